// The weighted layers of the model graph: Conv2d, GroupedConv2d and Linear, with the precision
// policy's operators (INT16, BF16/FP16 operands, FP32) and their sampled numerics. BatchNorm is in
// batchnorm.cpp, the parameter-free layers in relu_pool_routing.cpp. Each works on the blocked
// FP32 layout; parallel loops run on the context's threads over disjoint outputs, so results do
// not depend on the thread count.
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
#include "src/model/layer_helpers.hpp"

namespace dfp::model {
namespace {

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
std::unique_ptr<Layer> make_linear(int k, bool b) { return std::make_unique<Linear>(k, b); }

}  // namespace dfp::model
