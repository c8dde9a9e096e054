// The layers of the model graph. Each works on the blocked FP32 layout; per-channel work runs
// over the 16 lanes of a block, which the compiler vectorizes. Parallel loops run on the
// context's threads over disjoint outputs, so results do not depend on the thread count.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <limits>

#include <optional>

#include "dfp/float16.hpp"
#include "dfp/loss_scale.hpp"
#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"
#include "simd/onednn/conv_onednn.hpp"
#include "src/aligned_buffer.hpp"
#include "src/model/layer.hpp"

namespace dfp::model {
namespace {

int cb_of(const TensorShape& s) { return channel_blocks(s.c); }
size_t plane(const TensorShape& s) { return size_t(s.h) * s.w * 16; }  // one channel block of one image

// Parallel over (image, channel block) pairs.
template <class F>
void for_blocks(const Context& ctx, int n, int cb, F&& f) {
  ctx.parallel_for(int64_t(n) * cb, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) f(static_cast<int>(i / cb), static_cast<int>(i % cb));
  });
}

// Zeroes lanes c >= C of the last channel block. Planned buffers are reused, so a layer that writes
// channel by channel must clear the padding lanes itself (every layer's outputs have them zero).
void zero_padding_lanes(const Context& ctx, float* t, const TensorShape& s) {
  const int used = s.c % 16;
  if (used == 0) return;
  const int CB = cb_of(s);
  ctx.parallel_for(s.n, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      float* p = t + (size_t(n) * CB + CB - 1) * plane(s);
      for (size_t i = 0; i < size_t(s.h) * s.w; ++i) std::fill(p + i * 16 + used, p + i * 16 + 16, 0.f);
    }
  });
}

// Bias: y[.., c] += b[c]; its gradient: sum of dy over batch and space.
void add_bias(const Context& ctx, float* y, const TensorShape& s, const float* b) {
  for_blocks(ctx, s.n, cb_of(s), [&](int n, int blk) {
    float* p = y + (size_t(n) * cb_of(s) + blk) * plane(s);
    float lane[16] = {};
    for (int l = 0; l < 16 && blk * 16 + l < s.c; ++l) lane[l] = b[blk * 16 + l];
    for (size_t i = 0; i < size_t(s.h) * s.w; ++i)
      for (int l = 0; l < 16; ++l) p[i * 16 + l] += lane[l];
  });
}
void bias_grad(const float* dy, const TensorShape& s, float* gb) {
  for (int blk = 0; blk < cb_of(s); ++blk) {
    double acc[16] = {};
    for (int n = 0; n < s.n; ++n) {
      const float* p = dy + (size_t(n) * cb_of(s) + blk) * plane(s);
      for (size_t i = 0; i < size_t(s.h) * s.w; ++i)
        for (int l = 0; l < 16; ++l) acc[l] += p[i * 16 + l];
    }
    for (int l = 0; l < 16 && blk * 16 + l < s.c; ++l) gb[blk * 16 + l] = static_cast<float>(acc[l]);
  }
}

// The DFP16 options of one Conv2d/Linear: the policy's, with names for error messages and a
// distinct stochastic stream per layer and tensor class.
DfpConvOptions layer_dfp_options(const PrecisionPolicy& policy, const std::string& name) {
  DfpConvOptions o = policy.dfp;
  for (QuantOptions* q : {&o.weights, &o.activations, &o.gradients}) {
    q->name = name + "." + q->name;
    q->seed ^= std::hash<std::string>{}(q->name);
  }
  return o;
}

// ---- reduced-precision operands ----------------------------------------------------------------

// Per-step stochastic key of one tensor class of one layer.
uint32_t step_key(uint64_t seed, uint64_t step) { return simd::stochastic_key(step_seed(seed, step)); }

// Runs a conversion kernel over n elements, one call per kChunk piece. Each piece's stochastic
// stream starts at its element index, so results do not depend on the thread count.
template <class Kernel, class Dst>
void convert_tensor(const Context& ctx, Kernel fn, const float* src, Dst* dst, size_t n, Rounding r, uint32_t key) {
  for_chunks(ctx, n, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; i += kChunk) fn(src + i, dst + i, std::min(kChunk, e - i), r, key, i);
  });
}

// dx = dy where the ReLU mask bit is set, else 0 (dx may be dy).
void mask_gradient(const Context& ctx, const uint16_t* mask, const float* dy, float* dx, size_t n) {
  const auto fn = ctx.kernels().relu_bwd.fn;
  for_chunks(ctx, n, [&](size_t b, size_t e) { fn(mask + b / 16, dy + b, dx + b, e - b); });
}
// dst = src rounded to `f` (FP32 values).
void round_tensor(const Context& ctx, FloatFormat f, const float* src, float* dst, size_t n, Rounding r, uint32_t key) {
  convert_tensor(ctx, f == FloatFormat::bf16 ? ctx.kernels().round_bf16.fn : ctx.kernels().round_fp16.fn, src, dst, n,
                 r, key);
}
// dst = the BF16 bit patterns of src.
void to_bf16_tensor(const Context& ctx, const float* src, uint16_t* dst, size_t n, Rounding r, uint32_t key) {
  convert_tensor(ctx, ctx.kernels().to_bf16.fn, src, dst, n, r, key);
}

// Per-tensor-class statistics of the last sampled step.
struct SampledNumerics {
  bool sampled = false;
  FormatStats x, w, dy;
};

void report_sample(const SampledNumerics& s, LayerNumerics& n) {
  n.sampled = s.sampled;
  if (!s.sampled) return;
  n.sqnr_x_db = s.x.sqnr_db();
  n.sqnr_w_db = s.w.sqnr_db();
  n.sqnr_dy_db = s.dy.sqnr_db();
  n.overflow = s.x.overflow + s.w.overflow + s.dy.overflow;
  n.underflow = s.x.underflow + s.w.underflow + s.dy.underflow;
  n.nonzero = s.x.nonzero + s.w.nonzero + s.dy.nonzero;
}

bool report_numerics(const ConvStats& s, const std::string& name, LayerNumerics& n) {
  n.layer = name;
  n.format = "int16";
  n.exp_x = s.x.exponent; n.exp_w = s.w.exponent; n.exp_dy = s.dy.exponent;
  n.chain_fwd = s.chain_fwd; n.chain_bwd = s.chain_bwd; n.chain_wgrad = s.chain_wgrad;
  n.saturated = s.x.saturated + s.w.saturated + s.dy.saturated;
  n.overflow_events = s.overflow_events;
  return true;
}

// A parameter tensor's storage: the layer's own, or a slice of a tensor that another layer owns.
// The groups of a grouped convolution are Conv2d layers whose weights are slices of one tensor:
// PyTorch's [K][C/groups][R][S] is exactly the groups' [K/groups][C/groups][R][S] one after the
// other, so the optimizer and checkpoints see one parameter, laid out as PyTorch lays it out.
class ParamStore {
 public:
  ParamStore() = default;
  ParamStore(const ParamStore&) = delete;  // a copy would view the original's storage
  ParamStore& operator=(const ParamStore&) = delete;
  // n zeros (in the slice, when viewing one: its size must be n).
  void allocate(size_t n) {
    if (viewing_) {
      DFP_CHECK(n == n_, Status::internal, "parameter slice of " + std::to_string(n_) + " values, layer needs " +
                                               std::to_string(n));
    } else {
      own_.assign(n, 0.f);
      p_ = own_.data();
      n_ = n;
    }
    std::fill(p_, p_ + n_, 0.f);
  }
  void view(float* p, size_t n) {
    viewing_ = true;
    own_.clear();
    p_ = p;
    n_ = n;
  }
  bool shared() const noexcept { return viewing_; }  // a slice of another layer's tensor
  float* data() noexcept { return p_; }
  const float* data() const noexcept { return p_; }
  size_t size() const noexcept { return n_; }
  float* begin() noexcept { return p_; }
  float* end() noexcept { return p_ + n_; }
  const float* begin() const noexcept { return p_; }
  const float* end() const noexcept { return p_ + n_; }

 private:
  std::vector<float> own_;
  float* p_ = nullptr;
  size_t n_ = 0;
  bool viewing_ = false;
};

// ---- Conv2d and Linear ------------------------------------------------------------------------
// Both hold FP32 master weights (and an optional bias) and run one operator chosen by the precision
// policy:
//   int16: ConvInt16 (DFP16 operands, all three passes).
//   bf16/fp16: the operands x, w, dy are rounded to their class formats, then the FP32 operator
//     runs on them: products of 16-bit floats are exact in FP32, so this is FP32 accumulation of
//     exact products, the numerics of VDPBF16PS and of tensor cores. A Conv2d whose three
//     classes are all BF16 runs oneDNN's BF16 primitives instead (VDPBF16PS, BF16 operands in
//     memory, half the bytes), with FP32 outputs. FP16 weight gradients are stored as FP16
//     (rounded, overflow to inf), as a half-precision wgrad output would be.
//   fp32: the FP32 operator.
// A Linear layer's input (N, F, 1, 1) is already blocked as rows of F features padded to 16,
// which is exactly what ConvInt16 reads for a 1x1 convolution over a 1x1 image, so in INT16 it
// needs no re-layout.

