// dfp: loss scaling for reduced-precision gradients (FP16, BF16), with PyTorch GradScaler
// semantics. Every device (CPU, CUDA) runs this one state machine; the device only reports
// whether the unscaled gradients of a step were all finite.
//
// Modes:
//   none     scale 1. A step whose gradients are not finite is still skipped (and counted), so
//            a non-finite gradient never reaches the master weights.
//   static   a fixed scale S (--loss-scale S); non-finite steps are skipped.
//   dynamic  torch.amp.GradScaler: start at init_scale (2^16); a non-finite step is skipped and
//            the scale multiplied by backoff_factor (0.5); after growth_interval (2000)
//            consecutive finite steps it is multiplied by growth_factor (2).
//   adaptive layer-wise scaling (Zhao, Vogel, Ahmed 2019): the loss gradient starts at
//            init_scale (1 unless set) and every Conv/Linear backward multiplies the
//            gradient it passes on by its own power-of-two factor, derived from the statistics of
//            its incoming gradient and weights; parameter gradients are divided by the scale
//            their layer saw. Non-finite steps are skipped and the initial scale backs off as in
//            dynamic mode.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "dfp/float16.hpp"

namespace dfp {

enum class LossScaleMode { none, fixed, dynamic, adaptive };
const char* loss_scale_mode_name(LossScaleMode m) noexcept;
// "none", "static", "dynamic", "adaptive"; throws naming `origin` otherwise.
LossScaleMode parse_loss_scale_mode(const std::string& text, const std::string& origin);

struct LossScaleOptions {
  LossScaleMode mode = LossScaleMode::none;
  // static: the scale; dynamic and adaptive: the first scale. Unset: the mode's default, 2^16
  // (GradScaler's) for static and dynamic, 1 for adaptive (its per-layer factors do the work).
  std::optional<double> init_scale;
  double initial_scale() const noexcept;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int growth_interval = 2000;
  // Adaptive mode (Zhao et al.): bounds on each layer's factor and on the accumulated scale.
  double adaptive_max_factor = 16.0;
  double adaptive_max_scale = 1024.0;
  std::string describe() const;
  // Throws dfp::Error(invalid_argument) naming `origin` and the field out of range.
  void validate(const std::string& origin) const;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScaleOptions& options = {});

  // The factor the loss gradient is multiplied by in the next backward pass.
  double scale() const noexcept { return scale_; }
  // Call once per training step, after backward, with whether every unscaled gradient was
  // finite. Returns true when the optimizer should apply the step, false when it is skipped.
  bool update(bool grads_finite);

  const LossScaleOptions& options() const noexcept { return options_; }
  uint64_t skipped_steps() const noexcept { return skipped_; }
  int growth_tracker() const noexcept { return tracker_; }
  // Checkpointed state, restored by resume so that a resumed run is bit-identical.
  void restore(double scale, int tracker, uint64_t skipped);

 private:
  LossScaleOptions options_;
  double scale_ = 1.0;
  int tracker_ = 0;
  uint64_t skipped_ = 0;
};

// Adaptive loss scaling: the factor one layer applies to the gradient it receives (Zhao, Vogel,
// Ahmed 2019, method "approx_range"):
//   sigma_o  = sqrt(E[g^2] E[w^2]) * sqrt(0.5 fan_in)        (expected |dx|; 0.5 assumes ReLU)
//   alpha_lo = u_min / (T sigma_o),  T = sqrt(2) erfinv(1e-3) (0.1% of values may underflow)
//   alpha    = max(alpha_lo, 1), then min(alpha, (u_max / fan_in) / (max|g| max|w|))
//   alpha    = min(alpha, max_scale / scale_so_far, max_factor), rounded down to a power of two.
// u_min/u_max: fp16 6e-8 / 6e4; bf16 9.2e-41 / 3.3e38; other formats: 1 (no scaling).
struct AdaptiveInputs {
  double g_mean_sq = 0;   // E[g^2] over the incoming gradient
  double w_mean_sq = 0;   // E[w^2] over the layer's weights
  double g_max_abs = 0, w_max_abs = 0;
  double fan_in = 1;      // C*R*S of the layer
  double scale_so_far = 1;  // product of the factors applied downstream
};
double adaptive_layer_factor(const AdaptiveInputs& in, FloatFormat gradient_format, double max_factor,
                             double max_scale) noexcept;

}  // namespace dfp
