// The operations of a weighted layer (weighted_ops.hpp): int16, native bf16, rounded float, MX,
// fp32.
#include "src/layers/weighted_ops.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <limits>
#include <optional>
#include <utility>
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
  if (const int es = posit_es(f)) {
    const auto fn = ctx.kernels().round_posit16.fn;
    for_chunks(ctx, n, [&](size_t b, size_t e) { fn(src + b, dst + b, e - b, es); });
    return;
  }
  convert_tensor(ctx, f == FloatFormat::bf16 ? ctx.kernels().round_bf16.fn : ctx.kernels().round_fp16.fn, src, dst, n,
                 r, key);
}
// Rounds the tensors of one class of a layer to the class's format: a 16-bit float or a posit
// directly, an 8-bit-or-smaller float at the power-of-two scale its Float8Options choose
// (dfp/precision.hpp). Keeps the delayed-scaling history, allocated when the layer is built, and
// the scale of the last tensor.
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
  // record: add max|src| to the delayed-scaling history (training passes; not the weights, whose
  // maxima weights_version adds).
  void round(const Context& ctx, const float* src, float* dst, size_t n, const QuantOptions& q, uint64_t step,
             bool record, float known_max = -1.f) {
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
    last_amax_ = std::bit_cast<float>(amax.load());
    if (record) push(last_amax_);
    scale_exp_ = s;
  }
  // The weights: a version's maximum joins the history when the next version arrives, so that a
  // version rounded again (after a checkpoint is loaded) takes the scale it had.
  void weights_version(uint64_t step) {
    if (pending_ && step != pending_step_) push(pending_amax_);
    pending_ = false;
  }
  void weights_rounded(uint64_t step) {
    pending_ = true;
    pending_step_ = step;
    pending_amax_ = last_amax_;
  }
  // The delayed-scaling history, oldest first (empty without one), and back: the last
  // amax_history values are kept.
  std::vector<float> history() const {
    std::vector<float> h;
    for (size_t i = 0; i < filled_; ++i) h.push_back(history_[(next_ + history_.size() - filled_ + i) % history_.size()]);
    return h;
  }
  bool set_history(const std::vector<float>& values, const std::string& what) {
    if (history_.empty()) return false;
    for (float v : values)
      DFP_CHECK(std::isfinite(v) && v >= 0, Status::corrupt_data,
                what + " holds " + std::to_string(v) + "; expected finite values >= 0");
    const size_t keep = std::min(values.size(), history_.size());
    std::copy(values.end() - ptrdiff_t(keep), values.end(), history_.begin());
    filled_ = keep;
    next_ = keep % history_.size();
    pending_ = false;
    return true;
  }
  // x against its rounding q: an 8-bit format's overflow counts the elements beyond its range.
  FormatStats measure(const Context& ctx, const float* x, const float* q, size_t n) const {
    if (!is_float8(f_)) return measure_rounded(ctx, x, q, n);
    return measure_float8(ctx, x, q, n, f_, scale_exp_);
  }

 private:
  void push(float amax) {
    if (history_.empty()) return;
    history_[next_] = amax;
    next_ = (next_ + 1) % history_.size();
    filled_ = std::min(filled_ + 1, history_.size());
  }

  FloatFormat f_;
  Float8Options o_;
  std::vector<float> history_;
  size_t next_ = 0, filled_ = 0;
  int scale_exp_ = 0;
  float last_amax_ = 0;
  bool pending_ = false;  // the weights: pending_amax_ of the version of pending_step_ awaits its successor
  uint64_t pending_step_ = 0;
  float pending_amax_ = 0;
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
  // The same interval into sum and into `within`, which says where part of sum is held.
  void lap(double& sum, double& within) {
    const double before = sum;
    lap(sum);
    within += sum - before;
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
    grad_taken_ = false;  // a new pass: a dy handed over in a backward that did not reach this layer is stale
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
    if (grad_taken_) {
      grad_taken_ = false;  // quantized by the BatchNorm after this layer, in this step
    } else {
      q_->quantize_grad_output_with_max_abs(dy, st.grad_max_abs, st.grad_plane_max);
      clock.lap(parts_.quantize_dy);
    }
    if (dx) q_->backward_data(dx, st.accumulate_dx & 1);
    clock.lap(parts_.backward_data);
    // The weight gradient's copy of x, where the layer keeps none; elsewhere the call does
    // nothing, and no lap puts that into quantize_x.
    if (q_->recompute_input()) clock.lap(parts_.quantize_x, parts_.quantize_x_in_backward);
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
                        InputQuantSpanFn quantized, const StepInfo& st) override {
    PartClock clock(st.timed);
    q_->set_step(st.step);
    q_->quantize_input_spans(fn, producer, max_abs, plane_max, quantized);
    clock.lap(parts_.quantize_x, parts_.quantize_x_in_producer);
    input_taken_ = true;
  }
  bool input_taken() const override { return input_taken_; }
  bool accepts_grad_spans() const override { return q_->accepts_grad_output_spans(); }
  void take_grad_spans(GradSpanFn fn, void* producer, float estimate, GradQuantSpanFn quantized,
                       const StepInfo& st) override {
    PartClock clock(st.timed);
    q_->quantize_grad_output_spans(fn, producer, estimate, quantized);
    clock.lap(parts_.quantize_dy, parts_.quantize_dy_in_producer);
    grad_taken_ = true;
  }
  bool grad_taken() const override { return grad_taken_; }
  bool recompute_input(InputSpanFn again, void* producer, InputPairSpanFn again_pairs) override {
    return q_->recompute_input_pairs(again, producer, again_pairs);
  }
  const LayerTime::Int16Parts& parts() const override { return parts_; }
  void reset_parts() override { parts_ = {}; }

 private:
  const Context& ctx_;
  const float* w_;
  size_t w_count_, in_size_, out_size_;
  std::unique_ptr<ConvInt16> q_;
  bool input_taken_ = false;  // the input was quantized by the producer in this step
  bool grad_taken_ = false;   // dy was quantized by its producer (a BatchNorm's backward) in this step
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
      round_w_.weights_version(step);
      round_w_.round(ctx_, w_, wr_.data(), w_count_, cls_.weights, step, false, float(mx));
      round_w_.weights_rounded(step);
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
  void scaling_histories(const std::string& prefix, std::map<std::string, std::vector<float>>& out) const override {
    for (const auto& [cls, r] : classes())
      if (std::vector<float> h = r->history(); !h.empty()) out[prefix + cls] = std::move(h);
  }
  bool set_scaling_history(const std::string& cls, const std::vector<float>& values, const std::string& what) override {
    ClassRounding* r = cls == "weights"       ? &round_w_
                       : cls == "activations" ? &round_x_
                       : cls == "gradients"   ? &round_dy_
                                              : nullptr;
    return r && r->set_history(values, what);
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
  std::array<std::pair<const char*, const ClassRounding*>, 3> classes() const {
    return {{{"weights", &round_w_}, {"activations", &round_x_}, {"gradients", &round_dy_}}};
  }

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
      round_x_.round(ctx_, x, xr_.data(), in_size_, cls_.activations, st.step, st.train);
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
      round_dy_.round(ctx_, dy, dyr_, out_size_, cls_.gradients, st.step, true);
      dyr = dyr_;
    }
    f_->backward(fmt_.activations != FloatFormat::fp32 ? xr_.data() : x, dyr, dx, gw);
    if (st.sample) sample_.dy = round_dy_.measure(ctx_, dy, dyr, out_size_);
  }
  // The weight gradient reads x: its rounded copy when activations are rounded.
  bool backward_reads_input() const override {
    return fmt_.activations == FloatFormat::fp32 && f_->backward_reads_input();
  }
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