class WeightedLayer : public Layer {
 public:
  void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo& st) override {
    if (q_) {
      if (input_taken_) {
        input_taken_ = false;  // quantized by the producer, in this step
      } else {
        q_->set_step(st.step);
        q_->quantize_input_with_max_abs(x[0], st.input_max_abs);
      }
      q_->forward(y);
      if (st.sample) sample_int16_forward(x[0]);
    } else if (native_bf16_) {
      to_bf16_tensor(ctx, x[0], xb_.data(), in_size_, cls_.activations.rounding, step_key(cls_.activations.seed, st.step));
      forward_bf16(xb_.data(), y);
      if (st.sample) {
        sample_.sampled = true;
        sample_.x = measure_bf16(ctx, x[0], xb_.data(), in_size_);
        sample_.w = measure_rounded(ctx, w_.data(), wr_.data(), w_.size());
      }
    } else if (float_) {
      const float* xr = x[0];
      if (fmt_.activations != FloatFormat::fp32) {
        round_tensor(ctx, fmt_.activations, x[0], xr_.data(), in_size_, cls_.activations.rounding,
                     step_key(cls_.activations.seed, st.step));
        xr = xr_.data();
      }
      forward_f32(xr, y);
      if (st.sample) {
        sample_.sampled = true;
        sample_.x = measure_rounded(ctx, x[0], xr, in_size_);
        sample_.w = fmt_.weights != FloatFormat::fp32 ? measure_rounded(ctx, w_.data(), wr_.data(), w_.size()) : FormatStats{};
      }
    } else {
      forward_f32(x[0], y);
    }
    if (has_bias_) add_bias(ctx, y, out_, b_.data());
  }
  void backward(const Context& ctx, const std::vector<const float*>& x, const float* y, const float* dy,
                const std::vector<float*>& dx, const StepInfo& st) override {
    if (q_) {
      q_->quantize_grad_output_with_max_abs(dy, st.grad_max_abs);
      if (dx[0]) q_->backward_data(dx[0], st.accumulate_dx & 1);
      q_->backward_weights(gw_.data());
      if (st.sample) sample_.dy = measure_dfp16(ctx, dy, out_size_, q_->stats().dy.exponent);
    } else if (native_bf16_) {
      to_bf16_tensor(ctx, dy, dyb_, out_size_, cls_.gradients.rounding, step_key(cls_.gradients.seed, st.step));
      backward_bf16(dyb_, dx[0]);
      if (st.sample) sample_.dy = measure_bf16(ctx, dy, dyb_, out_size_);
    } else if (float_) {
      const float* dyr = dy;
      if (fmt_.gradients != FloatFormat::fp32) {
        round_tensor(ctx, fmt_.gradients, dy, dyr_, out_size_, cls_.gradients.rounding,
                     step_key(cls_.gradients.seed, st.step));
        dyr = dyr_;
      }
      backward_f32(fmt_.activations != FloatFormat::fp32 ? xr_.data() : x[0], dyr, dx[0]);
      if (st.sample) sample_.dy = measure_rounded(ctx, dy, dyr, out_size_);
    } else {
      backward_f32(x[0], dy, dx[0]);
    }
    if (has_bias_) bias_grad(dy, out_, gb_.data());
    if (float_ && fmt_.gradients == FloatFormat::fp16) {
      // Half-precision weight-gradient output: rounded, overflowing to inf (the loss scaler's signal).
      round_tensor(ctx, FloatFormat::fp16, gw_.data(), gw_.data(), gw_.size(), Rounding::nearest_even, 0);
      if (has_bias_) round_tensor(ctx, FloatFormat::fp16, gb_.data(), gb_.data(), gb_.size(), Rounding::nearest_even, 0);
    }
  }
  void parameters(std::vector<Parameter>& out) override {
    out.push_back({name + ".weight", w_.data(), gw_.data(), w_.size(), true});
    if (has_bias_) out.push_back({name + ".bias", b_.data(), gb_.data(), b_.size(), true});
  }
  void weights_updated(uint64_t step, std::span<const float> param_max_abs) override {
    if (q_) {
      q_->set_step(step);
      // The weight is the first of parameters(); a negative maximum: measured by the quantizer.
      q_->set_weights_with_max_abs(w_.data(), param_max_abs.empty() ? -1.f : param_max_abs[0]);
    } else if (float_) {
      // Weight statistics of adaptive loss scaling: once per weight version, here, not per backward.
      double sq = 0, mx = 0;
      for (float v : w_) {
        sq += double(v) * v;
        mx = std::max(mx, double(std::fabs(v)));
      }
      w_mean_sq_ = sq / double(w_.size());
      w_max_abs_ = mx;
      const float* w = w_.data();
      if (fmt_.weights != FloatFormat::fp32) {
        round_tensor(*ctx_, fmt_.weights, w_.data(), wr_.data(), w_.size(), cls_.weights.rounding,
                     step_key(cls_.weights.seed, step));
        w = wr_.data();
      }
      if (native_bf16_) set_weights_bf16(w);  // already BF16 values: oneDNN's reorder is exact
      else set_weights_f32(w);
    } else {
      set_weights_f32(w_.data());
    }
  }
  const char* precision() const override { return precision_name(prec_); }
  std::string implementation() const override {
    if (!q_) return operator_implementation();
    const std::string fwd = q_->kernel_name(), bww = q_->weight_gradient_kernel_name();
    return fwd + " | " + fwd + " | " + bww;
  }
  bool accumulates_input_grad(size_t) const override { return q_ != nullptr; }
  size_t workspace_bytes() const override { return q_ ? q_->workspace_bytes() : dy_bytes_; }
  void use_workspace(void* region) override {
    if (q_) q_->use_workspace(region);
    dyr_ = static_cast<float*>(region);
    dyb_ = static_cast<uint16_t*>(region);
  }
  bool numerics(LayerNumerics& n) const override {
    if (q_) {
      report_numerics(q_->stats(), name, n);
    } else if (float_) {
      n.layer = name;
      n.format = fmt_.weights == fmt_.activations && fmt_.weights == fmt_.gradients
                     ? std::string(float_format_name(fmt_.weights))
                     : std::string(float_format_name(fmt_.weights)) + "/" + float_format_name(fmt_.activations) + "/" +
                           float_format_name(fmt_.gradients);
    } else {
      return false;
    }
    report_sample(sample_, n);
    return true;
  }
  double adaptive_factor(const Context& ctx, const float* dy, double scale_so_far,
                         const AdaptiveScaling& opts) const override {
    AdaptiveInputs in;
    FloatFormat f;
    if (!adaptive_weight_inputs(in, f)) return 1;
    return adaptive_factor_over(dy, out_, in, f, scale_so_far, opts);
  }
  // Adaptive loss scaling (Zhao, Vogel, Ahmed 2019) keeps the expected magnitude of the gradient a
  // layer passes on above its format's underflow threshold without letting its largest product
  // overflow. Its weight-side inputs (the current weights' E[w^2] and max|w|, the fan-in) and the
  // gradient format; false when the layer's gradients are not 16-bit floats (factor 1).
  bool adaptive_weight_inputs(AdaptiveInputs& in, FloatFormat& f) const {
    if (!float_ || (fmt_.gradients != FloatFormat::fp16 && fmt_.gradients != FloatFormat::bf16)) return false;
    in.w_mean_sq = w_mean_sq_;
    in.w_max_abs = w_max_abs_;
    in.fan_in = fan_in_;
    f = fmt_.gradients;
    return true;
  }
  // The factor with the gradient-side inputs measured over dy (blocked, shape `out`: padding lanes
  // are zero and not counted).
  static double adaptive_factor_over(const float* dy, const TensorShape& out, AdaptiveInputs in, FloatFormat f,
                                     double scale_so_far, const AdaptiveScaling& opts) {
    const double count = double(out.n) * out.c * out.h * out.w;
    const size_t n = out.blocked_elements();
    in.g_mean_sq = 0;
    in.g_max_abs = 0;
    for (size_t i = 0; i < n; ++i) {
      const double v = dy[i];
      in.g_mean_sq += v * v;
      in.g_max_abs = std::max(in.g_max_abs, std::fabs(v));
    }
    in.g_mean_sq /= count;
    in.scale_so_far = scale_so_far;
    return adaptive_layer_factor(in, f, opts.max_factor, opts.max_scale);
  }
  // The rounding statistics of the last sampled step (a grouped conv sums its groups'), and the
  // INT16 operator's figures of the last step (null unless int16).
  const SampledNumerics& sampled_numerics() const noexcept { return sample_; }
  const ConvStats* int16_stats() const noexcept { return q_ ? &q_->stats() : nullptr; }
  // Before build(): keep the weights, their gradient (and the bias and its gradient, when the
  // layer has one) in slices of tensors that a grouped convolution owns.
  void share_parameters(float* w, float* gw, size_t w_size, float* b, float* gb) {
    w_.view(w, w_size);
    gw_.view(gw, w_size);
    if (has_bias_) {
      b_.view(b, size_t(k_));
      gb_.view(gb, size_t(k_));
    }
  }

 protected:
  WeightedLayer(int k, bool bias) : k_(k), has_bias_(bias) {}
  // Allocates weights, gradients and the buffers of the policy's operator; creates the INT16
  // operator itself. Returns true when the subclass must create an FP32 operator (fp32, and the
  // bf16/fp16 layers that run it on rounded operands); a subclass that can run BF16 natively
  // sets native_bf16_ in its build() where wants_native_bf16() and simd::onednn::native_bf16_conv()
  // give it a primitive.
  bool plan(const Context& ctx, const ConvShape& shape, const TensorShape& in, const TensorShape& out,
            const PrecisionPolicy& policy) {
    ctx_ = &ctx;
    out_ = out;
    in_size_ = in.blocked_elements();
    out_size_ = out.blocked_elements();
    fan_in_ = double(shape.C) * shape.R * shape.S;
    w_.allocate(size_t(shape.K) * shape.C * shape.R * shape.S);
    gw_.allocate(w_.size());
    if (has_bias_) { b_.allocate(k_); gb_.allocate(k_); }
    prec_ = policy.resolve(name);
    if (prec_ == Precision::int16) {
      DfpConvOptions o = layer_dfp_options(policy, name);
      o.input_gradient = needs_input_grad.empty() || needs_input_grad[0];
      q_ = std::make_unique<ConvInt16>(ctx, shape, o, name);
      return false;
    }
    if (prec_ == Precision::bf16 || prec_ == Precision::fp16) {
      float_ = true;
      fmt_ = policy.class_formats(prec_);
      cls_ = layer_dfp_options(policy, name);
      if (fmt_.weights != FloatFormat::fp32) wr_ = AlignedBuffer<float>(w_.size());
    }
    return true;
  }
  // BF16 in all three classes: use BF16 operands in memory when the subclass supports it.
  bool wants_native_bf16() const {
    return float_ && fmt_.weights == FloatFormat::bf16 && fmt_.activations == FloatFormat::bf16 &&
           fmt_.gradients == FloatFormat::bf16;
  }
  // Buffers of the rounded-operand path (or of the native BF16 one).
  void allocate_operand_buffers() {
    if (!float_) return;
    if (native_bf16_) {
      xb_ = AlignedBuffer<uint16_t>(in_size_);
      dy_bytes_ = out_size_ * sizeof(uint16_t);
      return;
    }
    if (fmt_.activations != FloatFormat::fp32) xr_ = AlignedBuffer<float>(in_size_);
    if (fmt_.gradients != FloatFormat::fp32) dy_bytes_ = out_size_ * sizeof(float);
  }
  virtual void forward_f32(const float* x, float* y) = 0;
  virtual void backward_f32(const float* x, const float* dy, float* dx) = 0;  // dx may be null
  virtual void set_weights_f32(const float* w) = 0;
  virtual void forward_bf16(const uint16_t* x, float* y) {}
  virtual void backward_bf16(const uint16_t* dy, float* dx) {}  // dx may be null; uses the saved xb_
  virtual void set_weights_bf16(const float* w) {}
  virtual std::string operator_implementation() const = 0;  // of the fp32 or native bf16 operator

  void sample_int16_forward(const float* x) {
    sample_.sampled = true;
    sample_.x = measure_dfp16(*ctx_, x, in_size_, q_->stats().x.exponent);
    sample_.w = measure_dfp16(*ctx_, w_.data(), w_.size(), q_->stats().w.exponent);
  }

  const Context* ctx_ = nullptr;
  int k_;
  bool has_bias_;
  TensorShape out_;
  size_t in_size_ = 0, out_size_ = 0;
  double fan_in_ = 1;
  Precision prec_ = Precision::fp32;
  ParamStore w_, gw_, b_, gb_;
  std::unique_ptr<ConvInt16> q_;
  bool input_taken_ = false;  // q_'s input was quantized by the producer in this step
  bool float_ = false, native_bf16_ = false;
  PrecisionPolicy::ClassFormats fmt_{};
  DfpConvOptions cls_;                         // rounding and stochastic seeds per class
  AlignedBuffer<float> wr_, xr_;               // rounded operands (xr_ is kept for the weight gradient)
  AlignedBuffer<uint16_t> xb_;                 // native BF16 input, kept for the weight gradient
  float* dyr_ = nullptr;                       // rounded dy, in the shared workspace
  uint16_t* dyb_ = nullptr;                    // native BF16 dy, in the shared workspace
  size_t dy_bytes_ = 0;
  double w_mean_sq_ = 0, w_max_abs_ = 0;       // of the current weights (adaptive loss scaling)
  SampledNumerics sample_;
};

// The output shape of a convolution of k output channels with an r x r kernel over x.
TensorShape conv_output_shape(const std::string& name, const TensorShape& x, int k, int r, int stride, int pad) {
  DFP_CHECK(x.h + 2 * pad >= r && x.w + 2 * pad >= r, Status::invalid_argument,
            "conv '" + name + "': kernel " + std::to_string(r) + " larger than padded input " + std::to_string(x.h) +
                "x" + std::to_string(x.w));
  return {x.n, k, (x.h + 2 * pad - r) / stride + 1, (x.w + 2 * pad - r) / stride + 1};
}

