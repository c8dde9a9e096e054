// LayerOp (include/dfp/layer_op.hpp): a Conv2d or Linear layer of the model graph run on its own,
// on plain NCHW tensors, with one plan per input shape.
#include "dfp/layer_op.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/dfp16.hpp"
#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"
#include "src/core/aligned_buffer.hpp"
#include "src/core/atomic_max.hpp"
#include "src/layers/layer.hpp"
#include "src/layers/layer_helpers.hpp"

namespace dfp {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Plain [n][c][hw] <-> blocked [n][cb][hw][16], in parallel over (image, channel block), by the
// kernel table's transposes. plain_to_blocked returns max|x| (measured on the way: the DFP16
// exponent of an INT16 operand needs it).
float plain_to_blocked(const Context& ctx, const float* src, float* dst, int n, int c, size_t hw) {
  const int cb = channel_blocks(c);
  const auto fn = ctx.kernels().to_blocked.fn;
  std::atomic<uint32_t> best{0};  // non-negative floats order as their bit patterns
  model::for_blocks(ctx, n, cb, [&](int i, int b) {
    const float m = fn(src + (size_t(i) * c + size_t(b) * kChannelBlock) * hw, hw,
                       std::min(kChannelBlock, c - b * kChannelBlock), dst + (size_t(i) * cb + b) * hw * kChannelBlock, hw);
    atomic_max(best, std::bit_cast<uint32_t>(m));
  });
  return std::bit_cast<float>(best.load());
}

void blocked_to_plain(const Context& ctx, const float* src, float* dst, int n, int c, size_t hw) {
  const int cb = channel_blocks(c);
  const auto fn = ctx.kernels().from_blocked.fn;
  model::for_blocks(ctx, n, cb, [&](int i, int b) {
    fn(src + (size_t(i) * cb + b) * hw * kChannelBlock, std::min(kChannelBlock, c - b * kChannelBlock),
       dst + (size_t(i) * c + size_t(b) * kChannelBlock) * hw, hw, hw);
  });
}

// dst = src on the context's threads, returning max|src| (NaN never wins): the weights' DFP16
// exponent without a pass of its own.
float copy_max_abs(const Context& ctx, const float* src, float* dst, size_t n) {
  std::atomic<uint32_t> best{0};
  model::for_chunks(ctx, n, [&](size_t b, size_t e) {
    float m = 0.f;
    for (size_t i = b; i < e; ++i) {
      const float v = src[i];
      dst[i] = v;
      const float a = std::fabs(v);
      m = a > m ? a : m;
    }
    atomic_max(best, std::bit_cast<uint32_t>(m));
  });
  return std::bit_cast<float>(best.load());
}

void copy(const Context& ctx, const float* src, float* dst, size_t n) {
  model::for_chunks(ctx, n, [&](size_t b, size_t e) { std::memcpy(dst + b, src + b, (e - b) * sizeof(float)); });
}

// The plain input as the blocked spans an INT16 conv asks for (TakesInputSpans::take_input_spans): the
// input is converted and quantized a span at a time, and never exists as a blocked FP32 tensor.
struct PlainSpans {
  simd::ToBlockedFn to_blocked;
  const float* x;
  int c, h, w;
  static void fill(void* self, int n, int b, int h, int w0, int count, float* out) {
    const PlainSpans& s = *static_cast<const PlainSpans*>(self);
    const size_t plane = size_t(s.h) * s.w;
    s.to_blocked(s.x + (size_t(n) * s.c + size_t(b) * kChannelBlock) * plane + size_t(h) * s.w + w0, plane,
                 std::min(kChannelBlock, s.c - b * kChannelBlock), out, size_t(count));
  }
};

size_t plain_elements(const TensorShape& s) { return size_t(s.n) * s.c * s.h * s.w; }

}  // namespace

