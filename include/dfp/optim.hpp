// dfp: SGD on FP32 master weights, and learning-rate schedules.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "dfp/model.hpp"

namespace dfp {

struct SgdOptions {
  float momentum = 0.9f;
  float weight_decay = 5e-4f;
  bool nesterov = false;
};

// One SGD step over tensors the caller owns (what Sgd::step and dfp.torch.optim.SGD run): per
// tensor g' = g + weight_decay*w; v = momentum*v + g'; w -= lr * (nesterov ? g' + momentum*v : v),
// in one pass on the context's threads (large tensors split among them). A velocity of zeros is
// torch's first step (its buffer then equals g'). Writes max|w| of each tensor after the update
// into max_abs (NaN if any value is NaN, inf if any is infinite), for
// Model::weights_updated(max_abs). Allocates nothing; throws if the sizes of tensors and max_abs differ.
struct SgdTensor {
  float* value;
  const float* grad;
  float* velocity;
  size_t size;
  float weight_decay;
};
void sgd_update(const Context& ctx, std::span<const SgdTensor> tensors, float lr, float momentum, bool nesterov,
                std::span<float> max_abs);

// torch.optim.SGD semantics: g' = g + wd*w; v = momentum*v + g'; w -= lr * (nesterov ? g' + momentum*v : v).
class Sgd {
 public:
  Sgd(const Context& ctx, Model& model, const SgdOptions& options);
  // Updates every parameter, then has the model re-quantize/re-pack its weights (once per step).
  void step(float lr);
  std::vector<std::vector<float>>& momentum_buffers() { return velocity_; }

 private:
  const Context& ctx_;
  Model& model_;
  SgdOptions opt_;
  std::vector<std::vector<float>> velocity_;
  std::vector<SgdTensor> tensors_;  // step()'s list for sgd_update (sized once: a step allocates nothing)
  std::vector<float> max_abs_;  // max|w| of each parameter from the last update pass, for the model
};

enum class ScheduleKind { constant, step, multistep, cosine };
ScheduleKind parse_schedule(const std::string& text, const std::string& origin);
const char* schedule_name(ScheduleKind k) noexcept;

// Learning rate as a function of the global step. Warm-up ramps linearly from base/warmup to base
// over `warmup_steps`, then the schedule runs over the remaining steps:
//   step:      base * gamma^floor(epoch / step_epochs)
//   multistep: base * gamma^(number of milestones passed)
//   cosine:    base * (1 + cos(pi * t)) / 2, t from 0 to 1 over the post-warm-up steps
struct LrSchedule {
  ScheduleKind kind = ScheduleKind::cosine;
  float base = 0.1f;
  int steps_per_epoch = 1;
  int total_steps = 1;
  int warmup_steps = 0;
  float gamma = 0.1f;
  int step_epochs = 30;
  std::vector<int> milestones;  // epochs
  float at(int step) const;
};

}  // namespace dfp
