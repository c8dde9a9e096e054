// The CUDA device without a GPU: its runner (plan, buffers, gradient accumulation, loss scaling,
// SGD) and every own kernel body, executed by the host emulation back end (src/cuda/
// host_backend.cpp) and compared with the CPU FP32 layers. Runs in every build; the same cases run
// on the GPU in cuda_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "dfp/context.hpp"
#include "dfp/models.hpp"
#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"
#include "src/cuda/executor.hpp"
#include "tests/common/cuda_cases.hpp"
#include "tests/common/tolerance.hpp"
#include "tests/common/expect_error.hpp"

using namespace dfp;

namespace {

const Context& ctx2() {
  static Context c(ContextOptions{.threads = 2});
  return c;
}

std::shared_ptr<cuda::Executor> emulated(Model& host, const SgdOptions& so) {
  return std::make_shared<cuda::Executor>(cuda::make_host_backend(), host, so, nullptr);
}

void expect_close(const test::CaseErrors& e, const std::string& name) {
  test::print_errors("emulation " + name, e);
  EXPECT_LE(e.loss, test::kCudaEmulationRel) << name;
  EXPECT_LE(e.grad, test::kCudaEmulationRel) << name << ": worst gradient " << e.grad_at;
  EXPECT_LE(e.update, test::kCudaEmulationRel) << name;
  EXPECT_LE(e.momentum, test::kCudaEmulationRel) << name;
  EXPECT_LE(e.stats, test::kCudaEmulationRel) << name;
  EXPECT_EQ(e.hits_differ, 0) << name;
}

}  // namespace

TEST(CudaEmulation, EveryLayerKindMatchesTheCpu) {
  for (const test::CudaCase& c : test::cuda_cases()) {
    SCOPED_TRACE(c.name);
    // A static loss scale of 2^10 is exact in FP32: the results equal the unscaled ones.
    const test::CaseErrors e = test::compare_case(c, ctx2(), emulated, 1024.0);
    expect_close(e, c.name);
  }
}

TEST(CudaEmulation, ZooModelsMatchTheCpu) {
  struct Z { const char* name; int c, h, w, batch; };
  for (const Z z : {Z{"lenet", 1, 28, 28, 3}, Z{"resnet20", 3, 12, 12, 2}}) {
    SCOPED_TRACE(z.name);
    test::CudaCase c;
    c.name = z.name;
    c.batch = z.batch;
    c.build = [&](Model& m) { build_model(m, z.name, z.c, z.h, z.w, 10); };
    expect_close(test::compare_case(c, ctx2(), emulated, 1.0), z.name);
  }
}

// The training loop of the device (40 steps of LeNet on separable data) learns.
TEST(CudaEmulation, LeNetLossFalls) {
  Model m(ctx2(), "lenet");
  build_model(m, "lenet", 1, 28, 28, 10);
  m.build(32, PrecisionPolicy{});
  cuda::Executor d(cuda::make_host_backend(), m, SgdOptions{}, nullptr);
  LossScaleOptions o;
  o.mode = LossScaleMode::dynamic;
  LossScaler scaler(o);
  std::mt19937 g(3);
  const test::LossCurve c = test::train_separable(
      g, [&](const float* x, const int32_t* y, int n) { return d.train_step(x, y, n, 0.02f, scaler); });
  EXPECT_TRUE(c.finite);
  EXPECT_LT(c.last, 0.5 * c.first) << "first " << c.first << " last five " << c.last;
  EXPECT_EQ(scaler.skipped_steps(), 0u);
}

// The device draws base/random.hpp's streams, the CPU's: dropout's key is the layer's per-step key
// (seed mixed with the step's Weyl number), and the stream itself keeps its numbers (pinned: the
// masks of every run depend on them).
TEST(CudaEmulation, RandomStreamsAreTheCpus) {
  for (uint64_t seed : {0ULL, 1ULL, 0x123456789abcdefULL})
    for (uint64_t step : {0ULL, 7ULL, 1000000ULL})
      EXPECT_EQ(cuda::dropout_key(seed, step), simd::stochastic_key(seed ^ (step * 0x9e3779b97f4a7c15ULL)));
  const uint32_t key = simd::stochastic_key(0x123456789abcdefULL);
  const uint64_t index[] = {0, 1, 12345, 0xffffffffULL + 5};
  const uint32_t want[] = {0xbef045u, 0xfbe499u, 0x806629u, 0xaaf9c2u};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(simd::stochastic_rand24(key, index[i]), want[i]) << index[i];
}

