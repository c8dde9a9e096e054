// Scalar FP8 (OFP8 e4m3, e5m2) and MX element (e3m2, e2m3, e2m1, int8) conversions: the
// specification the kernels are tested against.
// Rounding works on the integer significand of the FP32 input, apart from the kernels' float
// arithmetic, so the two are independent checks of each other.
#include "dfp/float8.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "base/named_enum.hpp"

namespace dfp {

const char* overflow_name(Overflow o) noexcept {
  switch (o) {
    case Overflow::saturate: return "saturate";
    case Overflow::nonfinite: return "nonfinite";
  }
  return "?";
}

Overflow parse_overflow(const std::string& text, const std::string& origin) {
  return parse_named(text, {Overflow::saturate, Overflow::nonfinite}, overflow_name, origin, "overflow mode");
}

namespace {
constexpr Float8Info kFormats[] = {
    {FloatFormat::e4m3, 4, 3, 7, 448.0f, 0x7E, true},   {FloatFormat::e5m2, 5, 2, 15, 57344.0f, 0x7B, true},
    {FloatFormat::e3m2, 3, 2, 3, 28.0f, 0x1F, false},   {FloatFormat::e2m3, 2, 3, 1, 7.5f, 0x1F, false},
    {FloatFormat::e2m1, 2, 1, 1, 6.0f, 0x07, false},    {FloatFormat::int8, 1, 6, 1, 127.0f / 64, 0x7F, false},
};

// Formats without NaN give their largest magnitude (round_float8 keeps the NaN itself).
uint8_t nan_code(const Float8Info& f) noexcept {
  return f.format == FloatFormat::e4m3 ? 0x7F : f.format == FloatFormat::e5m2 ? 0x7E : f.max_code;
}
uint8_t overflow_code(const Float8Info& f, Overflow o) noexcept {
  if (o == Overflow::saturate || !f.nonfinite) return f.max_code;
  return f.format == FloatFormat::e4m3 ? 0x7F : 0x7C;  // e4m3 has no infinity: NaN
}

// The code of |x| (sign added by the caller). `r24` < 0: round to nearest even; else the uniform
// 24-bit number of stochastic rounding.
uint8_t encode_magnitude(uint32_t a, const Float8Info& f, Overflow o, int64_t r24) noexcept {
  if (a > 0x7F800000u) return nan_code(f);
  if (a == 0x7F800000u) return overflow_code(f, o);
  if (a == 0) return 0;
  // |x| = sig * 2^(e - 23), sig < 2^24.
  const uint32_t field = a >> 23;
  const int e = field ? int(field) - 127 : -126;
  const uint64_t sig = field ? (a & 0x7FFFFFu) | 0x800000u : a & 0x7FFFFFu;
  // The gap between neighbours of |x| in the format: 2^qe.
  const int m = f.mantissa_bits;
  const int qe = std::max(e, f.min_exponent()) - m;
  // n = |x| / 2^qe = sig / 2^shift, rounded; shift >= 23 - m.
  const int shift = 23 + qe - e;
  uint64_t n;
  if (shift >= 48) {
    n = 0;  // |x| < 2^-24 gaps: rounds to zero (stochastically: with probability below 2^-24)
  } else {
    n = sig >> shift;
    const uint64_t rem = sig & ((uint64_t(1) << shift) - 1);
    if (r24 < 0) {
      const uint64_t half = uint64_t(1) << (shift - 1);
      n += rem > half || (rem == half && (n & 1));
    } else {
      // Up with probability rem / 2^shift, to 24 bits: r24 * 2^shift < rem * 2^24.
      const uint64_t r = uint64_t(r24);
      n += shift >= 24 ? (r << (shift - 24)) < rem : (r << shift) < (rem << 24);
    }
  }
  if (n == 0) return 0;
  // |q| = n * 2^qe with n <= 2^(m+1). Its exponent and code.
  const int len = std::bit_width(n);
  const int ev = qe + len - 1;
  uint32_t code;
  if (ev < f.min_exponent()) {
    code = uint32_t(n);  // subnormal: exponent field 0, mantissa n (qe = min_exponent - m)
  } else {
    const uint64_t mant = (len - 1 <= m ? n << (m - (len - 1)) : n >> (len - 1 - m)) - (uint64_t(1) << m);
    const int biased = ev + f.bias;
    if (biased >= (1 << f.exponent_bits)) return overflow_code(f, o);
    code = (uint32_t(biased) << m) | uint32_t(mant);
  }
  return code > f.max_code ? overflow_code(f, o) : uint8_t(code);
}
}  // namespace

const Float8Info* float8_info(FloatFormat f) noexcept {
  for (const Float8Info& i : kFormats)
    if (i.format == f) return &i;
  return nullptr;
}

uint8_t f32_to_float8(float x, FloatFormat f, Overflow o) noexcept {
  const uint32_t b = std::bit_cast<uint32_t>(x);
  return uint8_t(((b >> 24) & 0x80u) | encode_magnitude(b & 0x7FFFFFFFu, *float8_info(f), o, -1));
}

uint8_t f32_to_float8_stochastic(float x, FloatFormat f, Overflow o, uint32_t r24) noexcept {
  const uint32_t b = std::bit_cast<uint32_t>(x);
  return uint8_t(((b >> 24) & 0x80u) | encode_magnitude(b & 0x7FFFFFFFu, *float8_info(f), o, r24 & 0xFFFFFFu));
}

float float8_to_f32(uint8_t code, FloatFormat fmt) noexcept {
  const Float8Info& f = *float8_info(fmt);
  const uint32_t sign = uint32_t(code & 0x80u) << 24;
  const int m = f.mantissa_bits;
  const uint32_t field = (code & 0x7Fu) >> m, mant = code & ((1u << m) - 1);
  const bool e4m3 = fmt == FloatFormat::e4m3;
  if (f.nonfinite && (e4m3 ? (code & 0x7Fu) == 0x7Fu : field == 0x1Fu)) {
    if (!e4m3 && mant == 0) return std::bit_cast<float>(sign | 0x7F800000u);
    return std::bit_cast<float>(sign | 0x7FC00000u);
  }
  const float v = field == 0 ? std::ldexp(float(mant), f.min_exponent() - m)
                             : std::ldexp(float((1u << m) | mant), int(field) - f.bias - m);
  return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(v));
}

