// The GPU back end of the CUDA device: own kernels (the functors of ops.hpp in a grid-stride loop,
// per-channel reductions in shared memory), cuDNN convolutions, cuBLAS GEMMs, a compute stream and
// a copy stream with pinned, double-buffered batch staging.
//
// Numerics. fp16: activations, activation gradients and the weight copies the libraries read are
// FP16; convolutions are cuDNN's "pseudo half" configuration (FP16 data, FP32 compute type) with
// the tensor-core math type the heuristics pick; GEMMs are cublasGemmEx with FP16 operands and
// CUBLAS_COMPUTE_32F. fp32: the same with FP32 data, cuDNN restricted to CUDNN_FMA_MATH and cuBLAS
// to CUBLAS_COMPUTE_32F under the default math mode, so TF32 is never used.
//
// Every cuDNN/cuBLAS/CUDA call is checked; a failure throws dfp::Error naming the call and, for
// convolutions, the layer shape.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "dfp/status.hpp"
#include "src/cuda/backend.hpp"

#ifndef DFP_CUDA_ARCHS
#define DFP_CUDA_ARCHS "?"
#endif

namespace dfp::cuda {
namespace {

[[noreturn]] void cuda_fail(const std::string& what, cudaError_t e) {
  fail(e == cudaErrorMemoryAllocation ? Status::unsupported : Status::internal,
       "CUDA device: " + what + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}
void cu_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) cuda_fail(what, e);
}
void dnn_check(cudnnStatus_t s, const std::string& what) {
  if (s != CUDNN_STATUS_SUCCESS)
    fail(Status::internal, "CUDA device: cuDNN " + what + " failed: " + cudnnGetErrorString(s));
}
void blas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    fail(Status::internal, std::string("CUDA device: cuBLAS ") + what + " failed: " + cublasGetStatusString(s));
}
#define DFP_CU(call) cu_check((call), #call)
#define DFP_BLAS(call) blas_check((call), #call)

// ---- kernels ------------------------------------------------------------------------------------

template <class F>
__global__ void for_each_kernel(F f, size_t n) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}

// Per-channel sums over the rows of a rows x C tensor: block (32 channels) x (8 row lanes), grid
// (channel groups) x (parts). Each thread sums its rows in FP32, the 8 lanes of a channel are added
// in FP64, and every part writes its FP64 partial sums to scratch[part][2C]. A thread reads four
// rows per iteration before adding any: with one load in flight per thread the sums run at a
// fraction of the memory bandwidth (they are latency-bound, not bandwidth-bound).
constexpr int kReduceRowLanes = 8;
template <class T>
__global__ void reduce_partial_kernel(ReduceArgs a, int parts) {
  __shared__ float su[kReduceRowLanes][32], sv[kReduceRowLanes][32];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float u = 0.f, v = 0.f;
  if (c < a.C) {
    const size_t step = size_t(parts) * kReduceRowLanes;
    size_t r = size_t(blockIdx.y) * kReduceRowLanes + threadIdx.y;
    for (; r + 3 * step < a.rows; r += 4 * step) {
      float tu[4], tv[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) reduce_term<T>(a, r + k * step, c, tu[k], tv[k]);
      u += (tu[0] + tu[1]) + (tu[2] + tu[3]);
      v += (tv[0] + tv[1]) + (tv[2] + tv[3]);
    }
    for (; r < a.rows; r += step) {
      float tu = 0.f, tv = 0.f;
      reduce_term<T>(a, r, c, tu, tv);
      u += tu;
      v += tv;
    }
  }
  su[threadIdx.y][threadIdx.x] = u;
  sv[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.y == 0 && c < a.C) {
    double du = 0, dv = 0;
    for (int j = 0; j < kReduceRowLanes; ++j) {
      du += su[j][threadIdx.x];
      dv += sv[j][threadIdx.x];
    }
    double* part = a.scratch + size_t(blockIdx.y) * 2 * a.C;
    part[c] = du;
    part[a.C + c] = dv;
  }
}
// out[j] = sum over parts of scratch[part][j], j in [0, 2C): block (32 values of j) x (32 part
// lanes); lane y sums parts y, y+32, ..., then lane 0 adds the 32 lane sums in lane order. The
// order is fixed, so the result is deterministic; the lanes keep 32 loads in flight per j.
constexpr int kFinalLanes = 32;
__global__ void reduce_final_kernel(const double* scratch, int parts, int twoC, double* out) {
  __shared__ double s[kFinalLanes][32];
  const int j = blockIdx.x * 32 + threadIdx.x;
  double acc = 0;
  if (j < twoC)
    for (int p = threadIdx.y; p < parts; p += kFinalLanes) acc += scratch[size_t(p) * twoC + j];
  s[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && j < twoC) {
    double t = 0;
    for (int k = 0; k < kFinalLanes; ++k) t += s[k][threadIdx.x];
    out[j] = t;
  }
}

