// Block DFP at the avx2 level, bit-identical to dfp16_round_block (include/dfp/dfp16.hpp): the
// AVX-512 form's arithmetic (simd/avx512/dfp16_block_avx512.cpp) on 8 lanes. Without VGETEXPPS a
// subnormal maximum is first scaled by 2^64 (exactly) to read its exponent off the bits. The last
// lanes % 8 lanes of a row kernel run the reference.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "simd/kernel_table.hpp"

namespace dfp::simd::avx2 {
namespace {

inline __m256i splat(int v) { return _mm256_set1_epi32(v); }
inline __m256 pow2(__m256i e) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, splat(127)), 23)); }
inline __m256 abs_ps(__m256 x) { return _mm256_and_ps(x, _mm256_castsi256_ps(splat(0x7FFFFFFF))); }

struct BlockScale {  // as at the AVX-512 levels
  __m256 up1, up2, down1, down2;
  explicit BlockScale(__m256i e) {
    const __m256i s = _mm256_sub_epi32(_mm256_setzero_si256(), e);
    const __m256i s1 = _mm256_min_epi32(s, splat(127)), d1 = _mm256_max_epi32(e, splat(-126));
    up1 = pow2(s1), up2 = pow2(_mm256_sub_epi32(s, s1));
    down1 = pow2(d1), down2 = pow2(_mm256_sub_epi32(e, d1));
  }
};

inline __m256 round_block(__m256 x, const BlockScale& k, bool biased) {
  const __m256 y = _mm256_mul_ps(_mm256_mul_ps(x, k.up1), k.up2);
  __m256 q;
  if (biased) {
    const __m256 sign = _mm256_and_ps(y, _mm256_castsi256_ps(splat(int(0x80000000u))));
    const __m256 a = abs_ps(y);
    const __m256 fl = _mm256_round_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m256 up = _mm256_cmp_ps(_mm256_sub_ps(a, fl), _mm256_set1_ps(0.25f), _CMP_GE_OQ);
    q = _mm256_or_ps(_mm256_add_ps(fl, _mm256_and_ps(up, _mm256_set1_ps(1.f))), sign);
  } else {
    q = _mm256_round_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  q = _mm256_min_ps(_mm256_max_ps(q, _mm256_set1_ps(-32767.f)), _mm256_set1_ps(32767.f));
  q = _mm256_add_ps(q, _mm256_setzero_ps());  // an integer: -0 is +0
  return _mm256_mul_ps(_mm256_mul_ps(q, k.down1), k.down2);
}

// dfp16_exponent of each lane's maximum (0 for a zero one).
inline __m256i block_exponent(__m256 amax, int headroom) {
  const __m256 sub = _mm256_cmp_ps(amax, _mm256_set1_ps(0x1p-126f), _CMP_LT_OQ);
  const __m256 m = _mm256_blendv_ps(amax, _mm256_mul_ps(amax, _mm256_set1_ps(0x1p64f)), sub);
  __m256i e = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(m), 23), splat(127 + 14 - headroom));
  e = _mm256_sub_epi32(e, _mm256_and_si256(_mm256_castps_si256(sub), splat(64)));
  return _mm256_andnot_si256(_mm256_castps_si256(_mm256_cmp_ps(amax, _mm256_setzero_ps(), _CMP_EQ_OQ)), e);
}

}  // namespace

void dfp16_lanes(const float* src, float* dst, size_t planes, size_t pixels, int headroom, Rounding r, int* lo,
                 int* hi) {
  const size_t plane = pixels * 16;
  const bool biased = r == Rounding::biased;
  const __m256 inf = _mm256_set1_ps(INFINITY), nan = _mm256_set1_ps(NAN);
  __m256 v[16];
  for (size_t p = 0; p < pixels; ++p) {
    __m256 amax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    for (size_t j = 0; j < planes; ++j)
      for (size_t h = 0; h < 2; ++h) {
        v[2 * j + h] = _mm256_loadu_ps(src + j * plane + p * 16 + h * 8);
        const __m256 a = abs_ps(v[2 * j + h]);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));
        amax = _mm256_max_ps(amax, a);
      }
    if (_mm256_movemask_ps(bad)) {
      for (size_t j = 0; j < planes; ++j)
        _mm256_storeu_ps(dst + j * plane + p * 16, nan), _mm256_storeu_ps(dst + j * plane + p * 16 + 8, nan);
      continue;
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const float m = _mm_cvtss_f32(m4);
    const __m256i e = block_exponent(_mm256_set1_ps(m), headroom);
    const BlockScale k(e);
    for (size_t j = 0; j < planes; ++j)
      for (size_t h = 0; h < 2; ++h) _mm256_storeu_ps(dst + j * plane + p * 16 + h * 8, round_block(v[2 * j + h], k, biased));
    if (m > 0.f) {
      const int es = _mm256_extract_epi32(e, 0);
      *lo = std::min(*lo, es);
      *hi = std::max(*hi, es);
    }
  }
}

void dfp16_rows(const float* src, float* dst, size_t rows, size_t lanes, size_t stride, size_t block, int headroom,
                Rounding r, int* lo, int* hi) {
  const bool biased = r == Rounding::biased;
  const __m256 inf = _mm256_set1_ps(INFINITY), nan = _mm256_set1_ps(NAN);
  size_t l = 0;
  for (; l + 8 <= lanes; l += 8) {
    for (size_t r0 = 0; r0 < rows; r0 += block) {
      const size_t r1 = std::min(rows, r0 + block);
      __m256 amax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
      for (size_t i = r0; i < r1; ++i) {
        const __m256 a = abs_ps(_mm256_loadu_ps(src + i * stride + l));
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));
        amax = _mm256_max_ps(amax, a);
      }
      const __m256i e = block_exponent(amax, headroom);
      const BlockScale k(e);
      for (size_t i = r0; i < r1; ++i) {
        const __m256 q = round_block(_mm256_loadu_ps(src + i * stride + l), k, biased);
        _mm256_storeu_ps(dst + i * stride + l, _mm256_blendv_ps(q, nan, bad));
      }
      alignas(32) int es[8];
      alignas(32) float ms[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(es), e);
      _mm256_store_ps(ms, amax);
      const int bad_bits = _mm256_movemask_ps(bad);
      for (int j = 0; j < 8; ++j)
        if (!(bad_bits >> j & 1) && ms[j] > 0.f) *lo = std::min(*lo, es[j]), *hi = std::max(*hi, es[j]);
    }
  }
  if (l < lanes) ref::dfp16_rows(src + l, dst + l, rows, lanes - l, stride, block, headroom, r, lo, hi);
}

}  // namespace dfp::simd::avx2
