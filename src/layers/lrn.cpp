// LRN: local response normalisation across channels (AlexNet, GoogLeNet-v1).
#include <algorithm>
#include <cmath>

#include "src/core/aligned_buffer.hpp"
#include "src/layers/layer.hpp"
#include "src/layers/layer_args.hpp"
#include "src/layers/layer_helpers.hpp"

namespace dfp::model {
namespace {

// Local response normalisation across channels (AlexNet, GoogLeNet-v1), as torch.nn.LocalResponseNorm:
// y_c = x_c / (k + alpha/size * sum_{c' in window(c)} x_c'^2)^beta.
class Lrn final : public Layer {
 public:
  Lrn(int size, float alpha, float beta, float k) : size_(size), alpha_(alpha), beta_(beta), k_(k) {}
  TensorShape infer(const std::vector<TensorShape>& in) const override { return in[0]; }
  void build(const Context&, const std::vector<TensorShape>& in, const TensorShape&, const LayerPrecision&,
             std::mt19937_64&) override {
    s_ = in[0];
    scale_ = AlignedBuffer<float>(s_.blocked_elements());
  }
  bool backward_reads_input(size_t) const override { return true; }
  bool backward_reads_output() const override { return true; }
  int lo(int c) const { return std::max(0, c - size_ / 2); }
  int hi(int c) const { return std::min(s_.c - 1, c + (size_ - 1) / 2); }
  void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo&) override {
    ctx.parallel_for(s_.n, [&](int64_t b, int64_t e) {
      for (int64_t n = b; n < e; ++n)
        for (int h = 0; h < s_.h; ++h)
          for (int w = 0; w < s_.w; ++w)
            for (int c = 0; c < s_.c; ++c) {
              double sum = 0;
              for (int j = lo(c); j <= hi(c); ++j) {
                const float v = x[0][bidx(s_, int(n), j, h, w)];
                sum += double(v) * v;
              }
              const size_t i = bidx(s_, int(n), c, h, w);
              scale_[i] = static_cast<float>(k_ + alpha_ / size_ * sum);
              y[i] = x[0][i] * std::pow(scale_[i], -beta_);
            }
    });
    zero_padding_lanes(ctx, y, s_);
  }
  void backward(const Context& ctx, const std::vector<const float*>& x, const float* y, const float* dy,
                const std::vector<float*>& dx, const StepInfo&) override {
    if (!dx[0]) return;
    ctx.parallel_for(s_.n, [&](int64_t b, int64_t e) {
      for (int64_t n = b; n < e; ++n)
        for (int h = 0; h < s_.h; ++h)
          for (int w = 0; w < s_.w; ++w)
            for (int c = 0; c < s_.c; ++c) {
              // Output j's window contains c exactly when c's window contains j (symmetric ranges
              // up to the odd/even split, handled by testing membership explicitly).
              double acc = 0;
              for (int j = std::max(0, c - size_); j <= std::min(s_.c - 1, c + size_); ++j) {
                if (c < lo(j) || c > hi(j)) continue;
                const size_t ij = bidx(s_, int(n), j, h, w);
                acc += double(dy[ij]) * y[ij] / scale_[ij];
              }
              const size_t i = bidx(s_, int(n), c, h, w);
              dx[0][i] = static_cast<float>(dy[i] * std::pow(scale_[i], -beta_) -
                                            2.0 * alpha_ * beta_ / size_ * x[0][i] * acc);
            }
    });
    zero_padding_lanes(ctx, dx[0], s_);
  }

 private:
  int size_;
  float alpha_, beta_, k_;
  TensorShape s_;
  AlignedBuffer<float> scale_;
};

}  // namespace

std::unique_ptr<Layer> build_lrn(const LayerParams& params, const LayerArgs& args) {
  const auto& q = std::get<LrnParams>(params);
  args.need_int(q.size >= 1, "size", ">= 1", q.size);
  args.need(std::isfinite(q.alpha), "alpha", "a finite number", std::to_string(q.alpha));
  args.need(std::isfinite(q.beta), "beta", "a finite number", std::to_string(q.beta));
  // k > 0 keeps the base of the power positive (k + alpha/size * sum of squares, sum >= 0).
  args.need(std::isfinite(q.k) && q.k > 0.f && q.alpha >= 0.f, "k and alpha", "k > 0 and alpha >= 0, finite",
            "k " + std::to_string(q.k) + ", alpha " + std::to_string(q.alpha));
  return std::make_unique<Lrn>(q.size, q.alpha, q.beta, q.k);
}

}  // namespace dfp::model
