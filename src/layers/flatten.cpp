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
  // Each 16-channel block of an image is a run of its NCHW row: the layout kernels copy it bit
  // for bit (to_blocked zeroes the padding lanes).
  void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo&) override {
    const auto from_blocked = ctx.kernels().from_blocked.fn;
    const size_t hw = size_t(in_.h) * in_.w, row_len = size_t(channel_blocks(out_.c)) * 16;
    ctx.parallel_for(in_.n, [&](int64_t b, int64_t e) {
      for (int64_t n = b; n < e; ++n) {
        float* row = y + size_t(n) * row_len;
        for (int blk = 0; blk < cb_of(in_); ++blk)
          from_blocked(x[0] + (size_t(n) * cb_of(in_) + blk) * plane(in_), std::min(16, in_.c - 16 * blk),
                       row + size_t(blk) * 16 * hw, hw, hw);
        std::fill(row + size_t(in_.c) * hw, row + row_len, 0.f);
      }
    });
  }
  void backward(const Context& ctx, const std::vector<const float*>&, const float*, const float* dy,
                const std::vector<float*>& dx, const StepInfo&) override {
    if (!dx[0]) return;
    const auto to_blocked = ctx.kernels().to_blocked.fn;
    const size_t hw = size_t(in_.h) * in_.w, row_len = size_t(channel_blocks(out_.c)) * 16;
    ctx.parallel_for(in_.n, [&](int64_t b, int64_t e) {
      for (int64_t n = b; n < e; ++n) {
        const float* row = dy + size_t(n) * row_len;
        for (int blk = 0; blk < cb_of(in_); ++blk)
          to_blocked(row + size_t(blk) * 16 * hw, hw, std::min(16, in_.c - 16 * blk),
                     dx[0] + (size_t(n) * cb_of(in_) + blk) * plane(in_), hw);
      }
    });
  }

 private:
  TensorShape in_, out_;
};

}  // namespace

std::unique_ptr<Layer> build_flatten(const LayerParams&, const LayerArgs&) { return std::make_unique<Flatten>(); }

}  // namespace dfp::model
