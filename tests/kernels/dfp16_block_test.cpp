// Block DFP: dfp16_round_block (a block rounded as a DFP16 tensor of its own) against the INT16
// quantizer and hand-computed cases (saturation, ties, biased rounding, subnormal and huge blocks,
// zeros, non-finite values), and the block kernels bit-identical to it at every level.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/dfp16.hpp"
#include "simd/kernel_table.hpp"
#include "tests/common/isa_levels.hpp"

using namespace dfp;

namespace {

// What a block should hold, in double arithmetic written from the format's definition: i =
// round(x / 2^e) (nearest even or biased), saturated to +-32767, then i * 2^e rounded to FP32.
std::vector<float> expected_block(const std::vector<float>& x, int headroom, Rounding r, int* exponent) {
  double amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(double(v)));
  const int e = amax > 0 ? int(std::floor(std::log2(amax))) - 14 + headroom : 0;
  *exponent = e;
  std::vector<float> out;
  for (float v : x) {
    const double y = std::ldexp(double(v), -e);
    double i;
    if (r == Rounding::biased) {
      const double a = std::fabs(y), fl = std::floor(a);
      i = std::copysign(a - fl >= 0.25 ? fl + 1 : fl, y);
    } else {
      i = std::nearbyint(y);
    }
    i = std::clamp(i, -32767.0, 32767.0) + 0.0;  // an integer: no -0
    out.push_back(float(std::ldexp(i, e)));
  }
  return out;
}

void expect_bits(const std::vector<float>& want, const std::vector<float>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(want[i]), std::bit_cast<uint32_t>(got[i]))
        << what << " element " << i << ": want " << want[i] << " got " << got[i];
}

}  // namespace

TEST(Dfp16Block, BlockIsTheQuantizersTensorOfItsOwn) {
  // A block holds exactly what quantize_dfp16 + dequantize_dfp16 give for it alone.
  Context ctx(ContextOptions{.threads = 1, .isa = "ref"});
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (int headroom : {0, 1, 2, 5, 8})
    for (Rounding r : {Rounding::nearest_even, Rounding::biased})
      for (int scale : {-140, -60, -3, 0, 7, 100}) {
        std::vector<float> x(64);
        for (float& v : x) v = normal(rng) * std::ldexp(1.f, scale + int(rng() % 16) - 8);
        QuantOptions o;
        o.headroom = headroom;
        o.rounding = r;
        std::vector<int16_t> q(x.size());
        const QuantStats s = quantize_dfp16(ctx, x.data(), q.data(), x.size(), o);
        std::vector<float> want(x.size()), got(x.size());
        dequantize_dfp16(ctx, q.data(), s.exponent, want.data(), x.size());
        EXPECT_EQ(s.exponent, dfp16_round_block(x.data(), got.data(), x.size(), 1, headroom, r));
        expect_bits(want, got, "headroom " + std::to_string(headroom) + " scale " + std::to_string(scale));
        int e = 0;
        expect_bits(expected_block(x, headroom, r, &e), got, "double arithmetic");
        EXPECT_EQ(e, s.exponent);
      }
}

