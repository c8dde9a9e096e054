// dfp: the optional CUDA device, for comparing CPU training with GPU mixed precision.
//
// A CudaModel runs a built Model's graph on one NVIDIA GPU: activations and gradients in FP16 with
// FP32 master weights (fp16, like PyTorch AMP: cuDNN convolutions on tensor cores with FP32
// accumulation, cuBLAS GEMMs, dynamic loss scaling through the same LossScaler as the CPU), or all
// in FP32 with TF32 disabled (fp32, the GPU baseline). Every layer computes the function its CPU
// counterpart computes (same BatchNorm statistics, pooling windows, dropout masks, loss).
//
// The device exists only in builds where CMake found nvcc and cuDNN (DFP_CUDA, see README). The
// API is the same in every build: without CUDA, or without a usable GPU at run time,
// cuda_available() is false with the reason and constructing a CudaModel throws
// Error(Status::unsupported) with it, so callers need no #ifdef. No CUDA type appears here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dfp/loss_scale.hpp"
#include "dfp/model.hpp"
#include "dfp/optim.hpp"

namespace dfp {

class Context;
namespace cuda {
class Executor;  // src/cuda/executor.hpp
}

// True when this dfp was built with CUDA and a usable GPU is present; otherwise false, with the
// reason in *why (built without CUDA, no device, driver too old, GPU architecture not compiled).
bool cuda_available(std::string* why = nullptr);

struct CudaOptions {
  // Each convolution pass takes the fastest algorithm cuDNN measures on this GPU when the model
  // is planned (as PyTorch's torch.backends.cudnn.benchmark); the choice, and so the rounding,
  // can differ between runs. Off: the first algorithm cuDNN's heuristics rank, the same in every
  // run on one GPU and library version.
  bool cudnn_benchmark = false;
};

class CudaModel {
 public:
  // host: a built Model (its batch size is the device's). Copies the graph, the parameters, the
  // BatchNorm running statistics and the step counter to the GPU. precision: Precision::fp16 or
  // Precision::fp32 (the GPU runs no other; anything else is Error(invalid_argument)). momentum: SGD momentum buffers
  // in Model::parameters() order (null: zeros), e.g. from a resumed checkpoint. Allocates every
  // device buffer now; steps allocate nothing.
  CudaModel(const Context& ctx, Model& host, Precision precision, const SgdOptions& sgd,
            const std::vector<std::vector<float>>* momentum = nullptr, const CudaOptions& options = {});
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  // One training step (forward, loss, backward, unscale, SGD) on a full batch in the Loader's
  // blocked layout. The loss gradient is multiplied by scaler.scale(); scaler.update() is called
  // with whether every unscaled gradient was finite, and the SGD update runs only if it says so.
  // With fp32, non-finite logits are Error(numerical_error) as on the CPU; with fp16 the step is
  // skipped (and the scale backs off) instead.
  StepResult train_step(const float* images, const int32_t* labels, int count, float lr, LossScaler& scaler);
  // Evaluation-mode forward and loss on 1..batch images.
  StepResult evaluate(const float* images, const int32_t* labels, int count);
  // Copies the parameters, BatchNorm running statistics, step counter and (when non-null) the
  // momentum buffers back to `host`, e.g. before writing a checkpoint.
  void download(Model& host, std::vector<std::vector<float>>* momentum = nullptr);

  Precision precision() const noexcept;
  uint64_t step() const noexcept;
  // One line: GPU, compute capability, library versions, precision and math modes.
  std::string describe() const;
  // Internal (tests): the runner behind this model.
  cuda::Executor& executor() noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dfp
