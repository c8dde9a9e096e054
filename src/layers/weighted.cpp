// The weighted layers of the model graph: Conv2d, GroupedConv2d and Linear, each running the
// operation its precision chose (weighted_ops.hpp) and reporting its numerics. BatchNorm is in
// batchnorm.cpp, each parameter-free layer in its own file. Each works on the blocked
// FP32 layout; parallel loops run on the context's threads over disjoint outputs, so results do
// not depend on the thread count.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <type_traits>
#include <limits>

#include <optional>

#include "dfp/float8.hpp"
#include "dfp/float16.hpp"
#include "dfp/loss_scale.hpp"
#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"
#include "src/core/aligned_buffer.hpp"
#include "src/layers/layer.hpp"
#include "src/layers/layer_args.hpp"
#include "src/layers/layer_helpers.hpp"
#include "src/layers/weighted_ops.hpp"

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
// Each channel's sum in FP64 over images, then pixels, in order; channel blocks in parallel (each
// block's sums are its own, so the thread count does not change them).
void bias_grad(const Context& ctx, const float* dy, const TensorShape& s, float* gb) {
  const auto sums = ctx.kernels().lane_sums.fn;
  ctx.parallel_for(cb_of(s), [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      double acc[16] = {};
      for (int n = 0; n < s.n; ++n) sums(dy + (size_t(n) * cb_of(s) + size_t(blk)) * plane(s), size_t(s.h) * s.w, acc);
      for (int l = 0; l < 16 && blk * 16 + l < s.c; ++l) gb[blk * 16 + l] = static_cast<float>(acc[l]);
    }
  });
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
// Both hold FP32 master weights (and an optional bias) and run the one operation their precision
// chose when the model was built (weighted_ops.hpp). A Linear layer's input (N, F, 1, 1) is
// already blocked as rows of F features padded to 16, which is exactly what ConvInt16 reads for a
// 1x1 convolution over a 1x1 image, so in INT16 it needs no re-layout.

