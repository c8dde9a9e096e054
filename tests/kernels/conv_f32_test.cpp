// FP32 baseline: the scalar reference against an independent plain-NCHW model and against itself
// (the three passes are adjoint), then oneDNN against the reference on the shapes that exercise
// each oneDNN code path (3x3 stride 1/2, 1x1 stride 2, 7x7 stride 2 with C=3, K not a multiple
// of 16, batch 1), and the inner product likewise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"
#include "tests/common/isa_levels.hpp"
#include "tests/common/expect_error.hpp"
#include "tests/common/reference.hpp"

namespace {

using dfp::ConvShape;

// Deterministic values in [-1, 1): splitmix64 of the index.
std::vector<float> random_values(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    uint64_t z = seed * 0x9e3779b97f4a7c15ULL + i + 1;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    v[i] = float(z >> 40) * 0x1.0p-23f - 1.f;
  }
  return v;
}

// A random nChw16c tensor: random channels, zero padding lanes (the layout's contract).
std::vector<float> random_blocked(int n, int c, int h, int w, uint64_t seed) {
  const std::vector<float> plain = random_values(size_t(n) * c * h * w, seed);
  std::vector<float> blocked(dfp::blocked_size(n, c, h, w));
  dfp::to_blocked(plain.data(), blocked.data(), n, c, h, w);
  return blocked;
}

std::vector<float> nan_filled(size_t n) { return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()); }


double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

// Every padding lane (channel >= c) of an nChw16c tensor is exactly zero (not NaN, not stale).
void expect_zero_padding(const std::vector<float>& t, int n, int c, int h, int w, const std::string& what) {
  const int cb = dfp::channel_blocks(c);
  int bad = 0;
  for (int in = 0; in < n; ++in)
    for (int b = 0; b < cb; ++b)
      for (int p = 0; p < h * w; ++p)
        for (int l = 0; l < dfp::kChannelBlock; ++l)
          if (b * dfp::kChannelBlock + l >= c) {
            const float v = t[((size_t(in) * cb + b) * h * w + p) * dfp::kChannelBlock + l];
            if (!(v == 0.f)) ++bad;
          }
  EXPECT_EQ(bad, 0) << what << ": padding lanes not zero";
}

std::string describe(const ConvShape& s) {
  return "N" + std::to_string(s.N) + " C" + std::to_string(s.C) + " " + std::to_string(s.H) + "x" +
         std::to_string(s.W) + " K" + std::to_string(s.K) + " " + std::to_string(s.R) + "x" + std::to_string(s.S) +
         " s" + std::to_string(s.stride_h) + "x" + std::to_string(s.stride_w) + " p" + std::to_string(s.pad_h) + "x" +
         std::to_string(s.pad_w);
}

ConvShape conv(int n, int c, int h, int w, int k, int r, int s, int stride, int pad) {
  ConvShape sh;
  sh.N = n; sh.C = c; sh.H = h; sh.W = w; sh.K = k; sh.R = r; sh.S = s;
  sh.stride_h = sh.stride_w = stride;
  sh.pad_h = r > 1 ? pad : 0;
  sh.pad_w = s > 1 ? pad : 0;
  return sh;
}

const std::vector<ConvShape>& test_shapes() {
  static const std::vector<ConvShape> shapes = {
      conv(2, 16, 12, 12, 32, 3, 3, 1, 1),  // 3x3 stride 1 pad 1
      conv(2, 24, 13, 13, 20, 3, 3, 2, 1),  // 3x3 stride 2, odd size, K=20 (padded to 32)
      conv(2, 32, 10, 10, 16, 1, 1, 2, 0),  // 1x1 stride 2
      conv(1, 3, 23, 23, 20, 7, 7, 2, 3),   // 7x7 stride 2 pad 3, C=3 (first layer), batch 1
      conv(1, 3, 9, 9, 20, 3, 3, 1, 1),     // C=3 with 3x3
      conv(3, 64, 8, 6, 64, 3, 3, 1, 1),    // rectangular image, full blocks
      conv(2, 20, 7, 9, 36, 3, 1, 1, 1),    // R != S, C and K both ragged
  };
  return shapes;
}

