// The CUDA device on a GPU: every layer kind against the CPU FP32 layers in fp32 and fp16, a short
// training run whose loss falls, loss scaling, and the trainer's --device cuda path. Every GPU test
// skips where cuda_available() is false (CPU-only builds, machines without a GPU); the tests of
// that situation itself run there instead.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <unistd.h>

#include "dfp/context.hpp"
#include "dfp/cuda.hpp"
#include "dfp/models.hpp"
#include "dfp/status.hpp"
#include "dfp/trainer.hpp"
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

#define DFP_NEED_GPU()                                  \
  do {                                                  \
    std::string why_;                                   \
    if (!cuda_available(&why_)) GTEST_SKIP() << why_;   \
  } while (0)

std::function<std::shared_ptr<cuda::Executor>(Model&, const SgdOptions&)> on_gpu(Precision p) {
  return [p](Model& host, const SgdOptions& so) {
    auto m = std::make_shared<CudaModel>(ctx2(), host, p, so);
    return std::shared_ptr<cuda::Executor>(m, &m->executor());  // keeps the CudaModel alive
  };
}

}  // namespace

// Without a GPU (or without CUDA in the build) the device says why, and constructing it is a
// clear Error(unsupported); with one, the reason is empty.
TEST(Cuda, AvailabilityComesWithAReason) {
  std::string why;
  const bool ok = cuda_available(&why);
  EXPECT_EQ(ok, why.empty()) << why;
  if (ok) return;
  Model m(ctx2(), "linear");
  m.softmax_cross_entropy(m.linear(m.input(4, 1, 1), 3, true, "fc"));
  m.build(2, PrecisionPolicy{});
  test::expect_error([&] { CudaModel d(ctx2(), m, Precision::fp16, SgdOptions{}); }, Status::unsupported, {why});
}

TEST(Cuda, DeviceFlagWithoutAGpuIsAClearError) {
  std::string why;
  if (cuda_available(&why)) GTEST_SKIP() << "a GPU is present";
  TrainConfig c;
  c.model = "lenet";
  c.device = "cuda";
  c.policy.precision = Precision::fp16;
  test::expect_error([&] { train(c, nullptr); }, Status::unsupported, {"--device cuda", why});
  c.device = "tpu";
  EXPECT_THROW(train(c, nullptr), Error);
}

TEST(Cuda, PrecisionNamesForCompare) {
  TrainConfig c;
  EXPECT_EQ(precision_label(c), "fp32");
  c.device = "cuda";
  c.policy.precision = Precision::fp16;
  EXPECT_EQ(precision_label(c), "cuda-fp16");
}

// The GPU runs fp16 or fp32 only: any other precision is refused before the device is touched.
TEST(Cuda, OnlyFp16AndFp32RunOnTheDevice) {
  Model m(ctx2(), "linear");
  m.softmax_cross_entropy(m.linear(m.input(4, 1, 1), 3, true, "fc"));
  m.build(2, PrecisionPolicy{});
  for (Precision p : {Precision::int16, Precision::bf16}) {
    SCOPED_TRACE(precision_name(p));
    test::expect_error([&] { CudaModel d(ctx2(), m, p, SgdOptions{}); }, Status::invalid_argument);
  }
  TrainConfig c;
  c.device = "cuda";
  c.policy.precision = Precision::int16;
  EXPECT_THROW(train(c, nullptr), Error);  // invalid_argument with a GPU, unsupported without
}

namespace {
// Every layer kind on the GPU against the CPU FP32 layers: loss and BatchNorm statistics within
// loss_tol, gradients, SGD updates and momentum within grad_tol (tolerance table rows).
void expect_cases_match(Precision p, double loss_scale, double loss_tol, double grad_tol) {
  for (const test::CudaCase& c : test::cuda_cases()) {
    SCOPED_TRACE(c.name);
    const test::CaseErrors e = test::compare_case(c, ctx2(), on_gpu(p), loss_scale);
    test::print_errors(std::string("cuda-") + precision_name(p) + " " + c.name, e);
    EXPECT_LE(e.loss, loss_tol) << c.name;
    EXPECT_LE(e.grad, grad_tol) << c.name << ": worst gradient " << e.grad_at;
    EXPECT_LE(e.update, grad_tol) << c.name;
    EXPECT_LE(e.momentum, grad_tol) << c.name;
    EXPECT_LE(e.stats, loss_tol) << c.name;
  }
}
}  // namespace

TEST(Cuda, EveryLayerKindMatchesTheCpuInFp32) {
  DFP_NEED_GPU();
  expect_cases_match(Precision::fp32, 1.0, test::kCudaFp32Rel, test::kCudaFp32Rel);
}

TEST(Cuda, EveryLayerKindMatchesTheCpuInFp16) {
  DFP_NEED_GPU();
  expect_cases_match(Precision::fp16, 256.0, test::kCudaFp16LossRel, test::kCudaFp16GradRel);
}

