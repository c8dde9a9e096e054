// Concat: channels of several inputs side by side (GoogLeNet's inception blocks).
#include "dfp/status.hpp"
#include "src/layers/layer.hpp"
#include "src/layers/layer_args.hpp"
#include "src/layers/layer_helpers.hpp"

namespace dfp::model {
namespace {

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

}  // namespace

std::unique_ptr<Layer> build_concat(const LayerParams&, const LayerArgs&) { return std::make_unique<Concat>(); }

}  // namespace dfp::model
