// dfp: the 16-bit floating-point storage formats of the mixed-precision modes.
//
//   bf16 (bfloat16): FP32's sign and 8-bit exponent with 7 mantissa bits; same range as FP32.
//   fp16 (IEEE 754 binary16): 5-bit exponent, 10 mantissa bits; largest finite 65504, smallest
//        normal 2^-14, smallest subnormal 2^-24.
//
// Conversions from FP32 round to nearest, ties to even (what F16C's VCVTPS2PH and oneDNN's
// bf16 reorders do), or stochastically: up with probability equal to the distance to the lower
// neighbour in units of the gap, from a counter-based random stream (seed, element index), so
// results do not depend on thread count. Overflow gives +-inf (fp16: |x| >= 65520 under
// round-to-nearest), values below half the smallest subnormal give +-0, NaN stays NaN (quiet).
// Products of two bf16 or two fp16 values are exact in FP32, so "FP16/BF16 operands, FP32
// accumulation" is emulated exactly by rounding the operands and computing in FP32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "dfp/dfp16.hpp"

namespace dfp {

// e4m3, e5m2: the OCP 8-bit formats; e3m2, e2m3 (FP6), e2m1 (FP4) and int8: the OCP Microscaling
// element formats (dfp/float8.hpp). Stored at a per-tensor or (MX) per-block scale. posit16,
// posit16es2: posit16 with 1 and 2 exponent bits (dfp/posit.hpp), unscaled.
enum class FloatFormat : uint8_t { fp32, bf16, fp16, e4m3, e5m2, e3m2, e2m3, e2m1, int8, posit16, posit16es2 };
const char* float_format_name(FloatFormat f) noexcept;
// "fp32", "bf16", "fp16", "e4m3", "e5m2", "e3m2", "e2m3", "e2m1", "int8", "posit16",
// "posit16es2"; throws naming `origin` otherwise.
FloatFormat parse_float_format(const std::string& text, const std::string& origin);
// The posit16 exponent size of a posit format (1, 2); 0 for the others.
inline int posit_es(FloatFormat f) noexcept { return f == FloatFormat::posit16 ? 1 : f == FloatFormat::posit16es2 ? 2 : 0; }

// Scalar conversions (the specification; the kernels are bit-identical to these).
uint16_t f32_to_bf16(float x) noexcept;           // round to nearest even
uint16_t f32_to_fp16(float x) noexcept;           // round to nearest even
float bf16_to_f32(uint16_t h) noexcept;
float fp16_to_f32(uint16_t h) noexcept;
// Stochastic rounding with the uniform 24-bit random number r (u = r * 2^-24).
uint16_t f32_to_bf16_stochastic(float x, uint32_t r24) noexcept;
uint16_t f32_to_fp16_stochastic(float x, uint32_t r24) noexcept;

// What rounding a tensor to a format did, measured on sampled steps.
struct FormatStats {
  double signal = 0;       // sum x^2 over finite elements
  double noise = 0;        // sum (x - q(x))^2 over elements whose q(x) is finite
  uint64_t elements = 0;
  uint64_t nonzero = 0;    // x != 0
  uint64_t overflow = 0;   // finite x, infinite q(x)  (DFP16: saturated to +-32767; FP8: beyond the
                           // largest finite value at the tensor's scale, saturated or not)
  uint64_t underflow = 0;  // x != 0, q(x) == 0
  uint64_t nonfinite = 0;  // x is NaN or Inf
  void add(const FormatStats& o) noexcept;
  // 10 log10(signal / noise); +inf when noise is 0 and signal is not, NaN when empty.
  double sqnr_db() const noexcept;
};
// Statistics of x against its rounded copy q (same length).
FormatStats measure_rounding(const float* x, const float* q, size_t n) noexcept;

}  // namespace dfp
