// DFP16 exponents below the tensor level (Granularity::slice): the pixel kernel's per-lane and
// per-pixel scales bit for bit against the scalar model at every level; all three passes exact
// under power-of-two scaling of whole images, channels, channel blocks and image pairs (what one
// exponent per tensor cannot be); every level against the scalar model; the overflow guarantee
// with every slice at full range; and the policy's text forms.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "dfp/precision.hpp"
#include "simd/kernel_table.hpp"
#include "tests/common/conv_int16_cases.hpp"
#include "tests/common/expect_error.hpp"
#include "tests/common/isa_levels.hpp"
#include "tests/common/reference.hpp"

using namespace dfp;
using test::random_ints;
using test::random_vec;
using namespace test::conv_int16_cases;

namespace {

DfpConvOptions slices(bool weights = true, bool activations = true) {
  DfpConvOptions o;
  if (weights) o.weights.granularity = Granularity::slice;
  if (activations) o.activations.granularity = Granularity::slice;
  o.gradients.granularity = Granularity::slice;
  return o;
}

// The power of two image n, output channel k and input channel c are scaled by.
int image_shift(size_t n) { return int(3 * n % 40); }
int out_shift(size_t k) { return int(k % 7); }
int in_shift(size_t c) { return int(2 * c % 9); }

// Image n of x (NCHW) or dy (NKHW) times 2^-image_shift(n).
std::vector<float> scale_images(std::vector<float> x, const ConvShape& s) {
  const size_t img = x.size() / s.N;
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(x[i], -image_shift(i / img));
  return x;
}
// Image pair q (images 2q, 2q + 1) of x or dy times 2^(sign * pair_shift(q)).
int pair_shift(size_t q) { return int(7 * q % 12) + 1; }
std::vector<float> scale_pairs(std::vector<float> x, const ConvShape& s, int sign) {
  const size_t img = x.size() / s.N;
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(x[i], sign * pair_shift(i / img / 2));
  return x;
}
// Channel block b (16 channels) of x (NCHW, C channels) or dy (NKHW, K) times 2^-block_shift(b).
int block_shift(size_t b) { return int(5 * b % 11); }
std::vector<float> scale_blocks(std::vector<float> x, const ConvShape& s, int channels) {
  const size_t plane = x.size() / s.N / channels;
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(x[i], -block_shift(i / plane % channels / 16));
  return x;
}
// Output channel k of w (KCRS) times 2^-out_shift(k), or input channel c times 2^-in_shift(c).
std::vector<float> scale_channels(std::vector<float> w, const ConvShape& s, bool input) {
  const size_t taps = size_t(s.R) * s.S;
  for (size_t i = 0; i < w.size(); ++i)
    w[i] = std::ldexp(w[i], input ? -in_shift(i / taps % s.C) : -out_shift(i / (taps * s.C)));
  return w;
}

// The pixel kernels each CPU level has, by name.
std::vector<std::pair<const char*, simd::PixelKernelFn>> pixel_kernels() {
  const CpuFeatures cpu = detect_cpu_features();
  std::vector<std::pair<const char*, simd::PixelKernelFn>> k;
  if (cpu.supports(Isa::avx2)) k.emplace_back("avx2", &simd::avx2::conv_s16_pixel);
  if (cpu.supports(Isa::avx2) && cpu.avx_vnni) k.emplace_back("avxvnni", &simd::avxvnni::conv_s16_pixel);
  if (cpu.supports(Isa::avx512bw)) k.emplace_back("avx512bw", &simd::avx512::conv_s16_pixel_bw);
  if (cpu.supports(Isa::avx512vnni)) k.emplace_back("avx512vnni", &simd::avx512vnni::conv_s16_pixel);
  return k;
}

}  // namespace

