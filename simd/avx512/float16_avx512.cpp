// AVX-512 BF16/FP16/FP8 conversions, bit-identical to the scalar specification. Round-to-nearest:
// BF16 by integer arithmetic on the FP32 bits (works on any AVX-512 CPU, no AVX512_BF16
// needed), FP16 by VCVTPS2PH / VCVTPH2PS (F16C semantics, IEEE round-to-nearest-even with
// subnormals). Stochastic rounding is a cold path (a numerics study option): it runs the scalar
// loops.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "simd/avx512/vector_loop.hpp"
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

}  // namespace

// The BF16 conversions mask only their last, partial vector (vector_loop.hpp).
void to_bf16(const float* src, uint16_t* dst, size_t n, Rounding r, uint32_t key, uint64_t base) {
  if (r == Rounding::stochastic) return ref::to_bf16(src, dst, n, r, key, base);
  for_each_vector(n, [&](size_t i, const auto& v) { v.store_u16(dst + i, bf16_bits_rne(v.load(src + i))); });
}

void round_bf16(const float* src, float* dst, size_t n, Rounding r, uint32_t key, uint64_t base) {
  if (r == Rounding::stochastic) return ref::round_bf16(src, dst, n, r, key, base);
  for_each_vector(n, [&](size_t i, const auto& v) {
    v.store(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits_rne(v.load(src + i)), 16)));
  });
}

void bf16_to_f32(const uint16_t* src, float* dst, size_t n) {
  for_each_vector(n, [&](size_t i, const auto& v) {
    v.store(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(v.load_u16(src + i), 16)));
  });
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

// ---- FP8 and the MX element formats -----------------------------------------------------------
// Round-to-nearest-even to the format's gap by float arithmetic: the gap g of |y| is 2^(max(e,
// emin) - m) with e its exponent (from the exponent bits, so exact), and (|y| + g*2^23) - g*2^23
// rounds |y| to a multiple of g in the FP32 addition's own round-to-nearest-even (g*2^23 has
// gap g, and |y| < 2^(m+1) g keeps the sum inside its binade). The exponent is capped at 2^24, far
// above every format's range, so that g*2^23 stays finite: a larger |y| is an overflow anyway.
// Overflow, infinities and NaN are masked in.
namespace dfp::simd::avx512 {
namespace {

struct SmallFloat {
  __m512 min_pow, cap, gap, big, maxv, inf, qnan, over_value;
  __m512i abs_bits, exp_bits;
  SmallFloat(const Float8Info& f, Overflow o)
      : min_pow(_mm512_set1_ps(std::ldexp(1.0f, f.min_exponent()))),
        cap(_mm512_set1_ps(0x1p24f)),
        gap(_mm512_set1_ps(std::ldexp(1.0f, -f.mantissa_bits))),
        big(_mm512_set1_ps(0x1p23f)),
        maxv(_mm512_set1_ps(f.max_finite)),
        inf(_mm512_set1_ps(INFINITY)),
        qnan(_mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000))),
        over_value(o == Overflow::saturate || !f.nonfinite ? maxv : f.format == FloatFormat::e5m2 ? inf : qnan),
        abs_bits(_mm512_set1_epi32(0x7FFFFFFF)),
        exp_bits(_mm512_set1_epi32(0x7F800000)) {}
};

// x * scale rounded to the format, times unscale (round_float8's arithmetic, lane by lane).
inline __m512 round_small(__m512 x, __m512 scale, __m512 unscale, const SmallFloat& k) {
  const __m512 y = _mm512_mul_ps(x, scale);
  const __m512i yb = _mm512_castps_si512(y);
  const __m512 a = _mm512_castsi512_ps(_mm512_and_si512(yb, k.abs_bits));
  const __m512 p = _mm512_min_ps(_mm512_max_ps(_mm512_castsi512_ps(_mm512_and_si512(yb, k.exp_bits)), k.min_pow), k.cap);
  const __m512 c = _mm512_mul_ps(_mm512_mul_ps(p, k.gap), k.big);
  __m512 q = _mm512_sub_ps(_mm512_add_ps(a, c), c);
  const __mmask16 over = _mm512_cmp_ps_mask(q, k.maxv, _CMP_GT_OQ) | _mm512_cmp_ps_mask(a, k.inf, _CMP_EQ_OQ);
  q = _mm512_mask_mov_ps(q, over, k.over_value);
  q = _mm512_mask_mov_ps(q, _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q), k.qnan);
  q = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(q), _mm512_andnot_si512(k.abs_bits, yb)));
  return _mm512_mul_ps(q, unscale);
}

