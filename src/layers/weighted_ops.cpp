// The four operations of a weighted layer (weighted_ops.hpp): int16, native bf16, rounded float,
// fp32.
#include "src/layers/weighted_ops.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>

#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"
#include "src/core/aligned_buffer.hpp"
#include "src/core/atomic_max.hpp"
#include "src/layers/layer_helpers.hpp"

namespace dfp::model {

void report_sample(const SampledNumerics& s, LayerNumerics& n) {
  n.sampled = s.sampled;
  if (!s.sampled) return;
  n.sqnr_x_db = s.x.sqnr_db();
  n.sqnr_w_db = s.w.sqnr_db();
  n.sqnr_dy_db = s.dy.sqnr_db();
  n.overflow = s.x.overflow + s.w.overflow + s.dy.overflow;
  n.underflow = s.x.underflow + s.w.underflow + s.dy.underflow;
  n.nonzero = s.x.nonzero + s.w.nonzero + s.dy.nonzero;
  n.underflow_x = s.x.underflow; n.underflow_w = s.w.underflow; n.underflow_dy = s.dy.underflow;
  n.nonzero_x = s.x.nonzero; n.nonzero_w = s.w.nonzero; n.nonzero_dy = s.dy.nonzero;
}

void report_numerics(const ConvStats& s, const std::string& name, LayerNumerics& n) {
  n.layer = name;
  n.format = "int16";
  n.exp_x = s.x.exponent; n.exp_w = s.w.exponent; n.exp_dy = s.dy.exponent;
  auto spread = [](const QuantStats& q) { return q.exponent_min != q.exponent ? std::optional<int>(q.exponent_min) : std::nullopt; };
  n.exp_x_min = spread(s.x); n.exp_w_min = spread(s.w); n.exp_dy_min = spread(s.dy);
  n.chain_fwd = s.chain_fwd; n.chain_bwd = s.chain_bwd; n.chain_wgrad = s.chain_wgrad;
  n.saturated = s.x.saturated + s.w.saturated + s.dy.saturated;
  n.overflow_events = s.overflow_events;
}

namespace {

// Runs a conversion kernel over n elements, one call per kChunk piece. Each piece's stochastic
// stream starts at its element index, so results do not depend on the thread count.
template <class Kernel, class Dst>
void convert_tensor(const Context& ctx, Kernel fn, const float* src, Dst* dst, size_t n, Rounding r, uint32_t key) {
  for_chunks(ctx, n, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; i += kChunk) fn(src + i, dst + i, std::min(kChunk, e - i), r, key, i);
  });
}