// Per-lane and per-pixel scales in every flush form (overwriting: sums scaled at the end;
// accumulating: an FMA per flush), with unit and per-step chains, at every tile size.
TEST(Granularity, PixelKernelScalesMatchTheScalarModel) {
  const auto kernels = pixel_kernels();
  if (kernels.empty()) GTEST_SKIP() << "no vector level on this CPU";
  uint32_t seed = 500;
  auto operands = [&](size_t n) { return test::random_int16(n, seed++); };
  auto powers = [&](size_t n, int lo, int hi) {
    std::vector<float> v(n);
    const auto r = random_ints(n, seed++, lo, hi);
    for (size_t i = 0; i < n; ++i) v[i] = std::ldexp(1.f, int(r[i]));
    return v;
  };
  const int nib = 2, ntaps = 3;
  const int64_t src_pix = 16, src_ib = src_pix * simd::max_pixels(1) + 64, tap_span = 40;
  const std::vector<int16_t> src = operands(size_t(nib * src_ib + 2 * tap_span + 64));
  const int64_t wei_ib = 3 * 256, wei_ob = nib * wei_ib;
  const std::vector<int16_t> wei = operands(size_t(2 * wei_ob));
  const int64_t tap_src[3] = {0, tap_span, 2 * tap_span - 16};
  const int32_t tap_wei[3] = {2, 0, 1};
  const std::vector<float> lanes = powers(32, -30, 10), pixels = powers(28, -20, 20);
  for (int nob : {1, 2})
    for (int npix = 1; npix <= simd::max_pixels(nob); ++npix)
      for (int which = 1; which <= 3; ++which)  // lane scales, pixel scales, both
        for (int chain : {3, 8, 48})
          for (bool accumulate : {false, true}) {
            const int64_t dst_pix = 16, dst_ob = 16 * 40;
            const std::vector<float> start = random_vec(size_t(2 * dst_ob), seed++, -1e6f, 1e6f);
            simd::PixelKernelArgs a{};
            a.src = src.data(); a.wei = wei.data(); a.tap_src = tap_src; a.tap_wei = tap_wei;
            a.ntaps = ntaps; a.nib = nib; a.pairs = 8; a.src_ib = src_ib; a.src_pix = src_pix;
            a.wei_ob = wei_ob; a.wei_ib = wei_ib; a.dst_ob = dst_ob; a.dst_pix = dst_pix;
            a.npix = npix; a.nob = nob; a.chain = chain; a.scale = 0x1p-20f; a.accumulate = accumulate;
            a.lane_scale = which & 1 ? lanes.data() : nullptr;
            a.pixel_scale = which & 2 ? pixels.data() : nullptr;
            std::vector<float> want = start;
            a.dst = want.data();
            simd::ref::conv_s16_pixel(a);
            for (auto [name, fn] : kernels) {
              std::vector<float> got = start;
              a.dst = got.data();
              fn(a);
              ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4))
                  << name << " nob " << nob << " npix " << npix << " scales " << which << " chain " << chain
                  << " accumulate " << accumulate;
            }
          }
}

