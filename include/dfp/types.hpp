// dfp: the vocabulary types the model, its layers and the programs that read them share: a
// tensor's shape, a trainable parameter, a layer's numerics and its time per pass. The model
// (dfp/model.hpp) hands them out; the layers (src/layers/) fill them without the model's header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "dfp/conv.hpp"

namespace dfp {

struct TensorShape {
  int n = 0, c = 0, h = 0, w = 0;
  size_t blocked_elements() const noexcept { return blocked_size(n, c, h, w); }
};

// A trainable tensor: FP32 master values and gradient, owned by the model.
struct Parameter {
  std::string name;
  float* value = nullptr;
  float* grad = nullptr;
  size_t size = 0;
  bool decay = true;  // weight decay applies (PyTorch applies it to every parameter by default)
};

// Per-layer numerics of the reduced-precision Conv2d/Linear layers. Exponents, chains and
// saturation are those of the last step (INT16; a grouped conv, whose groups have their own
// exponents, reports those of the groups with the largest magnitudes, the shortest chains and
// summed counts); the rounding statistics (SQNR of each operand
// against its FP32 value, overflow/underflow counts) are from the last sampled step (see
// Model::set_numerics_interval), NaN/0 before the first sample. For INT16 the SQNR is that of
// round-to-nearest at the step's exponent.
struct LayerNumerics {
  std::string layer;
  std::string format;  // int16, bf16, fp16, e4m3, or "w/x/dy" formats when they differ
  // int16: the shared exponents; with `scaled`, the per-tensor scales of the 8-bit classes, as
  // exponents of the tensor (x ~ its stored value * 2^exp_x; 0 for a class not scaled).
  int exp_x = 0, exp_w = 0, exp_dy = 0;
  bool scaled = false;
  // With Granularity::slice or a block granularity (and MX's block scales), where the slices' or
  // blocks' exponents differ: the smallest (exp_* is the largest).
  std::optional<int> exp_x_min, exp_w_min, exp_dy_min;
  int chain_fwd = 0, chain_bwd = 0, chain_wgrad = 0;
  uint64_t saturated = 0;
  int64_t overflow_events = 0;
  bool sampled = false;
  double sqnr_x_db = 0, sqnr_w_db = 0, sqnr_dy_db = 0;
  uint64_t overflow = 0, underflow = 0, nonzero = 0;  // summed over x, w, dy of the sample
  // The same counts per operand: which class loses its small values (a gradient's, an
  // activation's or a weight's) is what a format comparison asks.
  uint64_t underflow_x = 0, underflow_w = 0, underflow_dy = 0;
  uint64_t nonzero_x = 0, nonzero_w = 0, nonzero_dy = 0;
};

// Wall time of one layer's training passes, summed over the steps timed since the model was built
// or reset_layer_times() was last called (set_profiling(false) pauses the sums, true resumes them).
// Layers run one at a time, each using every thread, so the times add up to the step, less the
// optimizer (with the weights' re-quantization and packing) and data loading, which the trainer
// times. With set_debug_poison on, a backward time includes the poison fills of its buffers.
struct LayerTime {
  std::string layer;      // name; "loss" for the softmax cross-entropy
  std::string kind;       // LayerSpec::kind_name(); "loss"
  std::string precision;  // fp32, int16, bf16, fp16
  // What runs the layer's convolution or matrix product, "fwd | bwd_data | bwd_weights" where the
  // passes differ (e.g. "onednn:brgconv:avx512_core_amx_bf16 | onednn:jit:avx512_core_amx_bf16 |
  // ..."); empty for layers without one.
  std::string implementation;
  double forward_seconds = 0, backward_seconds = 0;
  uint64_t steps = 0;     // training forward passes timed
  // An INT16 Conv2d/Linear's time by part, summed over the same steps (zero for other layers):
  // quantization of x (with its padded and batch-pair copies; where a BatchNorm hands x over span
  // by span, in that BatchNorm's forward time, with the BatchNorm's own scale-shift of each span;
  // and the batch-pair copy computed again in the backward pass where the layer keeps none),
  // the forward pass, quantization of dy, the backward-data pass (with folding back a column
  // unfolding) and the weight-gradient pass (with the dy batch-pair interleave it does as it
  // goes). A pass's time includes its kernel's flushes of INT32 chains into FP32, which run
  // inside the kernel. The weights' quantization and packing run in the optimizer's time.
  // Of quantize_x, the parts that other times hold: quantize_x_in_producer, the spans quantized
  // inside the producer's forward (in that layer's forward_seconds, not this one's), and
  // quantize_x_in_backward, the batch-pair copy computed again (in this layer's
  // backward_seconds); the rest is in this layer's forward_seconds. Of quantize_dy,
  // quantize_dy_in_producer: dy computed span by span and quantized inside the backward of the
  // BatchNorm that reads this layer's output (in that layer's backward_seconds, with its
  // computation of each span); the rest is in this layer's backward_seconds.
  struct Int16Parts {
    double quantize_x = 0, forward = 0, quantize_dy = 0, backward_data = 0, backward_weights = 0;
    double quantize_x_in_producer = 0, quantize_x_in_backward = 0, quantize_dy_in_producer = 0;
  } int16;
};

}  // namespace dfp