// ---- Blocks along each pass's reduction: OCP Microscaling and Block DFP -----------------------------
// Each pass quantizes its own operands in blocks along its reduction: x and dy across the
// channels at each pixel (forward, backward-data) and along the pixels of each image at each
// channel (the weight gradient; along the batch where an image is one pixel, as a Linear's);
// w along its input channels at each output channel and kernel tap (forward) and along its
// output channels (backward-data), in two FP32 operators, one per set of weights.
//   MX (mxfp8, mxfp6, mxfp4, mxint8): blocks of 32 with an E8M0 scale; a class in a format that
//     is not an MX element (fp32, bf16, fp16) is rounded once and used by both passes.
//   Block DFP (int16 with a block granularity): DFP16 blocks of 32, 64 or 128, each with its own
//     exponent; a class of granularity tensor is rounded to DFP16 with one exponent, once.
class BlockOp final : public WeightedOp {
 public:
  BlockOp(const WeightedOpSpec& s, const LayerPrecision& p)
      : ctx_(*s.ctx),
        shape_(s.shape),
        w_(s.weights),
        w_count_(s.weight_count),
        in_size_(s.in_size),
        out_size_(s.out_size),
        fmt_(p.formats),
        cls_(p.options_for(s.name)),
        dfp_(p.precision == Precision::int16),
        f_(s.make_f32()),
        fb_(s.make_f32()),
        round_w_(fmt_.weights, kUnscaled),
        round_x_(fmt_.activations, kUnscaled),
        round_dy_(fmt_.gradients, kUnscaled),
        w_blocks_(blocking(fmt_.weights, cls_.weights)),
        x_blocks_(blocking(fmt_.activations, cls_.activations)),
        dy_blocks_(blocking(fmt_.gradients, cls_.gradients)),
        wf_(w_count_),
        wb_(w_count_),
        xq_(in_size_) {
    if (w_blocks_.dfp_tensor || x_blocks_.dfp_tensor || dy_blocks_.dfp_tensor)
      dfp_scratch_ = AlignedBuffer<int16_t>(std::max({w_count_, in_size_, out_size_}));
  }
  void forward(const float* x, float* y, const StepInfo& st) override {
    scales_x_ = kNoScales;
    const float* xq = quantize(round_x_, x_blocks_, x, xq_.data(), in_size_, shape_.C, shape_.H * shape_.W, false,
                               cls_.activations, st, scales_x_);
    f_->forward(xq, y);
    if (st.sample) {
      sample_.sampled = true;
      sample_.x = measure_rounded(ctx_, x, xq, in_size_);
      sample_.w = rounds(fmt_.weights, w_blocks_) ? measure_rounded(ctx_, w_, wf_.data(), w_count_) : FormatStats{};
    }
  }
  void backward(const float* x, const float* dy, float* dx, float* gw, const StepInfo& st) override {
    const int pixels = shape_.OH() * shape_.OW();
    scales_dy_ = kNoScales;
    const float* dq_data = nullptr;
    if (dx) {
      dq_data = quantize(round_dy_, dy_blocks_, dy, dyq_, out_size_, shape_.K, pixels, false, cls_.gradients, st,
                         scales_dy_);
      fb_->backward_data(dq_data, dx);
      if (st.sample) sample_.dy = measure_rounded(ctx_, dy, dq_data, out_size_);
    }
    // A class rounded whole has one rounding for the step: the forward's x (kept in xq_, or x
    // itself in FP32), backward-data's dy. Blocked classes take the weight gradient's own blocks.
    std::pair<int, int> ignored = kNoScales;
    const float* xq = x_blocks_.blocked()
                          ? quantize(round_x_, x_blocks_, x, xq_.data(), in_size_, shape_.C, shape_.H * shape_.W, true,
                                     cls_.activations, st, ignored)
                      : x_blocks_.dfp_tensor || round_x_.format() != FloatFormat::fp32 ? xq_.data()
                                                                                       : x;
    // Without an input gradient (a first layer) dy's record is the weight gradient's quantization.
    ignored = kNoScales;
    const float* dq = dq_data && !dy_blocks_.blocked()
                          ? dq_data
                          : quantize(round_dy_, dy_blocks_, dy, dyq_, out_size_, shape_.K, pixels, true, cls_.gradients,
                                     st, dx ? ignored : scales_dy_);
    if (!dx && st.sample) sample_.dy = measure_rounded(ctx_, dy, dq, out_size_);
    f_->backward_weights(xq, dq, gw);
  }
  void weights_updated(uint64_t step, float) override {
    scales_w_ = kNoScales;
    const int k = shape_.K, c = int(w_count_ / size_t(k) / size_t(shape_.R * shape_.S)), rs = shape_.R * shape_.S;
    if (w_blocks_.blocked()) {
      // Forward: along the input channels of each output channel and tap. Backward-data: along the
      // output channels of each input channel and tap.
      std::atomic<int> lo{kNoScales.first}, hi{kNoScales.second};
      ctx_.parallel_for(k, [&](int64_t b, int64_t e) {
        int l = kNoScales.first, h = kNoScales.second;
        for (int64_t i = b; i < e; ++i)
          round_rows(w_blocks_, cls_.weights, w_ + size_t(i) * c * rs, wf_.data() + size_t(i) * c * rs, size_t(c),
                     size_t(rs), size_t(rs), &l, &h);
        fold(lo, hi, l, h);
      });
      const size_t cols = size_t(c) * rs;
      ctx_.parallel_for(int64_t((cols + 15) / 16), [&](int64_t b, int64_t e) {
        int l = kNoScales.first, h = kNoScales.second;
        for (int64_t i = b; i < e; ++i) {
          const size_t first = size_t(i) * 16;
          round_rows(w_blocks_, cls_.weights, w_ + first, wb_.data() + first, size_t(k), std::min<size_t>(16, cols - first),
                     cols, &l, &h);
        }
        (void)l, (void)h;  // the forward blocks' scales are the ones reported
      });
      scales_w_ = {lo.load(), hi.load()};
      f_->set_weights(wf_.data());
      fb_->set_weights(wb_.data());
      return;
    }
    const float* w = w_;
    if (w_blocks_.dfp_tensor) {
      w = round_dfp16_tensor(w_, wf_.data(), w_count_, cls_.weights, scales_w_);
    } else if (fmt_.weights != FloatFormat::fp32) {
      round_w_.round(ctx_, w_, wf_.data(), w_count_, cls_.weights, step, false);
      w = wf_.data();
    }
    f_->set_weights(w);
    fb_->set_weights(w);
  }
  bool backward_reads_input() const override { return true; }  // the weight gradient's blocks are its own
  size_t workspace_bytes() const override { return out_size_ * sizeof(float); }
  void use_workspace(void* region) override { dyq_ = static_cast<float*>(region); }
  std::string implementation() const override { return f_->implementation(); }
  bool numerics(const std::string& layer, LayerNumerics& n) const override {
    n.layer = layer;
    if (dfp_)
      n.format = "int16";
    else
      n.format = fmt_.all(fmt_.weights) ? std::string(float_format_name(fmt_.weights)) : fmt_.names();
    report_sample(sample_, n);
    // The largest and smallest block scale (MX) or DFP16 exponent (Block DFP) of each operand
    // (forward's x and w, backward's dy).
    n.scaled = !dfp_;
    auto put = [](const std::pair<int, int>& s, int& hi, std::optional<int>& lo) {
      if (s.first > s.second) return;
      hi = s.second;
      if (s.first != s.second) lo = s.first;
    };
    put(scales_x_, n.exp_x, n.exp_x_min);
    put(scales_w_, n.exp_w, n.exp_w_min);
    put(scales_dy_, n.exp_dy, n.exp_dy_min);
    return true;
  }