// Scaling an image of x, or an output channel of w, by a power of two scales its forward outputs
// by exactly that power with exponents per image and per output channel: the integers, chains and
// unscaled sums are the same. Likewise backward-data's dx under scaling of dy's images and w's
// input channels, and the weight gradient's dW under scaling of x's and dy's channel blocks. With
// one exponent per tensor the scaled slices lose bits.
TEST(Granularity, PassesAreExactUnderPowerOfTwoScalingOfSlices) {
  for (Isa isa : test::isa_levels()) {
    Context ctx(ContextOptions{.threads = 2, .isa = isa_name(isa)});
    for (const ConvShape& s : edge_shapes()) {
      SCOPED_TRACE(describe(s) + " " + isa_name(isa));
      const auto x = random_vec(size_t(s.N) * s.C * s.H * s.W, 41);
      const auto w = random_vec(size_t(s.K) * s.C * s.R * s.S, 42, -0.3f, 0.3f);
      const auto dy = random_vec(size_t(s.N) * s.K * s.OH() * s.OW(), 43, -1e-3f, 1e-3f);
      const Outputs plain = run_int16(ctx, s, x, w, dy, slices());
      const auto xs = scale_images(x, s), dys = scale_images(dy, s);
      const auto w_out = scale_channels(w, s, false), w_in = scale_channels(w, s, true);
      const Outputs fwd = run_int16(ctx, s, xs, w_out, dy, slices());
      const Outputs bwd = run_int16(ctx, s, x, w_in, dys, slices());
      const Outputs wgrad = run_int16(ctx, s, scale_blocks(x, s, s.C), w, scale_blocks(dy, s, s.K), slices());
      // Image pair q of x times 2^-pair_shift(q), of dy times 2^pair_shift(q): each pair's products
      // are the same, so a weight gradient with exponents per image pair keeps every bit. A fully
      // connected layer reduces over all pairs in one call: one exponent over the batch, not this.
      const bool pairs = !(s.H == 1 && s.W == 1 && s.R == 1 && s.S == 1);
      const Outputs paired = run_int16(ctx, s, scale_pairs(x, s, -1), w, scale_pairs(dy, s, 1), slices());
      const size_t plane = size_t(s.OH()) * s.OW(), in_plane = size_t(s.H) * s.W;
      for (size_t i = 0; i < plain.y.size(); ++i) {
        const size_t n = i / (plane * s.K), k = i / plane % s.K;
        const float want = std::ldexp(plain.y[i], -image_shift(n) - out_shift(k));
        ASSERT_EQ(0, std::memcmp(&want, &fwd.y[i], 4)) << "y " << i << ": " << fwd.y[i] << " vs " << want;
      }
      for (size_t i = 0; i < plain.dx.size(); ++i) {
        const size_t n = i / (in_plane * s.C), c = i / in_plane % s.C;
        const float want = std::ldexp(plain.dx[i], -image_shift(n) - in_shift(c));
        ASSERT_EQ(0, std::memcmp(&want, &bwd.dx[i], 4)) << "dx " << i << ": " << bwd.dx[i] << " vs " << want;
      }
      const size_t taps = size_t(s.R) * s.S;
      for (size_t i = 0; i < plain.dw.size(); ++i) {
        const size_t k = i / (taps * s.C), c = i / taps % s.C;
        const float want = std::ldexp(plain.dw[i], -block_shift(c / 16) - block_shift(k / 16));
        ASSERT_EQ(0, std::memcmp(&want, &wgrad.dw[i], 4)) << "dw " << i << ": " << wgrad.dw[i] << " vs " << want;
        if (pairs) {
          ASSERT_EQ(0, std::memcmp(&plain.dw[i], &paired.dw[i], 4)) << "dw " << i << " with pairs scaled";
        }
      }
      EXPECT_EQ(fwd.stats.x.exponent, plain.stats.x.exponent);
      if (s.N > 1) {
        EXPECT_LT(fwd.stats.x.exponent_min, plain.stats.x.exponent_min);
        EXPECT_LT(bwd.stats.dy.exponent_min, plain.stats.dy.exponent_min);
      }
      if (s.N > 2 && s.K > 2) {
        const Outputs tensor = run_int16(ctx, s, xs, w_out, dy);
        bool differs = false;
        for (size_t i = 0; i < tensor.y.size() && !differs; ++i) differs = tensor.y[i] != fwd.y[i];
        EXPECT_TRUE(differs) << "one exponent per tensor kept every bit of the scaled slices";
      }
    }
  }
}

