// FP64 references and fills shared by the tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "dfp/conv.hpp"

namespace dfp::test {

// ||got - ref|| / ||ref||, in double. An all-zero ref divides by 1e-12 instead: any nonzero got
// then fails every tolerance. Different sizes give infinity.
inline double rel_l2(const float* got, const float* ref, size_t n) {
  double d = 0, r = 0;
  for (size_t i = 0; i < n; ++i) {
    d += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    r += double(ref[i]) * ref[i];
  }
  return std::sqrt(d) / std::max(std::sqrt(r), 1e-12);
}
inline double rel_l2(const std::vector<float>& got, const std::vector<float>& ref) {
  return got.size() == ref.size() ? rel_l2(got.data(), ref.data(), ref.size()) : INFINITY;
}

inline std::vector<float> random_vec(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

inline std::vector<float> random_ints(size_t n, uint32_t seed, int lo, int hi) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(u(g));
  return v;
}

// Kernel operands over the quantizer's whole range, [-32767, 32767] (it never writes -32768): one
// step's pair sum fits INT32, and sums past 2^24 make every flush's rounding show.
inline std::vector<int16_t> random_int16(size_t n, uint32_t seed) {
  const std::vector<float> r = random_ints(n, seed, -32767, 32767);
  std::vector<int16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<int16_t>(r[i]);
  return v;
}

// y[n][k][oh][ow] = sum x[n][c][ih][iw] w[k][c][r][s] (NCHW, OIHW, FP64), and alongside it the
// same sum over |x|*ax + |w|*aw + ax*aw (the quantization error bound, see tolerance.hpp).
inline void conv_fwd_ref(const ConvShape& s, const std::vector<float>& x, const std::vector<float>& w,
                         std::vector<double>& y, std::vector<double>* bound = nullptr, double ax = 0, double aw = 0) {
  const int OH = s.OH(), OW = s.OW();
  y.assign(size_t(s.N) * s.K * OH * OW, 0.0);
  if (bound) bound->assign(y.size(), 0.0);
  for (int n = 0; n < s.N; ++n)
    for (int k = 0; k < s.K; ++k)
      for (int oh = 0; oh < OH; ++oh)
        for (int ow = 0; ow < OW; ++ow) {
          double acc = 0, b = 0;
          for (int c = 0; c < s.C; ++c)
            for (int r = 0; r < s.R; ++r)
              for (int q = 0; q < s.S; ++q) {
                const int ih = oh * s.stride_h + r - s.pad_h, iw = ow * s.stride_w + q - s.pad_w;
                if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;
                const double xv = x[((size_t(n) * s.C + c) * s.H + ih) * s.W + iw];
                const double wv = w[((size_t(k) * s.C + c) * s.R + r) * s.S + q];
                acc += xv * wv;
                b += std::fabs(xv) * aw + std::fabs(wv) * ax + ax * aw;
              }
          const size_t o = ((size_t(n) * s.K + k) * OH + oh) * OW + ow;
          y[o] = acc;
          if (bound) (*bound)[o] = b;
        }
}

// dx[n][c][ih][iw] = sum dy[n][k][oh][ow] w[k][c][r][s] over ih = oh*stride + r - pad.
inline void conv_bwd_data_ref(const ConvShape& s, const std::vector<float>& dy, const std::vector<float>& w,
                              std::vector<double>& dx, std::vector<double>* bound = nullptr, double ag = 0,
                              double aw = 0) {
  const int OH = s.OH(), OW = s.OW();
  dx.assign(size_t(s.N) * s.C * s.H * s.W, 0.0);
  if (bound) bound->assign(dx.size(), 0.0);
  for (int n = 0; n < s.N; ++n)
    for (int k = 0; k < s.K; ++k)
      for (int oh = 0; oh < OH; ++oh)
        for (int ow = 0; ow < OW; ++ow) {
          const double g = dy[((size_t(n) * s.K + k) * OH + oh) * OW + ow];
          for (int c = 0; c < s.C; ++c)
            for (int r = 0; r < s.R; ++r)
              for (int q = 0; q < s.S; ++q) {
                const int ih = oh * s.stride_h + r - s.pad_h, iw = ow * s.stride_w + q - s.pad_w;
                if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;
                const double wv = w[((size_t(k) * s.C + c) * s.R + r) * s.S + q];
                const size_t o = ((size_t(n) * s.C + c) * s.H + ih) * s.W + iw;
                dx[o] += g * wv;
                if (bound) (*bound)[o] += std::fabs(g) * aw + std::fabs(wv) * ag + ag * aw;
              }
        }
}

// dw[k][c][r][s] = sum x[n][c][ih][iw] dy[n][k][oh][ow].
inline void conv_bwd_weights_ref(const ConvShape& s, const std::vector<float>& x, const std::vector<float>& dy,
                                 std::vector<double>& dw, std::vector<double>* bound = nullptr, double ax = 0,
                                 double ag = 0) {
  const int OH = s.OH(), OW = s.OW();
  dw.assign(size_t(s.K) * s.C * s.R * s.S, 0.0);
  if (bound) bound->assign(dw.size(), 0.0);
  for (int n = 0; n < s.N; ++n)
    for (int k = 0; k < s.K; ++k)
      for (int oh = 0; oh < OH; ++oh)
        for (int ow = 0; ow < OW; ++ow) {
          const double g = dy[((size_t(n) * s.K + k) * OH + oh) * OW + ow];
          for (int c = 0; c < s.C; ++c)
            for (int r = 0; r < s.R; ++r)
              for (int q = 0; q < s.S; ++q) {
                const int ih = oh * s.stride_h + r - s.pad_h, iw = ow * s.stride_w + q - s.pad_w;
                if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;
                const double xv = x[((size_t(n) * s.C + c) * s.H + ih) * s.W + iw];
                const size_t o = ((size_t(k) * s.C + c) * s.R + r) * s.S + q;
                dw[o] += xv * g;
                if (bound) (*bound)[o] += std::fabs(xv) * ag + std::fabs(g) * ax + ax * ag;
              }
        }
}

}  // namespace dfp::test