// 2^e for integer lanes e in [-126, 127].
inline __m512 pow2(__m512i e) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(127)), 23)); }

// MX: the lanes' X = floor(log2 amax) - emax, clamped (mx_scale_exponent; amax's exponent bits,
// so a zero or subnormal amax clamps to the lower end).
inline __m512i mx_scale(__m512 amax, int emax) {
  const __m512i e = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_castps_si512(amax), 23), _mm512_set1_epi32(127 + emax));
  return _mm512_min_epi32(_mm512_max_epi32(e, _mm512_set1_epi32(-kFloat8MaxScaleExp)), _mm512_set1_epi32(kFloat8MaxScaleExp));
}

void fold_scales(__m512i x, __mmask16 valid, int* lo, int* hi) {
  if (!valid) return;
  *lo = std::min(*lo, _mm512_mask_reduce_min_epi32(valid, x));
  *hi = std::max(*hi, _mm512_mask_reduce_max_epi32(valid, x));
}

}  // namespace

float round_fp8(const float* src, float* dst, size_t n, FloatFormat format, Overflow overflow, int scale_exp,
                Rounding r, uint32_t key, uint64_t base) {
  if (r == Rounding::stochastic) return ref::round_fp8(src, dst, n, format, overflow, scale_exp, r, key, base);
  const SmallFloat k(*float8_info(format), overflow);
  const __m512 scale = _mm512_set1_ps(std::ldexp(1.0f, scale_exp)), unscale = _mm512_set1_ps(std::ldexp(1.0f, -scale_exp));
  __m512 amax = _mm512_setzero_ps();
  // Only the last, partial vector masked (vector_loop.hpp). A lane's |x| counts where finite: the
  // others are ANDed to +0, which leaves the maximum (>= +0) as it is.
  for_each_vector(n, [&](size_t i, const auto& v) {
    const __m512 x = v.load(src + i);
    const __m512 ax = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), k.abs_bits));
    const __m512i finite = _mm512_movm_epi32(_mm512_cmp_ps_mask(ax, k.inf, _CMP_LT_OQ));
    amax = _mm512_max_ps(amax, _mm512_and_ps(ax, _mm512_castsi512_ps(finite)));
    v.store(dst + i, round_small(x, scale, unscale, k));
  });
  return _mm512_reduce_max_ps(amax);
}

// One block per pixel: 16 lanes of a and 16 of b; the block's X broadcast.
void mx_lanes(const float* a, const float* b, float* da, float* db, size_t pixels, FloatFormat format, int* lo,
              int* hi) {
  const Float8Info& f = *float8_info(format);
  const SmallFloat k(f, Overflow::saturate);
  const int emax = f.max_exponent();
  for (size_t p = 0; p < pixels; ++p) {
    const __m512 va = _mm512_loadu_ps(a + p * 16), vb = b ? _mm512_loadu_ps(b + p * 16) : _mm512_setzero_ps();
    const __m512 aa = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(va), k.abs_bits));
    const __m512 ab = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(vb), k.abs_bits));
    const __m512 amax = _mm512_max_ps(aa, ab);
    if (_mm512_cmp_ps_mask(amax, k.inf, _CMP_NLT_UQ) | _mm512_cmp_ps_mask(aa, k.inf, _CMP_NLT_UQ)) {
      _mm512_storeu_ps(da + p * 16, k.qnan);  // a NaN or an infinity: the block is NaN
      if (b) _mm512_storeu_ps(db + p * 16, k.qnan);
      continue;
    }
    const __m512i x = mx_scale(_mm512_set1_ps(_mm512_reduce_max_ps(amax)), emax);
    const __m512 scale = pow2(_mm512_sub_epi32(_mm512_setzero_si512(), x)), unscale = pow2(x);
    _mm512_storeu_ps(da + p * 16, round_small(va, scale, unscale, k));
    if (b) _mm512_storeu_ps(db + p * 16, round_small(vb, scale, unscale, k));
    fold_scales(x, 1, lo, hi);
  }
}

