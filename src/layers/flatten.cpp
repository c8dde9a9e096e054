// Flatten: (N, C, H, W) -> (N, C*H*W, 1, 1), from the blocked layout into torch.flatten's order.
#include <algorithm>

#include "src/layers/layer.hpp"
#include "src/layers/layer_args.hpp"
#include "src/layers/layer_helpers.hpp"

namespace dfp::model {
namespace {

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

}  // namespace

std::unique_ptr<Layer> build_flatten(const LayerParams&, const LayerArgs&) { return std::make_unique<Flatten>(); }

}  // namespace dfp::model