TEST(Dfp16Block, HandComputedCases) {
  std::vector<float> out(4);
  // Headroom 2: max 1.0 -> e = -12, one unit is 2^-12; 2^-13 is a tie (to even: 0), 3 * 2^-13 a
  // tie to 2 units; below half a unit rounds to zero.
  const float a[4] = {1.f, 0x1p-13f, 3 * 0x1p-13f, 0x1.fffffep-14f};
  EXPECT_EQ(-12, dfp16_round_block(a, out.data(), 4, 1, 2, Rounding::nearest_even));
  EXPECT_EQ(out, (std::vector<float>{1.f, 0.f, 0x1p-11f, 0.f}));
  // Biased: a quarter unit and up rounds the magnitude up, signs kept.
  const float b[4] = {1.f, -0x1p-14f, 0x1.fffffep-15f, -0.f};
  EXPECT_EQ(-12, dfp16_round_block(b, out.data(), 4, 1, 2, Rounding::biased));
  EXPECT_EQ(out, (std::vector<float>{1.f, -0x1p-12f, 0.f, 0.f}));
  EXPECT_FALSE(std::signbit(out[3]));  // integers have no -0
  // Headroom 0: a maximum just below 2 rounds to 32768 units and saturates at 32767.
  const float c[2] = {0x1.fffffep0f, -0x1.fffffep0f};
  EXPECT_EQ(-14, dfp16_round_block(c, out.data(), 2, 1, 0, Rounding::nearest_even));
  EXPECT_EQ(out[0], 32767 * 0x1p-14f);
  EXPECT_EQ(out[1], -32767 * 0x1p-14f);
  // Subnormal blocks. Headroom 2: e = ilogb(2^-140) - 14 + 2 = -152, below the smallest
  // subnormal: every input (a multiple of 2^-149) is a whole number of units and comes back as it
  // was. Headroom 8: e = -146, a unit is 8 * 2^-149, so 3 * 2^-149 rounds to 0 and 5 * 2^-149 to
  // one unit.
  const float d[3] = {0x1p-140f, 3 * 0x1p-149f, -0x1p-149f};
  EXPECT_EQ(-152, dfp16_round_block(d, out.data(), 3, 1, 2, Rounding::nearest_even));
  EXPECT_EQ(out[0], 0x1p-140f);
  EXPECT_EQ(out[1], 3 * 0x1p-149f);
  EXPECT_EQ(out[2], -0x1p-149f);
  const float d8[3] = {0x1p-140f, 3 * 0x1p-149f, 5 * 0x1p-149f};
  EXPECT_EQ(-146, dfp16_round_block(d8, out.data(), 3, 1, 8, Rounding::nearest_even));
  EXPECT_EQ(out[0], 0x1p-140f);
  EXPECT_EQ(out[1], 0.f);
  EXPECT_EQ(out[2], 0x1p-146f);
  // The largest floats: e = 127 - 12 = 115.
  const float f[2] = {3e38f, 1e30f};
  EXPECT_EQ(115, dfp16_round_block(f, out.data(), 2, 1, 2, Rounding::nearest_even));
  EXPECT_EQ(out[0], std::ldexp(std::nearbyint(std::ldexp(3e38f, -115)), 115));
  // A block of zeros (+0 out, as the quantizer's integers); a non-finite value makes the block NaN.
  const float z[2] = {0.f, -0.f};
  EXPECT_EQ(kDfpBlockZero, dfp16_round_block(z, out.data(), 2, 1, 2, Rounding::nearest_even));
  EXPECT_FALSE(std::signbit(out[0]));
  EXPECT_FALSE(std::signbit(out[1]));
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY}) {
    const float n[3] = {1.f, bad, 2.f};
    EXPECT_EQ(kDfpBlockNonFinite, dfp16_round_block(n, out.data(), 3, 1, 2, Rounding::nearest_even));
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(std::isnan(out[i]));
  }
  // A stride: only every third element belongs to the block.
  const float s[7] = {1.f, 99.f, 99.f, 0x1p-14f, 99.f, 99.f, 3.f};
  float t[7] = {};
  EXPECT_EQ(-11, dfp16_round_block(s, t, 3, 3, 2, Rounding::nearest_even));  // max 3: ilogb 1
  EXPECT_EQ(t[0], 1.f);
  EXPECT_EQ(t[3], 0.f);  // an eighth of a unit
  EXPECT_EQ(t[6], 3.f);
  EXPECT_EQ(t[1], 0.f);  // untouched
}

class Dfp16BlockIsa : public ::testing::TestWithParam<const char*> {};

