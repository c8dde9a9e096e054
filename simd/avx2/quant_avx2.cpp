// AVX2 DFP16 quantization (compiled with -mavx2 -mfma -mf16c -maes): max-abs, rounding
// statistics, quantization with the ARS-5 stream on AES-NI, dequantization and the batch-pair
// interleave. The results are the reference's bits (simd/ref/quant_ref.cpp): every rounding here
// is an exactly specified operation on exact values.
//
// AVX2 has no VSCALEFPS and no embedded rounding: the scale 2^-e is a multiply by a normal power
// of two, which rounds as ldexp does (exact, or correctly rounded where the result is subnormal),
// so the kernels take exponents with -e in [-126, 127] and leave the others (tensors below 2^-110
// or beyond FP32's range after scaling) to the reference. The stochastic floor(y + u) is computed
// from y's integer and fraction parts in exact arithmetic, as the reference does (see
// stochastic_q below).
//
// Tails go through the same vector path on a zero-padded copy: every element takes one path.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "simd/kernel_table.hpp"

namespace dfp::simd::avx2 {
namespace {

inline __m256 abs_ps(__m256 x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.f), x); }
// All-ones where x is not finite: |x| not below Inf (NaN compares unordered).
inline __m256 nonfinite_mask(__m256 x) {
  return _mm256_cmp_ps(abs_ps(x), _mm256_set1_ps(__builtin_inff()), _CMP_NLT_UQ);
}
inline unsigned count(__m256 mask) { return static_cast<unsigned>(__builtin_popcount(_mm256_movemask_ps(mask))); }

// ARS-5 (simd/kernel_table.hpp: ars5, dfp16_rand24) on AES-NI, one 128-bit block per counter:
// 16 words per call, the blocks of four consecutive counters.
struct ArsAesni {
  __m128i key[kArsRounds + 1];
  uint64_t counter;
  ArsAesni(uint64_t seed, uint64_t counter0) : counter(counter0) {
    for (int r = 0; r <= kArsRounds; ++r) {
      const Block128 k = ars_round_key(seed, r);
      key[r] = _mm_set_epi64x(static_cast<long long>(k.hi), static_cast<long long>(k.lo));
    }
  }
  void next(__m256i& w0, __m256i& w1) {
    __m128i v[4];
    for (int j = 0; j < 4; ++j)
      v[j] = _mm_xor_si128(_mm_set_epi64x(0, static_cast<long long>(counter + uint64_t(j))), key[0]);
    for (int r = 1; r < kArsRounds; ++r)
      for (int j = 0; j < 4; ++j) v[j] = _mm_aesenc_si128(v[j], key[r]);
    for (int j = 0; j < 4; ++j) v[j] = _mm_aesenclast_si128(v[j], key[kArsRounds]);
    counter += 4;
    w0 = _mm256_set_m128i(v[1], v[0]);
    w1 = _mm256_set_m128i(v[3], v[2]);
  }
};

// The random words of 16 consecutive elements from index_base on: word (index_base + i) % 4 of
// block (index_base + i) / 4. Without a skew (index_base % 4 == 0, the common case) the blocks
// are used as they come; with one, each 16 elements take 16 words from `skew` words into a
// window of 20 (the current four blocks and the next one's first words).
class RoundingStream {
 public:
  RoundingStream(uint64_t seed, uint64_t index_base)
      : gen_(seed, index_base >> 2), skew_(static_cast<int>(index_base & 3)) {
    if (skew_) {
      __m256i w0, w1;
      gen_.next(w0, w1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(win_), w0);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(win_ + 8), w1);
    }
  }
  // u in [0, 1) as rand24 (an integer-valued float, exact) for the next 16 elements.
  void next(__m256& r0, __m256& r1) {
    __m256i w0, w1;
    gen_.next(w0, w1);
    if (skew_) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(win_ + 16), w0);
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(win_ + skew_));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(win_ + skew_ + 8));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(win_), w0);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(win_ + 8), w1);
      w0 = a;
      w1 = b;
    }
    r0 = _mm256_cvtepi32_ps(_mm256_srli_epi32(w0, 8));
    r1 = _mm256_cvtepi32_ps(_mm256_srli_epi32(w1, 8));
  }

 private:
  ArsAesni gen_;
  int skew_;
  alignas(32) uint32_t win_[24] = {};
};

