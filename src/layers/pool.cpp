// Max and average pooling (with ceil mode, as torch.nn.MaxPool2d/AvgPool2d) and global average
// pooling.
#include <algorithm>
#include <cstring>
#include <limits>

#include "dfp/status.hpp"
#include "src/core/aligned_buffer.hpp"
#include "src/layers/layer.hpp"
#include "src/layers/layer_args.hpp"
#include "src/layers/layer_helpers.hpp"

namespace dfp::model {
namespace {

class Pool final : public Layer {
 public:
  Pool(bool max, int k, int s, int p, bool ceil_mode) : max_(max), k_(k), s_(s), p_(p), ceil_(ceil_mode) {}
  int out_dim(int in) const {
    int o = ceil_ ? (in + 2 * p_ - k_ + s_ - 1) / s_ + 1 : (in + 2 * p_ - k_) / s_ + 1;
    if (ceil_ && (o - 1) * s_ >= in + p_) --o;  // PyTorch: the last window must start inside
    return o;
  }
  TensorShape infer(const std::vector<TensorShape>& in) const override {
    DFP_CHECK(in[0].h + 2 * p_ >= k_ && in[0].w + 2 * p_ >= k_, Status::invalid_argument,
              "pool '" + name + "': window larger than the padded input");
    return {in[0].n, in[0].c, out_dim(in[0].h), out_dim(in[0].w)};
  }
  void build(const Context&, const std::vector<TensorShape>& in, const TensorShape& out, const LayerPrecision&,
             std::mt19937_64&) override {
    in_ = in[0];
    out_ = out;
    if (max_) {
      DFP_CHECK(k_ * k_ < kNoTap, Status::invalid_argument,
                "maxpool '" + name + "': window " + std::to_string(k_) + "x" + std::to_string(k_) +
                    " has more taps than the saved argmax can name (at most 15x15)");
      argmax_ = AlignedBuffer<uint8_t>(out.blocked_elements());
    }
  }
  void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo&) override {
    for_blocks(ctx, in_.n, cb_of(in_), [&](int n, int blk) {
      const float* p = x[0] + (size_t(n) * cb_of(in_) + blk) * plane(in_);
      const size_t out_off = (size_t(n) * cb_of(out_) + blk) * plane(out_);
      float* q = y + out_off;
      for (int oh = 0; oh < out_.h; ++oh)
        for (int ow = 0; ow < out_.w; ++ow) {
          const size_t o = (size_t(oh) * out_.w + ow) * 16;
          if (max_) {
            // The first maximum in window order (row-major) gets the gradient: its tap is saved.
            float acc[16];
            uint8_t arg[16];
            for (int l = 0; l < 16; ++l) { acc[l] = -std::numeric_limits<float>::infinity(); arg[l] = kNoTap; }
            bool first = true;
            for_window(oh, ow, [&](size_t off, int tap) {
              const float* v = p + off;
              if (first) {  // the first tap is taken as it is (NaN included)
                for (int l = 0; l < 16; ++l) { acc[l] = v[l]; arg[l] = uint8_t(tap); }
                first = false;
                return;
              }
              for (int l = 0; l < 16; ++l) {  // branch-free, so the lanes vectorise
                const bool gt = v[l] > acc[l];
                acc[l] = gt ? v[l] : acc[l];
                arg[l] = gt ? uint8_t(tap) : arg[l];
              }
            });
            std::memcpy(q + o, acc, sizeof acc);
            std::memcpy(argmax_.data() + out_off + o, arg, sizeof arg);
          } else {
            float acc[16] = {};
            for_window(oh, ow, [&](size_t off, int) {
              for (int l = 0; l < 16; ++l) acc[l] += p[off + l];
            });
            const float inv = 1.f / float(k_ * k_);  // count_include_pad, as PyTorch's default
            for (int l = 0; l < 16; ++l) q[o + l] = acc[l] * inv;
          }
        }
    });
  }
  void backward(const Context& ctx, const std::vector<const float*>&, const float*, const float* dy,
                const std::vector<float*>& dx, const StepInfo&) override {
    if (!dx[0]) return;
    for_blocks(ctx, in_.n, cb_of(in_), [&](int n, int blk) {
      float* d = dx[0] + (size_t(n) * cb_of(in_) + blk) * plane(in_);
      const size_t out_off = (size_t(n) * cb_of(out_) + blk) * plane(out_);
      const float* g = dy + out_off;
      std::fill(d, d + plane(in_), 0.f);
      const float inv = 1.f / float(k_ * k_);
      for (int oh = 0; oh < out_.h; ++oh)
        for (int ow = 0; ow < out_.w; ++ow) {
          const size_t o = (size_t(oh) * out_.w + ow) * 16;
          const float* go = g + o;
          if (max_) {
            const uint8_t* arg = argmax_.data() + out_off + o;
            for (int l = 0; l < 16; ++l) {
              if (arg[l] == kNoTap) continue;
              const int ih = oh * s_ + arg[l] / k_ - p_, iw = ow * s_ + arg[l] % k_ - p_;
              d[(size_t(ih) * in_.w + iw) * 16 + l] += go[l];
            }
          } else {
            for_window(oh, ow, [&](size_t off, int) {
              for (int l = 0; l < 16; ++l) d[off + l] += go[l] * inv;
            });
          }
        }
    });
  }

