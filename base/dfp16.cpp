// dfp: the scalar parts of DFP16 that simd/'s kernels take as their specification: the shared
// exponent of a set of values and the block form of the rounding (include/dfp/dfp16.hpp).
#include <cmath>
#include <limits>

#include "dfp/dfp16.hpp"

namespace dfp {

int dfp16_exponent(float max_abs, int headroom) noexcept {
  if (!(max_abs > 0.f) || !std::isfinite(max_abs)) return 0;
  return std::ilogb(max_abs) - 14 + headroom;  // ilogb is exact for denormals too
}

int dfp16_round_block(const float* src, float* dst, size_t n, size_t stride, int headroom, Rounding r) noexcept {
  float amax = 0.f;
  bool finite = true;
  for (size_t i = 0; i < n; ++i) {
    const float v = src[i * stride];
    finite = finite && std::isfinite(v);
    amax = std::fmax(amax, std::fabs(v));
  }
  if (!finite) {
    for (size_t i = 0; i < n; ++i) dst[i * stride] = std::numeric_limits<float>::quiet_NaN();
    return kDfpBlockNonFinite;
  }
  const int e = dfp16_exponent(amax, headroom);
  for (size_t i = 0; i < n; ++i) {
    // ldexp is exact here unless the result lies below 2^-126, where every rounding gives +-0.
    const float y = std::ldexp(src[i * stride], -e);
    float q;
    if (r == Rounding::biased) {
      const float a = std::fabs(y), fl = std::floor(a);
      q = std::copysign(a - fl >= 0.25f ? fl + 1.f : fl, y);
    } else {
      q = std::nearbyint(y);  // the default rounding mode: half to even
    }
    q = std::fmin(std::fmax(q, -32767.f), 32767.f) + 0.f;  // an integer: -0 is +0
    dst[i * stride] = std::ldexp(q, e);  // correctly rounded where i * 2^e is subnormal
  }
  return amax == 0.f ? kDfpBlockZero : e;
}

}  // namespace dfp
