// Max and average pooling (with ceil mode, as torch.nn.MaxPool2d/AvgPool2d) and global average
// pooling.
#include <algorithm>

#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"
#include "src/core/aligned_buffer.hpp"
#include "src/layers/layer.hpp"
#include "src/layers/layer_args.hpp"
#include "src/layers/layer_helpers.hpp"

namespace dfp::model {
namespace {

class Pool final : public Layer, public TakesInputSpans {
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
  // The input may come as spans from a BatchNorm (with its ReLU: ResNet's and VGG's BN, ReLU,
  // max-pool), whole rows at a time into a ring of rows in L1, so that its FP32 output is never
  // written or read. Every input row is asked for, in order, whether or not a window reads it: the
  // BatchNorm saves what its backward needs as it computes each span.
  bool accepts_input_spans(size_t i) const override { return i == 0 && size_t(k_) * in_.w <= kRingPixels; }
  void take_input_spans(size_t, InputSpanFn fn, void* producer, float, const float*, InputQuantSpanFn,
                        const StepInfo&) override {
    span_ = {fn, producer};
  }
  void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo&) override {
    const size_t row_floats = size_t(in_.w) * 16;
    const auto max_row = ctx.kernels().maxpool_row.fn;
    for_blocks(ctx, in_.n, cb_of(in_), [&](int n, int blk) {
      const size_t out_off = (size_t(n) * cb_of(out_) + blk) * plane(out_);
      if (!span_.fn) {
        const float* p = x[0] + (size_t(n) * cb_of(in_) + blk) * plane(in_);
        for (int oh = 0; oh < out_.h; ++oh)
          pool_row(max_row, oh, [&](int ih) { return p + ih * row_floats; }, y + out_off, out_off);
        return;
      }
      // Input row ih in slot ih % R: R rows of the ring, at least the window's k. A call asks for
      // as many rows as lie ahead of the ring's end and overwrite no row the window still reads, so
      // that a small plane comes in a few calls (each has a BatchNorm's fixed cost).
      alignas(64) float ring[kRingPixels * 16];
      const int R = int(kRingPixels / size_t(in_.w));
      int next = 0;  // the first row not asked for yet
      auto fetch_to = [&](int end, int first_needed) {
        while (next < end) {
          const int rows = std::min({in_.h - next, R - next % R, R - (next - first_needed)});
          span_.fn(span_.producer, n, blk, next, 0, rows * in_.w, ring + size_t(next % R) * row_floats);
          next += rows;
        }
      };
      for (int oh = 0; oh < out_.h; ++oh) {
        fetch_to(std::min(in_.h, oh * s_ - p_ + k_), std::max(0, oh * s_ - p_));
        pool_row(max_row, oh, [&](int ih) { return static_cast<const float*>(ring + size_t(ih % R) * row_floats); },
                 y + out_off, out_off);
      }
      fetch_to(in_.h, in_.h);  // rows no window reads
    });
    span_ = {};
  }
  void backward(const Context& ctx, const std::vector<const float*>&, const float*, const float* dy,
                const std::vector<float*>& dx, const StepInfo&) override {
    if (!dx[0]) return;
    const auto max_bwd = ctx.kernels().maxpool_row_bwd.fn;
    for_blocks(ctx, in_.n, cb_of(in_), [&](int n, int blk) {
      float* d = dx[0] + (size_t(n) * cb_of(in_) + blk) * plane(in_);
      const size_t out_off = (size_t(n) * cb_of(out_) + blk) * plane(out_);
      const float* g = dy + out_off;
      std::fill(d, d + plane(in_), 0.f);
      auto d_row = [&](int ih) { return d + size_t(ih) * in_.w * 16; };
      const float inv = 1.f / float(k_ * k_);
      for (int oh = 0; oh < out_.h; ++oh) {
        if (max_) {  // the gradient to each window's saved tap
          float* rows[kMaxWindow];
          for (int r = 0; r < k_; ++r) rows[r] = window_row(oh, r, d_row);
          const size_t o = size_t(oh) * out_.w * 16;
          max_bwd({rows, k_, s_, p_, out_.w, g + o, argmax_.data() + out_off + o});
          continue;
        }
        for (int ow = 0; ow < out_.w; ++ow) {
          const float* go = g + (size_t(oh) * out_.w + ow) * 16;
          for_window(oh, ow, d_row, [&](float* v, int) {
            for (int l = 0; l < 16; ++l) v[l] += go[l] * inv;
          });
        }
      }
    });
  }