// Each lane's rows in blocks of 32: 16 lanes' blocks at once.
void mx_rows(const float* src, float* dst, size_t rows, size_t lanes, size_t stride, FloatFormat format, int* lo,
             int* hi) {
  const Float8Info& f = *float8_info(format);
  const SmallFloat k(f, Overflow::saturate);
  const int emax = f.max_exponent();
  for (size_t l = 0; l < lanes; l += 16) {
    const __mmask16 m = tail_mask(lanes - l);
    // Only a partial block of lanes masked (vector_loop.hpp); a block's NaN lanes merged in only
    // where it has any.
    auto blocks = [&](const auto& v) {
      for (size_t r0 = 0; r0 < rows; r0 += kMxBlock) {
        const size_t r1 = std::min(rows, r0 + kMxBlock);
        __m512 amax = _mm512_setzero_ps();
        __mmask16 bad = 0;
        for (size_t r = r0; r < r1; ++r) {
          const __m512i bits = _mm512_castps_si512(v.load(src + r * stride + l));
          const __m512 ax = _mm512_castsi512_ps(_mm512_and_si512(bits, k.abs_bits));
          bad |= _mm512_cmp_ps_mask(ax, k.inf, _CMP_NLT_UQ);
          amax = _mm512_max_ps(amax, ax);
        }
        const __m512i x = mx_scale(amax, emax);
        const __m512 scale = pow2(_mm512_sub_epi32(_mm512_setzero_si512(), x)), unscale = pow2(x);
        for (size_t r = r0; r < r1; ++r) {
          __m512 q = round_small(v.load(src + r * stride + l), scale, unscale, k);
          if (bad) q = _mm512_mask_mov_ps(q, bad, k.qnan);
          v.store(dst + r * stride + l, q);
        }
        fold_scales(x, m & ~bad, lo, hi);
      }
    };
    if (m == 0xFFFF)
      blocks(WholeVector{});
    else
      blocks(TailVector{m});
  }
}

}  // namespace dfp::simd::avx512

// ---- posit16 ------------------------------------------------------------------------------------
// The scalar encoder's string arithmetic (base/posit.cpp) on 32-bit lanes: the regime's bits, then
// the exponent and fraction bits that fit after it, the guard and sticky bits below, with shifts
// of variable length; then the decoder's, with the regime's run length from the bit length of the
// rest (read off its exact FP32 conversion).
namespace dfp::simd::avx512 {
namespace {
inline __m512i splat(int v) { return _mm512_set1_epi32(v); }
inline __m512i bit_length(__m512i v) {  // v < 2^24; 0 for 0
  const __m512i e = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_castps_si512(_mm512_cvtepi32_ps(v)), 23), splat(126));
  return _mm512_mask_mov_epi32(e, _mm512_cmpeq_epi32_mask(v, _mm512_setzero_si512()), _mm512_setzero_si512());
}
}  // namespace

