// FP8 (OFP8 e4m3, e5m2): every code against the specification's values, rounding on ties, overflow
// in both modes, subnormals and underflow, NaN, stochastic rounding's unbiasedness, the per-tensor
// scale exponent, and the kernels bit-identical to the scalar specification at every level.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/float8.hpp"
#include "simd/kernel_table.hpp"
#include "tests/common/isa_levels.hpp"

using namespace dfp;

namespace {
// Independent decoders written from the OFP8 specification's tables (not from the code under test).
double e4m3_value(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  const double sign = s ? -1.0 : 1.0;
  if (e == 15 && m == 7) return std::nan("");
  if (e == 0) return sign * std::ldexp(double(m), -9);  // m/8 * 2^-6
  return sign * std::ldexp(1.0 + m / 8.0, e - 7);
}
double e5m2_value(uint8_t c) {
  const int s = c >> 7, e = (c >> 2) & 31, m = c & 3;
  const double sign = s ? -1.0 : 1.0;
  if (e == 31) return m ? std::nan("") : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(double(m), -16);  // m/4 * 2^-14
  return sign * std::ldexp(1.0 + m / 4.0, e - 15);
}
double value(uint8_t c, FloatFormat f) { return f == FloatFormat::e4m3 ? e4m3_value(c) : e5m2_value(c); }
constexpr FloatFormat kFormats[] = {FloatFormat::e4m3, FloatFormat::e5m2};
}  // namespace

TEST(Float8, EveryCodeDecodesToTheSpecificationsValue) {
  for (FloatFormat f : kFormats) {
    for (int c = 0; c < 256; ++c) {
      const double want = value(uint8_t(c), f);
      const float got = float8_to_f32(uint8_t(c), f);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << float_format_name(f) << " code " << c;
        EXPECT_EQ(std::bit_cast<uint32_t>(got), (c & 0x80 ? 0xFFC00000u : 0x7FC00000u));
      } else {
        EXPECT_EQ(double(got), want) << float_format_name(f) << " code " << c;
        EXPECT_EQ(std::signbit(got), c >= 0x80);
      }
    }
  }
  // The table's landmarks.
  EXPECT_EQ(float8_to_f32(0x7E, FloatFormat::e4m3), 448.f);
  EXPECT_EQ(float8_to_f32(0x08, FloatFormat::e4m3), 0x1p-6f);
  EXPECT_EQ(float8_to_f32(0x01, FloatFormat::e4m3), 0x1p-9f);
  EXPECT_EQ(float8_to_f32(0x7B, FloatFormat::e5m2), 57344.f);
  EXPECT_EQ(float8_to_f32(0x04, FloatFormat::e5m2), 0x1p-14f);
  EXPECT_EQ(float8_to_f32(0x01, FloatFormat::e5m2), 0x1p-16f);
  EXPECT_EQ(float8_to_f32(0xFC, FloatFormat::e5m2), -INFINITY);
  EXPECT_EQ(float8_info(FloatFormat::e4m3)->max_finite, 448.f);
  EXPECT_EQ(float8_info(FloatFormat::e5m2)->max_finite, 57344.f);
  EXPECT_EQ(float8_info(FloatFormat::fp16), nullptr);
}

TEST(Float8, RoundsToNearestWithTiesToTheEvenCode) {
  for (FloatFormat f : kFormats) {
    const uint8_t max_code = float8_info(f)->max_code;
    for (int c = 0; c <= max_code; ++c) {
      for (int sign : {0, 0x80}) {
        const uint8_t code = uint8_t(c | sign);
        const float v = float8_to_f32(code, f);
        for (Overflow o : {Overflow::saturate, Overflow::nonfinite})
          ASSERT_EQ(f32_to_float8(v, f, o), code) << float_format_name(f) << " round trip of code " << int(code);
        if (c == max_code) continue;
        // The midpoint to the next code up (exact in FP32) and a nudge either side.
        const float next = float8_to_f32(uint8_t((c + 1) | sign), f);
        const float mid = float((double(v) + double(next)) / 2);
        const uint8_t even = (c & 1) ? uint8_t((c + 1) | sign) : code;
        EXPECT_EQ(f32_to_float8(mid, f, Overflow::saturate), even) << float_format_name(f) << " tie above code " << c;
        EXPECT_EQ(f32_to_float8(std::nextafter(mid, 0.f), f, Overflow::saturate), code);
        EXPECT_EQ(f32_to_float8(std::nextafter(mid, sign ? -INFINITY : INFINITY), f, Overflow::saturate),
                  uint8_t((c + 1) | sign));
      }
    }
  }
}

