// dfp::CudaModel and cuda_available(): the GPU back end in builds with CUDA (DFP_HAVE_CUDA, set by
// CMake for this file only), a clear "built without CUDA" error otherwise.
#include "dfp/cuda.hpp"

#include "dfp/status.hpp"
#include "src/cuda/executor.hpp"

namespace dfp {

namespace {
#if !DFP_HAVE_CUDA
constexpr const char* kNoCuda = "this dfp was built without CUDA (nvcc/cuDNN not found at configure time)";
#endif
}  // namespace

bool cuda_available(std::string* why) {
#if DFP_HAVE_CUDA
  return cuda::gpu_available(why);
#else
  if (why) *why = kNoCuda;
  return false;
#endif
}

const char* cuda_precision_name(CudaPrecision p) noexcept { return p == CudaPrecision::fp16 ? "fp16" : "fp32"; }

CudaPrecision parse_cuda_precision(const std::string& text, const std::string& origin) {
  if (text == "fp16") return CudaPrecision::fp16;
  if (text == "fp32") return CudaPrecision::fp32;
  fail(Status::invalid_argument,
       origin + ": precision '" + text + "' is not available on the CUDA device; expected fp16 or fp32");
}

struct CudaModel::Impl {
  CudaPrecision precision;
  cuda::Executor ex;
};

CudaModel::CudaModel(const Context&, Model& host, CudaPrecision precision, const SgdOptions& sgd,
                     const std::vector<std::vector<float>>* momentum) {
#if DFP_HAVE_CUDA
  std::string why;
  DFP_CHECK(cuda::gpu_available(&why), Status::unsupported, "CUDA device: " + why);
  impl_.reset(new Impl{precision, cuda::Executor(cuda::make_gpu_backend(precision == CudaPrecision::fp16), host, sgd,
                                                 momentum)});
#else
  (void)host;
  (void)precision;
  (void)sgd;
  (void)momentum;
  fail(Status::unsupported, kNoCuda);
#endif
}

CudaModel::~CudaModel() = default;

StepResult CudaModel::train_step(const float* images, const int32_t* labels, int count, float lr, LossScaler& scaler) {
  return impl_->ex.train_step(images, labels, count, lr, scaler);
}
StepResult CudaModel::evaluate(const float* images, const int32_t* labels, int count) {
  return impl_->ex.evaluate(images, labels, count);
}
void CudaModel::download(Model& host, std::vector<std::vector<float>>* momentum) { impl_->ex.download(host, momentum); }
CudaPrecision CudaModel::precision() const noexcept { return impl_->precision; }
uint64_t CudaModel::step() const noexcept { return impl_->ex.step(); }
std::string CudaModel::describe() const { return impl_->ex.describe(); }
cuda::Executor& CudaModel::executor() noexcept { return impl_->ex; }

}  // namespace dfp
