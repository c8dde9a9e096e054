// The zero-padding shortcut of ResNet option A (CIFAR ResNets): strided, with zero channels.
#include <algorithm>

#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"
#include "src/layers/layer.hpp"
#include "src/layers/layer_args.hpp"
#include "src/layers/layer_helpers.hpp"

namespace dfp::model {
namespace {

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

std::unique_ptr<Layer> build_shortcut_pad(const LayerParams& params, const LayerArgs& a) {
  const auto& q = std::get<ShortcutPadParams>(params);
  a.need_int(q.out_channels >= 1, "output channels", ">= 1", q.out_channels);
  a.need_int(q.stride >= 1, "stride", ">= 1", q.stride);
  return std::make_unique<ShortcutPad>(q.out_channels, q.stride);
}

}  // namespace dfp::model
