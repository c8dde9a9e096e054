// The CUDA device's model runner: plans a host Model's graph onto a Backend (buffers, cuDNN
// convolutions, parameter segments) once, then runs training steps and evaluations with the same
// semantics as the CPU Model (every layer of src/layers/, the softmax cross-entropy of model_step.cpp,
// SGD of optim.cpp) and the LossScaler state machine on the host.
//
// A training step: stage the batch (laid out as NHWC on the host's threads into pinned memory,
// copied on its own stream), convert it to the activation type, forward,
// loss (its gradient multiplied by the loss scale), backward (cuDNN/cuBLAS write T weight
// gradients, own kernels FP32 BatchNorm and bias gradients), unscale every parameter gradient into
// the FP32 master gradient with a found-inf flag, one small copy back (loss, hits, flags), then
// LossScaler::update on the host decides whether the SGD kernel (which also refreshes the T weight
// copies) runs. Nothing is allocated after construction.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dfp/loss_scale.hpp"
#include "dfp/model.hpp"
#include "dfp/optim.hpp"
#include "src/cuda/backend.hpp"

namespace dfp::cuda {

class Executor {
 public:
  // host: a built Model. Its graph, parameters, BatchNorm running statistics and step counter are
  // copied to the device; momentum: SGD momentum buffers in Model::parameters() order (null: zeros).
  Executor(std::unique_ptr<Backend> backend, Model& host, const SgdOptions& sgd,
           const std::vector<std::vector<float>>* momentum);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // One training step on a full batch (count == batch), blocked FP32 images as the Loader makes them.
  StepResult train_step(const float* images, const int32_t* labels, int count, float lr, LossScaler& scaler);
  // Forward in evaluation mode (running statistics, no dropout) on 1..batch images.
  StepResult evaluate(const float* images, const int32_t* labels, int count);

  // Host -> device: parameters, running statistics, momentum (null: zeros), step.
  void upload(Model& host, const std::vector<std::vector<float>>* momentum);
  // Device -> host: parameters, running statistics, momentum (if non-null), step; then the host
  // model's weights_updated(), so that it can run (or be checkpointed) as it is.
  void download(Model& host, std::vector<std::vector<float>>* momentum);
  // The FP32 parameter gradients of the last training step (unscaled), Model::parameters() order.
  std::vector<std::vector<float>> gradients();

  // Per-layer timing: with it on, every layer waits for the device before and after it runs, and
  // its wall time is added to its row (forward, backward); steps get slower by about one
  // synchronisation per layer. Rows are the graph's nodes in order; turning timing on, or
  // reset_profile(), zeroes them; turning it off keeps them for reading.
  struct LayerTime {
    std::string name, kind;
    double forward_ms = 0, backward_ms = 0;
  };
  struct StepTime {
    double stage_ms = 0, loss_ms = 0, update_ms = 0;  // batch staging, loss + unscale, SGD
    int steps = 0;
  };
  void set_profile(bool on);
  const std::vector<LayerTime>& layer_times() const noexcept { return layer_times_; }
  const StepTime& step_times() const noexcept { return step_times_; }
  void reset_profile();

  uint64_t step() const noexcept { return step_; }
  int batch() const noexcept { return batch_; }
  Backend& backend() noexcept { return *be_; }
  std::string describe() const;

 private:
  struct NodeRt;
  struct ParamRt;
  void forward(const Staged& in, bool train);
  void backward();
  void* at(void* base, size_t elems) const;
  StepStats finish(const Staged& in, int count, bool train, float scale);
  Staged stage(const float* images, const int32_t* labels, int count);

  std::unique_ptr<Backend> be_;
  const Context* ctx_;  // the host model's: its threads lay out the staged batch
  SgdOptions sgd_;
  int batch_ = 0, loss_node_ = 0, classes_ = 0;
  float smoothing_ = 0.f;
  size_t image_bytes_ = 0;  // one staged image (NHWC FP32)
  uint64_t step_ = 0;
  std::vector<NodeRt> nodes_;
  std::vector<ParamRt> params_;
  size_t total_ = 0, total_dev_ = 0;  // master elements, device-copy elements
  float *w_ = nullptr, *g_ = nullptr, *v_ = nullptr;
  void *wdev_ = nullptr, *gdev_ = nullptr;
  ParamSeg* segs_ = nullptr;
  double *sums_ = nullptr, *scratch_ = nullptr;
  double* loss_ = nullptr;
  int *hit1_ = nullptr, *hit5_ = nullptr;
  StepStats* stats_ = nullptr;
  bool profile_ = false;
  std::vector<LayerTime> layer_times_;
  StepTime step_times_;
};

}  // namespace dfp::cuda
