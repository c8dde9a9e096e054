// The loss-scaling state machine (see include/dfp/loss_scale.hpp).
#include "dfp/loss_scale.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "dfp/status.hpp"
#include "src/named_enum.hpp"

namespace dfp {

const char* loss_scale_mode_name(LossScaleMode m) noexcept {
  switch (m) {
    case LossScaleMode::none: return "none";
    case LossScaleMode::fixed: return "static";
    case LossScaleMode::dynamic: return "dynamic";
    case LossScaleMode::adaptive: return "adaptive";
  }
  return "?";
}

LossScaleMode parse_loss_scale_mode(const std::string& text, const std::string& origin) {
  return parse_named(text, {LossScaleMode::none, LossScaleMode::fixed, LossScaleMode::dynamic, LossScaleMode::adaptive},
                     loss_scale_mode_name, origin, "loss scaling");
}

double LossScaleOptions::initial_scale() const noexcept {
  return init_scale.value_or(mode == LossScaleMode::adaptive ? 1.0 : 65536.0);
}

std::string LossScaleOptions::describe() const {
  std::ostringstream o;
  o << "loss_scale=" << loss_scale_mode_name(mode);
  if (mode == LossScaleMode::fixed) o << "(" << initial_scale() << ")";
  if (mode == LossScaleMode::dynamic || mode == LossScaleMode::adaptive)
    o << "(init=" << initial_scale() << ",growth=" << growth_factor << ",backoff=" << backoff_factor
      << ",interval=" << growth_interval << ")";
  return o.str();
}

LossScaler::LossScaler(const LossScaleOptions& o) : options_(o) {
  const bool scaled = o.mode != LossScaleMode::none;
  DFP_CHECK(!scaled || (std::isfinite(o.initial_scale()) && o.initial_scale() > 0), Status::invalid_argument,
            "LossScaleOptions.init_scale (flag --loss-scale): expected a positive finite scale, got " +
                std::to_string(o.initial_scale()));
  DFP_CHECK(o.growth_interval >= 1, Status::invalid_argument,
            "LossScaleOptions.growth_interval (flag --scale-growth-interval): expected >= 1, got " +
                std::to_string(o.growth_interval));
  DFP_CHECK(o.growth_factor >= 1 && o.backoff_factor > 0 && o.backoff_factor <= 1, Status::invalid_argument,
            "LossScaleOptions: expected growth_factor >= 1 and 0 < backoff_factor <= 1, got " +
                std::to_string(o.growth_factor) + " and " + std::to_string(o.backoff_factor));
  scale_ = scaled ? o.initial_scale() : 1.0;
}

bool LossScaler::update(bool finite) {
  const bool moving = options_.mode == LossScaleMode::dynamic || options_.mode == LossScaleMode::adaptive;
  if (!finite) {
    ++skipped_;
    if (moving) {
      scale_ *= options_.backoff_factor;
      tracker_ = 0;
    }
    return false;
  }
  if (moving && ++tracker_ >= options_.growth_interval) {
    scale_ *= options_.growth_factor;
    tracker_ = 0;
  }
  return true;
}

void LossScaler::restore(double scale, int tracker, uint64_t skipped) {
  scale_ = scale;
  tracker_ = tracker;
  skipped_ = skipped;
}

double adaptive_layer_factor(const AdaptiveInputs& in, FloatFormat f, double max_factor, double max_scale) noexcept {
  double u_min, u_max;
  if (f == FloatFormat::fp16) { u_min = 6e-8; u_max = 6e4; }
  else if (f == FloatFormat::bf16) { u_min = 9.2e-41; u_max = 3.3e38; }
  else return 1;
  const double sigma_o = std::sqrt(in.g_mean_sq * in.w_mean_sq) * std::sqrt(0.5 * in.fan_in);
  if (!(sigma_o > 0) || !std::isfinite(sigma_o)) return 1;
  const double T = 1.2533469508069276e-3;  // sqrt(2) * erfinv(1e-3)
  double alpha = std::max(u_min / (T * sigma_o), 1.0);
  const double o_max = in.g_max_abs * in.w_max_abs;
  if (o_max > 0) alpha = std::min(alpha, (u_max / in.fan_in) / o_max);
  alpha = std::min({alpha, max_scale / in.scale_so_far, max_factor});
  if (!(alpha > 0)) return 1;
  return std::exp2(std::floor(std::log2(alpha)));
}

}  // namespace dfp
