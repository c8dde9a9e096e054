// INT16 (DFP16) convolution and fully-connected operators: exactness on integer data, bit-identity
// of every ISA with the scalar model at tile edges, the quantization error bound against FP64,
// adversarial operands that would overflow a naive INT32 chain, and error reporting. The
// micro-kernels called directly are in conv_int16_kernels_test.cpp, x from a producer's spans in
// conv_int16_spans_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"
#include "src/core/aligned_buffer.hpp"
#include "tests/common/conv_int16_cases.hpp"
#include "tests/common/reference.hpp"
#include "tests/common/tolerance.hpp"
#include "tests/common/expect_error.hpp"
#include "tests/common/isa_levels.hpp"

using namespace dfp;
using test::random_ints;
using test::random_vec;
using namespace test::conv_int16_cases;

TEST(ConvInt16, ExactOnIntegerData) {
  for (const ConvShape& s : edge_shapes()) {
    SCOPED_TRACE(describe(s));
    const auto x = random_ints(size_t(s.N) * s.C * s.H * s.W, 1, -7, 7);
    const auto w = random_ints(size_t(s.K) * s.C * s.R * s.S, 2, -7, 7);
    const auto dy = random_ints(size_t(s.N) * s.K * s.OH() * s.OW(), 3, -7, 7);
    std::vector<double> y, dx, dw;
    test::conv_fwd_ref(s, x, w, y);
    test::conv_bwd_data_ref(s, dy, w, dx);
    test::conv_bwd_weights_ref(s, x, dy, dw);
    Context ctx(ContextOptions{.threads = 2});
    const Outputs o = run_int16(ctx, s, x, w, dy);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(o.y[i], y[i]) << "y " << i;
    for (size_t i = 0; i < dx.size(); ++i) ASSERT_EQ(o.dx[i], dx[i]) << "dx " << i;
    for (size_t i = 0; i < dw.size(); ++i) ASSERT_EQ(o.dw[i], dw[i]) << "dw " << i;
  }
}

// Each vector level against the scalar model, named explicitly (a context's own level wins over
// DFP_ISA): the suite's forced-level re-runs would repeat the default run's work, so they skip.
class ConvInt16Isa : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (const char* forced = std::getenv("DFP_ISA"); forced && *forced)
      GTEST_SKIP() << "every level runs in the default run; DFP_ISA=" << forced;
    if (!detect_cpu_features().supports(parse_isa(GetParam(), "test"))) GTEST_SKIP() << "CPU lacks " << GetParam();
  }
};