__global__ void probe_kernel(int* p) {
  if (p) *p = 1;
}

// ---- convolutions ---------------------------------------------------------------------------------

constexpr size_t kMaxConvWorkspace = size_t(1) << 30;  // per algorithm; larger ones are passed over

struct ConvPlan {
  ConvDims d;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t cv[3] = {nullptr, nullptr, nullptr};  // fwd, bwd data, bwd filter
  cudnnConvolutionFwdAlgo_t fwd = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  cudnnConvolutionBwdDataAlgo_t data = CUDNN_CONVOLUTION_BWD_DATA_ALGO_0;
  cudnnConvolutionBwdFilterAlgo_t filter = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0;
  size_t ws[3] = {0, 0, 0};
  std::string name;  // for messages
};

std::string dims_text(const ConvDims& d) {
  return "conv N=" + std::to_string(d.N) + " C=" + std::to_string(d.C) + " H=" + std::to_string(d.H) +
         " W=" + std::to_string(d.W) + " K=" + std::to_string(d.K) + " " + std::to_string(d.R) + "x" +
         std::to_string(d.S) + " stride " + std::to_string(d.stride) + " pad " + std::to_string(d.pad) +
         (d.groups > 1 ? " groups " + std::to_string(d.groups) : std::string());
}

bool tensor_math(cudnnMathType_t m) { return m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION; }

