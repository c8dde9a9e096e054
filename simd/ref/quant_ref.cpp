// Scalar reference for DFP16 quantization: the specification the AVX-512 kernels match bit for
// bit. Every step is an exactly specified operation (ldexp, nearbyint, floor, compare, exact double
// arithmetic), so a vector kernel that computes the same exact values gets the same bits.
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

FormatStats dfp16_stats(const float* x, size_t n, double down, double up) {
  double signal[kStatsLanes] = {}, noise[kStatsLanes] = {};
  FormatStats s;
  s.elements = n;
  for (size_t i = 0; i < n; ++i) {
    const int l = int(i % kStatsLanes);
    double v = x[i];
    if (!std::isfinite(v)) { ++s.nonfinite; v = 0; }  // a zero in its lane: adds +0 to both sums
    signal[l] += v * v;
    s.nonzero += v != 0;
    const double y = v * down;
    double q = std::nearbyint(y);
    if (std::fabs(y) >= 32767.5) {  // nearest-even gives |q| >= 32768 (32767.5 is a tie, to even)
      ++s.overflow;
      q = std::copysign(32767.0, y);
    }
    const double r = q * up;
    s.underflow += v != 0 && r == 0;
    const double d = v - r;
    noise[l] += d * d;
  }
  for (int l = 0; l < kStatsLanes; ++l) {
    s.signal += signal[l];
    s.noise += noise[l];
  }
  return s;
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

// Rounds y = x * 2^-e to an integer-valued value, nearest-even or biased.
static inline float round_value(float y, Rounding r) {
  if (r == Rounding::nearest_even) return std::nearbyint(y);  // default rounding mode: half to even
  const float a = std::fabs(y);
  const float fl = std::floor(a);
  const float q = (a - fl) >= 0.25f ? fl + 1.f : fl;
  return std::copysign(q, y);
}

// Stochastic rounding: q = floor(y + u), u = rand24 * 2^-24, in exact arithmetic. Rounds up with
// probability floor(frac(y) * 2^24) / 2^24, within 2^-24 of frac(y) and never above it. y is
// x * 2^-e as x1 * 2^k with 2^k a normal float (the kernels' FMA takes 2^k as an operand): k =
// clamp(-e, -126, 127), x1 = ldexp(x, -e - k), correctly rounded, which is x itself unless the
// tensor lies below 2^-110. In double, y is exact and so is y - floor(y).
static inline double round_stochastic(float x, int exponent, uint32_t rand24) {
  const int k = std::clamp(-exponent, -126, 127);
  const float x1 = -exponent == k ? x : std::ldexp(x, -exponent - k);
  const double y = std::ldexp(static_cast<double>(x1), k);
  if (!(std::fabs(y) < 0x1p24)) return y;  // saturates (Inf included)
  const double fl = std::floor(y);
  const double f24 = std::floor((y - fl) * 0x1p24);  // y + u >= fl + 1  <=>  rand24 >= 2^24 - f24
  return static_cast<double>(rand24) >= 0x1p24 - f24 ? fl + 1 : fl;
}

void quantize(const float* src, int16_t* dst, size_t n, int exponent, Rounding rounding, uint64_t seed,
              uint64_t index_base, QuantCounters* counters) {
  RoundingStream stream(seed);
  uint64_t saturated = 0, bad = 0;
  int32_t max_q = 0;
  for (size_t i = 0; i < n; ++i) {
    float x = src[i];
    if (!std::isfinite(x)) { ++bad; x = 0.f; }
    double q = rounding == Rounding::stochastic
                   ? round_stochastic(x, exponent, stream.rand24(index_base + i))
                   : round_value(std::ldexp(x, -exponent), rounding);  // ldexp: exact (correctly rounded if subnormal)
    if (std::fabs(q) > 32767) { ++saturated; q = std::copysign(32767., q); }
    dst[i] = static_cast<int16_t>(q);
    max_q = std::max(max_q, static_cast<int32_t>(std::fabs(q)));
  }
  if (counters) {
    counters->saturated += saturated;
    counters->nonfinite += bad;
    counters->max_abs_q = std::max(counters->max_abs_q, max_q);
  }
}

void quantize2(const float* src, int16_t* dst_a, int16_t* dst_b, size_t n, int exponent_a, int exponent_b,
               Rounding rounding, uint64_t seed, uint64_t index_base, QuantCounters* counters_a,
               QuantCounters* counters_b) {
  quantize(src, dst_a, n, exponent_a, rounding, seed, index_base, counters_a);
  quantize(src, dst_b, n, exponent_b, rounding, seed, index_base, counters_b);
}

void dequantize(const int16_t* src, float* dst, size_t n, int exponent) {
  for (size_t i = 0; i < n; ++i) dst[i] = std::ldexp(static_cast<float>(src[i]), exponent);
}

// Block DFP: each block through the specification.
static void fold_block_exponent(int e, int* lo, int* hi) {
  if (e == kDfpBlockZero || e == kDfpBlockNonFinite) return;
  *lo = std::min(*lo, e);
  *hi = std::max(*hi, e);
}

void dfp16_lanes(const float* src, float* dst, size_t planes, size_t pixels, int headroom, Rounding r, int* lo, int* hi) {
  float block[128];
  const size_t plane = pixels * 16;
  for (size_t p = 0; p < pixels; ++p) {
    for (size_t j = 0; j < planes; ++j) std::copy(src + j * plane + p * 16, src + j * plane + p * 16 + 16, block + j * 16);
    fold_block_exponent(dfp16_round_block(block, block, planes * 16, 1, headroom, r), lo, hi);
    for (size_t j = 0; j < planes; ++j) std::copy(block + j * 16, block + j * 16 + 16, dst + j * plane + p * 16);
  }
}

void dfp16_rows(const float* src, float* dst, size_t rows, size_t lanes, size_t stride, size_t block, int headroom,
                Rounding r, int* lo, int* hi) {
  for (size_t l = 0; l < lanes; ++l)
    for (size_t r0 = 0; r0 < rows; r0 += block)
      fold_block_exponent(dfp16_round_block(src + r0 * stride + l, dst + r0 * stride + l, std::min(block, rows - r0),
                                            stride, headroom, r),
                          lo, hi);
}

void interleave(const int16_t* a, const int16_t* b, int16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    dst[2 * i] = a[i];
    dst[2 * i + 1] = b ? b[i] : int16_t{0};
  }
}

}  // namespace dfp::simd::ref