// Kaiming normal with fan_out = K*R*S, for ReLU networks (torchvision's ResNet/VGG/ResNeXt
// initialisation; for a grouped weight [K][C/G][R][S] PyTorch's fan_out is K*R*S too).
template <class Range>
void init_kaiming_fan_out(Range& w, int fan_out, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.f, std::sqrt(2.f / float(fan_out)));
  for (auto& v : w) v = nd(rng);
}

class Conv2d final : public WeightedLayer {
 public:
  Conv2d(int k, int r, int stride, int pad, bool bias) : WeightedLayer(k, bias), r_(r), stride_(stride), pad_(pad) {}
  TensorShape infer(const std::vector<TensorShape>& in) const override {
    return conv_output_shape(name, in[0], k_, r_, stride_, pad_);
  }
  size_t count_parameters(const std::vector<TensorShape>& in) const override {
    return size_t(k_) * in[0].c * r_ * r_ + (has_bias_ ? k_ : 0);
  }
  // The weight gradient reads x; INT16 keeps its DFP16 copy, BF16 its BF16 copy, the rounded-
  // operand path its rounded copy: only plain FP32 needs the Model's.
  bool backward_reads_input(size_t) const override {
    return !q_ && !native_bf16_ && !(float_ && fmt_.activations != FloatFormat::fp32);
  }
  void build(const Context& ctx, const std::vector<TensorShape>& in, const TensorShape& out,
             const PrecisionPolicy& policy, std::mt19937_64& rng) override {
    ConvShape s;
    s.N = in[0].n; s.C = in[0].c; s.H = in[0].h; s.W = in[0].w;
    s.K = k_; s.R = s.S = r_;
    s.stride_h = s.stride_w = stride_;
    s.pad_h = s.pad_w = pad_;
    if (plan(ctx, s, in[0], out, policy)) {
      if (wants_native_bf16()) {
        bf_ = simd::onednn::native_bf16_conv(ctx, s, name);
        native_bf16_ = bf_.has_value();
      }
      if (!native_bf16_) f_ = std::make_unique<ConvF32>(ctx, s, name);
      allocate_operand_buffers();
    }
    if (!w_.shared()) init_kaiming_fan_out(w_, k_ * r_ * r_, rng);  // else the tensor's owner draws it
  }

 private:
  void forward_f32(const float* x, float* y) override { f_->forward(x, y); }
  void backward_f32(const float* x, const float* dy, float* dx) override {
    if (dx) f_->backward_data(dy, dx);
    f_->backward_weights(x, dy, gw_.data());
  }
  void set_weights_f32(const float* w) override { f_->set_weights(w); }
  void forward_bf16(const uint16_t* x, float* y) override { bf_->forward(x, y); }
  void backward_bf16(const uint16_t* dy, float* dx) override {
    if (dx) bf_->backward_data(dy, dx);
    bf_->backward_weights(xb_.data(), dy, gw_.data());
  }
  void set_weights_bf16(const float* w) override { bf_->set_weights(w); }
  std::string operator_implementation() const override {
    if (bf_)
      return "onednn:" + bf_->impl_forward() + " | onednn:" + bf_->impl_backward_data() + " | onednn:" +
             bf_->impl_backward_weights();
    return f_ ? f_->kernel_name() : "";
  }
  bool accepts_input_spans(size_t i) const override { return i == 0 && q_ && q_->accepts_input_spans(); }
  void take_input_spans(size_t, InputSpanFn fn, void* producer, float max_abs, const StepInfo& st) override {
    q_->set_step(st.step);
    q_->quantize_input_spans(fn, producer, max_abs);
    input_taken_ = true;
  }
  bool input_taken() const override { return input_taken_; }

  int r_, stride_, pad_;
  std::unique_ptr<ConvF32> f_;
  std::optional<simd::onednn::ConvPrimitives> bf_;
};

// ---- channel ranges: concat and grouped convolution -------------------------------------------
// Lanes l of a 16-channel block whose channel first + l lies in [0, c).
uint16_t lane_range(int first, int c) {
  uint16_t m = 0;
  for (int l = 0; l < 16; ++l) m |= uint16_t(first + l >= 0 && first + l < c) << l;
  return m;
}

// Channels [c0, c0 + part.c) of the blocked tensor `whole` <-> a blocked tensor of part.c
// channels. A range that starts inside a channel block reads (writes) the lanes of two blocks of
// the whole tensor for each of its own blocks: gathering is the shift_lanes kernel's two-block
// permute (padding lanes of `part` written zero); scattering writes only the range's lanes.
void gather_channels(const Context& ctx, const float* whole, const TensorShape& ws, int c0, float* part,
                     const TensorShape& ps) {
  const int pcb = cb_of(ps), wcb = cb_of(ws);
  const auto shift_lanes = ctx.kernels().shift_lanes.fn;
  for_blocks(ctx, ps.n, pcb, [&](int n, int b) {
    const int first = c0 + b * 16, blk = first / 16;
    auto block = [&](int i) { return i < wcb ? whole + (size_t(n) * wcb + i) * plane(ws) : nullptr; };
    shift_lanes(block(blk), block(blk + 1), first % 16, 1, part + (size_t(n) * pcb + b) * plane(ps), 1,
                size_t(ps.h) * ps.w, lane_range(b * 16, ps.c));
  });
}
void scatter_channels(const Context& ctx, const float* part, const TensorShape& ps, float* whole, const TensorShape& ws,
                      int c0, bool accumulate) {
  const int pcb = cb_of(ps), wcb = cb_of(ws);
  const size_t pixels = size_t(ps.h) * ps.w;
  // Tasks write disjoint channels (two tasks may share a block of the whole tensor, not a lane).
  for_blocks(ctx, ps.n, pcb, [&](int n, int b) {
    const float* s = part + (size_t(n) * pcb + b) * plane(ps);
    const int first = c0 + b * 16, lanes = std::min(16, ps.c - b * 16);
    const int off = first % 16, to_first = std::min(lanes, 16 - off);
    float* d0 = whole + (size_t(n) * wcb + first / 16) * plane(ws);
    float* d1 = d0 + plane(ws);
    // Contiguous runs: a whole aligned block at once, else per pixel lanes [0, to_first) into d0
    // and the rest into d1 (the mode chosen outside the loops).
    auto put = [accumulate](float* d, const float* src, size_t count) {
      if (accumulate)
        for (size_t l = 0; l < count; ++l) d[l] += src[l];
      else
        std::memcpy(d, src, count * sizeof(float));
    };
    if (off == 0 && lanes == 16) return put(d0, s, plane(ps));
    for (size_t i = 0; i < pixels; ++i) {
      put(d0 + i * 16 + off, s + i * 16, size_t(to_first));
      if (lanes > to_first) put(d1 + i * 16, s + i * 16 + to_first, size_t(lanes - to_first));
    }
  });
}