class GpuBackend final : public Backend {
 public:
  GpuBackend(bool fp16, bool benchmark) : half_(fp16), benchmark_(benchmark) {
    try {
      DFP_CU(cudaGetDevice(&device_));
      DFP_CU(cudaGetDeviceProperties(&prop_, device_));
      DFP_CU(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
      DFP_CU(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
      for (int s = 0; s < 2; ++s) {
        DFP_CU(cudaEventCreateWithFlags(&copied_[s], cudaEventDisableTiming));
        DFP_CU(cudaEventCreateWithFlags(&consumed_[s], cudaEventDisableTiming));
      }
      dnn_check(cudnnCreate(&dnn_), "cudnnCreate");
      dnn_check(cudnnSetStream(dnn_, compute_), "cudnnSetStream");
      DFP_BLAS(cublasCreate(&blas_));
      DFP_BLAS(cublasSetStream(blas_, compute_));  // resets the workspace: set ours afterwards
      DFP_BLAS(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));
      blas_ws_ = alloc(kBlasWorkspace);
      DFP_BLAS(cublasSetWorkspace(blas_, blas_ws_, kBlasWorkspace));
      DFP_CU(cudaHostAlloc(&small_, kSmall, cudaHostAllocDefault));
      max_blocks_ = std::max(1, prop_.multiProcessorCount) * 32;
    } catch (...) {
      release();
      throw;
    }
  }
  ~GpuBackend() override { release(); }

  bool half() const override { return half_; }

  std::string describe() const override {
    int rt = 0, drv = 0, blas = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    if (blas_) cublasGetVersion(blas_, &blas);
    const size_t dnn = cudnnGetVersion();
    auto ver = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
    char mem[32];
    std::snprintf(mem, sizeof mem, "%.1f GiB", double(prop_.totalGlobalMem) / (1 << 30));
    return std::string(prop_.name) + " (sm_" + std::to_string(prop_.major) + std::to_string(prop_.minor) + ", " +
           std::to_string(prop_.multiProcessorCount) + " SMs, " + mem + "), driver " + ver(drv) + ", runtime " +
           ver(rt) + ", cuDNN " + std::to_string(dnn / 10000) + "." + std::to_string(dnn % 10000 / 100) + "." +
           std::to_string(dnn % 100) + ", cuBLAS " + std::to_string(blas) +
           (half_ ? "; fp16: FP16 activations/gradients, FP32 master weights, tensor cores with FP32 accumulation"
                  : "; fp32: FP32 everywhere, TF32 off") +
           (benchmark_ ? "; cuDNN algorithms measured (benchmark)" : "; cuDNN algorithms by heuristics");
  }

  // ---- planning ----
  void* alloc(size_t bytes) override {
    void* p = nullptr;
    DFP_CU(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
    dev_.push_back(p);
    DFP_CU(cudaMemsetAsync(p, 0, bytes, compute_));
    return p;
  }
  void reserve_staging(size_t image_bytes, size_t label_bytes) override {
    image_total_ = image_bytes;
    label_total_ = label_bytes;
    for (int s = 0; s < 2; ++s) {
      DFP_CU(cudaHostAlloc(&pin_img_[s], std::max<size_t>(image_bytes, 1), cudaHostAllocDefault));
      DFP_CU(cudaHostAlloc(&pin_lab_[s], std::max<size_t>(label_bytes, 1), cudaHostAllocDefault));
      dev_img_[s] = static_cast<float*>(alloc(image_bytes));
      dev_lab_[s] = static_cast<int32_t*>(alloc(label_bytes));
    }
  }
  int conv_plan(const ConvDims& d) override {
    ConvPlan c;
    c.d = d;
    c.name = dims_text(d);
    convs_.push_back(c);  // owned from here on (released with the back end if planning throws)
    ConvPlan& p = convs_.back();
    const cudnnDataType_t dt = half_ ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
    dnn_check(cudnnCreateTensorDescriptor(&p.x), "cudnnCreateTensorDescriptor");
    dnn_check(cudnnCreateTensorDescriptor(&p.y), "cudnnCreateTensorDescriptor");
    dnn_check(cudnnCreateFilterDescriptor(&p.w), "cudnnCreateFilterDescriptor");
    for (auto& cv : p.cv) dnn_check(cudnnCreateConvolutionDescriptor(&cv), "cudnnCreateConvolutionDescriptor");
    dnn_check(cudnnSetTensor4dDescriptor(p.x, CUDNN_TENSOR_NHWC, dt, d.N, d.C, d.H, d.W),
              "cudnnSetTensor4dDescriptor (input) of " + p.name);
    dnn_check(cudnnSetFilter4dDescriptor(p.w, dt, CUDNN_TENSOR_NHWC, d.K, d.group_channels(), d.R, d.S),
              "cudnnSetFilter4dDescriptor of " + p.name);
    for (auto cv : p.cv) {
      // FP32 compute type for both precisions (FP16 data: cuDNN's pseudo-half configuration).
      dnn_check(cudnnSetConvolution2dDescriptor(cv, d.pad, d.pad, d.stride, d.stride, 1, 1, CUDNN_CROSS_CORRELATION,
                                                CUDNN_DATA_FLOAT),
                "cudnnSetConvolution2dDescriptor of " + p.name);
      dnn_check(cudnnSetConvolutionMathType(cv, half_ ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH),
                "cudnnSetConvolutionMathType of " + p.name);
      // Grouped: the filter holds C/groups input channels per output channel.
      dnn_check(cudnnSetConvolutionGroupCount(cv, d.groups), "cudnnSetConvolutionGroupCount of " + p.name);
    }
    int on = 0, oc = 0, oh = 0, ow = 0;
    dnn_check(cudnnGetConvolution2dForwardOutputDim(p.cv[0], p.x, p.w, &on, &oc, &oh, &ow),
              "cudnnGetConvolution2dForwardOutputDim of " + p.name);
    DFP_CHECK(on == d.N && oc == d.K && oh == d.OH && ow == d.OW, Status::internal,
              "CUDA device: cuDNN's output shape of " + p.name + " (" + std::to_string(oh) + "x" + std::to_string(ow) +
                  ") differs from the model's (" + std::to_string(d.OH) + "x" + std::to_string(d.OW) + ")");
    dnn_check(cudnnSetTensor4dDescriptor(p.y, CUDNN_TENSOR_NHWC, dt, d.N, d.K, d.OH, d.OW),
              "cudnnSetTensor4dDescriptor (output) of " + p.name);

    int max = 0, got = 0;
    dnn_check(cudnnGetConvolutionForwardAlgorithmMaxCount(dnn_, &max), "cudnnGetConvolutionForwardAlgorithmMaxCount");
    std::vector<cudnnConvolutionFwdAlgoPerf_t> pf(std::max(max, 1));
    if (benchmark_)
      dnn_check(cudnnFindConvolutionForwardAlgorithm(dnn_, p.x, p.w, p.cv[0], p.y, int(pf.size()), &got, pf.data()),
                "cudnnFindConvolutionForwardAlgorithm of " + p.name);
    else
      dnn_check(cudnnGetConvolutionForwardAlgorithm_v7(dnn_, p.x, p.w, p.cv[0], p.y, int(pf.size()), &got, pf.data()),
                "cudnnGetConvolutionForwardAlgorithm_v7 of " + p.name);
    pick(pf.data(), got, p.cv[0], "forward", p, p.fwd, p.ws[0], [&](cudnnConvolutionFwdAlgo_t a, size_t* b) {
      return cudnnGetConvolutionForwardWorkspaceSize(dnn_, p.x, p.w, p.cv[0], p.y, a, b);
    });

    dnn_check(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(dnn_, &max),
              "cudnnGetConvolutionBackwardDataAlgorithmMaxCount");
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> pd(std::max(max, 1));
    if (benchmark_)
      dnn_check(cudnnFindConvolutionBackwardDataAlgorithm(dnn_, p.w, p.y, p.cv[1], p.x, int(pd.size()), &got, pd.data()),
                "cudnnFindConvolutionBackwardDataAlgorithm of " + p.name);
    else
      dnn_check(cudnnGetConvolutionBackwardDataAlgorithm_v7(dnn_, p.w, p.y, p.cv[1], p.x, int(pd.size()), &got, pd.data()),
                "cudnnGetConvolutionBackwardDataAlgorithm_v7 of " + p.name);
    pick(pd.data(), got, p.cv[1], "backward-data", p, p.data, p.ws[1], [&](cudnnConvolutionBwdDataAlgo_t a, size_t* b) {
      return cudnnGetConvolutionBackwardDataWorkspaceSize(dnn_, p.w, p.y, p.cv[1], p.x, a, b);
    });

    dnn_check(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(dnn_, &max),
              "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount");
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> pw(std::max(max, 1));
    if (benchmark_)
      dnn_check(cudnnFindConvolutionBackwardFilterAlgorithm(dnn_, p.x, p.y, p.cv[2], p.w, int(pw.size()), &got, pw.data()),
                "cudnnFindConvolutionBackwardFilterAlgorithm of " + p.name);
    else
      dnn_check(cudnnGetConvolutionBackwardFilterAlgorithm_v7(dnn_, p.x, p.y, p.cv[2], p.w, int(pw.size()), &got, pw.data()),
                "cudnnGetConvolutionBackwardFilterAlgorithm_v7 of " + p.name);
    pick(pw.data(), got, p.cv[2], "backward-filter", p, p.filter, p.ws[2],
         [&](cudnnConvolutionBwdFilterAlgo_t a, size_t* b) {
           return cudnnGetConvolutionBackwardFilterWorkspaceSize(dnn_, p.x, p.y, p.cv[2], p.w, a, b);
         });
    for (size_t b : p.ws) workspace_need_ = std::max(workspace_need_, b);
    return int(convs_.size()) - 1;
  }
  void planned() override {
    if (workspace_need_ > workspace_bytes_) {
      workspace_ = alloc(workspace_need_);
      workspace_bytes_ = workspace_need_;
    }
    DFP_CU(cudaStreamSynchronize(compute_));
  }

  // ---- transfers ----
  void upload(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    DFP_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, compute_));
    DFP_CU(cudaStreamSynchronize(compute_));
  }
  void download(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    DFP_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, compute_));
    DFP_CU(cudaStreamSynchronize(compute_));
  }
  // Slot s alternates per batch. The host writes the batch into pinned slot s once the copy that
  // last read it is done (event copied_[s]); the copy stream waits until the compute stream is
  // past the step that last read device slot s (event consumed_[s], recorded when the next batch
  // was staged); the compute stream waits for the copy. So the copy of batch k+1 overlaps the tail
  // of step k (its SGD update), whatever the host does in between.
  HostSlot staging_slot() override {
    DFP_CU(cudaEventSynchronize(copied_[slot_]));
    return {static_cast<float*>(pin_img_[slot_]), static_cast<int32_t*>(pin_lab_[slot_])};
  }
  Staged commit(size_t image_bytes, size_t label_bytes) override {
    DFP_CHECK(image_bytes <= image_total_ && label_bytes <= label_total_, Status::internal,
              "CUDA device: batch larger than the staging buffers");
    const int s = slot_, prev = slot_ ^ 1;
    slot_ ^= 1;
    DFP_CU(cudaEventRecord(consumed_[prev], compute_));  // everything queued so far read slot prev
    DFP_CU(cudaStreamWaitEvent(copy_, consumed_[s], 0));
    DFP_CU(cudaMemcpyAsync(dev_img_[s], pin_img_[s], image_bytes, cudaMemcpyHostToDevice, copy_));
    if (image_bytes < image_total_)
      DFP_CU(cudaMemsetAsync(reinterpret_cast<char*>(dev_img_[s]) + image_bytes, 0, image_total_ - image_bytes, copy_));
    DFP_CU(cudaMemcpyAsync(dev_lab_[s], pin_lab_[s], label_bytes, cudaMemcpyHostToDevice, copy_));
    DFP_CU(cudaEventRecord(copied_[s], copy_));
    DFP_CU(cudaStreamWaitEvent(compute_, copied_[s], 0));
    return {dev_img_[s], dev_lab_[s]};
  }
  void read_back(void* host, const void* dev, size_t bytes) override {
    DFP_CHECK(bytes <= kSmall, Status::internal, "CUDA device: read_back of more than 256 bytes");
    DFP_CU(cudaMemcpyAsync(small_, dev, bytes, cudaMemcpyDeviceToHost, compute_));
    DFP_CU(cudaStreamSynchronize(compute_));  // also reports errors of the step's kernels
    std::memcpy(host, small_, bytes);
  }

  void synchronize() override { DFP_CU(cudaStreamSynchronize(compute_)); }

  // ---- queued work ----
  void run(Op op, const void* args, size_t n) override {
    if (n == 0) return;
    if (half_) dispatch<__half>(op, args, n);
    else dispatch<float>(op, args, n);
  }
  void reduce(const ReduceArgs& a) override {
    if (a.C <= 0) return;
    // About 512 rows per part (64 per thread), at most kReduceParts parts.
    const int parts = int(std::clamp<size_t>((a.rows + 511) / 512, 1, kReduceParts));
    const dim3 grid((a.C + 31) / 32, parts), block(32, kReduceRowLanes);
    if (half_) reduce_partial_kernel<__half><<<grid, block, 0, compute_>>>(a, parts);
    else reduce_partial_kernel<float><<<grid, block, 0, compute_>>>(a, parts);
    DFP_CU(cudaGetLastError());
    reduce_final_kernel<<<(2 * a.C + 31) / 32, dim3(32, kFinalLanes), 0, compute_>>>(a.scratch, parts, 2 * a.C, a.out);
    DFP_CU(cudaGetLastError());
  }
  void conv_fwd(int id, const void* x, const void* w, void* y) override {
    const ConvPlan& p = convs_[id];
    const float one = 1.f, zero = 0.f;
    dnn_check(cudnnConvolutionForward(dnn_, &one, p.x, x, p.w, w, p.cv[0], p.fwd, workspace_, p.ws[0], &zero, p.y, y),
              "cudnnConvolutionForward of " + p.name);
  }
  void conv_bwd_data(int id, const void* w, const void* dy, void* dx, bool accumulate) override {
    const ConvPlan& p = convs_[id];
    const float one = 1.f, beta = accumulate ? 1.f : 0.f;
    dnn_check(cudnnConvolutionBackwardData(dnn_, &one, p.w, w, p.y, dy, p.cv[1], p.data, workspace_, p.ws[1], &beta,
                                           p.x, dx),
              "cudnnConvolutionBackwardData of " + p.name);
  }
  void conv_bwd_filter(int id, const void* x, const void* dy, void* dw) override {
    const ConvPlan& p = convs_[id];
    const float one = 1.f, zero = 0.f;
    dnn_check(cudnnConvolutionBackwardFilter(dnn_, &one, p.x, x, p.y, dy, p.cv[2], p.filter, workspace_, p.ws[2],
                                             &zero, p.w, dw),
              "cudnnConvolutionBackwardFilter of " + p.name);
  }
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  void gemm(bool ta, bool tb, int M, int N, int K, const void* A, int lda, const void* B, int ldb, void* C, int ldc,
            bool accumulate) override {
    const cudaDataType_t dt = half_ ? CUDA_R_16F : CUDA_R_32F;
    const float one = 1.f, beta = accumulate ? 1.f : 0.f;
    DFP_BLAS(cublasGemmEx(blas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &one, B, dt,
                          ldb, A, dt, lda, &beta, C, dt, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

 private:
  static constexpr size_t kBlasWorkspace = size_t(32) << 20;  // cuBLAS' recommendation for Hopper
  static constexpr size_t kSmall = 256;

  template <class T>
  void dispatch(Op op, const void* args, size_t n) {
    const unsigned blocks = unsigned(std::min<size_t>((n + 255) / 256, size_t(max_blocks_)));
    switch (op) {
#define DFP_CASE(name)                                                                                 \
  case Op::name:                                                                                       \
    for_each_kernel<<<blocks, 256, 0, compute_>>>(name##Fn<T>{*static_cast<const name##Args*>(args)}, n); \
    break;
      DFP_CUDA_OPS(DFP_CASE)
#undef DFP_CASE
    }
    DFP_CU(cudaGetLastError());
  }

  // Picks the first algorithm (in the heuristics' order) that cuDNN reports as supported, whose
  // workspace fits kMaxConvWorkspace and whose math is allowed: fp16 prefers tensor-core math
  // (falling back to any), fp32 never takes tensor-core (TF32) math and runs with CUDNN_FMA_MATH.
  // The descriptor keeps the math type of the pick.
  template <class Perf, class Algo, class Workspace>
  void pick(const Perf* perf, int count, cudnnConvolutionDescriptor_t cv, const char* pass, const ConvPlan& p,
            Algo& algo, size_t& ws, Workspace workspace) {
    for (int round = 0; round < 2; ++round)
      for (int i = 0; i < count; ++i) {
        const Perf& c = perf[i];
        if (c.status != CUDNN_STATUS_SUCCESS) continue;
        const bool tensor = tensor_math(c.mathType);
        if (!half_ && tensor) continue;
        if (half_ && round == 0 && !tensor) continue;
        const cudnnMathType_t math = half_ ? c.mathType : CUDNN_FMA_MATH;
        if (cudnnSetConvolutionMathType(cv, math) != CUDNN_STATUS_SUCCESS) continue;
        size_t bytes = 0;
        if (workspace(c.algo, &bytes) != CUDNN_STATUS_SUCCESS || bytes > kMaxConvWorkspace) continue;
        algo = c.algo;
        ws = bytes;
        return;
      }
    fail(Status::unsupported, std::string("CUDA device: cuDNN offers no ") + pass + " algorithm for " + p.name +
                                  (half_ ? " in FP16" : " in FP32 without TF32") + " within " +
                                  std::to_string(kMaxConvWorkspace >> 20) + " MiB of workspace");
  }

  void release() noexcept {
    if (compute_) cudaStreamSynchronize(compute_);
    if (copy_) cudaStreamSynchronize(copy_);
    for (ConvPlan& p : convs_) {
      if (p.x) cudnnDestroyTensorDescriptor(p.x);
      if (p.y) cudnnDestroyTensorDescriptor(p.y);
      if (p.w) cudnnDestroyFilterDescriptor(p.w);
      for (auto cv : p.cv)
        if (cv) cudnnDestroyConvolutionDescriptor(cv);
    }
    convs_.clear();
    if (blas_) cublasDestroy(blas_);
    if (dnn_) cudnnDestroy(dnn_);
    blas_ = nullptr;
    dnn_ = nullptr;
    for (void* p : dev_) cudaFree(p);
    dev_.clear();
    for (int s = 0; s < 2; ++s) {
      if (pin_img_[s]) cudaFreeHost(pin_img_[s]);
      if (pin_lab_[s]) cudaFreeHost(pin_lab_[s]);
      if (copied_[s]) cudaEventDestroy(copied_[s]);
      if (consumed_[s]) cudaEventDestroy(consumed_[s]);
      pin_img_[s] = pin_lab_[s] = nullptr;
      copied_[s] = consumed_[s] = nullptr;
    }
    if (small_) cudaFreeHost(small_);
    small_ = nullptr;
    if (copy_) cudaStreamDestroy(copy_);
    if (compute_) cudaStreamDestroy(compute_);
    copy_ = compute_ = nullptr;
  }

  bool half_;
  bool benchmark_;
  int device_ = 0;
  cudaDeviceProp prop_{};
  int max_blocks_ = 1;
  cudaStream_t compute_ = nullptr, copy_ = nullptr;
  cudnnHandle_t dnn_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* blas_ws_ = nullptr;
  std::vector<void*> dev_;
  std::vector<ConvPlan> convs_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0, workspace_need_ = 0;
  void* pin_img_[2] = {nullptr, nullptr};
  void* pin_lab_[2] = {nullptr, nullptr};
  float* dev_img_[2] = {nullptr, nullptr};
  int32_t* dev_lab_[2] = {nullptr, nullptr};
  cudaEvent_t copied_[2] = {nullptr, nullptr}, consumed_[2] = {nullptr, nullptr};
  int slot_ = 0;
  size_t image_total_ = 0, label_total_ = 0;
  void* small_ = nullptr;
};

}  // namespace

std::unique_ptr<Backend> make_gpu_backend(bool fp16, bool benchmark) {
  return std::make_unique<GpuBackend>(fp16, benchmark);
}

bool gpu_available(std::string* why) {
  auto no = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    int rt = 0;
    cudaRuntimeGetVersion(&rt);
    if (e == cudaErrorNoDevice) return no("no CUDA GPU found");
    if (e == cudaErrorInsufficientDriver)
      return no("no usable CUDA GPU: no NVIDIA driver, or one older than the CUDA " + std::to_string(rt / 1000) + "." +
                std::to_string(rt % 1000 / 10) + " runtime dfp was built with (cudaErrorInsufficientDriver)");
    return no(std::string("no usable CUDA GPU (cudaGetDeviceCount: ") + cudaGetErrorName(e) + ": " +
              cudaGetErrorString(e) + ")");
  }
  if (n == 0) return no("no CUDA GPU found");
  int dev = 0;
  cudaDeviceProp p{};
  if ((e = cudaGetDevice(&dev)) != cudaSuccess || (e = cudaGetDeviceProperties(&p, dev)) != cudaSuccess) {
    cudaGetLastError();
    return no(std::string("CUDA device query failed: ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
  }
  cudaFuncAttributes fa{};
  if ((e = cudaFuncGetAttributes(&fa, probe_kernel)) != cudaSuccess) {
    cudaGetLastError();
    return no(std::string("GPU ") + p.name + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) +
              ") cannot run this build's kernels, compiled for CUDA architectures " + DFP_CUDA_ARCHS + " (" +
              cudaGetErrorName(e) + "); reconfigure with -DCMAKE_CUDA_ARCHITECTURES=" + std::to_string(p.major) +
              std::to_string(p.minor));
  }
  const size_t dnn = cudnnGetVersion();
  if (dnn / 10000 != CUDNN_MAJOR)
    return no("cuDNN runtime " + std::to_string(dnn) + " does not match the headers dfp was built with (" +
              std::to_string(CUDNN_VERSION) + ")");
  if (why) why->clear();
  return true;
}

}  // namespace dfp::cuda

// The module's entry points (dlopen'ed by cuda_model.cpp, so that a CPU-only run of dfp never
// loads the CUDA, cuBLAS and cuDNN libraries: mapping them costs ~150 MiB of resident memory).
extern "C" __attribute__((visibility("default"))) bool dfp_cuda_gpu_available(std::string* why) {
  return dfp::cuda::gpu_available(why);
}
extern "C" __attribute__((visibility("default"))) dfp::cuda::Backend* dfp_cuda_make_gpu_backend(bool fp16,
                                                                                               bool benchmark) {
  return dfp::cuda::make_gpu_backend(fp16, benchmark).release();
}

