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

// ---- FP8 and the MX element formats -----------------------------------------------------------
// The AVX-512 forms' arithmetic (simd/avx512/float16_avx512.cpp) on 8 lanes; the last n % 8
// elements (and lanes) run the reference.
namespace dfp::simd::avx2 {
namespace {

struct SmallFloat {
  __m256 min_pow, cap, gap, big, maxv, inf, qnan, over_value, abs_bits, exp_bits;
  SmallFloat(const Float8Info& f, Overflow o)
      : min_pow(_mm256_set1_ps(std::ldexp(1.0f, f.min_exponent()))),
        cap(_mm256_set1_ps(0x1p24f)),
        gap(_mm256_set1_ps(std::ldexp(1.0f, -f.mantissa_bits))),
        big(_mm256_set1_ps(0x1p23f)),
        maxv(_mm256_set1_ps(f.max_finite)),
        inf(_mm256_set1_ps(INFINITY)),
        qnan(_mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000))),
        over_value(o == Overflow::saturate || !f.nonfinite ? maxv : f.format == FloatFormat::e5m2 ? inf : qnan),
        abs_bits(_mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF))),
        exp_bits(_mm256_castsi256_ps(_mm256_set1_epi32(0x7F800000))) {}
};

inline __m256 round_small(__m256 x, __m256 scale, __m256 unscale, const SmallFloat& k) {
  const __m256 y = _mm256_mul_ps(x, scale);
  const __m256 a = _mm256_and_ps(y, k.abs_bits);
  const __m256 p = _mm256_min_ps(_mm256_max_ps(_mm256_and_ps(y, k.exp_bits), k.min_pow), k.cap);
  const __m256 c = _mm256_mul_ps(_mm256_mul_ps(p, k.gap), k.big);
  __m256 q = _mm256_sub_ps(_mm256_add_ps(a, c), c);
  const __m256 over = _mm256_or_ps(_mm256_cmp_ps(q, k.maxv, _CMP_GT_OQ), _mm256_cmp_ps(a, k.inf, _CMP_EQ_OQ));
  q = _mm256_blendv_ps(q, k.over_value, over);
  q = _mm256_blendv_ps(q, k.qnan, _mm256_cmp_ps(y, y, _CMP_UNORD_Q));
  q = _mm256_or_ps(q, _mm256_andnot_ps(k.abs_bits, y));
  return _mm256_mul_ps(q, unscale);
}

inline __m256 pow2(__m256i e) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23)); }

inline __m256i mx_scale(__m256 amax, int emax) {
  const __m256i e = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(amax), 23), _mm256_set1_epi32(127 + emax));
  return _mm256_min_epi32(_mm256_max_epi32(e, _mm256_set1_epi32(-kFloat8MaxScaleExp)), _mm256_set1_epi32(kFloat8MaxScaleExp));
}

inline bool any(__m256 mask) { return _mm256_movemask_ps(mask) != 0; }

}  // namespace

float round_fp8(const float* src, float* dst, size_t n, FloatFormat format, Overflow overflow, int scale_exp,
                Rounding r, uint32_t key, uint64_t base) {
  if (r == Rounding::stochastic) return ref::round_fp8(src, dst, n, format, overflow, scale_exp, r, key, base);
  const SmallFloat k(*float8_info(format), overflow);
  const __m256 scale = _mm256_set1_ps(std::ldexp(1.0f, scale_exp)), unscale = _mm256_set1_ps(std::ldexp(1.0f, -scale_exp));
  __m256 amax = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(src + i);
    const __m256 ax = _mm256_and_ps(x, k.abs_bits);
    amax = _mm256_max_ps(amax, _mm256_and_ps(ax, _mm256_cmp_ps(ax, k.inf, _CMP_LT_OQ)));
    _mm256_storeu_ps(dst + i, round_small(x, scale, unscale, k));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, amax);
  float m = ref::round_fp8(src + i, dst + i, n - i, format, overflow, scale_exp, r, key, base + i);
  for (float v : lanes) m = std::max(m, v);
  return m;
}