class WeightedLayer : public Layer, public ReducedPrecision, public ProfiledParts {
 public:
  void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo& st) override {
    op_->forward(x[0], y, st);
    if (has_bias_) add_bias(ctx, y, out_, b_.data());
  }
  void backward(const Context& ctx, const std::vector<const float*>& x, const float* y, const float* dy,
                const std::vector<float*>& dx, const StepInfo& st) override {
    op_->backward(x[0], dy, dx[0], gw_.data(), st);
    if (has_bias_) bias_grad(ctx, dy, out_, gb_.data());
    op_->finish_gradients(gw_.data(), gw_.size(), has_bias_ ? gb_.data() : nullptr, gb_.size());
  }
  void parameters(std::vector<Parameter>& out) override {
    out.push_back({name + ".weight", w_.data(), gw_.data(), w_.size(), true});
    if (has_bias_) out.push_back({name + ".bias", b_.data(), gb_.data(), b_.size(), true});
  }
  void weights_updated(uint64_t step, std::span<const float> param_max_abs) override {
    // The weight is the first of parameters(); a negative maximum: measured by the operation.
    op_->weights_updated(step, param_max_abs.empty() ? -1.f : param_max_abs[0]);
  }
  const char* precision() const override { return precision_name(prec_); }
  std::string implementation() const override { return op_->implementation(); }
  const LayerTime::Int16Parts* int16_parts() const override {
    return op_ && op_->int16() ? &op_->int16()->parts() : nullptr;
  }
  void reset_parts() override {
    if (op_ && op_->int16()) op_->int16()->reset_parts();
  }
  bool accumulates_input_grad(size_t) const override { return op_ && op_->accumulates_input_grad(); }
  size_t workspace_bytes() const override { return op_ ? op_->workspace_bytes() : 0; }
  void use_workspace(void* region) override { op_->use_workspace(region); }
  bool numerics(LayerNumerics& n) const override { return op_->numerics(name, n); }
  void scaling_histories(const std::string& prefix, std::map<std::string, std::vector<float>>& out) const override {
    op_->scaling_histories(prefix, out);
  }
  bool set_scaling_history(const std::string& key, const std::vector<float>& values, const std::string& what) override {
    return op_->set_scaling_history(key, values, what);
  }
  double adaptive_factor(const Context& ctx, const float* dy, double scale_so_far,
                         const AdaptiveScaling& opts) const override {
    AdaptiveInputs in;
    FloatFormat f;
    if (!op_->adaptive_weight_inputs(in, f)) return 1;
    return adaptive_factor_over(dy, out_, in, f, scale_so_far, opts);
  }
  bool adaptive_weight_inputs(AdaptiveInputs& in, FloatFormat& f) const { return op_->adaptive_weight_inputs(in, f); }
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
  const SampledNumerics& sampled_numerics() const noexcept { return op_->sampled_numerics(); }
  const ConvStats* int16_stats() const noexcept { return op_->int16() ? &op_->int16()->stats() : nullptr; }
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
  // Allocates weights and gradients, and the operation of the layer's precision; `make_f32`
  // makes the layer's FP32 operator where that operation runs one. bf16_operands: the layer can
  // run the kernel table's BF16-operand convolution.
  void plan(const Context& ctx, const ConvShape& shape, const TensorShape& in, const TensorShape& out,
            const LayerPrecision& precision, std::function<std::unique_ptr<F32Operator>()> make_f32,
            bool bf16_operands) {
    out_ = out;
    w_.allocate(size_t(shape.K) * shape.C * shape.R * shape.S);
    gw_.allocate(w_.size());
    if (has_bias_) { b_.allocate(k_); gb_.allocate(k_); }
    prec_ = precision.precision;
    WeightedOpSpec spec;
    spec.ctx = &ctx;
    spec.name = name;
    spec.shape = shape;
    spec.in_size = in.blocked_elements();
    spec.out_size = out.blocked_elements();
    spec.weights = w_.data();
    spec.weight_count = w_.size();
    spec.input_gradient = needs_input_grad.empty() || needs_input_grad[0];
    spec.fan_in = double(shape.C) * shape.R * shape.S;
    spec.make_f32 = std::move(make_f32);
    spec.bf16_operands = bf16_operands;
    op_ = make_weighted_op(spec, precision);
  }

  int k_;
  bool has_bias_;
  TensorShape out_;
  Precision prec_ = Precision::fp32;
  ParamStore w_, gw_, b_, gb_;
  std::unique_ptr<WeightedOp> op_;
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

// A Conv2d's FP32 operator: ConvF32 on the blocked layout as it is.
class ConvF32Operator final : public F32Operator {
 public:
  ConvF32Operator(const Context& ctx, const ConvShape& s, const std::string& name) : f_(ctx, s, name) {}
  void set_weights(const float* w) override { f_.set_weights(w); }
  void forward(const float* x, float* y) override { f_.forward(x, y); }
  void backward(const float* x, const float* dy, float* dx, float* gw) override {
    if (dx) f_.backward_data(dy, dx);
    f_.backward_weights(x, dy, gw);
  }
  void backward_data(const float* dy, float* dx) override { f_.backward_data(dy, dx); }
  void backward_weights(const float* x, const float* dy, float* gw) override {
    f_.inputs_rewritten();  // its operands are its own, possibly in the buffers the other passes read
    f_.backward_weights(x, dy, gw);
  }
  std::string implementation() const override { return f_.kernel_name(); }

 private:
  ConvF32 f_;
};

class Conv2d final : public WeightedLayer, public TakesInputSpans, public TakesGradSpans {
 public:
  Conv2d(int k, int r, int stride, int pad, bool bias) : WeightedLayer(k, bias), r_(r), stride_(stride), pad_(pad) {}
  TensorShape infer(const std::vector<TensorShape>& in) const override {
    return conv_output_shape(name, in[0], k_, r_, stride_, pad_);
  }
  size_t count_parameters(const std::vector<TensorShape>& in) const override {
    return size_t(k_) * in[0].c * r_ * r_ + (has_bias_ ? k_ : 0);
  }
  // Before build(): as FP32, which reads x for the weight gradient.
  bool backward_reads_input(size_t) const override { return !op_ || op_->backward_reads_input(); }
  void build(const Context& ctx, const std::vector<TensorShape>& in, const TensorShape& out,
             const LayerPrecision& precision, std::mt19937_64& rng) override {
    ConvShape s;
    s.N = in[0].n; s.C = in[0].c; s.H = in[0].h; s.W = in[0].w;
    s.K = k_; s.R = s.S = r_;
    s.stride_h = s.stride_w = stride_;
    s.pad_h = s.pad_w = pad_;
    plan(ctx, s, in[0], out, precision,
         [&ctx, s, this] { return std::make_unique<ConvF32Operator>(ctx, s, name); }, true);
    if (!w_.shared()) init_kaiming_fan_out(w_, k_ * r_ * r_, rng);  // else the tensor's owner draws it
  }

