// Add: the residual sum of two tensors of one shape.
#include <algorithm>
#include <cstring>

#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"
#include "src/core/aligned_buffer.hpp"
#include "src/layers/layer.hpp"
#include "src/layers/layer_args.hpp"
#include "src/layers/layer_helpers.hpp"

namespace dfp::model {
namespace {

class Add final : public Layer, public AbsorbsRelu, public MeasuresMaxima, public TakesInputSpans {
 public:
  TensorShape infer(const std::vector<TensorShape>& in) const override {
    DFP_CHECK(in[0].c == in[1].c && in[0].h == in[1].h && in[0].w == in[1].w, Status::invalid_argument,
              "add '" + name + "': input shapes differ (" + std::to_string(in[0].c) + "x" + std::to_string(in[0].h) +
                  "x" + std::to_string(in[0].w) + " vs " + std::to_string(in[1].c) + "x" + std::to_string(in[1].h) +
                  "x" + std::to_string(in[1].w) + ")");
    return in[0];
  }
  void build(const Context&, const std::vector<TensorShape>& in, const TensorShape&, const LayerPrecision&,
             std::mt19937_64&) override {
    s_ = in[0];
    n_ = in[0].blocked_elements();
    if (relu_) {
      mask_ = AlignedBuffer<uint16_t>((n_ + 15) / 16);
      planes_.assign(size_t(s_.n) * cb_of(s_), 0.f);
    }
  }
  // Either input may come as spans from a BatchNorm (its scale-shift, and the DFP16 copy it saves,
  // computed here piece by piece), so its FP32 output is never written or read.
  bool accepts_input_spans(size_t i) const override { return i < 2; }
  void take_input_spans(size_t i, InputSpanFn fn, void* producer, float, const float*, InputQuantSpanFn,
                        const StepInfo&) override {
    spans_[i] = {fn, producer};
  }
  bool forward_in_place(size_t) const override { return true; }
  bool backward_in_place(size_t) const override { return true; }
  // The gradient reaches every input unchanged, or, with the ReLU fused, masked once in place.
  bool backward_passes_gradient() const override { return true; }
  // Fused ReLU (the residual block's): the ReLU kernel runs on each chunk of the sum while it is
  // still in cache, so the bits, mask and max are the two layers' own.
  bool absorb_relu() override {
    relu_ = true;
    return true;
  }
  float output_max_abs() const override { return out_max_; }
  // With the ReLU: max|y| of each plane, measured as the pieces go.
  const float* output_plane_max() const override { return relu_ ? planes_.data() : nullptr; }
  void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo&) override {
    const auto fn = ctx.kernels().add.fn;
    const auto add_relu = ctx.kernels().add_relu.fn;  // the bits of add, then the ReLU on the sum
    const float *a = x[0], *c = x[1];
    const size_t n = n_;
    uint16_t* mask = relu_ ? mask_.data() : nullptr;
    std::atomic<float> mx{0.f};
    const size_t pl = plane(s_);
    if (mask) std::fill(planes_.begin(), planes_.end(), 0.f);
    if (!spans_[0].fn && !spans_[1].fn) {
      for_chunks(ctx, n, [&](size_t b, size_t e) {
        if (!mask) {
          fn(a + b, c + b, y + b, e - b);
          return;
        }
        float m = 0.f;
        for (size_t i = b; i < e;) {  // a piece per plane: each plane's max
          const size_t end = std::min(e, (i / pl + 1) * pl);
          const float r = add_relu(a + i, c + i, y + i, mask + i / 16, end - i);
          atomic_max(planes_[i / pl], r);
          m = r > m ? r : m;
          i = end;
        }
        atomic_max(mx, m);
      });
      out_max_ = mask ? mx.load() : -1.f;
      return;
    }
    // Pieces of each chunk that stay within one plane (the spans' unit), each input from its
    // producer into an L1 tile where it comes as spans. Element-wise: the bits of the plain path.
    const int CB = cb_of(s_), W = s_.w;
    for_chunks(ctx, n, [&](size_t b, size_t e) {
      alignas(64) float tile[2][kSpanPixels * 16];
      float m = 0.f;
      for (size_t i = b; i < e;) {
        const size_t end = std::min({e, i + kSpanPixels * 16, (i / pl + 1) * pl});
        const float* in[2] = {a + i, c + i};
        for (int k = 0; k < 2; ++k) {
          if (!spans_[k].fn) continue;
          const size_t p = i / pl, px = i % pl / 16;
          spans_[k].fn(spans_[k].producer, int(p / CB), int(p % CB), int(px / W), int(px % W), int(end - i) / 16, tile[k]);
          in[k] = tile[k];
        }
        if (mask) {
          const float r = add_relu(in[0], in[1], y + i, mask + i / 16, end - i);
          atomic_max(planes_[i / pl], r);
          m = r > m ? r : m;
        } else {
          fn(in[0], in[1], y + i, end - i);
        }
        i = end;
      }
      if (mask) atomic_max(mx, m);
    });
    out_max_ = mask ? mx.load() : -1.f;
    spans_[0] = spans_[1] = {};
  }
  void backward(const Context& ctx, const std::vector<const float*>&, const float*, const float* dy,
                const std::vector<float*>& dx, const StepInfo&) override {
    if (relu_) {
      // Mask into the first input's buffer, or over dy itself where an input shares it.
      float* first = nullptr;
      for (float* d : dx)
        if (d && (!first || d == dy)) first = d;
      if (!first) return;
      mask_gradient(ctx, mask_.data(), dy, first, n_);
      dy = first;
    }
    for (float* d : dx)
      if (d && d != dy) std::memcpy(d, dy, n_ * sizeof(float));  // d == dy: the planned buffer is shared
  }

 private:
  static constexpr size_t kSpanPixels = 128;
  TensorShape s_;
  size_t n_ = 0;
  bool relu_ = false;
  AlignedBuffer<uint16_t> mask_;
  float out_max_ = -1.f;
  std::vector<float> planes_;  // output_plane_max(), [N][CB]
  struct {
    InputSpanFn fn = nullptr;
    void* producer = nullptr;
  } spans_[2];  // inputs fed as spans in this step (take_input_spans)
};

}  // namespace

std::unique_ptr<Layer> build_add(const LayerParams&, const LayerArgs&) { return std::make_unique<Add>(); }

}  // namespace dfp::model