// The scalar reference: one thread, level ref. The oneDNN path: two threads, the best level.
// (Assigned field by field: designated initializers that skip `log` trip -Wmissing-field-initializers.)
dfp::ContextOptions ref_options() {
  dfp::ContextOptions o;
  o.threads = 1;
  o.isa = "ref";
  return o;
}
dfp::ContextOptions fast_options() {
  dfp::ContextOptions o;
  o.threads = 2;
  return o;
}

// ---- the reference itself ------------------------------------------------------------------

// Forward on plain NCHW, double accumulation: independent of the blocked indexing.
std::vector<float> naive_forward_nchw(const ConvShape& s, const std::vector<float>& x, const std::vector<float>& w) {
  const int OH = s.OH(), OW = s.OW();
  std::vector<float> y(size_t(s.N) * s.K * OH * OW);
  for (int n = 0; n < s.N; ++n)
    for (int k = 0; k < s.K; ++k)
      for (int oh = 0; oh < OH; ++oh)
        for (int ow = 0; ow < OW; ++ow) {
          double acc = 0;
          for (int c = 0; c < s.C; ++c)
            for (int r = 0; r < s.R; ++r)
              for (int q = 0; q < s.S; ++q) {
                const int ih = oh * s.stride_h - s.pad_h + r, iw = ow * s.stride_w - s.pad_w + q;
                if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;
                acc += double(x[((size_t(n) * s.C + c) * s.H + ih) * s.W + iw]) *
                       w[((size_t(k) * s.C + c) * s.R + r) * s.S + q];
              }
          y[((size_t(n) * s.K + k) * OH + oh) * OW + ow] = float(acc);
        }
  return y;
}

TEST(ConvF32Ref, KernelName) {
  dfp::Context ref_ctx(ref_options());
  dfp::ConvF32 op(ref_ctx, conv(1, 4, 5, 5, 4, 3, 3, 1, 1));
  EXPECT_STREQ(op.kernel_name(), "conv_f32__ref");
}

// The FP32 backend is a kernel-table entry like any kernel: the reference at `ref`, oneDNN's
// primitives at every AVX-512 level the CPU has, and the operators run what the table names.
TEST(ConvF32, BackendComesFromTheKernelTable) {
  const dfp::ConvShape s = conv(1, 4, 5, 5, 4, 3, 3, 1, 1);
  for (dfp::Isa isa : dfp::test::isa_levels()) {
    const char* level = dfp::isa_name(isa);
    SCOPED_TRACE(level);
    dfp::ContextOptions o = ref_options();
    o.isa = level;
    dfp::Context ctx(o);
    const bool ref = std::string(level) == "ref";
    EXPECT_STREQ(ctx.kernels().conv_f32.name, ref ? "conv_f32__ref" : "conv_f32__onednn");
    EXPECT_STREQ(ctx.kernels().linear_f32.name, ref ? "inner_product_f32__ref" : "inner_product_f32__onednn");
    dfp::ConvF32 c(ctx, s);
    dfp::LinearF32 fc(ctx, 2, 8, 3);
    EXPECT_EQ(std::string(c.kernel_name()).rfind(ref ? "conv_f32__ref" : "onednn:", 0), 0u) << c.kernel_name();
    EXPECT_EQ(std::string(fc.kernel_name()).rfind(ref ? "inner_product_f32__ref" : "onednn:", 0), 0u)
        << fc.kernel_name();
  }
}