 private:
  bool accepts_input_spans(size_t i) const override {
    return i == 0 && op_->int16() && op_->int16()->accepts_input_spans();
  }
  void take_input_spans(size_t, InputSpanFn fn, void* producer, float max_abs, const float* plane_max,
                        InputQuantSpanFn quantized, const StepInfo& st) override {
    op_->int16()->take_input_spans(fn, producer, max_abs, plane_max, quantized, st);  // only where accepted
  }
  bool input_taken() const override { return op_->int16() && op_->int16()->input_taken(); }
  bool recompute_input_spans(size_t i, InputSpanFn again, void* producer, InputPairSpanFn again_pairs) override {
    return accepts_input_spans(i) && op_->int16()->recompute_input(again, producer, again_pairs);
  }
  // dy as spans where only the INT16 operation reads it (a bias gradient reads dy itself).
  bool accepts_grad_spans() const override { return op_->int16() && !has_bias_ && op_->int16()->accepts_grad_spans(); }
  void take_grad_spans(GradSpanFn fn, void* producer, float estimate, GradQuantSpanFn quantized,
                       const StepInfo& st) override {
    op_->int16()->take_grad_spans(fn, producer, estimate, quantized, st);  // only where accepted
  }
  bool grad_taken() const override { return op_->int16() && op_->int16()->grad_taken(); }

  int r_, stride_, pad_;
};