TEST_P(ConvInt16Isa, BitExactAgainstScalarModel) {
  Context ctx(ContextOptions{.threads = 2, .isa = GetParam()});
  for (const ConvShape& s : edge_shapes()) {
    SCOPED_TRACE(describe(s));
    const auto x = random_vec(size_t(s.N) * s.C * s.H * s.W, 11);
    const auto w = random_vec(size_t(s.K) * s.C * s.R * s.S, 12, -0.3f, 0.3f);
    const auto dy = random_vec(size_t(s.N) * s.K * s.OH() * s.OW(), 13, -1e-3f, 1e-3f);
    // Derived chains, and forced short ones: per-step flush paths, and (2) a last flush on the last
    // step of a direct GEMM call, whose scale applies after it.
    for (int chain : {0, 2, 3, 8}) {
      DfpConvOptions o;
      o.chain_override = chain;
      o.gradients.rounding = Rounding::stochastic;
      const Outputs a = run_int16(ref_ctx(), s, x, w, dy, o);
      const Outputs b = run_int16(ctx, s, x, w, dy, o);
      expect_outputs_bits_equal(a, b);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, ConvInt16Isa, ::testing::ValuesIn(test::isa_names_from(Isa::avx2)));

// Each pass names the kernel it runs: the pixel kernel for forward and backward data, the pair
// kernel for the weight gradient, of the context's ISA; the verification mode names its shadow.
TEST_P(ConvInt16Isa, NamesTheKernelOfEachPass) {
  Context ctx(ContextOptions{.threads = 2, .isa = GetParam()});
  const ConvShape s = edge_shapes().front();
  const ConvInt16 conv(ctx, s);
  EXPECT_STREQ(conv.kernel_name(), ctx.kernels().conv_s16_pixel.name);
  EXPECT_STREQ(conv.weight_gradient_kernel_name(), ctx.kernels().conv_s16_pair.name);
  // The avx2 level names its VEX VPDPWSSD form "avxvnni" where the CPU has AVX-VNNI.
  const std::string level = GetParam();
  const std::string form = level == "avx2" && ctx.cpu().avx_vnni ? "avxvnni" : level;
  EXPECT_NE(std::string(conv.kernel_name()).find("__" + form + "_"), std::string::npos) << conv.kernel_name();
  EXPECT_NE(std::string(conv.weight_gradient_kernel_name()).find("__" + form + "_"), std::string::npos);
  EXPECT_NE(std::string(conv.weight_gradient_kernel_name()).find("_pair"), std::string::npos);
  DfpConvOptions o;
  o.verify = true;
  const ConvInt16 verifying(ctx, s, o);
  EXPECT_STREQ(verifying.weight_gradient_kernel_name(), "conv_s16s16f32__ref_int64_shadow");
}

// Adding onto a dx that holds other (non-integer) values keeps an FMA per flush (the overwriting
// path is BitExactAgainstScalarModel's), against the scalar model, with derived chains, forced
// short ones (per-step flush paths), and whole units whose last flush falls on the call's last
// step (8).
TEST_P(ConvInt16Isa, AccumulatingBackwardDataBitExactAgainstScalarModel) {
  Context ctx(ContextOptions{.threads = 2, .isa = GetParam()});
  for (const ConvShape& s : edge_shapes()) {
    SCOPED_TRACE(describe(s));
    const auto w = random_vec(size_t(s.K) * s.C * s.R * s.S, 21, -0.3f, 0.3f);
    const auto dy = random_vec(size_t(s.N) * s.K * s.OH() * s.OW(), 22, -1e-3f, 1e-3f);
    const auto before = random_vec(size_t(s.N) * s.C * s.H * s.W, 23, -1e-2f, 1e-2f);
    std::vector<float> dyb(blocked_size(s.N, s.K, s.OH(), s.OW())), start(blocked_size(s.N, s.C, s.H, s.W));
    to_blocked(dy.data(), dyb.data(), s.N, s.K, s.OH(), s.OW());
    to_blocked(before.data(), start.data(), s.N, s.C, s.H, s.W);
    for (int chain : {0, 3, 8}) {
      auto run = [&](const Context& c) {
        ConvInt16 conv = backward_data_op(c, s, w, dyb, chain);
        std::vector<float> dx = start;
        conv.backward_data(dx.data(), true);
        return dx;
      };
      expect_bits_equal(run(ref_ctx()), run(ctx), "backward_data (accumulate), chain " + std::to_string(chain));
    }
  }
}

// The overwriting flush's claim (Flush in simd/avx512/conv_s16_kernels.hpp): summing the chains
// unscaled and scaling once at the end gives the bits of an FMA per flush. Overwriting dx and
// adding onto +0 (which keeps the FMA) must agree bit for bit, at every level, with chains of 1
// and 3 steps so that many flushes round (full-range operands: partial sums past 2^24).
TEST(ConvInt16, OverwritingGivesTheBitsOfAnFmaPerFlush) {
  for (Isa isa : test::isa_levels()) {
    Context ctx(ContextOptions{.threads = 2, .isa = isa_name(isa)});
    for (const ConvShape& s : edge_shapes()) {
      SCOPED_TRACE(std::string(isa_name(isa)) + " " + describe(s));
      const auto w = random_vec(size_t(s.K) * s.C * s.R * s.S, 31);
      const auto dy = random_vec(size_t(s.N) * s.K * s.OH() * s.OW(), 32, -1e3f, 1e3f);
      std::vector<float> dyb(blocked_size(s.N, s.K, s.OH(), s.OW()));
      to_blocked(dy.data(), dyb.data(), s.N, s.K, s.OH(), s.OW());
      for (int chain : {1, 3}) {
        ConvInt16 conv = backward_data_op(ctx, s, w, dyb, chain);
        std::vector<float> overwritten(blocked_size(s.N, s.C, s.H, s.W), -1.f), added(overwritten.size(), 0.f);
        conv.backward_data(overwritten.data(), false);
        conv.backward_data(added.data(), true);
        expect_bits_equal(overwritten, added, "chain " + std::to_string(chain));
      }
    }
  }
}

TEST(ConvInt16, WithinQuantizationBoundOfFp64) {
  Context ctx(ContextOptions{.threads = 2});
  for (const ConvShape& s : edge_shapes()) {
    SCOPED_TRACE(describe(s));
    const auto x = random_vec(size_t(s.N) * s.C * s.H * s.W, 21, 0.f, 4.f);  // post-ReLU-like
    const auto w = random_vec(size_t(s.K) * s.C * s.R * s.S, 22, -0.2f, 0.2f);
    const auto dy = random_vec(size_t(s.N) * s.K * s.OH() * s.OW(), 23, -1e-4f, 1e-4f);
    const Outputs o = run_int16(ctx, s, x, w, dy);
    // Nearest rounding: each operand errs by at most half a step of its exponent.
    const double ax = test::dfp16_step(o.stats.x.exponent) / 2, aw = test::dfp16_step(o.stats.w.exponent) / 2,
                 ag = test::dfp16_step(o.stats.dy.exponent) / 2;
    std::vector<double> y, dx, dw, by, bdx, bdw;
    test::conv_fwd_ref(s, x, w, y, &by, ax, aw);
    test::conv_bwd_data_ref(s, dy, w, dx, &bdx, ag, aw);
    test::conv_bwd_weights_ref(s, x, dy, dw, &bdw, ax, ag);
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_LE(std::fabs(o.y[i] - y[i]), by[i] + std::fabs(y[i]) * test::kFp32Flush) << "y " << i;
    for (size_t i = 0; i < dx.size(); ++i)
      ASSERT_LE(std::fabs(o.dx[i] - dx[i]), bdx[i] + std::fabs(dx[i]) * test::kFp32Flush) << "dx " << i;
    for (size_t i = 0; i < dw.size(); ++i)
      ASSERT_LE(std::fabs(o.dw[i] - dw[i]), bdw[i] + std::fabs(dw[i]) * test::kFp32Flush) << "dw " << i;
  }
}

// Every value at the same maximum: a naive INT32 chain over 3x3x64 = 576 products of 4096*4096
// (2^24) overflows after 128 of them. The derived chains keep every partial sum in range, and
// because all partial sums are multiples of 2^24 the FP32 result is exact.
TEST(ConvInt16, AdversarialOperandsGiveExactAnswer) {
  const ConvShape s = make(4, 64, 6, 6, 32, 3, 3, 1, 0);  // no padding: every output sees 576 products
  for (bool mixed_signs : {false, true}) {
    SCOPED_TRACE(mixed_signs ? "random signs" : "all positive");
    const auto x = constant_magnitude(size_t(s.N) * s.C * s.H * s.W, 1.f, 1, mixed_signs);
    const auto w = constant_magnitude(size_t(s.K) * s.C * s.R * s.S, 1.f, 2, mixed_signs);
    const auto dy = constant_magnitude(size_t(s.N) * s.K * s.OH() * s.OW(), 1.f, 3, mixed_signs);
    std::vector<double> y, dx, dw;
    test::conv_fwd_ref(s, x, w, y);
    test::conv_bwd_data_ref(s, dy, w, dx);
    test::conv_bwd_weights_ref(s, x, dy, dw);
    for (bool verify : {false, true}) {
      DfpConvOptions o;
      o.verify = verify;
      Context ctx(ContextOptions{.threads = 2});
      const Outputs r = run_int16(ctx, s, x, w, dy, o);
      EXPECT_EQ(r.stats.x.max_abs_int, 4096);
      EXPECT_LT(r.stats.chain_fwd, 2 * 576);  // the bound really shortened the chain
      EXPECT_EQ(r.stats.overflow_events, 0);
      for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(r.y[i], y[i]) << "y " << i;
      for (size_t i = 0; i < dx.size(); ++i) ASSERT_EQ(r.dx[i], dx[i]) << "dx " << i;
      for (size_t i = 0; i < dw.size(); ++i) ASSERT_EQ(r.dw[i], dw[i]) << "dw " << i;
    }
    if (!mixed_signs) {
      // The verification mode does see overflow when a chain is forced past the bound.
      DfpConvOptions o;
      o.verify = true;
      o.chain_override = 1 << 20;
      Context ctx(ContextOptions{.threads = 2});
      const Outputs r = run_int16(ctx, s, x, w, dy, o);
      EXPECT_GT(r.stats.overflow_events, 0);
    }
  }
}

// Full-range operands: with headroom 0 every value of +-(32767/16384) quantizes to +-32767, the
// largest INT16 magnitude, and one pair of products (2 * 32767^2 = 2^31 - 131069) only just fits
// INT32. The bound must then give chains of a single VPDPWSSD step (its sub-unit branch); the
// verification mode (INT64 shadow) counts no overflow; the default kernels give the same bits;
// and the outputs are within one FP32 rounding per flush of the FP64 result (the products are
// exact; only the flushes into FP32 round). Convolution and the fully connected GEMM alike.
TEST(ConvInt16, FullRangeOperandsChainOneStepWithoutOverflow) {
  const float big = 32767.f / 16384.f;
  DfpConvOptions o;
  o.weights.headroom = o.activations.headroom = o.gradients.headroom = 0;
  // Sum of |products| per output, and the flush count: every pair of products is one chain.
  auto bound = [](double abs_sum, int terms) { return (terms / 2 + 2) * 0x1p-24 * abs_sum; };
  for (bool mixed_signs : {false, true}) {
    SCOPED_TRACE(mixed_signs ? "random signs" : "all positive");
    auto fill = [&](size_t n, uint32_t seed) { return constant_magnitude(n, big, seed, mixed_signs); };
    const ConvShape s = make(2, 32, 5, 5, 16, 3, 3, 1, 1);
    const auto x = fill(size_t(s.N) * s.C * s.H * s.W, 11), w = fill(size_t(s.K) * s.C * s.R * s.S, 12),
               dy = fill(size_t(s.N) * s.K * s.OH() * s.OW(), 13);
    std::vector<double> y, dx, dw;
    test::conv_fwd_ref(s, x, w, y);
    test::conv_bwd_data_ref(s, dy, w, dx);
    test::conv_bwd_weights_ref(s, x, dy, dw);
    DfpConvOptions v = o;
    v.verify = true;
    Context ctx(ContextOptions{.threads = 2});
    const Outputs checked = run_int16(ctx, s, x, w, dy, v), fast = run_int16(ctx, s, x, w, dy, o);
    for (const Outputs* r : {&checked, &fast}) {
      EXPECT_EQ(r->stats.x.max_abs_int, 32767);
      EXPECT_EQ(r->stats.w.max_abs_int, 32767);
      EXPECT_EQ(r->stats.dy.max_abs_int, 32767);
      EXPECT_EQ(r->stats.chain_fwd, 1);
      EXPECT_EQ(r->stats.chain_bwd, 1);
      EXPECT_EQ(r->stats.chain_wgrad, 1);
    }
    EXPECT_EQ(checked.stats.overflow_events, 0);
    expect_outputs_bits_equal(fast, checked);
    // Each output's products all have magnitude big^2, so sum|products| = terms * big^2; interior
    // outputs have C*9 (forward), K*9 (backward-data) and N*OH*OW-ish (weights) terms at most.
    const double b2 = double(big) * big;
    for (size_t i = 0; i < y.size(); ++i) ASSERT_LE(std::fabs(fast.y[i] - y[i]), bound(b2 * s.C * 9, s.C * 9)) << "y " << i;
    for (size_t i = 0; i < dx.size(); ++i) ASSERT_LE(std::fabs(fast.dx[i] - dx[i]), bound(b2 * s.K * 9, s.K * 9)) << "dx " << i;
    const int wterms = s.N * s.OH() * s.OW();
    for (size_t i = 0; i < dw.size(); ++i) ASSERT_LE(std::fabs(fast.dw[i] - dw[i]), bound(b2 * wterms, wterms)) << "dw " << i;

    // The fully connected layer: [N][C] x [K][C] is a 1x1 convolution of 1x1 images, so the
    // convolution's FP64 references apply.
    const int N = 6, C = 40, K = 20;
    const ConvShape ls = make(N, C, 1, 1, K, 1, 1, 1, 0);
    const auto lx = fill(size_t(N) * C, 21), lw = fill(size_t(K) * C, 22), ldy = fill(size_t(N) * K, 23);
    const Outputs lin = run_linear(ctx, N, C, K, lx, lw, ldy, o), lin_checked = run_linear(ctx, N, C, K, lx, lw, ldy, v);
    for (const Outputs* r : {&lin, &lin_checked}) {
      EXPECT_EQ(r->stats.chain_fwd, 1);
      EXPECT_EQ(r->stats.chain_bwd, 1);
      EXPECT_EQ(r->stats.chain_wgrad, 1);
    }
    EXPECT_EQ(lin_checked.stats.overflow_events, 0);
    expect_outputs_bits_equal(lin, lin_checked, "linear ");
    std::vector<double> ly, ldx, ldw;
    test::conv_fwd_ref(ls, lx, lw, ly);
    test::conv_bwd_data_ref(ls, ldy, lw, ldx);
    test::conv_bwd_weights_ref(ls, lx, ldy, ldw);
    for (size_t i = 0; i < ly.size(); ++i) ASSERT_LE(std::fabs(lin.y[i] - ly[i]), bound(b2 * C, C)) << "linear y " << i;
    for (size_t i = 0; i < ldx.size(); ++i) ASSERT_LE(std::fabs(lin.dx[i] - ldx[i]), bound(b2 * K, K)) << "linear dx " << i;
    for (size_t i = 0; i < ldw.size(); ++i) ASSERT_LE(std::fabs(lin.dw[i] - ldw[i]), bound(b2 * N, N)) << "linear dw " << i;
  }
}

TEST(ConvInt16, ChainBoundIsExactOverWindowsOfUnits) {
  // Weights 1.0 on even taps and 0.25 on odd ones, x and dy all 1.0, no padding: every output's
  // INT32 sum reaches the bound, a = 4096, and a unit (one input block, one tap: 16 products per
  // lane) sums to 4096 * 16 * 4096 = 2^28 on an even tap and 2^26 on an odd one. The per-unit
  // bound allows 7 units (56 steps); windows of the actual sequence (HLHLHLHLH twice) allow 11:
  // the first 11 units sum to 6 * 2^28 + 5 * 2^26 < 2^31, the first 12 to 7 * 2^28 + 5 * 2^26 > 2^31.
  const ConvShape s = make(2, 32, 5, 5, 16, 3, 3, 1, 0);
  std::vector<float> w(size_t(s.K) * s.C * 9);
  for (size_t i = 0; i < w.size(); ++i) w[i] = (i % 9) % 2 == 0 ? 1.f : 0.25f;
  const std::vector<float> x(size_t(s.N) * s.C * s.H * s.W, 1.f), dy(size_t(s.N) * s.K * s.OH() * s.OW(), 1.f);
  Context ctx(ContextOptions{.threads = 2});
  EXPECT_EQ(run_verified_exact(ctx, s, x, w, dy).stats.chain_fwd, 88);
  DfpConvOptions o;
  o.verify = true;
  // One unit more overflows: the bound is the longest safe chain, not just a safe one.
  o.chain_override = 96;
  EXPECT_GT(run_int16(ctx, s, x, w, dy, o).stats.overflow_events, 0);

  // With padding, edge rows skip the taps that read padding rows, and edge columns (where the
  // middle of a row is at least 5 pixels: 8x8, and 12x12 at stride 2) the taps that read padding
  // columns. Each runs a shorter unit sequence with its own chain; the bound holds for all of them,
  // in both passes. 64 channels: an edge column's 4 x 6 units would overflow in one chain.
  for (auto [size, stride] : {std::pair{6, 1}, std::pair{6, 2}, std::pair{8, 1}, std::pair{12, 2}}) {
    const ConvShape sp = make(2, 64, size, size, 32, 3, 3, stride, 1);
    std::vector<float> wp(size_t(sp.K) * sp.C * 9);
    for (size_t i = 0; i < wp.size(); ++i) wp[i] = (i % 9) % 2 == 0 ? 1.f : 0.25f;
    const std::vector<float> xp(size_t(sp.N) * sp.C * sp.H * sp.W, 1.f),
        dyp(size_t(sp.N) * sp.K * sp.OH() * sp.OW(), 1.f);
    SCOPED_TRACE(describe(sp));
    run_verified_exact(ctx, sp, xp, wp, dyp);
  }
}

// Calls take their chains from the largest |q| of the rows they read, not the tensor's. Big values
// (1.5: 6144 = 3 * 2^11 as DFP16, products of 2^25.2, so 57 of them pass INT32) sit in image 3 of
// x, in one row of image 2 of x, in the rows of image 3 of dy that do not start a weight-gradient
// tile (every 8th row does, at 16 x 16), and in one row of image 1 of dy; everything else is 1/64
// of them, and every weight is big. One big input row under a tap gives 64 big products, so a
// call whose bound missed a row it reads -- a tap's row, a row of an edge column's chunk, a row
// of a weight-gradient tile, the second image of its pair -- would run a chain that overflows,
// and verification counts it. Powers of two times 3 keep every result exact.
TEST(ConvInt16, ChainsFollowTheRowsEachCallReads) {
  for (int stride : {1, 2}) {
    const ConvShape s = make(4, 64, 16, 16, 64, 3, 3, stride, 1);
    SCOPED_TRACE(describe(s));
    const int OH = s.OH(), OW = s.OW();
    const float big = 1.5f, small = 1.5f / 64;
    std::vector<float> x(size_t(s.N) * s.C * s.H * s.W), dy(size_t(s.N) * s.K * OH * OW);
    const std::vector<float> w(size_t(s.K) * s.C * 9, big);
    for (size_t i = 0; i < x.size(); ++i) {
      const size_t n = i / (size_t(s.C) * s.H * s.W), h = i / s.W % s.H;
      x[i] = n == 3 || (n == 2 && h == 5) ? big : small;
    }
    for (size_t i = 0; i < dy.size(); ++i) {
      const size_t n = i / (size_t(s.K) * OH * OW), h = i / OW % OH;
      dy[i] = (n == 3 && h % 8 != 0) || (n == 1 && h == 2) ? big : small;
    }
    Context ctx(ContextOptions{.threads = 2});
    EXPECT_EQ(run_verified_exact(ctx, s, x, w, dy).stats.x.max_abs_int, 6144);
  }
  // 4x4 images: a row's calls of three images (then two) run over one pass of the weights
  // (PixelPass::images_per_item), each image's call with the chain of its own rows. Image 2's big
  // row (x) and image 1's (dy) share their items with small images; a call that took another
  // image's bound would overflow.
  const ConvShape s = make(5, 64, 4, 4, 64, 3, 3, 1, 1);
  SCOPED_TRACE(describe(s));
  const float big = 1.5f, small = 1.5f / 64;
  std::vector<float> x(size_t(s.N) * s.C * 16), dy(size_t(s.N) * s.K * 16);
  const std::vector<float> w(size_t(s.K) * s.C * 9, big);
  for (size_t i = 0; i < x.size(); ++i) {
    const size_t n = i / (size_t(s.C) * 16), h = i / 4 % 4;
    x[i] = n == 4 || (n == 2 && h == 1) ? big : small;
  }
  for (size_t i = 0; i < dy.size(); ++i) {
    const size_t n = i / (size_t(s.K) * 16), h = i / 4 % 4;
    dy[i] = n == 4 || (n == 1 && h == 2) ? big : small;
  }
  Context ctx(ContextOptions{.threads = 2});
  EXPECT_EQ(run_verified_exact(ctx, s, x, w, dy).stats.x.max_abs_int, 6144);
}

// Images whose weight-gradient tile is the whole output (8x8 here) run their image pairs as one
// kernel call's planes, each plane with its own pair's chain. Big values sit in image 4 of x and
// of dy (pair 2) and in rows 3 and 4 of image 1 of dy (pair 0); everything else, weights aside,
// is 1/64 of them. Pair 2's center tap reads 64 big products, over the 57 that fit INT32:
// a plane whose chain came from another pair's bounds, or from no bound, would overflow, and
// verification counts it. Five pairs: a call of kWgradPlanes (4) and one of the last pair, which
// has one image.
TEST(ConvInt16, ChainsFollowThePairOfEachPlane) {
  const ConvShape s = make(9, 64, 8, 8, 64, 3, 3, 1, 1);
  const int OH = s.OH(), OW = s.OW();
  const float big = 1.5f, small = 1.5f / 64;
  std::vector<float> x(size_t(s.N) * s.C * s.H * s.W), dy(size_t(s.N) * s.K * OH * OW);
  const std::vector<float> w(size_t(s.K) * s.C * 9, big);
  for (size_t i = 0; i < x.size(); ++i) x[i] = i / (size_t(s.C) * s.H * s.W) == 4 ? big : small;
  for (size_t i = 0; i < dy.size(); ++i) {
    const size_t n = i / (size_t(s.K) * OH * OW), h = i / OW % OH;
    dy[i] = n == 4 || (n == 1 && (h == 3 || h == 4)) ? big : small;
  }
  Context ctx(ContextOptions{.threads = 2});
  const Outputs r = run_verified_exact(ctx, s, x, w, dy);
  EXPECT_EQ(r.stats.x.max_abs_int, 6144);
  EXPECT_LT(r.stats.chain_wgrad, 64);  // the bound really shortened a chain
}

// The planes of one call (4x4 images: kWgradPlanes pairs) continue each other's chain only where
// their sums together fit INT32. x is big; dy is small in pair 0 and big in pairs 1-3: a big
// pair's center tap sums 32 products of 6144^2 (1.21e9), so pair 0 (1/64 of that, with a chain
// from its own small bound) can take pair 1 into its chain, and no other two planes fit one:
// continued past that, the chain would overflow INT32, and verification counts it. With dy
// small everywhere all four fit one chain. Exact against FP64. K = 64: by output blocks, so one
// task's calls take all four pairs.
TEST(ConvInt16, PlanesContinueAChainOnlyWhereTheirSumsFitInt32) {
  const ConvShape s = make(8, 16, 4, 4, 64, 3, 3, 1, 1);
  const float big = 1.5f, small = big / 64;
  const size_t dy_image = size_t(s.K) * s.OH() * s.OW();
  for (bool all_small : {false, true}) {
    SCOPED_TRACE(all_small ? "dy small" : "dy big but in pair 0");
    const std::vector<float> x(size_t(s.N) * s.C * s.H * s.W, big), w(size_t(s.K) * s.C * 9, big);
    std::vector<float> dy(size_t(s.N) * dy_image);
    for (size_t i = 0; i < dy.size(); ++i) dy[i] = all_small || i / dy_image < 2 ? small : big;
    for (int threads : {1, 2}) {
      Context ctx(ContextOptions{.threads = threads});
      const Outputs r = run_verified_exact(ctx, s, x, w, dy);
      EXPECT_EQ(r.stats.x.max_abs_int, 6144);
    }
  }
}

// Image tiles (rows of at most 2 pixels: 8 images at one position) and GEMM layers (1x1 over 1x1
// images: 14 images per call) bound each call by the largest |q| over the images it takes. One
// image of x and one of dy are big, each in the second tile; every weight is big. A call whose
// bound missed an image it reads would run a chain that overflows, and verification counts it.
TEST(ConvInt16, ChainsFollowTheImagesEachTileReads) {
  for (const ConvShape& s : {make(20, 64, 2, 2, 64, 3, 3, 1, 1), make(30, 512, 1, 1, 64, 1, 1, 1, 0)}) {
    SCOPED_TRACE(describe(s));
    const int OH = s.OH(), OW = s.OW();
    const float big = 1.5f, small = 1.5f / 64;
    std::vector<float> x(size_t(s.N) * s.C * s.H * s.W), dy(size_t(s.N) * s.K * OH * OW);
    const std::vector<float> w(size_t(s.K) * s.C * s.R * s.S, big);
    for (size_t i = 0; i < x.size(); ++i) x[i] = i / (size_t(s.C) * s.H * s.W) == 15 ? big : small;
    for (size_t i = 0; i < dy.size(); ++i) dy[i] = i / (size_t(s.K) * OH * OW) == 9 ? big : small;
    Context ctx(ContextOptions{.threads = 2});
    EXPECT_EQ(run_verified_exact(ctx, s, x, w, dy).stats.x.max_abs_int, 6144);
  }
}

// Output images of at most kWgradAcrossPairs positions (2x2; 3x4 at stride 2) chain the weight
// gradient across image pairs. Every image but the first pair's is big in x and dy, so that 29
// positions overflow INT32 and a call of 32 pairs must flush inside: a chain bounded by one
// pair's operands (the first's) would overflow, and verification counts it. By output blocks
// (K 64), with an odd batch, and by slices of pairs (K 40).
TEST(ConvInt16, ChainsAcrossImagePairsFollowEveryPairTheyRead) {
  for (const ConvShape& s : {make(64, 64, 2, 2, 64, 3, 3, 1, 1), make(63, 32, 3, 4, 64, 3, 3, 2, 1),
                             make(63, 32, 2, 2, 40, 3, 3, 1, 1)}) {
    SCOPED_TRACE(describe(s));
    const int OH = s.OH(), OW = s.OW();
    const float big = 1.5f, small = 1.5f / 64;
    std::vector<float> x(size_t(s.N) * s.C * s.H * s.W), dy(size_t(s.N) * s.K * OH * OW);
    const std::vector<float> w(size_t(s.K) * s.C * s.R * s.S, big);
    for (size_t i = 0; i < x.size(); ++i) x[i] = i / (size_t(s.C) * s.H * s.W) < 2 ? small : big;
    for (size_t i = 0; i < dy.size(); ++i) dy[i] = i / (size_t(s.K) * OH * OW) < 2 ? small : big;
    Context ctx(ContextOptions{.threads = 2});
    const Outputs r = run_verified_exact(ctx, s, x, w, dy);
    EXPECT_EQ(r.stats.x.max_abs_int, 6144);
    EXPECT_LT(r.stats.chain_wgrad, 29);
  }
}

TEST(ConvInt16, IndependentOfThreadCount) {
  // K = 40: the weight gradient sums fixed slices of image pairs; K = 72 (5 output blocks): it
  // runs by groups of output blocks, grouped differently for each thread count (as planes: 9x9
  // outputs); K = 64 and 70 the same over tiles of positions (12x12 outputs) with 3 input
  // blocks (3x3, and 1x1 with a partial last block).
  for (const ConvShape& s : {make(6, 24, 10, 10, 40, 3, 3, 2, 1), make(5, 20, 9, 9, 72, 3, 3, 1, 1),
                             make(3, 48, 12, 12, 64, 3, 3, 1, 1), make(3, 44, 12, 12, 70, 1, 1, 1, 0)}) {
    SCOPED_TRACE(describe(s));
    const auto x = random_vec(size_t(s.N) * s.C * s.H * s.W, 31);
    const auto w = random_vec(size_t(s.K) * s.C * s.R * s.S, 32);
    const auto dy = random_vec(size_t(s.N) * s.K * s.OH() * s.OW(), 33);
    Context one(ContextOptions{.threads = 1});
    const Outputs a = run_int16(one, s, x, w, dy);
    for (int threads : {2, 3}) {
      Context more(ContextOptions{.threads = threads});
      const Outputs b = run_int16(more, s, x, w, dy);
      expect_outputs_bits_equal(a, b);
    }
  }
}

// Without an input-gradient pass (a network's first layer) dy is quantized straight into the weight
// gradient's batch-pair layout: the same bits as the operator with one, with stochastic rounding,
// odd batches, rows of several 128-pixel pieces (OW = 150), unfolded first layers, fully connected
// layers (split by slices, and writing dW in place), and at every kernel level; no INT32 chain
// overflows (the reference counts them).
TEST(ConvInt16, WeightGradientWithoutInputGradientGivesTheSameBits) {
  for (Isa level : test::isa_levels()) {
    const std::string isa = isa_name(level);
    Context ctx(ContextOptions{.threads = 2, .isa = isa});
    for (const ConvShape& s : {make(5, 3, 12, 150, 16, 3, 3, 1, 1), make(3, 3, 15, 13, 20, 7, 7, 2, 3),
                               make(4, 20, 9, 9, 72, 3, 3, 2, 1), make(3, 1, 28, 28, 6, 5, 5, 1, 2),
                               make(5, 40, 1, 1, 24, 1, 1, 1, 0), make(7, 48, 1, 1, 72, 1, 1, 1, 0)}) {
      SCOPED_TRACE(std::string(isa) + " " + describe(s));
      const auto x = random_vec(size_t(s.N) * s.C * s.H * s.W, 41);
      const auto w = random_vec(size_t(s.K) * s.C * s.R * s.S, 42);
      const auto dy = random_vec(size_t(s.N) * s.K * s.OH() * s.OW(), 43);
      std::vector<float> xb(blocked_size(s.N, s.C, s.H, s.W)), dyb(blocked_size(s.N, s.K, s.OH(), s.OW()));
      to_blocked(x.data(), xb.data(), s.N, s.C, s.H, s.W);
      to_blocked(dy.data(), dyb.data(), s.N, s.K, s.OH(), s.OW());
      DfpConvOptions with;
      with.gradients.rounding = Rounding::stochastic;
      with.verify = level == Isa::ref;
      DfpConvOptions without = with;
      without.input_gradient = false;
      std::vector<float> dw[2];
      ConvStats st[2];
      for (int i = 0; i < 2; ++i) {
        ConvInt16 conv(ctx, s, i ? without : with, "c");
        conv.set_step(7);
        conv.set_weights(w.data());
        conv.quantize_input(xb.data());
        conv.quantize_grad_output(dyb.data());
        dw[i].assign(w.size(), -1.f);
        conv.backward_weights(dw[i].data());
        st[i] = conv.stats();
      }
      expect_bits_equal(dw[0], dw[1], "backward_weights");
      EXPECT_EQ(st[0].dy.exponent, st[1].dy.exponent);
      EXPECT_EQ(st[0].dy.max_abs_int, st[1].dy.max_abs_int);
      EXPECT_EQ(st[0].dy.saturated, st[1].dy.saturated);
      EXPECT_EQ(st[0].chain_wgrad, st[1].chain_wgrad);
      if (with.verify) {  // counted by the reference only
        EXPECT_EQ(st[1].overflow_events, 0);
      }
    }
  }
}

TEST(LinearInt16, MatchesConvolutionAndFp64) {
  const int N = 37, C = 70, K = 19;
  const auto x = random_vec(size_t(N) * C, 41, 0.f, 2.f);
  const auto w = random_vec(size_t(K) * C, 42, -0.1f, 0.1f);
  const auto dy = random_vec(size_t(N) * K, 43, -0.01f, 0.01f);
  Context ctx(ContextOptions{.threads = 2});
  const Outputs fast = run_linear(ctx, N, C, K, x, w, dy), scalar = run_linear(ref_ctx(), N, C, K, x, w, dy);
  expect_outputs_bits_equal(fast, scalar, "linear ");
  const std::vector<float>&y = fast.y, &dx = fast.dx, &dw = fast.dw;
  const ConvStats& st = fast.stats;
  const double ax = test::dfp16_step(st.x.exponent) / 2, aw = test::dfp16_step(st.w.exponent) / 2,
               ag = test::dfp16_step(st.dy.exponent) / 2;
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) {
      double ref = 0, b = 0;
      for (int c = 0; c < C; ++c) {
        ref += double(x[n * C + c]) * w[k * C + c];
        b += std::fabs(x[n * C + c]) * aw + std::fabs(w[k * C + c]) * ax + ax * aw;
      }
      ASSERT_LE(std::fabs(y[n * K + k] - ref), b + std::fabs(ref) * test::kFp32Flush);
    }
  for (int k = 0; k < K; ++k)
    for (int c = 0; c < C; ++c) {
      double ref = 0, b = 0;
      for (int n = 0; n < N; ++n) {
        ref += double(x[n * C + c]) * dy[n * K + k];
        b += std::fabs(x[n * C + c]) * ag + std::fabs(dy[n * K + k]) * ax + ax * ag;
      }
      ASSERT_LE(std::fabs(dw[k * C + c] - ref), b + std::fabs(ref) * test::kFp32Flush);
    }
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) {
      double ref = 0, b = 0;
      for (int k = 0; k < K; ++k) {
        ref += double(dy[n * K + k]) * w[k * C + c];
        b += std::fabs(dy[n * K + k]) * aw + std::fabs(w[k * C + c]) * ag + ag * aw;
      }
      ASSERT_LE(std::fabs(dx[n * C + c] - ref), b + std::fabs(ref) * test::kFp32Flush);
    }
}

