// AVX-512 DFP16 quantization, written once and instantiated per stochastic stream generator:
//   ArsVaes:  VAES, one instruction per round for four counters (quant_avx512.cpp, -mvaes)
//   ArsAesni: 128-bit AES-NI                                     (quant_aesni.cpp, -maes)
// The AES-NI form has its own translation unit compiled without -mvaes: with VAES and AVX512VL
// enabled a compiler may encode a 128-bit AESENC in EVEX form (xmm16-31), which needs VAES.
//
// The kernels perform the reference's operations in the same order (simd/ref/quant_ref.cpp):
// scalef by 2^-e, round in the float domain, count and clamp saturation, convert. Tails are
// handled with masks, not a scalar loop, so every element takes the same path.
//
// Everything here has internal linkage (see conv_s16_kernels.hpp for why).
#pragma once

#include <immintrin.h>

#include <cmath>

#include "simd/kernel_table.hpp"

namespace dfp::simd {
namespace {

constexpr int kNonFiniteClasses = 0x01 | 0x08 | 0x10 | 0x80;  // QNaN, +Inf, -Inf, SNaN

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
  if constexpr (R == Rounding::nearest_even) {
    // The conversion rounds half to even itself, so y is clamped and converted without a separate
    // rounding step. Same results as rounding first: |round(y)| > 32767 exactly when
    // |y| >= 32767.5, and every y beyond +-32767 rounds to a value that clamps to +-32767.
    // max_q collects max|y|; quantize_impl rounds it once (rounding is monotonic and odd).
    const __m512 a = _mm512_abs_ps(y);
    const __mmask16 sat = _mm512_cmp_ps_mask(a, _mm512_set1_ps(32767.5f), _CMP_GE_OQ) & m;
    if (sat) saturated += static_cast<uint64_t>(__builtin_popcount(sat));
    max_q = _mm512_mask_max_ps(max_q, m, max_q, a);
    const __m512 c = _mm512_min_ps(_mm512_max_ps(y, _mm512_set1_ps(-32767.f)), _mm512_set1_ps(32767.f));
    const __m512i i32 = _mm512_cvt_roundps_epi32(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_mask_storeu_epi16(dst, m, _mm512_cvtepi32_epi16(i32));
    return;
  }
  __m512 q;
  if constexpr (R == Rounding::stochastic) {
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
    float mqf = _mm512_reduce_max_ps(max_q);
    if constexpr (R == Rounding::nearest_even) mqf = std::fmin(std::nearbyint(mqf), 32767.f);  // max|y| -> max|q|
    const int32_t mq = static_cast<int32_t>(mqf);
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
}  // namespace dfp::simd
