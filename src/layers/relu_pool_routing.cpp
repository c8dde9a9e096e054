// The parameter-free layers: ReLU, max/average and global pooling, and the shape and routing
// layers (Flatten, Add, Concat, Dropout, LRN, the zero-padding shortcut).
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
#include "src/core/aligned_buffer.hpp"
#include "src/layers/layer.hpp"
#include "src/layers/layer_helpers.hpp"
#include "src/layers/layer_helpers.hpp"

namespace dfp::model {
namespace {

// ---- ReLU ---------------------------------------------------------------------------------

class Relu final : public Layer {
 public:
  TensorShape infer(const std::vector<TensorShape>& in) const override { return in[0]; }
  bool forward_in_place(size_t) const override { return true; }
  bool backward_in_place(size_t) const override { return true; }
  void pass_through() override { through_ = true; }
  float output_max_abs() const override { return out_max_; }
  float input_grad_max_abs() const override { return in_grad_max_; }
  const float* output_plane_max() const override { return out_planes_; }
  const float* input_grad_plane_max() const override { return in_grad_planes_; }
  void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo& st) override {
    const size_t n = n_elems_;
    out_planes_ = nullptr;
    if (through_) {  // the producer applied it; in place (the usual plan) there is nothing to do
      if (y != x[0]) std::memcpy(y, x[0], n * sizeof(float));
      out_max_ = st.input_max_abs;
      out_planes_ = st.input_plane_max;
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
    in_grad_planes_ = nullptr;
    if (!dx[0]) return;
    const size_t n = n_elems_;
    if (through_) {  // the producer masks the gradient
      if (dx[0] != dy) std::memcpy(dx[0], dy, n * sizeof(float));
      in_grad_max_ = st.grad_max_abs;
      in_grad_planes_ = st.grad_plane_max;
      return;
    }
    mask_gradient(ctx, mask_.data(), dy, dx[0], n);
  }
  void build(const Context&, const std::vector<TensorShape>& in, const TensorShape&, const LayerPrecision&,
             std::mt19937_64&) override {
    n_elems_ = in[0].blocked_elements();
    if (!through_) mask_ = AlignedBuffer<uint16_t>((n_elems_ + 15) / 16);
  }

 private:
  size_t n_elems_ = 0;
  bool through_ = false;          // the producer applies the ReLU (absorb_relu)
  AlignedBuffer<uint16_t> mask_;  // bit i: x[i] > 0, all that backward needs
  float out_max_ = -1.f, in_grad_max_ = -1.f;
  const float *out_planes_ = nullptr, *in_grad_planes_ = nullptr;  // a through ReLU's neighbours'
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
  void build(const Context&, const std::vector<TensorShape>& in, const TensorShape& out, const LayerPrecision&,
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
  void build(const Context&, const std::vector<TensorShape>& in, const TensorShape&, const LayerPrecision&,
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
  void build(const Context&, const std::vector<TensorShape>& in, const TensorShape& out, const LayerPrecision&,
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
  void build(const Context&, const std::vector<TensorShape>& in, const TensorShape&, const LayerPrecision&,
             std::mt19937_64&) override {
    s_ = in[0];
    n_ = in[0].blocked_elements();
    if (relu_) {
      mask_ = AlignedBuffer<uint16_t>((n_ + 15) / 16);
      planes_.assign(size_t(s_.n) * cb_of(s_), 0.f);
    }
  }
  // Either input may come as spans from a BatchNorm (its scale-shift, and the DFP16 copy it saves,
  // computed here piece by piece), so its FP32 output is never written or read.
  bool accepts_input_spans(size_t i) const override { return i < 2; }
  void take_input_spans(size_t i, InputSpanFn fn, void* producer, float, const float*, const StepInfo&) override {
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
  // With the ReLU: max|y| of each plane, measured as the pieces go.
  const float* output_plane_max() const override { return relu_ ? planes_.data() : nullptr; }
  void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo&) override {
    const auto fn = ctx.kernels().add.fn;
    const auto add_relu = ctx.kernels().add_relu.fn;  // the bits of add, then the ReLU on the sum
    const float *a = x[0], *c = x[1];
    const size_t n = n_;
    uint16_t* mask = relu_ ? mask_.data() : nullptr;
    std::atomic<float> mx{0.f};
    const size_t pl = plane(s_);
    if (mask) std::fill(planes_.begin(), planes_.end(), 0.f);
    if (!spans_[0].fn && !spans_[1].fn) {
      for_chunks(ctx, n, [&](size_t b, size_t e) {
        if (!mask) {
          fn(a + b, c + b, y + b, e - b);
          return;
        }
        float m = 0.f;
        for (size_t i = b; i < e;) {  // a piece per plane: each plane's max
          const size_t end = std::min(e, (i / pl + 1) * pl);
          const float r = add_relu(a + i, c + i, y + i, mask + i / 16, end - i);
          atomic_max(planes_[i / pl], r);
          m = r > m ? r : m;
          i = end;
        }
        atomic_max(mx, m);
      });
      out_max_ = mask ? mx.load() : -1.f;
      return;
    }
    // Pieces of each chunk that stay within one plane (the spans' unit), each input from its
    // producer into an L1 tile where it comes as spans. Element-wise: the bits of the plain path.
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
          atomic_max(planes_[i / pl], r);
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
  std::vector<float> planes_;  // output_plane_max(), [N][CB]
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
  void build(const Context&, const std::vector<TensorShape>& in, const TensorShape& out, const LayerPrecision&,
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

// Inverted dropout; the mask is a function of (seed, step, element), recomputed in backward. The
// element is counted in the job's global batch (StepInfo::first_image), so a data-parallel job's
// ranks draw the masks one process with the whole batch draws.
class Dropout final : public Layer {
 public:
  explicit Dropout(float p) : p_(p) {}
  TensorShape infer(const std::vector<TensorShape>& in) const override {
    DFP_CHECK(p_ >= 0.f && p_ < 1.f, Status::invalid_argument,
              "dropout '" + name + "': p expected in [0, 1), got " + std::to_string(p_));
    return in[0];
  }
  void build(const Context& ctx, const std::vector<TensorShape>& in, const TensorShape&, const LayerPrecision&,
             std::mt19937_64& rng) override {
    n_ = in[0].blocked_elements();
    image_ = n_ / size_t(std::max(1, in[0].n));  // the batch is the outermost dimension
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
    const size_t at = size_t(st.first_image) * image_;
    for_chunks(ctx, n_, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) y[i] = !drop ? src[i] : (keep(key, at + i) ? src[i] * scale : 0.f);
    });
  }
  void backward(const Context& ctx, const std::vector<const float*>&, const float*, const float* dy,
                const std::vector<float*>& dx, const StepInfo& st) override {
    if (!dx[0]) return;
    const float scale = 1.f / (1.f - p_);
    float* d = dx[0];
    const uint32_t key = step_key(seed_, st.step);
    const size_t at = size_t(st.first_image) * image_;
    for_chunks(ctx, n_, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) d[i] = keep(key, at + i) ? dy[i] * scale : 0.f;
    });
  }

 private:
  float p_;
  size_t n_ = 0;
  size_t image_ = 0;  // elements per image
  uint64_t seed_ = 0;
};

// Local response normalisation across channels (AlexNet, GoogLeNet-v1), as torch.nn.LocalResponseNorm:
// y_c = x_c / (k + alpha/size * sum_{c' in window(c)} x_c'^2)^beta.
class Lrn final : public Layer {
 public:
  Lrn(int size, float alpha, float beta, float k) : size_(size), alpha_(alpha), beta_(beta), k_(k) {}
  TensorShape infer(const std::vector<TensorShape>& in) const override { return in[0]; }
  void build(const Context&, const std::vector<TensorShape>& in, const TensorShape&, const LayerPrecision&,
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
  void build(const Context&, const std::vector<TensorShape>& in, const TensorShape& out, const LayerPrecision&,
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

std::unique_ptr<Layer> make_relu() { return std::make_unique<Relu>(); }
std::unique_ptr<Layer> make_pool(bool max, int k, int s, int p, bool c) { return std::make_unique<Pool>(max, k, s, p, c); }
std::unique_ptr<Layer> make_global_avgpool() { return std::make_unique<GlobalAvgPool>(); }
std::unique_ptr<Layer> make_flatten() { return std::make_unique<Flatten>(); }
std::unique_ptr<Layer> make_add() { return std::make_unique<Add>(); }
std::unique_ptr<Layer> make_concat() { return std::make_unique<Concat>(); }
std::unique_ptr<Layer> make_dropout(float p) { return std::make_unique<Dropout>(p); }
std::unique_ptr<Layer> make_lrn(int size, float a, float b, float k) { return std::make_unique<Lrn>(size, a, b, k); }
std::unique_ptr<Layer> make_shortcut_pad(int c, int s) { return std::make_unique<ShortcutPad>(c, s); }

}  // namespace dfp::model