TEST(ConvInt16, ClearErrors) {
  Context ctx(ContextOptions{.threads = 1});
  ConvShape bad = make(1, 3, 4, 4, 8, 3, 3, 0, 1);
  test::expect_error([&] { ConvInt16 c(ctx, bad, {}, "layer2.conv1"); }, Status::invalid_argument, {"layer2.conv1", "stride_h"});
  const ConvShape s = make(1, 3, 4, 4, 8, 3, 3, 1, 1);
  ConvInt16 c(ctx, s, {}, "conv1");
  std::vector<float> y(blocked_size(1, 8, 4, 4));
  EXPECT_THROW(c.forward(y.data()), Error);  // no weights yet
  std::vector<float> xb(blocked_size(1, 3, 4, 4), 1.f);
  xb[5] = NAN;
  test::expect_error([&] { c.quantize_input(xb.data()); }, Status::numerical_error, {"conv1"});
  // An operator told that no input gradient is wanted refuses backward_data, unfolded (C = 3,
  // 3x3) or not (C = 16), before it touches dx.
  DfpConvOptions no_dx;
  no_dx.input_gradient = false;
  for (int C : {3, 16}) {
    const ConvShape f = make(1, C, 4, 4, 8, 3, 3, 1, 1);
    ConvInt16 first(ctx, f, no_dx, "stem");
    std::vector<float> w(size_t(8) * C * 9, 0.5f), x(blocked_size(1, C, 4, 4), 1.f), dy(blocked_size(1, 8, 4, 4), 1.f);
    std::vector<float> dx(blocked_size(1, C, 4, 4), -1.f), dw(w.size());
    first.set_weights(w.data());
    first.quantize_input(x.data());
    first.quantize_grad_output(dy.data());
    first.backward_weights(dw.data());
    test::expect_error([&] { first.backward_data(dx.data()); }, Status::invalid_argument, {"stem", "input_gradient"});
    for (float v : dx) ASSERT_EQ(v, -1.f);
  }
}

