// What the model, training and memory-plan suites share: a 2-thread context, a random batch, and
// the built-in loss's gradient as a caller computes it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "dfp/model.hpp"

namespace dfp::test {

inline const Context& ctx2() {
  static Context c(ContextOptions{.threads = 2});
  return c;
}

// A batch of N(0, 1) images of m's input shape in the blocked layout, drawn from `seed`.
inline std::vector<float> batch_images(const Model& m, uint32_t seed) {
  const TensorShape s = m.shape(0);
  std::vector<float> nchw(size_t(m.batch()) * s.c * s.h * s.w);
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : nchw) v = nd(g);
  std::vector<float> b(blocked_size(m.batch(), s.c, s.h, s.w));
  to_blocked(nchw.data(), b.data(), m.batch(), s.c, s.h, s.w);
  return b;
}

// The built-in loss's gradient as the caller computes it: float((p - onehot) / n) with p the
// softmax rounded to float, as the model keeps it.
inline std::vector<float> cross_entropy_grad(const std::vector<float>& z, const std::vector<int32_t>& y, int n, int k) {
  std::vector<float> g(z.size());
  for (int i = 0; i < n; ++i) {
    const float* r = z.data() + size_t(i) * k;
    const float zmax = *std::max_element(r, r + k);
    double sum = 0;
    for (int c = 0; c < k; ++c) sum += std::exp(double(r[c]) - zmax);
    const double lse = zmax + std::log(sum);
    for (int c = 0; c < k; ++c) {
      const float p = static_cast<float>(std::exp(r[c] - lse));
      g[size_t(i) * k + c] = static_cast<float>((p - (c == y[i] ? 1.0 : 0.0)) / n);
    }
  }
  return g;
}

}  // namespace dfp::test
