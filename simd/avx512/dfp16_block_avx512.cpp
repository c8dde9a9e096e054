// Block DFP at the AVX-512 levels, bit-identical to dfp16_round_block (include/dfp/dfp16.hpp):
// each block's exponent from its largest magnitude (VGETEXPPS, exact for subnormals too), the
// scaling by 2^-e and back as multiplies by normal powers of two (a second factor where 2^-e or
// 2^e is not a normal float: the first product is exact, the second rounds once, as ldexp does),
// nearest-even by VRNDSCALEPS, biased as floor plus the fraction's test.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "simd/avx512/vector_loop.hpp"
#include "simd/kernel_table.hpp"

namespace dfp::simd::avx512 {
namespace {

inline __m512i splat(int v) { return _mm512_set1_epi32(v); }
// 2^e for integer lanes e in [-126, 127].
inline __m512 pow2(__m512i e) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e, splat(127)), 23)); }

// x * 2^-e = (x * up1) * up2 and i * 2^e = (i * down1) * down2: e lies in [-163, 121] (dfp16_exponent
// of any finite maximum, headroom <= 8), so -e splits into min(-e, 127) and a rest in [0, 36], and
// e into max(e, -126) and a rest in [-37, 0].
struct BlockScale {
  __m512 up1, up2, down1, down2;
  explicit BlockScale(__m512i e) {
    const __m512i s = _mm512_sub_epi32(_mm512_setzero_si512(), e);
    const __m512i s1 = _mm512_min_epi32(s, splat(127)), d1 = _mm512_max_epi32(e, splat(-126));
    up1 = pow2(s1), up2 = pow2(_mm512_sub_epi32(s, s1));
    down1 = pow2(d1), down2 = pow2(_mm512_sub_epi32(e, d1));
  }
};

inline __m512 round_block(__m512 x, const BlockScale& k, bool biased) {
  const __m512 y = _mm512_mul_ps(_mm512_mul_ps(x, k.up1), k.up2);
  __m512 q;
  if (biased) {
    const __m512i sign = _mm512_and_si512(_mm512_castps_si512(y), splat(int(0x80000000u)));
    const __m512 a = _mm512_abs_ps(y);
    const __m512 fl = _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __mmask16 up = _mm512_cmp_ps_mask(_mm512_sub_ps(a, fl), _mm512_set1_ps(0.25f), _CMP_GE_OQ);
    q = _mm512_mask_add_ps(fl, up, fl, _mm512_set1_ps(1.f));
    q = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(q), sign));
  } else {
    q = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  q = _mm512_min_ps(_mm512_max_ps(q, _mm512_set1_ps(-32767.f)), _mm512_set1_ps(32767.f));
  q = _mm512_add_ps(q, _mm512_setzero_ps());  // an integer: -0 is +0
  return _mm512_mul_ps(_mm512_mul_ps(q, k.down1), k.down2);
}

// dfp16_exponent of each lane's maximum (0 for a zero one).
inline __m512i block_exponent(__m512 amax, int headroom) {
  const __m512i e = _mm512_add_epi32(_mm512_cvttps_epi32(_mm512_getexp_ps(amax)), splat(headroom - 14));
  return _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_GT_OQ), e);
}

}  // namespace

void dfp16_lanes(const float* src, float* dst, size_t planes, size_t pixels, int headroom, Rounding r, int* lo,
                 int* hi) {
  const size_t plane = pixels * 16;
  const bool biased = r == Rounding::biased;
  const __m512 kInf = _mm512_set1_ps(INFINITY), kNan = _mm512_set1_ps(NAN);
  __m512 v[8];
  for (size_t p = 0; p < pixels; ++p) {
    __m512 amax = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for (size_t j = 0; j < planes; ++j) {
      v[j] = _mm512_loadu_ps(src + j * plane + p * 16);
      const __m512 a = _mm512_abs_ps(v[j]);
      bad |= _mm512_cmp_ps_mask(a, kInf, _CMP_NLT_UQ);
      amax = _mm512_max_ps(amax, a);
    }
    if (bad) {
      for (size_t j = 0; j < planes; ++j) _mm512_storeu_ps(dst + j * plane + p * 16, kNan);
      continue;
    }
    const float m = _mm512_reduce_max_ps(amax);
    const __m512i e = block_exponent(_mm512_set1_ps(m), headroom);
    const BlockScale k(e);
    for (size_t j = 0; j < planes; ++j) _mm512_storeu_ps(dst + j * plane + p * 16, round_block(v[j], k, biased));
    if (m > 0.f) {
      const int es = _mm512_cvtsi512_si32(e);
      *lo = std::min(*lo, es);
      *hi = std::max(*hi, es);
    }
  }
}

void dfp16_rows(const float* src, float* dst, size_t rows, size_t lanes, size_t stride, size_t block, int headroom,
                Rounding r, int* lo, int* hi) {
  const bool biased = r == Rounding::biased;
  const __m512 kInf = _mm512_set1_ps(INFINITY), kNan = _mm512_set1_ps(NAN);
  for (size_t l = 0; l < lanes; l += 16) {
    const __mmask16 m = tail_mask(lanes - l);
    for (size_t r0 = 0; r0 < rows; r0 += block) {
      const size_t r1 = std::min(rows, r0 + block);
      __m512 amax = _mm512_setzero_ps();
      __mmask16 bad = 0;
      for (size_t i = r0; i < r1; ++i) {
        const __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(m, src + i * stride + l));
        bad |= _mm512_cmp_ps_mask(a, kInf, _CMP_NLT_UQ);
        amax = _mm512_max_ps(amax, a);
      }
      const __m512i e = block_exponent(amax, headroom);
      const BlockScale k(e);
      for (size_t i = r0; i < r1; ++i) {
        const __m512 q = round_block(_mm512_maskz_loadu_ps(m, src + i * stride + l), k, biased);
        _mm512_mask_storeu_ps(dst + i * stride + l, m, _mm512_mask_mov_ps(q, bad, kNan));
      }
      const __mmask16 valid = m & ~bad & _mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_GT_OQ);
      if (valid) {
        *lo = std::min(*lo, _mm512_mask_reduce_min_epi32(valid, e));
        *hi = std::max(*hi, _mm512_mask_reduce_max_epi32(valid, e));
      }
    }
  }
}

}  // namespace dfp::simd::avx512