// Backward-data's packed weights: with one weight exponent they are wf's, written into the
// workspace by backward_data() itself, so a shared region that something else overwrote after
// set_weights() (the other layers' passes) gives the bits of an operator that owns its region,
// also when backward_data runs twice; with per-channel exponents they persist. Shapes: 3x3 with
// K and C past a block (edge units), strided, 1x1, and a fully connected layer.
TEST(ConvInt16, BackwardDataWeightsSurviveASharedRegion) {
  Context ctx(ContextOptions{.threads = 2});
  for (const ConvShape& s : {make(2, 20, 5, 7, 40, 3, 3, 1, 1), make(2, 32, 9, 11, 16, 3, 3, 2, 1),
                             make(3, 48, 4, 4, 24, 1, 1, 1, 0), make(4, 40, 1, 1, 24, 1, 1, 1, 0)})
    for (Granularity g : {Granularity::tensor, Granularity::slice}) {
      DfpConvOptions o;
      o.weights.granularity = g;
      const auto [w, xb, dyb, mx] = blocked_case(s, 71, false);
      std::vector<float> dx[3];
      for (int k = 0; k < 2; ++k) {  // owned, shared
        ConvInt16 c(ctx, s, o, "bwd");
        AlignedBuffer<std::byte> region(c.workspace_bytes());
        if (k == 1) c.use_workspace(region.data());
        c.set_weights(w.data());
        c.quantize_input_with_max_abs(xb.data(), mx);
        std::vector<float> y(blocked_size(s.N, s.K, s.OH(), s.OW()));
        c.forward(y.data());
        if (k == 1) std::memset(region.data(), 0x5a, region.size());  // another layer's use of the region
        c.quantize_grad_output(dyb.data());
        dx[k].assign(xb.size(), 0.f);
        c.backward_data(dx[k].data());
        if (k == 1) {
          dx[2].assign(xb.size(), 0.f);
          c.backward_data(dx[2].data());
        }
      }
      expect_bits_equal(dx[0], dx[1], "backward_data, shared region");
      expect_bits_equal(dx[0], dx[2], "backward_data, twice");
    }
}