void round_posit16(const float* src, float* dst, size_t n, int es) {
  const __m128i es_count = _mm_cvtsi32_si128(es);
  const __m512i one = splat(1), zero = _mm512_setzero_si512();
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512i b = _mm512_castps_si512(_mm512_maskz_loadu_ps(m, src + i));
    const __m512i a = _mm512_and_si512(b, splat(0x7FFFFFFF));
    // Encode.
    const __m512i e = _mm512_sub_epi32(_mm512_srli_epi32(a, 23), splat(127));
    const __m512i k = _mm512_sra_epi32(e, es_count);
    const __m512i ex = _mm512_sub_epi32(e, _mm512_sll_epi32(k, es_count));
    const __m512i kc = _mm512_min_epi32(_mm512_max_epi32(k, splat(-14)), splat(13));
    const __mmask16 pos = _mm512_cmpge_epi32_mask(kc, zero);
    const __m512i rl = _mm512_mask_mov_epi32(_mm512_sub_epi32(one, kc), pos, _mm512_add_epi32(kc, splat(2)));
    const __m512i regime = _mm512_mask_mov_epi32(
        one, pos, _mm512_slli_epi32(_mm512_sub_epi32(_mm512_sllv_epi32(one, _mm512_add_epi32(kc, one)), one), 1));
    const __m512i avail = _mm512_sub_epi32(splat(15), rl);
    const __m512i t = _mm512_or_si512(_mm512_sll_epi32(ex, _mm_cvtsi32_si128(23)), _mm512_and_si512(a, splat(0x7FFFFF)));
    const __m512i sh = _mm512_sub_epi32(splat(es + 23), avail);
    __m512i body = _mm512_or_si512(_mm512_sllv_epi32(regime, avail), _mm512_srlv_epi32(t, sh));
    const __m512i rest = _mm512_and_si512(t, _mm512_sub_epi32(_mm512_sllv_epi32(one, sh), one));
    const __m512i guard = _mm512_and_si512(_mm512_srlv_epi32(rest, _mm512_sub_epi32(sh, one)), one);
    const __mmask16 sticky =
        _mm512_test_epi32_mask(rest, _mm512_sub_epi32(_mm512_sllv_epi32(one, _mm512_sub_epi32(sh, one)), one));
    const __mmask16 up = _mm512_test_epi32_mask(guard, guard) & (sticky | _mm512_test_epi32_mask(body, one));
    body = _mm512_mask_add_epi32(body, up, body, one);
    body = _mm512_min_epi32(body, splat(0x7FFF));
    body = _mm512_mask_mov_epi32(body, _mm512_cmpge_epi32_mask(k, splat(14)), splat(0x7FFF));
    body = _mm512_mask_mov_epi32(body, _mm512_cmple_epi32_mask(k, splat(-15)) | _mm512_cmplt_epi32_mask(a, splat(0x00800000)),
                                 one);
    // Decode.
    const __mmask16 ones = _mm512_test_epi32_mask(body, splat(0x4000));
    const __m512i v = _mm512_mask_mov_epi32(body, ones, _mm512_andnot_si512(body, splat(0x7FFF)));
    const __m512i run = _mm512_sub_epi32(splat(15), bit_length(v));
    const __m512i kd = _mm512_mask_mov_epi32(_mm512_sub_epi32(zero, run), ones, _mm512_sub_epi32(run, one));
    const __m512i len = _mm512_max_epi32(_mm512_sub_epi32(splat(14), run), zero);
    const __m512i rest2 = _mm512_and_si512(body, _mm512_sub_epi32(_mm512_sllv_epi32(one, len), one));
    // The exponent: the es bits after the regime; bits past the string's end are zeros.
    const __m512i exd = _mm512_mask_mov_epi32(_mm512_sllv_epi32(rest2, _mm512_sub_epi32(splat(es), len)),
                                              _mm512_cmpge_epi32_mask(len, splat(es)),
                                              _mm512_srlv_epi32(rest2, _mm512_sub_epi32(len, splat(es))));
    const __m512i nf = _mm512_max_epi32(_mm512_sub_epi32(len, splat(es)), zero);
    const __m512i mant = _mm512_or_si512(_mm512_sllv_epi32(one, nf), _mm512_and_si512(rest2, _mm512_sub_epi32(_mm512_sllv_epi32(one, nf), one)));
    const __m512i scale = _mm512_sub_epi32(_mm512_add_epi32(_mm512_sll_epi32(kd, es_count), exd), nf);
    const __m512 pow2s = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(scale, splat(127)), 23));
    __m512i out = _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtepi32_ps(mant), pow2s));
    out = _mm512_or_si512(out, _mm512_and_si512(b, splat(int(0x80000000u))));
    out = _mm512_mask_mov_epi32(out, _mm512_cmpeq_epi32_mask(a, zero), zero);
    out = _mm512_mask_mov_epi32(out, _mm512_cmpge_epu32_mask(a, splat(0x7F800000)), splat(0x7FC00000));
    _mm512_mask_storeu_ps(dst + i, m, _mm512_castsi512_ps(out));
  }
}

}  // namespace dfp::simd::avx512
