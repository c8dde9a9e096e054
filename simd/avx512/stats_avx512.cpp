// AVX-512 rounding statistics of sampled steps (simd/kernel_table.hpp: Dfp16StatsFn), bit-identical
// to simd/ref's: the same 16 lanes (two vectors of 8 doubles), each product and sum rounded on
// its own (this file is compiled with -ffp-contract=off), the lanes added in order at the end.
#include <immintrin.h>

#include "simd/kernel_table.hpp"

namespace dfp::simd::avx512 {

FormatStats dfp16_stats(const float* x, size_t n, double down, double up) {
  static_assert(kStatsLanes == 16);
  __m512d signal[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
  __m512d noise[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
  const __m512d vdown = _mm512_set1_pd(down), vup = _mm512_set1_pd(up), zero = _mm512_setzero_pd();
  const __m512d limit = _mm512_set1_pd(32767.5), top = _mm512_set1_pd(32767.0);
  const __m512d sign_bit = _mm512_set1_pd(-0.0);
  uint64_t nonzero = 0, saturated = 0, underflow = 0, nonfinite = 0;
  for (size_t i = 0; i < n; i += 16) {
    // The tail reads zeros: they add +0 to the sums and count nowhere.
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    const __m512 f = _mm512_maskz_loadu_ps(m, x + i);
    for (int h = 0; h < 2; ++h) {
      __m512d v = _mm512_cvtps_pd(h ? _mm512_extractf32x8_ps(f, 1) : _mm512_castps512_ps256(f));
      const __mmask8 finite = _mm512_cmp_pd_mask(_mm512_sub_pd(v, v), zero, _CMP_EQ_OQ);
      nonfinite += 8 - unsigned(__builtin_popcount(finite));
      v = _mm512_maskz_mov_pd(finite, v);
      signal[h] = _mm512_add_pd(signal[h], _mm512_mul_pd(v, v));
      const __mmask8 nz = _mm512_cmp_pd_mask(v, zero, _CMP_NEQ_OQ);
      nonzero += unsigned(__builtin_popcount(nz));
      const __m512d y = _mm512_mul_pd(v, vdown);
      const __mmask8 sat = _mm512_cmp_pd_mask(_mm512_andnot_pd(sign_bit, y), limit, _CMP_GE_OQ);
      saturated += unsigned(__builtin_popcount(sat));
      __m512d q = _mm512_roundscale_pd(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      q = _mm512_mask_mov_pd(q, sat, _mm512_or_pd(top, _mm512_and_pd(sign_bit, y)));
      const __m512d r = _mm512_mul_pd(q, vup);
      underflow += unsigned(__builtin_popcount(nz & _mm512_cmp_pd_mask(r, zero, _CMP_EQ_OQ)));
      const __m512d d = _mm512_sub_pd(v, r);
      noise[h] = _mm512_add_pd(noise[h], _mm512_mul_pd(d, d));
    }
  }
  alignas(64) double sl[16], nl[16];
  _mm512_store_pd(sl, signal[0]);
  _mm512_store_pd(sl + 8, signal[1]);
  _mm512_store_pd(nl, noise[0]);
  _mm512_store_pd(nl + 8, noise[1]);
  FormatStats s;
  s.elements = n;
  for (int l = 0; l < 16; ++l) {
    s.signal += sl[l];
    s.noise += nl[l];
  }
  s.nonzero = nonzero, s.overflow = saturated, s.underflow = underflow, s.nonfinite = nonfinite;
  return s;
}

}  // namespace dfp::simd::avx512
