// dfp/simd/ref: scalar FP32 reference convolution and inner product, all three passes.
//
// The specification the oneDNN FP32 baseline is tested against, and the FP32 path of contexts
// at level `ref`. Same layouts as dfp::ConvF32: activations nChw16c [N][ceil(C/16)][H][W][16]
// (padding lanes read as given, written as zero), weights [K][C][R][S]; inner product row-major
// x[N][C], w[K][C], y[N][K]. Every output element is computed independently by one float
// accumulator over its reduction in a fixed order, so results do not depend on anything but the
// inputs. Single-threaded, no blocking: correctness first.
#pragma once

#include "dfp/conv.hpp"

namespace dfp::simd::ref {

// y[n][k][oh][ow] = sum over c, r, s of x[n][c][oh*sh - ph + r][ow*sw - pw + s] * w[k][c][r][s]
void conv_f32_forward(const ConvShape& s, const float* x, const float* w, float* y);
// dx[n][c][h][w] = sum over k, r, s with h = oh*sh - ph + r, w = ow*sw - pw + s of dy[n][k][oh][ow] * w[k][c][r][s]
void conv_f32_backward_data(const ConvShape& s, const float* dy, const float* w, float* dx);
// dw[k][c][r][s] = sum over n, oh, ow of x[n][c][oh*sh - ph + r][ow*sw - pw + s] * dy[n][k][oh][ow]
void conv_f32_backward_weights(const ConvShape& s, const float* x, const float* dy, float* dw);

// y[n][k] = sum_c x[n][c] * w[k][c]
void inner_product_f32_forward(int batch, int in, int out, const float* x, const float* w, float* y);
// dx[n][c] = sum_k dy[n][k] * w[k][c]
void inner_product_f32_backward_data(int batch, int in, int out, const float* dy, const float* w, float* dx);
// dw[k][c] = sum_n dy[n][k] * x[n][c]
void inner_product_f32_backward_weights(int batch, int in, int out, const float* x, const float* dy, float* dw);

}  // namespace dfp::simd::ref