// Conv2d with groups > 1 (PyTorch's Conv2d(groups=G)): input channels and output channels are cut
// into G equal groups, and output group g sees input group g only. Each group is an ordinary
// Conv2d (every precision, all three passes) over channels gathered from the blocked input into
// a dense tensor of its own; its output is scattered back. The weight is one [K][C/G][R][S]
// parameter, the groups' weights one after the other (ParamStore). Under int16 each group's x,
// w and dy are DFP16 tensors with their own exponents: a shared exponent is per group here, as
// the groups never meet in one sum.
class GroupedConv2d final : public Layer {
 public:
  GroupedConv2d(int k, int r, int stride, int pad, bool bias, int groups)
      : k_(k), r_(r), stride_(stride), pad_(pad), bias_(bias), groups_(groups) {}
  TensorShape infer(const std::vector<TensorShape>& in) const override {
    const TensorShape& x = in[0];
    DFP_CHECK(groups_ >= 1, Status::invalid_argument,
              "conv '" + name + "': groups must be at least 1, got " + std::to_string(groups_));
    DFP_CHECK(x.c % groups_ == 0 && k_ % groups_ == 0, Status::invalid_argument,
              "conv '" + name + "': groups " + std::to_string(groups_) + " must divide both the input channels (" +
                  std::to_string(x.c) + ") and the output channels (" + std::to_string(k_) + ")");
    return conv_output_shape(name, x, k_, r_, stride_, pad_);
  }
  size_t count_parameters(const std::vector<TensorShape>& in) const override {
    return size_t(k_) * (in[0].c / groups_) * r_ * r_ + (bias_ ? k_ : 0);
  }
  bool backward_reads_input(size_t) const override {
    return convs_.empty() || convs_.front()->backward_reads_input(0);  // before build(): as FP32
  }
  void build(const Context& ctx, const std::vector<TensorShape>& in, const TensorShape& out,
             const PrecisionPolicy& policy, std::mt19937_64& rng) override {
    in_ = in[0];
    out_ = out;
    part_in_ = {in_.n, in_.c / groups_, in_.h, in_.w};
    part_out_ = {out_.n, k_ / groups_, out_.h, out_.w};
    const size_t wg = size_t(part_out_.c) * part_in_.c * r_ * r_;
    w_.assign(wg * groups_, 0.f);
    gw_.assign(w_.size(), 0.f);
    if (bias_) { b_.assign(k_, 0.f); gb_.assign(k_, 0.f); }
    // The groups run at the precision the policy gives this layer's name (their own names, which
    // no override was written for, only seed their rounding streams).
    PrecisionPolicy group_policy = policy;
    group_policy.overrides.clear();
    group_policy.precision = policy.resolve(name);
    convs_.clear();
    size_t ws = 0;
    for (int g = 0; g < groups_; ++g) {
      auto c = std::make_unique<Conv2d>(part_out_.c, r_, stride_, pad_, bias_);
      c->name = name + ".group" + std::to_string(g);
      c->kind = kind;
      c->needs_input_grad = needs_input_grad;
      c->share_parameters(w_.data() + g * wg, gw_.data() + g * wg, wg, bias_ ? b_.data() + g * part_out_.c : nullptr,
                          bias_ ? gb_.data() + g * part_out_.c : nullptr);
      c->build(ctx, {part_in_}, part_out_, group_policy, rng);  // draws no weights: they are shared
      ws = std::max(ws, c->workspace_bytes());
      convs_.push_back(std::move(c));
    }
    init_kaiming_fan_out(w_, k_ * r_ * r_, rng);
    // Workspace: the group's x, its y or dy, its dx, then the group convolution's own scratch.
    auto aligned = [](size_t bytes) { return (bytes + 63) / 64 * 64; };
    x_off_ = 0;
    y_off_ = aligned(part_in_.blocked_elements() * sizeof(float));
    dx_off_ = y_off_ + aligned(part_out_.blocked_elements() * sizeof(float));
    inner_off_ = dx_off_ + (wants_dx() ? aligned(part_in_.blocked_elements() * sizeof(float)) : 0);
    workspace_ = inner_off_ + ws;
  }
  size_t workspace_bytes() const override { return workspace_; }
  void use_workspace(void* region) override {
    base_ = static_cast<char*>(region);
    for (auto& c : convs_)
      if (c->workspace_bytes()) c->use_workspace(base_ + inner_off_);
  }
  void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo& st) override {
    float* xg = part(x_off_);
    float* yg = part(y_off_);
    const StepInfo gs = group_step(st);
    for (int g = 0; g < groups_; ++g) {
      gather_channels(ctx, x[0], in_, g * part_in_.c, xg, part_in_);
      xs_[0] = xg;
      convs_[g]->forward(ctx, xs_, yg, gs);
      scatter_channels(ctx, yg, part_out_, y, out_, g * part_out_.c, false);
    }
    zero_padding_lanes(ctx, y, out_);
  }
  void backward(const Context& ctx, const std::vector<const float*>& x, const float* y, const float* dy,
                const std::vector<float*>& dx, const StepInfo& st) override {
    float* xg = part(x_off_);
    float* dyg = part(y_off_);
    float* dxg = dx[0] ? part(dx_off_) : nullptr;
    const bool reads_x = backward_reads_input(0);
    const bool accumulate = st.accumulate_dx & 1;
    const StepInfo gs = group_step(st);
    // dx[0] may be dy's own buffer (a residual Add's shared gradient, K == C): group g reads its dy
    // channels here, before it writes the same channels of dx below, and no later group reads them.
    for (int g = 0; g < groups_; ++g) {
      gather_channels(ctx, dy, out_, g * part_out_.c, dyg, part_out_);
      if (reads_x) gather_channels(ctx, x[0], in_, g * part_in_.c, xg, part_in_);
      xs_[0] = reads_x ? xg : nullptr;
      dxs_[0] = dxg;
      convs_[g]->backward(ctx, xs_, nullptr, dyg, dxs_, gs);
      if (dxg) scatter_channels(ctx, dxg, part_in_, dx[0], in_, g * part_in_.c, accumulate);
    }
    if (dx[0] && !accumulate) zero_padding_lanes(ctx, dx[0], in_);
  }
  bool accumulates_input_grad(size_t) const override { return true; }
  void parameters(std::vector<Parameter>& out) override {
    out.push_back({name + ".weight", w_.data(), gw_.data(), w_.size(), true});
    if (bias_) out.push_back({name + ".bias", b_.data(), gb_.data(), b_.size(), true});
  }
  void weights_updated(uint64_t step, std::span<const float>) override {
    // The whole tensor's maximum is not a group's: each group measures its own.
    for (auto& c : convs_) c->weights_updated(step, {});
  }
  const char* precision() const override { return convs_.empty() ? "fp32" : convs_.front()->precision(); }
  double adaptive_factor(const Context& ctx, const float* dy, double scale_so_far,
                         const AdaptiveScaling& opts) const override {
    // One factor for the layer, as for an ungrouped one: dy whole, the weights' statistics over
    // all groups (equal sizes: E[w^2] is the groups' mean).
    AdaptiveInputs in;
    FloatFormat f;
    if (!convs_.front()->adaptive_weight_inputs(in, f)) return 1;
    for (size_t g = 1; g < convs_.size(); ++g) {
      AdaptiveInputs gi;
      convs_[g]->adaptive_weight_inputs(gi, f);
      in.w_mean_sq += gi.w_mean_sq;
      in.w_max_abs = std::max(in.w_max_abs, gi.w_max_abs);
    }
    in.w_mean_sq /= double(convs_.size());
    return Conv2d::adaptive_factor_over(dy, out_, in, f, scale_so_far, opts);
  }
  // The groups' figures as one layer's: the exponents of the groups with the largest magnitudes
  // (those one shared exponent would take; an all-zero group's exponent 0 says nothing), the
  // shortest chains, counts summed, and the rounding statistics of the whole tensors (signal and
  // noise summed over the groups, as an ungrouped layer measures them).
  bool numerics(LayerNumerics& out) const override {
    if (convs_.empty() || !convs_.front()->numerics(out)) return false;  // name and format
    if (const ConvStats* first = convs_.front()->int16_stats()) {
      ConvStats whole = *first;
      auto widest = [](QuantStats& into, const QuantStats& g) {
        const uint64_t saturated = into.saturated + g.saturated;
        if (g.max_abs > into.max_abs) into = g;
        into.saturated = saturated;
      };
      for (size_t g = 1; g < convs_.size(); ++g) {
        const ConvStats& s = *convs_[g]->int16_stats();
        widest(whole.x, s.x);
        widest(whole.w, s.w);
        widest(whole.dy, s.dy);
        whole.chain_fwd = std::min(whole.chain_fwd, s.chain_fwd);
        whole.chain_bwd = std::min(whole.chain_bwd, s.chain_bwd);
        whole.chain_wgrad = std::min(whole.chain_wgrad, s.chain_wgrad);
        whole.overflow_events += s.overflow_events;
      }
      report_numerics(whole, name, out);
    }
    SampledNumerics sampled = convs_.front()->sampled_numerics();
    for (size_t g = 1; g < convs_.size(); ++g) {
      const SampledNumerics& s = convs_[g]->sampled_numerics();
      sampled.sampled = sampled.sampled && s.sampled;
      sampled.x.add(s.x);
      sampled.w.add(s.w);
      sampled.dy.add(s.dy);
    }
    report_sample(sampled, out);
    out.layer = name;
    return true;
  }

 private:
  bool wants_dx() const { return needs_input_grad.empty() || needs_input_grad[0]; }
  float* part(size_t offset) const { return reinterpret_cast<float*>(base_ + offset); }
  // The maxima a neighbour measured are those of the whole tensor, not of a group's; each group
  // writes its own dx, which backward() then adds or copies.
  static StepInfo group_step(StepInfo st) {
    st.input_max_abs = -1.f;
    st.grad_max_abs = -1.f;
    st.accumulate_dx = 0;
    return st;
  }

  int k_, r_, stride_, pad_;
  bool bias_;
  int groups_;
  TensorShape in_, out_, part_in_, part_out_;
  std::vector<float> w_, gw_, b_, gb_;
  std::vector<std::unique_ptr<Conv2d>> convs_;
  std::vector<const float*> xs_ = {nullptr};  // the group's operands (a step allocates nothing)
  std::vector<float*> dxs_ = {nullptr};
  size_t x_off_ = 0, y_off_ = 0, dx_off_ = 0, inner_off_ = 0, workspace_ = 0;
  char* base_ = nullptr;
};

class Linear final : public WeightedLayer {
 public:
  Linear(int k, bool bias) : WeightedLayer(k, bias) {}
  TensorShape infer(const std::vector<TensorShape>& in) const override {
    DFP_CHECK(in[0].h == 1 && in[0].w == 1, Status::invalid_argument,
              "linear '" + name + "': input must be flat (N x F x 1 x 1); add flatten() or global_avgpool() first");
    return {in[0].n, k_, 1, 1};
  }
  size_t count_parameters(const std::vector<TensorShape>& in) const override {
    return size_t(k_) * in[0].c + (has_bias_ ? k_ : 0);
  }
  void build(const Context& ctx, const std::vector<TensorShape>& in, const TensorShape& out,
             const PrecisionPolicy& policy, std::mt19937_64& rng) override {
    n_ = in[0].n;
    f_in_ = in[0].c;
    ConvShape s;
    s.N = n_; s.C = f_in_; s.K = k_;  // 1x1 kernel over a 1x1 image
    if (plan(ctx, s, in[0], out, policy)) {
      // oneDNN's inner product reads dense rows; the blocked rows are padded to 16 features.
      f_ = std::make_unique<LinearF32>(ctx, n_, f_in_, k_, name);
      rows_x_ = AlignedBuffer<float>(size_t(n_) * f_in_);
      rows_y_ = AlignedBuffer<float>(size_t(n_) * k_);
      rows_dx_ = AlignedBuffer<float>(size_t(n_) * f_in_);
      allocate_operand_buffers();  // BF16 too runs on rounded operands here: the layer is small
    }
    // PyTorch's nn.Linear default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and bias.
    const float bound = 1.f / std::sqrt(float(f_in_));
    std::uniform_real_distribution<float> ud(-bound, bound);
    for (auto& v : w_) v = ud(rng);
    for (auto& v : b_) v = ud(rng);
  }

 private:
  static void to_rows(const float* blk, float* rows, int n, int f) {
    const int fp = channel_blocks(f) * 16;
    for (int i = 0; i < n; ++i) std::memcpy(rows + size_t(i) * f, blk + size_t(i) * fp, sizeof(float) * f);
  }
  static void from_rows(const float* rows, float* blk, int n, int f) {
    const int fp = channel_blocks(f) * 16;
    for (int i = 0; i < n; ++i) {
      std::memcpy(blk + size_t(i) * fp, rows + size_t(i) * f, sizeof(float) * f);
      std::fill(blk + size_t(i) * fp + f, blk + size_t(i + 1) * fp, 0.f);
    }
  }
  void forward_f32(const float* x, float* y) override {
    to_rows(x, rows_x_.data(), n_, f_in_);
    f_->forward(rows_x_.data(), rows_y_.data());
    from_rows(rows_y_.data(), y, n_, k_);
  }
  void backward_f32(const float* x, const float* dy, float* dx) override {
    to_rows(dy, rows_y_.data(), n_, k_);  // rows_x_ still holds this step's input
    if (dx) {
      f_->backward_data(rows_y_.data(), rows_dx_.data());
      from_rows(rows_dx_.data(), dx, n_, f_in_);
    }
    f_->backward_weights(rows_x_.data(), rows_y_.data(), gw_.data());
  }
  void set_weights_f32(const float* w) override { f_->set_weights(w); }
  std::string operator_implementation() const override { return f_ ? f_->kernel_name() : ""; }

  int n_ = 0, f_in_ = 0;
  AlignedBuffer<float> rows_x_, rows_y_, rows_dx_;
  std::unique_ptr<LinearF32> f_;
};

// ---- BatchNorm2d ----------------------------------------------------------------------------

