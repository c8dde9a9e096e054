// The arithmetic of a Conv2d or Linear layer, one object per layer chosen once when the model is
// built from the layer's LayerPrecision (make_weighted_op): one interface, one implementation
// per way of computing, as oneDNN lists implementations of a primitive.
//   int16:         ConvInt16 (DFP16 operands, all three passes, INT32 chains flushed into FP32).
//   native bf16:   the kernel table's conv_bf16 (BF16 operands in memory, FP32 accumulation and
//                  outputs), where the layer has one and all three classes are BF16.
//   rounded float: x, w, dy rounded to their class formats (bf16/fp16; fp8 and the MX element
//                  formats at a per-tensor scale; posit16), then the layer's FP32 operator on
//                  them: products of 16-bit and smaller floats are exact in FP32, so this is FP32
//                  accumulation of exact products, the numerics of VDPBF16PS and of tensor
//                  cores (posits' products are rounded once). FP16 weight gradients are stored as
//                  FP16 (rounded, overflow to inf), as a half-precision wgrad output would be.
//   blocks:        OCP Microscaling, and Block DFP (int16 with a block granularity): each pass's
//                  operands quantized in blocks along that pass's reduction, two FP32 operators
//                  (the backward-data pass has weights of its own).
//   fp32:          the layer's FP32 operator.
// The layer owns the FP32 master weights, the bias and the parameter gradients; an operation
// reads the master weights through the pointer it is built with.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dfp/conv.hpp"
#include "dfp/loss_scale.hpp"
#include "dfp/precision.hpp"
#include "src/layers/layer.hpp"

namespace dfp::model {

// The FP32 arithmetic of one Conv2d or Linear on the blocked layout (the layer adapts its
// backend's layouts): what the fp32 operation runs, and the rounded-float one on its rounded
// operands.
class F32Operator {
 public:
  virtual ~F32Operator() = default;
  virtual void set_weights(const float* w) = 0;
  virtual void forward(const float* x, float* y) = 0;
  // dx may be null; gw is overwritten. x is this step's input as forward() saw it.
  virtual void backward(const float* x, const float* dy, float* dx, float* gw) = 0;
  // The two backward passes apart, each on operands of its own (MX quantizes each pass's
  // operands along its own reduction): dx from dy with the weights set last; gw from x and dy,
  // read as they are now even where they are the buffers the other passes read.
  virtual void backward_data(const float* dy, float* dx) = 0;
  virtual void backward_weights(const float* x, const float* dy, float* gw) = 0;
  virtual std::string implementation() const = 0;
  // Whether backward and backward_weights read the x they are given (a Linear's operator keeps
  // its own rows of the forward's input and reads none).
  virtual bool backward_reads_input() const { return true; }
};

// Per-tensor-class statistics of the last sampled step.
struct SampledNumerics {
  bool sampled = false;
  FormatStats x, w, dy;
};
void report_sample(const SampledNumerics& s, LayerNumerics& n);
// The INT16 operator's figures of its last step as the layer `name`'s numerics.
void report_numerics(const ConvStats& s, const std::string& name, LayerNumerics& n);

// What only the INT16 operation has: its figures of the last step, input fusion (TakesInputSpans,
// layer.hpp) and the time of its parts over the timed steps (StepInfo::timed).
class Int16Operation {
 public:
  virtual ~Int16Operation() = default;
  virtual const ConvStats& stats() const noexcept = 0;
  virtual bool accepts_input_spans() const = 0;
  virtual void take_input_spans(InputSpanFn fn, void* producer, float max_abs, const float* plane_max,
                                InputQuantSpanFn quantized, const StepInfo& st) = 0;
  virtual bool input_taken() const = 0;
  virtual bool recompute_input(InputSpanFn again, void* producer,
                               InputPairSpanFn again_pairs) = 0;  // TakesInputSpans::recompute_input_spans
  // TakesGradSpans, for the layer (which declines where it reads dy itself: a bias).
  virtual bool accepts_grad_spans() const = 0;
  virtual void take_grad_spans(GradSpanFn fn, void* producer, float estimate, GradQuantSpanFn quantized,
                               const StepInfo& st) = 0;
  virtual bool grad_taken() const = 0;
  virtual const LayerTime::Int16Parts& parts() const = 0;
  virtual void reset_parts() = 0;
};

class WeightedOp {
 public:
  virtual ~WeightedOp() = default;
  virtual void forward(const float* x, float* y, const StepInfo& st) = 0;
  // dx may be null; gw is overwritten (or, for an accumulating operation, dx added to when
  // st.accumulate_dx & 1).
  virtual void backward(const float* x, const float* dy, float* dx, float* gw, const StepInfo& st) = 0;
  // After the layer's bias gradient: the gradients' storage format applied to gw and gb.
  virtual void finish_gradients(float* gw, size_t nw, float* gb, size_t nb) {}
  // The master weights changed: `step` is the next step (rounding streams), `max_abs` their
  // maximum as the optimizer measured it (negative: unknown).
  virtual void weights_updated(uint64_t step, float max_abs) = 0;
  // Whether backward needs the Model's FP32 input (else it keeps its own copy, or none).
  virtual bool backward_reads_input() const = 0;
  virtual bool accumulates_input_grad() const { return false; }
  virtual size_t workspace_bytes() const { return 0; }
  virtual void use_workspace(void* region) {}
  // What runs the passes: "fwd | bwd_data | bwd_weights", or one name for all three.
  virtual std::string implementation() const = 0;
  // The layer's numerics (format, INT16 figures, sampled statistics); false for fp32.
  virtual bool numerics(const std::string& layer, LayerNumerics& n) const { return false; }
  // Adaptive loss scaling's weight-side inputs and the gradients' format; false unless the
  // gradients are 16-bit floats.
  virtual bool adaptive_weight_inputs(AdaptiveInputs& in, FloatFormat& f) const { return false; }
  // Delayed FP8 scaling's amax histories by class (ReducedPrecision::scaling_histories).
  virtual void scaling_histories(const std::string& prefix, std::map<std::string, std::vector<float>>& out) const {}
  virtual bool set_scaling_history(const std::string& cls, const std::vector<float>& values, const std::string& what) {
    return false;
  }
  // The INT16 operation's own interface; null for the others.
  virtual Int16Operation* int16() noexcept { return nullptr; }
  virtual const Int16Operation* int16() const noexcept { return nullptr; }
  const SampledNumerics& sampled_numerics() const noexcept { return sample_; }

 protected:
  SampledNumerics sample_;
};

// What the operation of a Conv2d or Linear is built from.
struct WeightedOpSpec {
  const Context* ctx = nullptr;
  std::string name;            // the layer's (error messages, rounding streams)
  ConvShape shape;             // a Linear is a 1x1 convolution over a 1x1 image
  size_t in_size = 0, out_size = 0;  // blocked elements of x and y
  const float* weights = nullptr;    // the layer's FP32 master weights, `weight_count` of them
  size_t weight_count = 0;
  bool input_gradient = true;  // backward computes dx
  double fan_in = 1;
  // Makes the layer's FP32 operator (once for the fp32 and rounded-float operations; twice for
  // MX, whose backward-data pass has weights of its own).
  std::function<std::unique_ptr<F32Operator>()> make_f32;
  bool bf16_operands = false;  // the layer can run the table's conv_bf16 (a Conv2d)
};

std::unique_ptr<WeightedOp> make_weighted_op(const WeightedOpSpec& spec, const LayerPrecision& precision);

}  // namespace dfp::model