void LayerOpSpec::validate() const {
  const std::string what = "layer '" + name + "'";
  auto need = [&](bool ok, const char* field, const std::string& expected, int got) {
    DFP_CHECK(ok, Status::invalid_argument,
              what + ": " + field + " must be " + expected + ", got " + std::to_string(got));
  };
  DFP_CHECK(!name.empty(), Status::invalid_argument, "LayerOpSpec: name must not be empty");
  need(in_channels >= 1, kind == Kind::linear ? "in_features" : "in_channels", ">= 1", in_channels);
  need(out_channels >= 1, kind == Kind::linear ? "out_features" : "out_channels", ">= 1", out_channels);
  if (kind == Kind::linear) {
    need(kernel == 1 && stride == 1 && pad == 0 && groups == 1, "kernel/stride/pad/groups",
         "1/1/0/1 for a Linear (kernel shown)", kernel);
    return;
  }
  need(kernel >= 1, "kernel", ">= 1", kernel);
  need(stride >= 1, "stride", ">= 1", stride);
  need(pad >= 0 && pad < kernel, "padding", "in [0, kernel - 1] (kernel " + std::to_string(kernel) + ")", pad);
  need(groups >= 1, "groups", ">= 1", groups);
  need(in_channels % groups == 0, "in_channels", "a multiple of groups (" + std::to_string(groups) + ")", in_channels);
  need(out_channels % groups == 0, "out_channels", "a multiple of groups (" + std::to_string(groups) + ")",
       out_channels);
}

struct LayerOp::Impl {
  // Everything the passes of one input shape use.
  struct Plan {
    int n = 0, h = 0, w = 0;
    bool input_grad = false;
    TensorShape in, out;
    std::unique_ptr<model::Layer> layer;
    float* weights = nullptr;  // the layer's own FP32 master copy, and its bias
    float* bias = nullptr;
    float* grad_weights = nullptr;
    float* grad_bias = nullptr;
    AlignedBuffer<float> x;   // blocked x; dx too where backward does not read x
    AlignedBuffer<float> y;   // blocked y, then dy
    AlignedBuffer<float> dx;  // blocked dx where backward reads x
    AlignedBuffer<std::byte> workspace;
    bool loaded = false;
    uint64_t version = 0;  // of the weights loaded
    uint64_t ticket = 0;   // of the training forward whose state the layer holds (0: none)
    uint64_t step = 0;     // that forward's step
    bool sample = false;   // that step samples the rounding statistics
    uint64_t last_use = 0;
  };

  const Context& ctx;
  LayerOpSpec spec;
  LayerPrecision precision;
  std::vector<std::unique_ptr<Plan>> plans;
  std::vector<const float*> xs = {nullptr};  // operand lists, reused (a call allocates nothing)
  std::vector<float*> dxs = {nullptr};
  uint64_t steps = 0, tickets = 0, uses = 0;
  bool sample_next = false;
  const Plan* last_trained = nullptr;
  LayerOpTimes times;
  mutable std::mutex mutex;

  Impl(const Context& c, const LayerOpSpec& s, const PrecisionPolicy& policy) : ctx(c), spec(s) {
    spec.validate();
    policy.validate("layer '" + spec.name + "' policy");
    precision = policy.for_layer(spec.name);
  }

  bool linear() const { return spec.kind == LayerOpSpec::Kind::linear; }
  // The layer's name for messages (built only when a check fails: a call allocates nothing).
  std::string who() const { return "layer '" + spec.name + "'"; }

  TensorShape input_shape(int n, int h, int w) const {
    DFP_CHECK(n >= 1, Status::invalid_argument, who() + ": batch must be >= 1, got " + std::to_string(n));
    if (linear()) {
      DFP_CHECK(h == 1 && w == 1, Status::invalid_argument,
                who() + ": a Linear's input is [n][in_features] (h = w = 1), got h " + std::to_string(h) + ", w " +
                    std::to_string(w));
      return {n, spec.in_channels, 1, 1};
    }
    DFP_CHECK(h >= 1 && w >= 1, Status::invalid_argument,
              who() + ": input height and width must be >= 1, got " + std::to_string(h) + "x" + std::to_string(w));
    DFP_CHECK(h + 2 * spec.pad >= spec.kernel && w + 2 * spec.pad >= spec.kernel, Status::invalid_argument,
              who() + ": kernel " + std::to_string(spec.kernel) + " larger than the padded input " + std::to_string(h) +
                  "x" + std::to_string(w) + " (padding " + std::to_string(spec.pad) + ")");
    return {n, spec.in_channels, h, w};
  }

  TensorShape output_shape(const TensorShape& in) const {
    if (linear()) return {in.n, spec.out_channels, 1, 1};
    return {in.n, spec.out_channels, (in.h + 2 * spec.pad - spec.kernel) / spec.stride + 1,
            (in.w + 2 * spec.pad - spec.kernel) / spec.stride + 1};
  }

