// The AVX-512 streaming kernels' loop over n elements, 16 at a time: whole vectors through plain
// loads and stores, only the last, partial one through masked ones. Masked loads and stores on
// every vector, and loads masked by a word from memory, ran the element-wise, BatchNorm-backward,
// BF16 and FP8 kernels at 0.3-0.5x the AVX2 ones' speed on Zen 5 (docs/measurements.md, session
// 53); plain ones cost nothing on any CPU.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace dfp::simd::avx512 {

inline __mmask16 tail_mask(size_t left) { return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1); }

// All ones in the lanes whose bit of `word` is set, zero in the others: a ReLU's mask word as a
// vector to AND with (the bits of a zero-masked load, which keeps NaN payloads and gives +0).
inline __m512 mask_lanes(uint16_t word) {
  const __m512i bit = _mm512_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768);
  return _mm512_castsi512_ps(_mm512_movm_epi32(_mm512_test_epi32_mask(_mm512_set1_epi32(word), bit)));
}

// A whole vector: plain loads and stores; mask() is all ones.
struct WholeVector {
  static constexpr __mmask16 mask() { return 0xFFFF; }
  static __m512 load(const float* p) { return _mm512_loadu_ps(p); }
  static __m512i load_u16(const uint16_t* p) {  // zero-extended to 32-bit lanes
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void store(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
  static void store_u16(uint16_t* p, __m512i v) {  // each 32-bit lane's low half
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(v));
  }
};

// The last, partial vector: masked loads (zero past the end) and stores.
struct TailVector {
  __mmask16 m;
  __mmask16 mask() const { return m; }
  __m512 load(const float* p) const { return _mm512_maskz_loadu_ps(m, p); }
  __m512i load_u16(const uint16_t* p) const { return _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)); }
  void store(float* p, __m512 v) const { _mm512_mask_storeu_ps(p, m, v); }
  void store_u16(uint16_t* p, __m512i v) const { _mm512_mask_cvtepi32_storeu_epi16(p, m, v); }
};

// f(i, v) for i = 0, 16, ... < n, with v a WholeVector, or a TailVector for a partial last one.
template <class F>
inline void for_each_vector(size_t n, F&& f) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) f(i, WholeVector{});
  if (i < n) f(i, TailVector{tail_mask(n - i)});
}

}  // namespace dfp::simd::avx512
