// Dropout: inverted dropout with a counter-based mask, recomputed in backward.
#include <algorithm>

#include "dfp/status.hpp"
#include "src/layers/layer.hpp"
#include "src/layers/layer_args.hpp"
#include "src/layers/layer_helpers.hpp"

namespace dfp::model {
namespace {

// Inverted dropout; the mask is a function of (seed, step, element), recomputed in backward. The
// element is counted in the job's global batch (StepInfo::first_image), so a data-parallel job's
// ranks draw the masks one process with the whole batch draws.
class Dropout final : public Layer, public RandomStream {
 public:
  explicit Dropout(float p) : p_(p) {}
  TensorShape infer(const std::vector<TensorShape>& in) const override {
    DFP_CHECK(p_ >= 0.f && p_ < 1.f, Status::invalid_argument,
              "dropout '" + name + "': p expected in [0, 1), got " + std::to_string(p_));
    return in[0];
  }
  void build(const Context& ctx, const std::vector<TensorShape>& in, const TensorShape&, const LayerPrecision&,
             std::mt19937_64& rng) override {
    n_ = in[0].blocked_elements();
    image_ = n_ / size_t(std::max(1, in[0].n));  // the batch is the outermost dimension
    seed_ = rng();
  }
  uint64_t random_seed() const override { return seed_; }
  bool forward_in_place(size_t) const override { return true; }
  bool backward_in_place(size_t) const override { return true; }
  // Element i survives at this step: a pure function of (seed, step, i), so forward and backward
  // agree and nothing is stored.
  bool keep(uint32_t key, size_t i) const { return float(simd::stochastic_rand24(key, i)) * 0x1p-24f >= p_; }
  void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo& st) override {
    const float scale = 1.f / (1.f - p_);
    const float* src = x[0];
    const bool drop = st.train && p_ != 0.f;
    const uint32_t key = step_key(seed_, st.step);
    const size_t at = size_t(st.first_image) * image_;
    for_chunks(ctx, n_, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) y[i] = !drop ? src[i] : (keep(key, at + i) ? src[i] * scale : 0.f);
    });
  }
  void backward(const Context& ctx, const std::vector<const float*>&, const float*, const float* dy,
                const std::vector<float*>& dx, const StepInfo& st) override {
    if (!dx[0]) return;
    const float scale = 1.f / (1.f - p_);
    float* d = dx[0];
    const uint32_t key = step_key(seed_, st.step);
    const size_t at = size_t(st.first_image) * image_;
    for_chunks(ctx, n_, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) d[i] = keep(key, at + i) ? dy[i] * scale : 0.f;
    });
  }

 private:
  float p_;
  size_t n_ = 0;
  size_t image_ = 0;  // elements per image
  uint64_t seed_ = 0;
};

}  // namespace

std::unique_ptr<Layer> build_dropout(const LayerParams& params, const LayerArgs& a) {
  const float p = std::get<DropoutParams>(params).p;
  a.need(p >= 0.f && p < 1.f, "probability", "in [0, 1)", std::to_string(p));
  return std::make_unique<Dropout>(p);
}

}  // namespace dfp::model