TEST(ConvF32Ref, ForwardMatchesPlainModel) {
  dfp::Context ref_ctx(ref_options());
  for (const ConvShape& s : test_shapes()) {
    SCOPED_TRACE(describe(s));
    const std::vector<float> x_plain = random_values(size_t(s.N) * s.C * s.H * s.W, 1);
    const std::vector<float> w = random_values(size_t(s.K) * s.C * s.R * s.S, 2);
    std::vector<float> x(dfp::blocked_size(s.N, s.C, s.H, s.W));
    dfp::to_blocked(x_plain.data(), x.data(), s.N, s.C, s.H, s.W);

    dfp::ConvF32 op(ref_ctx, s, "ref_conv");
    op.set_weights(w.data());
    std::vector<float> y = nan_filled(dfp::blocked_size(s.N, s.K, s.OH(), s.OW()));
    op.forward(x.data(), y.data());
    expect_zero_padding(y, s.N, s.K, s.OH(), s.OW(), "y");
    std::vector<float> y_plain(size_t(s.N) * s.K * s.OH() * s.OW());
    dfp::from_blocked(y.data(), y_plain.data(), s.N, s.K, s.OH(), s.OW());
    EXPECT_LT(dfp::test::rel_l2(y_plain, naive_forward_nchw(s, x_plain, w)), 1e-6);
  }
}

// <conv(x, w), dy> = <x, bwd_data(dy, w)> = <w, bwd_weights(x, dy)>: the two backward passes are
// the adjoints of the forward pass in x and in w.
TEST(ConvF32Ref, BackwardPassesAreAdjoints) {
  dfp::Context ref_ctx(ref_options());
  for (const ConvShape& s : test_shapes()) {
    SCOPED_TRACE(describe(s));
    const std::vector<float> x = random_blocked(s.N, s.C, s.H, s.W, 3);
    const std::vector<float> dy = random_blocked(s.N, s.K, s.OH(), s.OW(), 4);
    const std::vector<float> w = random_values(size_t(s.K) * s.C * s.R * s.S, 5);
    dfp::ConvF32 op(ref_ctx, s);
    op.set_weights(w.data());
    std::vector<float> y = nan_filled(dy.size()), dx = nan_filled(x.size()), dw = nan_filled(w.size());
    op.forward(x.data(), y.data());
    op.backward_data(dy.data(), dx.data());
    op.backward_weights(x.data(), dy.data(), dw.data());
    expect_zero_padding(dx, s.N, s.C, s.H, s.W, "dx");
    const double ydy = dot(y, dy), xdx = dot(x, dx), wdw = dot(w, dw);
    const double scale = std::sqrt(dot(y, y) * dot(dy, dy));
    EXPECT_NEAR(xdx, ydy, 1e-5 * scale);
    EXPECT_NEAR(wdw, ydy, 1e-5 * scale);
  }
}

// ---- oneDNN against the reference ----------------------------------------------------------

constexpr double kTolerance = 1e-4;

TEST(ConvF32OneDnn, MatchesReferenceAllPasses) {
  dfp::Context ref_ctx(ref_options());
  dfp::Context fast(fast_options());
  if (fast.isa() == dfp::Isa::ref) GTEST_SKIP() << "context level is ref (DFP_ISA or CPU): no oneDNN path";
  for (const ConvShape& s : test_shapes()) {
    SCOPED_TRACE(describe(s));
    const std::vector<float> x = random_blocked(s.N, s.C, s.H, s.W, 11);
    const std::vector<float> dy = random_blocked(s.N, s.K, s.OH(), s.OW(), 12);
    const std::vector<float> w = random_values(size_t(s.K) * s.C * s.R * s.S, 13);

    dfp::ConvF32 ref(ref_ctx, s, "ref");
    dfp::ConvF32 dnn(fast, s, "onednn");
    EXPECT_EQ(std::string(dnn.kernel_name()).rfind("onednn:", 0), 0u) << dnn.kernel_name();
    ref.set_weights(w.data());
    dnn.set_weights(w.data());

    std::vector<float> y_ref = nan_filled(dy.size()), y = nan_filled(dy.size());
    ref.forward(x.data(), y_ref.data());
    dnn.forward(x.data(), y.data());
    EXPECT_LT(dfp::test::rel_l2(y, y_ref), kTolerance) << "forward, " << dnn.kernel_name();
    expect_zero_padding(y, s.N, s.K, s.OH(), s.OW(), "oneDNN y");

    std::vector<float> dx_ref = nan_filled(x.size()), dx = nan_filled(x.size());
    ref.backward_data(dy.data(), dx_ref.data());
    dnn.backward_data(dy.data(), dx.data());
    EXPECT_LT(dfp::test::rel_l2(dx, dx_ref), kTolerance) << "backward_data";
    expect_zero_padding(dx, s.N, s.C, s.H, s.W, "oneDNN dx");

    std::vector<float> dw_ref = nan_filled(w.size()), dw = nan_filled(w.size());
    ref.backward_weights(x.data(), dy.data(), dw_ref.data());
    dnn.backward_weights(x.data(), dy.data(), dw.data());
    EXPECT_LT(dfp::test::rel_l2(dw, dw_ref), kTolerance) << "backward_weights";

    // Repeated calls on other buffers reuse the cached memories correctly.
    std::vector<float> y2 = nan_filled(dy.size());
    dnn.forward(x.data(), y2.data());
    EXPECT_EQ(y2, y);
  }
}

