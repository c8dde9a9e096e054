// AVX-512 BF16/FP16/FP8 conversions, bit-identical to the scalar specification. Round-to-nearest:
// BF16 by integer arithmetic on the FP32 bits (works on any AVX-512 CPU, no AVX512_BF16
// needed), FP16 by VCVTPS2PH / VCVTPH2PS (F16C semantics, IEEE round-to-nearest-even with
// subnormals). Stochastic rounding is a cold path (a numerics study option): it runs the scalar
// loops.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "simd/kernel_table.hpp"

namespace dfp::simd::avx512 {
namespace {

inline __m512i bf16_bits_rne(__m512 x) {
  const __m512i b = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40));
}

inline __mmask16 tail_mask(size_t left) { return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1); }

}  // namespace

void to_bf16(const float* src, uint16_t* dst, size_t n, Rounding r, uint32_t key, uint64_t base) {
  if (r == Rounding::stochastic) return ref::to_bf16(src, dst, n, r, key, base);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512i h = bf16_bits_rne(_mm512_maskz_loadu_ps(m, src + i));
    _mm512_mask_cvtepi32_storeu_epi16(dst + i, m, h);
  }
}

void round_bf16(const float* src, float* dst, size_t n, Rounding r, uint32_t key, uint64_t base) {
  if (r == Rounding::stochastic) return ref::round_bf16(src, dst, n, r, key, base);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512i h = bf16_bits_rne(_mm512_maskz_loadu_ps(m, src + i));
    _mm512_mask_storeu_ps(dst + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)));
  }
}

void bf16_to_f32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, src + i));
    _mm512_mask_storeu_ps(dst + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)));
  }
}

void to_fp16(const float* src, uint16_t* dst, size_t n, Rounding r, uint32_t key, uint64_t base) {
  if (r == Rounding::stochastic) return ref::to_fp16(src, dst, n, r, key, base);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_mask_storeu_epi16(dst + i, m, h);
  }
}

void round_fp16(const float* src, float* dst, size_t n, Rounding r, uint32_t key, uint64_t base) {
  if (r == Rounding::stochastic) return ref::round_fp16(src, dst, n, r, key, base);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(h));
  }
}

void fp16_to_f32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + i)));
  }
}

}  // namespace dfp::simd::avx512

// ---- FP8 ----------------------------------------------------------------------------------------
// Round-to-nearest-even to the format's gap by float arithmetic: the gap g of |y| is 2^(max(e,
// emin) - m) with e its exponent (from the exponent bits, so exact), and (|y| + g*2^23) - g*2^23
// rounds |y| to a multiple of g in the FP32 addition's own round-to-nearest-even (g*2^23 has
// gap g, and |y| < 2^(m+1) g keeps the sum inside its binade). The exponent is capped at 2^24, far
// above either format's range, so that g*2^23 stays finite: a larger |y| is an overflow anyway.
// Overflow, infinities and NaN are masked in.
namespace dfp::simd::avx512 {

float round_fp8(const float* src, float* dst, size_t n, FloatFormat format, Overflow overflow, int scale_exp,
                Rounding r, uint32_t key, uint64_t base) {
  if (r == Rounding::stochastic) return ref::round_fp8(src, dst, n, format, overflow, scale_exp, r, key, base);
  const Float8Info& f = *float8_info(format);
  const __m512 scale = _mm512_set1_ps(std::ldexp(1.0f, scale_exp)), unscale = _mm512_set1_ps(std::ldexp(1.0f, -scale_exp));
  const __m512 min_pow = _mm512_set1_ps(std::ldexp(1.0f, f.min_exponent())), cap = _mm512_set1_ps(0x1p24f);
  const __m512 gap = _mm512_set1_ps(std::ldexp(1.0f, -f.mantissa_bits)), big = _mm512_set1_ps(0x1p23f);
  const __m512 maxv = _mm512_set1_ps(f.max_finite), inf = _mm512_set1_ps(INFINITY);
  const __m512 qnan = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000));
  const __m512 over_value = overflow == Overflow::saturate ? maxv : format == FloatFormat::e5m2 ? inf : qnan;
  const __m512i abs_bits = _mm512_set1_epi32(0x7FFFFFFF), exp_bits = _mm512_set1_epi32(0x7F800000);
  __m512 amax = _mm512_setzero_ps();
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 x = _mm512_maskz_loadu_ps(m, src + i);
    const __m512 ax = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), abs_bits));
    amax = _mm512_mask_max_ps(amax, _mm512_cmp_ps_mask(ax, inf, _CMP_LT_OQ), amax, ax);
    const __m512 y = _mm512_mul_ps(x, scale);
    const __m512i yb = _mm512_castps_si512(y);
    const __m512 a = _mm512_castsi512_ps(_mm512_and_si512(yb, abs_bits));
    const __m512 p = _mm512_min_ps(_mm512_max_ps(_mm512_castsi512_ps(_mm512_and_si512(yb, exp_bits)), min_pow), cap);
    const __m512 c = _mm512_mul_ps(_mm512_mul_ps(p, gap), big);
    __m512 q = _mm512_sub_ps(_mm512_add_ps(a, c), c);
    const __mmask16 over = _mm512_cmp_ps_mask(q, maxv, _CMP_GT_OQ) | _mm512_cmp_ps_mask(a, inf, _CMP_EQ_OQ);
    q = _mm512_mask_mov_ps(q, over, over_value);
    q = _mm512_mask_mov_ps(q, _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q), qnan);
    q = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(q), _mm512_andnot_si512(abs_bits, yb)));
    _mm512_mask_storeu_ps(dst + i, m, _mm512_mul_ps(q, unscale));
  }
  return _mm512_reduce_max_ps(amax);
}

}  // namespace dfp::simd::avx512