// Every level against the scalar model with exponents per slice, on images and channels of
// different magnitudes, derived and forced chains.
TEST(Granularity, BitExactAgainstScalarModel) {
  for (Isa isa : test::isa_levels()) {
    if (isa == Isa::ref) continue;
    Context ctx(ContextOptions{.threads = 2, .isa = isa_name(isa)});
    for (const ConvShape& s : edge_shapes()) {
      SCOPED_TRACE(describe(s) + " " + isa_name(isa));
      const auto x = scale_blocks(scale_images(random_vec(size_t(s.N) * s.C * s.H * s.W, 51), s), s, s.C);
      const auto w = scale_channels(scale_channels(random_vec(size_t(s.K) * s.C * s.R * s.S, 52, -0.3f, 0.3f), s,
                                                   false), s, true);
      const auto dy = scale_blocks(scale_images(random_vec(size_t(s.N) * s.K * s.OH() * s.OW(), 53, -1e-3f, 1e-3f), s),
                                   s, s.K);
      for (int chain : {0, 3, 8}) {
        for (int form = 0; form < 3; ++form) {  // all classes, weights only, activations and gradients only
          DfpConvOptions o = slices(form != 2, form != 1);
          o.chain_override = chain;
          o.activations.rounding = Rounding::stochastic;
          expect_outputs_bits_equal(run_int16(ref_ctx(), s, x, w, dy, o), run_int16(ctx, s, x, w, dy, o),
                                    "chain " + std::to_string(chain) + " form " + std::to_string(form) + ": ");
        }
      }
    }
  }
}