 private:
  static constexpr uint8_t kNoTap = 255;
  static constexpr int kMaxWindow = 15;  // max pooling's rows per window (k * k taps < kNoTap)
  static constexpr size_t kRingPixels = 512;  // the spans' row ring: 32 KiB of the task's stack
  // Row r of output row oh's windows: row(ih) for input row ih = oh * stride - pad + r, null
  // outside the input.
  template <class Row>
  auto window_row(int oh, int r, Row&& row) const -> decltype(row(0)) {
    const int ih = oh * s_ - p_ + r;
    return ih >= 0 && ih < in_.h ? row(ih) : nullptr;
  }
  // f(pixel, tap) for every in-bounds tap of output pixel (oh, ow), in window order
  // (simd::pool_window); input pixel iw of row ih is row(ih) + iw * 16.
  template <class Row, class F>
  void for_window(int oh, int ow, Row&& row, F&& f) const {
    simd::pool_window([&](int r) { return window_row(oh, r, row); }, k_, s_, p_, in_.w, ow, f);
  }
  // Output row oh of one channel-block plane into q (the plane's output; argmax at out_off), input
  // row ih at row(ih): the plane itself, or the spans' ring.
  template <class Row>
  void pool_row(simd::MaxPoolRowFn max_row, int oh, Row row, float* q, size_t out_off) {
    const size_t o = size_t(oh) * out_.w * 16;
    if (max_) {
      const float* rows[kMaxWindow];
      for (int r = 0; r < k_; ++r) rows[r] = window_row(oh, r, row);
      max_row({rows, k_, s_, p_, in_.w, out_.w, q + o, argmax_.data() + out_off + o});
      return;
    }
    const float inv = 1.f / float(k_ * k_);  // count_include_pad, as PyTorch's default
    for (int ow = 0; ow < out_.w; ++ow) {
      float acc[16] = {};
      for_window(oh, ow, row, [&](const float* v, int) {
        for (int l = 0; l < 16; ++l) acc[l] += v[l];
      });
      for (int l = 0; l < 16; ++l) q[o + size_t(ow) * 16 + l] = acc[l] * inv;
    }
  }

  bool max_;
  int k_, s_, p_;
  bool ceil_;
  TensorShape in_, out_;
  AlignedBuffer<uint8_t> argmax_;  // max: per output element, the tap its value came from
  struct {
    InputSpanFn fn = nullptr;
    void* producer = nullptr;
  } span_;  // the input fed as spans in this step (take_input_spans)
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

}  // namespace

std::unique_ptr<Layer> build_maxpool(const LayerParams& params, const LayerArgs& a) {
  const auto& q = std::get<PoolParams>(params);
  a.window(q.kernel, q.stride, q.pad, true);
  return std::make_unique<Pool>(true, q.kernel, q.stride, q.pad, q.ceil_mode);
}
std::unique_ptr<Layer> build_avgpool(const LayerParams& params, const LayerArgs& a) {
  const auto& q = std::get<PoolParams>(params);
  a.window(q.kernel, q.stride, q.pad, true);
  a.need(!q.ceil_mode, "ceil_mode", "false (average pooling rounds its output size down)", "true");
  return std::make_unique<Pool>(false, q.kernel, q.stride, q.pad, false);
}
std::unique_ptr<Layer> build_global_avgpool(const LayerParams&, const LayerArgs&) {
  return std::make_unique<GlobalAvgPool>();
}

}  // namespace dfp::model
