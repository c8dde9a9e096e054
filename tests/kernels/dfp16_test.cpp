// DFP16 format: exponent choice, rounding modes, saturation, edge cases, and bit-identity of the
// AVX-512 kernels with the scalar reference (the BatchNorm kernels': bn_kernels_test.cpp).
#include <gtest/gtest.h>

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "dfp/dfp16.hpp"
#include "dfp/model.hpp"
#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"
#include "tests/common/isa_levels.hpp"
#include "tests/common/reference.hpp"
#include "tests/common/scoped_env.hpp"
#include "tests/common/tolerance.hpp"
#include "tests/common/expect_error.hpp"

using namespace dfp;

namespace {

Context& ref_ctx() {
  static Context c(ContextOptions{.threads = 1, .isa = "ref"});
  return c;
}
Context& best_ctx() {
  static Context c(ContextOptions{.threads = 2});
  return c;
}

QuantOptions opts(int headroom, Rounding r, uint64_t seed = 7) {
  QuantOptions o;
  o.headroom = headroom;
  o.rounding = r;
  o.seed = seed;
  o.name = "t";
  return o;
}

}  // namespace

TEST(Dfp16Exponent, LargestElementLandsInTopBinade) {
  for (int h = 0; h <= 4; ++h) {
    for (float m : {1.f, 1.5f, 3.99f, 1e-3f, 7e5f}) {
      const int e = dfp16_exponent(m, h);
      const double scaled = std::ldexp(double(m), -e);
      EXPECT_GE(scaled, std::ldexp(1.0, 14 - h)) << m << " h=" << h;
      EXPECT_LT(scaled, std::ldexp(1.0, 15 - h)) << m << " h=" << h;
    }
  }
  EXPECT_EQ(dfp16_exponent(0.f, 2), 0);
  // Denormal maximum: ilogb is exact there.
  EXPECT_EQ(dfp16_exponent(std::ldexp(1.f, -140), 0), -154);
}

TEST(Dfp16Quantize, AllZeroTensor) {
  std::vector<float> x(1000, 0.f);
  std::vector<int16_t> q(x.size(), 5);
  const QuantStats st = quantize_dfp16(best_ctx(), x.data(), q.data(), x.size(), opts(2, Rounding::nearest_even));
  EXPECT_EQ(st.exponent, 0);
  EXPECT_EQ(st.max_abs_int, 0);
  for (int16_t v : q) EXPECT_EQ(v, 0);
}

TEST(Dfp16Quantize, SingleHugeOutlierFlushesSmallValues) {
  std::vector<float> x(100, 1.f);
  x[37] = 1e30f;
  std::vector<int16_t> q(x.size());
  const QuantStats st = quantize_dfp16(best_ctx(), x.data(), q.data(), x.size(), opts(2, Rounding::nearest_even));
  EXPECT_EQ(st.saturated, 0u);
  EXPECT_GE(q[37], 4096);
  EXPECT_LT(q[37], 8192);
  EXPECT_EQ(st.max_abs_int, q[37]);
  // 1.0 is ~2^-100 of the outlier: below one step.
  for (size_t i = 0; i < x.size(); ++i) {
    if (i != 37) {
      EXPECT_EQ(q[i], 0) << i;
    }
  }
}

TEST(Dfp16Quantize, DenormalsRoundTrip) {
  std::vector<float> x = test::random_vec(333, 3);
  for (auto& v : x) v = std::ldexp(v, -135);  // all subnormal
  std::vector<int16_t> q(x.size());
  std::vector<float> back(x.size());
  const QuantStats st = quantize_dfp16(best_ctx(), x.data(), q.data(), x.size(), opts(1, Rounding::nearest_even));
  dequantize_dfp16(best_ctx(), q.data(), st.exponent, back.data(), x.size());
  float m = 0;
  for (float v : x) m = std::max(m, std::fabs(v));
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_LE(std::fabs(back[i] - x[i]), m * test::dfp16_roundtrip_rel(1)) << i;
}

TEST(Dfp16Quantize, NonFiniteIsAnErrorNamingTheTensor) {
  std::vector<float> x(50, 0.5f);
  x[17] = std::numeric_limits<float>::quiet_NaN();
  std::vector<int16_t> q(x.size());
  QuantOptions o = opts(2, Rounding::nearest_even);
  o.name = "conv3.activations";
  test::expect_error([&] { quantize_dfp16(best_ctx(), x.data(), q.data(), x.size(), o); }, Status::numerical_error, {"conv3.activations", "element 17"});
}

// A headroom out of [0, kDfpMaxHeadroom] is refused by one rule (QuantOptions::validate) wherever
// options arrive: the quantizers, the INT16 convolution, the precision policy.
TEST(Dfp16Quantize, HeadroomOutOfRangeIsRefusedEverywhere) {
  std::vector<float> x(8, 0.5f);
  std::vector<int16_t> q(x.size());
  for (int bad : {-1, kDfpMaxHeadroom + 1}) {
    const std::string got = "got " + std::to_string(bad);
    QuantOptions o = opts(bad, Rounding::nearest_even);
    o.name = "fc.weights";
    test::expect_error([&] { quantize_dfp16(best_ctx(), x.data(), q.data(), x.size(), o); }, Status::invalid_argument,
                       {"quantization", "headroom", got, "fc.weights"});
    test::expect_error([&] { quantize_dfp16_with_max_abs(best_ctx(), x.data(), q.data(), x.size(), 0.5f, o); },
                       Status::invalid_argument, {"headroom", got});
    DfpConvOptions co;
    co.gradients.headroom = bad;
    ConvShape s;
    s.N = 1; s.C = 16; s.H = 4; s.W = 4; s.K = 16; s.R = 3; s.S = 3; s.pad_h = 1; s.pad_w = 1;
    test::expect_error([&] { ConvInt16 c(best_ctx(), s, co, "layer3.conv2"); }, Status::invalid_argument,
                       {"convolution 'layer3.conv2'", "headroom", got, co.gradients.name});
    PrecisionPolicy p;
    p.precision = Precision::int16;
    p.dfp.activations.headroom = bad;
    test::expect_error([&] { p.validate("flags"); }, Status::invalid_argument,
                       {"flags", "headroom", got, p.dfp.activations.name});
  }
}

