// BF16 / FP16 storage formats: every 16-bit pattern, rounding on ties, overflow and subnormals,
// stochastic rounding's unbiasedness, and the kernels bit-identical to the scalar specification.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/float16.hpp"
#include "simd/kernel_table.hpp"
#include "tests/common/isa_levels.hpp"

using namespace dfp;

namespace {
// Independent decoders written from the format definitions (not from the code under test).
double fp16_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  const double sign = s ? -1.0 : 1.0;
  if (e == 31) return m ? std::nan("") : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(double(m), -24);
  return sign * std::ldexp(1.0 + m / 1024.0, e - 15);
}
double bf16_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
  const double sign = s ? -1.0 : 1.0;
  if (e == 255) return m ? std::nan("") : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(double(m), -133);
  return sign * std::ldexp(1.0 + m / 128.0, e - 127);
}
bool same(double a, float b) { return (std::isnan(a) && std::isnan(b)) || (a == double(b) && std::signbit(a) == std::signbit(b)); }
}  // namespace

TEST(Float16, EveryFp16PatternWidensExactlyAndRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_f32(uint16_t(h));
    ASSERT_TRUE(same(fp16_value(uint16_t(h)), f)) << std::hex << h;
    if (!std::isnan(f)) ASSERT_EQ(f32_to_fp16(f), h) << std::hex << h;
    else ASSERT_TRUE(std::isnan(fp16_to_f32(f32_to_fp16(f))));
  }
}

TEST(Float16, EveryBf16PatternWidensExactlyAndRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(uint16_t(h));
    ASSERT_TRUE(same(bf16_value(uint16_t(h)), f)) << std::hex << h;
    if (!std::isnan(f)) ASSERT_EQ(f32_to_bf16(f), h) << std::hex << h;
    else ASSERT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
  }
}