// dst = src rounded to `f` (FP32 values).
void round_tensor(const Context& ctx, FloatFormat f, const float* src, float* dst, size_t n, Rounding r, uint32_t key) {
  convert_tensor(ctx, f == FloatFormat::bf16 ? ctx.kernels().round_bf16.fn : ctx.kernels().round_fp16.fn, src, dst, n,
                 r, key);
}
// Rounds the tensors of one class of a layer to the class's format: a 16-bit one directly, an
// 8-bit one at the power-of-two scale its Float8Options choose (dfp/precision.hpp). Keeps the
// delayed-scaling history, allocated when the layer is built, and the scale of the last tensor.
class ClassRounding {
 public:
  ClassRounding(FloatFormat f, const Float8Options& o) : f_(f), o_(o) {
    if (is_float8(f) && o.scaling == Float8Scaling::delayed) history_.assign(size_t(o.amax_history), 0.f);
  }
  FloatFormat format() const noexcept { return f_; }
  bool scaled() const noexcept { return is_float8(f_) && o_.scaling != Float8Scaling::none; }
  // The scale of the last tensor rounded, as an exponent of the tensor: x ~ stored * 2^exponent.
  int exponent() const noexcept { return -scale_exp_; }
  // dst = src rounded (src == dst allowed). known_max >= 0: max|src|, measured by the caller.
  void round(const Context& ctx, const float* src, float* dst, size_t n, const QuantOptions& q, uint64_t step,
             float known_max = -1.f) {
    const uint32_t key = step_key(q.seed, step);
    if (!is_float8(f_)) return round_tensor(ctx, f_, src, dst, n, q.rounding, key);
    int s = 0;
    if (o_.scaling == Float8Scaling::current || (o_.scaling == Float8Scaling::delayed && filled_ == 0)) {
      s = float8_scale_exponent(known_max >= 0 ? known_max : max_abs(ctx, src, n, nullptr), f_, o_.margin);
    } else if (o_.scaling == Float8Scaling::delayed) {
      s = float8_scale_exponent(*std::max_element(history_.begin(), history_.begin() + filled_), f_, o_.margin);
    }
    const auto fn = ctx.kernels().round_fp8.fn;
    std::atomic<uint32_t> amax{0};
    for_chunks(ctx, n, [&](size_t b, size_t e) {
      float m = 0.f;
      for (size_t i = b; i < e; i += kChunk)
        m = std::max(m, fn(src + i, dst + i, std::min(kChunk, e - i), f_, o_.overflow, s, q.rounding, key, i));
      atomic_max(amax, std::bit_cast<uint32_t>(m));  // non-negative floats order as their bit patterns
    });
    if (!history_.empty()) {
      history_[next_] = std::bit_cast<float>(amax.load());
      next_ = (next_ + 1) % history_.size();
      filled_ = std::min(filled_ + 1, history_.size());
    }
    scale_exp_ = s;
  }
  // x against its rounding q: an 8-bit format's overflow counts the elements beyond its range.
  FormatStats measure(const Context& ctx, const float* x, const float* q, size_t n) const {
    if (!is_float8(f_)) return measure_rounded(ctx, x, q, n);
    return measure_float8(ctx, x, q, n, f_, scale_exp_);
  }

 private:
  FloatFormat f_;
  Float8Options o_;
  std::vector<float> history_;
  size_t next_ = 0, filled_ = 0;
  int scale_exp_ = 0;
};

// dst = the BF16 bit patterns of src.
void to_bf16_tensor(const Context& ctx, const float* src, uint16_t* dst, size_t n, Rounding r, uint32_t key) {
  convert_tensor(ctx, ctx.kernels().to_bf16.fn, src, dst, n, r, key);
}

// ---- int16 --------------------------------------------------------------------------------------
// Adds the time since the last lap to a part's sum, when the step is timed (one clock read per
// part; none otherwise).
class PartClock {
 public:
  explicit PartClock(bool on) : on_(on), t_(on ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{}) {}
  void lap(double& sum) {
    if (!on_) return;
    const auto now = std::chrono::steady_clock::now();
    sum += std::chrono::duration<double>(now - t_).count();
    t_ = now;
  }

 private:
  bool on_;
  std::chrono::steady_clock::time_point t_;
};