void mx_lanes(const float* a, const float* b, float* da, float* db, size_t pixels, FloatFormat format, int* lo,
              int* hi) {
  const Float8Info& f = *float8_info(format);
  const SmallFloat k(f, Overflow::saturate);
  const int emax = f.max_exponent();
  for (size_t p = 0; p < pixels; ++p) {
    __m256 v[4] = {_mm256_loadu_ps(a + p * 16), _mm256_loadu_ps(a + p * 16 + 8), _mm256_setzero_ps(), _mm256_setzero_ps()};
    if (b) v[2] = _mm256_loadu_ps(b + p * 16), v[3] = _mm256_loadu_ps(b + p * 16 + 8);
    __m256 amax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    for (const __m256& x : v) {
      const __m256 ax = _mm256_and_ps(x, k.abs_bits);
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(ax, k.inf, _CMP_NLT_UQ));
      amax = _mm256_max_ps(amax, ax);
    }
    if (any(bad)) {
      _mm256_storeu_ps(da + p * 16, k.qnan), _mm256_storeu_ps(da + p * 16 + 8, k.qnan);
      if (b) _mm256_storeu_ps(db + p * 16, k.qnan), _mm256_storeu_ps(db + p * 16 + 8, k.qnan);
      continue;
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const __m256i x = mx_scale(_mm256_set1_ps(_mm_cvtss_f32(m4)), emax);
    const __m256 scale = pow2(_mm256_sub_epi32(_mm256_setzero_si256(), x)), unscale = pow2(x);
    _mm256_storeu_ps(da + p * 16, round_small(v[0], scale, unscale, k));
    _mm256_storeu_ps(da + p * 16 + 8, round_small(v[1], scale, unscale, k));
    if (b) {
      _mm256_storeu_ps(db + p * 16, round_small(v[2], scale, unscale, k));
      _mm256_storeu_ps(db + p * 16 + 8, round_small(v[3], scale, unscale, k));
    }
    const int xs = _mm256_extract_epi32(x, 0);
    *lo = std::min(*lo, xs);
    *hi = std::max(*hi, xs);
  }
}

void mx_rows(const float* src, float* dst, size_t rows, size_t lanes, size_t stride, FloatFormat format, int* lo,
             int* hi) {
  const Float8Info& f = *float8_info(format);
  const SmallFloat k(f, Overflow::saturate);
  const int emax = f.max_exponent();
  size_t l = 0;
  for (; l + 8 <= lanes; l += 8) {
    for (size_t r0 = 0; r0 < rows; r0 += kMxBlock) {
      const size_t r1 = std::min(rows, r0 + kMxBlock);
      __m256 amax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
      for (size_t r = r0; r < r1; ++r) {
        const __m256 ax = _mm256_and_ps(_mm256_loadu_ps(src + r * stride + l), k.abs_bits);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(ax, k.inf, _CMP_NLT_UQ));
        amax = _mm256_max_ps(amax, ax);
      }
      const __m256i x = mx_scale(amax, emax);
      const __m256 scale = pow2(_mm256_sub_epi32(_mm256_setzero_si256(), x)), unscale = pow2(x);
      for (size_t r = r0; r < r1; ++r) {
        const __m256 q = round_small(_mm256_loadu_ps(src + r * stride + l), scale, unscale, k);
        _mm256_storeu_ps(dst + r * stride + l, _mm256_blendv_ps(q, k.qnan, bad));
      }
      alignas(32) int xs[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(xs), x);
      const int bad_bits = _mm256_movemask_ps(bad);
      for (int j = 0; j < 8; ++j)
        if (!(bad_bits >> j & 1)) *lo = std::min(*lo, xs[j]), *hi = std::max(*hi, xs[j]);
    }
  }
  if (l < lanes) ref::mx_rows(src + l, dst + l, rows, lanes - l, stride, format, lo, hi);
}

}  // namespace dfp::simd::avx2

// ---- posit16 ------------------------------------------------------------------------------------
// The AVX-512 form's integer arithmetic (simd/avx512/float16_avx512.cpp) on 8 lanes, masks as
// lane vectors; the last n % 8 elements run the reference.
namespace dfp::simd::avx2 {
namespace {
inline __m256i splat(int v) { return _mm256_set1_epi32(v); }
inline __m256i select(__m256i mask, __m256i yes, __m256i no) { return _mm256_blendv_epi8(no, yes, mask); }
inline __m256i bit_length(__m256i v) {  // v < 2^24; 0 for 0
  const __m256i e = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(_mm256_cvtepi32_ps(v)), 23), splat(126));
  return _mm256_andnot_si256(_mm256_cmpeq_epi32(v, _mm256_setzero_si256()), e);
}
}  // namespace

