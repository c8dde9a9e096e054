// The optimizer's element-wise update (simd/optim_xsimd.hpp) instantiated for AVX2, compiled with
// -ffp-contract=off (no FMA: every product and sum rounds as the reference's does).
#include "simd/optim_xsimd.hpp"

namespace dfp::simd {

float avx2::sgd_update(float* w, const float* grad, float* v, size_t n, const SgdArgs& a) {
  return a.nesterov ? sgd_update_simd<xsimd::avx2, true>(w, grad, v, n, a)
                    : sgd_update_simd<xsimd::avx2, false>(w, grad, v, n, a);
}

}  // namespace dfp::simd
