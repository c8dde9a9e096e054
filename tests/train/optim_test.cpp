// The optimizer: SGD's update formula at every kernel level, its measured maxima setting the
// weight exponent, and the learning-rate schedules.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/models.hpp"
#include "dfp/optim.hpp"
#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"
#include "tests/common/expect_error.hpp"
#include "tests/common/isa_levels.hpp"
#include "tests/common/model_helpers.hpp"

using namespace dfp;
using test::batch_images;
using test::ctx2;

// SGD's update (momentum, Nesterov, weight decay) follows its formula, in FP32 operations none
// fused, and every kernel level gives the reference's bits, at every length (tails included).
TEST(Sgd, UpdateFollowsTheFormulaAtEveryKernelLevel) {
  const CpuFeatures cpu = detect_cpu_features();
  std::mt19937 g(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{1000}})
    for (bool nesterov : {false, true})
      for (float wd : {0.f, 5e-4f}) {
        std::vector<float> w(n), grad(n), v(n);
        for (size_t i = 0; i < n; ++i) { w[i] = nd(g); grad[i] = nd(g); v[i] = nd(g); }
        const simd::SgdArgs a{0.1f, 0.9f, wd, nesterov};
        // The formula, one FP32 operation at a time (volatile: nothing fused or reordered).
        std::vector<float> we(w), ve(v);
        for (size_t i = 0; i < n; ++i) {
          volatile float t = a.weight_decay * we[i];
          const float gi = grad[i] + t;
          t = a.momentum * ve[i];
          ve[i] = t + gi;
          t = a.momentum * ve[i];
          const float step = nesterov ? gi + t : ve[i];
          t = a.lr * step;
          we[i] = we[i] - t;
        }
        for (Isa isa : test::isa_levels()) {
          const simd::KernelTable k = simd::make_kernel_table(isa, cpu);
          std::vector<float> wk(w), vk(v);
          const float max_abs = k.sgd_update.fn(wk.data(), grad.data(), vk.data(), n, a);
          // (n = 0: empty vectors, whose data() may be null, which memcmp must not get.)
          ASSERT_EQ(0, n ? std::memcmp(wk.data(), we.data(), n * sizeof(float)) : 0) << k.sgd_update.name << " n=" << n;
          ASSERT_EQ(0, n ? std::memcmp(vk.data(), ve.data(), n * sizeof(float)) : 0) << k.sgd_update.name << " n=" << n;
          float want = 0.f;
          for (float x : we) want = std::max(want, std::fabs(x));
          ASSERT_EQ(max_abs, want) << k.sgd_update.name << " n=" << n;
        }
      }
  // The maximum it returns is the DFP16 exponent's input: a NaN anywhere (also in a vector tail)
  // must make it NaN, so that the quantizer measures and reports the tensor; infinity stays.
  for (size_t n : {size_t{7}, size_t{16}, size_t{40}})
    for (size_t bad : {size_t{0}, n - 1}) {
      for (Isa isa : test::isa_levels()) {
        const simd::KernelTable k = simd::make_kernel_table(isa, cpu);
        for (float poison : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
          std::vector<float> w(n, 0.5f), grad(n, 0.f), v(n, 0.f);
          grad[bad] = poison;  // the updated weight becomes NaN, or -inf
          const float m = k.sgd_update.fn(w.data(), grad.data(), v.data(), n, {0.1f, 0.9f, 0.f, false});
          if (std::isnan(poison)) EXPECT_TRUE(std::isnan(m)) << k.sgd_update.name << " n=" << n << " at " << bad;
          else EXPECT_EQ(m, std::numeric_limits<float>::infinity()) << k.sgd_update.name << " n=" << n;
        }
      }
    }
}

// The optimizer's pass measures max|w| and hands it to weights_updated(max_abs), which takes the
// INT16 weights' exponent from it: the same exponent as a measured maximum; a reported 4x larger
// maximum moves it by exactly 2; weights_updated() without maxima measures again; a wrong count
// is refused.
TEST(Sgd, ItsMaximumSetsTheWeightExponent) {
  Model m(ctx2(), "m");
  auto x = m.input(3, 6, 6);
  m.softmax_cross_entropy(m.linear(m.global_avgpool(m.conv(x, 16, 3, 1, 1, false, "c"), "gap"), 4, true, "fc"));
  PrecisionPolicy pol;
  pol.precision = Precision::int16;
  m.build(2, pol);
  Sgd sgd(ctx2(), m, {0.9f, 5e-4f, false});
  const auto img = batch_images(m, 3);
  const std::vector<int32_t> y = {1, 3};
  m.forward(img.data(), y.data(), 2, true);
  m.backward();
  sgd.step(0.1f);
  auto exp_w = [&] {
    m.forward(img.data(), y.data(), 2, true);
    return m.numerics().at(0).exp_w;
  };
  const int from_optimizer = exp_w();
  m.weights_updated();
  const int measured = exp_w();
  EXPECT_EQ(from_optimizer, measured);
  const Parameter& w = m.parameters()[0];
  float true_max = 0.f;
  for (size_t i = 0; i < w.size; ++i) true_max = std::max(true_max, std::fabs(w.value[i]));
  std::vector<float> reported(m.parameters().size(), -1.f);
  reported[0] = true_max * 4;  // as if the optimizer had reported a 4x larger weight
  m.weights_updated(reported);
  EXPECT_EQ(exp_w(), measured + 2);
  m.weights_updated();  // nothing reported: measured again
  EXPECT_EQ(exp_w(), measured);
  reported.pop_back();
  test::expect_error([&] { m.weights_updated(reported); }, Status::invalid_argument, {"weights_updated", "one per parameter"});
}

TEST(Schedule, WarmupCosineStepMultistep) {
  LrSchedule s;
  s.base = 0.1f; s.steps_per_epoch = 10; s.total_steps = 100; s.warmup_steps = 10;
  EXPECT_FLOAT_EQ(s.at(0), 0.01f);
  EXPECT_FLOAT_EQ(s.at(9), 0.1f);
  EXPECT_FLOAT_EQ(s.at(10), 0.1f);
  EXPECT_NEAR(s.at(55), 0.05f, 1e-6);
  EXPECT_NEAR(s.at(100), 0.f, 1e-7);
  s.kind = ScheduleKind::multistep; s.warmup_steps = 0; s.milestones = {3, 6};
  EXPECT_FLOAT_EQ(s.at(29), 0.1f);
  EXPECT_NEAR(s.at(30), 0.01f, 1e-8);
  EXPECT_NEAR(s.at(65), 0.001f, 1e-9);
  s.kind = ScheduleKind::step; s.step_epochs = 2;
  EXPECT_NEAR(s.at(45), 0.001f, 1e-9);
  EXPECT_THROW(parse_schedule("linear", "flag --schedule"), Error);
}