// A strided layer's backward data whose dx outgrows the cache streams the zeros of the phases no
// tap reaches (non-temporal stores, 64-byte aligned dx only): every element of dx is written, with
// the exact answer, aligned (streamed) or not, on every ISA. dx starts as NaN.
TEST(ConvInt16, LargeStridedBackwardDataWritesEveryElement) {
  const ConvShape s = make(2, 256, 130, 130, 16, 1, 1, 2, 0);  // dx 33 MiB
  const auto w = random_ints(size_t(s.K) * s.C, 61, -7, 7);
  const auto dy = random_ints(size_t(s.N) * s.K * s.OH() * s.OW(), 62, -7, 7);
  std::vector<double> want;
  test::conv_bwd_data_ref(s, dy, w, want);
  std::vector<float> dyb(blocked_size(s.N, s.K, s.OH(), s.OW()));
  to_blocked(dy.data(), dyb.data(), s.N, s.K, s.OH(), s.OW());
  const size_t n = blocked_size(s.N, s.C, s.H, s.W);
  AlignedBuffer<float> buf(n + 16);  // 64-byte aligned
  std::vector<float> got(n);
  for (Isa level : test::isa_levels()) {
    const std::string isa = isa_name(level);
    Context ctx(ContextOptions{.threads = 2, .isa = isa});
    ConvInt16 conv(ctx, s, {}, "strided");
    conv.set_weights(w.data());
    conv.quantize_grad_output(dyb.data());
    for (int offset : {0, 4}) {  // 64-byte aligned, and not
      SCOPED_TRACE(isa + " offset " + std::to_string(offset));
      float* dx = buf.data() + offset;
      std::fill(dx, dx + n, NAN);
      conv.backward_data(dx);
      from_blocked(dx, got.data(), s.N, s.C, s.H, s.W);
      for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "dx " << i;
    }
  }
}

