// Scalar reference of the optimizer's element-wise update (compiled without contraction: every
// product and sum rounds on its own, as kernel_table.hpp specifies).
#include "simd/kernel_table.hpp"

namespace dfp::simd::ref {
void sgd_update(float* w, const float* grad, float* v, size_t n, const SgdArgs& a) {
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i] + a.weight_decay * w[i];
    v[i] = a.momentum * v[i] + g;
    w[i] = w[i] - a.lr * (a.nesterov ? g + a.momentum * v[i] : v[i]);
  }
}
}  // namespace dfp::simd::ref
