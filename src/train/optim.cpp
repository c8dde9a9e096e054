// SGD with momentum / Nesterov / weight decay on FP32 master weights, and LR schedules.
#include "dfp/optim.hpp"

#include <cmath>
#include <numbers>

#include "dfp/context.hpp"
#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"
#include "base/named_enum.hpp"

namespace dfp {

Sgd::Sgd(const Context& ctx, Model& model, const SgdOptions& o) : ctx_(ctx), model_(model), opt_(o) {
  DFP_CHECK(model.built(), Status::invalid_argument, "Sgd: model '" + model.name() + "' is not built");
  DFP_CHECK(o.momentum >= 0.f && o.weight_decay >= 0.f, Status::invalid_argument,
            "Sgd: momentum and weight decay must be >= 0");
  for (const Parameter& p : model.parameters()) velocity_.emplace_back(p.size, 0.f);
  max_abs_.assign(model.parameters().size(), -1.f);
}

void Sgd::step(float lr) {
  auto& params = model_.parameters();
  const auto update = ctx_.kernels().sgd_update.fn;
  ctx_.parallel_for(int64_t(params.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      Parameter& p = params[i];
      const simd::SgdArgs a{lr, opt_.momentum, p.decay ? opt_.weight_decay : 0.f, opt_.nesterov};
      max_abs_[size_t(i)] = update(p.value, p.grad, velocity_[i].data(), p.size, a);
    }
  });
  model_.weights_updated(max_abs_);
}

ScheduleKind parse_schedule(const std::string& t, const std::string& origin) {
  return parse_named(t, {ScheduleKind::constant, ScheduleKind::step, ScheduleKind::multistep, ScheduleKind::cosine},
                     schedule_name, origin, "schedule");
}

const char* schedule_name(ScheduleKind k) noexcept {
  switch (k) {
    case ScheduleKind::constant: return "constant";
    case ScheduleKind::step: return "step";
    case ScheduleKind::multistep: return "multistep";
    case ScheduleKind::cosine: return "cosine";
  }
  return "?";
}

float LrSchedule::at(int step) const {
  if (step < warmup_steps) return base * float(step + 1) / float(warmup_steps);
  const int epoch = step / std::max(1, steps_per_epoch);
  switch (kind) {
    case ScheduleKind::constant: return base;
    case ScheduleKind::step: return base * std::pow(gamma, float(epoch / std::max(1, step_epochs)));
    case ScheduleKind::multistep: {
      int passed = 0;
      for (int m : milestones) passed += epoch >= m;
      return base * std::pow(gamma, float(passed));
    }
    case ScheduleKind::cosine: {
      const int span = std::max(1, total_steps - warmup_steps);
      const double t = std::min(1.0, double(step - warmup_steps) / span);
      return static_cast<float>(base * 0.5 * (1.0 + std::cos(std::numbers::pi * t)));
    }
  }
  return base;
}

}  // namespace dfp
