// Internal layer interface of the model graph. Every layer reads and writes FP32 activations in
// the blocked layout ([N][ceil(C/16)][H][W][16], padding lanes zero) and has an explicit forward
// and backward over buffers planned by the Model; a layer allocates only in build().
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/float16.hpp"
#include "dfp/layer_kind.hpp"
#include "dfp/precision.hpp"
#include "dfp/types.hpp"
#include "base/random.hpp"
#include "src/core/atomic_max.hpp"

namespace dfp::model {

struct StepInfo {
  int count = 0;       // images in the batch (the rest of the planned batch is zero padding)
  bool train = false;  // batch statistics, dropout, saving what backward needs
  uint64_t step = 0;   // training step index: seeds per-step randomness (dropout)
  bool sample = false; // measure rounding statistics on this step (LayerNumerics)
  // Largest magnitudes measured by a neighbour on the way (negative: not known). Forward: of
  // x[0], from its producer; backward: of dy, from the layer that wrote it. An INT16 layer then
  // derives its DFP16 exponent without a pass over the tensor.
  float input_max_abs = -1.f;
  float grad_max_abs = -1.f;
  // The same per plane (image n, channel block b of 16: [n * blocks + b]) where the neighbour
  // measured that too (null: not known). An INT16 layer with Granularity::slice exponents derives
  // them without a pass over the tensor.
  const float* input_plane_max = nullptr;
  const float* grad_plane_max = nullptr;
  // Backward: bit i set when dx[i] already holds another consumer's part of input i's gradient and
  // backward() adds its own to it (only for inputs where accumulates_input_grad(i) is true).
  uint32_t accumulate_dx = 0;
  // Model::set_statistics_sum: adds values over the processes of a data-parallel job, in place
  // (BatchNorm's batch statistics and backward sums in training); null: this process's batch only.
  const std::function<void(double* values, size_t count)>* statistics_sum = nullptr;
  bool timed = false;  // Model::set_profiling: layers that time their parts (LayerTime) do so
  // Model::set_batch_offset: image n of this batch is image first_image + n of the job's global
  // batch (per-image random draws are keyed by the latter).
  int first_image = 0;
  // Backward: the layer may hand its input gradient to that input's producer as spans
  // (FeedsGradSpans): nothing else reads that gradient in this step (no adaptive loss scaling).
  bool grad_spans = false;
};

// Bounds of adaptive loss scaling (Zhao et al. 2019), see include/dfp/loss_scale.hpp.
struct AdaptiveScaling {
  double max_factor = 16;   // per layer
  double max_scale = 1024;  // accumulated product of the factors
};

// Element-wise work runs over pieces of kChunk elements on the context's threads: f(begin, end)
// for each task's run of whole pieces. kChunk is a multiple of 16, so every piece starts on a ReLU
// mask word; it is also where the stochastic streams of chunked conversions restart their offsets.
constexpr size_t kChunk = size_t(1) << 15;
template <class F>
void for_chunks(const Context& ctx, size_t n, F&& f) {
  ctx.parallel_for(int64_t((n + kChunk - 1) / kChunk),
                   [&](int64_t b, int64_t e) { f(size_t(b) * kChunk, std::min(n, size_t(e) * kChunk)); });
}

// Rounding statistics of a sampled step (LayerNumerics), on the context's threads: the tensor is
// cut into at most kStatPieces pieces whose bounds depend on n alone, each measured on its own and
// the results summed in piece order, so the figures do not depend on the thread count.
//   measure_dfp16: x against DFP16 round-to-nearest-even at exponent e (|q| > 32767 saturates and
//                  counts as overflow);
//   measure_rounded: x against its rounded copy q (FP32 values);
//   measure_bf16: x against the BF16 bit patterns q.
FormatStats measure_dfp16(const Context& ctx, const float* x, size_t n, int e);
// The same over equal consecutive slices (images, output channels), slice i at exponent
// slices[i], summed in slice order; with no slices, measure_dfp16 at e.
FormatStats measure_dfp16_slices(const Context& ctx, const float* x, size_t n, int e, const std::vector<int>& slices);
FormatStats measure_rounded(const Context& ctx, const float* x, const float* q, size_t n);
// The same for an 8-bit format at the scale 2^scale_exp (measure_float8_rounding).
FormatStats measure_float8(const Context& ctx, const float* x, const float* q, size_t n, FloatFormat f, int scale_exp);
FormatStats measure_bf16(const Context& ctx, const float* x, const uint16_t* q, size_t n);

// Blocked-layout index of (n, c, h, w).
inline size_t bidx(const TensorShape& s, int n, int c, int h, int w) {
  return ((((size_t(n) * channel_blocks(s.c) + c / 16) * s.h + h) * s.w) + w) * 16 + (c % 16);
}

class Layer {
 public:
  virtual ~Layer() = default;
  std::string name;
  std::string kind;
  // Set by the Model before build(): whether backward() will be asked for the gradient of input
  // i (false for the data), so that a layer plans only the buffers its backward will use.
  std::vector<char> needs_input_grad;
  // Output shape from input shapes (batch dimension n may be 0 before build()).
  virtual TensorShape infer(const std::vector<TensorShape>& in) const = 0;
  // Plans operators and scratch for the final shapes in the precision the model's policy gives
  // this layer's name; initialises parameters from rng.
  virtual void build(const Context& ctx, const std::vector<TensorShape>& in, const TensorShape& out,
                     const LayerPrecision& precision, std::mt19937_64& rng) {}
  virtual void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo& st) = 0;
  // dy: gradient of the output. dx[i]: where to write the gradient of input i (overwrite), or
  // null when no gradient is needed for that input. Parameter gradients are overwritten too.
  virtual void backward(const Context& ctx, const std::vector<const float*>& x, const float* y, const float* dy,
                        const std::vector<float*>& dx, const StepInfo& st) = 0;
  // What backward reads besides dy: the FP32 input i and the FP32 output as forward left them. The
  // Model keeps exactly these alive until this layer's backward (and passes null for the rest);
  // anything else a backward needs the layer saves itself, in the form it needs (DFP16 copies,
  // bit masks, argmax indices).
  virtual bool backward_reads_input(size_t i) const { return false; }
  virtual bool backward_reads_output() const { return false; }
  // Element-wise layers: y may be written over input i's buffer, and dx[i] over dy's (the Model
  // decides when nothing else needs the overwritten values; the layer must then read each element
  // before writing it).
  virtual bool forward_in_place(size_t i) const { return false; }
  virtual bool backward_in_place(size_t i) const { return false; }
  // dx[i] = dy for every input (residual Add): the Model may hand every input the output
  // gradient's own buffer, and backward then has nothing to write.
  virtual bool backward_passes_gradient() const { return false; }
  // backward() can add input i's gradient to what dx[i] holds (StepInfo::accumulate_dx), as part
  // of its own writes: the Model then sums a second consumer's part without a buffer and a pass
  // of its own (an INT16 conv's flushes add; FP32 order: dx + c1 + c2 ..., not dx + (c1 + ...)).
  virtual bool accumulates_input_grad(size_t i) const { return false; }
  // Transient scratch, one region shared by all layers: valid only within one forward() or
  // backward() call.
  virtual size_t workspace_bytes() const { return 0; }
  virtual void use_workspace(void* region) {}
  virtual void parameters(std::vector<Parameter>& out) {}
  // Trainable scalars, from the input shapes alone (works before build()).
  virtual size_t count_parameters(const std::vector<TensorShape>& in) const { return 0; }
  virtual void buffers(std::vector<std::pair<std::string, std::vector<float>*>>& out) {}
  // The optimizer changed the parameters; `step` is the next training step (rounding streams).
  // param_max_abs: max|value| of each of this layer's parameters, in parameters() order, as the
  // optimizer measured them (Model::weights_updated(max_abs)); empty where not known.
  virtual void weights_updated(uint64_t step, std::span<const float> param_max_abs) {}
  virtual const char* precision() const { return "fp32"; }
  // The optional interfaces below that this layer offers (null: not offered). The Model asks once
  // per node, when it builds the graph.
  template <class Interface>
  Interface* as() noexcept {
    return dynamic_cast<Interface*>(this);
  }
  template <class Interface>
  const Interface* as() const noexcept {
    return dynamic_cast<const Interface*>(this);
  }
};