// Per-channel reductions run over (channel block, batch slice) tasks with a fixed number of
// slices, summed in slice order: both cores work even on a 16-channel layer, and results do not
// depend on the thread count. Within a task, runs of kRun pixels are reduced in FP32 lanes and
// combined in FP64: the forward statistics as each run's mean and squared deviations about it
// (bn_moments, Chan et al.), the backward sums as plain run totals (the error of a 256-term FP32
// sum at most).
class BatchNorm final : public Layer {
 public:
  TensorShape infer(const std::vector<TensorShape>& in) const override { return in[0]; }
  void build(const Context&, const std::vector<TensorShape>& in, const TensorShape&, const PrecisionPolicy& policy,
             std::mt19937_64&) override {
    s_ = in[0];
    const int cp = cb_of(s_) * 16;  // padded channels: padding lanes have gamma 0, so output 0
    gamma_.assign(cp, 0.f);
    std::fill(gamma_.begin(), gamma_.begin() + s_.c, 1.f);
    beta_.assign(cp, 0.f);
    ggamma_.assign(cp, 0.f);
    gbeta_.assign(cp, 0.f);
    running_mean_.assign(s_.c, 0.f);
    running_var_.assign(s_.c, 1.f);
    mean_.assign(cp, 0.f);
    invstd_.assign(cp, 0.f);
    slices_ = std::min(kSlices, s_.n);
    k1_.assign(cp, 0.f);
    k2_.assign(cp, 0.f);
    k3_.assign(cp, 0.f);
    part_a_.assign(size_t(cb_of(s_)) * slices_ * 16, 0.0);
    part_b_.assign(part_a_.size(), 0.0);
    part_n_.assign(size_t(cb_of(s_)) * slices_, 0.0);
    part_min_.assign(part_a_.size(), 0.f);
    part_max_.assign(part_a_.size(), 0.f);
    fa_.assign(cp, 0.f);
    lo_.assign(cp, 0.f);
    hi_.assign(cp, 0.f);
    fb_.assign(cp, 0.f);
    if (relu_) mask_ = AlignedBuffer<uint16_t>(s_.blocked_elements() / 16);
    // INT16 policy: the input saved for backward is kept as DFP16 (Das et al. keep every saved
    // activation in 16 bits); the statistics and the arithmetic stay FP32.
    if (policy.resolve(name) == Precision::int16) {
      xq_ = AlignedBuffer<int16_t>(s_.blocked_elements());
      xq_opts_ = policy.dfp.activations;
      xq_opts_.seed ^= std::hash<std::string>{}(name + ".saved_input");
    }
  }
  bool backward_reads_input(size_t) const override { return xq_.size() == 0; }
  // Fused ReLU: y = max(0, bn(x)) with the ReLU's bit mask (bit set: bn(x) > 0, the same test as
  // the ReLU kernels), and backward masks dy as it reads it. Bit-identical to BN then ReLU.
  bool absorb_relu() override {
    relu_ = true;
    return true;
  }
  // With the ReLU fused, the forward measures max|y| (the ReLU kernel returns it); the backward
  // always measures max|dx| (the apply kernel returns it).
  float output_max_abs() const override { return out_max_; }
  float input_grad_max_abs() const override { return in_grad_max_; }
  bool forward_in_place(size_t) const override { return true; }
  bool backward_in_place(size_t) const override { return true; }  // dx after all the sums
  // The output's largest magnitude follows from each channel's extremes before the fact (y = x *
  // a + b is monotonic in x, and its rounding too), so the consumer (an INT16 conv, which needs
  // it first, or a residual Add) can take the output as spans (see Layer::feed_spans_to).
  bool feed_spans_to(Layer* consumer, size_t slot) override {
    consumer_ = consumer;
    consumer_slot_ = slot;
    return true;
  }
  void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo& st) override {
    const int CB = cb_of(s_);
    const size_t hw = size_t(s_.h) * s_.w;
    const bool save_q = st.train && xq_.size() > 0;
    if (st.train) {
      const double m = double(s_.n) * hw;
      // One pass: each channel's mean, sum of squared deviations and extremes, and max|x|.
      moments(ctx, x[0]);
      float mx = 0.f;  // max|x|
      for (int c = 0; c < CB * 16; ++c) {  // combined over the slices, in slice order
        double mean = 0, m2 = 0, count = 0;
        lo_[c] = std::numeric_limits<float>::infinity();
        hi_[c] = -lo_[c];
        for (int sl = 0; sl < slices_; ++sl) {
          const size_t t = size_t(c / 16) * slices_ + sl, i = t * 16 + c % 16;
          combine_moments(mean, m2, count, part_a_[i], part_b_[i], part_n_[t]);
          count += part_n_[t];
          lo_[c] = part_min_[i] < lo_[c] ? part_min_[i] : lo_[c];
          hi_[c] = part_max_[i] > hi_[c] ? part_max_[i] : hi_[c];
        }
        mx = hi_[c] > mx ? hi_[c] : mx;
        mx = -lo_[c] > mx ? -lo_[c] : mx;
        const double var = m2 / m;
        mean_[c] = static_cast<float>(mean);
        invstd_[c] = static_cast<float>(1.0 / std::sqrt(var + kEps));
        if (c < s_.c) {  // PyTorch: running var uses the unbiased estimate
          running_mean_[c] = (1 - kMomentum) * running_mean_[c] + kMomentum * mean_[c];
          running_var_[c] = static_cast<float>((1 - kMomentum) * running_var_[c] +
                                               kMomentum * var * m / std::max(1.0, m - 1));
        }
      }
      if (save_q) xq_exp_ = dfp16_exponent(std::isfinite(mx) ? mx : 0.f, xq_opts_.headroom);
    } else {
      for (int c = 0; c < cb_of(s_) * 16; ++c) {
        mean_[c] = c < s_.c ? running_mean_[c] : 0.f;
        invstd_[c] = c < s_.c ? 1.f / std::sqrt(running_var_[c] + kEps) : 0.f;
      }
    }
    for (int c = 0; c < CB * 16; ++c) {
      fa_[c] = gamma_[c] * invstd_[c];
      fb_[c] = beta_[c] - mean_[c] * fa_[c];
    }
    span_ = {x[0], save_q, step_seed(xq_opts_.seed, st.step), &ctx};
    if (consumer_ && st.train && !st.sample) {
      // Fused into the consumer: max|y| from each channel's extremes, through the same kernels as
      // the values themselves, then the spans on request.
      const auto scale_shift = ctx.kernels().bn_scale_shift.fn;
      float mx = 0.f;
      for (int blk = 0; blk < CB; ++blk) {
        alignas(64) float ext[2][16], z[2][16];
        std::copy_n(lo_.data() + blk * 16, 16, ext[0]);
        std::copy_n(hi_.data() + blk * 16, 16, ext[1]);
        scale_shift(&ext[0][0], &z[0][0], fa_.data() + blk * 16, fb_.data() + blk * 16, 2);
        for (int l = 0; l < 16; ++l)
          for (int k = 0; k < 2; ++k) {
            const float v = relu_ ? z[k][l] : std::fabs(z[k][l]);  // the ReLU's max: from 0
            mx = v > mx ? v : mx;                                   // NaN never wins
          }
      }
      out_max_ = relu_ ? mx : -1.f;
      consumer_->take_input_spans(consumer_slot_, &BatchNorm::produce_span, this, mx, st);
      return;
    }
    std::atomic<float> out_max{0.f};
    for_blocks(ctx, s_.n, CB, [&](int n, int blk) {
      const size_t off = (size_t(n) * CB + blk) * plane(s_);
      atomic_max(out_max, normalize(off, blk, hw, y + off));  // y may overwrite x (in place)
    });
    out_max_ = relu_ ? out_max.load() : -1.f;
  }
  void backward(const Context& ctx, const std::vector<const float*>& x, const float* y, const float* dy,
                const std::vector<float*>& dx, const StepInfo& st) override {
    if (xq_.size()) backward_from(ctx, xq_.data(), std::ldexp(1.f, xq_exp_), dy, dx[0]);
    else backward_from(ctx, x[0], 1.f, dy, dx[0]);
  }
  void parameters(std::vector<Parameter>& out) override {
    // The padded lanes are part of the storage; their gradient is always 0, so they stay 0.
    out.push_back({name + ".weight", gamma_.data(), ggamma_.data(), gamma_.size(), true});
    out.push_back({name + ".bias", beta_.data(), gbeta_.data(), beta_.size(), true});
  }
  size_t count_parameters(const std::vector<TensorShape>& in) const override { return 2 * size_t(in[0].c); }
  void buffers(std::vector<std::pair<std::string, std::vector<float>*>>& out) override {
    out.push_back({name + ".running_mean", &running_mean_});
    out.push_back({name + ".running_var", &running_var_});
  }

 private:
  static constexpr int kSlices = 8;
  static constexpr size_t kRun = 256;

  // The forward's work on `pixels` pixels of channel block blk from element off of x (as of the
  // current forward, span_): the saved DFP16 copy, y = x * a + b into out, and the fused ReLU with
  // its mask. Returns the ReLU's max (0 without it).
  float normalize(size_t off, int blk, size_t pixels, float* out) {
    const Context& ctx = *span_.ctx;
    const float* p = span_.x + off;
    if (span_.save_q) {  // before out, which may overwrite x (in place)
      simd::QuantCounters cnt;
      ctx.kernels().quantize.fn(p, xq_.data() + off, pixels * 16, xq_exp_, xq_opts_.rounding, span_.qseed, off, &cnt);
    }
    ctx.kernels().bn_scale_shift.fn(p, out, fa_.data() + blk * 16, fb_.data() + blk * 16, pixels);
    return relu_ ? ctx.kernels().relu_fwd.fn(out, out, mask_.data() + off / 16, pixels * 16) : 0.f;  // in cache
  }
  static void produce_span(void* self, int n, int b, int h, int w0, int count, float* out) {
    BatchNorm& bn = *static_cast<BatchNorm*>(self);
    const size_t off = (size_t(n) * cb_of(bn.s_) + b) * plane(bn.s_) + (size_t(h) * bn.s_.w + w0) * 16;
    bn.normalize(off, b, size_t(count), out);
  }

  // Per (channel block, batch slice) task: runs of at most kRun pixels of each plane through
  // bn_moments (one pass over memory), combined in FP64 in run order: part_a_ the mean and part_b_
  // the sum of squared deviations per lane over part_n_ values, part_min_ and part_max_ the extremes.
  void moments(const Context& ctx, const float* x) {
    std::fill(part_min_.begin(), part_min_.end(), std::numeric_limits<float>::infinity());
    std::fill(part_max_.begin(), part_max_.end(), -std::numeric_limits<float>::infinity());
    const int S = slices_, CB = cb_of(s_);
    const size_t hw = size_t(s_.h) * s_.w;
    const auto run_moments = ctx.kernels().bn_moments.fn;
    ctx.parallel_for(int64_t(CB) * S, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int blk = int(t / S), sl = int(t % S);
        double* A = part_a_.data() + size_t(t) * 16;
        double* B = part_b_.data() + size_t(t) * 16;
        std::fill(A, A + 16, 0.0);
        std::fill(B, B + 16, 0.0);
        double count = 0;
        for (int n = sl * s_.n / S; n < (sl + 1) * s_.n / S; ++n) {
          const size_t off = (size_t(n) * CB + blk) * plane(s_);
          for (size_t i0 = 0; i0 < hw; i0 += kRun) {
            const size_t np = std::min(hw, i0 + kRun) - i0;
            alignas(64) float c[16], d[16], q[16];
            run_moments(x + off + i0 * 16, np, c, d, q, part_min_.data() + size_t(t) * 16,
                        part_max_.data() + size_t(t) * 16);
            const double r = double(np);
            for (int l = 0; l < 16; ++l) {
              const double dev = d[l];  // the run's mean and squared deviations about it
              combine_moments(A[l], B[l], count, double(c[l]) + dev / r, std::max(0.0, double(q[l]) - dev * dev / r), r);
            }
            count += r;
          }
        }
        part_n_[size_t(t)] = count;
      }
    });
  }
  // Adds a part of `count_b` values with mean mean_b and sum of squared deviations m2_b to one of
  // `count` values (Chan, Golub and LeVeque's pairwise update).
  static void combine_moments(double& mean, double& m2, double count, double mean_b, double m2_b, double count_b) {
    const double total = count + count_b, delta = mean_b - mean;
    mean += delta * (count_b / total);
    m2 += m2_b + delta * delta * (count * count_b / total);
  }

  // Backward's sums: calls term(blk, first element, pixels, a[16], b[16]) over runs of at most
  // kRun pixels of every plane, accumulating into FP32 lanes that each run starts at zero, then
  // adds each run's lanes into the FP64 partials part_a_, part_b_ per (channel block, batch slice,
  // lane).
  template <class Term>
  void reduce(const Context& ctx, Term term) {
    std::fill(part_a_.begin(), part_a_.end(), 0.0);
    std::fill(part_b_.begin(), part_b_.end(), 0.0);
    const int S = slices_, CB = cb_of(s_);
    const size_t hw = size_t(s_.h) * s_.w;
    ctx.parallel_for(int64_t(CB) * S, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int blk = int(t / S), sl = int(t % S);
        double* A = part_a_.data() + size_t(t) * 16;
        double* B = part_b_.data() + size_t(t) * 16;
        for (int n = sl * s_.n / S; n < (sl + 1) * s_.n / S; ++n) {
          const size_t off = (size_t(n) * CB + blk) * plane(s_);
          for (size_t i0 = 0; i0 < hw; i0 += kRun) {
            alignas(64) float fa[16] = {}, fb[16] = {};
            term(blk, off + i0 * 16, std::min(hw, i0 + kRun) - i0, fa, fb);
            for (int l = 0; l < 16; ++l) { A[l] += fa[l]; B[l] += fb[l]; }
          }
        }
      }
    });
  }
  // Channel c's total over the slices, in slice order.
  double total(const std::vector<double>& part, int c) const {
    double t = 0;
    for (int sl = 0; sl < slices_; ++sl) t += part[(size_t(c / 16) * slices_ + sl) * 16 + c % 16];
    return t;
  }

  // x[i] * x_scale is the saved input (FP32, or DFP16 with x_scale = 2^e).
  template <class T>
  void backward_from(const Context& ctx, const T* x, float x_scale, const float* dy, float* dx) {
    const int CB = cb_of(s_);
    const size_t hw = size_t(s_.h) * s_.w;
    const double m = double(s_.n) * hw;
    const float *mean = mean_.data(), *inv = invstd_.data();
    // Fused ReLU: the kernels read dy through its mask (0 where the ReLU blocked it).
    const uint16_t* mask = relu_ ? mask_.data() : nullptr;
    auto coefficients = [&](int blk) {
      return simd::BnCoefficients{mean + blk * 16, inv + blk * 16, k1_.data() + blk * 16, k2_.data() + blk * 16,
                                  k3_.data() + blk * 16, x_scale};
    };
    auto term = [&](int blk, size_t e, size_t np, float* sdy, float* sdyx) {
      const uint16_t* m = mask ? mask + e / 16 : nullptr;
      if constexpr (std::is_same_v<T, int16_t>)
        ctx.kernels().bn_bwd_sums_s16.fn(x + e, dy + e, m, coefficients(blk), np, sdy, sdyx);
      else
        ctx.kernels().bn_bwd_sums_f32.fn(x + e, dy + e, m, coefficients(blk), np, sdy, sdyx);
    };
    reduce(ctx, term);
    for (int c = 0; c < CB * 16; ++c) {
      const double sdy = total(part_a_, c), sdyx = total(part_b_, c);
      ggamma_[c] = c < s_.c ? static_cast<float>(sdyx) : 0.f;
      gbeta_[c] = c < s_.c ? static_cast<float>(sdy) : 0.f;
      // dx = gamma*inv/m * (m*dy - sum(dy) - xhat*sum(dy*xhat))
      k1_[c] = gamma_[c] * invstd_[c];
      k2_[c] = static_cast<float>(sdy / m);
      k3_[c] = static_cast<float>(sdyx / m);
    }
    in_grad_max_ = -1.f;
    if (!dx) return;
    std::atomic<float> dx_max{0.f};
    for_blocks(ctx, s_.n, CB, [&](int n, int blk) {
      const size_t off = (size_t(n) * CB + blk) * plane(s_);
      // dx may be dy (in place): each element is read before it is written.
      const uint16_t* mp = mask ? mask + off / 16 : nullptr;
      float m;
      if constexpr (std::is_same_v<T, int16_t>)
        m = ctx.kernels().bn_bwd_apply_s16.fn(x + off, dy + off, mp, dx + off, coefficients(blk), hw, 0.f);
      else
        m = ctx.kernels().bn_bwd_apply_f32.fn(x + off, dy + off, mp, dx + off, coefficients(blk), hw, 0.f);
      atomic_max(dx_max, m);
    });
    in_grad_max_ = dx_max.load();
  }

  static constexpr double kEps = 1e-5, kMomentum = 0.1;
  TensorShape s_;
  std::vector<float> gamma_, beta_, ggamma_, gbeta_, running_mean_, running_var_, mean_, invstd_;
  std::vector<float> k1_, k2_, k3_;  // backward's per-channel coefficients
  int slices_ = 1;
  std::vector<double> part_a_, part_b_;  // per (channel block, slice, lane)
  std::vector<double> part_n_;           // forward: values per (channel block, slice)
  std::vector<float> part_min_, part_max_;
  std::vector<float> fa_, fb_;           // forward: y = x * fa_ + fb_ per channel
  std::vector<float> lo_, hi_;           // forward (training): each channel's min and max of x
  struct Span {                          // what normalize() reads, set by each forward()
    const float* x = nullptr;
    bool save_q = false;
    uint64_t qseed = 0;
    const Context* ctx = nullptr;
  } span_;
  Layer* consumer_ = nullptr;            // takes the output as spans (feed_spans_to)
  size_t consumer_slot_ = 0;             // as its input consumer_slot_
  AlignedBuffer<int16_t> xq_;  // the saved input as DFP16 (INT16 policy), exponent xq_exp_
  int xq_exp_ = 0;
  QuantOptions xq_opts_;
  bool relu_ = false;              // the following ReLU is applied here
  AlignedBuffer<uint16_t> mask_;   // its bit mask (relu_ only)
  float out_max_ = -1.f, in_grad_max_ = -1.f;
};