TEST(Cuda, LeNetLossFallsInBothPrecisions) {
  DFP_NEED_GPU();
  for (Precision p : {Precision::fp16, Precision::fp32}) {
    SCOPED_TRACE(precision_name(p));
    Model m(ctx2(), "lenet");
    build_model(m, "lenet", 1, 28, 28, 10);
    m.build(32, PrecisionPolicy{});
    CudaModel d(ctx2(), m, p, SgdOptions{});
    LossScaleOptions o;
    o.mode = p == Precision::fp16 ? LossScaleMode::dynamic : LossScaleMode::none;
    LossScaler scaler(o);
    std::mt19937 g(3);
    const test::LossCurve c = test::train_separable(
        g, [&](const float* x, const int32_t* y, int n) { return d.train_step(x, y, n, 0.02f, scaler); });
    ASSERT_TRUE(c.finite);
    EXPECT_LT(c.last, 0.5 * c.first) << "first " << c.first << " last five " << c.last;
    EXPECT_LE(scaler.skipped_steps(), 5u);  // dynamic scaling may back off a few times at the start
    std::vector<float> x;
    std::vector<int32_t> y;
    test::separable_batch(32, g, x, y);
    const StepResult e = d.evaluate(x.data(), y.data(), 20);
    EXPECT_EQ(e.count, 20);
    EXPECT_GT(e.correct1, 10);
  }
}

// fp16: a loss scale of 2^40 makes the scaled loss gradient overflow FP16 (max 65504), so the step
// is skipped, the weights and momentum stay, and the scale halves; steps apply again once the
// scale fits. The same state machine (LossScaler) as the CPU.
TEST(Cuda, Fp16LossScalerSkipsOverflowingStepsAndBacksOff) {
  DFP_NEED_GPU();
  Model m(ctx2(), "c");
  test::cuda_case("batchnorm").build(m);  // conv, BatchNorm, ReLU, pooling, linear
  m.build(8, PrecisionPolicy{});
  CudaModel d(ctx2(), m, Precision::fp16, SgdOptions{});
  LossScaleOptions o;
  o.mode = LossScaleMode::dynamic;
  o.init_scale = std::ldexp(1.0, 40);
  LossScaler scaler(o);
  std::vector<float> x;
  std::vector<int32_t> y;
  test::case_data(m, 9, x, y);
  std::vector<std::vector<float>> w0;
  for (const Parameter& p : m.parameters()) w0.emplace_back(p.value, p.value + p.size);
  d.train_step(x.data(), y.data(), 8, 0.1f, scaler);
  EXPECT_EQ(scaler.skipped_steps(), 1u);
  EXPECT_EQ(scaler.scale(), std::ldexp(1.0, 39));
  std::vector<std::vector<float>> mom;
  d.download(m, &mom);
  for (size_t p = 0; p < w0.size(); ++p) {
    EXPECT_EQ(std::memcmp(w0[p].data(), m.parameters()[p].value, w0[p].size() * sizeof(float)), 0) << p;
    for (float v : mom[p]) ASSERT_EQ(v, 0.f);
  }
  int applied = 0;
  for (int s = 0; s < 40; ++s) {
    const uint64_t before = scaler.skipped_steps();
    d.train_step(x.data(), y.data(), 8, 0.1f, scaler);
    applied += scaler.skipped_steps() == before;
  }
  EXPECT_GT(applied, 0);
  EXPECT_LT(scaler.scale(), std::ldexp(1.0, 30));  // dlogits*scale < 65504 needs roughly scale < 2^19 here
  d.download(m, nullptr);
  EXPECT_NE(std::memcmp(w0[0].data(), m.parameters()[0].value, w0[0].size() * sizeof(float)), 0);
}

// dfp train --device cuda: the same loop, metrics and checkpoints; the checkpoint evaluates on the CPU.
TEST(Cuda, TrainerRunsOnTheGpu) {
  DFP_NEED_GPU();
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("dfp_test_cuda_" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  for (Precision p : {Precision::fp16, Precision::fp32}) {
    SCOPED_TRACE(precision_name(p));
    TrainConfig c;
    c.model = "lenet";
    c.device = "cuda";
    c.policy.precision = p;
    c.epochs = 2;
    c.batch_size = 64;
    c.lr = 0.05f;
    c.limit_train = 6400;
    c.limit_test = 2000;
    c.threads = 2;
    c.out = dir + "/" + precision_name(p);  // each precision its own run directory
    const auto metrics = train(c, nullptr);
    ASSERT_EQ(metrics.size(), 2u);
    EXPECT_GT(metrics.back().test_top1, 75.0);  // as the CPU smoke test (LeNet, 2 epochs, 6400 images)
    std::ifstream mf(c.out + "/metrics.jsonl");
    std::string line, all;
    int lines = 0;
    while (std::getline(mf, line)) {
      ++lines;
      all += line;
    }
    EXPECT_EQ(lines, 2);
    EXPECT_NE(all.find("device=cuda"), std::string::npos);
    // The checkpoint holds FP32 master weights: the CPU evaluates it (on the whole test split).
    const EvalResult r = evaluate_checkpoint(c.out + "/checkpoint.dfp", "", 2, nullptr);
    EXPECT_EQ(r.images, 10000);
    EXPECT_GT(r.top1, 70.0);
  }
  std::filesystem::remove_all(dir);
}