// ---- What a layer may offer besides Layer -----------------------------------------------------
// A layer offers one of these by deriving from it as well as from Layer: the few layers that take
// part in reduced-precision numerics, profiling, a random stream or fusion (docs/design/fusion.md).
// A new layer's author reads Layer alone and adds these when the layer does that.

// A Conv2d/Linear of a reduced precision: its numerics and its factor in adaptive loss scaling.
class ReducedPrecision {
 public:
  virtual ~ReducedPrecision() = default;
  virtual bool numerics(LayerNumerics& out) const = 0;
  // Adaptive loss scaling: the power-of-two factor this layer applies to its incoming gradient dy
  // (whose accumulated adaptive scale is `scale_so_far`).
  virtual double adaptive_factor(const Context& ctx, const float* dy, double scale_so_far,
                                 const AdaptiveScaling& opts) const = 0;
  // Delayed FP8 scaling's amax histories, oldest first, as out[prefix + "weights"] (and
  // "activations", "gradients"; a grouped conv's as prefix + "g<i>.<class>"): training state a
  // checkpoint keeps. set_ returns false for a key the layer keeps no history under, and throws
  // corrupt_data naming `what` for a value that is not finite and >= 0.
  virtual void scaling_histories(const std::string& prefix, std::map<std::string, std::vector<float>>& out) const {}
  virtual bool set_scaling_history(const std::string& key, const std::vector<float>& values, const std::string& what) {
    return false;
  }
};