// ---- ReLU ---------------------------------------------------------------------------------

class Relu final : public Layer {
 public:
  TensorShape infer(const std::vector<TensorShape>& in) const override { return in[0]; }
  bool forward_in_place(size_t) const override { return true; }
  bool backward_in_place(size_t) const override { return true; }
  void pass_through() override { through_ = true; }
  float output_max_abs() const override { return out_max_; }
  float input_grad_max_abs() const override { return in_grad_max_; }
  void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo& st) override {
    const size_t n = n_elems_;
    if (through_) {  // the producer applied it; in place (the usual plan) there is nothing to do
      if (y != x[0]) std::memcpy(y, x[0], n * sizeof(float));
      out_max_ = st.input_max_abs;
      return;
    }
    const auto fn = ctx.kernels().relu_fwd.fn;
    const float* src = x[0];
    uint16_t* mask = mask_.data();
    std::atomic<float> mx{0.f};
    for_chunks(ctx, n, [&](size_t b, size_t e) { atomic_max(mx, fn(src + b, y + b, mask + b / 16, e - b)); });
    out_max_ = mx.load();
  }
  void backward(const Context& ctx, const std::vector<const float*>&, const float*, const float* dy,
                const std::vector<float*>& dx, const StepInfo& st) override {
    in_grad_max_ = -1.f;
    if (!dx[0]) return;
    const size_t n = n_elems_;
    if (through_) {  // the producer masks the gradient
      if (dx[0] != dy) std::memcpy(dx[0], dy, n * sizeof(float));
      in_grad_max_ = st.grad_max_abs;
      return;
    }
    mask_gradient(ctx, mask_.data(), dy, dx[0], n);
  }
  void build(const Context&, const std::vector<TensorShape>& in, const TensorShape&, const PrecisionPolicy&,
             std::mt19937_64&) override {
    n_elems_ = in[0].blocked_elements();
    if (!through_) mask_ = AlignedBuffer<uint16_t>((n_elems_ + 15) / 16);
  }

 private:
  size_t n_elems_ = 0;
  bool through_ = false;          // the producer applies the ReLU (absorb_relu)
  AlignedBuffer<uint16_t> mask_;  // bit i: x[i] > 0, all that backward needs
  float out_max_ = -1.f, in_grad_max_ = -1.f;
};

// ---- pooling ------------------------------------------------------------------------------

class Pool final : public Layer {
 public:
  Pool(bool max, int k, int s, int p, bool ceil_mode) : max_(max), k_(k), s_(s), p_(p), ceil_(ceil_mode) {}
  int out_dim(int in) const {
    int o = ceil_ ? (in + 2 * p_ - k_ + s_ - 1) / s_ + 1 : (in + 2 * p_ - k_) / s_ + 1;
    if (ceil_ && (o - 1) * s_ >= in + p_) --o;  // PyTorch: the last window must start inside
    return o;
  }
  TensorShape infer(const std::vector<TensorShape>& in) const override {
    DFP_CHECK(in[0].h + 2 * p_ >= k_ && in[0].w + 2 * p_ >= k_, Status::invalid_argument,
              "pool '" + name + "': window larger than the padded input");
    return {in[0].n, in[0].c, out_dim(in[0].h), out_dim(in[0].w)};
  }
  void build(const Context&, const std::vector<TensorShape>& in, const TensorShape& out, const PrecisionPolicy&,
             std::mt19937_64&) override {
    in_ = in[0];
    out_ = out;
    if (max_) {
      DFP_CHECK(k_ * k_ < kNoTap, Status::invalid_argument,
                "maxpool '" + name + "': window " + std::to_string(k_) + "x" + std::to_string(k_) +
                    " has more taps than the saved argmax can name (at most 15x15)");
      argmax_ = AlignedBuffer<uint8_t>(out.blocked_elements());
    }
  }
  void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo&) override {
    for_blocks(ctx, in_.n, cb_of(in_), [&](int n, int blk) {
      const float* p = x[0] + (size_t(n) * cb_of(in_) + blk) * plane(in_);
      const size_t out_off = (size_t(n) * cb_of(out_) + blk) * plane(out_);
      float* q = y + out_off;
      for (int oh = 0; oh < out_.h; ++oh)
        for (int ow = 0; ow < out_.w; ++ow) {
          const size_t o = (size_t(oh) * out_.w + ow) * 16;
          if (max_) {
            // The first maximum in window order (row-major) gets the gradient: its tap is saved.
            float acc[16];
            uint8_t arg[16];
            for (int l = 0; l < 16; ++l) { acc[l] = -std::numeric_limits<float>::infinity(); arg[l] = kNoTap; }
            bool first = true;
            for_window(oh, ow, [&](size_t off, int tap) {
              const float* v = p + off;
              if (first) {  // the first tap is taken as it is (NaN included)
                for (int l = 0; l < 16; ++l) { acc[l] = v[l]; arg[l] = uint8_t(tap); }
                first = false;
                return;
              }
              for (int l = 0; l < 16; ++l) {  // branch-free, so the lanes vectorise
                const bool gt = v[l] > acc[l];
                acc[l] = gt ? v[l] : acc[l];
                arg[l] = gt ? uint8_t(tap) : arg[l];
              }
            });
            std::memcpy(q + o, acc, sizeof acc);
            std::memcpy(argmax_.data() + out_off + o, arg, sizeof arg);
          } else {
            float acc[16] = {};
            for_window(oh, ow, [&](size_t off, int) {
              for (int l = 0; l < 16; ++l) acc[l] += p[off + l];
            });
            const float inv = 1.f / float(k_ * k_);  // count_include_pad, as PyTorch's default
            for (int l = 0; l < 16; ++l) q[o + l] = acc[l] * inv;
          }
        }
    });
  }
  void backward(const Context& ctx, const std::vector<const float*>&, const float*, const float* dy,
                const std::vector<float*>& dx, const StepInfo&) override {
    if (!dx[0]) return;
    for_blocks(ctx, in_.n, cb_of(in_), [&](int n, int blk) {
      float* d = dx[0] + (size_t(n) * cb_of(in_) + blk) * plane(in_);
      const size_t out_off = (size_t(n) * cb_of(out_) + blk) * plane(out_);
      const float* g = dy + out_off;
      std::fill(d, d + plane(in_), 0.f);
      const float inv = 1.f / float(k_ * k_);
      for (int oh = 0; oh < out_.h; ++oh)
        for (int ow = 0; ow < out_.w; ++ow) {
          const size_t o = (size_t(oh) * out_.w + ow) * 16;
          const float* go = g + o;
          if (max_) {
            const uint8_t* arg = argmax_.data() + out_off + o;
            for (int l = 0; l < 16; ++l) {
              if (arg[l] == kNoTap) continue;
              const int ih = oh * s_ + arg[l] / k_ - p_, iw = ow * s_ + arg[l] % k_ - p_;
              d[(size_t(ih) * in_.w + iw) * 16 + l] += go[l];
            }
          } else {
            for_window(oh, ow, [&](size_t off, int) {
              for (int l = 0; l < 16; ++l) d[off + l] += go[l] * inv;
            });
          }
        }
    });
  }

 private:
  static constexpr uint8_t kNoTap = 255;
  // Calls f(offset of the input pixel within a channel-block plane, tap index r * k + c) for every
  // in-bounds tap of output pixel (oh, ow), in window order (row-major), which decides max-pool ties.
  template <class F>
  void for_window(int oh, int ow, F&& f) const {
    for (int r = 0; r < k_; ++r) {
      const int ih = oh * s_ + r - p_;
      if (ih < 0 || ih >= in_.h) continue;
      for (int c = 0; c < k_; ++c) {
        const int iw = ow * s_ + c - p_;
        if (iw < 0 || iw >= in_.w) continue;
        f((size_t(ih) * in_.w + iw) * 16, r * k_ + c);
      }
    }
  }

  bool max_;
  int k_, s_, p_;
  bool ceil_;
  TensorShape in_, out_;
  AlignedBuffer<uint8_t> argmax_;  // max: per output element, the tap its value came from
};

