// Scalar references of the BatchNorm kernels (kernel_table.hpp states the operations). Compiled
// with -ffp-contract=off: every product and sum is rounded on its own, as in the vector kernels.
#include <algorithm>
#include <cmath>

#include "simd/kernel_table.hpp"

namespace dfp::simd::ref {
namespace {

// dy, or 0 where a fused ReLU's mask bit is clear.
inline float grad(const float* dy, const uint16_t* mask, size_t i, int l) {
  return !mask || (mask[i] >> l) & 1 ? dy[i * 16 + l] : 0.f;
}

template <class T>
void bwd_sums(const T* x, const float* dy, const uint16_t* mask, const BnCoefficients& c, size_t pixels, float* sdy,
              float* sdyx, float* glo, float* ghi) {
  for (size_t i = 0; i < pixels; ++i)
    for (int l = 0; l < 16; ++l) {
      const size_t e = i * 16 + l;
      const float g = grad(dy, mask, i, l);
      sdy[l] += g;
      glo[l] = g < glo[l] ? g : glo[l];  // NaN never wins
      ghi[l] = g > ghi[l] ? g : ghi[l];
      sdyx[l] += g * (float(x[e]) * c.x_scale - c.mean[l]) * c.inv[l];
    }
}

template <class T>
float bwd_apply(const T* x, const float* dy, const uint16_t* mask, float* dx, const BnCoefficients& c, size_t pixels,
                float mx) {
  for (size_t i = 0; i < pixels; ++i)
    for (int l = 0; l < 16; ++l) {
      const size_t e = i * 16 + l;
      const float xhat = (float(x[e]) * c.x_scale - c.mean[l]) * c.inv[l];
      dx[e] = c.k1[l] * (grad(dy, mask, i, l) - c.k2[l] - xhat * c.k3[l]);
      const float a = std::fabs(dx[e]);
      mx = a > mx ? a : mx;
    }
  return mx;
}

}  // namespace

void bn_scale_shift(const float* x, float* y, const float* a, const float* b, size_t pixels) {
  for (size_t i = 0; i < pixels; ++i)
    for (int l = 0; l < 16; ++l) y[i * 16 + l] = x[i * 16 + l] * a[l] + b[l];
}

void bn_moments(const float* x, size_t pixels, float* centre, float* dev, float* sq, float* min, float* max) {
  for (int l = 0; l < 16; ++l) {
    float s = 0.f;
    for (size_t i = 0; i < pixels; ++i) {
      const float v = x[i * 16 + l];
      s += v;
      min[l] = v < min[l] ? v : min[l];  // NaN never wins
      max[l] = v > max[l] ? v : max[l];
    }
    const float c = s / static_cast<float>(pixels);
    float d = 0.f, q = 0.f;
    for (size_t i = 0; i < pixels; ++i) {
      const float t = x[i * 16 + l] - c;
      d += t;
      q += t * t;
    }
    centre[l] = c;
    dev[l] = d;
    sq[l] = q;
  }
}

void bn_bwd_sums_s16(const int16_t* x, const float* dy, const uint16_t* mask, const BnCoefficients& c, size_t pixels,
                     float* sdy, float* sdyx, float* glo, float* ghi) {
  bwd_sums(x, dy, mask, c, pixels, sdy, sdyx, glo, ghi);
}
void bn_bwd_sums_f32(const float* x, const float* dy, const uint16_t* mask, const BnCoefficients& c, size_t pixels,
                     float* sdy, float* sdyx, float* glo, float* ghi) {
  bwd_sums(x, dy, mask, c, pixels, sdy, sdyx, glo, ghi);
}
float bn_bwd_apply_s16(const int16_t* x, const float* dy, const uint16_t* mask, float* dx, const BnCoefficients& c,
                       size_t pixels, float max0) {
  return bwd_apply(x, dy, mask, dx, c, pixels, max0);
}
float bn_bwd_apply_f32(const float* x, const float* dy, const uint16_t* mask, float* dx, const BnCoefficients& c,
                       size_t pixels, float max0) {
  return bwd_apply(x, dy, mask, dx, c, pixels, max0);
}

// The kernels it stands for, in turn, a piece of pixels at a time.
bool bn_requantize_pair(const int16_t* a, const int16_t* b, int e_in, const float* scale, const float* shift,
                        bool relu, int e_out, int16_t* dst, size_t pixels, int32_t* max_q) {
  constexpr size_t kPixels = 32;
  float y[kPixels * 16];
  int16_t q[2][kPixels * 16];
  uint16_t mask[kPixels];
  max_q[0] = max_q[1] = 0;
  for (size_t p0 = 0; p0 < pixels; p0 += kPixels) {
    const size_t np = std::min(kPixels, pixels - p0), n = np * 16;
    for (int i = 0; i < (b ? 2 : 1); ++i) {
      dequantize((i ? b : a) + p0 * 16, y, n, e_in);
      bn_scale_shift(y, y, scale, shift, np);
      if (relu) relu_fwd(y, y, mask, n);
      QuantCounters c;
      quantize(y, q[i], n, e_out, Rounding::nearest_even, 0, 0, &c);
      if (c.saturated || c.nonfinite || c.max_abs_q >= 32767) return false;
      max_q[i] = std::max(max_q[i], c.max_abs_q);
    }
    interleave(q[0], b ? q[1] : nullptr, dst + p0 * 32, n);
  }
  return true;
}

bool bn_requantize(const int16_t* x, int e_in, const float* scale, const float* shift, uint16_t* mask, int e_out,
                   int16_t* dst, size_t pixels, int32_t* max_q) {
  constexpr size_t kPixels = 32;
  float y[kPixels * 16];
  *max_q = 0;
  for (size_t p0 = 0; p0 < pixels; p0 += kPixels) {
    const size_t np = std::min(kPixels, pixels - p0), n = np * 16;
    dequantize(x + p0 * 16, y, n, e_in);
    bn_scale_shift(y, y, scale, shift, np);
    if (mask) relu_fwd(y, y, mask + p0, n);
    QuantCounters c;
    quantize(y, dst + p0 * 16, n, e_out, Rounding::nearest_even, 0, 0, &c);
    if (c.saturated || c.nonfinite || c.max_abs_q >= 32767) return false;
    *max_q = std::max(*max_q, c.max_abs_q);
  }
  return true;
}

float bn_bwd_requantize(const int16_t* x, const float* dy, const uint16_t* mask, const BnCoefficients& c,
                        size_t pixels, int e_out, int16_t* dst, int32_t* max_q) {
  constexpr size_t kPixels = 32;
  float d[kPixels * 16];
  float mx = 0.f;
  *max_q = 0;
  for (size_t p0 = 0; p0 < pixels; p0 += kPixels) {
    const size_t np = std::min(kPixels, pixels - p0), n = np * 16;
    mx = bwd_apply(x + p0 * 16, dy + p0 * 16, mask ? mask + p0 : nullptr, d, c, np, mx);
    QuantCounters q;
    quantize(d, dst + p0 * 16, n, e_out, Rounding::nearest_even, 0, 0, &q);
    if (q.saturated || q.nonfinite || q.max_abs_q >= 32767) return -1.f;
    *max_q = std::max(*max_q, q.max_abs_q);
  }
  return mx;
}

}  // namespace dfp::simd::ref
