// Scalar FP32 reference convolution and inner product. See conv_f32_ref.hpp.
#include "simd/ref/conv_f32_ref.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "simd/kernel_table.hpp"

namespace dfp::simd::ref {
namespace {

// Element (n, c, h, w) of an nChw16c tensor with `c_total` channels and h_total x w_total pixels.
inline size_t blocked_index(int n, int c, int h, int w, int c_total, int h_total, int w_total) {
  const size_t cb = size_t(channel_blocks(c_total));
  return (((size_t(n) * cb + size_t(c / kChannelBlock)) * h_total + h) * w_total + w) * kChannelBlock +
         c % kChannelBlock;
}

inline size_t weight_index(const ConvShape& s, int k, int c, int r, int q) {
  return ((size_t(k) * s.C + c) * s.R + r) * s.S + q;
}

}  // namespace

void conv_f32_forward(const ConvShape& s, const float* x, const float* w, float* y) {
  const int OH = s.OH(), OW = s.OW();
  const int k_padded = channel_blocks(s.K) * kChannelBlock;
  for (int n = 0; n < s.N; ++n)
    for (int k = 0; k < k_padded; ++k)
      for (int oh = 0; oh < OH; ++oh)
        for (int ow = 0; ow < OW; ++ow) {
          float acc = 0.f;
          if (k < s.K)
            for (int c = 0; c < s.C; ++c)
              for (int r = 0; r < s.R; ++r) {
                const int ih = oh * s.stride_h - s.pad_h + r;
                if (ih < 0 || ih >= s.H) continue;
                for (int q = 0; q < s.S; ++q) {
                  const int iw = ow * s.stride_w - s.pad_w + q;
                  if (iw < 0 || iw >= s.W) continue;
                  acc += x[blocked_index(n, c, ih, iw, s.C, s.H, s.W)] * w[weight_index(s, k, c, r, q)];
                }
              }
          y[blocked_index(n, k, oh, ow, s.K, OH, OW)] = acc;  // padding lanes (k >= K) get 0
        }
}

void conv_f32_backward_data(const ConvShape& s, const float* dy, const float* w, float* dx) {
  const int OH = s.OH(), OW = s.OW();
  const int c_padded = channel_blocks(s.C) * kChannelBlock;
  for (int n = 0; n < s.N; ++n)
    for (int c = 0; c < c_padded; ++c)
      for (int ih = 0; ih < s.H; ++ih)
        for (int iw = 0; iw < s.W; ++iw) {
          float acc = 0.f;
          if (c < s.C)
            for (int k = 0; k < s.K; ++k)
              for (int r = 0; r < s.R; ++r) {
                // Output rows oh with oh*stride - pad + r == ih: one or none.
                const int th = ih + s.pad_h - r;
                if (th < 0 || th % s.stride_h != 0) continue;
                const int oh = th / s.stride_h;
                if (oh >= OH) continue;
                for (int q = 0; q < s.S; ++q) {
                  const int tw = iw + s.pad_w - q;
                  if (tw < 0 || tw % s.stride_w != 0) continue;
                  const int ow = tw / s.stride_w;
                  if (ow >= OW) continue;
                  acc += dy[blocked_index(n, k, oh, ow, s.K, OH, OW)] * w[weight_index(s, k, c, r, q)];
                }
              }
          dx[blocked_index(n, c, ih, iw, s.C, s.H, s.W)] = acc;
        }
}

void conv_f32_backward_weights(const ConvShape& s, const float* x, const float* dy, float* dw) {
  const int OH = s.OH(), OW = s.OW();
  for (int k = 0; k < s.K; ++k)
    for (int c = 0; c < s.C; ++c)
      for (int r = 0; r < s.R; ++r)
        for (int q = 0; q < s.S; ++q) {
          float acc = 0.f;
          for (int n = 0; n < s.N; ++n)
            for (int oh = 0; oh < OH; ++oh) {
              const int ih = oh * s.stride_h - s.pad_h + r;
              if (ih < 0 || ih >= s.H) continue;
              for (int ow = 0; ow < OW; ++ow) {
                const int iw = ow * s.stride_w - s.pad_w + q;
                if (iw < 0 || iw >= s.W) continue;
                acc += x[blocked_index(n, c, ih, iw, s.C, s.H, s.W)] * dy[blocked_index(n, k, oh, ow, s.K, OH, OW)];
              }
            }
          dw[weight_index(s, k, c, r, q)] = acc;
        }
}

void inner_product_f32_forward(int batch, int in, int out, const float* x, const float* w, float* y) {
  for (int n = 0; n < batch; ++n)
    for (int k = 0; k < out; ++k) {
      float acc = 0.f;
      for (int c = 0; c < in; ++c) acc += x[size_t(n) * in + c] * w[size_t(k) * in + c];
      y[size_t(n) * out + k] = acc;
    }
}

void inner_product_f32_backward_data(int batch, int in, int out, const float* dy, const float* w, float* dx) {
  for (int n = 0; n < batch; ++n)
    for (int c = 0; c < in; ++c) {
      float acc = 0.f;
      for (int k = 0; k < out; ++k) acc += dy[size_t(n) * out + k] * w[size_t(k) * in + c];
      dx[size_t(n) * in + c] = acc;
    }
}

void inner_product_f32_backward_weights(int batch, int in, int out, const float* x, const float* dy, float* dw) {
  for (int k = 0; k < out; ++k)
    for (int c = 0; c < in; ++c) {
      float acc = 0.f;
      for (int n = 0; n < batch; ++n) acc += dy[size_t(n) * out + k] * x[size_t(n) * in + c];
      dw[size_t(k) * in + c] = acc;
    }
}

// ---- the kernel table's FP32 backends at level ref -------------------------------------------
namespace {

class RefConv final : public ConvF32Backend {
 public:
  explicit RefConv(const ConvShape& shape) : s_(shape) {}
  const char* impl() const noexcept override { return "conv_f32__ref"; }
  void set_weights(const float* w) override { w_.assign(w, w + size_t(s_.K) * s_.C * s_.R * s_.S); }
  void forward(const float* x, float* y) override { conv_f32_forward(s_, x, w_.data(), y); }
  void backward_data(const float* dy, float* dx) override { conv_f32_backward_data(s_, dy, w_.data(), dx); }
  void backward_weights(const float* x, const float* dy, float* dw) override {
    conv_f32_backward_weights(s_, x, dy, dw);
  }
  void inputs_rewritten() override {}  // every pass reads its arguments