// A maximum measured by the tensor's producer (the optimizer's update, a ReLU) gives the bits and
// statistics of measuring it here; a negative or non-finite one is measured here; and non-finite
// elements are still refused, with their position, when the producer's maximum is finite.
TEST(Dfp16Quantize, ProducersMaximumGivesTheMeasuredBits) {
  std::vector<float> x = test::random_vec(1000, 4);
  float m = 0;
  for (float v : x) m = std::max(m, std::fabs(v));
  const QuantOptions o = opts(2, Rounding::stochastic);
  std::vector<int16_t> want(x.size()), got(x.size());
  const QuantStats a = quantize_dfp16(best_ctx(), x.data(), want.data(), x.size(), o);
  for (float known : {m, -1.f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    const QuantStats b = quantize_dfp16_with_max_abs(best_ctx(), x.data(), got.data(), x.size(), known, o);
    EXPECT_EQ(want, got) << known;
    EXPECT_EQ(a.exponent, b.exponent) << known;
    EXPECT_EQ(a.max_abs, b.max_abs) << known;
    EXPECT_EQ(a.max_abs_int, b.max_abs_int) << known;
  }
  const QuantStats twice = quantize_dfp16_with_max_abs(best_ctx(), x.data(), got.data(), x.size(), 2 * m, o);
  EXPECT_EQ(twice.exponent, a.exponent + 1) << "the producer's maximum is trusted";
  x[613] = std::numeric_limits<float>::quiet_NaN();
  QuantOptions named = o;
  named.name = "fc.weights";
  test::expect_error([&] { quantize_dfp16_with_max_abs(best_ctx(), x.data(), got.data(), x.size(), m, named); },
                     Status::numerical_error, {"fc.weights", "element 613"});
}

TEST(Dfp16Quantize, NonFiniteCountPolicyStoresZero) {
  std::vector<float> x(50, 0.5f);
  x[3] = std::numeric_limits<float>::infinity();
  x[9] = -std::numeric_limits<float>::infinity();
  x[11] = std::numeric_limits<float>::quiet_NaN();
  std::vector<int16_t> q(x.size());
  QuantOptions o = opts(2, Rounding::nearest_even);
  o.nonfinite = NonFinitePolicy::count;
  const QuantStats st = quantize_dfp16(best_ctx(), x.data(), q.data(), x.size(), o);
  EXPECT_EQ(st.nonfinite, 3u);
  EXPECT_EQ(st.max_abs, 0.5f);  // the exponent ignores them
  EXPECT_EQ(q[3], 0);
  EXPECT_EQ(q[9], 0);
  EXPECT_EQ(q[11], 0);
  EXPECT_EQ(q[0], 4096);  // 0.5 = 2^-1 with headroom 2 maps to 2^12
}

TEST(Dfp16Quantize, NearestTiesGoToEven) {
  const std::vector<float> x = {0.5f, 1.5f, 2.5f, 3.5f, -0.5f, -1.5f, -2.5f, -3.5f, 2.4f, 2.6f};
  const std::vector<int16_t> want = {0, 2, 2, 4, 0, -2, -2, -4, 2, 3};
  for (Context* c : {&ref_ctx(), &best_ctx()}) {
    std::vector<int16_t> q(x.size());
    quantize_dfp16_with_exponent(*c, x.data(), q.data(), x.size(), 0, opts(0, Rounding::nearest_even));
    EXPECT_EQ(q, want);
  }
}

TEST(Dfp16Quantize, BiasedRoundsMagnitudeUpFromOneQuarter) {
  const std::vector<float> x = {2.25f, 2.2f, -2.25f, -2.2f, 0.25f, -0.24f, 7.75f};
  const std::vector<int16_t> want = {3, 2, -3, -2, 1, 0, 8};
  for (Context* c : {&ref_ctx(), &best_ctx()}) {
    std::vector<int16_t> q(x.size());
    quantize_dfp16_with_exponent(*c, x.data(), q.data(), x.size(), 0, opts(0, Rounding::biased));
    EXPECT_EQ(q, want);
  }
}

TEST(Dfp16Quantize, SaturatesSymmetricallyNeverMinus32768) {
  // Headroom 0: the maximum can round up to 2^15, which must clamp to 32767 (not wrap to -32768).
  const std::vector<float> x = {32767.75f, -32767.75f, 100.f};
  // With a given exponent, an out-of-range value (an exponent predicted from history) clamps too.
  const std::vector<float> y = {-32768.f, 40000.f, -5.f};
  for (Context* c : {&ref_ctx(), &best_ctx()}) {
    std::vector<int16_t> q(x.size());
    const QuantStats st = quantize_dfp16(*c, x.data(), q.data(), x.size(), opts(0, Rounding::nearest_even));
    EXPECT_EQ(st.exponent, 0);
    EXPECT_EQ(q, (std::vector<int16_t>{32767, -32767, 100}));
    EXPECT_EQ(st.saturated, 2u);
    EXPECT_EQ(st.max_abs_int, 32767);
    const QuantStats s2 = quantize_dfp16_with_exponent(*c, y.data(), q.data(), y.size(), 0, opts(0, Rounding::stochastic));
    EXPECT_EQ(q, (std::vector<int16_t>{-32767, 32767, -5}));
    EXPECT_EQ(s2.saturated, 2u);
  }
}

TEST(Dfp16Quantize, StochasticIsUnbiased) {
  const size_t n = 1 << 20;
  for (float v : {0.3f, -0.3f, 0.75f, 5.125f}) {
    std::vector<float> x(n, v);
    std::vector<int16_t> q(n);
    quantize_dfp16_with_exponent(best_ctx(), x.data(), q.data(), n, 0, opts(0, Rounding::stochastic, 1234));
    double sum = 0;
    for (int16_t i : q) sum += i;
    const double f = v - std::floor(v);
    const double sigma = std::sqrt(f * (1 - f) / n);
    EXPECT_NEAR(sum / n, v, test::kStochasticZ * sigma) << v;
    for (int16_t i : q) ASSERT_TRUE(i == std::floor(v) || i == std::floor(v) + 1);
  }
}

// The software AES round (the stochastic stream's specification) against FIPS-197 Appendix B:
// round 1 of the example cipher (state after the initial AddRoundKey -> start of round 2), and
// the whole AES-128 example, whose last round has no MixColumns (AESENCLAST).
TEST(Dfp16Quantize, SoftwareAesRoundMatchesFips197) {
  using simd::Block128;
  auto block = [](std::initializer_list<int> bytes) {
    Block128 b;
    int i = 0;
    for (int v : bytes) { (i < 8 ? b.lo : b.hi) |= uint64_t(v) << (8 * (i % 8)); ++i; }
    return b;
  };
  auto byte = [](const Block128& b, int i) { return uint8_t((i < 8 ? b.lo : b.hi) >> (8 * (i % 8))); };
  const Block128 in = block({0x19, 0x3d, 0xe3, 0xbe, 0xa0, 0xf4, 0xe2, 0x2b, 0x9a, 0xc6, 0x8d, 0x2a, 0xe9, 0xf8, 0x48, 0x08});
  const Block128 k1 = block({0xa0, 0xfa, 0xfe, 0x17, 0x88, 0x54, 0x2c, 0xb1, 0x23, 0xa3, 0x39, 0x39, 0x2a, 0x6c, 0x76, 0x05});
  const Block128 r2 = block({0xa4, 0x9c, 0x7f, 0xf2, 0x68, 0x9f, 0x35, 0x2b, 0x6b, 0x5b, 0xea, 0x43, 0x02, 0x6a, 0x50, 0x49});
  const Block128 got = simd::aes_detail::round(in, k1, false);
  EXPECT_EQ(got.lo, r2.lo);
  EXPECT_EQ(got.hi, r2.hi);
  // AES-128: key expansion (FIPS-197 section 5.2), then 9 full rounds and the last one.
  const Block128 key = block({0x2b, 0x7e, 0x15, 0x16, 0x28, 0xae, 0xd2, 0xa6, 0xab, 0xf7, 0x15, 0x88, 0x09, 0xcf, 0x4f, 0x3c});
  const Block128 plain = block({0x32, 0x43, 0xf6, 0xa8, 0x88, 0x5a, 0x30, 0x8d, 0x31, 0x31, 0x98, 0xa2, 0xe0, 0x37, 0x07, 0x34});
  const Block128 cipher = block({0x39, 0x25, 0x84, 0x1d, 0x02, 0xdc, 0x09, 0xfb, 0xdc, 0x11, 0x85, 0x97, 0x19, 0x6a, 0x0b, 0x32});
  uint8_t w[176];
  for (int i = 0; i < 16; ++i) w[i] = byte(key, i);
  uint8_t rcon = 1;
  for (int i = 16; i < 176; i += 4) {
    uint8_t t[4] = {w[i - 4], w[i - 3], w[i - 2], w[i - 1]};
    if (i % 16 == 0) {
      const uint8_t t0 = t[0];
      t[0] = uint8_t(simd::aes_detail::kSbox.v[t[1]] ^ rcon);
      t[1] = simd::aes_detail::kSbox.v[t[2]];
      t[2] = simd::aes_detail::kSbox.v[t[3]];
      t[3] = simd::aes_detail::kSbox.v[t0];
      rcon = simd::aes_detail::xtime(rcon);
    }
    for (int j = 0; j < 4; ++j) w[i + j] = uint8_t(w[i - 16 + j] ^ t[j]);
  }
  auto round_key = [&](int r) {
    Block128 k;
    for (int i = 0; i < 16; ++i) (i < 8 ? k.lo : k.hi) |= uint64_t(w[16 * r + i]) << (8 * (i % 8));
    return k;
  };
  Block128 state{plain.lo ^ round_key(0).lo, plain.hi ^ round_key(0).hi};
  for (int r = 1; r <= 10; ++r) state = simd::aes_detail::round(state, round_key(r), r == 10);
  EXPECT_EQ(state.lo, cipher.lo);
  EXPECT_EQ(state.hi, cipher.hi);
}

// Neighbouring draws are uncorrelated: within an ARS block (lags 1..3), across blocks (lag 4,
// 16) and between two seeds. Each element rounds 0.5 up or down; the sample correlation of the
// bits must stay within 5 standard errors of 0.
TEST(Dfp16Quantize, StochasticDrawsAreUncorrelated) {
  const size_t n = 1 << 20;
  std::vector<float> x(n, 0.5f);
  std::vector<int16_t> a(n), b(n);
  quantize_dfp16_with_exponent(best_ctx(), x.data(), a.data(), n, 0, opts(0, Rounding::stochastic, 1));
  quantize_dfp16_with_exponent(best_ctx(), x.data(), b.data(), n, 0, opts(0, Rounding::stochastic, 2));
  auto corr = [&](const std::vector<int16_t>& u, const std::vector<int16_t>& v, size_t lag) {
    double su = 0, sv = 0, suv = 0, suu = 0, svv = 0;
    const size_t m = n - lag;
    for (size_t i = 0; i < m; ++i) {
      const double p = u[i], q = v[i + lag];
      su += p; sv += q; suv += p * q; suu += p * p; svv += q * q;
    }
    const double cov = suv / m - (su / m) * (sv / m);
    return cov / std::sqrt((suu / m - (su / m) * (su / m)) * (svv / m - (sv / m) * (sv / m)));
  };
  const double bound = 5.0 / std::sqrt(double(n));
  for (size_t lag : {1, 2, 3, 4, 5, 16}) EXPECT_LT(std::fabs(corr(a, a, lag)), bound) << "lag " << lag;
  EXPECT_LT(std::fabs(corr(a, b, 0)), bound) << "seeds 1 and 2";
}

// Every rounding mode of the best kernels against the reference on the values where rounding,
// saturation and the max can go wrong: ties, the clamp boundary (+-32767.5 rounds to +-32768 and
// saturates; +-32767.49 does not), values that overflow to Inf when scaled, -0, and a masked tail.
TEST(Dfp16Quantize, EdgeValuesMatchReference) {
  const std::vector<float> edges = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, -0.f, 0.f, 32767.f, -32767.f,
                                    32767.49f, -32767.49f, 32767.5f, -32767.5f, 32768.f, -32768.f, 40000.5f,
                                    -1e30f, 3e38f, -3e38f, 1e-40f, -1e-40f, 16383.5f, 16384.5f, 0.49999997f};
  // -200, -127, 130: the stochastic FMA's 2^k is out of range and x is pre-scaled first.
  for (int exponent : {0, -1, -200, 3, -127, 130})
    for (Rounding r : {Rounding::nearest_even, Rounding::stochastic, Rounding::biased})
      for (size_t n = 1; n <= edges.size(); n += 6) {
        std::vector<int16_t> q0(n), q1(n);
        simd::QuantCounters c0, c1;
        simd::ref::quantize(edges.data(), q0.data(), n, exponent, r, 5, 0, &c0);
        best_ctx().kernels().quantize.fn(edges.data(), q1.data(), n, exponent, r, 5, 0, &c1);
        ASSERT_EQ(q0, q1) << "exponent " << exponent << " " << rounding_name(r) << " n=" << n;
        EXPECT_EQ(c0.saturated, c1.saturated) << "exponent " << exponent << " " << rounding_name(r);
        EXPECT_EQ(c0.max_abs_q, c1.max_abs_q) << "exponent " << exponent << " " << rounding_name(r);
        for (int16_t v : q1) ASSERT_NE(v, -32768);
      }
}