class GlobalAvgPool final : public Layer {
 public:
  TensorShape infer(const std::vector<TensorShape>& in) const override { return {in[0].n, in[0].c, 1, 1}; }
  void build(const Context&, const std::vector<TensorShape>& in, const TensorShape&, const PrecisionPolicy&,
             std::mt19937_64&) override {
    in_ = in[0];
  }
  void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo&) override {
    const size_t hw = size_t(in_.h) * in_.w;
    for_blocks(ctx, in_.n, cb_of(in_), [&](int n, int blk) {
      const float* p = x[0] + (size_t(n) * cb_of(in_) + blk) * plane(in_);
      float acc[16] = {};
      for (size_t i = 0; i < hw; ++i)
        for (int l = 0; l < 16; ++l) acc[l] += p[i * 16 + l];
      for (int l = 0; l < 16; ++l) y[(size_t(n) * cb_of(in_) + blk) * 16 + l] = acc[l] / float(hw);
    });
  }
  void backward(const Context& ctx, const std::vector<const float*>&, const float*, const float* dy,
                const std::vector<float*>& dx, const StepInfo&) override {
    if (!dx[0]) return;
    const size_t hw = size_t(in_.h) * in_.w;
    for_blocks(ctx, in_.n, cb_of(in_), [&](int n, int blk) {
      float* d = dx[0] + (size_t(n) * cb_of(in_) + blk) * plane(in_);
      const float* g = dy + (size_t(n) * cb_of(in_) + blk) * 16;
      for (size_t i = 0; i < hw; ++i)
        for (int l = 0; l < 16; ++l) d[i * 16 + l] = g[l] / float(hw);
    });
  }

 private:
  TensorShape in_;
};

// ---- shape and routing layers ---------------------------------------------------------------

// (N, C, H, W) -> (N, C*H*W, 1, 1), features in (c, h, w) order as torch.flatten.
class Flatten final : public Layer {
 public:
  TensorShape infer(const std::vector<TensorShape>& in) const override {
    return {in[0].n, in[0].c * in[0].h * in[0].w, 1, 1};
  }
  void build(const Context&, const std::vector<TensorShape>& in, const TensorShape& out, const PrecisionPolicy&,
             std::mt19937_64&) override {
    in_ = in[0];
    out_ = out;
  }
  void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo&) override {
    ctx.parallel_for(in_.n, [&](int64_t b, int64_t e) {
      for (int64_t n = b; n < e; ++n) {
        float* row = y + size_t(n) * channel_blocks(out_.c) * 16;
        std::fill(row, row + channel_blocks(out_.c) * 16, 0.f);
        for (int c = 0; c < in_.c; ++c)
          for (int h = 0; h < in_.h; ++h)
            for (int w = 0; w < in_.w; ++w) row[(size_t(c) * in_.h + h) * in_.w + w] = x[0][bidx(in_, int(n), c, h, w)];
      }
    });
  }
  void backward(const Context& ctx, const std::vector<const float*>&, const float*, const float* dy,
                const std::vector<float*>& dx, const StepInfo&) override {
    if (!dx[0]) return;
    ctx.parallel_for(in_.n, [&](int64_t b, int64_t e) {
      for (int64_t n = b; n < e; ++n) {
        const float* row = dy + size_t(n) * channel_blocks(out_.c) * 16;
        float* d = dx[0] + size_t(n) * cb_of(in_) * plane(in_);
        std::fill(d, d + cb_of(in_) * plane(in_), 0.f);
        for (int c = 0; c < in_.c; ++c)
          for (int h = 0; h < in_.h; ++h)
            for (int w = 0; w < in_.w; ++w) dx[0][bidx(in_, int(n), c, h, w)] = row[(size_t(c) * in_.h + h) * in_.w + w];
      }
    });
  }

 private:
  TensorShape in_, out_;
};

class Add final : public Layer {
 public:
  TensorShape infer(const std::vector<TensorShape>& in) const override {
    DFP_CHECK(in[0].c == in[1].c && in[0].h == in[1].h && in[0].w == in[1].w, Status::invalid_argument,
              "add '" + name + "': input shapes differ (" + std::to_string(in[0].c) + "x" + std::to_string(in[0].h) +
                  "x" + std::to_string(in[0].w) + " vs " + std::to_string(in[1].c) + "x" + std::to_string(in[1].h) +
                  "x" + std::to_string(in[1].w) + ")");
    return in[0];
  }
  void build(const Context&, const std::vector<TensorShape>& in, const TensorShape&, const PrecisionPolicy&,
             std::mt19937_64&) override {
    s_ = in[0];
    n_ = in[0].blocked_elements();
    if (relu_) mask_ = AlignedBuffer<uint16_t>((n_ + 15) / 16);
  }
  // Either input may come as spans from a BatchNorm (its scale-shift, and the DFP16 copy it saves,
  // computed here piece by piece), so its FP32 output is never written or read.
  bool accepts_input_spans(size_t i) const override { return i < 2; }
  void take_input_spans(size_t i, InputSpanFn fn, void* producer, float, const StepInfo&) override {
    spans_[i] = {fn, producer};
  }
  bool forward_in_place(size_t) const override { return true; }
  bool backward_in_place(size_t) const override { return true; }
  // The gradient reaches every input unchanged, or, with the ReLU fused, masked once in place.
  bool backward_passes_gradient() const override { return true; }
  // Fused ReLU (the residual block's): the ReLU kernel runs on each chunk of the sum while it is
  // still in cache, so the bits, mask and max are the two layers' own.
  bool absorb_relu() override {
    relu_ = true;
    return true;
  }
  float output_max_abs() const override { return out_max_; }
  void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo&) override {
    const auto fn = ctx.kernels().add.fn;
    const auto add_relu = ctx.kernels().add_relu.fn;  // the bits of add, then the ReLU on the sum
    const float *a = x[0], *c = x[1];
    const size_t n = n_;
    uint16_t* mask = relu_ ? mask_.data() : nullptr;
    std::atomic<float> mx{0.f};
    if (!spans_[0].fn && !spans_[1].fn) {
      for_chunks(ctx, n, [&](size_t b, size_t e) {
        if (mask) atomic_max(mx, add_relu(a + b, c + b, y + b, mask + b / 16, e - b));
        else fn(a + b, c + b, y + b, e - b);
      });
      out_max_ = mask ? mx.load() : -1.f;
      return;
    }
    // Pieces of each chunk that stay within one plane (the spans' unit), each input from its
    // producer into an L1 tile where it comes as spans. Element-wise: the bits of the plain path.
    const size_t pl = plane(s_);
    const int CB = cb_of(s_), W = s_.w;
    for_chunks(ctx, n, [&](size_t b, size_t e) {
      alignas(64) float tile[2][kSpanPixels * 16];
      float m = 0.f;
      for (size_t i = b; i < e;) {
        const size_t end = std::min({e, i + kSpanPixels * 16, (i / pl + 1) * pl});
        const float* in[2] = {a + i, c + i};
        for (int k = 0; k < 2; ++k) {
          if (!spans_[k].fn) continue;
          const size_t p = i / pl, px = i % pl / 16;
          spans_[k].fn(spans_[k].producer, int(p / CB), int(p % CB), int(px / W), int(px % W), int(end - i) / 16, tile[k]);
          in[k] = tile[k];
        }
        if (mask) {
          const float r = add_relu(in[0], in[1], y + i, mask + i / 16, end - i);
          m = r > m ? r : m;
        } else {
          fn(in[0], in[1], y + i, end - i);
        }
        i = end;
      }
      if (mask) atomic_max(mx, m);
    });
    out_max_ = mask ? mx.load() : -1.f;
    spans_[0] = spans_[1] = {};
  }
  void backward(const Context& ctx, const std::vector<const float*>&, const float*, const float* dy,
                const std::vector<float*>& dx, const StepInfo&) override {
    if (relu_) {
      // Mask into the first input's buffer, or over dy itself where an input shares it.
      float* first = nullptr;
      for (float* d : dx)
        if (d && (!first || d == dy)) first = d;
      if (!first) return;
      mask_gradient(ctx, mask_.data(), dy, first, n_);
      dy = first;
    }
    for (float* d : dx)
      if (d && d != dy) std::memcpy(d, dy, n_ * sizeof(float));  // d == dy: the planned buffer is shared
  }

 private:
  static constexpr size_t kSpanPixels = 128;
  TensorShape s_;
  size_t n_ = 0;
  bool relu_ = false;
  AlignedBuffer<uint16_t> mask_;
  float out_max_ = -1.f;
  struct {
    InputSpanFn fn = nullptr;
    void* producer = nullptr;
  } spans_[2];  // inputs fed as spans in this step (take_input_spans)
};

class Concat final : public Layer {
 public:
  TensorShape infer(const std::vector<TensorShape>& in) const override {
    TensorShape o = in[0];
    o.c = 0;
    for (const auto& s : in) {
      DFP_CHECK(s.h == in[0].h && s.w == in[0].w, Status::invalid_argument,
                "concat '" + name + "': inputs differ in spatial size");
      o.c += s.c;
    }
    return o;
  }
  void build(const Context&, const std::vector<TensorShape>& in, const TensorShape& out, const PrecisionPolicy&,
             std::mt19937_64&) override {
    in_ = in;
    out_ = out;
  }
  // Input i is the output's channel range [off_i, off_i + c_i): scattered there forward, gathered
  // back (whole blocks when the offset is block-aligned, as in every GoogLeNet Inception block).
  void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo&) override {
    int off = 0;
    for (size_t i = 0; i < in_.size(); ++i) {
      scatter_channels(ctx, x[i], in_[i], y, out_, off, false);
      off += in_[i].c;
    }
    zero_padding_lanes(ctx, y, out_);
  }
  void backward(const Context& ctx, const std::vector<const float*>&, const float*, const float* dy,
                const std::vector<float*>& dx, const StepInfo&) override {
    int off = 0;
    for (size_t i = 0; i < in_.size(); ++i) {
      if (dx[i]) gather_channels(ctx, dy, out_, off, dx[i], in_[i]);
      off += in_[i].c;
    }
  }

 private:
  std::vector<TensorShape> in_;
  TensorShape out_;
};

