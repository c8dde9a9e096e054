// AVX-512 DFP16 quantization (compiled with -mavx512f/bw/dq/vl and -mvaes): max-abs, the
// VAES form of quantization (quant_kernels.hpp), dequantization and the batch-pair interleave.
#include <cstring>

#include "simd/avx512/quant_kernels.hpp"
#include "simd/avx512/vector_loop.hpp"

namespace dfp::simd::avx512 {
namespace {

// ARS-5 stream (simd/kernel_table.hpp: ars5, dfp16_rand24), 16 numbers per call: the blocks of
// four consecutive counters. VAES runs each round on all four at once.
struct ArsVaes {
  __m512i key[kArsRounds + 1];
  __m512i counters;
  ArsVaes(uint64_t seed, uint64_t counter0) {
    for (int r = 0; r <= kArsRounds; ++r) {
      const Block128 k = ars_round_key(seed, r);
      key[r] = _mm512_broadcast_i32x4(_mm_set_epi64x(static_cast<long long>(k.hi), static_cast<long long>(k.lo)));
    }
    const long long c = static_cast<long long>(counter0);
    counters = _mm512_set_epi64(0, c + 3, 0, c + 2, 0, c + 1, 0, c);
  }
  __m512i next() {
    __m512i v = _mm512_xor_si512(counters, key[0]);
    for (int r = 1; r < kArsRounds; ++r) v = _mm512_aesenc_epi128(v, key[r]);
    v = _mm512_aesenclast_epi128(v, key[kArsRounds]);
    counters = _mm512_add_epi64(counters, _mm512_set_epi64(0, 4, 0, 4, 0, 4, 0, 4));
    return v;
  }
};

}  // namespace

namespace {

// max_abs where some element is not finite: each lane's comparison, counting those.
float max_abs_counting(const float* x, size_t n, uint64_t* nonfinite) {
  __m512 m0 = _mm512_setzero_ps(), m1 = _mm512_setzero_ps();
  uint64_t bad = 0;
  auto one = [&](__m512 v, __mmask16 valid, __m512& m) {
    const __mmask16 nf = _mm512_fpclass_ps_mask(v, kNonFiniteClasses) & valid;
    if (nf) bad += static_cast<uint64_t>(__builtin_popcount(nf));
    m = _mm512_mask_max_ps(m, valid & ~nf, m, _mm512_abs_ps(v));
  };
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    one(_mm512_loadu_ps(x + i), 0xFFFF, m0);
    one(_mm512_loadu_ps(x + i + 16), 0xFFFF, m1);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1);
    one(_mm512_maskz_loadu_ps(m, x + i), m, m0);
  }
  if (nonfinite) *nonfinite += bad;
  return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
}

}  // namespace

// The largest |x| as the largest of the bit patterns with the sign cleared: an unsigned maximum
// orders finite magnitudes as their values (-0 as +0), and a non-finite value, whose exponent
// bits are all ones, is above every finite one; where the largest is such, the counting loop
// runs. Its per-vector class test and masked maximum cost more than the loads on Zen 5
// (docs/measurements.md, session 54); non-finite values come only with an overflow.
float max_abs(const float* x, size_t n, uint64_t* nonfinite) {
  const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF);
  __m512i m0 = _mm512_setzero_si512(), m1 = _mm512_setzero_si512();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_loadu_si512(x + i), magnitude));
    m1 = _mm512_max_epu32(m1, _mm512_and_si512(_mm512_loadu_si512(x + i + 16), magnitude));
  }
  for (; i < n; i += 16)  // masked-off lanes load as 0, which no maximum takes
    m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_maskz_loadu_epi32(tail_mask(n - i), x + i), magnitude));
  const uint32_t top = _mm512_reduce_max_epu32(_mm512_max_epu32(m0, m1));
  if (top >= 0x7F800000u) return max_abs_counting(x, n, nonfinite);
  float r;
  std::memcpy(&r, &top, sizeof r);
  return r;
}

void quantize_vaes(const float* src, int16_t* dst, size_t n, int exponent, Rounding rounding, uint64_t seed,
                   uint64_t index_base, QuantCounters* counters) {
  quantize_with<ArsVaes>(src, dst, n, exponent, rounding, seed, index_base, counters);
}

void quantize2_vaes(const float* src, int16_t* dst_a, int16_t* dst_b, size_t n, int exponent_a, int exponent_b,
                    Rounding rounding, uint64_t seed, uint64_t index_base, QuantCounters* counters_a,
                    QuantCounters* counters_b) {
  quantize2_with<ArsVaes>(src, dst_a, dst_b, n, exponent_a, exponent_b, rounding, seed, index_base, counters_a,
                          counters_b);
}

void dequantize(const int16_t* src, float* dst, size_t n, int exponent) {
  const __m512 e = _mm512_set1_ps(static_cast<float>(exponent));
  size_t i = 0;
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm256_maskz_loadu_epi16(m, src + i)));
    _mm512_mask_storeu_ps(dst + i, m, _mm512_scalef_ps(v, e));
  }
}

void interleave(const int16_t* a, const int16_t* b, int16_t* dst, size_t n) {
  // Word indices that zip 32 words of a (0..31) with 32 words of b (32..63).
  alignas(64) static constexpr uint16_t lo_idx[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                                      8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr uint16_t hi_idx[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                      24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i lo = _mm512_load_si512(lo_idx), hi = _mm512_load_si512(hi_idx);
  for (size_t i = 0; i < n; i += 32) {
    const size_t left = n - i;
    const __mmask32 m = left >= 32 ? ~__mmask32(0) : static_cast<__mmask32>((1ull << left) - 1);
    const __m512i va = _mm512_maskz_loadu_epi16(m, a + i);
    const __m512i vb = b ? _mm512_maskz_loadu_epi16(m, b + i) : _mm512_setzero_si512();
    const __m512i r0 = _mm512_permutex2var_epi16(va, lo, vb);
    const __m512i r1 = _mm512_permutex2var_epi16(va, hi, vb);
    if (left >= 32) {
      _mm512_storeu_si512(dst + 2 * i, r0);
      _mm512_storeu_si512(dst + 2 * i + 32, r1);
    } else {
      const size_t w = 2 * left;  // words to write
      const __mmask32 m0 = w >= 32 ? ~__mmask32(0) : static_cast<__mmask32>((1ull << w) - 1);
      const __mmask32 m1 = w > 32 ? static_cast<__mmask32>((1ull << (w - 32)) - 1) : __mmask32(0);
      _mm512_mask_storeu_epi16(dst + 2 * i, m0, r0);
      _mm512_mask_storeu_epi16(dst + 2 * i + 32, m1, r1);
    }
  }
}

}  // namespace dfp::simd::avx512
