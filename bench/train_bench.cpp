// Training throughput (images/s) of one full step -- forward, loss, backward, SGD update with
// re-quantization/re-packing -- per model and precision, on a fixed random batch (like
// ../shared/peers/torch/train_bench.py, so the figures compare with PyTorch's in the same run).
// Counter "img_per_s"; label: model, precision, batch, input.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/conv_layers.hpp"
#include "bench/kind_table.hpp"
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
// int16_over_fp32, their ratio (fp8_over_fp32 for fp8:fp32 and so on; slice_over_tensor for
// granularities).
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
  // `what` is "b:a" (int16:fp32, fp8:fp32, slice:tensor): the counters are named after both.
  const size_t colon = what.find(':');
  const std::string b_name = what.substr(0, colon), a_name = what.substr(colon + 1);
  const bool granularity = a_name == "tensor";
  state.counters[a_name + "_img_per_s"] = images / t_fp32;
  state.counters[(granularity ? std::string("slice") : b_name) + "_img_per_s"] = images / t_int16;
  state.counters[(granularity ? std::string("slice") : b_name) + "_over_" + a_name] = t_fp32 / t_int16;
  state.SetLabel(std::string(cfg.model) + " " + what + " b" + std::to_string(cfg.batch) + " " + std::to_string(cfg.c) +
                 "x" + std::to_string(cfg.h) + "x" + std::to_string(cfg.w) + ", blocks of " +
                 std::to_string(kRatioBlock) + " steps");
}

