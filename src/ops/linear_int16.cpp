// INT16 fully-connected layer: a 1x1 convolution over a 1x1 image, whose planner runs the pixel
// kernel over the batch (see ConvInt16's gemm mode). Rows are copied into the channel-blocked
// layout ([N][ceil(C/16)][16], zero padded) in buffers planned at construction.
#include <algorithm>
#include <cstring>

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "src/core/aligned_buffer.hpp"

namespace dfp {

namespace {
void rows_to_blocked(const float* src, float* dst, int n, int c) {
  const int cp = channel_blocks(c) * kChannelBlock;
  for (int i = 0; i < n; ++i) std::memcpy(dst + size_t(i) * cp, src + size_t(i) * c, sizeof(float) * c);
}
void blocked_to_rows(const float* src, float* dst, int n, int c) {
  const int cp = channel_blocks(c) * kChannelBlock;
  for (int i = 0; i < n; ++i) std::memcpy(dst + size_t(i) * c, src + size_t(i) * cp, sizeof(float) * c);
}
ConvShape linear_shape(int batch, int in, int out) {
  ConvShape s;
  s.N = batch;
  s.C = in;
  s.K = out;
  return s;
}
}  // namespace

struct LinearInt16::Impl {
  ConvInt16 conv;
  int n, c, k;
  AlignedBuffer<float> x_blk, dy_blk, out_blk;  // padding lanes of x_blk, dy_blk stay zero
  Impl(const Context& ctx, int batch, int in, int out, const DfpConvOptions& o, std::string name)
      : conv(ctx, linear_shape(batch, in, out), o, std::move(name)), n(batch), c(in), k(out),
        x_blk(blocked_size(batch, in, 1, 1)), dy_blk(blocked_size(batch, out, 1, 1)),
        out_blk(blocked_size(batch, std::max(in, out), 1, 1)) {}
};

LinearInt16::LinearInt16(const Context& ctx, int batch, int in, int out, const DfpConvOptions& o, std::string name)
    : impl_(std::make_unique<Impl>(ctx, batch, in, out, o, std::move(name))) {}
LinearInt16::~LinearInt16() = default;
LinearInt16::LinearInt16(LinearInt16&&) noexcept = default;
LinearInt16& LinearInt16::operator=(LinearInt16&&) noexcept = default;

const ConvStats& LinearInt16::stats() const noexcept { return impl_->conv.stats(); }
void LinearInt16::set_step(uint64_t step) { impl_->conv.set_step(step); }
void LinearInt16::set_weights(const float* w_kc) { impl_->conv.set_weights(w_kc); }

void LinearInt16::quantize_input(const float* x) {
  rows_to_blocked(x, impl_->x_blk.data(), impl_->n, impl_->c);
  impl_->conv.quantize_input(impl_->x_blk.data());
}
void LinearInt16::quantize_grad_output(const float* dy) {
  rows_to_blocked(dy, impl_->dy_blk.data(), impl_->n, impl_->k);
  impl_->conv.quantize_grad_output(impl_->dy_blk.data());
}
void LinearInt16::forward(float* y) {
  impl_->conv.forward(impl_->out_blk.data());
  blocked_to_rows(impl_->out_blk.data(), y, impl_->n, impl_->k);
}
void LinearInt16::backward_data(float* dx) {
  impl_->conv.backward_data(impl_->out_blk.data());
  blocked_to_rows(impl_->out_blk.data(), dx, impl_->n, impl_->c);
}
void LinearInt16::backward_weights(float* dw) { impl_->conv.backward_weights(dw); }

}  // namespace dfp