// Every image, channel and channel block at the full 13-bit range of its own exponent (constant
// magnitudes: x 2^-(n mod 9) per image and 2^-(b mod 2) per channel block, dy 2^-(n mod 5) and
// 2^-(b mod 2), w 2^-(k mod 3) per output channel and 2^-(c mod 2) per input channel): each call's
// chain comes from the rows it reads at their own exponent, so verification counts no overflow
// and the answers are exact; a chain forced past the bound does overflow. Row calls, image tiles
// (2x2 rows) and GEMM tiles.
TEST(Granularity, ChainsHoldWithEverySliceAtFullRange) {
  const ConvShape shapes[] = {make(4, 64, 6, 6, 32, 3, 3, 1, 0), make(20, 64, 2, 2, 64, 3, 3, 1, 1),
                              make(30, 512, 1, 1, 64, 1, 1, 1, 0)};
  for (const ConvShape& s : shapes)
    for (bool mixed_signs : {false, true}) {
      SCOPED_TRACE(describe(s) + (mixed_signs ? ", random signs" : ", all positive"));
      auto x = constant_magnitude(size_t(s.N) * s.C * s.H * s.W, 1.f, 61, mixed_signs);
      auto w = constant_magnitude(size_t(s.K) * s.C * s.R * s.S, 1.f, 62, mixed_signs);
      auto dy = constant_magnitude(size_t(s.N) * s.K * s.OH() * s.OW(), 1.f, 63, mixed_signs);
      const size_t img = size_t(s.C) * s.H * s.W, dy_img = size_t(s.K) * s.OH() * s.OW(), taps = size_t(s.R) * s.S;
      const size_t plane = size_t(s.H) * s.W, dy_plane = size_t(s.OH()) * s.OW();
      for (size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(x[i], -int(i / img % 9) - int(i / plane / 16 % 2));
      for (size_t i = 0; i < dy.size(); ++i) dy[i] = std::ldexp(dy[i], -int(i / dy_img % 5) - int(i / dy_plane / 16 % 2));
      for (size_t i = 0; i < w.size(); ++i) w[i] = std::ldexp(w[i], -int(i / (taps * s.C) % 3) - int(i / taps % s.C % 2));
      Context ctx(ContextOptions{.threads = 2});
      const Outputs r = run_verified_exact(ctx, s, x, w, dy, slices());
      EXPECT_EQ(r.stats.x.max_abs_int, 4096);
      EXPECT_EQ(r.stats.x.exponent - r.stats.x.exponent_min, std::min(s.N, 9) - 1);
      EXPECT_EQ(r.stats.w.exponent - r.stats.w.exponent_min, 2);
      EXPECT_EQ(r.stats.dy.max_abs_int, 4096);
      EXPECT_EQ(r.stats.dy.exponent - r.stats.dy.exponent_min, std::min(s.N, 5) - 1);
      if (mixed_signs) continue;
      DfpConvOptions o = slices();
      o.verify = true;
      o.chain_override = 1 << 20;
      EXPECT_GT(run_int16(ctx, s, x, w, dy, o).stats.overflow_events, 0);
    }
}

TEST(Granularity, PolicyTextForms) {
  PrecisionPolicy p;
  p.precision = Precision::int16;
  p.dfp.weights.granularity = Granularity::slice;
  p.dfp.gradients.granularity = Granularity::slice;
  const auto f = p.fields();
  EXPECT_EQ(f.at("granularity"), "slice,tensor,slice");
  const PrecisionPolicy q = PrecisionPolicy::from_fields(f, "checkpoint");
  EXPECT_EQ(q.dfp.weights.granularity, Granularity::slice);
  EXPECT_EQ(q.dfp.activations.granularity, Granularity::tensor);
  EXPECT_EQ(q.dfp.gradients.granularity, Granularity::slice);
  EXPECT_NE(p.describe().find("weights{headroom=2,rounding=nearest,granularity=slice}"), std::string::npos)
      << p.describe();
  // A checkpoint from before the setting: one exponent per tensor.
  auto old = f;
  old.erase("granularity");
  EXPECT_EQ(PrecisionPolicy::from_fields(old, "checkpoint").dfp.weights.granularity, Granularity::tensor);
  auto bad = f;
  bad["granularity"] = "slice,row,tensor";
  test::expect_error([&] { PrecisionPolicy::from_fields(bad, "ck.dfp"); }, Status::invalid_argument,
                     {"ck.dfp field granularity", "row"});
}

// The exponents a layer reports for dy are those of the copy its passes read: per image with a
// backward-data pass, and without one (a first layer) the weight gradient's, per image pair and
// 16-channel block (repeated for each plane of the blocked dy), which are what stats().dy then
// describes.
TEST(Granularity, GradientExponentsAreThoseOfTheCopyRead) {
  const ConvShape s{.N = 3, .C = 16, .H = 5, .W = 5, .K = 32, .R = 3, .S = 3, .pad_h = 1, .pad_w = 1};
  const auto w = random_vec(size_t(s.K) * s.C * s.R * s.S, 52, -0.3f, 0.3f);
  // |dy| = 2^-10 * 2^-image_shift(n) * 2^-block_shift(b): a pair's largest is its first image's.
  const auto dy = scale_blocks(
      scale_images(constant_magnitude(size_t(s.N) * s.K * s.OH() * s.OW(), std::ldexp(1.f, -10), 53, true), s), s,
      s.K);
  std::vector<float> dyb(blocked_size(s.N, s.K, s.OH(), s.OW()));
  to_blocked(dy.data(), dyb.data(), s.N, s.K, s.OH(), s.OW());
  for (bool input_gradient : {true, false}) {
    DfpConvOptions o = slices();
    o.input_gradient = input_gradient;
    ConvInt16 conv(ref_ctx(), s, o, "first");
    conv.set_weights(w.data());
    conv.quantize_grad_output(dyb.data());
    const std::vector<int>& e = conv.grad_output_exponents();
    if (input_gradient) {
      ASSERT_EQ(e.size(), size_t(s.N));
      continue;
    }
    ASSERT_EQ(e.size(), size_t(s.N) * 2);  // [n][block]
    for (int n = 0; n < s.N; ++n)
      for (int b = 0; b < 2; ++b)
        EXPECT_EQ(e[size_t(n) * 2 + b] - e[0], -image_shift(size_t(n / 2 * 2)) - block_shift(size_t(b)))
            << "image " << n << ", block " << b;
    EXPECT_EQ(e[0], conv.stats().dy.exponent);
    EXPECT_EQ(e[size_t(s.N - 1) * 2 + 1], conv.stats().dy.exponent_min);
  }
}