// A layer that times its parts (--profile) and names what runs its convolution or product.
class ProfiledParts {
 public:
  virtual ~ProfiledParts() = default;
  // Per pass where they differ ("fwd | bwd_data | bwd_weights"), as --profile reports it.
  virtual std::string implementation() const { return ""; }
  // The time of the layer's parts, summed over the timed steps (StepInfo::timed) since the last
  // reset; null when the layer does not split its time in its current precision.
  virtual const LayerTime::Int16Parts* int16_parts() const = 0;
  virtual void reset_parts() = 0;
};

// A layer with its own random stream, its seed drawn in build() (dropout).
class RandomStream {
 public:
  virtual ~RandomStream() = default;
  virtual uint64_t random_seed() const = 0;
};

// Fusion, decided by the Model before build(): a layer whose output is read only by a ReLU may
// apply that ReLU itself (BatchNorm does: one pass over the tensor instead of two, forward and
// backward). absorb_relu() returns whether it did; the Model then calls pass_through() on the
// ReLU, which from then on hands values and gradients on unchanged.
class AbsorbsRelu {
 public:
  virtual ~AbsorbsRelu() = default;
  virtual bool absorb_relu() = 0;
};
class PassesThrough {
 public:
  virtual ~PassesThrough() = default;
  virtual void pass_through() = 0;
};

// What the layer measured for free during its last call (negative: nothing): max|y| after
// forward(), max|dx[0]| after backward(). The Model hands them on as StepInfo's maxima.
class MeasuresMaxima {
 public:
  virtual ~MeasuresMaxima() = default;
  virtual float output_max_abs() const { return -1.f; }
  virtual float input_grad_max_abs() const { return -1.f; }
  // The same per plane of the blocked tensor, [n * blocks + b] (null: not measured).
  virtual const float* output_plane_max() const { return nullptr; }
  virtual const float* input_grad_plane_max() const { return nullptr; }
};

// Fusion, linked by the Model after build(): a layer can take input i as spans that its producer
// computes on request, so the FP32 tensor between them is never written or read. The producer is
// a BatchNorm (with or without its ReLU) whose output only this layer reads; it accepts the link
// in feed_spans_to() and, in a step where it cannot feed (inference, numerics sampling), writes
// its output as usual. In a step where it feeds, it calls take_input_spans() from its forward(),
// with max|input| (and, where measured, each plane's: null otherwise) known before any span is
// asked for:
//   - an INT16 conv quantizes its input there and then, a span at a time while each is in L1
//     (ConvInt16::quantize_input_spans); its forward() then skips its own quantization, and
//     input_taken() says so beforehand;
//   - a residual Add records the source and asks for the spans in its own forward(), adding each
//     to the other input while it is in L1 (the Model keeps the producer's own input, which the
//     spans are computed from, alive until then); a pool does the same, whole rows at a time.
// A span is `count` pixels of channel block b of image n from pixel w0 of row h; an Add's run on
// into the following rows of the same plane (w0 + count <= (H - h) * W).
using InputSpanFn = void (*)(void* producer, int n, int b, int h, int w0, int count, float* out);
// The same spans quantized (ConvInt16::InputQuantSpanFn), and those of images n and n + 1 quantized
// into a batch-pair layout (ConvInt16::InputPairSpanFn).
using InputQuantSpanFn = bool (*)(void* producer, int n, int b, int h, int w0, int count, int exponent, int16_t* out,
                                  int32_t* max_q);
