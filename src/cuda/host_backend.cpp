// The host emulation of the CUDA device: the operation bodies of ops.hpp in plain loops (T = float),
// reference NHWC convolutions and row-major GEMMs in double. It exists so that the Executor (the
// plan, the buffer wiring, the gradient accumulation, loss scaling and the parameter updates) and
// every own kernel body are tested on machines without a GPU. Meant for small test models: it is
// single-threaded and makes no attempt at speed.
#include <cstring>
#include <vector>

#include "dfp/status.hpp"
#include "src/cuda/backend.hpp"

namespace dfp::cuda {
namespace {

class HostBackend final : public Backend {
 public:
  bool half() const override { return false; }
  std::string describe() const override { return "host emulation of the CUDA device (FP32, reference loops)"; }

  void* alloc(size_t bytes) override {
    blocks_.emplace_back(new double[(bytes + 7) / 8 + 1]());  // zero-filled, 8-byte aligned
    return blocks_.back().get();
  }
  void reserve_staging(size_t image_bytes, size_t label_bytes) override {
    image_bytes_ = image_bytes;
    images_ = static_cast<float*>(alloc(image_bytes));
    labels_ = static_cast<int32_t*>(alloc(label_bytes));
  }
  int conv_plan(const ConvDims& d) override {
    convs_.push_back(d);
    return int(convs_.size()) - 1;
  }
  void planned() override {}

  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  HostSlot staging_slot() override { return {images_, labels_}; }
  Staged commit(size_t image_bytes, size_t label_bytes) override {
    DFP_CHECK(image_bytes <= image_bytes_, Status::internal, "host backend: batch larger than its staging buffer");
    (void)label_bytes;
    std::memset(reinterpret_cast<char*>(images_) + image_bytes, 0, image_bytes_ - image_bytes);
    return {images_, labels_};
  }
  void read_back(void* host, const void* dev, size_t bytes) override { std::memcpy(host, dev, bytes); }
  void synchronize() override {}

  void run(Op op, const void* args, size_t n) override {
    switch (op) {
#define DFP_CASE(name)                                                 \
  case Op::name: {                                                     \
    const name##Fn<float> f{*static_cast<const name##Args*>(args)};    \
    for (size_t i = 0; i < n; ++i) f(i);                               \
    break;                                                             \
  }
      DFP_CUDA_OPS(DFP_CASE)
#undef DFP_CASE
    }
  }

  void reduce(const ReduceArgs& a) override {
    for (int c = 0; c < a.C; ++c) {
      double su = 0, sv = 0;
      for (size_t r = 0; r < a.rows; ++r) {
        float u = 0.f, v = 0.f;
        reduce_term<float>(a, r, c, u, v);
        su += u;
        sv += v;
      }
      a.out[c] = su;
      a.out[a.C + c] = sv;
    }
  }

  // Calls f(y_off, x_off, w_off) for every (output element, in-bounds tap) of convolution d, in
  // the order n, oh, ow, k, r, s: the element offsets of y[n][oh][ow][k] (NHWC), of the first
  // channel of k's group in the input pixel x[n][ih][iw] (NHWC) and of channel 0 of w[k][r][s]
  // (KRSC, C/groups channels); the callers sum over the group's C/groups channels.
  template <class F>
  static void for_each_tap(const ConvDims& d, F&& f) {
    for (int n = 0; n < d.N; ++n)
      for (int oh = 0; oh < d.OH; ++oh)
        for (int ow = 0; ow < d.OW; ++ow)
          for (int k = 0; k < d.K; ++k) {
            const size_t y_off = nhwc_index(d.OH, d.OW, d.K, n, oh, ow, k);
            for (int r = 0; r < d.R; ++r) {
              const int ih = oh * d.stride + r - d.pad;
              if (ih < 0 || ih >= d.H) continue;
              for (int s = 0; s < d.S; ++s) {
                const int iw = ow * d.stride + s - d.pad;
                if (iw < 0 || iw >= d.W) continue;
                f(y_off, nhwc_index(d.H, d.W, d.C, n, ih, iw, k / (d.K / d.groups) * d.group_channels()),
                  ((size_t(k) * d.R + r) * d.S + s) * d.group_channels());
              }
            }
          }
  }

  void conv_fwd(int id, const void* xv, const void* wv, void* yv) override {
    const ConvDims& d = convs_.at(id);
    const float *x = static_cast<const float*>(xv), *w = static_cast<const float*>(wv);
    float* y = static_cast<float*>(yv);
    std::vector<double> acc(size_t(d.N) * d.OH * d.OW * d.K, 0.0);
    for_each_tap(d, [&](size_t yo, size_t xo, size_t wo) {
      for (int c = 0; c < d.group_channels(); ++c) acc[yo] += double(x[xo + c]) * w[wo + c];
    });
    for (size_t i = 0; i < acc.size(); ++i) y[i] = float(acc[i]);
  }
  void conv_bwd_data(int id, const void* wv, const void* dyv, void* dxv, bool accumulate) override {
    const ConvDims& d = convs_.at(id);
    const float *w = static_cast<const float*>(wv), *dy = static_cast<const float*>(dyv);
    float* dx = static_cast<float*>(dxv);
    std::vector<double> acc(size_t(d.N) * d.H * d.W * d.C, 0.0);
    for_each_tap(d, [&](size_t yo, size_t xo, size_t wo) {
      const double g = dy[yo];
      for (int c = 0; c < d.group_channels(); ++c) acc[xo + c] += g * w[wo + c];
    });
    for (size_t i = 0; i < acc.size(); ++i) dx[i] = float(acc[i] + (accumulate ? dx[i] : 0.0));
  }
  void conv_bwd_filter(int id, const void* xv, const void* dyv, void* dwv) override {
    const ConvDims& d = convs_.at(id);
    const float *x = static_cast<const float*>(xv), *dy = static_cast<const float*>(dyv);
    float* dw = static_cast<float*>(dwv);
    std::vector<double> acc(size_t(d.K) * d.R * d.S * d.group_channels(), 0.0);
    for_each_tap(d, [&](size_t yo, size_t xo, size_t wo) {
      const double g = dy[yo];
      for (int c = 0; c < d.group_channels(); ++c) acc[wo + c] += g * x[xo + c];
    });
    for (size_t i = 0; i < acc.size(); ++i) dw[i] = float(acc[i]);
  }
  void gemm(bool ta, bool tb, int M, int N, int K, const void* Av, int lda, const void* Bv, int ldb, void* Cv,
            int ldc, bool accumulate) override {
    const float *A = static_cast<const float*>(Av), *B = static_cast<const float*>(Bv);
    float* C = static_cast<float*>(Cv);
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        double acc = 0;
        for (int k = 0; k < K; ++k) {
          const float a = ta ? A[size_t(k) * lda + i] : A[size_t(i) * lda + k];
          const float b = tb ? B[size_t(j) * ldb + k] : B[size_t(k) * ldb + j];
          acc += double(a) * b;
        }
        float& c = C[size_t(i) * ldc + j];
        c = float(acc + (accumulate ? c : 0.0));
      }
  }

 private:
  std::vector<std::unique_ptr<double[]>> blocks_;
  std::vector<ConvDims> convs_;
  float* images_ = nullptr;
  int32_t* labels_ = nullptr;
  size_t image_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_host_backend() { return std::make_unique<HostBackend>(); }

}  // namespace dfp::cuda