// A step whose scaled gradients overflow is skipped (weights and momentum untouched) and the
// dynamic scale halves; once the scale fits, steps apply again. Here FP32 overflows because the
// inputs are huge (1e10) and the scale starts at 2^100: fc weight gradient ~ 2^100 * 1e10.
TEST(CudaEmulation, OverflowingStepsAreSkippedAndTheScaleBacksOff) {
  Model host(ctx2(), "linear");
  host.softmax_cross_entropy(host.linear(host.input(8, 1, 1), 4, true, "fc"));
  host.build(4, PrecisionPolicy{});
  cuda::Executor dev(cuda::make_host_backend(), host, SgdOptions{}, nullptr);
  std::vector<float> x;
  std::vector<int32_t> y;
  test::case_data(host, 5, x, y, 1e10f);
  LossScaleOptions o;
  o.mode = LossScaleMode::dynamic;
  o.init_scale = std::ldexp(1.0, 100);
  o.growth_interval = 1000;
  LossScaler scaler(o);
  const std::vector<float> w0(host.parameters()[0].value, host.parameters()[0].value + host.parameters()[0].size);
  const StepResult r = dev.train_step(x.data(), y.data(), 4, 0.1f, scaler);
  EXPECT_TRUE(std::isfinite(r.loss));
  EXPECT_EQ(scaler.skipped_steps(), 1u);
  EXPECT_EQ(scaler.scale(), std::ldexp(1.0, 99));
  std::vector<std::vector<float>> mom;
  dev.download(host, &mom);
  EXPECT_EQ(std::memcmp(w0.data(), host.parameters()[0].value, w0.size() * sizeof(float)), 0);
  for (float v : mom[0]) EXPECT_EQ(v, 0.f);
  EXPECT_EQ(dev.step(), 1u);  // a skipped step still counts (dropout streams), as on the CPU
  // Back off until the gradients fit (2^100 * 1e10 / 4 must drop below FP32's 2^128).
  int applied_at = -1;
  for (int s = 0; s < 40 && applied_at < 0; ++s) {
    const uint64_t skipped = scaler.skipped_steps();
    dev.train_step(x.data(), y.data(), 4, 0.1f, scaler);
    if (scaler.skipped_steps() == skipped) applied_at = s;
  }
  ASSERT_GE(applied_at, 0);
  EXPECT_LE(scaler.scale(), std::ldexp(1.0, 99));
  dev.download(host, nullptr);
  EXPECT_NE(std::memcmp(w0.data(), host.parameters()[0].value, w0.size() * sizeof(float)), 0);
}

// In FP32 a non-finite loss is an error, as on the CPU (no loss scaler hides divergence).
TEST(CudaEmulation, Fp32NonFiniteLogitsAreAnErrorAndBadCallsAreRefused) {
  Model host(ctx2(), "linear");
  host.softmax_cross_entropy(host.linear(host.input(8, 1, 1), 4, true, "fc"));
  host.build(4, PrecisionPolicy{});
  cuda::Executor dev(cuda::make_host_backend(), host, SgdOptions{}, nullptr);
  std::vector<float> x;
  std::vector<int32_t> y;
  test::case_data(host, 5, x, y);
  LossScaler none{LossScaleOptions{}};
  x[3] = std::numeric_limits<float>::infinity();
  test::expect_error([&] { dev.train_step(x.data(), y.data(), 4, 0.1f, none); }, Status::numerical_error);
  x[3] = 0.f;
  EXPECT_THROW(dev.train_step(x.data(), y.data(), 3, 0.1f, none), Error);  // training batches are full
  y[1] = 4;
  EXPECT_THROW(dev.evaluate(x.data(), y.data(), 4), Error);  // label out of range
  y[1] = 0;
  LossScaleOptions ad;
  ad.mode = LossScaleMode::adaptive;
  LossScaler adaptive(ad);
  test::expect_error([&] { dev.train_step(x.data(), y.data(), 4, 0.1f, adaptive); }, Status::unsupported);
  EXPECT_NO_THROW(dev.evaluate(x.data(), y.data(), 2));
}