// floor(y + rand24 * 2^-24) in exact arithmetic, for y = x * 2^-e (a float product, exact unless
// |y| < 2^-126) and x finite; `nonzero`: x != 0. With a = |y|, fl = floor(a), g = a - fl and
// t = g * 2^24 (all exact):
//   y >= 0: fl + 1 when rand24 + floor(t) >= 2^24 (u >= 1 - g), else fl
//   y < 0:  -fl when g == 0; otherwise -fl when rand24 >= ceil(t) (u >= g), else -fl - 1
// The sums are integers below 2^25: exact. Where the product rounds (|y| < 2^-126), every
// nonzero a < 1 gives the exact answer (0, or -1 when rand24 == 0 and y < 0): a product that
// rounds to 0 counts as 2^-149 through `nonzero`. |y| >= 2^24 is clamped there (already integer,
// and saturating).
inline __m256 stochastic_q(__m256 y, __m256 nonzero, __m256 rand24) {
  const __m256 a0 = _mm256_min_ps(abs_ps(y), _mm256_set1_ps(0x1p24f));
  const __m256 a = _mm256_blendv_ps(a0, _mm256_max_ps(a0, _mm256_set1_ps(0x1p-149f)), nonzero);
  const __m256 fl = _mm256_round_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m256 g = _mm256_sub_ps(a, fl);
  const __m256 t = _mm256_mul_ps(g, _mm256_set1_ps(0x1p24f));
  const __m256 one = _mm256_set1_ps(1.f);
  // positive: up = rand24 + floor(t) >= 2^24
  const __m256 ft = _mm256_round_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m256 up = _mm256_cmp_ps(_mm256_add_ps(rand24, ft), _mm256_set1_ps(0x1p24f), _CMP_GE_OQ);
  const __m256 qpos = _mm256_add_ps(fl, _mm256_and_ps(up, one));
  // negative: -(fl + (g > 0 && rand24 < ceil(t)))
  const __m256 ct = _mm256_round_ps(t, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
  const __m256 down = _mm256_and_ps(_mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_GT_OQ),
                                    _mm256_cmp_ps(rand24, ct, _CMP_LT_OQ));
  const __m256 qneg = _mm256_xor_ps(_mm256_add_ps(fl, _mm256_and_ps(down, one)), _mm256_set1_ps(-0.f));
  // y's sign where x != 0 (a product that rounds to -0 is still negative).
  return _mm256_blendv_ps(qpos, qneg, _mm256_and_ps(nonzero, y));
}

// Biased rounding of y (reference round_value): |y| rounds up from a fraction of 0.25, sign kept.
inline __m256 biased_q(__m256 y) {
  const __m256 a = abs_ps(y);
  const __m256 fl = _mm256_round_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m256 up = _mm256_cmp_ps(_mm256_sub_ps(a, fl), _mm256_set1_ps(0.25f), _CMP_GE_OQ);
  const __m256 qa = _mm256_add_ps(fl, _mm256_and_ps(up, _mm256_set1_ps(1.f)));
  return _mm256_or_ps(qa, _mm256_and_ps(y, _mm256_set1_ps(-0.f)));
}

// The counts per lane, as INT32 vectors (a compare's all-ones lane subtracted is one more):
// a MOVMSKPS and a POPCNT per 8 elements on the scalar ports cost 17% of the kernel on L1
// pieces (docs/measurements.md, session 45). A lane counts at most n / 8 elements.
struct Counts {
  __m256i saturated = _mm256_setzero_si256(), bad = _mm256_setzero_si256();
  __m256 max_q = _mm256_setzero_ps();
};

inline uint64_t lane_total(__m256i v) {
  alignas(32) uint32_t l[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(l), v);
  uint64_t t = 0;
  for (uint32_t x : l) t += x;
  return t;
}