float round_float8(float x, FloatFormat f, Overflow o, int scale_exp, Rounding r, uint32_t r24) noexcept {
  const float y = x * std::ldexp(1.0f, scale_exp);
  if (std::isnan(y) && !float8_info(f)->nonfinite)  // no code: the NaN itself, quieted, with its sign
    return std::bit_cast<float>((std::bit_cast<uint32_t>(y) & 0x80000000u) | 0x7FC00000u);
  const uint8_t c = r == Rounding::stochastic ? f32_to_float8_stochastic(y, f, o, r24) : f32_to_float8(y, f, o);
  return float8_to_f32(c, f) * std::ldexp(1.0f, -scale_exp);
}

int float8_scale_exponent(float amax, FloatFormat f, int margin) noexcept {
  if (!(amax > 0) || !std::isfinite(amax)) return 0;
  int ea, em;
  const float fa = std::frexp(amax, &ea), fm = std::frexp(float8_info(f)->max_finite, &em);
  const int s = (fa <= fm ? em - ea : em - ea - 1) - margin;
  return std::clamp(s, -kFloat8MaxScaleExp, kFloat8MaxScaleExp);
}

int mx_scale_exponent(float amax, FloatFormat element) noexcept {
  if (!(amax > 0)) return -kFloat8MaxScaleExp;
  int e;
  std::frexp(amax, &e);  // amax = f * 2^e, f in [0.5, 1): floor(log2 amax) = e - 1
  return std::clamp(e - 1 - float8_info(element)->max_exponent(), -kFloat8MaxScaleExp, kFloat8MaxScaleExp);
}

int mx_round_block(const float* src, float* dst, size_t n, size_t stride, FloatFormat element) noexcept {
  float amax = 0;
  bool finite = true;
  for (size_t i = 0; i < n; ++i) {
    const float v = src[i * stride];
    finite = finite && std::isfinite(v);
    amax = std::max(amax, std::fabs(v));
  }
  if (!finite) {
    for (size_t i = 0; i < n; ++i) dst[i * stride] = std::bit_cast<float>(0x7FC00000u);
    return kMxNanScale;
  }
  const int x = mx_scale_exponent(amax, element);
  for (size_t i = 0; i < n; ++i)
    dst[i * stride] = round_float8(src[i * stride], element, Overflow::saturate, -x, Rounding::nearest_even, 0);
  return x;
}

FormatStats measure_float8_rounding(const float* x, const float* q, size_t n, FloatFormat f, int scale_exp) noexcept {
  FormatStats s = measure_rounding(x, q, n);
  // measure_rounding counted the infinite q; a saturated q is finite.
  s.overflow = 0;
  const double limit = std::ldexp(double(float8_info(f)->max_finite), -scale_exp);
  for (size_t i = 0; i < n; ++i) s.overflow += std::isfinite(x[i]) && std::fabs(double(x[i])) > limit;
  return s;
}

}  // namespace dfp
