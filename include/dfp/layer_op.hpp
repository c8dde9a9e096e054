// dfp: one Conv2d or Linear layer run on its own, on plain tensors, for programs that keep their
// own graph and autograd (the PyTorch bridge, dfp.torch).
//
// A LayerOp takes plain NCHW activations ([N][C][H][W] FP32; a Linear: row-major [N][in]), converts
// them to dfp's blocked layout (conv.hpp) and runs the layer's forward, backward-data and weight
// gradient in the precision the policy gives the layer's name: the same layer objects, operations
// and kernels as a Model's (int16 DFP16 operands, bf16/fp16 operands with FP32 accumulation, or
// fp32). The caller owns the FP32 master weights and passes them with a version number; the
// operation copies, quantizes and packs them only when that version changes.
//
// Plans. Everything a pass needs -- the layer's operators, its blocked copies of x, y, dy and dx,
// its scratch -- is planned once per input shape (batch, height, width, and whether the input
// gradient is wanted) and kept for the next call of that shape, so repeated calls allocate
// nothing. The kMaxPlans most recently used shapes are kept.
//
// Saved state. A training forward keeps what its backward needs (an INT16 layer its DFP16 input, an
// FP32 one its blocked input) in the plan of its shape, and returns a ticket; backward(ticket)
// runs on that state. Another training forward of the same shape replaces it: holds(ticket) then
// says false, and the caller runs the forward again before the backward.
//
// One call at a time per LayerOp (calls are serialised by a lock).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "dfp/model.hpp"
#include "dfp/precision.hpp"

namespace dfp {

class Context;

struct LayerOpSpec {
  enum class Kind { conv2d, linear };
  Kind kind = Kind::conv2d;
  int in_channels = 1;   // a Linear's in_features
  int out_channels = 1;  // a Linear's out_features
  // Conv2d only: a square kernel, the same stride and zero padding on both axes, and groups that
  // divide both channel counts (PyTorch's Conv2d(groups=...)).
  int kernel = 1, stride = 1, pad = 0, groups = 1;
  bool bias = false;
  // The policy's overrides match it; the stochastic rounding streams and error messages use it.
  std::string name = "layer";

  // Throws Error(invalid_argument) naming the layer and the field.
  void validate() const;
};

// Where a LayerOp's time went, summed over its calls since construction or reset_times().
struct LayerOpTimes {
  double layout_seconds = 0;    // NCHW <-> blocked conversions of x, y, dy and dx
  double weights_seconds = 0;   // weight loads: the copy, quantization or rounding, packing
  double forward_seconds = 0;   // the layer's forward (operand quantization included)
  double backward_seconds = 0;  // backward-data and weight gradient (dy's quantization included)
  uint64_t forwards = 0, backwards = 0, weight_loads = 0;
};

class LayerOp {
 public:
  static constexpr size_t kMaxPlans = 4;

  // Validates spec and policy; plans nothing yet.
  LayerOp(const Context& ctx, const LayerOpSpec& spec, const PrecisionPolicy& policy);
  ~LayerOp();
  LayerOp(const LayerOp&) = delete;
  LayerOp& operator=(const LayerOp&) = delete;

  const LayerOpSpec& spec() const noexcept;
  // The precision the policy resolved for spec().name.
  Precision precision() const noexcept;
  // K * C/groups * kernel * kernel (a Linear: out * in).
  size_t weight_count() const noexcept;
  // The output of an input [n][C][h][w]: {n, K, OH, OW} (a Linear, whose input is [n][in]: h = w
  // = 1 and {n, out, 1, 1}). Throws invalid_argument naming the layer when the shape does not fit.
  std::array<int, 4> output_shape(int n, int h, int w) const;

  // y = layer(x): x plain [n][C][h][w], y plain [n][K][OH][OW]. weights: [K][C/groups][k][k] (a
  // Linear: [out][in]) FP32, bias: K values, or null when the layer has none; the plan copies and
  // re-quantizes them when `weights_version` differs from the version it last loaded. train: keep
  // what backward needs and return its ticket (0 otherwise). input_grad: the backward will be
  // asked for dx (false for a network's first layer: its input-gradient buffers are not planned).
  uint64_t forward(const float* x, int n, int h, int w, const float* weights, const float* bias,
                   uint64_t weights_version, float* y, bool train, bool input_grad);
  // Whether the state of the training forward `ticket` is still held.
  bool holds(uint64_t ticket) const;
  // The gradients of the training forward `ticket` from dy (plain, the shape of its y): dx plain
  // (null: not wanted; needs input_grad in that forward), gw [weight_count()] and gb [K] (null
  // without bias) overwritten with the weight and bias gradients. Throws invalid_argument if the
  // state is not held (holds(ticket) is false).
  void backward(uint64_t ticket, const float* dy, float* dx, float* gw, float* gb);

  // forward and backward with every buffer's size (in floats) checked against the shapes of the
  // call (backward: of the forward `ticket`) before anything is read or written: a size that
  // differs throws invalid_argument naming the layer, the argument (x, weights, bias, y; dy, dx,
  // grad_weights, grad_bias) and both sizes. An empty span stands for a null pointer (no bias, dx
  // not wanted).
  uint64_t forward(std::span<const float> x, int n, int h, int w, std::span<const float> weights,
                   std::span<const float> bias, uint64_t weights_version, std::span<float> y, bool train,
                   bool input_grad);
  void backward(uint64_t ticket, std::span<const float> dy, std::span<float> dx, std::span<float> gw,
                std::span<float> gb);
  // The input shape {n, C, h, w} of the training forward `ticket` (a Linear's: {n, in, 1, 1}).
  // Throws invalid_argument as backward does when its state is not held.
  std::array<int, 4> input_shape(uint64_t ticket) const;

  // Sample the rounding statistics (LayerNumerics' SQNR and counts) in the next training step.
  void sample_next_step();
  // The numerics of the last training step (exponents, chains, saturation; the rounding statistics
  // of the last sampled step), named spec().name. False for an fp32 layer, or before a training
  // forward.
  bool numerics(LayerNumerics& out) const;
  // What runs the passes ("fwd | bwd_data | bwd_weights"); empty before the first forward.
  std::string implementation() const;
  // Training forwards so far (the step of the stochastic rounding streams).
  uint64_t steps() const;
  size_t plans() const;
  LayerOpTimes times() const;
  void reset_times();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dfp