// Uploading a checkpoint's state (parameters, momentum, statistics, step) and reading it back is
// the identity.
TEST(CudaEmulation, UploadDownloadRoundTrip) {
  Model host(ctx2(), "bn");
  test::cuda_case("batchnorm").build(host);
  host.build(2, PrecisionPolicy{});
  ASSERT_FALSE(host.buffers().empty()) << "the round trip must cover BatchNorm running statistics";
  std::vector<std::vector<float>> mom;
  for (const Parameter& p : host.parameters()) {
    mom.emplace_back(p.size);
    for (size_t i = 0; i < p.size; ++i) mom.back()[i] = float(i % 7) * 0.25f;
  }
  for (auto& [name, v] : host.buffers())
    for (size_t i = 0; i < v->size(); ++i) (*v)[i] = 0.5f + float(i);
  host.set_step(41);
  std::vector<std::vector<float>> w;
  for (const Parameter& p : host.parameters()) w.emplace_back(p.value, p.value + p.size);
  cuda::Executor dev(cuda::make_host_backend(), host, SgdOptions{}, &mom);
  EXPECT_EQ(dev.step(), 41u);
  for (const Parameter& p : host.parameters()) std::memset(p.value, 0, p.size * sizeof(float));
  std::vector<std::vector<float>> mom2;
  dev.download(host, &mom2);
  EXPECT_EQ(mom2, mom);
  for (size_t p = 0; p < w.size(); ++p)
    EXPECT_EQ(std::memcmp(w[p].data(), host.parameters()[p].value, w[p].size() * sizeof(float)), 0);
  for (auto& [name, v] : host.buffers()) EXPECT_EQ((*v)[1], 1.5f) << name;
  EXPECT_EQ(host.step(), 41u);
}

// Per-layer timing observes and changes nothing: two devices from one host model, one timed, take
// the same steps to the same weights; the timed one has a row per node, forward time on every
// layer, backward time on the weighted ones, and one count per step.
TEST(CudaEmulation, ProfilingTimesLayersWithoutChangingTheStep) {
  Model host(ctx2(), "lenet");
  build_model(host, "lenet", 1, 28, 28, 10);
  host.build(8, PrecisionPolicy{});
  cuda::Executor plain(cuda::make_host_backend(), host, SgdOptions{}, nullptr);
  cuda::Executor timed(cuda::make_host_backend(), host, SgdOptions{}, nullptr);
  timed.set_profile(true);
  std::vector<float> x(blocked_size(8, 1, 28, 28));
  std::vector<int32_t> y(8);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 2654435761u % 1000) - 500) * 1e-3f;
  for (int i = 0; i < 8; ++i) y[size_t(i)] = i % 10;
  LossScaler s1, s2;
  for (int step = 0; step < 3; ++step) {
    const StepResult a = plain.train_step(x.data(), y.data(), 8, 0.05f, s1);
    const StepResult b = timed.train_step(x.data(), y.data(), 8, 0.05f, s2);
    EXPECT_EQ(a.loss, b.loss) << "step " << step;
  }
  const auto ga = plain.gradients(), gb = timed.gradients();
  EXPECT_EQ(ga, gb);
  timed.set_profile(false);  // the rows stay readable
  const auto& rows = timed.layer_times();
  ASSERT_EQ(rows.size(), host.graph().size());
  EXPECT_EQ(timed.step_times().steps, 3);
  for (size_t i = 1; i < rows.size(); ++i) {
    EXPECT_GT(rows[i].forward_ms, 0.0) << rows[i].name;
    if (rows[i].kind == "conv" || rows[i].kind == "fc") {
      EXPECT_GT(rows[i].backward_ms, 0.0) << rows[i].name;
    }
  }
  timed.reset_profile();
  EXPECT_EQ(timed.step_times().steps, 0);
  EXPECT_EQ(timed.layer_times()[1].forward_ms, 0.0);
}
