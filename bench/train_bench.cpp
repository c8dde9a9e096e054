// Training throughput (images/s) of one full step -- forward, loss, backward, SGD update with
// re-quantization/re-packing -- per model and precision, on a fixed random batch (like
// ../shared/peers/torch/train_bench.py, so the figures compare with PyTorch's in the same run).
// Counter "img_per_s"; label: model, precision, batch, input.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "bench/train_case.hpp"
#include "src/openmp_env.hpp"

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

}  // namespace

int main(int argc, char** argv) {
  dfp::reexec_with_passive_openmp(argv);  // as the dfp program does (src/openmp_env.hpp)
  const std::vector<Config> configs = {
      {"resnet20", 128, 3, 32, 32, 10},
      {"resnet20", 128, 1, 28, 28, 10},
      {"resnet18c", 64, 3, 32, 32, 10},
      {"vgg11bn", 64, 3, 32, 32, 10},
  };
  for (const Config& c : configs)
    for (dfp::Precision p : {dfp::Precision::fp32, dfp::Precision::int16, dfp::Precision::bf16, dfp::Precision::fp16})
      for (int t : {2})
        benchmark::RegisterBenchmark(("train/" + std::string(c.model) + "_" + std::to_string(c.c) + "x" +
                                      std::to_string(c.h) + "/" + dfp::precision_name(p) + "/threads:" + std::to_string(t))
                                         .c_str(),
                                     train_step, c, p, t)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime()
            ->MinTime(2.0);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