// backward_data(dx, accumulate = true) adds the gradient to what dx holds, on every path (direct,
// strided phases, image tiles, GEMM, unfolded columns folded back) and ISA, with derived and
// forced short chains (several flushes per output). Integer data: every order of the sums is exact.
TEST(ConvInt16, BackwardDataAccumulatesOntoDx) {
  for (Isa level : test::isa_levels()) {
    const std::string isa = isa_name(level);
    Context ctx(ContextOptions{.threads = 2, .isa = isa});
    for (const ConvShape& s : edge_shapes()) {
      SCOPED_TRACE(describe(s) + " " + isa);
      const auto w = random_ints(size_t(s.K) * s.C * s.R * s.S, 52, -7, 7);
      const auto dy = random_ints(size_t(s.N) * s.K * s.OH() * s.OW(), 53, -7, 7);
      const auto before = random_ints(size_t(s.N) * s.C * s.H * s.W, 54, -1000, 1000);
      std::vector<double> dx;
      test::conv_bwd_data_ref(s, dy, w, dx);
      std::vector<float> dyb(blocked_size(s.N, s.K, s.OH(), s.OW())), dxb(blocked_size(s.N, s.C, s.H, s.W));
      to_blocked(dy.data(), dyb.data(), s.N, s.K, s.OH(), s.OW());
      for (int chain : {0, 3}) {
        ConvInt16 conv = backward_data_op(ctx, s, w, dyb, chain);
        to_blocked(before.data(), dxb.data(), s.N, s.C, s.H, s.W);  // padding lanes 0
        conv.backward_data(dxb.data(), true);
        std::vector<float> got(before.size());
        from_blocked(dxb.data(), got.data(), s.N, s.C, s.H, s.W);
        for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], before[i] + dx[i]) << "dx " << i << " chain " << chain;
        for (size_t i = 0; i < dxb.size(); ++i)
          if (i % 16 + 16 * (i / (16 * size_t(s.H) * s.W) % channel_blocks(s.C)) >= size_t(s.C)) {
            ASSERT_EQ(dxb[i], 0.f) << "padding lane " << i;
          }
      }
    }
  }
}