// --kinds=MODEL_CxH (e.g. resnet18c_3x32): the step's time by layer kind, FP32 and INT16 side by
// side (bench/kind_table.hpp), over rounds of kRatioBlock steps of each in turn on 2 threads (or
// --threads=N: run with 1 beside 2, it shows which kinds scale with the threads), with the layers'
// profiling on (two clock reads per layer and pass); with --layers, then a row per convolution
// (bench/conv_layers.hpp).
int kind_table(const Config& cfg, int rounds, bool layers, int threads) {
  using clock = std::chrono::steady_clock;
  dfp::ContextOptions o;
  o.threads = threads;
  dfp::Context ctx(o);
  const dfp::bench::TrainBatch batch(cfg);
  struct Column {
    dfp::Precision precision;
    std::unique_ptr<dfp::bench::TrainRun> run;
    double optimizer_s = 0, step_s = 0;
  };
  std::vector<Column> cols;
  for (dfp::Precision p : {dfp::Precision::fp32, dfp::Precision::int16}) {
    cols.push_back({p, std::make_unique<dfp::bench::TrainRun>(ctx, cfg, p)});
    for (int i = 0; i < 2; ++i) cols.back().run->step(batch, cfg.batch);  // warm-up
    cols.back().run->model.set_profiling(true);
    cols.back().run->model.reset_layer_times();
  }
  // Each round's ratio too: the host's speed drifts between rounds, and a slow stretch that
  // falls on one precision's block moves the total more than the median of the rounds.
  std::vector<double> round_ratio;
  for (int r = 0; r < rounds; ++r) {
    double block_s[2] = {0, 0};
    for (size_t ci = 0; ci < cols.size(); ++ci) {
      Column& c = cols[ci];
      for (int i = 0; i < kRatioBlock; ++i) {
        const auto t0 = clock::now();
        c.run->model.forward(batch.x.data(), batch.y.data(), cfg.batch, true);
        c.run->model.backward();
        const auto t1 = clock::now();
        c.run->sgd.step(0.01f);
        const auto t2 = clock::now();
        c.optimizer_s += std::chrono::duration<double>(t2 - t1).count();
        c.step_s += std::chrono::duration<double>(t2 - t0).count();
        block_s[ci] += std::chrono::duration<double>(t2 - t0).count();
      }
    }
    round_ratio.push_back(block_s[0] / block_s[1]);
  }
  const double steps = double(rounds) * kRatioBlock;
  std::printf("%s b%d %dx%dx%d, %d threads, isa %s: %d rounds of %d steps per precision\n", cfg.model, cfg.batch, cfg.c,
              cfg.h, cfg.w, threads, dfp::isa_name(ctx.isa()), rounds, kRatioBlock);
  std::vector<dfp::bench::KindColumn> table;
  for (const Column& c : cols) {
    std::printf("  %-6s %8.1f ms per step, %7.1f images/s\n", dfp::precision_name(c.precision), c.step_s / steps * 1e3,
                cfg.batch / (c.step_s / steps));
    table.push_back({dfp::precision_name(c.precision), c.run->model.layer_times(), c.optimizer_s / steps * 1e3});
  }
  std::printf("  int16 over fp32: %.3fx (rounds:", cols[0].step_s / cols[1].step_s);
  for (double q : round_ratio) std::printf(" %.3f", q);
  std::vector<double> sorted = round_ratio;
  std::sort(sorted.begin(), sorted.end());
  const size_t m = sorted.size();
  std::printf("; median %.3f)\n", m % 2 ? sorted[m / 2] : (sorted[m / 2 - 1] + sorted[m / 2]) / 2);
  dfp::bench::print_kind_table(table);
  if (!layers) return 0;
  std::map<std::string, dfp::LayerTime> fp32, int16;
  for (const dfp::LayerTime& t : table[0].times) fp32[t.layer] = t;
  for (const dfp::LayerTime& t : table[1].times) int16[t.layer] = t;
  const std::vector<dfp::bench::ConvRow> rows = dfp::bench::convolutions(cols[1].run->model, cfg.batch);
  dfp::bench::print_conv_layer_header();
  for (size_t i = 0; i < rows.size(); ++i)
    dfp::bench::print_conv_layer_row(rows[i], int16.at(rows[i].name), fp32.at(rows[i].name), i == 0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<Config> configs = {
      {"resnet20", 128, 3, 32, 32, 10},
      {"resnet20", 128, 1, 28, 28, 10},
      {"resnet18c", 64, 3, 32, 32, 10},
      {"vgg11bn", 64, 3, 32, 32, 10},
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--kinds=", 0) != 0) continue;
    int rounds = 3, threads = 2;
    bool layers = false;
    for (int j = 1; j < argc; ++j) {
      if (std::string(argv[j]).rfind("--rounds=", 0) == 0) rounds = std::max(1, std::atoi(argv[j] + 9));
      if (std::string(argv[j]).rfind("--threads=", 0) == 0) threads = std::max(1, std::atoi(argv[j] + 10));
      layers |= std::string(argv[j]) == "--layers";
    }
    for (const Config& c : configs)
      if (a.substr(8) == std::string(c.model) + "_" + std::to_string(c.c) + "x" + std::to_string(c.h))
        return kind_table(c, rounds, layers, threads);
    std::fprintf(stderr, "train_bench: --kinds=%s: expected one of resnet20_3x32, resnet20_1x28, resnet18c_3x32, "
                 "vgg11bn_3x32\n", a.substr(8).c_str());
    return 2;
  }
  for (const Config& c : configs)
    for (dfp::Precision p : {dfp::Precision::fp32, dfp::Precision::int16, dfp::Precision::bf16, dfp::Precision::fp16,
                              dfp::Precision::fp8, dfp::Precision::mxfp8})
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
  // The emulated formats' steps against FP32's (issue 48's speed target: each <= 1.5x FP32's step).
  ratio("train_ratio", configs[0], fp32, TrainRun::policy(dfp::Precision::fp8), "fp8:fp32");
  for (dfp::Precision p : {dfp::Precision::mxfp8, dfp::Precision::mxfp4, dfp::Precision::posit16})
    ratio("train_ratio", configs[0], fp32, TrainRun::policy(p), std::string(dfp::precision_name(p)) + ":fp32");
  // Block DFP (int16 with exponents per block of 32 along each pass's reduction; emulated).
  dfp::PrecisionPolicy block32 = int16;
  for (dfp::QuantOptions* q : {&block32.dfp.weights, &block32.dfp.activations, &block32.dfp.gradients})
    q->granularity = dfp::Granularity::block32;
  ratio("train_ratio", configs[0], fp32, block32, "int16_block32:fp32");
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
