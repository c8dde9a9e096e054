// Scalar reference of the optimizer's element-wise update (compiled without contraction: every
// product and sum rounds on its own, as kernel_table.hpp specifies).
#include <algorithm>
#include <cmath>
#include <limits>

#include "simd/kernel_table.hpp"

namespace dfp::simd::ref {
float sgd_update(float* w, const float* grad, float* v, size_t n, const SgdArgs& a) {
  float max_abs = 0.f;
  bool nan = false;
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i] + a.weight_decay * w[i];
    v[i] = a.momentum * v[i] + g;
    w[i] = w[i] - a.lr * (a.nesterov ? g + a.momentum * v[i] : v[i]);
    max_abs = std::max(max_abs, std::fabs(w[i]));
    nan |= std::isnan(w[i]);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : max_abs;
}
}  // namespace dfp::simd::ref