// The weight gradient's chain from dy's row L1 norms: x constant at its largest integer (8191 at
// headroom 2) and each dy row one image's largest value (8191) then 31 values of 1500, in both
// images. A row's L1 norm is 2 * (8191 + 31 * 1500) = 109382 in every lane; two rows times 8191
// fit INT32 and three do not, so every call of 4 rows (128 positions of 32) flushes after each 2
// rows, where the bound from the maxima alone allows 16 positions. The window sums are above 2^24,
// so the flush points show in dW's bits: the test fails if the chain is longer (overflow, counted
// by the verification mode), or shorter (other roundings). Both granularities, with and without a
// backward-data pass: the dy tile interleaved from the padded copy (tensor), and the whole
// batch-pair copy with the norms that quantization wrote (slice, or no backward-data pass).
TEST(ConvInt16, WeightGradientChainsFromDyRowNorms) {
  const ConvShape s = make(2, 16, 8, 32, 16, 1, 1, 1, 0);  // one image pair; tiles of 4 rows
  const float xv = 8191.f / 4096.f;                         // q = 8191 at exponent -12
  std::vector<float> x(size_t(s.N) * s.C * s.H * s.W, xv), w(size_t(s.K) * s.C, 0.5f), dy(size_t(s.N) * s.K * s.H * s.W);
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = (i % s.W == 0 ? 8191.f : 1500.f) / 4096.f;
  // FP32 partials as the kernels flush them into zeroed partials, one add per window, then the
  // scale 2^-24 (exact): windows of 2 rows, and of 16 positions for contrast.
  auto flushed = [](const std::vector<int64_t>& windows) {
    float p = 0.f;
    for (int64_t v : windows) p += static_cast<float>(v);
    return p * 0x1p-24f;
  };
  std::vector<int64_t> two_rows(4, int64_t{8191} * 2 * 2 * (8191 + 31 * 1500)), half_rows;
  for (int r = 0; r < 8; ++r) {
    half_rows.push_back(int64_t{8191} * 2 * (8191 + 15 * 1500));
    half_rows.push_back(int64_t{8191} * 2 * 16 * 1500);
  }
  const float want = flushed(two_rows);
  ASSERT_NE(want, flushed(half_rows));  // the data tells the chains apart
  Context ctx(ContextOptions{.threads = 2});
  for (Granularity g : {Granularity::tensor, Granularity::slice}) {
    for (bool input_gradient : {true, false}) {
      for (bool verify : {false, true}) {
        SCOPED_TRACE(std::string(granularity_name(g)) + (input_gradient ? "" : ", no backward-data pass") +
                     (verify ? ", verified" : ""));
        DfpConvOptions o;
        o.weights.granularity = o.activations.granularity = o.gradients.granularity = g;
        o.verify = verify;
        o.input_gradient = input_gradient;
        const Outputs r = run_int16(ctx, s, x, w, dy, o);
        EXPECT_EQ(r.stats.overflow_events, 0);
        EXPECT_EQ(r.stats.chain_wgrad, 16);  // the bound from the maxima, which the rows' norms extend
        for (size_t i = 0; i < r.dw.size(); ++i) ASSERT_EQ(r.dw[i], want) << "dw " << i;
      }
    }
  }
}

