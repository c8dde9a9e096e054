// What the model, training and memory-plan suites share: a 2-thread context and a random batch.
#pragma once

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

}  // namespace dfp::test
