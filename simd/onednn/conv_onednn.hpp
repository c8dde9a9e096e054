// dfp/simd/onednn: oneDNN 2.6 FP32 primitives for the FP32 baseline (dfp::ConvF32, dfp::LinearF32).
//
// The user layouts are dfp's: activations nChw16c ([N][ceil(C/16)][H][W][16], which is exactly
// oneDNN's format_tag::nChw16c with its channel padding) and plain weights OIHW [K][C][R][S]; for
// the inner product row-major x[N][C], w[K][C], y[N][K]. Weights are reordered once into the
// layout each primitive chose (format_tag::any); activations are passed straight through when the
// primitive accepts nChw16c (asked for explicitly) and reordered otherwise (e.g. the C=3 first
// layer, where oneDNN's JIT kernels want plain nchw). Everything -- primitives, reorders, the
// weight copies, the intermediate tensors and one shared scratchpad (scratchpad_mode::user) -- is
// created in the constructor, so a call allocates nothing.
//
// Each call binds the context's OpenMP thread count first; the constructor does too, because
// oneDNN's JIT kernels fix their thread partition when the primitive is created.
//
// Not thread-safe: one object runs one call at a time (the user buffers are attached to cached
// memory objects per call).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "dfp/conv.hpp"

namespace dfp::simd::onednn {

class ConvPrimitives {
 public:
  // Throws dfp::Error(unsupported) naming `name` if oneDNN cannot create a primitive. `threads`:
  // the OpenMP thread count bound before creation and before each call.
  // bf16_operands: x, dy (and the packed weights) are BF16 in the same layouts (x, dy passed as
  // uint16_t bit patterns); y, dx and dw stay FP32. set_weights still takes FP32 (oneDNN's
  // reorder rounds to nearest even; pass values already rounded to BF16 to control rounding).
  ConvPrimitives(int threads, const ConvShape& shape, const std::string& name, bool bf16_operands = false);
  ~ConvPrimitives();
  ConvPrimitives(ConvPrimitives&&) noexcept;
  ConvPrimitives& operator=(ConvPrimitives&&) noexcept;

  // pd.impl_info_str() of each pass, e.g. "jit:avx512_core".
  const std::string& impl_forward() const noexcept;
  const std::string& impl_backward_data() const noexcept;
  const std::string& impl_backward_weights() const noexcept;

  void set_weights(const float* w_kcrs);                                    // OIHW
  void forward(const void* x, float* y);                                   // nChw16c -> nChw16c
  void backward_data(const void* dy, float* dx);                           // nChw16c -> nChw16c
  void backward_weights(const void* x, const void* dy, float* dw_kcrs);   // -> OIHW
  // The buffers forward / backward_data read were written since: backward_weights reorders its
  // arguments again rather than reading the copies those calls made.
  void inputs_rewritten() noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// oneDNN's BF16-operand convolution for `shape`, as the bf16 policy runs it; none at the ref level
// (no JIT code there), where oneDNN has no primitive for the shape, or where it has only its
// reference implementation for a pass (a CPU without AVX-512): the caller then rounds the operands
// to BF16 and runs the FP32 operator, the same numerics (exact products, FP32 sums).
std::optional<ConvPrimitives> native_bf16_conv(int threads, const ConvShape& shape, const std::string& name);

// Fully connected without bias: y[n][k] = sum_c x[n][c] * w[k][c].
class InnerProductPrimitives {
 public:
  InnerProductPrimitives(int threads, int batch, int in_features, int out_features,
                         const std::string& name);
  ~InnerProductPrimitives();
  InnerProductPrimitives(InnerProductPrimitives&&) noexcept;
  InnerProductPrimitives& operator=(InnerProductPrimitives&&) noexcept;

  const std::string& impl_forward() const noexcept;
  const std::string& impl_backward_data() const noexcept;
  const std::string& impl_backward_weights() const noexcept;

  void set_weights(const float* w_kc);
  void forward(const float* x_nc, float* y_nk);
  void backward_data(const float* dy_nk, float* dx_nc);
  void backward_weights(const float* x_nc, const float* dy_nk, float* dw_kc);
  void inputs_rewritten() noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dfp::simd::onednn
