// AVX-512 BF16/FP16 conversions, bit-identical to the scalar specification. Round-to-nearest:
// BF16 by integer arithmetic on the FP32 bits (works on any AVX-512 CPU, no AVX512_BF16
// needed), FP16 by VCVTPS2PH / VCVTPH2PS (F16C semantics, IEEE round-to-nearest-even with
// subnormals). Stochastic rounding is a cold path (a numerics study option): it runs the scalar
// loops.
#include <immintrin.h>

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