 private:
  ConvShape s_;
  std::vector<float> w_;  // the caller's [K][C][R][S], copied
};

class RefLinear final : public LinearF32Backend {
 public:
  RefLinear(int batch, int in, int out) : n_(batch), c_(in), k_(out) {}
  const char* impl() const noexcept override { return "inner_product_f32__ref"; }
  void set_weights(const float* w) override { w_.assign(w, w + size_t(k_) * c_); }
  void forward(const float* x, float* y) override { inner_product_f32_forward(n_, c_, k_, x, w_.data(), y); }
  void backward_data(const float* dy, float* dx) override {
    inner_product_f32_backward_data(n_, c_, k_, dy, w_.data(), dx);
  }
  void backward_weights(const float* x, const float* dy, float* dw) override {
    inner_product_f32_backward_weights(n_, c_, k_, x, dy, dw);
  }
  void inputs_rewritten() override {}

 private:
  int n_, c_, k_;
  std::vector<float> w_;  // the caller's [K][C], copied
};

}  // namespace

std::unique_ptr<ConvF32Backend> make_conv_f32(int, const ConvShape& shape, const std::string&) {
  return std::make_unique<RefConv>(shape);
}

std::unique_ptr<LinearF32Backend> make_linear_f32(int, int batch, int in_features, int out_features,
                                                  const std::string&) {
  return std::make_unique<RefLinear>(batch, in_features, out_features);
}

// The reference level has no BF16-operand convolution of its own: the layer rounds its operands
// to BF16 and runs make_conv_f32's, which is this arithmetic (exact products, FP32 sums).
std::unique_ptr<ConvBf16Backend> make_conv_bf16(int, const ConvShape&, const std::string&) {
  return nullptr;
}

}  // namespace dfp::simd::ref