// 8 elements: the rounded, clamped values as INT32 (for the caller to pack).
template <Rounding R>
inline __m256i quantize8(__m256 x, __m256 scale, __m256 rand24, Counts& c) {
  const __m256 bad = nonfinite_mask(x);
  c.bad = _mm256_sub_epi32(c.bad, _mm256_castps_si256(bad));
  x = _mm256_andnot_ps(bad, x);
  const __m256 y = _mm256_mul_ps(x, scale);
  __m256 q;
  if constexpr (R == Rounding::nearest_even) {
    q = _mm256_round_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  } else if constexpr (R == Rounding::biased) {
    q = biased_q(y);
  } else {
    const __m256 nonzero = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_NEQ_OQ);
    q = stochastic_q(y, nonzero, rand24);
  }
  const __m256 top = _mm256_set1_ps(32767.f);
  c.saturated = _mm256_sub_epi32(c.saturated, _mm256_castps_si256(_mm256_cmp_ps(abs_ps(q), top, _CMP_GT_OQ)));
  q = _mm256_min_ps(_mm256_max_ps(q, _mm256_set1_ps(-32767.f)), top);
  c.max_q = _mm256_max_ps(c.max_q, abs_ps(q));
  return _mm256_cvtps_epi32(q);  // integer-valued and in range: exact
}

template <Rounding R>
void quantize_impl(const float* src, int16_t* dst, size_t n, int exponent, uint64_t seed, uint64_t index_base,
                   QuantCounters* counters) {
  const __m256 scale = _mm256_set1_ps(std::ldexp(1.f, -exponent));
  Counts c;
  RoundingStream stream(seed, index_base);
  auto block = [&](const float* s, int16_t* d) __attribute__((always_inline)) {
    __m256 r0 = _mm256_setzero_ps(), r1 = _mm256_setzero_ps();
    if constexpr (R == Rounding::stochastic) stream.next(r0, r1);
    const __m256i a = quantize8<R>(_mm256_loadu_ps(s), scale, r0, c);
    const __m256i b = quantize8<R>(_mm256_loadu_ps(s + 8), scale, r1, c);
    // VPACKSSDW packs within 128-bit lanes: put the four quarters back in element order.
    const __m256i q = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), q);
  };
  size_t i = 0;
  for (; i + 16 <= n; i += 16) block(src + i, dst + i);
  if (i < n) {
    // Zeros pad the tail: they round to 0 in every mode and count nowhere.
    alignas(32) float s[16] = {};
    alignas(32) int16_t d[16];
    std::memcpy(s, src + i, (n - i) * sizeof(float));
    block(s, d);
    std::memcpy(dst + i, d, (n - i) * sizeof(int16_t));
  }
  if (counters) {
    counters->saturated += lane_total(c.saturated);
    counters->nonfinite += lane_total(c.bad);
    const __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(c.max_q), _mm256_extractf128_ps(c.max_q, 1));
    alignas(16) float m[4];
    _mm_store_ps(m, m4);
    const int32_t mq = static_cast<int32_t>(std::max(std::max(m[0], m[1]), std::max(m[2], m[3])));
    if (mq > counters->max_abs_q) counters->max_abs_q = mq;
  }
}

// Round-to-nearest-even without per-element checks, as the AVX-512 kernels do it: VROUNDPS, then
// VCVTPS2DQ of the integer-valued result (exact in range; 0x80000000, which packs to -32768, for
// NaN, Inf and |y| >= 2^31) and VPACKSSDW's saturation. Where the largest |q| (VPABSW read as
// unsigned, so -32768 is 32768) reaches 32767, an element may have saturated or not been
// finite: it returns false, and the checked form runs the call again (then its bits and
// counters are the checked form's alone). On L1-resident pieces it runs at about twice the
// checked form's speed (docs/measurements.md, session 48).
bool quantize_nearest_unchecked(const float* src, int16_t* dst, size_t n, int exponent, int32_t& max_q) {
  const __m256 scale = _mm256_set1_ps(std::ldexp(1.f, -exponent));
  __m256i peak = _mm256_setzero_si256();
  auto eight = [&](const float* s) __attribute__((always_inline)) {
    const __m256 y = _mm256_mul_ps(_mm256_loadu_ps(s), scale);
    return _mm256_cvtps_epi32(_mm256_round_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  };
  auto block = [&](const float* s, int16_t* d) __attribute__((always_inline)) {
    // VPACKSSDW packs within 128-bit lanes: put the four quarters back in element order.
    const __m256i q = _mm256_permute4x64_epi64(_mm256_packs_epi32(eight(s), eight(s + 8)), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), q);
    peak = _mm256_max_epu16(peak, _mm256_abs_epi16(q));
  };
  size_t i = 0;
  for (; i + 16 <= n; i += 16) block(src + i, dst + i);
  if (i < n) {  // zeros pad the tail, as in quantize_impl
    alignas(32) float s[16] = {};
    alignas(32) int16_t d[16];
    std::memcpy(s, src + i, (n - i) * sizeof(float));
    block(s, d);
    std::memcpy(dst + i, d, (n - i) * sizeof(int16_t));
  }
  // The largest of the 16 unsigned words: VPHMINPOSUW on their complements.
  const __m128i m = _mm_max_epu16(_mm256_castsi256_si128(peak), _mm256_extracti128_si256(peak, 1));
  const int least = _mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(m, _mm_set1_epi16(-1)))) & 0xFFFF;
  max_q = 0xFFFF - least;
  return max_q < 32767;
}

