// Scalar BF16/FP16/FP8 conversion kernels: loops over the scalar specifications (base/float16.cpp,
// base/float8.cpp).
#include <algorithm>
#include <cmath>

#include "dfp/float16.hpp"
#include "dfp/float8.hpp"
#include "dfp/posit.hpp"
#include "simd/kernel_table.hpp"

namespace dfp::simd::ref {
namespace {
template <class Nearest, class Stochastic>
void convert(const float* src, uint16_t* dst, size_t n, Rounding r, uint32_t key, uint64_t base, Nearest nearest,
             Stochastic stochastic) {
  if (r == Rounding::stochastic) {
    for (size_t i = 0; i < n; ++i) dst[i] = stochastic(src[i], stochastic_rand24(key, base + i));
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = nearest(src[i]);
  }
}
}  // namespace

void to_bf16(const float* src, uint16_t* dst, size_t n, Rounding r, uint32_t key, uint64_t base) {
  convert(src, dst, n, r, key, base, f32_to_bf16, f32_to_bf16_stochastic);
}
void to_fp16(const float* src, uint16_t* dst, size_t n, Rounding r, uint32_t key, uint64_t base) {
  convert(src, dst, n, r, key, base, f32_to_fp16, f32_to_fp16_stochastic);
}
void bf16_to_f32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = dfp::bf16_to_f32(src[i]);
}
void fp16_to_f32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = dfp::fp16_to_f32(src[i]);
}
void round_bf16(const float* src, float* dst, size_t n, Rounding r, uint32_t key, uint64_t base) {
  for (size_t i = 0; i < n; ++i)
    dst[i] = dfp::bf16_to_f32(r == Rounding::stochastic ? f32_to_bf16_stochastic(src[i], stochastic_rand24(key, base + i))
                                                        : f32_to_bf16(src[i]));
}
void round_fp16(const float* src, float* dst, size_t n, Rounding r, uint32_t key, uint64_t base) {
  for (size_t i = 0; i < n; ++i)
    dst[i] = dfp::fp16_to_f32(r == Rounding::stochastic ? f32_to_fp16_stochastic(src[i], stochastic_rand24(key, base + i))
                                                        : f32_to_fp16(src[i]));
}

float round_fp8(const float* src, float* dst, size_t n, FloatFormat f, Overflow o, int scale_exp, Rounding r,
                uint32_t key, uint64_t base) {
  float amax = 0.f;
  for (size_t i = 0; i < n; ++i) {
    const float x = src[i];
    if (std::isfinite(x)) amax = std::max(amax, std::fabs(x));
    dst[i] = round_float8(x, f, o, scale_exp, r, r == Rounding::stochastic ? stochastic_rand24(key, base + i) : 0);
  }
  return amax;
}

namespace {
void fold(int x, int* lo, int* hi) {
  if (x == kMxNanScale) return;
  *lo = std::min(*lo, x);
  *hi = std::max(*hi, x);
}
}  // namespace

void mx_lanes(const float* a, const float* b, float* da, float* db, size_t pixels, FloatFormat f, int* lo, int* hi) {
  float block[kMxBlock];
  for (size_t p = 0; p < pixels; ++p) {
    std::copy(a + p * 16, a + p * 16 + 16, block);
    if (b) std::copy(b + p * 16, b + p * 16 + 16, block + 16);
    fold(mx_round_block(block, block, b ? 32 : 16, 1, f), lo, hi);
    std::copy(block, block + 16, da + p * 16);
    if (b) std::copy(block + 16, block + 32, db + p * 16);
  }
}

void mx_rows(const float* src, float* dst, size_t rows, size_t lanes, size_t stride, FloatFormat f, int* lo, int* hi) {
  for (size_t l = 0; l < lanes; ++l)
    for (size_t r0 = 0; r0 < rows; r0 += kMxBlock)
      fold(mx_round_block(src + r0 * stride + l, dst + r0 * stride + l, std::min<size_t>(kMxBlock, rows - r0), stride, f),
           lo, hi);
}

void round_posit16(const float* src, float* dst, size_t n, int es) {
  for (size_t i = 0; i < n; ++i) dst[i] = dfp::round_posit16(src[i], es);
}

}  // namespace dfp::simd::ref
