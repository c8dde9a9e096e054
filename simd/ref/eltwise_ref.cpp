// Scalar references of the element-wise FP32 kernels.
#include <algorithm>
#include <limits>

#include "simd/kernel_table.hpp"

namespace dfp::simd::ref {
float relu_fwd(const float* x, float* y, uint16_t* mask, size_t n) {
  float mx = 0.f;
  for (size_t i = 0; i < n; i += 16) {
    uint16_t bits = 0;
    for (size_t j = 0; j < 16 && i + j < n; ++j) {
      const bool pos = x[i + j] > 0.f;
      y[i + j] = pos ? x[i + j] : 0.f;
      mx = y[i + j] > mx ? y[i + j] : mx;
      bits |= uint16_t(pos) << j;
    }
    mask[i / 16] = bits;
  }
  return mx;
}
float add_relu(const float* a, const float* b, float* y, uint16_t* mask, size_t n) {
  float mx = 0.f;
  for (size_t i = 0; i < n; i += 16) {
    uint16_t bits = 0;
    for (size_t j = 0; j < 16 && i + j < n; ++j) {
      const float s = a[i + j] + b[i + j];
      const bool pos = s > 0.f;
      y[i + j] = pos ? s : 0.f;
      mx = y[i + j] > mx ? y[i + j] : mx;
      bits |= uint16_t(pos) << j;
    }
    mask[i / 16] = bits;
  }
  return mx;
}
void relu_bwd(const uint16_t* mask, const float* dy, float* dx, size_t n) {
  for (size_t i = 0; i < n; ++i) dx[i] = (mask[i / 16] >> (i % 16)) & 1 ? dy[i] : 0.f;
}
void add(const float* a, const float* b, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}
void shift_lanes(const float* a, const float* b, int shift, size_t in_step, float* out, size_t out_step, size_t pixels,
                 uint16_t keep) {
  for (size_t p = 0; p < pixels; ++p)
    for (int l = 0; l < 16; ++l) {
      const int j = l + shift;
      const float* src = j < 16 ? a : b;
      out[p * out_step * 16 + l] = (keep >> l & 1) && src ? src[p * in_step * 16 + j % 16] : 0.f;
    }
}
void lane_sums(const float* x, size_t pixels, double* acc) {
  for (size_t p = 0; p < pixels; ++p)
    for (int l = 0; l < 16; ++l) acc[l] += x[p * 16 + l];
}
float to_blocked(const float* plain, size_t plane, int lanes, float* blocked, size_t pixels) {
  float mx = 0.f;
  for (size_t p = 0; p < pixels; ++p)
    for (int l = 0; l < 16; ++l) {
      const float v = l < lanes ? plain[size_t(l) * plane + p] : 0.f;
      blocked[p * 16 + l] = v;
      const float a = v < 0.f ? -v : v;
      mx = a > mx ? a : mx;
    }
  return mx;
}
void from_blocked(const float* blocked, int lanes, float* plain, size_t plane, size_t pixels) {
  for (size_t p = 0; p < pixels; ++p)
    for (int l = 0; l < lanes; ++l) plain[size_t(l) * plane + p] = blocked[p * 16 + l];
}
void maxpool_row(const MaxPoolRowArgs& a) {
  for (int o = 0; o < a.out_w; ++o)
    for (int l = 0; l < 16; ++l) {
      float best = -std::numeric_limits<float>::infinity();
      uint8_t arg = 255;
      maxpool_taps(a, o, [&](const float* px, int t) {
        const float v = px[l];
        if (arg == 255 || v > best) {
          best = v;
          arg = uint8_t(t);
        }
      });
      a.y[size_t(o) * 16 + l] = best;
      a.arg[size_t(o) * 16 + l] = arg;
    }
}
void maxpool_row_bwd(const MaxPoolRowBwdArgs& a) {
  for (int o = 0; o < a.out_w; ++o)
    for (int l = 0; l < 16; ++l) {
      const int t = a.arg[size_t(o) * 16 + l];
      if (t == 255) continue;
      a.rows[t / a.k][size_t(o * a.stride - a.pad + t % a.k) * 16 + l] += a.dy[size_t(o) * 16 + l];
    }
}
}  // namespace dfp::simd::ref
