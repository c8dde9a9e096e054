// dfp: posit16 (Gustafson and Yonemoto, 2017; Posit Standard 2022), the format the study that
// started dfp's comparison named as future work.
//
// A posit16 is 16 bits: a sign, then the magnitude's bit string in two's complement: a regime
// (a run of m equal bits ended by the opposite bit or the string's end: k = m - 1 for a run of
// ones, -m for zeros), `es` exponent bits and the fraction. Its value is 2^(k * 2^es + e) * 1.f.
// es = 1 is the posit16 of the studies before the standard; es = 2 the standard's. 0x0000 is
// zero and 0x8000 NaR ("not a real"). maxpos = 2^(14 * 2^es) (2^28, 2^56), minpos its inverse;
// up to 12 (es 1) or 11 (es 2) fraction bits near 1, fewer towards both ends (tapered accuracy).
//
// Conversion from FP32 rounds the magnitude's bit string to nearest, ties to the even string (the
// standard's rule, so ties in the tapered regions fall between geometric neighbours); a nonzero
// value never rounds to zero (it becomes minpos) nor beyond maxpos; NaN and infinities become NaR.
// Every posit16 is exactly an FP32 value.
//
// Training with posit16 operands accumulates their products in FP32, as the FP32 convolutions
// do: products of two posit16 significands (up to 13 bits each) can need 26 bits, one rounding
// more than the standard's exact quire would make (relative 2^-24, far below the format's own
// 2^-13).
#pragma once

#include <cstdint>

namespace dfp {

uint16_t f32_to_posit16(float x, int es) noexcept;
// NaR gives a quiet NaN.
float posit16_to_f32(uint16_t p, int es) noexcept;
inline float round_posit16(float x, int es) noexcept { return posit16_to_f32(f32_to_posit16(x, es), es); }

}  // namespace dfp