class Int16Op final : public WeightedOp, public Int16Operation {
 public:
  Int16Op(const WeightedOpSpec& s, const LayerPrecision& p)
      : ctx_(*s.ctx), w_(s.weights), w_count_(s.weight_count), in_size_(s.in_size), out_size_(s.out_size) {
    DfpConvOptions o = p.options_for(s.name);
    o.input_gradient = s.input_gradient;
    q_ = std::make_unique<ConvInt16>(ctx_, s.shape, o, s.name);
  }
  void forward(const float* x, float* y, const StepInfo& st) override {
    PartClock clock(st.timed);
    if (input_taken_) {
      input_taken_ = false;  // quantized by the producer, in this step
    } else {
      q_->set_step(st.step);
      q_->quantize_input_with_max_abs(x, st.input_max_abs, st.input_plane_max);
      clock.lap(parts_.quantize_x);
    }
    q_->forward(y);
    clock.lap(parts_.forward);
    if (st.sample) {
      sample_.sampled = true;
      sample_.x = measure_dfp16_slices(ctx_, x, in_size_, q_->stats().x.exponent, q_->input_exponents());
      sample_.w = measure_dfp16_slices(ctx_, w_, w_count_, q_->stats().w.exponent, q_->weight_exponents());
    }
  }
  void backward(const float*, const float* dy, float* dx, float* gw, const StepInfo& st) override {
    PartClock clock(st.timed);
    q_->quantize_grad_output_with_max_abs(dy, st.grad_max_abs, st.grad_plane_max);
    clock.lap(parts_.quantize_dy);
    if (dx) q_->backward_data(dx, st.accumulate_dx & 1);
    clock.lap(parts_.backward_data);
    q_->backward_weights(gw);
    clock.lap(parts_.backward_weights);
    if (st.sample)
      sample_.dy = measure_dfp16_slices(ctx_, dy, out_size_, q_->stats().dy.exponent, q_->grad_output_exponents());
  }
  void weights_updated(uint64_t step, float max_abs) override {
    q_->set_step(step);
    q_->set_weights_with_max_abs(w_, max_abs);
  }
  bool backward_reads_input() const override { return false; }  // it keeps its DFP16 input
  bool accumulates_input_grad() const override { return true; }
  size_t workspace_bytes() const override { return q_->workspace_bytes(); }
  void use_workspace(void* region) override { q_->use_workspace(region); }
  std::string implementation() const override {
    const std::string fwd = q_->kernel_name(), bww = q_->weight_gradient_kernel_name();
    return fwd + " | " + fwd + " | " + bww;
  }
  bool numerics(const std::string& layer, LayerNumerics& n) const override {
    report_numerics(q_->stats(), layer, n);
    report_sample(sample_, n);
    return true;
  }
  Int16Operation* int16() noexcept override { return this; }
  const Int16Operation* int16() const noexcept override { return this; }
  const ConvStats& stats() const noexcept override { return q_->stats(); }
  bool accepts_input_spans() const override { return q_->accepts_input_spans(); }
  void take_input_spans(InputSpanFn fn, void* producer, float max_abs, const float* plane_max,
                        const StepInfo& st) override {
    PartClock clock(st.timed);
    q_->set_step(st.step);
    q_->quantize_input_spans(fn, producer, max_abs, plane_max);
    clock.lap(parts_.quantize_x);
    input_taken_ = true;
  }
  bool input_taken() const override { return input_taken_; }
  const LayerTime::Int16Parts& parts() const override { return parts_; }
  void reset_parts() override { parts_ = {}; }

 private:
  const Context& ctx_;
  const float* w_;
  size_t w_count_, in_size_, out_size_;
  std::unique_ptr<ConvInt16> q_;
  bool input_taken_ = false;  // the input was quantized by the producer in this step
  LayerTime::Int16Parts parts_;
};

// ---- 16-bit floats: what the native bf16 and rounded-float operations share -----------------------
class FloatOp : public WeightedOp {
 public:
  FloatOp(const WeightedOpSpec& s, const LayerPrecision& p)
      : ctx_(*s.ctx),
        w_(s.weights),
        w_count_(s.weight_count),
        in_size_(s.in_size),
        out_size_(s.out_size),
        fan_in_(s.fan_in),
        fmt_(p.formats),
        cls_(p.options_for(s.name)),
        round_w_(fmt_.weights, p.fp8),
        round_x_(fmt_.activations, p.fp8),
        round_dy_(fmt_.gradients, p.fp8) {
    if (fmt_.weights != FloatFormat::fp32) wr_ = AlignedBuffer<float>(w_count_);
  }
  void weights_updated(uint64_t step, float) override {
    // Weight statistics of adaptive loss scaling: once per weight version, here, not per backward.
    double sq = 0, mx = 0;
    for (size_t i = 0; i < w_count_; ++i) {
      const float v = w_[i];
      sq += double(v) * v;
      mx = std::max(mx, double(std::fabs(v)));
    }
    w_mean_sq_ = sq / double(w_count_);
    w_max_abs_ = mx;
    const float* w = w_;
    if (fmt_.weights != FloatFormat::fp32) {
      round_w_.round(ctx_, w_, wr_.data(), w_count_, cls_.weights, step, float(mx));
      w = wr_.data();
    }
    load_weights(w);
  }
  void finish_gradients(float* gw, size_t nw, float* gb, size_t nb) override {
    if (fmt_.gradients != FloatFormat::fp16) return;
    // Half-precision weight-gradient output: rounded, overflowing to inf (the loss scaler's signal).
    round_tensor(ctx_, FloatFormat::fp16, gw, gw, nw, Rounding::nearest_even, 0);
    if (gb) round_tensor(ctx_, FloatFormat::fp16, gb, gb, nb, Rounding::nearest_even, 0);
  }
  bool numerics(const std::string& layer, LayerNumerics& n) const override {
    n.layer = layer;
    // One name when the classes agree, else "weights/activations/gradients".
    n.format = fmt_.all(fmt_.weights) ? std::string(float_format_name(fmt_.weights)) : fmt_.names();
    report_sample(sample_, n);
    // Scaled 8-bit classes: the scale of each tensor as an exponent (x ~ stored * 2^exp_x).
    n.scaled = round_w_.scaled() || round_x_.scaled() || round_dy_.scaled();
    n.exp_w = round_w_.exponent(); n.exp_x = round_x_.exponent(); n.exp_dy = round_dy_.exponent();
    return true;
  }
  // Adaptive loss scaling (Zhao, Vogel, Ahmed 2019) keeps the expected magnitude of the gradient a
  // layer passes on above its format's underflow threshold without letting its largest product
  // overflow: its weight-side inputs are the current weights' E[w^2] and max|w| and the fan-in.
  bool adaptive_weight_inputs(AdaptiveInputs& in, FloatFormat& f) const override {
    const bool unscaled_fp8 = is_float8(fmt_.gradients) && !round_dy_.scaled();
    if (fmt_.gradients != FloatFormat::fp16 && fmt_.gradients != FloatFormat::bf16 && !unscaled_fp8) return false;
    in.w_mean_sq = w_mean_sq_;
    in.w_max_abs = w_max_abs_;
    in.fan_in = fan_in_;
    f = fmt_.gradients;
    return true;
  }