TEST(Float8, OverflowSaturatesOrGoesNonFiniteAsTheModeSays) {
  const auto e4 = FloatFormat::e4m3, e5 = FloatFormat::e5m2;
  const auto sat = Overflow::saturate, nf = Overflow::nonfinite;
  // e4m3: 464 lies halfway between 448 (even) and the missing 480: it rounds to 448.
  EXPECT_EQ(f32_to_float8(464.f, e4, nf), 0x7E);
  EXPECT_EQ(f32_to_float8(std::nextafter(464.f, INFINITY), e4, nf), 0x7F);  // NaN: e4m3 has no inf
  EXPECT_EQ(f32_to_float8(std::nextafter(464.f, INFINITY), e4, sat), 0x7E);
  EXPECT_EQ(f32_to_float8(-1e30f, e4, sat), 0xFE);
  EXPECT_EQ(f32_to_float8(-1e30f, e4, nf), 0xFF);
  EXPECT_EQ(f32_to_float8(INFINITY, e4, sat), 0x7E);
  EXPECT_EQ(f32_to_float8(-INFINITY, e4, nf), 0xFF);
  // e5m2, IEEE: |x| >= 61440 (halfway to 65536, which is even) overflows.
  EXPECT_EQ(f32_to_float8(std::nextafter(61440.f, 0.f), e5, nf), 0x7B);
  EXPECT_EQ(f32_to_float8(61440.f, e5, nf), 0x7C);
  EXPECT_EQ(f32_to_float8(61440.f, e5, sat), 0x7B);
  EXPECT_EQ(f32_to_float8(-INFINITY, e5, nf), 0xFC);
  EXPECT_EQ(f32_to_float8(-INFINITY, e5, sat), 0xFB);
  // NaN stays NaN, with its sign, in both modes.
  for (Overflow o : {sat, nf}) {
    EXPECT_EQ(f32_to_float8(std::numeric_limits<float>::quiet_NaN(), e4, o), 0x7F);
    EXPECT_EQ(f32_to_float8(-std::numeric_limits<float>::quiet_NaN(), e4, o), 0xFF);
    EXPECT_EQ(f32_to_float8(std::bit_cast<float>(0x7F800001u), e5, o), 0x7E);
  }
}

TEST(Float8, SubnormalsAndUnderflow) {
  const auto e4 = FloatFormat::e4m3, e5 = FloatFormat::e5m2;
  // Half the smallest subnormal ties to the even code, zero; anything above rounds up to it.
  EXPECT_EQ(f32_to_float8(0x1p-10f, e4, Overflow::saturate), 0x00);
  EXPECT_EQ(f32_to_float8(std::nextafter(0x1p-10f, 1.f), e4, Overflow::saturate), 0x01);
  EXPECT_EQ(f32_to_float8(-0x1p-10f, e4, Overflow::saturate), 0x80);  // -0
  EXPECT_EQ(f32_to_float8(3 * 0x1p-10f, e4, Overflow::saturate), 0x02);  // 1.5 gaps: to the even 2
  EXPECT_EQ(f32_to_float8(0x1p-17f, e5, Overflow::saturate), 0x00);
  EXPECT_EQ(f32_to_float8(0x1.8p-17f, e5, Overflow::saturate), 0x01);
  // The largest subnormal rounds up into the smallest normal.
  EXPECT_EQ(f32_to_float8(0x1.ep-7f, e4, Overflow::saturate), 0x08);  // 7.5/8 * 2^-6 -> tie to 8/8 (even)
  // FP32 subnormals and zeros.
  EXPECT_EQ(f32_to_float8(std::numeric_limits<float>::denorm_min(), e5, Overflow::saturate), 0x00);
  EXPECT_EQ(f32_to_float8(-0.f, e5, Overflow::saturate), 0x80);
}

