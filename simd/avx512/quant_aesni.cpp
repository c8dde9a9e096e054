// The AES-NI form of AVX-512 DFP16 quantization (compiled with -mavx512f/bw/dq/vl and -maes, never
// -mvaes), for AVX-512 CPUs without VAES (Skylake-SP, Cascade Lake). See quant_kernels.hpp.
#include "simd/avx512/quant_kernels.hpp"

namespace dfp::simd::avx512 {
namespace {

// The ARS-5 stream of quant_avx512.cpp's ArsVaes, one 128-bit block at a time.
struct ArsAesni {
  __m128i key[kArsRounds + 1];
  uint64_t counter;
  ArsAesni(uint64_t seed, uint64_t counter0) : counter(counter0) {
    for (int r = 0; r <= kArsRounds; ++r) {
      const Block128 k = ars_round_key(seed, r);
      key[r] = _mm_set_epi64x(static_cast<long long>(k.hi), static_cast<long long>(k.lo));
    }
  }
  __m512i next() {
    __m128i v[4];
    for (int j = 0; j < 4; ++j)
      v[j] = _mm_xor_si128(_mm_set_epi64x(0, static_cast<long long>(counter + uint64_t(j))), key[0]);
    for (int r = 1; r < kArsRounds; ++r)
      for (int j = 0; j < 4; ++j) v[j] = _mm_aesenc_si128(v[j], key[r]);
    for (int j = 0; j < 4; ++j) v[j] = _mm_aesenclast_si128(v[j], key[kArsRounds]);
    counter += 4;
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(v[1], v[0])), _mm256_set_m128i(v[3], v[2]), 1);
  }
};

}  // namespace

void quantize_aesni(const float* src, int16_t* dst, size_t n, int exponent, Rounding rounding, uint64_t seed,
                    uint64_t index_base, QuantCounters* counters) {
  quantize_with<ArsAesni>(src, dst, n, exponent, rounding, seed, index_base, counters);
}

void quantize2_aesni(const float* src, int16_t* dst_a, int16_t* dst_b, size_t n, int exponent_a, int exponent_b,
                     Rounding rounding, uint64_t seed, uint64_t index_base, QuantCounters* counters_a,
                     QuantCounters* counters_b) {
  quantize2_with<ArsAesni>(src, dst_a, dst_b, n, exponent_a, exponent_b, rounding, seed, index_base, counters_a,
                           counters_b);
}

}  // namespace dfp::simd::avx512