  // The plan of this shape: for a training forward the one with this input_grad; for inference
  // any of the shape. Made when there is none, in place of the least recently used beyond kMaxPlans.
  Plan& plan_for(int n, int h, int w, bool train, bool input_grad) {
    Plan* found = nullptr;
    for (auto& p : plans) {
      if (p->n != n || p->h != h || p->w != w) continue;
      if (p->input_grad == input_grad) {
        found = p.get();
        break;
      }
      if (!train && !found) found = p.get();
    }
    if (!found) found = &make_plan(n, h, w, input_grad);
    found->last_use = ++uses;
    return *found;
  }

  Plan& make_plan(int n, int h, int w, bool input_grad) {
    const TensorShape in = input_shape(n, h, w);
    if (plans.size() >= kMaxPlans) {
      auto lru = std::min_element(plans.begin(), plans.end(), [](auto& a, auto& b) { return a->last_use < b->last_use; });
      if (last_trained == lru->get()) last_trained = nullptr;
      plans.erase(lru);
    }
    auto p = std::make_unique<Plan>();
    p->n = n; p->h = h; p->w = w;
    p->input_grad = input_grad;
    p->in = in;
    p->layer = linear() ? model::make_linear(spec.out_channels, spec.bias)
                        : model::make_conv(spec.out_channels, spec.kernel, spec.stride, spec.pad, spec.bias, spec.groups);
    p->layer->name = spec.name;
    p->layer->kind = linear() ? "fc" : "conv";
    p->layer->needs_input_grad = {char(input_grad)};
    p->out = p->layer->infer({in});
    std::mt19937_64 rng(ctx.seed());  // the initial weights it draws are replaced by the caller's
    p->layer->build(ctx, {in}, p->out, precision, rng);
    std::vector<Parameter> params;
    p->layer->parameters(params);
    DFP_CHECK(params.size() == (spec.bias ? 2u : 1u) && params[0].size == weight_count(), Status::internal,
              "layer '" + spec.name + "': unexpected parameters of the planned layer");
    p->weights = params[0].value;
    p->grad_weights = params[0].grad;
    if (spec.bias) {
      p->bias = params[1].value;
      p->grad_bias = params[1].grad;
    }
    const bool reads_x = p->layer->backward_reads_input(0);
    p->x = AlignedBuffer<float>(in.blocked_elements());
    p->y = AlignedBuffer<float>(p->out.blocked_elements());
    if (input_grad && reads_x) p->dx = AlignedBuffer<float>(in.blocked_elements());
    if (const size_t ws = p->layer->workspace_bytes()) {
      p->workspace = AlignedBuffer<std::byte>((ws + 63) / 64 * 64);
      p->layer->use_workspace(p->workspace.data());
    }
    plans.push_back(std::move(p));
    return *plans.back();
  }

  size_t weight_count() const {
    return linear() ? size_t(spec.out_channels) * spec.in_channels
                    : size_t(spec.out_channels) * (spec.in_channels / spec.groups) * spec.kernel * spec.kernel;
  }

  void load_weights(Plan& p, const float* w, const float* b, uint64_t version) {
    if (p.loaded && p.version == version) return;
    const auto t0 = Clock::now();
    const float max_abs[2] = {copy_max_abs(ctx, w, p.weights, weight_count()), -1.f};  // the bias: not needed
    if (spec.bias) std::copy(b, b + spec.out_channels, p.bias);
    p.layer->weights_updated(steps, std::span<const float>(max_abs, spec.bias ? 2 : 1));
    p.loaded = true;
    p.version = version;
    times.weights_seconds += seconds_since(t0);
    ++times.weight_loads;
  }

