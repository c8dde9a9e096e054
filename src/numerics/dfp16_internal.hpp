// The DFP16 exponent's input, one rule for every quantizer (the public ones in dfp16.cpp and the
// convolution's own in src/ops/conv_int16/quantize.cpp): trust the maximum the tensor's producer
// measured, or measure it, refusing non-finite elements under NonFinitePolicy::error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "dfp/dfp16.hpp"

namespace dfp {
class Context;
namespace detail {

// How an error names a tensor: "tensor 'fc.weights'", or "convolution 'conv1': conv1.activations
// tensor" for an operand of the convolution `layer`. Views, so that naming costs nothing until
// an error is raised (a training step allocates nothing).
struct TensorName {
  std::string_view tensor;     // QuantOptions::name
  std::string_view layer = {};  // empty outside a convolution
  std::string text() const;
};
// max|src| over the n elements: `known` when the producer measured it (finite and >= 0; the
// quantizer then still counts non-finite elements), else measured here.
float exponent_max_abs(const Context& ctx, const float* src, size_t n, float known, NonFinitePolicy policy,
                       TensorName what);
// Status::numerical_error: `count` non-finite elements, with the first one's index and value
// (src may be null when the elements came from elsewhere, e.g. a producer's spans).
[[noreturn]] void fail_nonfinite(const float* src, size_t n, uint64_t count, TensorName what);

// Quantizes `slices` consecutive runs of slice_len elements, each with the exponent of its own
// max|x| (written to exps[s]); element i keeps the stochastic index i, as in one tensor. The
// stats' exponent is the largest, exponent_min the smallest of a slice holding a nonzero value.
QuantStats quantize_slices(const Context& ctx, const float* src, int16_t* dst, size_t slices, size_t slice_len,
                           const QuantOptions& options, int* exps);

}  // namespace detail
}  // namespace dfp
