// ReLU, in place: the producing layer applies it where it can (absorb_relu, fusion.md); otherwise a
// bit mask of x > 0 is all that backward keeps.
#include <cstring>

#include "simd/kernel_table.hpp"
#include "src/core/aligned_buffer.hpp"
#include "src/layers/layer.hpp"
#include "src/layers/layer_args.hpp"
#include "src/layers/layer_helpers.hpp"

namespace dfp::model {
namespace {

class Relu final : public Layer, public PassesThrough, public MeasuresMaxima {
 public:
  TensorShape infer(const std::vector<TensorShape>& in) const override { return in[0]; }
  bool forward_in_place(size_t) const override { return true; }
  bool backward_in_place(size_t) const override { return true; }
  void pass_through() override { through_ = true; }
  float output_max_abs() const override { return out_max_; }
  float input_grad_max_abs() const override { return in_grad_max_; }
  const float* output_plane_max() const override { return out_planes_; }
  const float* input_grad_plane_max() const override { return in_grad_planes_; }
  void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo& st) override {
    const size_t n = n_elems_;
    out_planes_ = nullptr;
    if (through_) {  // the producer applied it; in place (the usual plan) there is nothing to do
      if (y != x[0]) std::memcpy(y, x[0], n * sizeof(float));
      out_max_ = st.input_max_abs;
      out_planes_ = st.input_plane_max;
      return;
    }
    const auto fn = ctx.kernels().relu_fwd.fn;
    const float* src = x[0];
    uint16_t* mask = mask_.data();
    std::atomic<float> mx{0.f};
    for_chunks(ctx, n, [&](size_t b, size_t e) { atomic_max(mx, fn(src + b, y + b, mask + b / 16, e - b)); });
    out_max_ = mx.load();
  }
  void backward(const Context& ctx, const std::vector<const float*>&, const float*, const float* dy,
                const std::vector<float*>& dx, const StepInfo& st) override {
    in_grad_max_ = -1.f;
    in_grad_planes_ = nullptr;
    if (!dx[0]) return;
    const size_t n = n_elems_;
    if (through_) {  // the producer masks the gradient
      if (dx[0] != dy) std::memcpy(dx[0], dy, n * sizeof(float));
      in_grad_max_ = st.grad_max_abs;
      in_grad_planes_ = st.grad_plane_max;
      return;
    }
    mask_gradient(ctx, mask_.data(), dy, dx[0], n);
  }
  void build(const Context&, const std::vector<TensorShape>& in, const TensorShape&, const LayerPrecision&,
             std::mt19937_64&) override {
    n_elems_ = in[0].blocked_elements();
    if (!through_) mask_ = AlignedBuffer<uint16_t>((n_elems_ + 15) / 16);
  }

 private:
  size_t n_elems_ = 0;
  bool through_ = false;          // the producer applies the ReLU (absorb_relu)
  AlignedBuffer<uint16_t> mask_;  // bit i: x[i] > 0, all that backward needs
  float out_max_ = -1.f, in_grad_max_ = -1.f;
  const float *out_planes_ = nullptr, *in_grad_planes_ = nullptr;  // a through ReLU's neighbours'
};

}  // namespace

std::unique_ptr<Layer> build_relu(const LayerParams&, const LayerArgs&) { return std::make_unique<Relu>(); }

}  // namespace dfp::model