  uint64_t forward(const float* x, int n, int h, int w, const float* wt, const float* b, uint64_t version, float* y,
                   bool train, bool input_grad) {
    DFP_CHECK(x && y && wt, Status::invalid_argument, who() + ": forward needs x, y and the weights");
    DFP_CHECK(!spec.bias || b, Status::invalid_argument, who() + ": the layer has a bias; none was given");
    Plan& p = plan_for(n, h, w, train, input_grad);
    load_weights(p, wt, b, version);
    model::StepInfo st;
    st.count = n;
    st.train = train;
    st.step = steps;
    st.sample = train && sample_next;
    const size_t hw = size_t(p.in.h) * p.in.w;
    auto t0 = Clock::now();
    bool taken = false;
    auto* takes = p.layer->as<model::TakesInputSpans>();
    if (!st.sample && takes && takes->accepts_input_spans(0)) {
      // The conv quantizes the plain input span by span; max|x| first (its exponent needs it).
      uint64_t nonfinite = 0;
      const float m = max_abs(ctx, x, size_t(n) * p.in.c * hw, &nonfinite);
      if (nonfinite == 0) {  // else the blocked path below reports the tensor as the layer does
        PlainSpans spans{ctx.kernels().to_blocked.fn, x, p.in.c, p.in.h, p.in.w};
        takes->take_input_spans(0, &PlainSpans::fill, &spans, m, nullptr, nullptr, st);
        taken = true;
      }
    }
    if (!taken) {
      st.input_max_abs = plain_to_blocked(ctx, x, p.x.data(), n, p.in.c, hw);
      times.layout_seconds += seconds_since(t0);
      t0 = Clock::now();
    }
    xs[0] = taken ? nullptr : p.x.data();
    p.layer->forward(ctx, xs, p.y.data(), st);
    times.forward_seconds += seconds_since(t0);
    t0 = Clock::now();
    blocked_to_plain(ctx, p.y.data(), y, n, p.out.c, size_t(p.out.h) * p.out.w);
    times.layout_seconds += seconds_since(t0);
    ++times.forwards;
    if (!train) {
      p.ticket = 0;  // the layer's saved state is this inference pass's now
      return 0;
    }
    p.ticket = ++tickets;
    p.step = steps++;
    p.sample = st.sample;
    sample_next = false;
    last_trained = &p;
    return p.ticket;
  }

  Plan* holding(uint64_t ticket) const {
    if (ticket == 0) return nullptr;
    for (auto& p : plans)
      if (p->ticket == ticket) return p.get();
    return nullptr;
  }

  Plan& held(uint64_t ticket) const {
    Plan* p = holding(ticket);
    DFP_CHECK(p, Status::invalid_argument,
              who() + ": backward of a forward whose state is no longer held (ticket " + std::to_string(ticket) +
                  "; another forward of the same shape replaced it): run the forward again");
    return *p;
  }

  // A buffer of `got` floats where the call needs `want`.
  void need_size(size_t got, size_t want, const char* what, const char* pass) const {
    DFP_CHECK(got == want, Status::invalid_argument,
              who() + ": " + what + " holds " + std::to_string(got) + " floats; the " + pass + " needs " +
                  std::to_string(want));
  }

  void check_forward_sizes(size_t x, int n, int h, int w, size_t weights, size_t bias, size_t y) const {
    const TensorShape in = input_shape(n, h, w);
    const TensorShape out = output_shape(in);
    need_size(x, plain_elements(in), "x", "forward");
    need_size(weights, weight_count(), "weights", "forward");
    need_size(bias, spec.bias ? size_t(spec.out_channels) : 0, "bias", "forward");
    need_size(y, plain_elements(out), "y", "forward");
  }

  void check_backward_sizes(uint64_t ticket, size_t dy, size_t dx, size_t gw, size_t gb) const {
    const Plan& p = held(ticket);
    need_size(dy, plain_elements(p.out), "dy", "backward of that forward");
    if (dx) need_size(dx, plain_elements(p.in), "dx", "backward of that forward");
    need_size(gw, weight_count(), "grad_weights", "backward");
    need_size(gb, spec.bias ? size_t(spec.out_channels) : 0, "grad_bias", "backward");
  }

