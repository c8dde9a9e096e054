// The two back ends of the CUDA device: the GPU (gpu_backend.cu: kernels, cuDNN, cuBLAS, streams)
// and a host emulation (host_backend.cpp: the same operation bodies in plain loops, reference
// convolutions and GEMMs, FP32 only). The Executor (executor.hpp) plans and runs a model against
// this interface, so everything but the GPU back end itself is exercised by the GPU-less tests.
//
// Pointers handed to and returned by a Backend are device pointers (host memory for the host back
// end): the Executor never dereferences them. Allocation happens only while a model is planned;
// a training step allocates nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "src/cuda/ops.hpp"

namespace dfp::cuda {

// A convolution as cuDNN sees it: NHWC input N x C x H x W, KRSC weights (K x R x S x C/groups),
// NHWC output N x K x OH x OW. With groups > 1, output channel k reads the input channels of its
// group, k / (K/groups).
struct ConvDims {
  int N = 0, C = 0, H = 0, W = 0, K = 0, R = 0, S = 0, stride = 1, pad = 0, OH = 0, OW = 0, groups = 1;
  int group_channels() const { return C / groups; }  // input channels each output channel reads
};

struct Staged {
  const float* images = nullptr;  // the blocked batch on the device
  const int32_t* labels = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // Element type of activations, activation gradients and device weight copies: FP16 (true) or FP32.
  virtual bool half() const = 0;
  size_t elem_bytes() const { return half() ? 2 : 4; }
  // One line: the device, library versions and math modes.
  virtual std::string describe() const = 0;

  // ---- planning (may allocate) ----
  virtual void* alloc(size_t bytes) = 0;  // zero-filled; lives as long as the back end
  // Pinned host staging and device buffers for batches of `image_bytes` (NHWC FP32, the model's
  // own channels: no blocked-layout padding crosses the bus) and `label_bytes`, double-buffered
  // so that the copy of one batch overlaps the previous step.
  virtual void reserve_staging(size_t image_bytes, size_t label_bytes) = 0;
  // Returns an id for conv_*; chooses the algorithms of all three passes.
  virtual int conv_plan(const ConvDims& d) = 0;
  // Every conv_plan() is done: allocates the shared workspace.
  virtual void planned() = 0;

  // ---- transfers ----
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;    // waits until done
  virtual void download(void* dst, const void* src, size_t bytes) = 0;  // waits for queued work
  // The host side of the next staging slot, once the copy that last read it is done: the caller
  // writes the batch there (images in the layout of reserve_staging), then calls commit().
  struct HostSlot {
    float* images;
    int32_t* labels;
  };
  virtual HostSlot staging_slot() = 0;
  // Queues the copy of the slot's first `image_bytes` (the rest of the device buffer is zeroed)
  // and `label_bytes`; work queued afterwards sees them.
  virtual Staged commit(size_t image_bytes, size_t label_bytes) = 0;
  // Waits for all queued work, then copies `bytes` (small: the step's statistics) to the host.
  virtual void read_back(void* host, const void* dev, size_t bytes) = 0;
  // Waits for all queued work (per-layer timing only: it serialises host and device).
  virtual void synchronize() = 0;

  // ---- queued work ----
  // Runs the functor of `op` (args: the matching XArgs struct of ops.hpp) for i in [0, n).
  virtual void run(Op op, const void* args, size_t n) = 0;
  template <class A>
  void run(const A& args, size_t n) { run(A::kOp, &args, n); }
  virtual void reduce(const ReduceArgs& a) = 0;
  virtual void conv_fwd(int id, const void* x, const void* w, void* y) = 0;
  virtual void conv_bwd_data(int id, const void* w, const void* dy, void* dx, bool accumulate) = 0;
  virtual void conv_bwd_filter(int id, const void* x, const void* dy, void* dw) = 0;
  // Row-major C[M][N] (+)= op(A)[M][K] * op(B)[K][N], FP32 accumulation; op(A) = A^T when ta
  // (A stored K x M), likewise B. Leading dimensions in elements.
  virtual void gemm(bool ta, bool tb, int M, int N, int K, const void* A, int lda, const void* B, int ldb,
                    void* C, int ldc, bool accumulate) = 0;
};

// The host emulation (FP32 only).
std::unique_ptr<Backend> make_host_backend();

// The GPU (defined only in builds with CUDA). fp16: FP16 tensors on tensor cores with FP32
// accumulation; otherwise FP32 tensors with TF32 disabled. benchmark: each convolution pass takes
// the fastest algorithm cuDNN measures on this GPU at planning time (cudnnFind*, as PyTorch's
// cudnn.benchmark; the choice, and so the rounding, can differ between runs); otherwise the first
// that cuDNN's heuristics rank (the same every run on one GPU and library version).
std::unique_ptr<Backend> make_gpu_backend(bool fp16, bool benchmark);
// Whether a usable GPU is present; the reason in *why when not.
bool gpu_available(std::string* why);

}  // namespace dfp::cuda