 protected:
  virtual void load_weights(const float* w) = 0;  // the weights in their class format

  const Context& ctx_;
  const float* w_;
  size_t w_count_, in_size_, out_size_;
  double fan_in_;
  ClassFormats fmt_;
  DfpConvOptions cls_;          // rounding and stochastic seeds per class
  ClassRounding round_w_, round_x_, round_dy_;
  AlignedBuffer<float> wr_;     // the rounded weights
  double w_mean_sq_ = 0, w_max_abs_ = 0;
};

// ---- native bf16 -----------------------------------------------------------------------------------
class NativeBf16Op final : public FloatOp {
 public:
  NativeBf16Op(const WeightedOpSpec& s, const LayerPrecision& p, std::unique_ptr<simd::ConvBf16Backend> b)
      : FloatOp(s, p), b_(std::move(b)), xb_(in_size_) {}
  void forward(const float* x, float* y, const StepInfo& st) override {
    to_bf16_tensor(ctx_, x, xb_.data(), in_size_, cls_.activations.rounding, step_key(cls_.activations.seed, st.step));
    b_->forward(xb_.data(), y);
    if (st.sample) {
      sample_.sampled = true;
      sample_.x = measure_bf16(ctx_, x, xb_.data(), in_size_);
      sample_.w = measure_rounded(ctx_, w_, wr_.data(), w_count_);
    }
  }
  void backward(const float*, const float* dy, float* dx, float* gw, const StepInfo& st) override {
    to_bf16_tensor(ctx_, dy, dyb_, out_size_, cls_.gradients.rounding, step_key(cls_.gradients.seed, st.step));
    if (dx) b_->backward_data(dyb_, dx);
    b_->backward_weights(xb_.data(), dyb_, gw);
    if (st.sample) sample_.dy = measure_bf16(ctx_, dy, dyb_, out_size_);
  }
  bool backward_reads_input() const override { return false; }  // it keeps its BF16 input
  size_t workspace_bytes() const override { return out_size_ * sizeof(uint16_t); }
  void use_workspace(void* region) override { dyb_ = static_cast<uint16_t*>(region); }
  std::string implementation() const override {
    return std::string(b_->impl_forward()) + " | " + b_->impl_backward_data() + " | " + b_->impl_backward_weights();
  }

 private:
  // Already BF16 values: the backend's reorder to BF16 is exact.
  void load_weights(const float* w) override { b_->set_weights(w); }

