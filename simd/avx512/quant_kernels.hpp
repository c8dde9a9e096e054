// AVX-512 DFP16 quantization, written once and instantiated per stochastic stream generator:
//   ArsVaes:  VAES, one instruction per round for four counters (quant_avx512.cpp, -mvaes)
//   ArsAesni: 128-bit AES-NI                                     (quant_aesni.cpp, -maes)
// The AES-NI form has its own translation unit compiled without -mvaes: with VAES and AVX512VL
// enabled a compiler may encode a 128-bit AESENC in EVEX form (xmm16-31), which needs VAES.
//
// The kernels give the reference's bits (simd/ref/quant_ref.cpp): each rounding is an exactly
// specified operation on exact values. Tails are handled with masks, not a scalar loop, so every
// element takes the same path.
//
// Everything here has internal linkage (see conv_s16_kernels.hpp for why).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "simd/kernel_table.hpp"

namespace dfp::simd {
namespace {

constexpr int kNonFiniteClasses = 0x01 | 0x08 | 0x10 | 0x80;  // QNaN, +Inf, -Inf, SNaN

// Element i of a call draws word (index_base + i) % 4 of block (index_base + i) / 4. The stream
// runs over whole blocks from block index_base / 4, so each 16 elements take 16 words that start
// `skew` = index_base % 4 words into the current 16-word vector: one two-source permute. Without a
// skew (the common case: callers cut tensors at multiples of 16) the vectors are used as they come.
template <class Gen>
class RoundingStream {
 public:
  RoundingStream(uint64_t seed, uint64_t index_base)
      : gen_(seed, index_base >> 2),
        skewed_((index_base & 3) != 0),
        pick_(_mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                               _mm512_set1_epi32(static_cast<int>(index_base & 3)))),
        cur_(skewed_ ? gen_.next() : _mm512_setzero_si512()) {}
  // u in [0, 1) for the next 16 elements: rand24 * 2^-24, exact.
  __m512 next_unit() {
    __m512i words = gen_.next();
    if (skewed_) {
      const __m512i nxt = words;
      words = _mm512_permutex2var_epi32(cur_, pick_, nxt);
      cur_ = nxt;
    }
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(words, 8)), _mm512_set1_ps(0x1p-24f));
  }

 private:
  Gen gen_;
  bool skewed_;
  __m512i pick_, cur_;
};

struct NoStream {
  __m512 next_unit() { return _mm512_setzero_ps(); }
};

// The scale of one call. Nearest and biased: y = scalef(x, -e). Stochastic: q = floor(y + u)
// computed as one FMA rounded down, fma_RD(x1, 2^k, u), whose floor is the exact floor of the
// real sum (the largest float <= the sum is >= its integer floor, which is a float). 2^k must be a
// normal float, so k = clamp(-e, -126, 127) and x1 = scalef(x, -e - k); the pre-scale is 0 for
// every exponent a tensor's own maximum gives, except for tensors below 2^-110.
struct Scale {
  explicit Scale(int exponent)
      : neg_e(_mm512_set1_ps(static_cast<float>(-exponent))),
        k(std::clamp(-exponent, -126, 127)),
        pre(-exponent - k),
        pre_v(_mm512_set1_ps(static_cast<float>(pre))),
        s(_mm512_set1_ps(std::ldexp(1.f, k))) {}
  __m512 neg_e;
  int k, pre;
  __m512 pre_v, s;
};

constexpr int kRoundDown = _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC;

inline __m512 stochastic_sum(__m512 x, const Scale& sc, __m512 u) {
  if (sc.pre) x = _mm512_scalef_ps(x, sc.pre_v);
  return _mm512_fmadd_round_ps(x, sc.s, u, kRoundDown);
}