void round_posit16(const float* src, float* dst, size_t n, int es) {
  const __m128i es_count = _mm_cvtsi32_si128(es);
  const __m256i one = splat(1), zero = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i b = _mm256_castps_si256(_mm256_loadu_ps(src + i));
    const __m256i a = _mm256_and_si256(b, splat(0x7FFFFFFF));
    const __m256i e = _mm256_sub_epi32(_mm256_srli_epi32(a, 23), splat(127));
    const __m256i k = _mm256_sra_epi32(e, es_count);
    const __m256i ex = _mm256_sub_epi32(e, _mm256_sll_epi32(k, es_count));
    const __m256i kc = _mm256_min_epi32(_mm256_max_epi32(k, splat(-14)), splat(13));
    const __m256i pos = _mm256_cmpgt_epi32(kc, splat(-1));
    const __m256i rl = select(pos, _mm256_add_epi32(kc, splat(2)), _mm256_sub_epi32(one, kc));
    const __m256i regime =
        select(pos, _mm256_slli_epi32(_mm256_sub_epi32(_mm256_sllv_epi32(one, _mm256_add_epi32(kc, one)), one), 1), one);
    const __m256i avail = _mm256_sub_epi32(splat(15), rl);
    const __m256i t = _mm256_or_si256(_mm256_slli_epi32(ex, 23), _mm256_and_si256(a, splat(0x7FFFFF)));
    const __m256i sh = _mm256_sub_epi32(splat(es + 23), avail);
    __m256i body = _mm256_or_si256(_mm256_sllv_epi32(regime, avail), _mm256_srlv_epi32(t, sh));
    const __m256i rest = _mm256_and_si256(t, _mm256_sub_epi32(_mm256_sllv_epi32(one, sh), one));
    const __m256i guard = _mm256_and_si256(_mm256_srlv_epi32(rest, _mm256_sub_epi32(sh, one)), one);
    const __m256i below = _mm256_and_si256(rest, _mm256_sub_epi32(_mm256_sllv_epi32(one, _mm256_sub_epi32(sh, one)), one));
    const __m256i sticky_or_odd = _mm256_or_si256(_mm256_xor_si256(_mm256_cmpeq_epi32(below, zero), splat(-1)),
                                                  _mm256_cmpeq_epi32(_mm256_and_si256(body, one), one));
    body = _mm256_add_epi32(body, _mm256_and_si256(guard, _mm256_srli_epi32(sticky_or_odd, 31)));
    body = _mm256_min_epi32(body, splat(0x7FFF));
    body = select(_mm256_cmpgt_epi32(k, splat(13)), splat(0x7FFF), body);
    body = select(_mm256_or_si256(_mm256_cmpgt_epi32(splat(-14), k), _mm256_cmpgt_epi32(splat(0x00800000), a)), one, body);
    const __m256i ones = _mm256_cmpeq_epi32(_mm256_and_si256(body, splat(0x4000)), splat(0x4000));
    const __m256i v = select(ones, _mm256_andnot_si256(body, splat(0x7FFF)), body);
    const __m256i run = _mm256_sub_epi32(splat(15), bit_length(v));
    const __m256i kd = select(ones, _mm256_sub_epi32(run, one), _mm256_sub_epi32(zero, run));
    const __m256i len = _mm256_max_epi32(_mm256_sub_epi32(splat(14), run), zero);
    const __m256i rest2 = _mm256_and_si256(body, _mm256_sub_epi32(_mm256_sllv_epi32(one, len), one));
    const __m256i exd = select(_mm256_cmpgt_epi32(len, splat(es - 1)), _mm256_srlv_epi32(rest2, _mm256_sub_epi32(len, splat(es))),
                               _mm256_sllv_epi32(rest2, _mm256_sub_epi32(splat(es), len)));
    const __m256i nf = _mm256_max_epi32(_mm256_sub_epi32(len, splat(es)), zero);
    const __m256i mant =
        _mm256_or_si256(_mm256_sllv_epi32(one, nf), _mm256_and_si256(rest2, _mm256_sub_epi32(_mm256_sllv_epi32(one, nf), one)));
    const __m256i scale = _mm256_sub_epi32(_mm256_add_epi32(_mm256_sll_epi32(kd, es_count), exd), nf);
    const __m256 pow2s = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(scale, splat(127)), 23));
    __m256i out = _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(mant), pow2s));
    out = _mm256_or_si256(out, _mm256_and_si256(b, splat(int(0x80000000u))));
    out = _mm256_andnot_si256(_mm256_cmpeq_epi32(a, zero), out);
    out = select(_mm256_cmpgt_epi32(a, splat(0x7F7FFFFF)), splat(0x7FC00000), out);
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(out));
  }
  ref::round_posit16(src + i, dst + i, n - i, es);
}

}  // namespace dfp::simd::avx2