TEST_P(Dfp16BlockIsa, BlockKernelsBitIdenticalToSpecification) {
  if (!detect_cpu_features().supports(parse_isa(GetParam(), "test"))) GTEST_SKIP() << "CPU lacks " << GetParam();
  Context c(ContextOptions{.threads = 1, .isa = GetParam()});
  const simd::KernelTable& k = c.kernels();
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.f, 1.f);
  // Regions of very different magnitude (subnormal blocks to the largest floats), zeros, ties and
  // a few non-finite values.
  auto data = [&](size_t n, size_t region) {
    std::vector<float> v(n);
    int scale = 0;
    for (size_t i = 0; i < n; ++i) {
      if (i % region == 0) scale = int(rng() % 260) - 150;
      v[i] = normal(rng) * std::ldexp(1.f, std::min(scale + int(rng() % 12) - 6, 120));
    }
    for (size_t i = 0; i < n; i += 97) v[i] = 0.f;
    for (size_t i = 3; i < n; i += 113) v[i] = std::ldexp(std::nearbyint(std::ldexp(v[i], 8)) + 0.5f, -8);
    for (size_t i = 5; i < n; i += 331) v[i] = std::bit_cast<float>(uint32_t(rng()));
    if (n > 600) {
      v[n / 3] = std::numeric_limits<float>::quiet_NaN();
      v[n / 2] = -INFINITY;
      for (size_t i = n - 200; i < n - 100; ++i) v[i] = 0.f;  // whole blocks of zeros
    }
    return v;
  };
  for (Rounding r : {Rounding::nearest_even, Rounding::biased})
    for (int headroom : {0, 2, 8}) {
      SCOPED_TRACE(std::string(rounding_name(r)) + " headroom " + std::to_string(headroom));
      for (size_t planes = 1; planes <= 8; ++planes) {
        const size_t pixels = 37;
        const std::vector<float> x = data(planes * pixels * 16, 16 * 5);
        std::vector<float> want(x.size()), got(x.size()), inplace = x;
        int lo0 = 1000, hi0 = -1000, lo1 = 1000, hi1 = -1000, lo2 = 1000, hi2 = -1000;
        simd::ref::dfp16_lanes(x.data(), want.data(), planes, pixels, headroom, r, &lo0, &hi0);
        k.dfp16_lanes.fn(x.data(), got.data(), planes, pixels, headroom, r, &lo1, &hi1);
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4)) << k.dfp16_lanes.name << " planes " << planes;
        k.dfp16_lanes.fn(inplace.data(), inplace.data(), planes, pixels, headroom, r, &lo2, &hi2);
        ASSERT_EQ(0, std::memcmp(want.data(), inplace.data(), want.size() * 4)) << "in place";
        EXPECT_EQ(lo0, lo1);
        EXPECT_EQ(hi0, hi1);
        EXPECT_LT(lo0, hi0);
      }
      for (auto [rows, lanes, stride, block] :
           {std::tuple<size_t, size_t, size_t, size_t>{100, 16, 16, 32}, {64, 9, 9, 64}, {300, 37, 40, 128},
            {5, 3, 3, 32}, {129, 24, 24, 128}, {70, 16, 640, 64}}) {
        const std::vector<float> x = data(rows * stride, 7 * stride);
        std::vector<float> want = x, got = x;  // the gaps between rows stay as they are
        int lo0 = 1000, hi0 = -1000, lo1 = 1000, hi1 = -1000;
        simd::ref::dfp16_rows(x.data(), want.data(), rows, lanes, stride, block, headroom, r, &lo0, &hi0);
        k.dfp16_rows.fn(x.data(), got.data(), rows, lanes, stride, block, headroom, r, &lo1, &hi1);
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4))
            << k.dfp16_rows.name << " " << rows << "x" << lanes << " block " << block;
        EXPECT_EQ(lo0, lo1);
        EXPECT_EQ(hi0, hi1);
        std::vector<float> inplace = x;
        k.dfp16_rows.fn(inplace.data(), inplace.data(), rows, lanes, stride, block, headroom, r, &lo1, &hi1);
        ASSERT_EQ(0, std::memcmp(want.data(), inplace.data(), want.size() * 4));
      }
    }
}

INSTANTIATE_TEST_SUITE_P(AllLevels, Dfp16BlockIsa, ::testing::ValuesIn(test::isa_names_from(Isa::ref)));
