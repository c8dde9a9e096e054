// AVX-512 DFP16 quantization (compiled with -mavx512f/bw/dq/vl, and -maes/-mvaes for the
// stochastic stream; the dispatcher picks the VAES or AES-NI form from CPUID). Performs the reference's
// operations in the same order (simd/ref/quant_ref.cpp): scalef by 2^-e, round in the float
// domain, count and clamp saturation, convert. Tails are handled with masks, not a scalar loop,
// so every element takes the same path.
#include <immintrin.h>

#include "simd/kernel_table.hpp"

namespace dfp::simd::avx512 {
namespace {

constexpr int kNonFiniteClasses = 0x01 | 0x08 | 0x10 | 0x80;  // QNaN, +Inf, -Inf, SNaN

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

// The same stream with 128-bit AES-NI, for AVX-512 CPUs without VAES (Skylake-SP, Cascade Lake).
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

// Element i of a call draws word (index_base + i) % 4 of block (index_base + i) / 4. The stream
// runs over whole blocks from block index_base / 4, so each 16 elements take 16 words that start
// `skew` = index_base % 4 words into the current 16-word vector: one two-source permute.
template <class Gen>
class RoundingStream {
 public:
  RoundingStream(uint64_t seed, uint64_t index_base)
      : gen_(seed, index_base >> 2),
        pick_(_mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                               _mm512_set1_epi32(static_cast<int>(index_base & 3)))),
        cur_(gen_.next()) {}
  // u in [0, 1) for the next 16 elements.
  __m512 next_unit() {
    const __m512i nxt = gen_.next();
    const __m512i words = _mm512_permutex2var_epi32(cur_, pick_, nxt);
    cur_ = nxt;
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(words, 8)), _mm512_set1_ps(0x1p-24f));
  }

 private:
  Gen gen_;
  __m512i pick_, cur_;
};

struct NoStream {
  __m512 next_unit() { return _mm512_setzero_ps(); }
};

template <Rounding R>
inline void quantize_block(const float* src, int16_t* dst, __mmask16 m, __m512 neg_e, __m512 u,
                           uint64_t& saturated, uint64_t& bad, __m512& max_q) {
  __m512 x = _mm512_maskz_loadu_ps(m, src);
  const __mmask16 nf = _mm512_fpclass_ps_mask(x, kNonFiniteClasses) & m;
  if (nf) { bad += static_cast<uint64_t>(__builtin_popcount(nf)); x = _mm512_mask_mov_ps(x, nf, _mm512_setzero_ps()); }
  const __m512 y = _mm512_scalef_ps(x, neg_e);
  __m512 q;
  if constexpr (R == Rounding::nearest_even) {
    q = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  } else if constexpr (R == Rounding::stochastic) {
    const __m512 fl = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m512 frac = _mm512_sub_ps(y, fl);
    const __mmask16 up = _mm512_cmp_ps_mask(u, frac, _CMP_LT_OQ);
    q = _mm512_mask_add_ps(fl, up, fl, _mm512_set1_ps(1.f));
  } else {
    const __m512 a = _mm512_abs_ps(y);
    const __m512 fl = _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __mmask16 up = _mm512_cmp_ps_mask(_mm512_sub_ps(a, fl), _mm512_set1_ps(0.25f), _CMP_GE_OQ);
    const __m512 qa = _mm512_mask_add_ps(fl, up, fl, _mm512_set1_ps(1.f));
    // copysign(qa, y)
    const __m512i sign = _mm512_and_si512(_mm512_castps_si512(y), _mm512_set1_epi32(static_cast<int>(0x80000000U)));
    q = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(qa), sign));
  }
  const __mmask16 sat = _mm512_cmp_ps_mask(_mm512_abs_ps(q), _mm512_set1_ps(32767.f), _CMP_GT_OQ) & m;
  if (sat) saturated += static_cast<uint64_t>(__builtin_popcount(sat));
  q = _mm512_min_ps(_mm512_max_ps(q, _mm512_set1_ps(-32767.f)), _mm512_set1_ps(32767.f));
  max_q = _mm512_mask_max_ps(max_q, m, max_q, _mm512_abs_ps(q));
  const __m256i i16 = _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(q));  // q is integer-valued and in range
  _mm256_mask_storeu_epi16(dst, m, i16);
}

template <Rounding R, class Stream>
void quantize_impl(const float* src, int16_t* dst, size_t n, int exponent, Stream stream,
                   QuantCounters* counters) {
  const __m512 neg_e = _mm512_set1_ps(static_cast<float>(-exponent));
  uint64_t saturated = 0, bad = 0;
  __m512 max_q = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    quantize_block<R>(src + i, dst + i, 0xFFFF, neg_e, stream.next_unit(), saturated, bad, max_q);
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    quantize_block<R>(src + i, dst + i, m, neg_e, stream.next_unit(), saturated, bad, max_q);
  }
  if (counters) {
    counters->saturated += saturated;
    counters->nonfinite += bad;
    const int32_t mq = static_cast<int32_t>(_mm512_reduce_max_ps(max_q));
    if (mq > counters->max_abs_q) counters->max_abs_q = mq;
  }
}

template <class Gen>
void quantize_with(const float* src, int16_t* dst, size_t n, int exponent, Rounding rounding, uint64_t seed,
                   uint64_t index_base, QuantCounters* counters) {
  switch (rounding) {
    case Rounding::nearest_even:
      return quantize_impl<Rounding::nearest_even>(src, dst, n, exponent, NoStream{}, counters);
    case Rounding::stochastic:
      return quantize_impl<Rounding::stochastic>(src, dst, n, exponent, RoundingStream<Gen>(seed, index_base),
                                                 counters);
    case Rounding::biased:
      return quantize_impl<Rounding::biased>(src, dst, n, exponent, NoStream{}, counters);
  }
}

}  // namespace

float max_abs(const float* x, size_t n, uint64_t* nonfinite) {
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

void quantize_vaes(const float* src, int16_t* dst, size_t n, int exponent, Rounding rounding, uint64_t seed,
                   uint64_t index_base, QuantCounters* counters) {
  quantize_with<ArsVaes>(src, dst, n, exponent, rounding, seed, index_base, counters);
}

void quantize_aesni(const float* src, int16_t* dst, size_t n, int exponent, Rounding rounding, uint64_t seed,
                    uint64_t index_base, QuantCounters* counters) {
  quantize_with<ArsAesni>(src, dst, n, exponent, rounding, seed, index_base, counters);
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