// The weight gradient reuses the forward's and backward-data's reordered x and dy only within a
// step: the same buffers refilled for the next step, with the passes in another order (weight
// gradient before backward-data), give the next step's gradient; and a caller that writes other
// values into those buffers between the passes (MX's weight gradient quantizes x and dy along its
// own reduction into them) says so with inputs_rewritten(), and the weight gradient reads them.
// Few-channel shapes make oneDNN want other layouts than nChw16c, so the reorders (and their
// reuse) happen; so does 40 channels at oneDNN's AVX2 level (nChw8c).
TEST(ConvF32OneDnn, WeightGradientReadsThisStepsTensors) {
  dfp::Context ref_ctx(ref_options());
  dfp::Context fast(fast_options());
  if (fast.isa() == dfp::Isa::ref) GTEST_SKIP() << "context level is ref (DFP_ISA or CPU): no oneDNN path";
  for (const ConvShape& s : {conv(4, 3, 12, 12, 3, 3, 3, 1, 1), conv(4, 3, 12, 12, 16, 3, 3, 1, 1),
                             conv(2, 40, 6, 6, 20, 3, 3, 1, 1)}) {
    SCOPED_TRACE(describe(s));
    const std::vector<float> w = random_values(size_t(s.K) * s.C * s.R * s.S, 13);
    dfp::ConvF32 ref(ref_ctx, s, "ref");
    dfp::ConvF32 dnn(fast, s, "onednn");
    ref.set_weights(w.data());
    dnn.set_weights(w.data());
    std::vector<float> x(dfp::blocked_size(s.N, s.C, s.H, s.W)), dx(x.size());
    std::vector<float> dy(dfp::blocked_size(s.N, s.K, s.OH(), s.OW())), y(dy.size());
    auto refill = [&](int seed) {  // the same buffers, new values
      const std::vector<float> xs = random_blocked(s.N, s.C, s.H, s.W, 20 + seed);
      const std::vector<float> dys = random_blocked(s.N, s.K, s.OH(), s.OW(), 30 + seed);
      std::copy(xs.begin(), xs.end(), x.begin());
      std::copy(dys.begin(), dys.end(), dy.begin());
    };
    for (int step = 0; step < 4; ++step) {
      refill(step);
      dnn.forward(x.data(), y.data());
      std::vector<float> dw = nan_filled(w.size()), dw_ref = nan_filled(w.size());
      if (step == 1 || step == 2) {  // weight gradient first, twice running: step 1's dy copy must not serve step 2
        dnn.backward_weights(x.data(), dy.data(), dw.data());
        dnn.backward_data(dy.data(), dx.data());
      } else {
        dnn.backward_data(dy.data(), dx.data());
        if (step == 3) {  // both buffers rewritten between the passes
          refill(10);
          dnn.inputs_rewritten();
        }
        dnn.backward_weights(x.data(), dy.data(), dw.data());
      }
      ref.backward_weights(x.data(), dy.data(), dw_ref.data());
      EXPECT_LT(dfp::test::rel_l2(dw, dw_ref), kTolerance) << "step " << step;
    }
  }
}

