// dfp::CudaModel and cuda_available(): the GPU back end in builds with CUDA (DFP_HAVE_CUDA, set by
// CMake for this file only), a clear "built without CUDA" error otherwise.
#include "dfp/cuda.hpp"

#include "dfp/status.hpp"
#include "src/cuda/executor.hpp"

#if DFP_HAVE_CUDA
#include <dlfcn.h>
#include <unistd.h>

#include <filesystem>
#endif

namespace dfp {

namespace {
#if !DFP_HAVE_CUDA
constexpr const char* kNoCuda = "this dfp was built without CUDA (nvcc/cuDNN not found at configure time)";
#else
// The GPU back end is a module of its own (libdfp_cuda_gpu.so, linked to cudart, cuBLAS and cuDNN),
// loaded on first use: CPU-only runs never map those libraries. Looked up next to the running
// program and next to the object holding this code (libdfp.so when shared), then in the library
// directory of an installed tree relative to the program (bin/../lib...), then where the build put
// it, then on the loader's search path.
struct GpuModule {
  void* handle = nullptr;
  std::string error;
  bool (*available)(std::string*) = nullptr;
  cuda::Backend* (*make)(bool, bool) = nullptr;
};

GpuModule load_gpu_module() {
  GpuModule m;
  std::vector<std::string> candidates;
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back((self.parent_path() / "libdfp_cuda_gpu.so").string());
  Dl_info here{};
  if (dladdr(reinterpret_cast<void*>(&load_gpu_module), &here) && here.dli_fname && here.dli_fname[0] == '/')
    candidates.push_back((std::filesystem::path(here.dli_fname).parent_path() / "libdfp_cuda_gpu.so").string());
  if (!self.empty())
    candidates.push_back((self.parent_path() / DFP_CUDA_LIB_FROM_BIN / "libdfp_cuda_gpu.so").lexically_normal().string());
  candidates.push_back(DFP_CUDA_MODULE);  // the build tree
  candidates.push_back("libdfp_cuda_gpu.so");
  for (const std::string& c : candidates) {
    if (c.find('/') != std::string::npos && !std::filesystem::exists(c, ec)) continue;
    // dlopen keeps one reference per call and returns the same handle: the module is never
    // unloaded (the CUDA runtime does not support it), so nothing is kept here between calls.
    m.handle = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (m.handle) break;
    m.error += std::string(m.error.empty() ? "" : "; ") + dlerror();
  }
  if (!m.handle) {
    if (m.error.empty()) m.error = "libdfp_cuda_gpu.so not found next to the program or at " DFP_CUDA_MODULE;
    return m;
  }
  m.available = reinterpret_cast<bool (*)(std::string*)>(dlsym(m.handle, "dfp_cuda_gpu_available"));
  m.make = reinterpret_cast<cuda::Backend* (*)(bool, bool)>(dlsym(m.handle, "dfp_cuda_make_gpu_backend"));
  if (!m.available || !m.make) m.error = "libdfp_cuda_gpu.so lacks its entry points (a module of another dfp build?)";
  return m;
}
#endif
}  // namespace

bool cuda_available(std::string* why) {
#if DFP_HAVE_CUDA
  const GpuModule m = load_gpu_module();
  if (!m.error.empty()) {
    if (why) *why = "cannot load the CUDA back end: " + m.error;
    return false;
  }
  return m.available(why);
#else
  if (why) *why = kNoCuda;
  return false;
#endif
}

struct CudaModel::Impl {
  Precision precision;
  cuda::Executor ex;
};

CudaModel::CudaModel(const Context&, Model& host, Precision precision, const SgdOptions& sgd,
                     const std::vector<std::vector<float>>* momentum, const CudaOptions& options) {
  DFP_CHECK(precision == Precision::fp16 || precision == Precision::fp32, Status::invalid_argument,
            std::string("CUDA device: precision ") + precision_name(precision) + " is not available; expected fp16 or fp32");
#if DFP_HAVE_CUDA
  std::string why;
  DFP_CHECK(cuda_available(&why), Status::unsupported, "CUDA device: " + why);
  const GpuModule m = load_gpu_module();
  impl_.reset(new Impl{precision,
                       cuda::Executor(std::unique_ptr<cuda::Backend>(m.make(precision == Precision::fp16,
                                                                            options.cudnn_benchmark)),
                                      host, sgd, momentum)});
#else
  (void)host;
  (void)precision;
  (void)sgd;
  (void)momentum;
  (void)options;
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
Precision CudaModel::precision() const noexcept { return impl_->precision; }
uint64_t CudaModel::step() const noexcept { return impl_->ex.step(); }
std::string CudaModel::describe() const { return impl_->ex.describe(); }
cuda::Executor& CudaModel::executor() noexcept { return impl_->ex; }

}  // namespace dfp
