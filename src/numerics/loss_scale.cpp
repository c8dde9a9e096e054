// The loss-scaling state machine (see include/dfp/loss_scale.hpp).
#include "dfp/loss_scale.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "dfp/float8.hpp"
#include "dfp/status.hpp"
#include "base/named_enum.hpp"

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

void LossScaleOptions::validate(const std::string& origin) const {
  const bool scaled = mode != LossScaleMode::none;
  DFP_CHECK(!scaled || (std::isfinite(initial_scale()) && initial_scale() > 0), Status::invalid_argument,
            origin + ": init_scale expected a positive finite scale, got " + std::to_string(initial_scale()));
  DFP_CHECK(growth_interval >= 1, Status::invalid_argument,
            origin + ": growth_interval expected >= 1, got " + std::to_string(growth_interval));
  DFP_CHECK(growth_factor >= 1 && backoff_factor > 0 && backoff_factor <= 1, Status::invalid_argument,
            origin + ": expected growth_factor >= 1 and 0 < backoff_factor <= 1, got " + std::to_string(growth_factor) +
                " and " + std::to_string(backoff_factor));
}

LossScaler::LossScaler(const LossScaleOptions& o) : options_(o) {
  o.validate("LossScaleOptions");
  scale_ = o.mode != LossScaleMode::none ? o.initial_scale() : 1.0;
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
  else if (const Float8Info* i = float8_info(f)) {  // unscaled FP8 (fp8 scaling none)
    u_min = std::ldexp(1.0, i->min_exponent() - i->mantissa_bits);
    u_max = i->max_finite;
  } else return 1;
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