// The checked path: every element's saturation and non-finite input is counted.
template <Rounding R>
inline void quantize_block(const float* src, int16_t* dst, __mmask16 m, const Scale& sc, __m512 u,
                           uint64_t& saturated, uint64_t& bad, __m512& max_q) {
  __m512 x = _mm512_maskz_loadu_ps(m, src);
  const __mmask16 nf = _mm512_fpclass_ps_mask(x, kNonFiniteClasses) & m;
  if (nf) { bad += static_cast<uint64_t>(__builtin_popcount(nf)); x = _mm512_mask_mov_ps(x, nf, _mm512_setzero_ps()); }
  if constexpr (R == Rounding::nearest_even) {
    const __m512 y = _mm512_scalef_ps(x, sc.neg_e);
    // The conversion rounds half to even itself, so y is clamped and converted without a separate
    // rounding step. Same results as rounding first: |round(y)| > 32767 exactly when
    // |y| >= 32767.5, and every y beyond +-32767 rounds to a value that clamps to +-32767.
    // max_q collects max|y|; quantize_checked rounds it once (rounding is monotonic and odd).
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
    q = _mm512_roundscale_ps(stochastic_sum(x, sc, u), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  } else {
    const __m512 y = _mm512_scalef_ps(x, sc.neg_e);
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
void quantize_checked(const float* src, int16_t* dst, size_t n, const Scale& sc, Stream stream,
                      QuantCounters* counters) {
  uint64_t saturated = 0, bad = 0;
  __m512 max_q = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    quantize_block<R>(src + i, dst + i, 0xFFFF, sc, stream.next_unit(), saturated, bad, max_q);
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    quantize_block<R>(src + i, dst + i, m, sc, stream.next_unit(), saturated, bad, max_q);
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

// 16 rounded values as INT32, unclamped: a NaN, an Inf or a value beyond INT32 converts to
// INT32_MIN (the "integer indefinite").
template <Rounding R>
inline __m512i round16(__m512 x, const Scale& sc, __m512 u) {
  if constexpr (R == Rounding::nearest_even)
    return _mm512_cvt_roundps_epi32(_mm512_scalef_ps(x, sc.neg_e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  else
    return _mm512_cvt_roundps_epi32(stochastic_sum(x, sc, u), kRoundDown);
}

// The common case without per-element checks, 32 elements a step: round, pack with signed
// saturation (VPACKSSDW), track max|q| in 16 bits. Anything the checked path would count shows
// up as |q| >= 32767: a saturating value packs to +-32767 or -32768, a NaN or Inf to -32768
// (INT32_MIN), and |-32768| is 32768 unsigned. Then it returns false and the caller redoes the
// call on the checked path; with the default headroom no element comes near 32767. The output
// is the checked path's bit for bit whenever it returns true. K outputs at K exponents (sc[k]
// into dst[k], max|q| into max_q[k]): each 32 elements are loaded, and their stochastic draws
// made, once for all of them; false when any output would have counted something.
template <Rounding R, int K, class Stream>
bool quantize_unchecked(const float* src, int16_t* const (&dst)[K], size_t n, const Scale* const (&sc)[K],
                        Stream stream, int32_t (&max_q)[K]) {
  const __m512i order = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);  // undoes VPACKSSDW's lane interleave
  __m512i peak[K];
  for (int k = 0; k < K; ++k) peak[k] = _mm512_setzero_si512();
  // Rounds x0, x1 (draws u0, u1) at every exponent; store(k, q) writes output k's 32 values.
  auto round_all = [&](__m512 x0, __m512 x1, __m512 u0, __m512 u1, auto&& store) {
    for (int k = 0; k < K; ++k) {
      const __m512i q =
          _mm512_permutexvar_epi64(order, _mm512_packs_epi32(round16<R>(x0, *sc[k], u0), round16<R>(x1, *sc[k], u1)));
      peak[k] = _mm512_max_epu16(peak[k], _mm512_abs_epi16(q));
      store(k, q);
    }
  };
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 u0 = stream.next_unit(), u1 = stream.next_unit();
    round_all(_mm512_loadu_ps(src + i), _mm512_loadu_ps(src + i + 16), u0, u1,
              [&](int k, __m512i q) { _mm512_storeu_si512(dst[k] + i, q); });
  }
  if (i < n) {
    const size_t left = n - i;
    const __mmask16 m0 = left >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
    const __mmask16 m1 = left > 16 ? static_cast<__mmask16>((1u << (left - 16)) - 1) : __mmask16(0);
    const __mmask32 m = static_cast<__mmask32>((uint64_t{1} << left) - 1);
    // Masked-off lanes read 0, which rounds to 0 in every mode.
    const __m512 u0 = stream.next_unit(), u1 = left > 16 ? stream.next_unit() : _mm512_setzero_ps();
    round_all(_mm512_maskz_loadu_ps(m0, src + i), _mm512_maskz_loadu_ps(m1, src + i + 16), u0, u1,
              [&](int k, __m512i q) { _mm512_mask_storeu_epi16(dst[k] + i, m, q); });
  }
  bool clean = true;
  for (int k = 0; k < K; ++k) {
    const __m512i lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(peak[k]));
    const __m512i hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(peak[k], 1));
    max_q[k] = static_cast<int32_t>(_mm512_reduce_max_epu32(_mm512_max_epu32(lo, hi)));
    clean &= max_q[k] < 32767;
  }
  return clean;
}

template <Rounding R, class MakeStream>
void quantize_impl(const float* src, int16_t* dst, size_t n, int exponent, MakeStream make_stream,
                   QuantCounters* counters) {
  const Scale sc(exponent);
  if constexpr (R != Rounding::biased) {
    int32_t mq[1] = {0};
    if (quantize_unchecked<R, 1>(src, {dst}, n, {&sc}, make_stream(), mq)) {
      if (counters && mq[0] > counters->max_abs_q) counters->max_abs_q = mq[0];
      return;
    }
  }
  quantize_checked<R>(src, dst, n, sc, make_stream(), counters);
}

template <class Gen>
void quantize_with(const float* src, int16_t* dst, size_t n, int exponent, Rounding rounding, uint64_t seed,
                   uint64_t index_base, QuantCounters* counters) {
  const auto none = [] { return NoStream{}; };
  switch (rounding) {
    case Rounding::nearest_even:
      return quantize_impl<Rounding::nearest_even>(src, dst, n, exponent, none, counters);
    case Rounding::stochastic:
      return quantize_impl<Rounding::stochastic>(
          src, dst, n, exponent, [&] { return RoundingStream<Gen>(seed, index_base); }, counters);
    case Rounding::biased:
      return quantize_impl<Rounding::biased>(src, dst, n, exponent, none, counters);
  }
}

// quantize_impl at two exponents: one unchecked pass for both, else the checked path for each.
template <Rounding R, class MakeStream>
void quantize2_impl(const float* src, int16_t* dst_a, int16_t* dst_b, size_t n, int exponent_a, int exponent_b,
                    MakeStream make_stream, QuantCounters* counters_a, QuantCounters* counters_b) {
  const Scale sa(exponent_a), sb(exponent_b);
  int32_t mq[2] = {0, 0};
  if (quantize_unchecked<R, 2>(src, {dst_a, dst_b}, n, {&sa, &sb}, make_stream(), mq)) {
    if (counters_a && mq[0] > counters_a->max_abs_q) counters_a->max_abs_q = mq[0];
    if (counters_b && mq[1] > counters_b->max_abs_q) counters_b->max_abs_q = mq[1];
    return;
  }
  quantize_checked<R>(src, dst_a, n, sa, make_stream(), counters_a);
  quantize_checked<R>(src, dst_b, n, sb, make_stream(), counters_b);
}

// Quantize2Fn: one pass for nearest-even and stochastic rounding (biased: one quantize_with each,
// as it has no unchecked path).
template <class Gen>
void quantize2_with(const float* src, int16_t* dst_a, int16_t* dst_b, size_t n, int exponent_a, int exponent_b,
                    Rounding rounding, uint64_t seed, uint64_t index_base, QuantCounters* counters_a,
                    QuantCounters* counters_b) {
  switch (rounding) {
    case Rounding::nearest_even:
      return quantize2_impl<Rounding::nearest_even>(src, dst_a, dst_b, n, exponent_a, exponent_b,
                                                    [] { return NoStream{}; }, counters_a, counters_b);
    case Rounding::stochastic:
      return quantize2_impl<Rounding::stochastic>(src, dst_a, dst_b, n, exponent_a, exponent_b,
                                                  [&] { return RoundingStream<Gen>(seed, index_base); }, counters_a,
                                                  counters_b);
    case Rounding::biased:
      quantize_with<Gen>(src, dst_a, n, exponent_a, rounding, seed, index_base, counters_a);
      quantize_with<Gen>(src, dst_b, n, exponent_b, rounding, seed, index_base, counters_b);
      return;
  }
}

}  // namespace
}  // namespace dfp::simd