TEST(Float8, StochasticRoundingIsUnbiased) {
  // 1 + 1/32 in e4m3 lies a quarter of the way from 1 to 1.125: a sweep of every 16th 24-bit
  // random number rounds up exactly a quarter of the time.
  for (FloatFormat f : kFormats) {
    const float lo = 1.f, gap = f == FloatFormat::e4m3 ? 0.125f : 0.25f, x = lo + gap / 4;
    int up = 0, n = 0;
    for (uint32_t r = 0; r < (1u << 24); r += 16, ++n) {
      const float q = float8_to_f32(f32_to_float8_stochastic(x, f, Overflow::saturate, r), f);
      ASSERT_TRUE(q == lo || q == lo + gap);
      up += q != lo;
    }
    EXPECT_EQ(up * 4, n) << float_format_name(f);
    // Representable values never move; the sign is kept.
    EXPECT_EQ(f32_to_float8_stochastic(-1.5f, f, Overflow::saturate, 0xFFFFFF), f32_to_float8(-1.5f, f, Overflow::saturate));
  }
}

TEST(Float8, ScaleExponentPutsTheTensorsMaximumInRange) {
  const auto e4 = FloatFormat::e4m3, e5 = FloatFormat::e5m2;
  EXPECT_EQ(float8_scale_exponent(448.f, e4, 0), 0);
  EXPECT_EQ(float8_scale_exponent(449.f, e4, 0), -1);
  EXPECT_EQ(float8_scale_exponent(1.f, e4, 0), 8);    // 256 <= 448 < 512
  EXPECT_EQ(float8_scale_exponent(1.75f, e4, 0), 8);  // 448 exactly
  EXPECT_EQ(float8_scale_exponent(1.76f, e4, 0), 7);
  EXPECT_EQ(float8_scale_exponent(1.f, e4, 2), 6);    // margin
  EXPECT_EQ(float8_scale_exponent(1.f, e5, 0), 15);
  EXPECT_EQ(float8_scale_exponent(0.f, e4, 0), 0);
  EXPECT_EQ(float8_scale_exponent(INFINITY, e4, 0), 0);
  EXPECT_EQ(float8_scale_exponent(1e-40f, e4, 0), kFloat8MaxScaleExp);
  EXPECT_EQ(float8_scale_exponent(3e38f, e5, 0), -113);
  // Rounding at the scale: the maximum lands on 448 exactly.
  EXPECT_EQ(round_float8(0.4375f, e4, Overflow::saturate, float8_scale_exponent(0.4375f, e4, 0),
                         Rounding::nearest_even, 0),
            0.4375f);
}

TEST(Float8, MeasureCountsSaturatedElementsAsOverflow) {
  const std::vector<float> x = {1.f, 500.f, -1e6f, 1e-5f, 0.f};
  std::vector<float> q(x.size());
  for (size_t i = 0; i < x.size(); ++i) q[i] = round_float8(x[i], FloatFormat::e4m3, Overflow::saturate, 0, Rounding::nearest_even, 0);
  const FormatStats s = measure_float8_rounding(x.data(), q.data(), x.size(), FloatFormat::e4m3, 0);
  EXPECT_EQ(s.overflow, 2u);
  EXPECT_EQ(s.underflow, 1u);  // 1e-5 < 2^-10
  EXPECT_EQ(s.nonzero, 4u);
}

class Float8Isa : public ::testing::TestWithParam<const char*> {};

