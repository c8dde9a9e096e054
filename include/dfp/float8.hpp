// dfp: the 8-bit floating-point formats of the OCP 8-bit Floating Point Specification (OFP8,
// rev. 1.0, 2023; Micikevicius et al., "FP8 formats for deep learning", 2022).
//
//   e4m3: 4 exponent bits (bias 7), 3 mantissa bits. No infinities; S.1111.111 is NaN, so the
//         largest finite value is S.1111.110 = 448. Smallest normal 2^-6, smallest subnormal 2^-9.
//   e5m2: 5 exponent bits (bias 15), 2 mantissa bits, IEEE 754 conventions: S.11111.00 is
//         infinity, S.11111.{01,10,11} NaN. Largest finite 57344, smallest normal 2^-14, smallest
//         subnormal 2^-16.
//
// Conversion from FP32 rounds to nearest, ties to even, as if the exponent range were unbounded;
// a result beyond the largest finite value is an overflow, handled by the Overflow mode (OFP8's
// saturating and non-saturating conversions). Infinite inputs overflow the same way; NaN stays
// NaN (e4m3 S.1111.111, e5m2 S.11111.10). A result below the smallest subnormal's half is +-0.
// Stochastic rounding rounds the magnitude up with probability equal to its distance from the
// lower neighbour in units of the gap, from a uniform 24-bit random number.
//
// Training rounds a tensor at a per-tensor power-of-two scale 2^s: q(x) = fp8(x * 2^s) * 2^-s
// (PrecisionPolicy's fp8 settings choose s). Products of two FP8 values are exact in FP32, and a
// power-of-two scale makes the dequantization exact, so "FP8 operands, FP32 accumulation" is
// emulated exactly by rounding the operands and computing in FP32.
#pragma once

#include <cstdint>

#include "dfp/dfp16.hpp"
#include "dfp/float16.hpp"

namespace dfp {

enum class Overflow : uint8_t {
  saturate,   // to the largest finite value (OFP8 "SAT")
  nonfinite,  // e5m2: to infinity; e4m3: to NaN, its only non-finite encoding
};
const char* overflow_name(Overflow o) noexcept;  // "saturate", "nonfinite"
Overflow parse_overflow(const std::string& text, const std::string& origin);

// A small float format's parameters.
struct Float8Info {
  FloatFormat format;
  int exponent_bits, mantissa_bits, bias;
  float max_finite;   // 448, 57344
  uint8_t max_code;   // the largest finite magnitude's code: 0x7E, 0x7B
  int min_exponent() const noexcept { return 1 - bias; }  // of the smallest normal
};
// The format's parameters; null unless f is e4m3 or e5m2.
const Float8Info* float8_info(FloatFormat f) noexcept;
inline bool is_float8(FloatFormat f) noexcept { return float8_info(f) != nullptr; }

// Scalar conversions (the specification; the kernels are bit-identical to these). f must be
// e4m3 or e5m2.
uint8_t f32_to_float8(float x, FloatFormat f, Overflow o) noexcept;
uint8_t f32_to_float8_stochastic(float x, FloatFormat f, Overflow o, uint32_t r24) noexcept;
// NaN codes give a quiet NaN with the code's sign (sign | 0x7FC00000).
float float8_to_f32(uint8_t code, FloatFormat f) noexcept;
// x * 2^scale_exp rounded to f and scaled back by 2^-scale_exp, both scalings FP32 products.
float round_float8(float x, FloatFormat f, Overflow o, int scale_exp, Rounding r, uint32_t r24) noexcept;

// The largest s with amax * 2^s <= the format's largest finite value, less `margin`, within
// [-kFloat8MaxScaleExp, kFloat8MaxScaleExp] (0 for a zero or non-finite amax): the per-tensor
// scale exponent of current and delayed scaling.
inline constexpr int kFloat8MaxScaleExp = 126;
int float8_scale_exponent(float amax, FloatFormat f, int margin) noexcept;

// Statistics of x against q(x) = its rounding at scale 2^scale_exp: measure_rounding's, with
// overflow counting the finite x whose |x| * 2^scale_exp exceeds the largest finite value.
FormatStats measure_float8_rounding(const float* x, const float* q, size_t n, FloatFormat f, int scale_exp) noexcept;

}  // namespace dfp
