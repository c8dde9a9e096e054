// The optimizer's element-wise update written once with xsimd (portable SIMD: the same source
// builds for any architecture xsimd knows), instantiated here for AVX-512. Compiled with
// -ffp-contract=off: GCC would otherwise fuse the multiplies and adds into FMAs and the bits
// would leave the reference's (kernel_table.hpp).
#include <xsimd/xsimd.hpp>

#include "simd/kernel_table.hpp"

namespace dfp::simd {
namespace {
template <class Arch, bool Nesterov>
void sgd_update_simd(float* w, const float* grad, float* v, size_t n, const SgdArgs& a) {
  using B = xsimd::batch<float, Arch>;
  const B lr(a.lr), m(a.momentum), wd(a.weight_decay);
  size_t i = 0;
  for (; i + B::size <= n; i += B::size) {
    const B wi = B::load_unaligned(w + i);
    const B g = B::load_unaligned(grad + i) + wd * wi;
    const B vi = m * B::load_unaligned(v + i) + g;
    vi.store_unaligned(v + i);
    (wi - lr * (Nesterov ? g + m * vi : vi)).store_unaligned(w + i);
  }
  ref::sgd_update(w + i, grad + i, v + i, n - i, a);  // the tail: the same operations on scalars
}
}  // namespace

void avx512::sgd_update(float* w, const float* grad, float* v, size_t n, const SgdArgs& a) {
  if (a.nesterov) sgd_update_simd<xsimd::avx512f, true>(w, grad, v, n, a);
  else sgd_update_simd<xsimd::avx512f, false>(w, grad, v, n, a);
}
}  // namespace dfp::simd
