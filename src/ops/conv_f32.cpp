// dfp::ConvF32 and dfp::LinearF32: the FP32 baseline, on the backend that the context's kernel
// table makes (oneDNN's primitives from avx2 up, the scalar reference at `ref`; see
// ConvF32Backend in simd/kernel_table.hpp). These classes check the arguments.
#include <memory>
#include <string>

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"

namespace dfp {
namespace {

void check_pointer(const void* p, const std::string& name, const char* method, const char* arg) {
  DFP_CHECK(p != nullptr, Status::invalid_argument,
            name + ": " + method + " argument '" + arg + "' expected a non-null pointer");
}

}  // namespace

// ---- ConvF32 -----------------------------------------------------------------------------

struct ConvF32::Impl {
  std::string name;
  std::unique_ptr<simd::ConvF32Backend> backend;
  bool weights_set = false;
};

ConvF32::ConvF32(const Context& ctx, const ConvShape& shape, std::string name) : impl_(std::make_unique<Impl>()) {
  shape.validate(name);
  impl_->name = std::move(name);
  impl_->backend = ctx.kernels().conv_f32.fn(ctx.threads(), shape, impl_->name);
}

ConvF32::~ConvF32() = default;
ConvF32::ConvF32(ConvF32&&) noexcept = default;
ConvF32& ConvF32::operator=(ConvF32&&) noexcept = default;

const char* ConvF32::kernel_name() const noexcept { return impl_->backend->impl(); }

void ConvF32::set_weights(const float* w_kcrs) {
  Impl& m = *impl_;
  check_pointer(w_kcrs, m.name, "set_weights", "w_kcrs");
  m.backend->set_weights(w_kcrs);
  m.weights_set = true;
}

void ConvF32::forward(const float* x, float* y) {
  Impl& m = *impl_;
  DFP_CHECK(m.weights_set, Status::invalid_argument, m.name + ": forward called before set_weights");
  check_pointer(x, m.name, "forward", "x");
  check_pointer(y, m.name, "forward", "y");
  m.backend->forward(x, y);
}

void ConvF32::backward_data(const float* dy, float* dx) {
  Impl& m = *impl_;
  DFP_CHECK(m.weights_set, Status::invalid_argument, m.name + ": backward_data called before set_weights");
  check_pointer(dy, m.name, "backward_data", "dy");
  check_pointer(dx, m.name, "backward_data", "dx");
  m.backend->backward_data(dy, dx);
}

void ConvF32::backward_weights(const float* x, const float* dy, float* dw_kcrs) {
  Impl& m = *impl_;
  check_pointer(x, m.name, "backward_weights", "x");
  check_pointer(dy, m.name, "backward_weights", "dy");
  check_pointer(dw_kcrs, m.name, "backward_weights", "dw_kcrs");
  m.backend->backward_weights(x, dy, dw_kcrs);
}

void ConvF32::inputs_rewritten() { impl_->backend->inputs_rewritten(); }

// ---- LinearF32 ---------------------------------------------------------------------------

struct LinearF32::Impl {
  std::string name;
  std::unique_ptr<simd::LinearF32Backend> backend;
  bool weights_set = false;
};

LinearF32::LinearF32(const Context& ctx, int batch, int in_features, int out_features, std::string name)
    : impl_(std::make_unique<Impl>()) {
  auto need_positive = [&](int v, const char* field) {
    DFP_CHECK(v >= 1, Status::invalid_argument,
              name + ": field " + field + " expected >= 1, got " + std::to_string(v));
  };
  need_positive(batch, "batch");
  need_positive(in_features, "in_features");
  need_positive(out_features, "out_features");
  Impl& m = *impl_;
  m.name = std::move(name);
  m.backend = ctx.kernels().linear_f32.fn(ctx.threads(), batch, in_features, out_features, m.name);
}

LinearF32::~LinearF32() = default;
LinearF32::LinearF32(LinearF32&&) noexcept = default;
LinearF32& LinearF32::operator=(LinearF32&&) noexcept = default;

const char* LinearF32::kernel_name() const noexcept { return impl_->backend->impl(); }

void LinearF32::set_weights(const float* w_kc) {
  Impl& m = *impl_;
  check_pointer(w_kc, m.name, "set_weights", "w_kc");
  m.backend->set_weights(w_kc);
  m.weights_set = true;
}

void LinearF32::forward(const float* x_nc, float* y_nk) {
  Impl& m = *impl_;
  DFP_CHECK(m.weights_set, Status::invalid_argument, m.name + ": forward called before set_weights");
  check_pointer(x_nc, m.name, "forward", "x_nc");
  check_pointer(y_nk, m.name, "forward", "y_nk");
  m.backend->forward(x_nc, y_nk);
}

void LinearF32::backward_data(const float* dy_nk, float* dx_nc) {
  Impl& m = *impl_;
  DFP_CHECK(m.weights_set, Status::invalid_argument, m.name + ": backward_data called before set_weights");
  check_pointer(dy_nk, m.name, "backward_data", "dy_nk");
  check_pointer(dx_nc, m.name, "backward_data", "dx_nc");
  m.backend->backward_data(dy_nk, dx_nc);
}

void LinearF32::backward_weights(const float* x_nc, const float* dy_nk, float* dw_kc) {
  Impl& m = *impl_;
  check_pointer(x_nc, m.name, "backward_weights", "x_nc");
  check_pointer(dy_nk, m.name, "backward_weights", "dy_nk");
  check_pointer(dw_kc, m.name, "backward_weights", "dw_kc");
  m.backend->backward_weights(x_nc, dy_nk, dw_kc);
}

void LinearF32::inputs_rewritten() { impl_->backend->inputs_rewritten(); }

}  // namespace dfp
