// The optimizer's element-wise update written once with xsimd (portable SIMD: the same source
// builds for any architecture xsimd knows), instantiated per level in a translation unit compiled
// for it (simd/avx512/optim_xsimd.cpp, simd/avx2/optim_xsimd_avx2.cpp) and with -ffp-contract=off:
// GCC would otherwise fuse the multiplies and adds into FMAs and the bits would leave the
// reference's (kernel_table.hpp).
//
// Internal linkage: the translation units are compiled with different ISA flags (see
// simd/avx512/conv_s16_kernels.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

#include <xsimd/xsimd.hpp>

#include "simd/kernel_table.hpp"

namespace dfp::simd {
namespace {
template <class Arch, bool Nesterov>
float sgd_update_simd(float* w, const float* grad, float* v, size_t n, const SgdArgs& a) {
  using B = xsimd::batch<float, Arch>;
  const B lr(a.lr), m(a.momentum), wd(a.weight_decay);
  B max_abs(0.f);
  auto nan = xsimd::batch_bool<float, Arch>(false);
  size_t i = 0;
  for (; i + B::size <= n; i += B::size) {
    const B wi = B::load_unaligned(w + i);
    const B g = B::load_unaligned(grad + i) + wd * wi;
    const B vi = m * B::load_unaligned(v + i) + g;
    vi.store_unaligned(v + i);
    const B wn = wi - lr * (Nesterov ? g + m * vi : vi);
    wn.store_unaligned(w + i);
    max_abs = xsimd::max(max_abs, xsimd::abs(wn));
    nan = nan || xsimd::isnan(wn);
  }
  // The tail: the same operations on scalars. A maximum does not depend on the order.
  const float tail = ref::sgd_update(w + i, grad + i, v + i, n - i, a);
  if (xsimd::any(nan) || std::isnan(tail)) return std::numeric_limits<float>::quiet_NaN();
  alignas(64) float lanes[B::size];  // xsimd 8.1 has no max reduction
  max_abs.store_aligned(lanes);
  return std::max(tail, *std::max_element(lanes, lanes + B::size));
}
}  // namespace
}  // namespace dfp::simd