// The row L1 kernel at every level this CPU runs, against the reference, which the test checks
// against its definition (INT16's -32768 counts 32768): random words, all extremes, and
// 1 to 130 positions (vector tails), with row strides past the row.
TEST(ConvInt16, PairRowL1AtEveryLevelMatchesTheReference) {
  const CpuFeatures cpu = detect_cpu_features();
  uint32_t seed = 300;
  for (int cols : {1, 2, 3, 7, 32, 128, 130}) {
    for (int extreme = 0; extreme < 3; ++extreme) {
      const int rows = 3;
      const int64_t stride = int64_t(cols) * 32 + 48;
      std::vector<int16_t> v(size_t(rows * stride));
      const auto r = random_ints(v.size(), seed++, -32768, 32767);
      for (size_t i = 0; i < v.size(); ++i)
        v[i] = static_cast<int16_t>(extreme == 0 ? r[i] : extreme == 1 ? -32768 : (int(r[i]) % 2 ? 32767 : -32768));
      std::vector<int32_t> want(rows), got(rows);
      simd::ref::pair_row_l1(v.data(), rows, cols, stride, want.data());
      for (int row = 0; row < rows; ++row) {
        int64_t largest = 0;
        for (int l = 0; l < 16; ++l) {
          int64_t sum = 0;
          for (int c = 0; c < cols; ++c)
            for (int i = 0; i < 2; ++i) sum += std::abs(int64_t{v[size_t(row * stride + c * 32 + 2 * l + i)]});
          largest = std::max(largest, sum);
        }
        ASSERT_EQ(want[size_t(row)], largest) << "ref, cols " << cols << " row " << row;
      }
      for (Isa isa : kIsaLevels) {
        if (isa == Isa::ref || !cpu.supports(isa)) continue;
        const simd::KernelTable t = simd::make_kernel_table(isa, cpu);
        t.pair_row_l1.fn(v.data(), rows, cols, stride, got.data());
        ASSERT_EQ(want, got) << t.pair_row_l1.name << ", cols " << cols << " extreme " << extreme;
      }
    }
  }
}

// The weight packing kernel at every level this CPU runs, against the reference, which the test
// checks against the layouts' definitions: 1 to 25 taps, row strides past the block or none, one layout
// or both, random words and the extremes (-32768 counts 32768), and pair maxima raised from what
// the caller had.
TEST(ConvInt16, PackWeightsAtEveryLevelMatchesTheReference) {
  const CpuFeatures cpu = detect_cpu_features();
  uint32_t seed = 400;
  for (int taps : {1, 2, 9, 17, 25}) {
    for (int layouts = 1; layouts <= 3; ++layouts) {
      for (int extreme = 0; extreme < 3; ++extreme) {
        // Without padding (layouts 2) the unit's last row ends the buffer: a kernel that reads
        // past it fails under the sanitizers.
        const int64_t row_stride = int64_t(16) * taps + (layouts == 2 ? 0 : 24);
        const int64_t l1_f_stride = taps + 3, l1_b_stride = taps + 5;
        std::vector<int16_t> src(size_t(16 * row_stride));
        const auto r = random_ints(src.size(), seed++, -32768, 32767);
        for (size_t i = 0; i < src.size(); ++i)
          src[i] = static_cast<int16_t>(extreme == 0 ? r[i] / (1 + int(i % 7) * 300)
                                        : extreme == 1 ? -32768 : (int(r[i]) % 2 ? 32767 : -32768));
        struct Out {
          std::vector<int16_t> f, b;
          std::vector<int32_t> l1_f, l1_b;
          int32_t pair_max[2] = {5, 70000};  // raised, never lowered
        };
        auto run = [&](simd::PackWeightsFn fn, Out& o) {
          o.f.assign(size_t(taps) * 256, 7);
          o.b.assign(size_t(taps) * 256, 7);
          o.l1_f.assign(size_t(16 * l1_f_stride), -1);
          o.l1_b.assign(size_t(16 * l1_b_stride), -1);
          simd::PackWeightsArgs a{src.data(), row_stride, taps, (layouts & 1) ? o.f.data() : nullptr,
                                  (layouts & 2) ? o.b.data() : nullptr, o.l1_f.data(), l1_f_stride,
                                  o.l1_b.data(), l1_b_stride, o.pair_max};
          fn(a);
        };
        Out want;
        run(&simd::ref::pack_weights, want);
        auto v = [&](int k, int c, int t) { return src[size_t(k * row_stride + c * taps + t)]; };
        int64_t f_pair = 5, b_pair = 70000;
        for (int t = 0; t < taps; ++t)
          for (int l = 0; l < 16; ++l) {
            int64_t f_sum = 0, b_sum = 0;
            for (int c = 0; c < 16; ++c) {
              const size_t at = size_t(t * 256 + (c / 2) * 32 + 2 * l + c % 2);
              if (layouts & 1) {
                ASSERT_EQ(want.f[at], v(l, c, t)) << "forward, tap " << t << " k " << l << " c " << c;
              }
              if (layouts & 2) {
                ASSERT_EQ(want.b[at], v(c, l, t)) << "backward, tap " << t << " c " << l << " k " << c;
              }
              f_sum += std::abs(int64_t{v(l, c, t)});
              b_sum += std::abs(int64_t{v(c, l, t)});
            }
            for (int j = 0; j < 8; ++j) {
              f_pair = std::max(f_pair, std::abs(int64_t{v(l, 2 * j, t)}) + std::abs(int64_t{v(l, 2 * j + 1, t)}));
              b_pair = std::max(b_pair, std::abs(int64_t{v(2 * j, l, t)}) + std::abs(int64_t{v(2 * j + 1, l, t)}));
            }
            if (layouts & 1) {
              ASSERT_EQ(want.l1_f[size_t(l * l1_f_stride + t)], f_sum);
            }
            if (layouts & 2) {
              ASSERT_EQ(want.l1_b[size_t(l * l1_b_stride + t)], b_sum);
            }
          }
        ASSERT_EQ(want.pair_max[0], (layouts & 1) ? f_pair : 5);
        ASSERT_EQ(want.pair_max[1], (layouts & 2) ? b_pair : 70000);
        if (!(layouts & 1)) {
          ASSERT_EQ(want.f, std::vector<int16_t>(size_t(taps) * 256, 7)) << "f written";
        }
        if (!(layouts & 2)) {
          ASSERT_EQ(want.b, std::vector<int16_t>(size_t(taps) * 256, 7)) << "b written";
        }
        for (Isa isa : kIsaLevels) {
          if (isa == Isa::ref || !cpu.supports(isa)) continue;
          const simd::KernelTable t = simd::make_kernel_table(isa, cpu);
          Out got;
          run(t.pack_weights.fn, got);
          const std::string what = std::string(t.pack_weights.name) + ", taps " + std::to_string(taps) +
                                   " layouts " + std::to_string(layouts) + " extreme " + std::to_string(extreme);
          ASSERT_EQ(want.f, got.f) << what;
          ASSERT_EQ(want.b, got.b) << what;
          ASSERT_EQ(want.l1_f, got.l1_f) << what;
          ASSERT_EQ(want.l1_b, got.l1_b) << what;
          ASSERT_EQ(want.pair_max[0], got.pair_max[0]) << what;
          ASSERT_EQ(want.pair_max[1], got.pair_max[1]) << what;
        }
      }
    }
  }
}