  void backward(uint64_t ticket, const float* dy, float* dx, float* gw, float* gb) {
    Plan& p = held(ticket);
    DFP_CHECK(dy && gw, Status::invalid_argument, who() + ": backward needs dy and the weight gradient's buffer");
    DFP_CHECK(!spec.bias || gb, Status::invalid_argument, who() + ": the layer has a bias; no buffer for its gradient");
    DFP_CHECK(!dx || p.input_grad, Status::invalid_argument,
              who() + ": dx asked of a forward run without input_grad");
    auto t0 = Clock::now();
    model::StepInfo st;
    st.grad_max_abs = plain_to_blocked(ctx, dy, p.y.data(), p.n, p.out.c, size_t(p.out.h) * p.out.w);
    times.layout_seconds += seconds_since(t0);
    t0 = Clock::now();
    st.count = p.n;
    st.train = true;
    st.step = p.step;
    st.sample = p.sample;
    const bool reads_x = p.layer->backward_reads_input(0);
    float* dxb = dx ? (reads_x ? p.dx.data() : p.x.data()) : nullptr;
    xs[0] = reads_x ? p.x.data() : nullptr;
    dxs[0] = dxb;
    p.layer->backward(ctx, xs, nullptr, p.y.data(), dxs, st);
    copy(ctx, p.grad_weights, gw, weight_count());
    if (spec.bias) std::copy(p.grad_bias, p.grad_bias + spec.out_channels, gb);
    times.backward_seconds += seconds_since(t0);
    if (dx) {
      t0 = Clock::now();
      blocked_to_plain(ctx, dxb, dx, p.n, p.in.c, size_t(p.in.h) * p.in.w);
      times.layout_seconds += seconds_since(t0);
    }
    ++times.backwards;
  }
};

LayerOp::LayerOp(const Context& ctx, const LayerOpSpec& spec, const PrecisionPolicy& policy)
    : impl_(std::make_unique<Impl>(ctx, spec, policy)) {}
LayerOp::~LayerOp() = default;

const LayerOpSpec& LayerOp::spec() const noexcept { return impl_->spec; }
Precision LayerOp::precision() const noexcept { return impl_->precision.precision; }
size_t LayerOp::weight_count() const noexcept { return impl_->weight_count(); }

std::array<int, 4> LayerOp::output_shape(int n, int h, int w) const {
  const TensorShape o = impl_->output_shape(impl_->input_shape(n, h, w));
  return {o.n, o.c, o.h, o.w};
}

uint64_t LayerOp::forward(const float* x, int n, int h, int w, const float* weights, const float* bias,
                          uint64_t weights_version, float* y, bool train, bool input_grad) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->forward(x, n, h, w, weights, bias, weights_version, y, train, input_grad);
}

bool LayerOp::holds(uint64_t ticket) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->holding(ticket) != nullptr;
}

void LayerOp::backward(uint64_t ticket, const float* dy, float* dx, float* gw, float* gb) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->backward(ticket, dy, dx, gw, gb);
}

uint64_t LayerOp::forward(std::span<const float> x, int n, int h, int w, std::span<const float> weights,
                          std::span<const float> bias, uint64_t weights_version, std::span<float> y, bool train,
                          bool input_grad) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->check_forward_sizes(x.size(), n, h, w, weights.size(), bias.size(), y.size());
  return impl_->forward(x.data(), n, h, w, weights.data(), bias.empty() ? nullptr : bias.data(), weights_version,
                        y.data(), train, input_grad);
}

void LayerOp::backward(uint64_t ticket, std::span<const float> dy, std::span<float> dx, std::span<float> gw,
                       std::span<float> gb) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->check_backward_sizes(ticket, dy.size(), dx.size(), gw.size(), gb.size());
  impl_->backward(ticket, dy.data(), dx.empty() ? nullptr : dx.data(), gw.data(), gb.empty() ? nullptr : gb.data());
}

std::array<int, 4> LayerOp::input_shape(uint64_t ticket) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const TensorShape& in = impl_->held(ticket).in;
  return {in.n, in.c, in.h, in.w};
}

void LayerOp::sample_next_step() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->sample_next = true;
}

bool LayerOp::numerics(LayerNumerics& out) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const auto* reduced = impl_->last_trained ? impl_->last_trained->layer->as<model::ReducedPrecision>() : nullptr;
  return reduced && reduced->numerics(out);
}

std::string LayerOp::implementation() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const auto* parts = impl_->plans.empty() ? nullptr : impl_->plans.back()->layer->as<model::ProfiledParts>();
  return parts ? parts->implementation() : std::string();
}

uint64_t LayerOp::steps() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->steps;
}

size_t LayerOp::plans() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->plans.size();
}

LayerOpTimes LayerOp::times() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->times;
}

void LayerOp::reset_times() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->times = {};
}

}  // namespace dfp
