// Training throughput (images/s) of one full step -- forward, loss, backward, SGD update with
// re-quantization/re-packing -- per model and precision, on a fixed random batch (like
// ../shared/peers/torch/train_bench.py, so the figures compare with PyTorch's in the same run).
// Counter "img_per_s"; label: model, precision, batch, input.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/models.hpp"
#include "dfp/optim.hpp"
#include "src/openmp_env.hpp"

namespace {

struct Config {
  const char* model;
  int batch, c, h, w, classes;
};

// FP16 runs with GradScaler's dynamic loss scale (as torch.amp users train), the others unscaled.
void train_step(benchmark::State& state, Config cfg, dfp::Precision precision, int threads) {
  dfp::ContextOptions o;
  o.threads = threads;
  dfp::Context ctx(o);
  dfp::Model m(ctx, cfg.model);
  dfp::build_model(m, cfg.model, cfg.c, cfg.h, cfg.w, cfg.classes);
  dfp::PrecisionPolicy p;
  p.precision = precision;
  m.build(cfg.batch, p);
  dfp::Sgd sgd(ctx, m, {0.9f, 5e-4f, false});
  if (precision == dfp::Precision::fp16) m.set_loss_scale(65536);
  std::vector<float> nchw(size_t(cfg.batch) * cfg.c * cfg.h * cfg.w);
  std::mt19937 g(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : nchw) v = nd(g);
  std::vector<float> x(dfp::blocked_size(cfg.batch, cfg.c, cfg.h, cfg.w));
  dfp::to_blocked(nchw.data(), x.data(), cfg.batch, cfg.c, cfg.h, cfg.w);
  std::vector<int32_t> y(cfg.batch);
  for (int i = 0; i < cfg.batch; ++i) y[i] = i % cfg.classes;
  for (int i = 0; i < 2; ++i) {  // warm-up
    m.forward(x.data(), y.data(), cfg.batch, true);
    m.backward();
    sgd.step(0.01f);
  }
  for (auto _ : state) {
    m.forward(x.data(), y.data(), cfg.batch, true);
    m.backward();
    sgd.step(0.01f);
  }
  state.counters["img_per_s"] = benchmark::Counter(double(cfg.batch), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(cfg.model) + " " + dfp::precision_name(precision) + " b" + std::to_string(cfg.batch) +
                 " " + std::to_string(cfg.c) + "x" + std::to_string(cfg.h) + "x" + std::to_string(cfg.w));
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