TEST_P(Float8Isa, KernelBitIdenticalToSpecification) {
  if (!detect_cpu_features().supports(parse_isa(GetParam(), "test"))) GTEST_SKIP() << "CPU lacks " << GetParam();
  Context c(ContextOptions{.threads = 1, .isa = GetParam()});
  const simd::KernelTable& k = c.kernels();
  for (FloatFormat f : kFormats) {
    // Every code, every midpoint and a nudge either side, specials, random floats over the whole
    // range and over the format's own range.
    std::vector<float> x;
    for (int code = 0; code < 256; ++code) {
      const float a = float8_to_f32(uint8_t(code), f), b = float8_to_f32(uint8_t(code + 1), f);
      x.push_back(a);
      if (std::isfinite(a) && std::isfinite(b) && code != 0x7F && code != 0xFF) {
        const float mid = float((double(a) + double(b)) / 2);
        x.insert(x.end(), {mid, std::nextafter(mid, INFINITY), std::nextafter(mid, -INFINITY)});
      }
    }
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (int i = 0; i < 20000; ++i) x.push_back(std::bit_cast<float>(uint32_t(rng())));
    for (int i = 0; i < 20000; ++i) x.push_back(normal(rng) * std::ldexp(1.f, int(rng() % 40) - 20));
    for (float s : {0.f, -0.f, INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN(),
                    std::bit_cast<float>(0x7F800001u), std::bit_cast<float>(0xFFC12345u),
                    std::numeric_limits<float>::denorm_min(), 464.f, 61440.f, 3.4e38f})
      x.push_back(s);
    x.push_back(1.f);  // odd length: masked tails
    const size_t n = x.size();
    std::vector<float> want(n), got(n);
    for (Overflow o : {Overflow::saturate, Overflow::nonfinite}) {
      for (int s : {0, 5, -7, 20, kFloat8MaxScaleExp, -kFloat8MaxScaleExp}) {
        for (Rounding r : {Rounding::nearest_even, Rounding::stochastic}) {
          const float m0 = simd::ref::round_fp8(x.data(), want.data(), n, f, o, s, r, 9, 13);
          const float m1 = k.round_fp8.fn(x.data(), got.data(), n, f, o, s, r, 9, 13);
          size_t bad = 0;
          while (bad < n && std::bit_cast<uint32_t>(want[bad]) == std::bit_cast<uint32_t>(got[bad])) ++bad;
          ASSERT_EQ(bad, n) << "x " << std::hexfloat << x[bad] << " want " << want[bad] << " got " << got[bad] << " "
              << k.round_fp8.name << " " << float_format_name(f) << " " << overflow_name(o) << " scale 2^" << s << " "
              << rounding_name(r);
          ASSERT_EQ(m0, m1);
          for (size_t i = 0; i < n && r == Rounding::nearest_even; ++i)
            ASSERT_EQ(std::bit_cast<uint32_t>(want[i]),
                      std::bit_cast<uint32_t>(round_float8(x[i], f, o, s, Rounding::nearest_even, 0)))
                << i;
          // In place.
          std::vector<float> inplace = x;
          k.round_fp8.fn(inplace.data(), inplace.data(), n, f, o, s, r, 9, 13);
          ASSERT_EQ(0, std::memcmp(want.data(), inplace.data(), n * 4));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllLevels, Float8Isa, ::testing::ValuesIn(test::isa_names_from(Isa::ref)));

// ---- The OCP Microscaling element formats and blocks ----------------------------------------------

TEST(Mx, ElementFormatsHoldTheSpecificationsValues) {
  struct Row {
    FloatFormat f;
    float max, min_subnormal;
    int emax, codes;
  };
  // OCP MX v1.0, tables of the FP6/FP4 element formats; MXINT8: k/64, |k| <= 127.
  for (const Row& r : {Row{FloatFormat::e3m2, 28.f, 0.0625f, 4, 64}, Row{FloatFormat::e2m3, 7.5f, 0.125f, 2, 64},
                       Row{FloatFormat::e2m1, 6.f, 0.5f, 2, 16}, Row{FloatFormat::int8, 127.f / 64, 1.f / 64, 0, 256},
                       Row{FloatFormat::e4m3, 448.f, 0x1p-9f, 8, 256}, Row{FloatFormat::e5m2, 57344.f, 0x1p-16f, 15, 256}}) {
    SCOPED_TRACE(float_format_name(r.f));
    const Float8Info& i = *float8_info(r.f);
    EXPECT_EQ(i.max_finite, r.max);
    EXPECT_EQ(float8_to_f32(i.max_code, r.f), r.max);
    EXPECT_EQ(float8_to_f32(1, r.f), r.min_subnormal);
    EXPECT_EQ(i.max_exponent(), r.emax);
    // Every code of a saturating format is finite, and round trips; a larger value saturates.
    const int half = r.codes / 2;
    for (int c = 0; c < half && !i.nonfinite; ++c) {
      const float v = float8_to_f32(uint8_t(c), r.f);
      ASSERT_TRUE(std::isfinite(v));
      ASSERT_EQ(f32_to_float8(v, r.f, Overflow::nonfinite), c);
      ASSERT_EQ(float8_to_f32(uint8_t(c | 0x80), r.f), -v);
    }
    if (!i.nonfinite) {
      EXPECT_EQ(f32_to_float8(1e30f, r.f, Overflow::nonfinite), i.max_code);  // no infinity to go to
      EXPECT_EQ(f32_to_float8(-INFINITY, r.f, Overflow::nonfinite), 0x80 | i.max_code);
      EXPECT_TRUE(std::isnan(round_float8(std::nanf(""), r.f, Overflow::saturate, 0, Rounding::nearest_even, 0)));
    }
  }
  // FP4's eight magnitudes, and MXINT8's grid with ties to even.
  const float e2m1[] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 8; ++c) EXPECT_EQ(float8_to_f32(uint8_t(c), FloatFormat::e2m1), e2m1[c]);
  EXPECT_EQ(round_float8(2.5f, FloatFormat::e2m1, Overflow::saturate, 0, Rounding::nearest_even, 0), 2.f);
  EXPECT_EQ(round_float8(5.f, FloatFormat::e2m1, Overflow::saturate, 0, Rounding::nearest_even, 0), 4.f);
  EXPECT_EQ(round_float8(1.5f / 64, FloatFormat::int8, Overflow::saturate, 0, Rounding::nearest_even, 0), 2.f / 64);
  EXPECT_EQ(round_float8(2.5f / 64, FloatFormat::int8, Overflow::saturate, 0, Rounding::nearest_even, 0), 2.f / 64);
  EXPECT_EQ(round_float8(-1.99f, FloatFormat::int8, Overflow::saturate, 0, Rounding::nearest_even, 0), -127.f / 64);
}

TEST(Mx, BlockScaleAndConversionFollowTheSpecification) {
  // X = floor(log2 max|v|) - emax; the elements are v / 2^X rounded and saturated.
  EXPECT_EQ(mx_scale_exponent(448.f, FloatFormat::e4m3), 0);
  EXPECT_EQ(mx_scale_exponent(511.f, FloatFormat::e4m3), 0);
  EXPECT_EQ(mx_scale_exponent(1.f, FloatFormat::e4m3), -8);
  EXPECT_EQ(mx_scale_exponent(1.f, FloatFormat::int8), 0);
  EXPECT_EQ(mx_scale_exponent(3.f, FloatFormat::e2m1), -1);
  EXPECT_EQ(mx_scale_exponent(0.f, FloatFormat::e2m1), -kFloat8MaxScaleExp);
  EXPECT_EQ(mx_scale_exponent(1e-40f, FloatFormat::e5m2), -kFloat8MaxScaleExp);
  EXPECT_EQ(mx_scale_exponent(3e38f, FloatFormat::int8), kFloat8MaxScaleExp);
  {
    const float v[] = {1.f, 0.5f, 3.f, -0.2f};
    float q[4];
    EXPECT_EQ(mx_round_block(v, q, 4, 1, FloatFormat::e2m1), -1);  // v * 2 on FP4's grid: 2, 1, 6, -0.4 -> -0.5
    EXPECT_EQ(q[0], 1.f);
    EXPECT_EQ(q[1], 0.5f);
    EXPECT_EQ(q[2], 3.f);
    EXPECT_EQ(q[3], -0.25f);
  }
  {
    // The block's largest value lands in the top binade and saturates above the format's largest
    // value: 500 with X = 0 becomes 448 (the spec's clipping).
    const float v[] = {500.f, 1.f, 0.f};
    float q[3];
    EXPECT_EQ(mx_round_block(v, q, 3, 1, FloatFormat::e4m3), 0);
    EXPECT_EQ(q[0], 448.f);
    EXPECT_EQ(q[1], 1.f);
    EXPECT_EQ(q[2], 0.f);
  }
  {
    // A strided block, and a NaN or an infinity makes the whole block NaN.
    float v[] = {1.f, 9.f, INFINITY, 9.f, 2.f, 9.f};
    EXPECT_EQ(mx_round_block(v, v, 3, 2, FloatFormat::e3m2), kMxNanScale);
    EXPECT_TRUE(std::isnan(v[0]) && std::isnan(v[2]) && std::isnan(v[4]));
    EXPECT_EQ(v[1], 9.f);
  }
}

class MxIsa : public ::testing::TestWithParam<const char*> {};

TEST_P(MxIsa, BlockKernelsBitIdenticalToSpecification) {
  if (!detect_cpu_features().supports(parse_isa(GetParam(), "test"))) GTEST_SKIP() << "CPU lacks " << GetParam();
  Context c(ContextOptions{.threads = 1, .isa = GetParam()});
  const simd::KernelTable& k = c.kernels();
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto data = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng) * std::ldexp(1.f, int(rng() % 24) - 12);
    // Blocks of very different magnitude, zeros, ties of the grid, and a few non-finite values.
    for (size_t i = 0; i < n; i += 97) v[i] = 0.f;
    for (size_t i = 5; i < n; i += 331) v[i] = std::bit_cast<float>(uint32_t(rng()));
    v[n / 3] = std::numeric_limits<float>::quiet_NaN();
    v[n / 2] = -INFINITY;
    return v;
  };
  for (FloatFormat f : {FloatFormat::e4m3, FloatFormat::e5m2, FloatFormat::e3m2, FloatFormat::e2m3, FloatFormat::e2m1,
                        FloatFormat::int8}) {
    SCOPED_TRACE(float_format_name(f));
    for (bool pair : {true, false}) {
      const size_t pixels = 77;
      const std::vector<float> a = data(pixels * 16), b = data(pixels * 16);
      std::vector<float> wa(a.size()), wb(b.size()), ga(a.size()), gb(b.size());
      int lo0 = 1000, hi0 = -1000, lo1 = 1000, hi1 = -1000;
      simd::ref::mx_lanes(a.data(), pair ? b.data() : nullptr, wa.data(), wb.data(), pixels, f, &lo0, &hi0);
      k.mx_lanes.fn(a.data(), pair ? b.data() : nullptr, ga.data(), gb.data(), pixels, f, &lo1, &hi1);
      ASSERT_EQ(0, std::memcmp(wa.data(), ga.data(), wa.size() * 4)) << k.mx_lanes.name;
      if (pair) {
        ASSERT_EQ(0, std::memcmp(wb.data(), gb.data(), wb.size() * 4)) << k.mx_lanes.name;
      }
      EXPECT_EQ(lo0, lo1);
      EXPECT_EQ(hi0, hi1);
      EXPECT_LT(lo0, hi0);
    }
    for (auto [rows, lanes, stride] : {std::tuple<size_t, size_t, size_t>{100, 16, 16}, {64, 9, 9}, {33, 37, 40}, {5, 3, 3}}) {
      const std::vector<float> x = data(rows * stride);
      std::vector<float> want = x, got = x;  // the gaps between rows stay as they are
      int lo0 = 1000, hi0 = -1000, lo1 = 1000, hi1 = -1000;
      simd::ref::mx_rows(x.data(), want.data(), rows, lanes, stride, f, &lo0, &hi0);
      k.mx_rows.fn(x.data(), got.data(), rows, lanes, stride, f, &lo1, &hi1);
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4)) << k.mx_rows.name << " " << rows << "x" << lanes;
      EXPECT_EQ(lo0, lo1);
      EXPECT_EQ(hi0, hi1);
      std::vector<float> inplace = x;
      k.mx_rows.fn(inplace.data(), inplace.data(), rows, lanes, stride, f, &lo1, &hi1);
      ASSERT_EQ(0, std::memcmp(want.data(), inplace.data(), want.size() * 4));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllLevels, MxIsa, ::testing::ValuesIn(test::isa_names_from(Isa::ref)));