TEST(ConvF32OneDnn, NewWeightsTakeEffect) {
  dfp::Context ref_ctx(ref_options());
  dfp::Context fast(fast_options());
  if (fast.isa() == dfp::Isa::ref) GTEST_SKIP() << "context level is ref: no oneDNN path";
  const ConvShape s = conv(2, 16, 8, 8, 16, 3, 3, 1, 1);
  const std::vector<float> x = random_blocked(s.N, s.C, s.H, s.W, 21);
  const std::vector<float> dy = random_blocked(s.N, s.K, s.OH(), s.OW(), 22);
  dfp::ConvF32 ref(ref_ctx, s), dnn(fast, s);
  for (uint64_t seed : {23, 24}) {
    const std::vector<float> w = random_values(size_t(s.K) * s.C * s.R * s.S, seed);
    ref.set_weights(w.data());
    dnn.set_weights(w.data());
    std::vector<float> y_ref(dy.size()), y(dy.size()), dx_ref(x.size()), dx(x.size());
    ref.forward(x.data(), y_ref.data());
    dnn.forward(x.data(), y.data());
    ref.backward_data(dy.data(), dx_ref.data());
    dnn.backward_data(dy.data(), dx.data());
    EXPECT_LT(dfp::test::rel_l2(y, y_ref), kTolerance);
    EXPECT_LT(dfp::test::rel_l2(dx, dx_ref), kTolerance);
  }
}

// ---- inner product -------------------------------------------------------------------------

struct LinearCase {
  int batch, in, out;
};

TEST(LinearF32, OneDnnMatchesReference) {
  dfp::Context ref_ctx(ref_options());
  dfp::Context fast(fast_options());
  if (fast.isa() == dfp::Isa::ref) GTEST_SKIP() << "context level is ref: no oneDNN path";
  for (const LinearCase& c : {LinearCase{4, 37, 10}, LinearCase{1, 64, 100}, LinearCase{32, 256, 10},
                              LinearCase{16, 513, 130}}) {
    SCOPED_TRACE("batch " + std::to_string(c.batch) + " in " + std::to_string(c.in) + " out " +
                 std::to_string(c.out));
    const std::vector<float> x = random_values(size_t(c.batch) * c.in, 31);
    const std::vector<float> w = random_values(size_t(c.out) * c.in, 32);
    const std::vector<float> dy = random_values(size_t(c.batch) * c.out, 33);
    dfp::LinearF32 ref(ref_ctx, c.batch, c.in, c.out, "ref_fc");
    dfp::LinearF32 dnn(fast, c.batch, c.in, c.out, "onednn_fc");
    EXPECT_STREQ(ref.kernel_name(), "inner_product_f32__ref");
    EXPECT_EQ(std::string(dnn.kernel_name()).rfind("onednn:", 0), 0u) << dnn.kernel_name();
    ref.set_weights(w.data());
    dnn.set_weights(w.data());

    std::vector<float> y_ref = nan_filled(dy.size()), y = nan_filled(dy.size());
    ref.forward(x.data(), y_ref.data());
    dnn.forward(x.data(), y.data());
    EXPECT_LT(dfp::test::rel_l2(y, y_ref), kTolerance) << "forward, " << dnn.kernel_name();

    std::vector<float> dx_ref = nan_filled(x.size()), dx = nan_filled(x.size());
    ref.backward_data(dy.data(), dx_ref.data());
    dnn.backward_data(dy.data(), dx.data());
    EXPECT_LT(dfp::test::rel_l2(dx, dx_ref), kTolerance) << "backward_data";

    std::vector<float> dw_ref = nan_filled(w.size()), dw = nan_filled(w.size());
    ref.backward_weights(x.data(), dy.data(), dw_ref.data());
    dnn.backward_weights(x.data(), dy.data(), dw.data());
    EXPECT_LT(dfp::test::rel_l2(dw, dw_ref), kTolerance) << "backward_weights";

    // The reference passes are adjoints too.
    EXPECT_NEAR(dot(x, dx_ref), dot(y_ref, dy), 1e-5 * std::sqrt(dot(y_ref, y_ref) * dot(dy, dy)));
    EXPECT_NEAR(dot(w, dw_ref), dot(y_ref, dy), 1e-5 * std::sqrt(dot(y_ref, y_ref) * dot(dy, dy)));
  }
}