 private:
  static constexpr uint8_t kNoTap = 255;
  // Calls f(offset of the input pixel within a channel-block plane, tap index r * k + c) for every
  // in-bounds tap of output pixel (oh, ow), in window order (row-major), which decides max-pool ties.
  template <class F>
  void for_window(int oh, int ow, F&& f) const {
    for (int r = 0; r < k_; ++r) {
      const int ih = oh * s_ + r - p_;
      if (ih < 0 || ih >= in_.h) continue;
      for (int c = 0; c < k_; ++c) {
        const int iw = ow * s_ + c - p_;
        if (iw < 0 || iw >= in_.w) continue;
        f((size_t(ih) * in_.w + iw) * 16, r * k_ + c);
      }
    }
  }

  bool max_;
  int k_, s_, p_;
  bool ceil_;
  TensorShape in_, out_;
  AlignedBuffer<uint8_t> argmax_;  // max: per output element, the tap its value came from
};

class GlobalAvgPool final : public Layer {
 public:
  TensorShape infer(const std::vector<TensorShape>& in) const override { return {in[0].n, in[0].c, 1, 1}; }
  void build(const Context&, const std::vector<TensorShape>& in, const TensorShape&, const LayerPrecision&,
             std::mt19937_64&) override {
    in_ = in[0];
  }
  void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo&) override {
    const size_t hw = size_t(in_.h) * in_.w;
    for_blocks(ctx, in_.n, cb_of(in_), [&](int n, int blk) {
      const float* p = x[0] + (size_t(n) * cb_of(in_) + blk) * plane(in_);
      float acc[16] = {};
      for (size_t i = 0; i < hw; ++i)
        for (int l = 0; l < 16; ++l) acc[l] += p[i * 16 + l];
      for (int l = 0; l < 16; ++l) y[(size_t(n) * cb_of(in_) + blk) * 16 + l] = acc[l] / float(hw);
    });
  }
  void backward(const Context& ctx, const std::vector<const float*>&, const float*, const float* dy,
                const std::vector<float*>& dx, const StepInfo&) override {
    if (!dx[0]) return;
    const size_t hw = size_t(in_.h) * in_.w;
    for_blocks(ctx, in_.n, cb_of(in_), [&](int n, int blk) {
      float* d = dx[0] + (size_t(n) * cb_of(in_) + blk) * plane(in_);
      const float* g = dy + (size_t(n) * cb_of(in_) + blk) * 16;
      for (size_t i = 0; i < hw; ++i)
        for (int l = 0; l < 16; ++l) d[i * 16 + l] = g[l] / float(hw);
    });
  }

 private:
  TensorShape in_;
};

}  // namespace

std::unique_ptr<Layer> build_maxpool(const LayerParams& params, const LayerArgs& a) {
  const auto& q = std::get<PoolParams>(params);
  a.window(q.kernel, q.stride, q.pad, true);
  return std::make_unique<Pool>(true, q.kernel, q.stride, q.pad, q.ceil_mode);
}
std::unique_ptr<Layer> build_avgpool(const LayerParams& params, const LayerArgs& a) {
  const auto& q = std::get<PoolParams>(params);
  a.window(q.kernel, q.stride, q.pad, true);
  a.need(!q.ceil_mode, "ceil_mode", "false (average pooling rounds its output size down)", "true");
  return std::make_unique<Pool>(false, q.kernel, q.stride, q.pad, false);
}
std::unique_ptr<Layer> build_global_avgpool(const LayerParams&, const LayerArgs&) {
  return std::make_unique<GlobalAvgPool>();
}

}  // namespace dfp::model
