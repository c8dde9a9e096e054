// Scalar posit16 conversions: the specification the kernels are tested against. The encoder builds
// the magnitude's whole bit string in 64 bits and rounds it; the decoder reads the regime bit by
// bit (the kernels compute both with shifts of variable length instead).
#include "dfp/posit.hpp"

#include <bit>
#include <cmath>

namespace dfp {

uint16_t f32_to_posit16(float x, int es) noexcept {
  const uint32_t b = std::bit_cast<uint32_t>(x);
  const uint32_t a = b & 0x7FFFFFFFu;
  if (a == 0) return 0;
  if (a >= 0x7F800000u) return 0x8000u;  // NaN, infinities: NaR
  uint32_t body;
  if (a < 0x00800000u) {
    body = 1;  // an FP32 subnormal is far below minpos (2^-28 at es 1)
  } else {
    const int e = int(a >> 23) - 127;
    const int k = e >> es;  // floor(e / 2^es)
    const uint64_t ex = uint64_t(e - (k << es)), frac = a & 0x7FFFFFu;
    if (k >= 14) {
      body = 0x7FFF;  // maxpos and beyond
    } else if (k <= -15) {
      body = 1;  // minpos: a nonzero value never rounds to zero
    } else {
      // The string after the sign, left-aligned in 64 bits: regime, exponent, fraction.
      const int rl = k >= 0 ? k + 2 : 1 - k;
      const uint64_t regime = k >= 0 ? ((uint64_t(1) << (k + 1)) - 1) << 1 : 1;
      const int tail = es + 23;
      const uint64_t s = ((regime << tail) | (ex << 23) | frac) << (64 - rl - tail);
      body = uint32_t(s >> 49);  // the top 15 bits
      const uint64_t rest = s << 15;
      const bool guard = rest >> 63, sticky = (rest << 1) != 0;
      body += guard && (sticky || (body & 1));
      if (body > 0x7FFF) body = 0x7FFF;
      if (body == 0) body = 1;
    }
  }
  return uint16_t(b >> 31 ? (0x10000u - body) & 0xFFFFu : body);
}

float posit16_to_f32(uint16_t p, int es) noexcept {
  if (p == 0) return 0.f;
  if (p == 0x8000u) return std::bit_cast<float>(0x7FC00000u);
  const bool negative = p & 0x8000u;
  const uint32_t body = negative ? (0x10000u - p) & 0x7FFFu : p;
  // The regime: the run of bits equal to bit 14.
  const uint32_t r0 = (body >> 14) & 1;
  int m = 0;
  while (m < 15 && ((body >> (14 - m)) & 1) == r0) ++m;
  const int k = r0 ? m - 1 : -m;
  const int len = m < 15 ? 14 - m : 0;  // bits after the regime's terminator
  const uint32_t rest = body & ((1u << len) - 1);
  const uint32_t ex = len >= es ? rest >> (len - es) : rest << (es - len);  // missing bits are 0
  const int nf = len > es ? len - es : 0;
  const uint32_t f = rest & ((1u << nf) - 1);
  const float v = std::ldexp(float((1u << nf) | f), k * (1 << es) + int(ex) - nf);
  return negative ? -v : v;
}

}  // namespace dfp
