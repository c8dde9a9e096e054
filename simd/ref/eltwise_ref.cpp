// Scalar references of the element-wise FP32 kernels.
#include <algorithm>

#include "simd/kernel_table.hpp"

namespace dfp::simd::ref {
void relu_fwd(const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
void relu_bwd(const float* y, const float* dy, float* dx, size_t n) {
  for (size_t i = 0; i < n; ++i) dx[i] = y[i] > 0.f ? dy[i] : 0.f;
}
void add(const float* a, const float* b, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}
}  // namespace dfp::simd::ref