TEST(LinearF32, ReferenceSmallExample) {
  dfp::Context ref_ctx(ref_options());
  // x = [[1, 2]], w = [[3, 4], [5, 6], [7, 8]] -> y = [[11, 17, 23]].
  const float x[2] = {1, 2};
  const float w[6] = {3, 4, 5, 6, 7, 8};
  float y[3] = {};
  dfp::LinearF32 op(ref_ctx, 1, 2, 3);
  op.set_weights(w);
  op.forward(x, y);
  EXPECT_EQ(y[0], 11.f);
  EXPECT_EQ(y[1], 17.f);
  EXPECT_EQ(y[2], 23.f);
}

// ---- errors --------------------------------------------------------------------------------

using dfp::test::expect_error;

TEST(ConvF32Errors, InvalidShapeNamesLayerAndField) {
  dfp::Context ref_ctx(ref_options()), fast_ctx(fast_options());
  for (dfp::Context* ctx : {&ref_ctx, &fast_ctx}) {
    ConvShape s = conv(1, 8, 8, 8, 8, 3, 3, 1, 1);
    s.pad_h = 3;  // pad must be < R
    expect_error([&] { dfp::ConvF32 op(*ctx, s, "layer7"); }, dfp::Status::invalid_argument, {"layer7"});
    expect_error([&] { dfp::ConvF32 op(*ctx, s, "layer7"); }, dfp::Status::invalid_argument, {"pad_h"});
    ConvShape z = conv(1, 8, 8, 8, 8, 3, 3, 1, 1);
    z.K = 0;
    expect_error([&] { dfp::ConvF32 op(*ctx, z, "layer8"); }, dfp::Status::invalid_argument, {"K"});
  }
}

TEST(ConvF32Errors, PassesBeforeSetWeights) {
  dfp::Context ref_ctx(ref_options()), fast_ctx(fast_options());
  for (dfp::Context* ctx : {&ref_ctx, &fast_ctx}) {
    const ConvShape s = conv(1, 16, 4, 4, 16, 3, 3, 1, 1);
    dfp::ConvF32 op(*ctx, s, "conv_a");
    std::vector<float> x(dfp::blocked_size(1, 16, 4, 4)), y(x.size());
    expect_error([&] { op.forward(x.data(), y.data()); }, dfp::Status::invalid_argument, {"set_weights"});
    expect_error([&] { op.backward_data(y.data(), x.data()); }, dfp::Status::invalid_argument, {"conv_a"});
    std::vector<float> w(16 * 16 * 9);
    op.set_weights(w.data());
    expect_error([&] { op.forward(nullptr, y.data()); }, dfp::Status::invalid_argument, {"'x'"});
  }
}

TEST(LinearF32Errors, InvalidSizes) {
  dfp::Context ref_ctx(ref_options()), fast_ctx(fast_options());
  expect_error([&] { dfp::LinearF32 op(ref_ctx, 0, 4, 4, "fc1"); }, dfp::Status::invalid_argument, {"batch"});
  expect_error([&] { dfp::LinearF32 op(fast_ctx, 2, 4, -1, "fc1"); }, dfp::Status::invalid_argument,
               {"out_features"});
  dfp::LinearF32 op(fast_ctx, 2, 4, 4, "fc2");
  float x[8] = {}, y[8] = {};
  expect_error([&] { op.forward(x, y); }, dfp::Status::invalid_argument, {"fc2"});
}

TEST(ConvF32, MoveKeepsState) {
  dfp::Context fast_ctx(fast_options());
  const ConvShape s = conv(1, 16, 5, 5, 16, 3, 3, 1, 1);
  const std::vector<float> x = random_blocked(1, 16, 5, 5, 41);
  const std::vector<float> w = random_values(16 * 16 * 9, 42);
  dfp::ConvF32 a(fast_ctx, s);
  a.set_weights(w.data());
  std::vector<float> y1(x.size()), y2(x.size());
  a.forward(x.data(), y1.data());
  dfp::ConvF32 b(std::move(a));
  b.forward(x.data(), y2.data());
  EXPECT_EQ(y1, y2);
}

}  // namespace
