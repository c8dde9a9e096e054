// posit16 (es 1 and 2): known codes, every code decoded and encoded back in order, ties to the even
// string in the linear and the tapered regions, no rounding to zero or past maxpos, NaR, and the
// kernels bit-identical to the scalar specification at every level.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/posit.hpp"
#include "simd/kernel_table.hpp"
#include "tests/common/isa_levels.hpp"

using namespace dfp;

TEST(Posit16, KnownCodes) {
  // es 1: 1 = 0x4000, 2 = regime 10, exponent 1: 0x5000; 4 = regime 110: 0x6000; 0.5 = regime 01,
  // exponent 1: 0x3000; the ends 2^+-28. es 2: 16 = regime 110: 0x6000, the ends 2^+-56.
  EXPECT_EQ(f32_to_posit16(1.f, 1), 0x4000);
  EXPECT_EQ(f32_to_posit16(-1.f, 1), 0xC000);
  EXPECT_EQ(f32_to_posit16(2.f, 1), 0x5000);
  EXPECT_EQ(f32_to_posit16(4.f, 1), 0x6000);
  EXPECT_EQ(f32_to_posit16(0.5f, 1), 0x3000);
  EXPECT_EQ(f32_to_posit16(1.5f, 1), 0x4800);
  EXPECT_EQ(f32_to_posit16(16.f, 2), 0x6000);
  EXPECT_EQ(posit16_to_f32(0x7FFF, 1), 0x1p28f);
  EXPECT_EQ(posit16_to_f32(0x0001, 1), 0x1p-28f);
  EXPECT_EQ(posit16_to_f32(0x7FFF, 2), 0x1p56f);
  EXPECT_EQ(posit16_to_f32(0x0001, 2), 0x1p-56f);
  EXPECT_EQ(posit16_to_f32(0xFFFF, 1), -0x1p-28f);
  // Zero, NaR.
  EXPECT_EQ(f32_to_posit16(0.f, 1), 0);
  EXPECT_EQ(f32_to_posit16(-0.f, 1), 0);
  EXPECT_EQ(f32_to_posit16(std::numeric_limits<float>::quiet_NaN(), 1), 0x8000);
  EXPECT_EQ(f32_to_posit16(-INFINITY, 2), 0x8000);
  EXPECT_TRUE(std::isnan(posit16_to_f32(0x8000, 1)));
}

TEST(Posit16, EveryCodeRoundTripsInOrder) {
  for (int es : {1, 2}) {
    float prev = -INFINITY;
    for (int c = -32767; c <= 32767; ++c) {  // as signed 16-bit integers, posits are ordered
      const uint16_t p = uint16_t(c);
      const float v = posit16_to_f32(p, es);
      ASSERT_TRUE(std::isfinite(v)) << c;
      ASSERT_GT(v, prev) << "es " << es << " code " << c;
      ASSERT_EQ(f32_to_posit16(v, es), p) << "es " << es << " code " << c;
      prev = v;
    }
  }
}

TEST(Posit16, RoundsToTheNearestEvenStringAndNeverToZeroOrPastMaxpos) {
  // Near 1 (es 1, 12 fraction bits): ties between 1 and 1 + 2^-12 go to 1; between 1 + 2^-12
  // and 1 + 2^-11 to the latter.
  EXPECT_EQ(round_posit16(1.f + 0x1p-13f, 1), 1.f);
  EXPECT_EQ(round_posit16(1.f + 3 * 0x1p-13f, 1), 1.f + 0x1p-11f);
  EXPECT_EQ(round_posit16(std::nextafter(1.f + 0x1p-13f, 2.f), 1), 1.f + 0x1p-12f);
  // Where the regime leaves no exponent bit, the neighbours 2^26 (0x7FFE) and 2^28 (0x7FFF) tie
  // at the string 0x7FFE followed by a one: 2^27, which goes to the even 2^26.
  EXPECT_EQ(round_posit16(0x1p27f, 1), 0x1p26f);
  EXPECT_EQ(round_posit16(0x1p27f * 1.01f, 1), 0x1p28f);
  EXPECT_EQ(round_posit16(0x1p-27f, 1), 0x1p-26f);  // the mirror tie: between 2^-28 (odd) and 2^-26
  // Saturation at both ends; FP32 subnormals become minpos.
  EXPECT_EQ(round_posit16(1e30f, 1), 0x1p28f);
  EXPECT_EQ(round_posit16(-1e30f, 2), -0x1p56f);
  EXPECT_EQ(round_posit16(1e-30f, 1), 0x1p-28f);
  EXPECT_EQ(round_posit16(-std::numeric_limits<float>::denorm_min(), 2), -0x1p-56f);
}

class PositIsa : public ::testing::TestWithParam<const char*> {};

TEST_P(PositIsa, KernelBitIdenticalToSpecification) {
  if (!detect_cpu_features().supports(parse_isa(GetParam(), "test"))) GTEST_SKIP() << "CPU lacks " << GetParam();
  Context c(ContextOptions{.threads = 1, .isa = GetParam()});
  const simd::KernelTable& k = c.kernels();
  for (int es : {1, 2}) {
    // Every code, every midpoint between neighbours and a nudge either side, random floats over
    // the whole range, specials.
    std::vector<float> x;
    for (int code = -32767; code < 32767; ++code) {
      const float a = posit16_to_f32(uint16_t(code), es), b = posit16_to_f32(uint16_t(code + 1), es);
      const float mid = float((double(a) + double(b)) / 2), geo = std::sqrt(std::fabs(a * b)) * (a < 0 ? -1.f : 1.f);
      x.insert(x.end(), {a, mid, std::nextafter(mid, INFINITY), std::nextafter(mid, -INFINITY), geo});
    }
    std::mt19937 rng(5);
    for (int i = 0; i < 100000; ++i) x.push_back(std::bit_cast<float>(uint32_t(rng())));
    for (float s : {0.f, -0.f, INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::denorm_min(), 3.4e38f, -1.17e-38f})
      x.push_back(s);
    x.push_back(1.f);  // odd length: tails
    const size_t n = x.size();
    std::vector<float> want(n), got(n);
    simd::ref::round_posit16(x.data(), want.data(), n, es);
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(want[i]), std::bit_cast<uint32_t>(round_posit16(x[i], es))) << i;
    k.round_posit16.fn(x.data(), got.data(), n, es);
    size_t bad = 0;
    while (bad < n && std::bit_cast<uint32_t>(want[bad]) == std::bit_cast<uint32_t>(got[bad])) ++bad;
    ASSERT_EQ(bad, n) << k.round_posit16.name << " es " << es << ": x " << std::hexfloat << x[bad] << " want "
                      << want[bad] << " got " << got[bad];
    std::vector<float> inplace = x;
    k.round_posit16.fn(inplace.data(), inplace.data(), n, es);
    ASSERT_EQ(0, std::memcmp(want.data(), inplace.data(), n * 4));
  }
}

INSTANTIATE_TEST_SUITE_P(AllLevels, PositIsa, ::testing::ValuesIn(test::isa_names_from(Isa::ref)));