// Inverted dropout; the mask is a function of (seed, step, element), recomputed in backward.
class Dropout final : public Layer {
 public:
  explicit Dropout(float p) : p_(p) {}
  TensorShape infer(const std::vector<TensorShape>& in) const override {
    DFP_CHECK(p_ >= 0.f && p_ < 1.f, Status::invalid_argument,
              "dropout '" + name + "': p expected in [0, 1), got " + std::to_string(p_));
    return in[0];
  }
  void build(const Context& ctx, const std::vector<TensorShape>& in, const TensorShape&, const PrecisionPolicy&,
             std::mt19937_64& rng) override {
    n_ = in[0].blocked_elements();
    seed_ = rng();
  }
  uint64_t random_seed() const override { return seed_; }
  bool forward_in_place(size_t) const override { return true; }
  bool backward_in_place(size_t) const override { return true; }
  // Element i survives at this step: a pure function of (seed, step, i), so forward and backward
  // agree and nothing is stored.
  bool keep(uint32_t key, size_t i) const { return float(simd::stochastic_rand24(key, i)) * 0x1p-24f >= p_; }
  void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo& st) override {
    const float scale = 1.f / (1.f - p_);
    const float* src = x[0];
    const bool drop = st.train && p_ != 0.f;
    const uint32_t key = step_key(seed_, st.step);
    for_chunks(ctx, n_, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) y[i] = !drop ? src[i] : (keep(key, i) ? src[i] * scale : 0.f);
    });
  }
  void backward(const Context& ctx, const std::vector<const float*>&, const float*, const float* dy,
                const std::vector<float*>& dx, const StepInfo& st) override {
    if (!dx[0]) return;
    const float scale = 1.f / (1.f - p_);
    float* d = dx[0];
    const uint32_t key = step_key(seed_, st.step);
    for_chunks(ctx, n_, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) d[i] = keep(key, i) ? dy[i] * scale : 0.f;
    });
  }

 private:
  float p_;
  size_t n_ = 0;
  uint64_t seed_ = 0;
};

// Local response normalisation across channels (AlexNet, GoogLeNet-v1), as torch.nn.LocalResponseNorm:
// y_c = x_c / (k + alpha/size * sum_{c' in window(c)} x_c'^2)^beta.
class Lrn final : public Layer {
 public:
  Lrn(int size, float alpha, float beta, float k) : size_(size), alpha_(alpha), beta_(beta), k_(k) {}
  TensorShape infer(const std::vector<TensorShape>& in) const override { return in[0]; }
  void build(const Context&, const std::vector<TensorShape>& in, const TensorShape&, const PrecisionPolicy&,
             std::mt19937_64&) override {
    s_ = in[0];
    scale_ = AlignedBuffer<float>(s_.blocked_elements());
  }
  bool backward_reads_input(size_t) const override { return true; }
  bool backward_reads_output() const override { return true; }
  int lo(int c) const { return std::max(0, c - size_ / 2); }
  int hi(int c) const { return std::min(s_.c - 1, c + (size_ - 1) / 2); }
  void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo&) override {
    ctx.parallel_for(s_.n, [&](int64_t b, int64_t e) {
      for (int64_t n = b; n < e; ++n)
        for (int h = 0; h < s_.h; ++h)
          for (int w = 0; w < s_.w; ++w)
            for (int c = 0; c < s_.c; ++c) {
              double sum = 0;
              for (int j = lo(c); j <= hi(c); ++j) {
                const float v = x[0][bidx(s_, int(n), j, h, w)];
                sum += double(v) * v;
              }
              const size_t i = bidx(s_, int(n), c, h, w);
              scale_[i] = static_cast<float>(k_ + alpha_ / size_ * sum);
              y[i] = x[0][i] * std::pow(scale_[i], -beta_);
            }
    });
    zero_padding_lanes(ctx, y, s_);
  }
  void backward(const Context& ctx, const std::vector<const float*>& x, const float* y, const float* dy,
                const std::vector<float*>& dx, const StepInfo&) override {
    if (!dx[0]) return;
    ctx.parallel_for(s_.n, [&](int64_t b, int64_t e) {
      for (int64_t n = b; n < e; ++n)
        for (int h = 0; h < s_.h; ++h)
          for (int w = 0; w < s_.w; ++w)
            for (int c = 0; c < s_.c; ++c) {
              // Output j's window contains c exactly when c's window contains j (symmetric ranges
              // up to the odd/even split, handled by testing membership explicitly).
              double acc = 0;
              for (int j = std::max(0, c - size_); j <= std::min(s_.c - 1, c + size_); ++j) {
                if (c < lo(j) || c > hi(j)) continue;
                const size_t ij = bidx(s_, int(n), j, h, w);
                acc += double(dy[ij]) * y[ij] / scale_[ij];
              }
              const size_t i = bidx(s_, int(n), c, h, w);
              dx[0][i] = static_cast<float>(dy[i] * std::pow(scale_[i], -beta_) -
                                            2.0 * alpha_ * beta_ / size_ * x[0][i] * acc);
            }
    });
    zero_padding_lanes(ctx, dx[0], s_);
  }

 private:
  int size_;
  float alpha_, beta_, k_;
  TensorShape s_;
  AlignedBuffer<float> scale_;
};

// ResNet option-A shortcut (He et al. 2016, CIFAR): x[:, :, ::s, ::s] with (out_c - c)/2 zero
// channels on each side.
class ShortcutPad final : public Layer {
 public:
  ShortcutPad(int out_c, int stride) : out_c_(out_c), stride_(stride) {}
  TensorShape infer(const std::vector<TensorShape>& in) const override {
    DFP_CHECK(out_c_ >= in[0].c && (out_c_ - in[0].c) % 2 == 0, Status::invalid_argument,
              "shortcut '" + name + "': output channels must exceed input channels by an even number");
    return {in[0].n, out_c_, (in[0].h + stride_ - 1) / stride_, (in[0].w + stride_ - 1) / stride_};
  }
  void build(const Context&, const std::vector<TensorShape>& in, const TensorShape& out, const PrecisionPolicy&,
             std::mt19937_64&) override {
    in_ = in[0];
    out_ = out;
  }
  // Both passes run row by row through the shift_lanes kernel: each output pixel is one two-block
  // permute of a source pixel, where a scalar lane-by-lane copy would cost a visible share of a
  // ResNet-20 step for its two shortcuts (docs/design/kernels.md).
  void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo&) override {
    const int off = (out_c_ - in_.c) / 2, OB = cb_of(out_), IB = cb_of(in_);
    const auto shift_lanes = ctx.kernels().shift_lanes.fn;
    ctx.parallel_for(int64_t(out_.n) * OB * out_.h, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int n = int(r / (int64_t(OB) * out_.h)), ob = int(r / out_.h % OB), h = int(r % out_.h);
        // Output lane l holds input channel first + l (none outside [0, C)).
        const int first = ob * 16 - off, blk = first >= 0 ? first / 16 : -((15 - first) / 16);
        auto row = [&](int b) { return b >= 0 && b < IB ? x[0] + bidx(in_, n, b * 16, h * stride_, 0) : nullptr; };
        shift_lanes(row(blk), row(blk + 1), first - blk * 16, size_t(stride_), y + bidx(out_, n, ob * 16, h, 0), 1,
                    size_t(out_.w), lane_range(first, in_.c));
      }
    });
  }
  void backward(const Context& ctx, const std::vector<const float*>&, const float*, const float* dy,
                const std::vector<float*>& dx, const StepInfo&) override {
    if (!dx[0]) return;
    const int off = (out_c_ - in_.c) / 2, IB = cb_of(in_), OB = cb_of(out_);
    const auto shift_lanes = ctx.kernels().shift_lanes.fn;
    ctx.parallel_for(int64_t(in_.n) * IB * in_.h, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int n = int(r / (int64_t(IB) * in_.h)), ib = int(r / in_.h % IB), h = int(r % in_.h);
        float* d = dx[0] + bidx(in_, n, ib * 16, h, 0);
        // Pixels (and rows) the shortcut skips get no gradient.
        if (stride_ > 1) std::fill(d, d + size_t(in_.w) * 16, 0.f);
        if (h % stride_ != 0) continue;
        // Input lane l's gradient is output channel ib * 16 + l + off's.
        const int first = ib * 16 + off, blk = first / 16;
        auto row = [&](int b) { return b < OB ? dy + bidx(out_, n, b * 16, h / stride_, 0) : nullptr; };
        shift_lanes(row(blk), row(blk + 1), first % 16, 1, d, size_t(stride_), size_t(out_.w), lane_range(ib * 16, in_.c));
      }
    });
  }

 private:
  int out_c_, stride_;
  TensorShape in_, out_;
};

}  // namespace

namespace {
constexpr int kStatPieces = 64;
constexpr size_t kStatMinPiece = size_t(1) << 14;
template <class Measure>
FormatStats measure_pieces(const Context& ctx, size_t n, Measure&& measure) {
  std::array<FormatStats, kStatPieces> part{};
  const size_t piece = std::max(kStatMinPiece, (n + kStatPieces - 1) / kStatPieces);
  const int64_t pieces = int64_t((n + piece - 1) / piece);
  ctx.parallel_for(pieces, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) part[size_t(i)] = measure(size_t(i) * piece, std::min(n, size_t(i + 1) * piece));
  });
  FormatStats s;
  for (int64_t i = 0; i < pieces; ++i) s.add(part[size_t(i)]);
  return s;
}
}  // namespace

FormatStats measure_dfp16(const Context& ctx, const float* x, size_t n, int e) {
  const auto fn = ctx.kernels().dfp16_stats.fn;
  const double down = std::ldexp(1.0, -e), up = std::ldexp(1.0, e);
  return measure_pieces(ctx, n, [&](size_t b, size_t e) { return fn(x + b, e - b, down, up); });
}

FormatStats measure_rounded(const Context& ctx, const float* x, const float* q, size_t n) {
  return measure_pieces(ctx, n, [&](size_t b, size_t e) { return measure_rounding(x + b, q + b, e - b); });
}

FormatStats measure_bf16(const Context& ctx, const float* x, const uint16_t* q, size_t n) {
  return measure_pieces(ctx, n, [&](size_t b, size_t e) {
    FormatStats s;
    float buf[256];
    for (size_t i = b; i < e; i += 256) {
      const size_t m = std::min<size_t>(256, e - i);
      for (size_t j = 0; j < m; ++j) buf[j] = bf16_to_f32(q[i + j]);
      s.add(measure_rounding(x + i, buf, m));
    }
    return s;
  });
}

std::unique_ptr<Layer> make_conv(int k, int r, int s, int p, bool b, int groups) {
  if (groups == 1) return std::make_unique<Conv2d>(k, r, s, p, b);
  return std::make_unique<GroupedConv2d>(k, r, s, p, b, groups);
}
std::unique_ptr<Layer> make_batchnorm() { return std::make_unique<BatchNorm>(); }
std::unique_ptr<Layer> make_relu() { return std::make_unique<Relu>(); }
std::unique_ptr<Layer> make_pool(bool max, int k, int s, int p, bool c) { return std::make_unique<Pool>(max, k, s, p, c); }
std::unique_ptr<Layer> make_global_avgpool() { return std::make_unique<GlobalAvgPool>(); }
std::unique_ptr<Layer> make_flatten() { return std::make_unique<Flatten>(); }
std::unique_ptr<Layer> make_linear(int k, bool b) { return std::make_unique<Linear>(k, b); }
std::unique_ptr<Layer> make_add() { return std::make_unique<Add>(); }
std::unique_ptr<Layer> make_concat() { return std::make_unique<Concat>(); }
std::unique_ptr<Layer> make_dropout(float p) { return std::make_unique<Dropout>(p); }
std::unique_ptr<Layer> make_lrn(int size, float a, float b, float k) { return std::make_unique<Lrn>(size, a, b, k); }
std::unique_ptr<Layer> make_shortcut_pad(int c, int s) { return std::make_unique<ShortcutPad>(c, s); }

}  // namespace dfp::model