 private:
  // How one class is rounded.
  struct Blocking {
    FloatFormat mx = FloatFormat::fp32;  // an MX element format; fp32: no MX blocks
    int dfp_block = 0;                   // DFP16 blocks of this many elements; 0: none
    bool dfp_tensor = false;             // DFP16 with one exponent per tensor
    bool blocked() const noexcept { return dfp_block > 0 || mx != FloatFormat::fp32; }
  };
  Blocking blocking(FloatFormat f, const QuantOptions& q) const {
    Blocking b;
    if (dfp_) {
      b.dfp_block = granularity_block(q.granularity);
      b.dfp_tensor = b.dfp_block == 0;
    } else if (is_float8(f)) {
      b.mx = f;
    }
    return b;
  }
  static bool rounds(FloatFormat f, const Blocking& b) { return b.blocked() || b.dfp_tensor || f != FloatFormat::fp32; }
  // Classes in another format than an MX element are rounded whole, unscaled.
  static constexpr Float8Options kUnscaled{Float8Scaling::none};
  static constexpr std::pair<int, int> kNoScales{1 << 20, -(1 << 20)};  // smallest, largest (empty: first > second)
  static void fold(std::atomic<int>& lo, std::atomic<int>& hi, int l, int h) {
    atomic_min(lo, l);
    atomic_max(hi, h);
  }
  // Blocks along rows (mx_rows / dfp16_rows).
  void round_rows(const Blocking& b, const QuantOptions& q, const float* src, float* dst, size_t rows, size_t lanes,
                  size_t stride, int* lo, int* hi) const {
    if (b.dfp_block)
      ctx_.kernels().dfp16_rows.fn(src, dst, rows, lanes, stride, size_t(b.dfp_block), q.headroom, q.rounding, lo, hi);
    else
      ctx_.kernels().mx_rows.fn(src, dst, rows, lanes, stride, b.mx, lo, hi);
  }
  // DFP16 with one exponent (the quantizer's rounding, dequantized); non-finite elements make the
  // tensor NaN, as a block holding one is.
  const float* round_dfp16_tensor(const float* src, float* dst, size_t size, const QuantOptions& q,
                                  std::pair<int, int>& scales) {
    QuantOptions o = q;
    o.nonfinite = NonFinitePolicy::count;
    const QuantStats s = quantize_dfp16(ctx_, src, dfp_scratch_.data(), size, o);
    if (s.nonfinite) {
      std::fill(dst, dst + size, std::numeric_limits<float>::quiet_NaN());
      return dst;
    }
    dequantize_dfp16(ctx_, dfp_scratch_.data(), s.exponent, dst, size);
    if (s.max_abs > 0.f) scales = {s.exponent, s.exponent};
    return dst;
  }
  // A blocked tensor [N][channel blocks][pixels][16] in its class's blocks: across the channels
  // (along_pixels false) or along each image's pixels (true; along the batch for one pixel); a
  // class that is not blocked rounded whole (fp32: as it is).
  const float* quantize(ClassRounding& r, const Blocking& b, const float* src, float* dst, size_t size, int channels,
                        int pixels, bool along_pixels, const QuantOptions& q, const StepInfo& st,
                        std::pair<int, int>& scales) {
    if (b.dfp_tensor) return round_dfp16_tensor(src, dst, size, q, scales);
    if (!b.blocked()) {
      if (r.format() == FloatFormat::fp32) return src;
      r.round(ctx_, src, dst, size, q, st.step, false);
      return dst;
    }
    const int n = shape_.N, cb = channel_blocks(channels);
    const size_t plane = size_t(pixels) * 16;
    std::atomic<int> lo{scales.first}, hi{scales.second};
    if (!along_pixels) {
      // Planes per block: 2 for MX's 32, block / 16 for DFP16's.
      const int per = b.dfp_block ? b.dfp_block / 16 : 2;
      const int groups = (cb + per - 1) / per;
      ctx_.parallel_for(int64_t(n) * groups, [&](int64_t from, int64_t to) {
        int l = kNoScales.first, h = kNoScales.second;
        for (int64_t t = from; t < to; ++t) {
          const size_t first_plane = size_t(t / groups) * cb + size_t(t % groups) * per;
          const size_t planes = std::min<size_t>(per, size_t(cb) - size_t(t % groups) * per);
          const size_t first = first_plane * plane;
          if (b.dfp_block)
            ctx_.kernels().dfp16_lanes.fn(src + first, dst + first, planes, size_t(pixels), q.headroom, q.rounding, &l, &h);
          else
            ctx_.kernels().mx_lanes.fn(src + first, planes == 2 ? src + first + plane : nullptr, dst + first,
                                       dst + first + plane, size_t(pixels), b.mx, &l, &h);
        }
        fold(lo, hi, l, h);
      });
    } else if (pixels > 1) {
      ctx_.parallel_for(int64_t(n) * cb, [&](int64_t from, int64_t to) {
        int l = kNoScales.first, h = kNoScales.second;
        for (int64_t t = from; t < to; ++t)
          round_rows(b, q, src + size_t(t) * plane, dst + size_t(t) * plane, size_t(pixels), 16, 16, &l, &h);
        fold(lo, hi, l, h);
      });
    } else {
      ctx_.parallel_for(cb, [&](int64_t from, int64_t to) {
        int l = kNoScales.first, h = kNoScales.second;
        for (int64_t t = from; t < to; ++t)
          round_rows(b, q, src + size_t(t) * 16, dst + size_t(t) * 16, size_t(n), 16, size_t(cb) * 16, &l, &h);
        fold(lo, hi, l, h);
      });
    }
    scales = {lo.load(), hi.load()};
    return dst;
  }