// Conv2d with groups > 1 (PyTorch's Conv2d(groups=G)): input channels and output channels are cut
// into G equal groups, and output group g sees input group g only. Each group is an ordinary
// Conv2d (every precision, all three passes) over channels gathered from the blocked input into
// a dense tensor of its own; its output is scattered back. The weight is one [K][C/G][R][S]
// parameter, the groups' weights one after the other (ParamStore). Under int16 each group's x,
// w and dy are DFP16 tensors with their own exponents: a shared exponent is per group here, as
// the groups never meet in one sum.
class GroupedConv2d final : public Layer, public ReducedPrecision, public ProfiledParts {
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
             const LayerPrecision& precision, std::mt19937_64& rng) override {
    in_ = in[0];
    out_ = out;
    part_in_ = {in_.n, in_.c / groups_, in_.h, in_.w};
    part_out_ = {out_.n, k_ / groups_, out_.h, out_.w};
    const size_t wg = size_t(part_out_.c) * part_in_.c * r_ * r_;
    w_.assign(wg * groups_, 0.f);
    gw_.assign(w_.size(), 0.f);
    if (bias_) { b_.assign(k_, 0.f); gb_.assign(k_, 0.f); }
    // The groups run at this layer's precision (their own names only seed their rounding streams).
    convs_.clear();
    size_t ws = 0;
    for (int g = 0; g < groups_; ++g) {
      auto c = std::make_unique<Conv2d>(part_out_.c, r_, stride_, pad_, bias_);
      c->name = name + ".group" + std::to_string(g);
      c->kind = kind;
      c->needs_input_grad = needs_input_grad;
      c->share_parameters(w_.data() + g * wg, gw_.data() + g * wg, wg, bias_ ? b_.data() + g * part_out_.c : nullptr,
                          bias_ ? gb_.data() + g * part_out_.c : nullptr);
      c->build(ctx, {part_in_}, part_out_, precision, rng);  // draws no weights: they are shared
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
  // The groups' times by part, summed (null unless the groups are INT16).
  const LayerTime::Int16Parts* int16_parts() const override {
    if (convs_.empty() || !convs_.front()->int16_parts()) return nullptr;
    parts_ = {};
    for (const auto& c : convs_) {
      const LayerTime::Int16Parts& p = *c->int16_parts();
      parts_.quantize_x += p.quantize_x;
      parts_.forward += p.forward;
      parts_.quantize_dy += p.quantize_dy;
      parts_.backward_data += p.backward_data;
      parts_.backward_weights += p.backward_weights;
      parts_.quantize_x_in_producer += p.quantize_x_in_producer;
      parts_.quantize_x_in_backward += p.quantize_x_in_backward;
      parts_.quantize_dy_in_producer += p.quantize_dy_in_producer;
    }
    return &parts_;
  }
  void reset_parts() override {
    for (auto& c : convs_) c->reset_parts();
  }
  // The groups' figures as one layer's: the exponents of the groups with the largest magnitudes
  // (those one shared exponent would take; an all-zero group's exponent 0 says nothing), the
  // shortest chains, counts summed, and the rounding statistics of the whole tensors (signal and
  // noise summed over the groups, as an ungrouped layer measures them).
  void scaling_histories(const std::string& prefix, std::map<std::string, std::vector<float>>& out) const override {
    for (size_t g = 0; g < convs_.size(); ++g) convs_[g]->scaling_histories(prefix + "g" + std::to_string(g) + ".", out);
  }
  bool set_scaling_history(const std::string& key, const std::vector<float>& values, const std::string& what) override {
    const size_t dot = key.find('.');
    if (key.size() < 2 || key[0] != 'g' || dot == std::string::npos) return false;
    const std::string index = key.substr(1, dot - 1);
    if (index.empty() || index.size() > 6 || index.find_first_not_of("0123456789") != std::string::npos) return false;
    const size_t g = std::stoul(index);
    return g < convs_.size() && convs_[g]->set_scaling_history(key.substr(dot + 1), values, what);
  }
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
    st.input_plane_max = st.grad_plane_max = nullptr;
    st.accumulate_dx = 0;
    return st;
  }

  int k_, r_, stride_, pad_;
  bool bias_;
  int groups_;
  TensorShape in_, out_, part_in_, part_out_;
  std::vector<float> w_, gw_, b_, gb_;
  std::vector<std::unique_ptr<Conv2d>> convs_;
  mutable LayerTime::Int16Parts parts_;  // int16_parts(): the groups' sums, as last asked for
  std::vector<const float*> xs_ = {nullptr};  // the group's operands (a step allocates nothing)
  std::vector<float*> dxs_ = {nullptr};
  size_t x_off_ = 0, y_off_ = 0, dx_off_ = 0, inner_off_ = 0, workspace_ = 0;
  char* base_ = nullptr;
};

// A Linear's FP32 operator: LinearF32 on dense rows, copied from and to the blocked rows (padded
// to 16 features). backward() reuses the rows forward() copied, so it reads no x.
class LinearF32Operator final : public F32Operator {
 public:
  LinearF32Operator(const Context& ctx, int n, int f_in, int k, const std::string& name)
      : n_(n), f_in_(f_in), k_(k), f_(ctx, n, f_in, k, name),
        rows_x_(size_t(n) * f_in), rows_y_(size_t(n) * k), rows_dx_(size_t(n) * f_in) {}
  void set_weights(const float* w) override { f_.set_weights(w); }
  void forward(const float* x, float* y) override {
    to_rows(x, rows_x_.data(), n_, f_in_);
    f_.forward(rows_x_.data(), rows_y_.data());
    from_rows(rows_y_.data(), y, n_, k_);
  }
  void backward(const float*, const float* dy, float* dx, float* gw) override {
    to_rows(dy, rows_y_.data(), n_, k_);  // rows_x_ still holds this step's input
    if (dx) {
      f_.backward_data(rows_y_.data(), rows_dx_.data());
      from_rows(rows_dx_.data(), dx, n_, f_in_);
    }
    f_.backward_weights(rows_x_.data(), rows_y_.data(), gw);
  }
  // backward() uses the rows forward() kept; backward_weights() (MX, with an x of its own
  // quantization) is handed its x by the layer, which then keeps it for the step.
  bool backward_reads_input() const override { return false; }
  void backward_data(const float* dy, float* dx) override {
    to_rows(dy, rows_y_.data(), n_, k_);
    f_.backward_data(rows_y_.data(), rows_dx_.data());
    from_rows(rows_dx_.data(), dx, n_, f_in_);
  }
  void backward_weights(const float* x, const float* dy, float* gw) override {
    to_rows(x, rows_x_.data(), n_, f_in_);
    to_rows(dy, rows_y_.data(), n_, k_);
    f_.inputs_rewritten();  // rows_x_ and rows_y_ now hold this pass's operands
    f_.backward_weights(rows_x_.data(), rows_y_.data(), gw);
  }
  std::string implementation() const override { return f_.kernel_name(); }

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

