// Training throughput (images/s) of one full step -- forward, loss, backward, SGD update with
// re-quantization/re-packing -- per model and precision, on a fixed random batch (like
// ../shared/peers/torch/train_bench.py, so the figures compare with PyTorch's in the same run).
// Counter "img_per_s"; label: model, precision, batch, input.
#include <benchmark/benchmark.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "bench/train_case.hpp"
#include "dfp/context.hpp"

namespace {

using Config = dfp::bench::TrainCase;

void train_step(benchmark::State& state, Config cfg, dfp::Precision precision, int threads) {
  dfp::ContextOptions o;
  o.threads = threads;
  dfp::Context ctx(o);
  const dfp::bench::TrainBatch batch(cfg);
  dfp::bench::TrainRun run(ctx, cfg, precision);
  for (int i = 0; i < 2; ++i) run.step(batch, cfg.batch);  // warm-up
  for (auto _ : state) run.step(batch, cfg.batch);
  state.counters["img_per_s"] = benchmark::Counter(double(cfg.batch), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(dfp::bench::case_label(cfg, precision));
}

// INT16 against FP32 in alternating blocks of kRatioBlock steps (one block of each per iteration,
// timed apart): both see the same machine state, so their ratio holds on a shared machine whose
// speed drifts between separate measurements (docs/performance.md).
// Blocks rather than single steps: training runs consecutive steps of one precision, and a step
// of the other precision in between evicts what the next step would find in L3 (32 MiB here;
// the INT16 arena of ResNet-20 is 24 MiB). Counters: each precision's images/s and
// int16_over_fp32, their ratio.
constexpr int kRatioBlock = 8;
// The same for two policies a (the baseline, "fp32") and b ("int16"): INT16 with exponents per
// slice against one per tensor (train_granularity).
void train_ratio(benchmark::State& state, Config cfg, int threads, const dfp::PrecisionPolicy& a,
                 const dfp::PrecisionPolicy& b, const std::string& what) {
  using clock = std::chrono::steady_clock;
  dfp::ContextOptions o;
  o.threads = threads;
  dfp::Context ctx(o);
  const dfp::bench::TrainBatch batch(cfg);
  dfp::bench::TrainRun fp32(ctx, cfg, a), int16(ctx, cfg, b);
  for (int i = 0; i < 2; ++i) {
    fp32.step(batch, cfg.batch);
    int16.step(batch, cfg.batch);
  }
  double t_fp32 = 0, t_int16 = 0;
  for (auto _ : state) {
    const auto t0 = clock::now();
    for (int i = 0; i < kRatioBlock; ++i) fp32.step(batch, cfg.batch);
    const auto t1 = clock::now();
    for (int i = 0; i < kRatioBlock; ++i) int16.step(batch, cfg.batch);
    const auto t2 = clock::now();
    t_fp32 += std::chrono::duration<double>(t1 - t0).count();
    t_int16 += std::chrono::duration<double>(t2 - t1).count();
  }
  const double images = double(state.iterations()) * kRatioBlock * cfg.batch;
  const bool granularity = what.find(":tensor") != std::string::npos;
  state.counters[granularity ? "tensor_img_per_s" : "fp32_img_per_s"] = images / t_fp32;
  state.counters[granularity ? "slice_img_per_s" : "int16_img_per_s"] = images / t_int16;
  state.counters[granularity ? "slice_over_tensor" : "int16_over_fp32"] = t_fp32 / t_int16;
  state.SetLabel(std::string(cfg.model) + " " + what + " b" + std::to_string(cfg.batch) + " " + std::to_string(cfg.c) +
                 "x" + std::to_string(cfg.h) + "x" + std::to_string(cfg.w) + ", blocks of " +
                 std::to_string(kRatioBlock) + " steps");
}

}  // namespace

int main(int argc, char** argv) {
  dfp::reexec_with_passive_openmp(argv);  // as the dfp program does (include/dfp/context.hpp)
  const std::vector<Config> configs = {
      {"resnet20", 128, 3, 32, 32, 10},
      {"resnet20", 128, 1, 28, 28, 10},
      {"resnet18c", 64, 3, 32, 32, 10},
      {"vgg11bn", 64, 3, 32, 32, 10},
  };
  for (const Config& c : configs)
    for (dfp::Precision p : {dfp::Precision::fp32, dfp::Precision::int16, dfp::Precision::bf16, dfp::Precision::fp16})
      for (int t : {1, 2})
        benchmark::RegisterBenchmark(("train/" + std::string(c.model) + "_" + std::to_string(c.c) + "x" +
                                      std::to_string(c.h) + "/" + dfp::precision_name(p) + "/threads:" + std::to_string(t))
                                         .c_str(),
                                     train_step, c, p, t)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime()
            ->MinTime(2.0);
  using dfp::bench::TrainRun;
  const dfp::PrecisionPolicy fp32 = TrainRun::policy(dfp::Precision::fp32), int16 = TrainRun::policy(dfp::Precision::int16);
  // Exponents per slice for the classes named: w, x, dy.
  auto sliced = [&](bool w, bool x, bool dy) {
    dfp::PrecisionPolicy p = int16;
    if (w) p.dfp.weights.granularity = dfp::Granularity::slice;
    if (x) p.dfp.activations.granularity = dfp::Granularity::slice;
    if (dy) p.dfp.gradients.granularity = dfp::Granularity::slice;
    return p;
  };
  auto ratio = [](const std::string& name, const Config& c, const dfp::PrecisionPolicy& a,
                  const dfp::PrecisionPolicy& b, const std::string& what) {
    benchmark::RegisterBenchmark((name + "/" + std::string(c.model) + "_" + std::to_string(c.c) + "x" +
                                  std::to_string(c.h) + "/" + what + "/threads:2")
                                     .c_str(),
                                 train_ratio, c, 2, a, b, what)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->MinTime(16.0);
  };
  for (const Config& c : {configs[0], configs[2]}) ratio("train_ratio", c, fp32, int16, "int16:fp32");
  // INT16 with exponents per slice against one per tensor (Granularity).
  for (const Config& c : {configs[1], configs[0]}) {
    ratio("train_granularity", c, int16, sliced(true, true, true), "slice:tensor");
    ratio("train_granularity", c, int16, sliced(true, false, true), "w+dy_slice:tensor");
    ratio("train_granularity", c, int16, sliced(true, false, false), "w_slice:tensor");
    // Every class per slice with headroom 1 (14 magnitude bits: what activation SQNR at FP16's
    // level takes), against today's default.
    dfp::PrecisionPolicy h1 = sliced(true, true, true);
    h1.dfp.weights.headroom = h1.dfp.activations.headroom = h1.dfp.gradients.headroom = 1;
    ratio("train_granularity", c, int16, h1, "slice_headroom1:tensor");
    // The same with the weights at headroom 2, which meet their SQNR target there (FP16's): the
    // pixel passes' chains, bounded by x or dy times the weights, halve once instead of twice.
    dfp::PrecisionPolicy h1w2 = h1;
    h1w2.dfp.weights.headroom = 2;
    ratio("train_granularity", c, int16, h1w2, "slice_headroom1_weights2:tensor");
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
