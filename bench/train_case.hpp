// One training case of the whole-step benchmarks (train_bench, memory_bench): a model at an input
// size and batch, a fixed random batch (as ../shared/peers/torch/train_bench.py uses), and the
// step -- forward, loss, backward, SGD with re-quantization/re-packing.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/models.hpp"
#include "dfp/optim.hpp"

namespace dfp::bench {

struct TrainCase {
  const char* model;
  int batch, c, h, w, classes;
};

// The batch, made before the model so that a memory measurement can leave it out.
struct TrainBatch {
  std::vector<float> x;  // blocked layout
  std::vector<int32_t> y;
  explicit TrainBatch(const TrainCase& cfg) : x(blocked_size(cfg.batch, cfg.c, cfg.h, cfg.w)), y(cfg.batch) {
    std::vector<float> nchw(size_t(cfg.batch) * cfg.c * cfg.h * cfg.w);
    std::mt19937 g(1);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& v : nchw) v = nd(g);
    to_blocked(nchw.data(), x.data(), cfg.batch, cfg.c, cfg.h, cfg.w);
    for (int i = 0; i < cfg.batch; ++i) y[i] = i % cfg.classes;
  }
};

// FP16 runs with GradScaler's initial loss scale (as torch.amp users train), the others unscaled.
struct TrainRun {
  Model model;
  Sgd sgd;
  TrainRun(const Context& ctx, const TrainCase& cfg, Precision precision) : TrainRun(ctx, cfg, policy(precision)) {}
  TrainRun(const Context& ctx, const TrainCase& cfg, const PrecisionPolicy& p)
      : model(ctx, cfg.model), sgd(ctx, built(model, cfg, p), {0.9f, 5e-4f, false}) {
    if (p.precision == Precision::fp16) model.set_loss_scale(65536);
  }
  static PrecisionPolicy policy(Precision precision) {
    PrecisionPolicy p;
    p.precision = precision;
    return p;
  }
  void step(const TrainBatch& b, int batch) {
    model.forward(b.x.data(), b.y.data(), batch, true);
    model.backward();
    sgd.step(0.01f);
  }

 private:
  static Model& built(Model& m, const TrainCase& cfg, const PrecisionPolicy& p) {
    build_model(m, cfg.model, cfg.c, cfg.h, cfg.w, cfg.classes);
    m.build(cfg.batch, p);
    return m;
  }
};

inline std::string case_label(const TrainCase& cfg, Precision p) {
  return std::string(cfg.model) + " " + precision_name(p) + " b" + std::to_string(cfg.batch) + " " +
         std::to_string(cfg.c) + "x" + std::to_string(cfg.h) + "x" + std::to_string(cfg.w);
}

}  // namespace dfp::bench
