// Scalar reference for DFP16 quantization: the specification the AVX-512 kernels match bit for
// bit. Every step is an exactly specified IEEE operation (ldexp, nearbyint, floor, compare), so a
// vector kernel doing the same operations in the same order gets the same bits.
#include <algorithm>
#include <cmath>

#include "simd/kernel_table.hpp"

namespace dfp::simd::ref {

float max_abs(const float* x, size_t n, uint64_t* nonfinite) {
  float m = 0.f;
  uint64_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) { ++bad; continue; }
    m = std::fmax(m, std::fabs(x[i]));
  }
  if (nonfinite) *nonfinite += bad;
  return m;
}

// The stochastic stream of one quantize call: ARS-5 blocks, each computed once for its four
// elements.
class RoundingStream {
 public:
  explicit RoundingStream(uint64_t seed) : seed_(seed) {}
  uint32_t rand24(uint64_t index) {
    if (!valid_ || index >> 2 != counter_) {
      counter_ = index >> 2;
      block_ = ars5(seed_, counter_);
      valid_ = true;
    }
    return ars_word(block_, index) >> 8;
  }

 private:
  uint64_t seed_, counter_ = 0;
  Block128 block_;
  bool valid_ = false;
};

// Rounds y (already scaled by 2^-e) to an integer-valued float.
static inline float round_value(float y, Rounding r, RoundingStream& stream, uint64_t index) {
  switch (r) {
    case Rounding::nearest_even:
      return std::nearbyint(y);  // default rounding mode: half to even
    case Rounding::stochastic: {
      const float fl = std::floor(y);
      const float frac = y - fl;  // exact: y and fl share the binade or fl is 0
      const float u = static_cast<float>(stream.rand24(index)) * 0x1p-24f;
      return u < frac ? fl + 1.f : fl;
    }
    case Rounding::biased: {
      const float a = std::fabs(y);
      const float fl = std::floor(a);
      const float q = (a - fl) >= 0.25f ? fl + 1.f : fl;
      return std::copysign(q, y);
    }
  }
  return 0.f;
}

void quantize(const float* src, int16_t* dst, size_t n, int exponent, Rounding rounding, uint64_t seed,
              uint64_t index_base, QuantCounters* counters) {
  RoundingStream stream(seed);
  uint64_t saturated = 0, bad = 0;
  int32_t max_q = 0;
  for (size_t i = 0; i < n; ++i) {
    float x = src[i];
    if (!std::isfinite(x)) { ++bad; x = 0.f; }
    const float y = std::ldexp(x, -exponent);  // exact (correctly rounded if subnormal)
    float q = round_value(y, rounding, stream, index_base + i);
    if (std::fabs(q) > 32767.f) { ++saturated; q = std::copysign(32767.f, q); }
    dst[i] = static_cast<int16_t>(q);
    max_q = std::max(max_q, static_cast<int32_t>(std::fabs(q)));
  }
  if (counters) {
    counters->saturated += saturated;
    counters->nonfinite += bad;
    counters->max_abs_q = std::max(counters->max_abs_q, max_q);
  }
}

void dequantize(const int16_t* src, float* dst, size_t n, int exponent) {
  for (size_t i = 0; i < n; ++i) dst[i] = std::ldexp(static_cast<float>(src[i]), exponent);
}

void interleave(const int16_t* a, const int16_t* b, int16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    dst[2 * i] = a[i];
    dst[2 * i + 1] = b ? b[i] : int16_t{0};
  }
}

}  // namespace dfp::simd::ref