  const Context& ctx_;
  ConvShape shape_;
  const float* w_;
  size_t w_count_, in_size_, out_size_;
  ClassFormats fmt_;
  DfpConvOptions cls_;
  bool dfp_;                              // Block DFP (an int16 layer), else MX
  std::unique_ptr<F32Operator> f_, fb_;  // forward and weight gradient; backward-data
  ClassRounding round_w_, round_x_, round_dy_;
  Blocking w_blocks_, x_blocks_, dy_blocks_;
  AlignedBuffer<float> wf_, wb_, xq_;  // the weights of each pass, the quantized input
  AlignedBuffer<int16_t> dfp_scratch_;  // DFP16 values of a class rounded with one exponent
  float* dyq_ = nullptr;               // the quantized dy, in the shared workspace
  std::pair<int, int> scales_x_ = kNoScales, scales_w_ = kNoScales, scales_dy_ = kNoScales;
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
  bool backward_reads_input() const override { return f_->backward_reads_input(); }
  std::string implementation() const override { return f_->implementation(); }

 private:
  const float* w_;
  std::unique_ptr<F32Operator> f_;
};

}  // namespace

std::unique_ptr<WeightedOp> make_weighted_op(const WeightedOpSpec& spec, const LayerPrecision& p) {
  switch (p.precision) {
    case Precision::int16: {
      const DfpConvOptions o = p.options_for(spec.name);
      if (granularity_block(o.weights.granularity) || granularity_block(o.activations.granularity) ||
          granularity_block(o.gradients.granularity))
        return std::make_unique<BlockOp>(spec, p);
      return std::make_unique<Int16Op>(spec, p);
    }
    case Precision::bf16:
    case Precision::fp16:
    case Precision::fp8:
    case Precision::posit16:
    case Precision::posit16es2:
      if (spec.bf16_operands && p.all_bf16())
        if (auto b = spec.ctx->kernels().conv_bf16.fn(spec.ctx->threads(), spec.shape, spec.name))
          return std::make_unique<NativeBf16Op>(spec, p, std::move(b));
      return std::make_unique<RoundedFloatOp>(spec, p);
    case Precision::mxfp8:
    case Precision::mxfp6:
    case Precision::mxfp4:
    case Precision::mxint8:
      return std::make_unique<BlockOp>(spec, p);
    case Precision::fp32:
      break;
  }
  return std::make_unique<Fp32Op>(spec);
}

}  // namespace dfp::model
