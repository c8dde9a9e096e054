// AVX2 BF16/FP16/FP8 conversions (compiled with -mf16c), bit-identical to the scalar specification.
// Round-to-nearest: BF16 by integer arithmetic on the FP32 bits, FP16 by F16C's VCVTPS2PH /
// VCVTPH2PS (IEEE round-to-nearest-even with subnormals). Stochastic rounding is a cold path (a
// numerics study option): it runs the scalar loops, as the last n % 8 elements do.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "simd/kernel_table.hpp"

namespace dfp::simd::avx2 {
namespace {

inline __m256i bf16_bits_rne(__m256 x) {
  const __m256i b = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  // A NaN keeps its upper bits, quieted.
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(r, quiet, nan);
}

// 8 values of at most 16 bits in INT32 lanes, as 8 words.
inline __m128i narrow(__m256i v) {
  return _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}

}  // namespace

void to_bf16(const float* src, uint16_t* dst, size_t n, Rounding r, uint32_t key, uint64_t base) {
  if (r == Rounding::stochastic) return ref::to_bf16(src, dst, n, r, key, base);
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), narrow(bf16_bits_rne(_mm256_loadu_ps(src + i))));
  ref::to_bf16(src + i, dst + i, n - i, r, key, base + i);
}

void round_bf16(const float* src, float* dst, size_t n, Rounding r, uint32_t key, uint64_t base) {
  if (r == Rounding::stochastic) return ref::round_bf16(src, dst, n, r, key, base);
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits_rne(_mm256_loadu_ps(src + i)), 16)));
  ref::round_bf16(src + i, dst + i, n - i, r, key, base + i);
}

void bf16_to_f32(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
  }
  ref::bf16_to_f32(src + i, dst + i, n - i);
}

void to_fp16(const float* src, uint16_t* dst, size_t n, Rounding r, uint32_t key, uint64_t base) {
  if (r == Rounding::stochastic) return ref::to_fp16(src, dst, n, r, key, base);
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  ref::to_fp16(src + i, dst + i, n - i, r, key, base + i);
}

void round_fp16(const float* src, float* dst, size_t n, Rounding r, uint32_t key, uint64_t base) {
  if (r == Rounding::stochastic) return ref::round_fp16(src, dst, n, r, key, base);
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
  ref::round_fp16(src + i, dst + i, n - i, r, key, base + i);
}

void fp16_to_f32(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  ref::fp16_to_f32(src + i, dst + i, n - i);
}

}  // namespace dfp::simd::avx2

// ---- FP8 ----------------------------------------------------------------------------------------
// The AVX-512 form's arithmetic (simd/avx512/float16_avx512.cpp) on 8 lanes; the last n % 8
// elements run the reference.
namespace dfp::simd::avx2 {

float round_fp8(const float* src, float* dst, size_t n, FloatFormat format, Overflow overflow, int scale_exp,
                Rounding r, uint32_t key, uint64_t base) {
  if (r == Rounding::stochastic) return ref::round_fp8(src, dst, n, format, overflow, scale_exp, r, key, base);
  const Float8Info& f = *float8_info(format);
  const __m256 scale = _mm256_set1_ps(std::ldexp(1.0f, scale_exp)), unscale = _mm256_set1_ps(std::ldexp(1.0f, -scale_exp));
  const __m256 min_pow = _mm256_set1_ps(std::ldexp(1.0f, f.min_exponent())), cap = _mm256_set1_ps(0x1p24f);
  const __m256 gap = _mm256_set1_ps(std::ldexp(1.0f, -f.mantissa_bits)), big = _mm256_set1_ps(0x1p23f);
  const __m256 maxv = _mm256_set1_ps(f.max_finite), inf = _mm256_set1_ps(INFINITY);
  const __m256 qnan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000));
  const __m256 over_value = overflow == Overflow::saturate ? maxv : format == FloatFormat::e5m2 ? inf : qnan;
  const __m256 abs_bits = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 exp_bits = _mm256_castsi256_ps(_mm256_set1_epi32(0x7F800000));
  __m256 amax = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(src + i);
    const __m256 ax = _mm256_and_ps(x, abs_bits);
    amax = _mm256_max_ps(amax, _mm256_and_ps(ax, _mm256_cmp_ps(ax, inf, _CMP_LT_OQ)));
    const __m256 y = _mm256_mul_ps(x, scale);
    const __m256 a = _mm256_and_ps(y, abs_bits);
    const __m256 p = _mm256_min_ps(_mm256_max_ps(_mm256_and_ps(y, exp_bits), min_pow), cap);
    const __m256 c = _mm256_mul_ps(_mm256_mul_ps(p, gap), big);
    __m256 q = _mm256_sub_ps(_mm256_add_ps(a, c), c);
    const __m256 over = _mm256_or_ps(_mm256_cmp_ps(q, maxv, _CMP_GT_OQ), _mm256_cmp_ps(a, inf, _CMP_EQ_OQ));
    q = _mm256_blendv_ps(q, over_value, over);
    q = _mm256_blendv_ps(q, qnan, _mm256_cmp_ps(y, y, _CMP_UNORD_Q));
    q = _mm256_or_ps(q, _mm256_andnot_ps(abs_bits, y));
    _mm256_storeu_ps(dst + i, _mm256_mul_ps(q, unscale));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, amax);
  float m = ref::round_fp8(src + i, dst + i, n - i, format, overflow, scale_exp, r, key, base + i);
  for (float v : lanes) m = std::max(m, v);
  return m;
}

}  // namespace dfp::simd::avx2
