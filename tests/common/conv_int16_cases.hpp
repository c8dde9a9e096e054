// The INT16 convolution suites' shared cases: the tile-edge shapes, all three passes of a
// convolution or fully connected layer run through the blocked layout, and bit-for-bit comparison.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "tests/common/reference.hpp"

namespace dfp::test::conv_int16_cases {

inline ConvShape make(int N, int C, int H, int W, int K, int R, int S, int stride, int pad) {
  ConvShape s;
  s.N = N; s.C = C; s.H = H; s.W = W; s.K = K; s.R = R; s.S = S;
  s.stride_h = s.stride_w = stride;
  s.pad_h = s.pad_w = pad;
  return s;
}

// Tile edges: odd C, C below one block, K not a multiple of 16, W below and above the register
// block, strides 1/2/4, padding, 1x1 / 3x3 / 5x5 / 7x7 / 11x11, batch 1 and odd batches, and the
// pure GEMM case, rows short enough to tile across images.
inline const std::vector<ConvShape>& edge_shapes() {
  static const std::vector<ConvShape> v = {
      make(1, 3, 9, 7, 20, 3, 3, 1, 1),   make(3, 5, 10, 11, 16, 3, 3, 2, 1), make(2, 17, 6, 5, 33, 1, 1, 1, 0),
      make(2, 16, 8, 8, 32, 1, 1, 2, 0),  make(1, 3, 15, 13, 8, 7, 7, 2, 3),
      // A 7x7 stem's two blocks of unfolded channels with the weight gradient's lanes over K: x's
      // batch-pair copy is its own padded rows (x_compact), odd batch; with small images the
      // weight gradient runs the pairs as planes, split by slices; with OW > 18 and four output
      // blocks (ResNet-50's stem form) in position tiles, split by output blocks.
      make(3, 3, 15, 13, 40, 7, 7, 2, 3), make(3, 3, 40, 40, 64, 7, 7, 2, 3),
      // strided 1x1 (the weight gradient's subsampled x): odd batch, odd sizes, strides 2 and 3
      make(3, 20, 9, 7, 24, 1, 1, 2, 0),  make(3, 33, 10, 11, 16, 1, 1, 3, 0),  make(2, 8, 19, 19, 16, 11, 11, 4, 2),
      make(2, 32, 9, 9, 16, 5, 5, 1, 2),  make(3, 64, 4, 30, 48, 3, 3, 1, 1), make(5, 40, 1, 1, 24, 1, 1, 1, 0),
      make(2, 1, 28, 28, 6, 5, 5, 1, 2),
      // Rows of <= 2 output pixels: tiles run over images (here more than one tile of them).
      make(17, 32, 2, 2, 40, 3, 3, 1, 1), make(15, 20, 3, 4, 36, 3, 3, 2, 1),
      // >= 4 output blocks: the weight gradient is split by output block instead of by slices.
      make(3, 20, 7, 9, 70, 3, 3, 1, 1),  make(5, 40, 1, 1, 80, 1, 1, 1, 0),
      // Four and five output blocks over tiles of positions (12x12 outputs), by output blocks,
      // with three input blocks: 3x3, and 1x1 with a partial last block.
      make(3, 48, 12, 12, 64, 3, 3, 1, 1), make(3, 44, 12, 12, 70, 1, 1, 1, 0),
      // GEMM with whole channel blocks and >= 4 output blocks: the weight gradient writes dW in
      // place; and with 2 KiB input rows (C = 1024): tiles of 8 images, not 14.
      make(7, 48, 1, 1, 72, 1, 1, 1, 0),  make(17, 1024, 1, 1, 40, 1, 1, 1, 0),
      // Weights over kPixelWeightBytes: row calls split the output-block groups between items
      // (forward 2 of 3 groups per item, backward-data 6 of 8); the weight gradient's pairs as
      // planes, the last pair with one image.
      make(5, 256, 4, 4, 96, 3, 3, 1, 1),
      // Stride 2 with rows of 7 and 4 output pixels: the forward's row calls of 2 or 3 images over
      // one pass of the weights, reading every other source pixel.
      make(3, 32, 14, 14, 32, 3, 3, 2, 1), make(4, 16, 8, 8, 32, 1, 1, 2, 0),
      // 2x2 output images, by output blocks: the weight gradient's calls across image pairs, in
      // two chunks of pairs (32 and 2, the last pair with one image).
      make(67, 16, 2, 2, 64, 3, 3, 1, 1),
  };
  return v;
}

inline std::string describe(const ConvShape& s) {
  char b[160];
  std::snprintf(b, sizeof b, "N%d C%d %dx%d K%d %dx%d stride %d pad %d", s.N, s.C, s.H, s.W, s.K, s.R, s.S, s.stride_h,
                s.pad_h);
  return b;
}

struct Outputs {
  std::vector<float> y, dx, dw;  // NCHW, NCHW, KCRS
  ConvStats stats;
};

// Runs all three passes on NCHW data through the blocked layout (without o.input_gradient: no
// backward-data pass, and dx stays empty).
inline Outputs run_int16(const Context& ctx, const ConvShape& s, const std::vector<float>& x, const std::vector<float>& w,
                  const std::vector<float>& dy, DfpConvOptions o = {}) {
  const int OH = s.OH(), OW = s.OW();
  std::vector<float> xb(blocked_size(s.N, s.C, s.H, s.W)), dyb(blocked_size(s.N, s.K, OH, OW));
  to_blocked(x.data(), xb.data(), s.N, s.C, s.H, s.W);
  to_blocked(dy.data(), dyb.data(), s.N, s.K, OH, OW);
  std::vector<float> yb(blocked_size(s.N, s.K, OH, OW), -1.f), dxb(blocked_size(s.N, s.C, s.H, s.W), -1.f);
  Outputs out;
  out.y.resize(size_t(s.N) * s.K * OH * OW);
  if (o.input_gradient) out.dx.resize(x.size());
  out.dw.assign(w.size(), -1.f);
  ConvInt16 conv(ctx, s, o, "test_conv");
  conv.set_weights(w.data());
  conv.quantize_input(xb.data());
  conv.quantize_grad_output(dyb.data());
  conv.forward(yb.data());
  if (o.input_gradient) conv.backward_data(dxb.data());
  conv.backward_weights(out.dw.data());
  from_blocked(yb.data(), out.y.data(), s.N, s.K, OH, OW);
  if (o.input_gradient) from_blocked(dxb.data(), out.dx.data(), s.N, s.C, s.H, s.W);
  // Padding lanes must come out as zero.
  for (size_t i = 0; i < yb.size(); ++i) {
    if ((i % 16) + 16 * ((i / (16 * size_t(OH) * OW)) % channel_blocks(s.K)) >= size_t(s.K)) { EXPECT_EQ(yb[i], 0.f); }
  }
  out.stats = conv.stats();
  return out;
}

// An operator ready for backward_data: plain [K][C][R][S] weights, a blocked dy, a forced chain
// (0: derived).
inline ConvInt16 backward_data_op(const Context& ctx, const ConvShape& s, const std::vector<float>& w,
                           const std::vector<float>& dy_blocked, int chain) {
  DfpConvOptions o;
  o.chain_override = chain;
  ConvInt16 conv(ctx, s, o, "bwd");
  conv.set_weights(w.data());
  conv.quantize_grad_output(dy_blocked.data());
  return conv;
}

inline void expect_bits_equal(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(0, std::memcmp(&a[i], &b[i], sizeof(float))) << what << " element " << i << ": " << a[i] << " vs " << b[i];
}

// The three passes' outputs of two runs, bit for bit (`what` prefixes the pass names).
inline void expect_outputs_bits_equal(const Outputs& a, const Outputs& b, const std::string& what = "") {
  expect_bits_equal(a.y, b.y, what + "forward");
  expect_bits_equal(a.dx, b.dx, what + "backward_data");
  expect_bits_equal(a.dw, b.dw, what + "backward_weights");
}

// n copies of `value`, each with a random sign (seeded) when mixed_signs, else all positive.
inline std::vector<float> constant_magnitude(size_t n, float value, uint32_t seed, bool mixed_signs) {
  std::vector<float> v(n, value);
  const auto r = random_ints(n, seed, 0, 1);
  if (mixed_signs)
    for (size_t i = 0; i < n; ++i) v[i] = r[i] ? value : -value;
  return v;
}

// All three passes of a fully connected layer on row-major data ([N][C] x [K][C]).
inline Outputs run_linear(const Context& ctx, int N, int C, int K, const std::vector<float>& x, const std::vector<float>& w,
                   const std::vector<float>& dy, const DfpConvOptions& o = {}) {
  Outputs out;
  // -1, as run_int16's: an element the operator does not write, or adds to instead of writing, shows.
  out.y.assign(size_t(N) * K, -1.f);
  out.dx.assign(size_t(N) * C, -1.f);
  out.dw.assign(size_t(K) * C, -1.f);
  LinearInt16 fc(ctx, N, C, K, o);
  fc.set_weights(w.data());
  fc.quantize_input(x.data());
  fc.quantize_grad_output(dy.data());
  fc.forward(out.y.data());
  fc.backward_data(out.dx.data());
  fc.backward_weights(out.dw.data());
  out.stats = fc.stats();
  return out;
}

inline const Context& ref_ctx() {
  static Context c(ContextOptions{.threads = 2, .isa = "ref"});
  return c;
}

// Runs the three passes in verification mode and expects no INT32 overflow and results equal to
// the FP64 reference (exact: the data's products and sums fit FP32). Returns the outputs.
inline Outputs run_verified_exact(const Context& ctx, const ConvShape& s, const std::vector<float>& x,
                           const std::vector<float>& w, const std::vector<float>& dy, DfpConvOptions o = {}) {
  std::vector<double> y, dx, dw;
  test::conv_fwd_ref(s, x, w, y);
  test::conv_bwd_data_ref(s, dy, w, dx);
  test::conv_bwd_weights_ref(s, x, dy, dw);
  o.verify = true;
  Outputs r = run_int16(ctx, s, x, w, dy, o);
  EXPECT_EQ(r.stats.overflow_events, 0);
  auto expect_equal = [](const std::vector<float>& got, const std::vector<double>& want, const char* what) {
    for (size_t i = 0; i < want.size(); ++i)
      if (got[i] != want[i]) {
        ADD_FAILURE() << what << " " << i << ": " << got[i] << " != " << want[i];
        return;
      }
  };
  expect_equal(r.y, y, "y");
  expect_equal(r.dx, dx, "dx");
  expect_equal(r.dw, dw, "dw");
  return r;
}

// A layer's operands in the blocked layout: weights, x (with `images_apart`, image n scaled by
// 2^-n) and dy from seeds seed .. seed + 2, and max|x|.
struct BlockedCase {
  std::vector<float> w, xb, dyb;
  float max_x = 0.f;
};
inline BlockedCase blocked_case(const ConvShape& s, uint32_t seed, bool images_apart) {
  auto x = random_vec(size_t(s.N) * s.C * s.H * s.W, seed, -2.f, 2.f);
  if (images_apart)
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(x[i], -int(i / (x.size() / s.N)));
  const auto dy = random_vec(size_t(s.N) * s.K * s.OH() * s.OW(), seed + 2, -1e-3f, 1e-3f);
  BlockedCase c{random_vec(size_t(s.K) * s.C * s.R * s.S, seed + 1, -0.3f, 0.3f),
                std::vector<float>(blocked_size(s.N, s.C, s.H, s.W)),
                std::vector<float>(blocked_size(s.N, s.K, s.OH(), s.OW()))};
  to_blocked(x.data(), c.xb.data(), s.N, s.C, s.H, s.W);
  to_blocked(dy.data(), c.dyb.data(), s.N, s.K, s.OH(), s.OW());
  for (float v : c.xb) c.max_x = std::max(c.max_x, std::fabs(v));
  return c;
}

}  // namespace dfp::test::conv_int16_cases