  int n_, f_in_, k_;
  LinearF32 f_;
  AlignedBuffer<float> rows_x_, rows_y_, rows_dx_;
};

class Linear final : public WeightedLayer {
 public:
  Linear(int k, bool bias) : WeightedLayer(k, bias) {}
  // Only an operation that quantizes x for the weight gradient on its own (MX) reads it.
  bool backward_reads_input(size_t) const override { return op_ && op_->backward_reads_input(); }
  TensorShape infer(const std::vector<TensorShape>& in) const override {
    DFP_CHECK(in[0].h == 1 && in[0].w == 1, Status::invalid_argument,
              "linear '" + name + "': input must be flat (N x F x 1 x 1); add flatten() or global_avgpool() first");
    return {in[0].n, k_, 1, 1};
  }
  size_t count_parameters(const std::vector<TensorShape>& in) const override {
    return size_t(k_) * in[0].c + (has_bias_ ? k_ : 0);
  }
  void build(const Context& ctx, const std::vector<TensorShape>& in, const TensorShape& out,
             const LayerPrecision& precision, std::mt19937_64& rng) override {
    const int n = in[0].n, f_in = in[0].c;
    ConvShape s;
    s.N = n; s.C = f_in; s.K = k_;  // 1x1 kernel over a 1x1 image
    // BF16 too runs on rounded operands here: the layer is small.
    plan(ctx, s, in[0], out, precision,
         [&ctx, n, f_in, this] { return std::make_unique<LinearF32Operator>(ctx, n, f_in, k_, name); }, false);
    // PyTorch's nn.Linear default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and bias.
    const float bound = 1.f / std::sqrt(float(f_in));
    std::uniform_real_distribution<float> ud(-bound, bound);
    for (auto& v : w_) v = ud(rng);
    for (auto& v : b_) v = ud(rng);
  }
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

FormatStats measure_dfp16_slices(const Context& ctx, const float* x, size_t n, int e, const std::vector<int>& slices) {
  if (slices.empty()) return measure_dfp16(ctx, x, n, e);
  FormatStats s;
  const size_t len = n / slices.size();
  for (size_t i = 0; i < slices.size(); ++i) s.add(measure_dfp16(ctx, x + i * len, len, slices[i]));
  return s;
}

FormatStats measure_rounded(const Context& ctx, const float* x, const float* q, size_t n) {
  return measure_pieces(ctx, n, [&](size_t b, size_t e) { return measure_rounding(x + b, q + b, e - b); });
}

FormatStats measure_float8(const Context& ctx, const float* x, const float* q, size_t n, FloatFormat f, int scale_exp) {
  return measure_pieces(ctx, n, [&](size_t b, size_t e) { return measure_float8_rounding(x + b, q + b, e - b, f, scale_exp); });
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
std::unique_ptr<Layer> build_conv(const LayerParams& params, const LayerArgs& a) {
  const auto& q = std::get<ConvParams>(params);
  a.need_int(q.out_channels >= 1, "output channels", ">= 1", q.out_channels);
  a.window(q.kernel, q.stride, q.pad, false);
  return make_conv(q.out_channels, q.kernel, q.stride, q.pad, q.bias, q.groups);
}
std::unique_ptr<Layer> build_linear(const LayerParams& params, const LayerArgs& a) {
  const auto& q = std::get<LinearParams>(params);
  a.need_int(q.out_features >= 1, "output features", ">= 1", q.out_features);
  return make_linear(q.out_features, q.bias);
}

}  // namespace dfp::model