// The kernels quantize without per-element checks and redo the call on the checked path when an
// element could have saturated or was NaN/Inf. One such value anywhere -- in the first element,
// a middle 32-element step, the last full step or the masked tail -- must still give the
// reference's bits and counters; so must a value that rounds to exactly 32767 without saturating.
TEST(Dfp16Quantize, OneOutOfRangeElementAnywhereMatchesReference) {
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), 40000.f, -32767.5f, 32767.f, -32766.6f};
  const std::vector<float> base = test::random_vec(77, 3, -300.f, 300.f);
  for (float special : specials)
    for (size_t at : {size_t(0), size_t(33), size_t(63), size_t(64), size_t(76)})
      for (Rounding r : {Rounding::nearest_even, Rounding::stochastic, Rounding::biased}) {
        std::vector<float> x = base;
        x[at] = special;
        std::vector<int16_t> q0(x.size()), q1(x.size());
        simd::QuantCounters c0, c1;
        simd::ref::quantize(x.data(), q0.data(), x.size(), 0, r, 9, 16, &c0);
        best_ctx().kernels().quantize.fn(x.data(), q1.data(), x.size(), 0, r, 9, 16, &c1);
        ASSERT_EQ(q0, q1) << special << " at " << at << " " << rounding_name(r);
        EXPECT_EQ(c0.saturated, c1.saturated) << special << " at " << at << " " << rounding_name(r);
        EXPECT_EQ(c0.nonfinite, c1.nonfinite) << special << " at " << at << " " << rounding_name(r);
        EXPECT_EQ(c0.max_abs_q, c1.max_abs_q) << special << " at " << at << " " << rounding_name(r);
      }
}

