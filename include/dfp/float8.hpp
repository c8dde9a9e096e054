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
// The OCP Microscaling (MX) v1.0 element formats, all saturating (no infinities, no NaN):
//   e3m2: FP6, bias 3, largest 28, smallest subnormal 2^-4;
//   e2m3: FP6, bias 1, largest 7.5, smallest subnormal 2^-3;
//   e2m1: FP4, bias 1, largest 6, smallest subnormal 2^-1;
//   int8: MXINT8's two's-complement element with its implicit 2^-6, k/64 for k in -127..127 (the
//         spec's -128 is never produced, as symmetric quantizers do); exactly the small float with
//         1 exponent bit, 6 mantissa bits and bias 1, which is how it is encoded here (code =
//         sign | |k|).
// Their codes occupy the low bits (sign at bit 7). They have no NaN: f32_to_float8 gives the
// largest magnitude for NaN, and round_float8 returns the NaN itself (the value has no code; a
// training run sees it).
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
  float max_finite;   // 448, 57344, 28, 7.5, 6, 127/64
  uint8_t max_code;   // the largest finite magnitude's code: 0x7E, 0x7B, 0x1F, 0x1F, 0x07, 0x7F
  bool nonfinite;     // has NaN (e4m3) or infinities and NaN (e5m2)
  int min_exponent() const noexcept { return 1 - bias; }  // of the smallest normal
  // The exponent of the largest normal: MX's emax (8, 15, 4, 2, 2, 0).
  int max_exponent() const noexcept { return (max_code >> mantissa_bits) - bias; }
};
// The format's parameters; null unless f is one of the 8-bit-or-smaller formats.
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

// ---- OCP Microscaling (MX) v1.0: blocks of kMxBlock elements sharing an E8M0 scale 2^X ----------
inline constexpr int kMxBlock = 32;
// X of a block whose largest magnitude is amax: floor(log2 amax) minus the element format's
// max_exponent() (so the largest element lands in the format's top binade, saturating above its
// largest value as the spec converts), within [-kFloat8MaxScaleExp, kFloat8MaxScaleExp] (E8M0's
// own range is -127..127: its two end values are left out, so that 2^X and 2^-X are normal
// floats; they matter only to blocks whose maximum is below 2^-126 or above 2^126 times the
// format's largest power of two). An all-zero block takes the lower end.
int mx_scale_exponent(float amax, FloatFormat element) noexcept;
// One block of n (<= kMxBlock) elements src[0], src[stride], ...: each rounded as the spec
// converts it, P = saturate(RNE(v * 2^-X)) in the element format, stored back as P * 2^X
// (round_float8 at scale -X). A block holding a NaN or an infinity becomes all NaN (the spec's NaN
// scale) and returns kMxNanScale; others return X.
inline constexpr int kMxNanScale = 1 << 20;
int mx_round_block(const float* src, float* dst, size_t n, size_t stride, FloatFormat element) noexcept;

// Statistics of x against q(x) = its rounding at scale 2^scale_exp: measure_rounding's, with
// overflow counting the finite x whose |x| * 2^scale_exp exceeds the largest finite value.
FormatStats measure_float8_rounding(const float* x, const float* q, size_t n, FloatFormat f, int scale_exp) noexcept;

}  // namespace dfp
