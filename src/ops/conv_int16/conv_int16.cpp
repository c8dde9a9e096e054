// dfp::ConvInt16, the INT16 (DFP16) convolution's public class: each call goes to its Impl, which
// conv_int16_impl.hpp declares (with the list of the operator's files).
#include <memory>
#include <string>
#include <utility>

#include "src/ops/conv_int16/conv_int16_impl.hpp"

namespace dfp {

ConvInt16::ConvInt16(const Context& ctx, const ConvShape& shape, const DfpConvOptions& options, std::string name)
    : impl_(std::make_unique<Impl>(ctx, shape, options, std::move(name))) {}
ConvInt16::~ConvInt16() = default;
ConvInt16::ConvInt16(ConvInt16&&) noexcept = default;
ConvInt16& ConvInt16::operator=(ConvInt16&&) noexcept = default;

const ConvShape& ConvInt16::shape() const noexcept { return impl_->user; }
const ConvStats& ConvInt16::stats() const noexcept { return impl_->stats; }
const char* ConvInt16::kernel_name() const noexcept {
  return impl_->opt.verify ? "conv_s16s16f32__ref_int64_shadow" : impl_->ctx.kernels().conv_s16_pixel.name;
}
const char* ConvInt16::weight_gradient_kernel_name() const noexcept {
  return impl_->opt.verify ? "conv_s16s16f32__ref_int64_shadow" : impl_->ctx.kernels().conv_s16_pair.name;
}
const std::vector<int>& ConvInt16::input_exponents() const noexcept { return impl_->x_img.exp; }
const std::vector<int>& ConvInt16::weight_exponents() const noexcept { return impl_->w_out_exp; }
const std::vector<int>& ConvInt16::grad_output_exponents() const noexcept {
  return impl_->opt.input_gradient ? impl_->dy_img.exp : impl_->dy_blk.planes;
}
void ConvInt16::set_step(uint64_t step) { impl_->set_step(step); }
void ConvInt16::set_weights(const float* w) { impl_->set_weights(w, -1.f); }
void ConvInt16::set_weights_with_max_abs(const float* w, float max_abs) { impl_->set_weights(w, max_abs); }
void ConvInt16::quantize_input(const float* x) { impl_->quantize_input(x, -1.f, nullptr); }
void ConvInt16::quantize_input_with_max_abs(const float* x, float max_abs, const float* plane_max_abs) {
  impl_->quantize_input(x, max_abs, plane_max_abs);
}
bool ConvInt16::accepts_input_spans() const noexcept { return !impl_->unfold; }
bool ConvInt16::recompute_input_pairs(InputSpanFn again, void* producer, InputPairSpanFn again_pairs) {
  return impl_->recompute_input_pairs(again, producer, again_pairs);
}
bool ConvInt16::recompute_input() { return impl_->recompute_x_pairs(); }
void ConvInt16::quantize_input_spans(InputSpanFn fn, void* producer, float max_abs, const float* plane_max_abs,
                                     InputQuantSpanFn quantized) {
  impl_->quantize_input_spans(fn, producer, max_abs, plane_max_abs, quantized);
}
bool ConvInt16::accepts_grad_output_spans() const noexcept { return !impl_->dy_slices; }
bool ConvInt16::quantize_grad_output_spans(GradSpanFn fn, void* producer, float estimate, GradQuantSpanFn quantized) {
  return impl_->quantize_grad_output_spans(fn, producer, estimate, quantized);
}
void ConvInt16::quantize_grad_output_with_max_abs(const float* dy, float max_abs, const float* plane_max_abs) {
  impl_->quantize_grad_output(dy, max_abs, plane_max_abs);
}
void ConvInt16::quantize_grad_output(const float* dy) { impl_->quantize_grad_output(dy, -1.f, nullptr); }
void ConvInt16::forward(float* y) { impl_->forward(y, nullptr); }
void ConvInt16::forward_quantized(QuantizedOutput& out) { impl_->forward(nullptr, &out); }
size_t ConvInt16::workspace_bytes() const noexcept { return impl_->workspace_bytes(); }
void ConvInt16::use_workspace(void* p) { impl_->use_workspace(p); }
void ConvInt16::backward_data(float* dx, bool accumulate) { impl_->backward_data(dx, accumulate); }
void ConvInt16::backward_weights(float* dw) { impl_->backward_weights(dw); }

}  // namespace dfp
