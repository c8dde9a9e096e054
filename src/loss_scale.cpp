// The loss-scaling state machine (see include/dfp/loss_scale.hpp).
#include "dfp/loss_scale.hpp"

#include <cmath>
#include <sstream>

#include "dfp/status.hpp"

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
  if (text == "none") return LossScaleMode::none;
  if (text == "static") return LossScaleMode::fixed;
  if (text == "dynamic") return LossScaleMode::dynamic;
  if (text == "adaptive") return LossScaleMode::adaptive;
  fail(Status::invalid_argument,
       origin + ": unknown loss scaling '" + text + "'; expected none, static, dynamic or adaptive");
}

std::string LossScaleOptions::describe() const {
  std::ostringstream o;
  o << "loss_scale=" << loss_scale_mode_name(mode);
  if (mode == LossScaleMode::fixed) o << "(" << init_scale << ")";
  if (mode == LossScaleMode::dynamic || mode == LossScaleMode::adaptive)
    o << "(init=" << init_scale << ",growth=" << growth_factor << ",backoff=" << backoff_factor
      << ",interval=" << growth_interval << ")";
  return o.str();
}

LossScaler::LossScaler(const LossScaleOptions& o) : options_(o) {
  const bool scaled = o.mode != LossScaleMode::none;
  DFP_CHECK(!scaled || (std::isfinite(o.init_scale) && o.init_scale > 0), Status::invalid_argument,
            "loss scale: expected a positive finite initial scale, got " + std::to_string(o.init_scale));
  DFP_CHECK(o.growth_factor >= 1 && o.backoff_factor > 0 && o.backoff_factor <= 1 && o.growth_interval >= 1,
            Status::invalid_argument,
            "loss scale: expected growth_factor >= 1, 0 < backoff_factor <= 1 and growth_interval >= 1");
  scale_ = scaled ? o.init_scale : 1.0;
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

}  // namespace dfp
