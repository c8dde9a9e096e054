// dfp::ConvF32 and dfp::LinearF32: the FP32 baseline. oneDNN's primitives on every AVX-512
// level, the scalar reference when the context runs at level `ref` (so that a `ref` context
// never touches JIT code, and tests can pin the specification).
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "dfp/status.hpp"
#include "simd/onednn/conv_onednn.hpp"
#include "simd/ref/conv_f32_ref.hpp"

namespace dfp {
namespace {

void check_pointer(const void* p, const std::string& name, const char* method, const char* arg) {
  DFP_CHECK(p != nullptr, Status::invalid_argument,
            name + ": " + method + " argument '" + arg + "' expected a non-null pointer");
}

}  // namespace

// ---- ConvF32 -----------------------------------------------------------------------------

struct ConvF32::Impl {
  ConvShape shape;
  std::string name;
  std::string kernel;
  // Exactly one of the two backends is used.
  std::optional<simd::onednn::ConvPrimitives> onednn;
  std::vector<float> ref_weights;  // reference backend: the caller's [K][C][R][S], copied
  bool weights_set = false;
};

ConvF32::ConvF32(const Context& ctx, const ConvShape& shape, std::string name) : impl_(std::make_unique<Impl>()) {
  shape.validate(name);
  impl_->shape = shape;
  impl_->name = std::move(name);
  if (ctx.isa() == Isa::ref) {
    impl_->kernel = "conv_f32__ref";
  } else {
    impl_->onednn.emplace(ctx, shape, impl_->name);
    impl_->kernel = "onednn:" + impl_->onednn->impl_forward();
  }
}

ConvF32::~ConvF32() = default;
ConvF32::ConvF32(ConvF32&&) noexcept = default;
ConvF32& ConvF32::operator=(ConvF32&&) noexcept = default;

const char* ConvF32::kernel_name() const noexcept { return impl_->kernel.c_str(); }

void ConvF32::set_weights(const float* w_kcrs) {
  Impl& m = *impl_;
  check_pointer(w_kcrs, m.name, "set_weights", "w_kcrs");
  if (m.onednn) {
    m.onednn->set_weights(w_kcrs);
  } else {
    const ConvShape& s = m.shape;
    m.ref_weights.assign(w_kcrs, w_kcrs + size_t(s.K) * s.C * s.R * s.S);
  }
  m.weights_set = true;
}

void ConvF32::forward(const float* x, float* y) {
  Impl& m = *impl_;
  DFP_CHECK(m.weights_set, Status::invalid_argument, m.name + ": forward called before set_weights");
  check_pointer(x, m.name, "forward", "x");
  check_pointer(y, m.name, "forward", "y");
  if (m.onednn)
    m.onednn->forward(x, y);
  else
    simd::ref::conv_f32_forward(m.shape, x, m.ref_weights.data(), y);
}

void ConvF32::backward_data(const float* dy, float* dx) {
  Impl& m = *impl_;
  DFP_CHECK(m.weights_set, Status::invalid_argument, m.name + ": backward_data called before set_weights");
  check_pointer(dy, m.name, "backward_data", "dy");
  check_pointer(dx, m.name, "backward_data", "dx");
  if (m.onednn)
    m.onednn->backward_data(dy, dx);
  else
    simd::ref::conv_f32_backward_data(m.shape, dy, m.ref_weights.data(), dx);
}

void ConvF32::backward_weights(const float* x, const float* dy, float* dw_kcrs) {
  Impl& m = *impl_;
  check_pointer(x, m.name, "backward_weights", "x");
  check_pointer(dy, m.name, "backward_weights", "dy");
  check_pointer(dw_kcrs, m.name, "backward_weights", "dw_kcrs");
  if (m.onednn)
    m.onednn->backward_weights(x, dy, dw_kcrs);
  else
    simd::ref::conv_f32_backward_weights(m.shape, x, dy, dw_kcrs);
}

// ---- LinearF32 ---------------------------------------------------------------------------

struct LinearF32::Impl {
  int batch = 0, in = 0, out = 0;
  std::string name;
  std::string kernel;
  std::optional<simd::onednn::InnerProductPrimitives> onednn;
  std::vector<float> ref_weights;  // reference backend: the caller's [out][in], copied
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
  m.batch = batch;
  m.in = in_features;
  m.out = out_features;
  m.name = std::move(name);
  if (ctx.isa() == Isa::ref) {
    m.kernel = "inner_product_f32__ref";
  } else {
    m.onednn.emplace(ctx, batch, in_features, out_features, m.name);
    m.kernel = "onednn:" + m.onednn->impl_forward();
  }
}

LinearF32::~LinearF32() = default;
LinearF32::LinearF32(LinearF32&&) noexcept = default;
LinearF32& LinearF32::operator=(LinearF32&&) noexcept = default;

const char* LinearF32::kernel_name() const noexcept { return impl_->kernel.c_str(); }

void LinearF32::set_weights(const float* w_kc) {
  Impl& m = *impl_;
  check_pointer(w_kc, m.name, "set_weights", "w_kc");
  if (m.onednn)
    m.onednn->set_weights(w_kc);
  else
    m.ref_weights.assign(w_kc, w_kc + size_t(m.out) * m.in);
  m.weights_set = true;
}

void LinearF32::forward(const float* x_nc, float* y_nk) {
  Impl& m = *impl_;
  DFP_CHECK(m.weights_set, Status::invalid_argument, m.name + ": forward called before set_weights");
  check_pointer(x_nc, m.name, "forward", "x_nc");
  check_pointer(y_nk, m.name, "forward", "y_nk");
  if (m.onednn)
    m.onednn->forward(x_nc, y_nk);
  else
    simd::ref::inner_product_f32_forward(m.batch, m.in, m.out, x_nc, m.ref_weights.data(), y_nk);
}

void LinearF32::backward_data(const float* dy_nk, float* dx_nc) {
  Impl& m = *impl_;
  DFP_CHECK(m.weights_set, Status::invalid_argument, m.name + ": backward_data called before set_weights");
  check_pointer(dy_nk, m.name, "backward_data", "dy_nk");
  check_pointer(dx_nc, m.name, "backward_data", "dx_nc");
  if (m.onednn)
    m.onednn->backward_data(dy_nk, dx_nc);
  else
    simd::ref::inner_product_f32_backward_data(m.batch, m.in, m.out, dy_nk, m.ref_weights.data(), dx_nc);
}

void LinearF32::backward_weights(const float* x_nc, const float* dy_nk, float* dw_kc) {
  Impl& m = *impl_;
  check_pointer(x_nc, m.name, "backward_weights", "x_nc");
  check_pointer(dy_nk, m.name, "backward_weights", "dy_nk");
  check_pointer(dw_kc, m.name, "backward_weights", "dw_kc");
  if (m.onednn)
    m.onednn->backward_weights(x_nc, dy_nk, dw_kc);
  else
    simd::ref::inner_product_f32_backward_weights(m.batch, m.in, m.out, x_nc, dy_nk, dw_kc);
}

}  // namespace dfp