using InputPairSpanFn = bool (*)(void* producer, int n, int images, int b, int h, int w0, int count, int exponent,
                                 int16_t* out, int32_t* max_q);
class TakesInputSpans {
 public:
  virtual ~TakesInputSpans() = default;
  virtual bool accepts_input_spans(size_t i) const = 0;
  // quantized (optional): the same spans already quantized, for a consumer that quantizes them.
  virtual void take_input_spans(size_t i, InputSpanFn fn, void* producer, float max_abs, const float* plane_max,
                                InputQuantSpanFn quantized, const StepInfo& st) = 0;
  virtual bool input_taken() const { return false; }
  // The producer can compute the same spans again, from what it keeps for its own backward, from
  // the end of its forward() until its backward() (`again`: a BatchNorm whose saved DFP16 input
  // is what its output is computed from). A consumer that would keep a copy of the input for its
  // backward (an INT16 conv's weight-gradient operand) may compute that copy then instead and
  // keep nothing between the passes; returns whether it does. Offered once, by feed_spans_to().
  // again_pairs (optional): the same spans already in the conv's batch-pair layout.
  virtual bool recompute_input_spans(size_t i, InputSpanFn again, void* producer, InputPairSpanFn again_pairs) {
    return false;
  }
};
class FeedsSpans {
 public:
  virtual ~FeedsSpans() = default;
  virtual bool feed_spans_to(Layer* consumer, size_t i) = 0;
};

// Backward fusion, linked by the Model after build(): a BatchNorm whose input is an INT16 conv's
// output, read by nothing else, can hand the conv its input gradient (the conv's dy) as spans
// that it computes on request, so that gradient is never written as FP32. The conv's backward
// runs right after the BatchNorm's (the Model links only such neighbours), and skips its own
// quantization of dy in a step where it took the spans (grad_taken()). A span is as for
// InputSpanFn; the function returns the largest magnitude it wrote (NaN never wins).
using GradSpanFn = float (*)(void* producer, int n, int b, int h, int w0, int count, float* out);
using GradQuantSpanFn = float (*)(void* producer, int n, int b, int h, int w0, int count, int exponent, int16_t* out,
                                  int32_t* max_q);  // ConvInt16::GradQuantSpanFn
class TakesGradSpans {
 public:
  virtual ~TakesGradSpans() = default;
  virtual bool accepts_grad_spans() const = 0;
  // estimate: the producer's estimate of max|gradient| (ConvInt16::quantize_grad_output_spans);
  // quantized (optional): the same spans already quantized.
  virtual void take_grad_spans(GradSpanFn fn, void* producer, float estimate, GradQuantSpanFn quantized,
                               const StepInfo& st) = 0;
  virtual bool grad_taken() const = 0;
};
class FeedsGradSpans {
 public:
  virtual ~FeedsGradSpans() = default;
  virtual bool feed_grad_spans_to(Layer* producer) = 0;
};

class LayerArgs;
// A layer kind's builder: checks the kind's parameters (`params` holds the kind's type; LayerArgs
// names the model, the kind and the layer in what it refuses) and makes the layer. A layer's file
// defines its kind's builder; the registry (src/graph/layer_registry.cpp) names it in the kind's row.
using BuildLayer = std::unique_ptr<Layer>(const LayerParams& params, const LayerArgs& args);

// Conv2d and Linear on their own (LayerOp). groups > 1: a grouped convolution (groups must divide
// both channel counts).
std::unique_ptr<Layer> make_conv(int out_channels, int kernel, int stride, int pad, bool bias, int groups = 1);
std::unique_ptr<Layer> make_linear(int out_features, bool bias);

}  // namespace dfp::model