inline float reduce_max(__m256 v) {
  alignas(32) float m[8];
  _mm256_store_ps(m, v);
  float r = m[0];
  for (int l = 1; l < 8; ++l) r = std::max(r, m[l]);
  return r;
}

}  // namespace

float max_abs(const float* x, size_t n, uint64_t* nonfinite) {
  __m256 m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
  uint64_t bad = 0;
  auto one = [&](__m256 v, __m256& m) {
    const __m256 nonfinite = nonfinite_mask(v);
    bad += count(nonfinite);
    m = _mm256_max_ps(m, _mm256_andnot_ps(nonfinite, abs_ps(v)));
  };
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    one(_mm256_loadu_ps(x + i), m0);
    one(_mm256_loadu_ps(x + i + 8), m1);
  }
  for (; i < n; i += 8) {
    alignas(32) float t[8] = {};  // zeros pad the tail: finite, and no larger than any |x|
    std::memcpy(t, x + i, std::min<size_t>(8, n - i) * sizeof(float));
    one(_mm256_load_ps(t), m0);
  }
  if (nonfinite) *nonfinite += bad;
  return reduce_max(_mm256_max_ps(m0, m1));
}

FormatStats dfp16_stats(const float* x, size_t n, double down, double up) {
  // The reference's 16 lanes as four vectors of 4 doubles (element i in lane i % 16), each
  // product and sum rounded on its own (-ffp-contract=off), the lanes added in order at the end.
  static_assert(kStatsLanes == 16);
  __m256d signal[4], noise[4];
  for (int h = 0; h < 4; ++h) signal[h] = noise[h] = _mm256_setzero_pd();
  const __m256d vdown = _mm256_set1_pd(down), vup = _mm256_set1_pd(up), zero = _mm256_setzero_pd();
  const __m256d limit = _mm256_set1_pd(32767.5), top = _mm256_set1_pd(32767.0);
  const __m256d sign_bit = _mm256_set1_pd(-0.0);
  auto popc = [](__m256d m) { return unsigned(__builtin_popcount(_mm256_movemask_pd(m))); };
  uint64_t nonzero = 0, saturated = 0, underflow = 0, nonfinite = 0;
  for (size_t i = 0; i < n; i += 16) {
    // The tail reads zeros: they add +0 to the sums and count nowhere.
    alignas(32) float t[16] = {};
    const float* p = x + i;
    if (n - i < 16) {
      std::memcpy(t, x + i, (n - i) * sizeof(float));
      p = t;
    }
    for (int h = 0; h < 4; ++h) {
      __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(p + 4 * h));
      const __m256d finite = _mm256_cmp_pd(_mm256_sub_pd(v, v), zero, _CMP_EQ_OQ);
      nonfinite += 4 - popc(finite);
      v = _mm256_and_pd(v, finite);
      signal[h] = _mm256_add_pd(signal[h], _mm256_mul_pd(v, v));
      const __m256d nz = _mm256_cmp_pd(v, zero, _CMP_NEQ_OQ);
      nonzero += popc(nz);
      const __m256d y = _mm256_mul_pd(v, vdown);
      const __m256d sat = _mm256_cmp_pd(_mm256_andnot_pd(sign_bit, y), limit, _CMP_GE_OQ);
      saturated += popc(sat);
      __m256d q = _mm256_round_pd(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      q = _mm256_blendv_pd(q, _mm256_or_pd(top, _mm256_and_pd(sign_bit, y)), sat);
      const __m256d r = _mm256_mul_pd(q, vup);
      underflow += popc(_mm256_and_pd(nz, _mm256_cmp_pd(r, zero, _CMP_EQ_OQ)));
      const __m256d d = _mm256_sub_pd(v, r);
      noise[h] = _mm256_add_pd(noise[h], _mm256_mul_pd(d, d));
    }
  }
  alignas(32) double sl[16], nl[16];
  for (int h = 0; h < 4; ++h) {
    _mm256_store_pd(sl + 4 * h, signal[h]);
    _mm256_store_pd(nl + 4 * h, noise[h]);
  }
  FormatStats s;
  s.elements = n;
  for (int l = 0; l < 16; ++l) {
    s.signal += sl[l];
    s.noise += nl[l];
  }
  s.nonzero = nonzero, s.overflow = saturated, s.underflow = underflow, s.nonfinite = nonfinite;
  return s;
}