// Stochastic rounding of values far below one step (|y| down to 2^-30) and just below an integer:
// floor(y + u) must come out of the kernels' rounded-down FMA exactly as the reference's exact
// arithmetic gives it, with the rounding-up probability floor(frac * 2^24) / 2^24.
TEST(Dfp16Quantize, StochasticTinyAndNearIntegerValuesMatchReference) {
  std::vector<float> x;
  for (int p = 1; p <= 30; ++p)
    for (float sign : {1.f, -1.f}) {
      x.push_back(sign * std::ldexp(1.f, -p));
      x.push_back(sign * (3.f - std::ldexp(1.f, -std::min(p, 22))));  // 3 - 2^-p: the ulp of 3 is 2^-22
      x.push_back(sign * std::nextafter(float(p), 0.f));
    }
  std::vector<int16_t> q0(x.size()), q1(x.size());
  simd::QuantCounters c0, c1;
  for (uint64_t seed : {1, 2, 3})
    for (int e : {0, -8, 8}) {
      simd::ref::quantize(x.data(), q0.data(), x.size(), e, Rounding::stochastic, seed, 0, &c0);
      best_ctx().kernels().quantize.fn(x.data(), q1.data(), x.size(), e, Rounding::stochastic, seed, 0, &c1);
      ASSERT_EQ(q0, q1) << "seed " << seed << " exponent " << e;
    }
  // 2^-14 above an integer rounds up with probability 2^-14; 2^-26, below the stream's 2^-24
  // resolution, never does (floor(2^-26 * 2^24) = 0).
  const size_t n = 1 << 22;
  for (auto [v, p] : {std::pair{5.f + 0x1p-14f, 0x1p-14}, std::pair{-7.f + 0x1p-14f, 0x1p-14}, std::pair{0x1p-26f, 0.0}}) {
    std::vector<float> xs(n, v);
    std::vector<int16_t> q(n);
    quantize_dfp16_with_exponent(best_ctx(), xs.data(), q.data(), n, 0, opts(0, Rounding::stochastic, 77));
    double ups = 0;
    for (int16_t i : q) ups += i - std::floor(v);
    if (p == 0) EXPECT_EQ(ups, 0) << v;
    else EXPECT_NEAR(ups, p * n, test::kStochasticZ * std::sqrt(p * n)) << v;
  }
}

// The stochastic kernels, AVX-512 with VAES or AES-NI and AVX2 with AES-NI, give the reference's
// bits from any starting index (the stream is read from the middle of an ARS block when
// index_base % 4 != 0).
TEST(Dfp16Quantize, StochasticKernelsMatchReferenceFromAnyIndex) {
  const CpuFeatures f = detect_cpu_features();
  std::vector<std::pair<const char*, simd::QuantizeFn>> kernels;
  if (f.supports(Isa::avx512bw) && f.vaes) kernels.emplace_back("avx512 vaes", &simd::avx512::quantize_vaes);
  if (f.supports(Isa::avx512bw) && f.aes) kernels.emplace_back("avx512 aesni", &simd::avx512::quantize_aesni);
  if (f.supports(Isa::avx2) && f.aes) kernels.emplace_back("avx2 aesni", &simd::avx2::quantize_aesni);
  if (kernels.empty()) GTEST_SKIP() << "CPU lacks AVX2 or AES";
  const std::vector<float> x = test::random_vec(200, 11, -40.f, 40.f);
  for (auto [name, fn] : kernels)
    for (uint64_t base : {uint64_t(0), uint64_t(1), uint64_t(2), uint64_t(3), uint64_t(6), uint64_t(1) << 40 | 5})
      for (size_t n : {size_t(1), size_t(3), size_t(16), size_t(17), size_t(35), size_t(200)}) {
        std::vector<int16_t> q0(n), q1(n);
        simd::QuantCounters c0, c1;
        simd::ref::quantize(x.data(), q0.data(), n, -2, Rounding::stochastic, 0xabcdef, base, &c0);
        fn(x.data(), q1.data(), n, -2, Rounding::stochastic, 0xabcdef, base, &c1);
        ASSERT_EQ(q0, q1) << name << " base=" << base << " n=" << n;
        EXPECT_EQ(c0.max_abs_q, c1.max_abs_q);
      }
}

// quantize2 (a tensor quantized for two slicings) gives the bits and counts of two quantize calls,
// at every level the CPU has, in every mode, from any index and on tails.
TEST(Dfp16Quantize, TwoExponentsGiveTheBitsOfTwoCalls) {
  const CpuFeatures f = detect_cpu_features();
  std::vector<float> x = test::random_vec(3000, 21, -40.f, 40.f);
  x[17] = 9e5f;  // saturates at exponent -2: the checked path
  std::vector<std::pair<std::string, simd::Quantize2Fn>> kernels;
  for (Isa level : kIsaLevels)
    if (f.supports(level)) {
      Context c(ContextOptions{.threads = 1, .isa = isa_name(level)});
      kernels.emplace_back(std::string(isa_name(level)) + " " + c.kernels().quantize2.name, c.kernels().quantize2.fn);
    }
  // The AES-NI form of AVX-512 CPUs without VAES, which a VAES CPU's table does not pick.
  if (f.supports(Isa::avx512bw) && f.aes) kernels.emplace_back("avx512 aesni", &simd::avx512::quantize2_aesni);
  for (const auto& [name, fn] : kernels) {
    for (Rounding r : {Rounding::nearest_even, Rounding::stochastic, Rounding::biased})
      for (uint64_t base : {uint64_t(0), uint64_t(3), uint64_t(16), uint64_t(1) << 40 | 5})
        for (size_t n : {size_t(1), size_t(17), size_t(1024), size_t(1041), size_t(3000)})
          for (auto [ea, eb] : {std::pair{-2, 1}, std::pair{3, -4}}) {
            std::vector<int16_t> a0(n), b0(n), a1(n), b1(n);
            simd::QuantCounters ca0, cb0, ca1, cb1;
            simd::ref::quantize(x.data(), a0.data(), n, ea, r, 0x5eed, base, &ca0);
            simd::ref::quantize(x.data(), b0.data(), n, eb, r, 0x5eed, base, &cb0);
            fn(x.data(), a1.data(), b1.data(), n, ea, eb, r, 0x5eed, base, &ca1, &cb1);
            const std::string what = name + " " + rounding_name(r) +
                                     " base=" + std::to_string(base) + " n=" + std::to_string(n);
            ASSERT_EQ(a0, a1) << what;
            ASSERT_EQ(b0, b1) << what;
            EXPECT_EQ(ca0.max_abs_q, ca1.max_abs_q) << what;
            EXPECT_EQ(cb0.max_abs_q, cb1.max_abs_q) << what;
            EXPECT_EQ(ca0.saturated, ca1.saturated) << what;
            EXPECT_EQ(cb0.saturated, cb1.saturated) << what;
          }
  }
}

TEST(Dfp16Quantize, StochasticDependsOnlyOnSeedAndIndex) {
  const std::vector<float> x = test::random_vec(100003, 5, -3.f, 3.f);
  auto run = [&](Context& c, uint64_t seed) {
    std::vector<int16_t> q(x.size());
    quantize_dfp16(c, x.data(), q.data(), x.size(), opts(1, Rounding::stochastic, seed));
    return q;
  };
  Context one(ContextOptions{.threads = 1});
  const auto a = run(one, 42), b = run(best_ctx(), 42), c = run(ref_ctx(), 42), d = run(best_ctx(), 43);
  EXPECT_EQ(a, b);  // thread count
  EXPECT_EQ(a, c);  // ISA
  EXPECT_NE(a, d);  // seed
}

