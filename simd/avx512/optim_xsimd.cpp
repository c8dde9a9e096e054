// The optimizer's element-wise update (simd/optim_xsimd.hpp) instantiated for AVX-512, compiled
// with -ffp-contract=off; and the xsimd version for `dfp info`.
#include "simd/optim_xsimd.hpp"

namespace dfp::simd {

float avx512::sgd_update(float* w, const float* grad, float* v, size_t n, const SgdArgs& a) {
  return a.nesterov ? sgd_update_simd<xsimd::avx512f, true>(w, grad, v, n, a)
                    : sgd_update_simd<xsimd::avx512f, false>(w, grad, v, n, a);
}
#define DFP_XSIMD_STR2(x) #x
#define DFP_XSIMD_STR(x) DFP_XSIMD_STR2(x)
const char* xsimd_version() noexcept {
  return DFP_XSIMD_STR(XSIMD_VERSION_MAJOR) "." DFP_XSIMD_STR(XSIMD_VERSION_MINOR) "." DFP_XSIMD_STR(XSIMD_VERSION_PATCH);
}

}  // namespace dfp::simd