void quantize_aesni(const float* src, int16_t* dst, size_t n, int exponent, Rounding rounding, uint64_t seed,
                    uint64_t index_base, QuantCounters* counters) {
  if (-exponent < -126 || -exponent > 127)  // 2^-e is not a normal float: see the file's comment
    return ref::quantize(src, dst, n, exponent, rounding, seed, index_base, counters);
  switch (rounding) {
    case Rounding::nearest_even: {
      int32_t max_q = 0;
      if (!quantize_nearest_unchecked(src, dst, n, exponent, max_q))
        return quantize_impl<Rounding::nearest_even>(src, dst, n, exponent, seed, index_base, counters);
      if (counters && max_q > counters->max_abs_q) counters->max_abs_q = max_q;
      return;
    }
    case Rounding::stochastic:
      return quantize_impl<Rounding::stochastic>(src, dst, n, exponent, seed, index_base, counters);
    case Rounding::biased:
      return quantize_impl<Rounding::biased>(src, dst, n, exponent, seed, index_base, counters);
  }
}

// The two quantizations one after the other (the AVX-512 forms share the draws).
void quantize2_aesni(const float* src, int16_t* dst_a, int16_t* dst_b, size_t n, int exponent_a, int exponent_b,
                     Rounding rounding, uint64_t seed, uint64_t index_base, QuantCounters* counters_a,
                     QuantCounters* counters_b) {
  quantize_aesni(src, dst_a, n, exponent_a, rounding, seed, index_base, counters_a);
  quantize_aesni(src, dst_b, n, exponent_b, rounding, seed, index_base, counters_b);
}

void dequantize(const int16_t* src, float* dst, size_t n, int exponent) {
  if (exponent < -126 || exponent > 127) return ref::dequantize(src, dst, n, exponent);
  const __m256 scale = _mm256_set1_ps(std::ldexp(1.f, exponent));
  auto eight = [&](const int16_t* s, float* d) {
    const __m256i v = _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
    _mm256_storeu_ps(d, _mm256_mul_ps(_mm256_cvtepi32_ps(v), scale));
  };
  size_t i = 0;
  for (; i + 8 <= n; i += 8) eight(src + i, dst + i);
  if (i < n) {
    alignas(32) int16_t s[8] = {};
    alignas(32) float d[8];
    std::memcpy(s, src + i, (n - i) * sizeof(int16_t));
    eight(s, d);
    std::memcpy(dst + i, d, (n - i) * sizeof(float));
  }
}

void interleave(const int16_t* a, const int16_t* b, int16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i va = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i));
    const __m256i vb = b ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i)) : _mm256_setzero_si256();
    // Within 128-bit lanes: lo = a0 b0 .. a3 b3 | a8 b8 .. a11 b11, hi = a4 b4 .. a7 b7 | a12 b12 ..
    const __m256i lo = _mm256_unpacklo_epi16(va, vb), hi = _mm256_unpackhi_epi16(va, vb);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * i), _mm256_permute2x128_si256(lo, hi, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * i + 16), _mm256_permute2x128_si256(lo, hi, 0x31));
  }
  for (; i < n; ++i) {
    dst[2 * i] = a[i];
    dst[2 * i + 1] = b ? b[i] : int16_t{0};
  }
}

}  // namespace dfp::simd::avx2