// Every ISA the CPU has produces the reference's bits, in every mode, on tails too.
class Dfp16Isa : public ::testing::TestWithParam<const char*> {};

TEST_P(Dfp16Isa, BitIdenticalToReference) {
  const CpuFeatures f = detect_cpu_features();
  const Isa isa = parse_isa(GetParam(), "test");
  if (!f.supports(isa)) GTEST_SKIP() << "CPU lacks " << GetParam();
  Context c(ContextOptions{.threads = 2, .isa = GetParam()});
  for (size_t n : {size_t(1), size_t(15), size_t(16), size_t(17), size_t(1000), size_t(70001)}) {
    std::vector<float> x = test::random_vec(n, uint32_t(n), -2.f, 2.f);
    x[n / 2] = 3.75f;
    for (Rounding r : {Rounding::nearest_even, Rounding::stochastic, Rounding::biased})
      for (int h : {0, 2, 5}) {
        std::vector<int16_t> q0(n), q1(n);
        const QuantStats s0 = quantize_dfp16(ref_ctx(), x.data(), q0.data(), n, opts(h, r, 99));
        const QuantStats s1 = quantize_dfp16(c, x.data(), q1.data(), n, opts(h, r, 99));
        ASSERT_EQ(q0, q1) << "n=" << n << " rounding=" << rounding_name(r) << " h=" << h;
        EXPECT_EQ(s0.exponent, s1.exponent);
        EXPECT_EQ(s0.max_abs_int, s1.max_abs_int);
        EXPECT_EQ(s0.saturated, s1.saturated);
        std::vector<float> d0(n), d1(n);
        dequantize_dfp16(ref_ctx(), q0.data(), s0.exponent, d0.data(), n);
        dequantize_dfp16(c, q1.data(), s1.exponent, d1.data(), n);
        ASSERT_EQ(0, std::memcmp(d0.data(), d1.data(), n * sizeof(float)));
      }
    std::vector<int16_t> a(n), b(n), i0(2 * n), i1(2 * n);
    for (size_t i = 0; i < n; ++i) { a[i] = int16_t(i * 7); b[i] = int16_t(-int(i)); }
    simd::ref::interleave(a.data(), b.data(), i0.data(), n);
    c.kernels().interleave.fn(a.data(), b.data(), i1.data(), n);
    ASSERT_EQ(i0, i1);
    c.kernels().interleave.fn(a.data(), nullptr, i1.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(i1[2 * i + 1], 0);
  }
}

// max_abs: the reference's value and count of non-finite elements at every level and tail length,
// with -0, denormals, and an infinity or NaN anywhere or nowhere (the largest |x| over the finite
// elements: a non-finite one never wins).
TEST_P(Dfp16Isa, MaxAbsBitIdenticalToReference) {
  if (!detect_cpu_features().supports(parse_isa(GetParam(), "test"))) GTEST_SKIP() << "CPU lacks " << GetParam();
  Context c(ContextOptions{.threads = 1, .isa = GetParam()});
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (size_t n : {size_t(1), size_t(15), size_t(16), size_t(17), size_t(31), size_t(33), size_t(1000)})
    for (int kind = 0; kind < 6; ++kind) {
      std::vector<float> x = test::random_vec(n, uint32_t(n) + 5, -3.f, 3.f);
      x[0] = -0.f;
      if (n > 3) x[3] = 1e-42f;  // a denormal
      if (kind == 1) x.assign(n, -0.f);
      if (kind == 2) x[n - 1] = inf;
      if (kind == 3) x[n / 2] = -nan;
      if (kind == 4) x[0] = -inf, x[n - 1] = nan;
      if (kind == 5) x[n - 1] = -7.5f;  // the largest in the tail
      uint64_t bad0 = 3, bad1 = 3;  // counts add to what is there
      const float m0 = simd::ref::max_abs(x.data(), n, &bad0);
      const float m1 = c.kernels().max_abs.fn(x.data(), n, &bad1);
      const std::string at = std::to_string(n) + " kind " + std::to_string(kind);
      ASSERT_EQ(std::bit_cast<uint32_t>(m0), std::bit_cast<uint32_t>(m1)) << at;
      ASSERT_EQ(bad0, bad1) << at;
      ASSERT_FALSE(std::isnan(m0)) << at;
      ASSERT_EQ(c.kernels().max_abs.fn(x.data(), n, nullptr), m0) << at;
    }
}

// Sampled-numerics statistics: the same bits as the reference at every level, at every tail length,
// at two scales, with ties, saturation, underflow, -0, denormals and non-finite values.
TEST_P(Dfp16Isa, StatisticsBitIdenticalToReference) {
  const CpuFeatures f = detect_cpu_features();
  const Isa isa = parse_isa(GetParam(), "test");
  if (!f.supports(isa)) GTEST_SKIP() << "CPU lacks " << GetParam();
  Context c(ContextOptions{.threads = 2, .isa = GetParam()});
  const auto fn = c.kernels().dfp16_stats.fn;
  for (size_t n : {size_t(0), size_t(1), size_t(15), size_t(16), size_t(17), size_t(1000), size_t(70001)}) {
    std::vector<float> x = test::random_vec(n, uint32_t(n) + 7, -40.f, 40.f);
    if (n >= 17) {
      x[1] = 32767.5f / 1024.f;  // a tie to 32768: saturates
      x[2] = -32766.5f / 1024.f;  // a tie to even, -32766
      x[3] = 1e-9f;               // underflows
      x[4] = 0.f;
      x[5] = std::numeric_limits<float>::infinity();
      x[6] = std::nanf("");
      x[16] = -std::numeric_limits<float>::infinity();
      x[7] = -0.f;
      x[8] = 1e-40f;   // denormal
      x[9] = -3e-39f;  // denormal
    }
    for (const int e : {-10, 4}) {  // q = x * 1024 (x[1], x[2] ties); q = x / 16
      const double down = std::ldexp(1.0, -e), up = std::ldexp(1.0, e);
      const FormatStats a = simd::ref::dfp16_stats(x.data(), n, down, up), b = fn(x.data(), n, down, up);
      EXPECT_EQ(0, std::memcmp(&a.signal, &b.signal, sizeof(double))) << "n=" << n << " e=" << e;
      EXPECT_EQ(0, std::memcmp(&a.noise, &b.noise, sizeof(double))) << "n=" << n << " e=" << e;
      EXPECT_EQ(a.nonzero, b.nonzero) << "n=" << n << " e=" << e;
      EXPECT_EQ(a.overflow, b.overflow) << "n=" << n << " e=" << e;
      EXPECT_EQ(b.elements, n);
      EXPECT_EQ(a.underflow, b.underflow) << "n=" << n << " e=" << e;
      EXPECT_EQ(a.nonfinite, b.nonfinite) << "n=" << n << " e=" << e;
      if (n >= 17 && e == -10) {
        EXPECT_EQ(b.nonfinite, 3u);
        EXPECT_GE(b.overflow, 1u);  // x[1] saturates; and every |x| >= 32 of the random values
        EXPECT_GE(b.underflow, 3u);  // x[3] and the two denormals
      }
    }
  }
}

// The element-wise FP32 kernels (ReLU forward/backward, add) match their scalar twins bit for bit,
// including -0, NaN and masked tails.

TEST_P(Dfp16Isa, ElementwiseBitIdenticalToReference) {
  if (!detect_cpu_features().supports(parse_isa(GetParam(), "test"))) GTEST_SKIP() << "CPU lacks " << GetParam();
  Context c(ContextOptions{.threads = 1, .isa = GetParam()});
  for (size_t n : {size_t(1), size_t(16), size_t(33), size_t(1001)}) {
    std::vector<float> a = test::random_vec(n, 1, -1.f, 1.f), b = test::random_vec(n, 2, -1.f, 1.f);
    a[0] = -0.f;
    if (n > 2) a[2] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> r0(n), r1(n);
    std::vector<uint16_t> m0((n + 15) / 16), m1((n + 15) / 16, 0xAAAA);
    const float mx0 = simd::ref::relu_fwd(a.data(), r0.data(), m0.data(), n);
    const float mx1 = c.kernels().relu_fwd.fn(a.data(), r1.data(), m1.data(), n);
    ASSERT_EQ(0, std::memcmp(r0.data(), r1.data(), n * sizeof(float)));
    ASSERT_EQ(mx0, mx1);
    ASSERT_EQ(mx0, *std::max_element(r0.begin(), r0.end()));
    ASSERT_EQ(m0, m1);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ((m0[i / 16] >> (i % 16)) & 1, a[i] > 0.f) << i;  // -0, NaN: 0
    simd::ref::relu_bwd(m0.data(), b.data(), r0.data(), n);
    c.kernels().relu_bwd.fn(m0.data(), b.data(), r1.data(), n);
    ASSERT_EQ(0, std::memcmp(r0.data(), r1.data(), n * sizeof(float)));
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(r0[i], a[i] > 0.f ? b[i] : 0.f);
    simd::ref::add(a.data(), b.data(), r0.data(), n);
    c.kernels().add.fn(a.data(), b.data(), r1.data(), n);
    ASSERT_EQ(0, std::memcmp(r0.data(), r1.data(), n * sizeof(float)));
    // add_relu: the bits, mask and max of add followed by relu_fwd on the sum.
    std::vector<float> s0(n), s1(n);
    std::vector<uint16_t> k0((n + 15) / 16), k1((n + 15) / 16, 0x5555);
    const float sm0 = simd::ref::relu_fwd(r0.data(), s0.data(), k0.data(), n);
    const float sm1 = c.kernels().add_relu.fn(a.data(), b.data(), s1.data(), k1.data(), n);
    ASSERT_EQ(0, std::memcmp(s0.data(), s1.data(), n * sizeof(float)));
    ASSERT_EQ(k0, k1);
    ASSERT_EQ(sm0, sm1);
    std::vector<uint16_t> k2((n + 15) / 16);
    ASSERT_EQ(sm0, simd::ref::add_relu(a.data(), b.data(), s1.data(), k2.data(), n));
    ASSERT_EQ(0, std::memcmp(s0.data(), s1.data(), n * sizeof(float)));
    ASSERT_EQ(k0, k2);
  }
}

// The max-pooling row kernels match their scalar twins bit for bit: values, the saved taps (ties
// go to the first tap in window order, a NaN first tap stays, a later NaN never wins) and the
// backward's additions (in output order where windows overlap; -0 kept where no tap adds), for
// window sizes, strides, pads, rows outside the input and windows of no tap.
TEST_P(Dfp16Isa, MaxPoolRowBitIdenticalToReference) {
  if (!detect_cpu_features().supports(parse_isa(GetParam(), "test"))) GTEST_SKIP() << "CPU lacks " << GetParam();
  Context c(ContextOptions{.threads = 1, .isa = GetParam()});
  const int in_w = 9;
  std::vector<float> in = test::random_vec(size_t(5) * in_w * 16, 31, -2.f, 2.f);
  for (size_t i = 0; i < in.size(); i += 7) in[i] = std::round(in[i]);  // ties
  in[16 * 3 + 2] = std::numeric_limits<float>::quiet_NaN();               // first tap of some windows
  in[16 * 11 + 5] = std::numeric_limits<float>::quiet_NaN();
  in[16 * 20 + 9] = -std::numeric_limits<float>::infinity();
  in[16 * 4 + 1] = -0.f;
  int windows = 0;
  for (int k : {1, 2, 3, 5})
    for (int stride : {1, 2, 3})
      for (int pad : {0, 1, 2})
        for (int nulls : {0, 1, 2}) {  // no row outside, the first, the first and the last
          if (pad > k) continue;
          const int out_w = (in_w + 2 * pad - k) / stride + 1 + (stride > 1);  // one window past the end
          const float* rows[5];
          for (int r = 0; r < k; ++r)
            rows[r] = (nulls >= 1 && r == 0) || (nulls == 2 && r == k - 1 && k > 1) ? nullptr : in.data() + size_t(r) * in_w * 16;
          std::vector<float> y0(size_t(out_w) * 16), y1(y0.size(), 7.f);
          std::vector<uint8_t> a0(y0.size()), a1(y0.size(), 9);
          simd::ref::maxpool_row({rows, k, stride, pad, in_w, out_w, y0.data(), a0.data()});
          c.kernels().maxpool_row.fn({rows, k, stride, pad, in_w, out_w, y1.data(), a1.data()});
          const std::string where = "k " + std::to_string(k) + " stride " + std::to_string(stride) + " pad " +
                                    std::to_string(pad) + " nulls " + std::to_string(nulls);
          ASSERT_EQ(0, std::memcmp(y0.data(), y1.data(), y0.size() * sizeof(float))) << where;
          ASSERT_EQ(a0, a1) << where;
          windows += int(std::count(a0.begin(), a0.end(), uint8_t(255)) < std::ptrdiff_t(a0.size()));
          // Backward into rows of dx that start as values (a -0 among them).
          std::vector<float> dx0 = test::random_vec(in.size(), 32, -1.f, 1.f), dx1;
          dx0[16 * 2] = -0.f;
          dx1 = dx0;
          const std::vector<float> dy = test::random_vec(y0.size(), 33, -1.f, 1.f);
          float* d0[5];
          float* d1[5];
          for (int r = 0; r < k; ++r) {
            d0[r] = rows[r] ? dx0.data() + size_t(r) * in_w * 16 : nullptr;
            d1[r] = rows[r] ? dx1.data() + size_t(r) * in_w * 16 : nullptr;
          }
          simd::ref::maxpool_row_bwd({d0, k, stride, pad, out_w, dy.data(), a0.data()});
          c.kernels().maxpool_row_bwd.fn({d1, k, stride, pad, out_w, dy.data(), a0.data()});
          ASSERT_EQ(0, std::memcmp(dx0.data(), dx1.data(), dx0.size() * sizeof(float))) << where;
        }
  EXPECT_GT(windows, 50);
  // The rules themselves, on the reference: the first of equal maxima, a NaN first tap kept.
  std::vector<float> row(size_t(3) * 16, 1.f);
  row[16 + 0] = 3.f;  // lane 0: pixel 1 greater
  row[0 + 1] = std::numeric_limits<float>::quiet_NaN();  // lane 1: NaN first
  row[16 + 2] = std::numeric_limits<float>::quiet_NaN();  // lane 2: NaN later
  const float* one[3] = {row.data(), nullptr, nullptr};  // a 3x3 window on the top row
  float y[16];
  uint8_t arg[16];
  simd::ref::maxpool_row({one, 3, 3, 0, 3, 1, y, arg});
  EXPECT_EQ(arg[0], 1);
  EXPECT_EQ(y[0], 3.f);
  EXPECT_TRUE(std::isnan(y[1]));
  EXPECT_EQ(arg[1], 0);
  EXPECT_EQ(y[2], 1.f);
  EXPECT_EQ(arg[2], 0);
  EXPECT_EQ(arg[3], 0);  // all equal: the first
}

// lane_sums (a bias's gradient) matches its scalar twin bit for bit, each lane summed in pixel
// order in FP64 from what it held: values whose sum depends on the order (large and small, both
// signs, -0), infinities and a NaN in separate lanes, run lengths around the vector forms.
TEST_P(Dfp16Isa, LaneSumsBitIdenticalToReference) {
  if (!detect_cpu_features().supports(parse_isa(GetParam(), "test"))) GTEST_SKIP() << "CPU lacks " << GetParam();
  Context c(ContextOptions{.threads = 1, .isa = GetParam()});
  for (size_t px : {size_t(0), size_t(1), size_t(3), size_t(17), size_t(256)}) {
    std::vector<float> x = test::random_vec(px * 16, 31 + unsigned(px), -1.f, 1.f);
    for (size_t p = 0; p < px; ++p) {
      x[p * 16 + 1] = p % 3 == 0 ? 3e7f : -1.f + float(p) * 1e-3f;  // order-dependent in FP32, exact in FP64
      x[p * 16 + 2] = -0.f;
      if (p == px / 2) {
        x[p * 16 + 3] = std::numeric_limits<float>::infinity();
        x[p * 16 + 4] = std::numeric_limits<float>::quiet_NaN();
      }
    }
    std::vector<double> r0(16), r1(16);
    for (int l = 0; l < 16; ++l) r0[size_t(l)] = r1[size_t(l)] = l == 5 ? 1e300 : 0.25 * l;
    simd::ref::lane_sums(x.data(), px, r0.data());
    c.kernels().lane_sums.fn(x.data(), px, r1.data());
    ASSERT_EQ(0, std::memcmp(r0.data(), r1.data(), r0.size() * sizeof(double))) << px;
    for (int l = 0; l < 16; ++l) {
      double want = l == 5 ? 1e300 : 0.25 * l;
      for (size_t p = 0; p < px; ++p) want += double(x[p * 16 + size_t(l)]);
      ASSERT_EQ(0, std::memcmp(&want, &r0[size_t(l)], sizeof want)) << px << " lane " << l;
    }
  }
}

// shift_lanes (the zero-padding shortcut) matches its scalar twin bit for bit and picks lane l + shift
// of the two blocks, for every shift, absent blocks, kept lanes, and pixel steps in and out.
TEST_P(Dfp16Isa, ShiftLanesBitIdenticalToReference) {
  if (!detect_cpu_features().supports(parse_isa(GetParam(), "test"))) GTEST_SKIP() << "CPU lacks " << GetParam();
  Context c(ContextOptions{.threads = 1, .isa = GetParam()});
  const size_t px = 5;
  std::vector<float> a = test::random_vec(px * 2 * 16, 21, -1.f, 1.f), b = test::random_vec(px * 2 * 16, 22, -1.f, 1.f);
  a[3] = -0.f;
  b[7] = std::numeric_limits<float>::quiet_NaN();
  for (int shift = 0; shift < 16; ++shift)
    for (int which = 0; which < 4; ++which)  // both blocks, a only, b only, none
      for (uint16_t keep : {uint16_t(0xFFFF), uint16_t(0x0FF0), uint16_t(0x8001)})
        for (size_t in_step : {size_t(1), size_t(2)})
          for (size_t out_step : {size_t(1), size_t(2)}) {
            const float* pa = which == 0 || which == 1 ? a.data() : nullptr;
            const float* pb = which == 0 || which == 2 ? b.data() : nullptr;
            std::vector<float> r0(px * out_step * 16, 7.f), r1 = r0;
            simd::ref::shift_lanes(pa, pb, shift, in_step, r0.data(), out_step, px, keep);
            c.kernels().shift_lanes.fn(pa, pb, shift, in_step, r1.data(), out_step, px, keep);
            ASSERT_EQ(0, std::memcmp(r0.data(), r1.data(), r0.size() * sizeof(float))) << shift << " " << which;
            for (size_t p = 0; p < px; ++p)
              for (int l = 0; l < 16; ++l) {
                const int j = l + shift;
                const float* src = j < 16 ? pa : pb;
                const float want = (keep >> l & 1) && src ? src[p * in_step * 16 + j % 16] : 0.f;
                const float got = r0[p * out_step * 16 + l];
                ASSERT_EQ(0, std::memcmp(&want, &got, sizeof want)) << shift << " " << p << " " << l;
                if (out_step == 2) {
                  ASSERT_EQ(r0[(p * 2 + 1) * 16 + l], 7.f);  // skipped pixels untouched
                }
              }
          }
}

// The layout transposes (plain channel planes <-> blocked pixels) match their scalar twins bit for
// bit, for every lane count and pixel runs around the 16-pixel step; to_blocked zeroes the lanes it
// does not fill and returns max|x| (NaN ignored), from_blocked writes only its lanes and pixels.
TEST_P(Dfp16Isa, LayoutTransposesBitIdenticalToReference) {
  if (!detect_cpu_features().supports(parse_isa(GetParam(), "test"))) GTEST_SKIP() << "CPU lacks " << GetParam();
  Context c(ContextOptions{.threads = 1, .isa = GetParam()});
  const size_t plane = 41;
  std::vector<float> plain = test::random_vec(16 * plane, 31, -3.f, 3.f);
  plain[2] = -0.f;
  plain[plane + 5] = std::numeric_limits<float>::quiet_NaN();
  plain[3 * plane + 7] = -9.5f;  // the largest magnitude, in lane 3
  for (int lanes : {1, 3, 15, 16})
    for (size_t pixels : {size_t(1), size_t(15), size_t(16), size_t(17), size_t(33), plane}) {
      std::vector<float> b0(pixels * 16, 7.f), b1 = b0;
      const float m0 = simd::ref::to_blocked(plain.data(), plane, lanes, b0.data(), pixels);
      const float m1 = c.kernels().to_blocked.fn(plain.data(), plane, lanes, b1.data(), pixels);
      ASSERT_EQ(0, std::memcmp(b0.data(), b1.data(), b0.size() * sizeof(float))) << lanes << " " << pixels;
      ASSERT_EQ(std::bit_cast<uint32_t>(m0), std::bit_cast<uint32_t>(m1)) << lanes << " " << pixels;
      float want_max = 0.f;
      for (size_t p = 0; p < pixels; ++p)
        for (int l = 0; l < 16; ++l) {
          const float want = l < lanes ? plain[size_t(l) * plane + p] : 0.f;
          ASSERT_EQ(0, std::memcmp(&want, &b0[p * 16 + l], sizeof want)) << lanes << " " << p << " " << l;
          if (std::fabs(want) > want_max) want_max = std::fabs(want);
        }
      ASSERT_EQ(m0, want_max);
      std::vector<float> p0(16 * plane, 5.f), p1 = p0;
      simd::ref::from_blocked(b0.data(), lanes, p0.data(), plane, pixels);
      c.kernels().from_blocked.fn(b0.data(), lanes, p1.data(), plane, pixels);
      ASSERT_EQ(0, std::memcmp(p0.data(), p1.data(), p0.size() * sizeof(float))) << lanes << " " << pixels;
      for (int l = 0; l < 16; ++l)
        for (size_t p = 0; p < plane; ++p) {
          const float want = l < lanes && p < pixels ? plain[size_t(l) * plane + p] : 5.f;
          ASSERT_EQ(0, std::memcmp(&want, &p0[size_t(l) * plane + p], sizeof want)) << lanes << " " << l << " " << p;
        }
    }
}

// The whole-tensor conversions on a context (its threads, this level's kernels) give the serial
// ones' bits: padding lanes zero, NaN and -0 kept, channel counts around the 16-lane block.
TEST_P(Dfp16Isa, WholeTensorLayoutOnAContextMatchesTheSerialOne) {
  if (!detect_cpu_features().supports(parse_isa(GetParam(), "test"))) GTEST_SKIP() << "CPU lacks " << GetParam();
  Context c(ContextOptions{.threads = 2, .isa = GetParam()});
  for (int ch : {1, 3, 16, 21, 40}) {
    const int n = 3, h = 5, w = 7;
    std::vector<float> x = test::random_vec(size_t(n) * ch * h * w, 40 + ch, -2.f, 2.f);
    x[1] = -0.f;
    x[x.size() - 2] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> b0(blocked_size(n, ch, h, w), 9.f), b1 = b0;
    to_blocked(x.data(), b0.data(), n, ch, h, w);
    to_blocked(c, x.data(), b1.data(), n, ch, h, w);
    ASSERT_EQ(0, std::memcmp(b0.data(), b1.data(), b0.size() * sizeof(float))) << ch;
    std::vector<float> y0(x.size(), 4.f), y1 = y0;
    from_blocked(b0.data(), y0.data(), n, ch, h, w);
    from_blocked(c, b0.data(), y1.data(), n, ch, h, w);
    ASSERT_EQ(0, std::memcmp(y0.data(), y1.data(), y0.size() * sizeof(float))) << ch;
    ASSERT_EQ(0, std::memcmp(y0.data(), x.data(), x.size() * sizeof(float))) << ch;
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, Dfp16Isa, ::testing::ValuesIn(test::isa_names_from(Isa::avx2)));

TEST(Dfp16Quantize, RejectsBadHeadroom) {
  std::vector<float> x(4, 1.f);
  std::vector<int16_t> q(4);
  EXPECT_THROW(quantize_dfp16(best_ctx(), x.data(), q.data(), 4, opts(9, Rounding::nearest_even)), Error);
  EXPECT_THROW(parse_rounding("up", "flag --round-weights"), Error);
}

TEST(Context, RejectsUnknownIsa) {
  test::expect_error([&] { Context c(ContextOptions{.isa = "avx9000"}); }, Status::invalid_argument, {"avx9000"});
}

// DFP_ISA forces a kernel level for every context that does not choose one itself; a bad value
// is an error naming the variable.
TEST(Context, DfpIsaVariableForcesTheKernelLevel) {
  {
    test::ScopedEnv isa("DFP_ISA", "ref");
    Context c(ContextOptions{.threads = 1});
    EXPECT_EQ(c.isa(), Isa::ref);
    EXPECT_NE(std::string(c.kernels().conv_s16_pixel.name).find("ref"), std::string::npos) << c.kernels().conv_s16_pixel.name;
    if (c.cpu().supports(Isa::avx512bw)) {  // the context's own choice wins over the variable
      Context d(ContextOptions{.threads = 1, .isa = "avx512bw"});
      EXPECT_EQ(d.isa(), Isa::avx512bw);
    }
  }
  test::ScopedEnv isa("DFP_ISA", "avx9000");
  test::expect_error([&] { Context c(ContextOptions{.threads = 1}); }, Status::invalid_argument,
                     {"environment variable DFP_ISA", "avx9000"});
}

// "avx2-vpmaddwd" is the avx2 level in the form of a CPU without AVX-VNNI, wherever AVX2 runs
// (the name of the INT16 pixel kernel says which form); a CPU without AVX2 refuses it as "avx2".
TEST(Context, Avx2VpmaddwdRunsTheAvx2FormWithoutAvxVnni) {
  Context probe(ContextOptions{.threads = 1});
  if (!probe.cpu().supports(Isa::avx2)) {
    test::expect_error([&] { Context c(ContextOptions{.threads = 1, .isa = "avx2-vpmaddwd"}); }, Status::unsupported,
                       {"avx2"});
    return;
  }
  Context c(ContextOptions{.threads = 1, .isa = "avx2-vpmaddwd"});
  EXPECT_EQ(c.isa(), Isa::avx2);
  const std::string name = c.kernels().conv_s16_pixel.name;
  EXPECT_NE(name.find("vpmaddwd"), std::string::npos) << name;
  EXPECT_EQ(name.find("avxvnni"), std::string::npos) << name;
  test::ScopedEnv isa("DFP_ISA", "avx2-vpmaddwd");
  Context d(ContextOptions{.threads = 1});
  EXPECT_EQ(std::string(d.kernels().conv_s16_pixel.name), name);
}

// One thread setting sizes the one OpenMP pool that runs dfp's loops and oneDNN's primitives.
// A loop covers [0, n) exactly once; an exception in a chunk reaches the caller; inside another
// parallel region a loop runs on that region's thread alone.
TEST(Context, LoopsRunOnTheOpenMpPoolOfTheThreadSetting) {
  for (int threads : {1, 2}) {
    Context c(ContextOptions{.threads = threads});
    EXPECT_EQ(c.threads(), threads);
    EXPECT_EQ(omp_get_max_threads(), threads);
    std::atomic<int> team{0}, elsewhere{0};
    std::vector<std::atomic<int>> seen(1000);
    const std::thread::id caller = std::this_thread::get_id();
    c.parallel_for(int64_t(seen.size()), [&](int64_t lo, int64_t hi) {
      team = std::max(team.load(), omp_get_num_threads());
      elsewhere += std::this_thread::get_id() != caller;
      for (int64_t i = lo; i < hi; ++i) ++seen[size_t(i)];
    });
    for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i].load(), 1) << i;
    if (threads == 1) EXPECT_EQ(elsewhere.load(), 0);
    else EXPECT_EQ(team.load(), threads);
    test::expect_error(
        [&] {
          c.parallel_for(64, [&](int64_t, int64_t hi) {
            if (hi == 64) fail(Status::numerical_error, "chunk ending at " + std::to_string(hi));
          });
        },
        Status::numerical_error, {"chunk ending at 64"});
    int nested_team = 0;
#pragma omp parallel num_threads(2)
    {
#pragma omp single
      c.parallel_for(64, [&](int64_t lo, int64_t hi) {
        EXPECT_EQ(lo, 0);
        EXPECT_EQ(hi, 64);
        nested_team = omp_get_num_threads();
      });
    }
    EXPECT_EQ(nested_team, 2) << "the loop ran on the enclosing team's thread, as one chunk";
  }
}