TEST(Float16, Fp16TiesOverflowAndSubnormals) {
  // Ties go to the even mantissa.
  EXPECT_EQ(f32_to_fp16(1.0f + 0x1p-11f), 0x3C00);              // 1 + half ulp -> 1
  EXPECT_EQ(f32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3C02);          // 1 + 1.5 ulp -> 1 + 2 ulp
  EXPECT_EQ(f32_to_fp16(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);   // just above the tie -> up
  EXPECT_EQ(f32_to_fp16(2049.0f), 0x6800);                      // 2048 + half ulp (2) -> 2048
  // Overflow: 65504 is the largest finite; the tie at 65520 rounds to inf.
  EXPECT_EQ(f32_to_fp16(65504.f), 0x7BFF);
  EXPECT_EQ(f32_to_fp16(65519.996f), 0x7BFF);
  EXPECT_EQ(f32_to_fp16(65520.f), 0x7C00);
  EXPECT_EQ(f32_to_fp16(-1e6f), 0xFC00);
  EXPECT_EQ(f32_to_fp16(INFINITY), 0x7C00);
  // Subnormals: smallest 2^-24; the tie at 2^-25 goes to even (zero); 3*2^-25 to 2*2^-24.
  EXPECT_EQ(f32_to_fp16(0x1p-24f), 0x0001);
  EXPECT_EQ(f32_to_fp16(0x1p-25f), 0x0000);
  EXPECT_EQ(f32_to_fp16(-0x1p-25f), 0x8000);
  EXPECT_EQ(f32_to_fp16(0x1.8p-25f), 0x0001);
  EXPECT_EQ(f32_to_fp16(3 * 0x1p-25f), 0x0002);
  EXPECT_EQ(f32_to_fp16(0x1p-14f - 0x1p-26f), 0x0400);          // rounds up into the smallest normal
  EXPECT_EQ(f32_to_fp16(1e-30f), 0x0000);
  EXPECT_EQ(f32_to_fp16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_TRUE(std::isnan(fp16_to_f32(f32_to_fp16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Float16, Bf16TiesOverflowAndSubnormals) {
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);               // tie -> even
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds to inf
  EXPECT_EQ(f32_to_bf16(0x1.fep127f), 0x7F7F);                  // largest finite bf16
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);  // tie at 2^-149 -> 0
  EXPECT_EQ(f32_to_bf16(0x1p-133f), 0x0001);                    // smallest bf16 subnormal
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  const uint16_t snan = f32_to_bf16(std::bit_cast<float>(0x7F800001u));  // payload only in low bits
  EXPECT_TRUE(std::isnan(bf16_to_f32(snan)));
}

TEST(Float16, StochasticRoundingIsUnbiasedAndStaysOnNeighbours) {
  for (float x : {1.0f + 0x1p-12f, -3.3f, 1e-6f, 65500.f, 7e-8f}) {
    const float lo16 = fp16_to_f32(f32_to_fp16(x));
    double sum16 = 0, sumb = 0;
    const int n = 200000;
    for (int i = 0; i < n; ++i) {
      const uint32_t r = simd::stochastic_rand24(simd::stochastic_key(7), uint64_t(i));
      const float h = fp16_to_f32(f32_to_fp16_stochastic(x, r));
      const float b = bf16_to_f32(f32_to_bf16_stochastic(x, r));
      ASSERT_LE(std::fabs(h - x), std::fabs(lo16 - x) + std::fabs(x) * 0x1p-10f + 0x1p-24f);
      sum16 += h;
      sumb += b;
    }
    const double ulp16 = std::fabs(x) < 0x1p-14 ? 0x1p-24 : std::ldexp(1.0, std::ilogb(x) - 10);
    const double ulpb = std::ldexp(1.0, std::ilogb(x) - 7);
    // Mean of n Bernoulli choices between neighbours: standard error <= ulp / (2 sqrt(n)).
    EXPECT_NEAR(sum16 / n, x, 5 * ulp16 / (2 * std::sqrt(double(n)))) << x;
    EXPECT_NEAR(sumb / n, x, 5 * ulpb / (2 * std::sqrt(double(n)))) << x;
  }
  // A value already representable never moves.
  for (uint32_t r : {0u, 1u, 0xFFFFFFu}) {
    EXPECT_EQ(f32_to_fp16_stochastic(1.5f, r), f32_to_fp16(1.5f));
    EXPECT_EQ(f32_to_bf16_stochastic(1.5f, r), f32_to_bf16(1.5f));
  }
}

TEST(Float16, MeasureRoundingCountsOverflowUnderflowAndNoise) {
  const std::vector<float> x = {1.f, 1e5f, 1e-9f, 0.f, 3.f};
  std::vector<float> q(x.size());
  for (size_t i = 0; i < x.size(); ++i) q[i] = fp16_to_f32(f32_to_fp16(x[i]));
  const FormatStats s = measure_rounding(x.data(), q.data(), x.size());
  EXPECT_EQ(s.overflow, 1u);
  EXPECT_EQ(s.underflow, 1u);
  EXPECT_EQ(s.nonzero, 4u);
  EXPECT_NEAR(s.noise, 1e-18, 1e-20);  // only the underflowed element is off
}

class Float16Isa : public ::testing::TestWithParam<const char*> {};

TEST_P(Float16Isa, KernelsBitIdenticalToSpecification) {
  if (!detect_cpu_features().supports(parse_isa(GetParam(), "test"))) GTEST_SKIP() << "CPU lacks " << GetParam();
  Context c(ContextOptions{.threads = 1, .isa = GetParam()});
  const simd::KernelTable& k = c.kernels();
  // Every half widened, every midpoint between consecutive halves (the ties) and a nudge either
  // side of it, specials, and random floats over the whole range.
  std::vector<float> x;
  for (uint32_t h = 0; h < 65536; ++h) {
    for (bool bf : {false, true}) {
      const float a = bf ? bf16_to_f32(uint16_t(h)) : fp16_to_f32(uint16_t(h));
      const float b = bf ? bf16_to_f32(uint16_t(h + 1)) : fp16_to_f32(uint16_t(h + 1));
      x.push_back(a);
      if (std::isfinite(a) && std::isfinite(b) && h != 0x7FFF && h != 0xFFFF) {
        const float mid = float((double(a) + double(b)) / 2);
        x.push_back(mid);
        x.push_back(std::nextafter(mid, INFINITY));
        x.push_back(std::nextafter(mid, -INFINITY));
      }
    }
  }
  std::mt19937 rng(3);
  for (int i = 0; i < 200000; ++i) x.push_back(std::bit_cast<float>(uint32_t(rng())));
  for (float s : {0.f, -0.f, INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN(),
                  std::bit_cast<float>(0x7F800001u), std::bit_cast<float>(0xFFC12345u), 65520.f, 65519.99f})
    x.push_back(s);
  x.push_back(1.f);  // odd length: masked tails
  const size_t n = x.size();
  std::vector<uint16_t> h0(n), h1(n);
  std::vector<float> f0(n), f1(n);
  for (Rounding r : {Rounding::nearest_even, Rounding::stochastic}) {
    simd::ref::to_fp16(x.data(), h0.data(), n, r, 5, 11);
    k.to_fp16.fn(x.data(), h1.data(), n, r, 5, 11);
    ASSERT_EQ(h0, h1) << "to_fp16 " << rounding_name(r);
    if (r == Rounding::nearest_even) {
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(h0[i], f32_to_fp16(x[i])) << i;
    }
    simd::ref::fp16_to_f32(h0.data(), f0.data(), n);
    k.fp16_to_f32.fn(h0.data(), f1.data(), n);
    ASSERT_EQ(0, std::memcmp(f0.data(), f1.data(), n * 4));
    k.round_fp16.fn(x.data(), f1.data(), n, r, 5, 11);
    ASSERT_EQ(0, std::memcmp(f0.data(), f1.data(), n * 4)) << "round_fp16";

    simd::ref::to_bf16(x.data(), h0.data(), n, r, 5, 11);
    k.to_bf16.fn(x.data(), h1.data(), n, r, 5, 11);
    ASSERT_EQ(h0, h1) << "to_bf16 " << rounding_name(r);
    simd::ref::bf16_to_f32(h0.data(), f0.data(), n);
    k.bf16_to_f32.fn(h0.data(), f1.data(), n);
    ASSERT_EQ(0, std::memcmp(f0.data(), f1.data(), n * 4));
    k.round_bf16.fn(x.data(), f1.data(), n, r, 5, 11);
    ASSERT_EQ(0, std::memcmp(f0.data(), f1.data(), n * 4)) << "round_bf16";
  }
}

INSTANTIATE_TEST_SUITE_P(AllLevels, Float16Isa, ::testing::ValuesIn(test::isa_names_from(Isa::ref)));
