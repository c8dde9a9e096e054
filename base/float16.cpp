// Scalar BF16/FP16 conversions: the specification the kernels are tested against.
#include "dfp/float16.hpp"

#include <bit>
#include <cmath>

#include "dfp/status.hpp"
#include "base/named_enum.hpp"

namespace dfp {

const char* float_format_name(FloatFormat f) noexcept {
  switch (f) {
    case FloatFormat::fp32: return "fp32";
    case FloatFormat::bf16: return "bf16";
    case FloatFormat::fp16: return "fp16";
    case FloatFormat::e4m3: return "e4m3";
    case FloatFormat::e5m2: return "e5m2";
    case FloatFormat::e3m2: return "e3m2";
    case FloatFormat::e2m3: return "e2m3";
    case FloatFormat::e2m1: return "e2m1";
    case FloatFormat::int8: return "int8";
    case FloatFormat::posit16: return "posit16";
    case FloatFormat::posit16es2: return "posit16es2";
  }
  return "?";
}

FloatFormat parse_float_format(const std::string& text, const std::string& origin) {
  return parse_named(text, {FloatFormat::fp32, FloatFormat::bf16, FloatFormat::fp16, FloatFormat::e4m3, FloatFormat::e5m2,
                                FloatFormat::e3m2, FloatFormat::e2m3, FloatFormat::e2m1, FloatFormat::int8,
                                FloatFormat::posit16, FloatFormat::posit16es2}, float_format_name, origin,
                     "format");
}

uint16_t f32_to_bf16(float x) noexcept {
  const uint32_t b = std::bit_cast<uint32_t>(x);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((b >> 16) | 0x0040u);  // quiet NaN
  return static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

uint16_t f32_to_bf16_stochastic(float x, uint32_t r24) noexcept {
  const uint32_t b = std::bit_cast<uint32_t>(x);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((b >> 16) | 0x0040u);
  if ((b & 0x7FFFFFFFu) == 0x7F800000u) return static_cast<uint16_t>(b >> 16);  // inf stays inf
  // Adding 16 uniform bits below the kept mantissa and truncating rounds up (away from zero in
  // magnitude) with probability = the discarded fraction.
  return static_cast<uint16_t>((b + (r24 >> 8)) >> 16);
}

float bf16_to_f32(uint16_t h) noexcept { return std::bit_cast<float>(uint32_t(h) << 16); }

uint16_t f32_to_fp16(float x) noexcept {
  const uint32_t b = std::bit_cast<uint32_t>(x);
  const uint32_t sign = (b >> 16) & 0x8000u;
  const uint32_t a = b & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));  // quiet NaN
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 (and inf): inf
  if (a < 0x38800000u) {
    // Below 2^-14: a subnormal (or zero) half, mantissa = x * 2^24 rounded to nearest even. The
    // product is exact; a result of 0x400 is the smallest normal, encoded the same way.
    const float f = std::bit_cast<float>(a) * 16777216.0f;
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(f)));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits; a carry
  // moves into the exponent, which is the correct result.
  const uint32_t r = a + 0x0FFFu + ((a >> 13) & 1u) - 0x38000000u;
  return static_cast<uint16_t>(sign | (r >> 13));
}

uint16_t f32_to_fp16_stochastic(float x, uint32_t r24) noexcept {
  const uint32_t b = std::bit_cast<uint32_t>(x);
  const uint32_t a = b & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) return f32_to_fp16(x);  // NaN, inf
  const float m = std::fabs(x);
  // Gap between neighbouring halves around m: 2^-24 below 2^-14, else 2^(e - 10).
  const int e = m < 0x1p-14f ? -14 : std::ilogb(m);
  const float ulp = std::ldexp(1.0f, e - 10);
  const float lo = std::floor(m / ulp) * ulp;   // exact: scaling by a power of two
  const float frac = (m - lo) / ulp;            // exact, in [0, 1)
  const float up = (float(r24) * 0x1p-24f < frac) ? lo + ulp : lo;  // 65536 -> inf below
  return static_cast<uint16_t>(((b >> 16) & 0x8000u) | (f32_to_fp16(up) & 0x7FFFu));
}

float fp16_to_f32(uint16_t h) noexcept {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (m << 13));
  if (e == 0) return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(float(m) * 0x1p-24f));
  return std::bit_cast<float>(sign | ((e + 112) << 23) | (m << 13));
}

void FormatStats::add(const FormatStats& o) noexcept {
  signal += o.signal; noise += o.noise; elements += o.elements; nonzero += o.nonzero;
  overflow += o.overflow; underflow += o.underflow; nonfinite += o.nonfinite;
}

double FormatStats::sqnr_db() const noexcept {
  if (signal == 0) return std::nan("");
  if (noise == 0) return INFINITY;
  return 10.0 * std::log10(signal / noise);
}

FormatStats measure_rounding(const float* x, const float* q, size_t n) noexcept {
  FormatStats s;
  s.elements = n;
  for (size_t i = 0; i < n; ++i) {
    const double v = x[i], r = q[i];
    if (!std::isfinite(v)) { ++s.nonfinite; continue; }
    s.signal += v * v;
    s.nonzero += v != 0;
    if (!std::isfinite(r)) { ++s.overflow; continue; }
    s.underflow += v != 0 && r == 0;
    s.noise += (v - r) * (v - r);
  }
  return s;
}

}  // namespace dfp
