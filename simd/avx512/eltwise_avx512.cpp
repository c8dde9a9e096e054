// AVX-512 element-wise FP32 kernels (bit-identical to simd/ref/eltwise_ref.cpp; masked tails).
#include <immintrin.h>

#include "simd/kernel_table.hpp"

namespace dfp::simd::avx512 {
namespace {
inline __mmask16 tail(size_t left) { return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1); }
}  // namespace

float relu_fwd(const float* x, float* y, uint16_t* mask, size_t n) {
  const __m512 z = _mm512_setzero_ps();
  __m512 mx = z;
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    // x > 0 ? x : 0 (maxps would turn -0 and NaN differently from the reference's compare)
    const __mmask16 pos = _mm512_cmp_ps_mask(v, z, _CMP_GT_OQ) & m;
    const __m512 r = _mm512_maskz_mov_ps(pos, v);
    _mm512_mask_storeu_ps(y + i, m, r);
    mx = _mm512_max_ps(mx, r);
    mask[i / 16] = pos;
  }
  return _mm512_reduce_max_ps(mx);
}

float add_relu(const float* a, const float* b, float* y, uint16_t* mask, size_t n) {
  const __m512 z = _mm512_setzero_ps();
  __m512 mx = z;
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail(n - i);
    const __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i));
    const __mmask16 pos = _mm512_cmp_ps_mask(v, z, _CMP_GT_OQ) & m;  // as relu_fwd
    const __m512 r = _mm512_maskz_mov_ps(pos, v);
    _mm512_mask_storeu_ps(y + i, m, r);
    mx = _mm512_max_ps(mx, r);
    mask[i / 16] = pos;
  }
  return _mm512_reduce_max_ps(mx);
}

void relu_bwd(const uint16_t* mask, const float* dy, float* dx, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail(n - i);
    _mm512_mask_storeu_ps(dx + i, m, _mm512_maskz_loadu_ps(__mmask16(mask[i / 16]) & m, dy + i));
  }
}

void add(const float* a, const float* b, float* y, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i)));
  }
}
void shift_lanes(const float* a, const float* b, int shift, size_t in_step, float* out, size_t out_step, size_t pixels,
                 uint16_t keep) {
  // Lane l takes element l + shift of the 32 that a's and b's pixels make: one two-source permute.
  const __m512i idx = _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                       _mm512_set1_epi32(shift));
  // Lanes whose source is absent are not kept.
  __mmask16 k = keep;
  for (int l = 0; l < 16; ++l)
    if (!(l + shift < 16 ? a : b)) k &= static_cast<__mmask16>(~(1u << l));
  const __m512 z = _mm512_setzero_ps();
  for (size_t p = 0; p < pixels; ++p) {
    const __m512 va = a ? _mm512_loadu_ps(a + p * in_step * 16) : z;
    const __m512 vb = b ? _mm512_loadu_ps(b + p * in_step * 16) : z;
    _mm512_storeu_ps(out + p * out_step * 16, _mm512_maskz_permutex2var_ps(k, va, idx, vb));
  }
}
}  // namespace dfp::simd::avx512
