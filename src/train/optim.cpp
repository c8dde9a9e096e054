// SGD with momentum / Nesterov / weight decay on FP32 master weights, and LR schedules.
#include "dfp/optim.hpp"

#include <algorithm>
#include <atomic>
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
  tensors_.resize(model.parameters().size());
  max_abs_.assign(model.parameters().size(), -1.f);
}

void sgd_update(const Context& ctx, std::span<const SgdTensor> tensors, float lr, float momentum, bool nesterov,
                std::span<float> max_abs) {
  DFP_CHECK(max_abs.size() == tensors.size(), Status::invalid_argument,
            "sgd_update: " + std::to_string(tensors.size()) + " tensors and " + std::to_string(max_abs.size()) +
                " max_abs entries; expected one each");
  // Pieces of up to kPiece values, so that one large tensor does not leave a thread idle. The
  // update is per value, so how a tensor is cut changes no bit; the maxima of a tensor's pieces
  // combine as the kernel's own do (NaN wins, then the largest).
  constexpr size_t kPiece = size_t(1) << 16;
  auto pieces_of = [](const SgdTensor& t) { return int64_t((t.size + kPiece - 1) / kPiece); };
  int64_t pieces = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    pieces += pieces_of(tensors[t]);
    max_abs[t] = 0.f;
  }
  const auto update = ctx.kernels().sgd_update.fn;
  ctx.parallel_for(pieces, [&](int64_t b, int64_t e) {
    size_t t = 0;
    int64_t first = 0;  // the index of tensor t's first piece
    while (first + pieces_of(tensors[t]) <= b) first += pieces_of(tensors[t++]);
    for (int64_t i = b; i < e; ++i) {
      while (i >= first + pieces_of(tensors[t])) first += pieces_of(tensors[t++]);
      const SgdTensor& x = tensors[t];
      const size_t begin = size_t(i - first) * kPiece, n = std::min(kPiece, x.size - begin);
      const float v = update(x.value + begin, x.grad + begin, x.velocity + begin, n,
                             simd::SgdArgs{lr, momentum, x.weight_decay, nesterov});
      std::atomic_ref<float> m(max_abs[t]);
      float old = m.load(std::memory_order_relaxed);
      while (!std::isnan(old) && (std::isnan(v) || v > old) && !m.compare_exchange_weak(old, v, std::memory_order_relaxed)) {
      }
    }
  });
}

void Sgd::step(float lr) {
  // Listed each step (into storage sized once): the velocities are handed out
  // (momentum_buffers(): a checkpoint's restore, the GPU's copy) and may have moved.
  const auto& params = model_.parameters();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Parameter& p = params[i];
    tensors_[i] = {p.value, p.grad, velocity_[i].data(), p.size, p.decay ? opt_.weight_decay : 0.f};
  }
  sgd_update(ctx_, tensors_, lr, opt_.momentum, opt_.nesterov, max_abs_);
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