  std::unique_ptr<simd::ConvBf16Backend> b_;
  AlignedBuffer<uint16_t> xb_;  // the BF16 input, kept for the weight gradient
  uint16_t* dyb_ = nullptr;     // the BF16 dy, in the shared workspace
};

// ---- rounded float -------------------------------------------------------------------------------
class RoundedFloatOp final : public FloatOp {
 public:
  RoundedFloatOp(const WeightedOpSpec& s, const LayerPrecision& p) : FloatOp(s, p), f_(s.make_f32()) {
    if (fmt_.activations != FloatFormat::fp32) xr_ = AlignedBuffer<float>(in_size_);
  }
  void forward(const float* x, float* y, const StepInfo& st) override {
    const float* xr = x;
    if (fmt_.activations != FloatFormat::fp32) {
      round_x_.round(ctx_, x, xr_.data(), in_size_, cls_.activations, st.step);
      xr = xr_.data();
    }
    f_->forward(xr, y);
    if (st.sample) {
      sample_.sampled = true;
      sample_.x = round_x_.measure(ctx_, x, xr, in_size_);
      sample_.w = fmt_.weights != FloatFormat::fp32 ? round_w_.measure(ctx_, w_, wr_.data(), w_count_) : FormatStats{};
    }
  }
  void backward(const float* x, const float* dy, float* dx, float* gw, const StepInfo& st) override {
    const float* dyr = dy;
    if (fmt_.gradients != FloatFormat::fp32) {
      round_dy_.round(ctx_, dy, dyr_, out_size_, cls_.gradients, st.step);
      dyr = dyr_;
    }
    f_->backward(fmt_.activations != FloatFormat::fp32 ? xr_.data() : x, dyr, dx, gw);
    if (st.sample) sample_.dy = round_dy_.measure(ctx_, dy, dyr, out_size_);
  }
  // The weight gradient reads x: its rounded copy when activations are rounded.
  bool backward_reads_input() const override { return fmt_.activations == FloatFormat::fp32; }
  size_t workspace_bytes() const override {
    return fmt_.gradients != FloatFormat::fp32 ? out_size_ * sizeof(float) : 0;
  }
  void use_workspace(void* region) override { dyr_ = static_cast<float*>(region); }
  std::string implementation() const override { return f_->implementation(); }

 private:
  void load_weights(const float* w) override { f_->set_weights(w); }

  std::unique_ptr<F32Operator> f_;
  AlignedBuffer<float> xr_;  // the rounded input, kept for the weight gradient
  float* dyr_ = nullptr;     // the rounded dy, in the shared workspace
};

// ---- fp32 ----------------------------------------------------------------------------------------
class Fp32Op final : public WeightedOp {
 public:
  explicit Fp32Op(const WeightedOpSpec& s) : w_(s.weights), f_(s.make_f32()) {}
  void forward(const float* x, float* y, const StepInfo&) override { f_->forward(x, y); }
  void backward(const float* x, const float* dy, float* dx, float* gw, const StepInfo&) override {
    f_->backward(x, dy, dx, gw);
  }
  void weights_updated(uint64_t, float) override { f_->set_weights(w_); }
  bool backward_reads_input() const override { return true; }
  std::string implementation() const override { return f_->implementation(); }

 private:
  const float* w_;
  std::unique_ptr<F32Operator> f_;
};

}  // namespace

std::unique_ptr<WeightedOp> make_weighted_op(const WeightedOpSpec& spec, const LayerPrecision& p) {
  switch (p.precision) {
    case Precision::int16:
      return std::make_unique<Int16Op>(spec, p);
    case Precision::bf16:
    case Precision::fp16:
    case Precision::fp8:
      if (spec.bf16_operands && p.all_bf16())
        if (auto b = spec.ctx->kernels().conv_bf16.fn(spec.ctx->threads(), spec.shape, spec.name))
          return std::make_unique<NativeBf16Op>(spec, p, std::move(b));
      return std::make_unique<RoundedFloatOp>(spec, p);
    case Precision::fp32:
      break;
  }
  return std::make_unique<Fp32Op>(spec);
}

}  // namespace dfp::model
