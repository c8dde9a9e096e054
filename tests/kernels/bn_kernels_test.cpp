// The BatchNorm kernels at every kernel level the CPU has: bit-identical to their scalar twins, and
// the one-kernel forms (dequantize / scale-shift / ReLU / quantize, the backward's dx and its
// quantization) bit-identical to that level's own kernels run in turn. The other DFP16 kernels'
// suite is dfp16_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/dfp16.hpp"
#include "dfp/isa.hpp"
#include "simd/kernel_table.hpp"
#include "tests/common/isa_levels.hpp"
#include "tests/common/reference.hpp"

using namespace dfp;

// Each test runs at the level it is given (the context chooses it), skipped where the CPU lacks it.
class BatchNormKernels : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!detect_cpu_features().supports(parse_isa(GetParam(), "test"))) GTEST_SKIP() << "CPU lacks " << GetParam();
    ctx_.emplace(ContextOptions{.threads = 1, .isa = GetParam()});
  }
  const simd::KernelTable& kernels() const { return ctx_->kernels(); }
  // A channel block's 16 per-lane coefficients in [lo, hi).
  static std::vector<float> lanes(uint32_t seed, float lo = -2.f, float hi = 2.f) {
    return test::random_vec(16, seed, lo, hi);
  }

 private:
  std::optional<Context> ctx_;
};

// The BatchNorm kernels match their scalar twins bit for bit (no fused multiply-add on either
// side), sums continuing from non-zero lanes, the max ignoring NaN.
TEST_P(BatchNormKernels, BatchNormKernelsBitIdenticalToReference) {
  const auto& k = kernels();
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  for (size_t px : {size_t(1), size_t(7), size_t(256)}) {
    const size_t n = px * 16;
    std::vector<float> x = test::random_vec(n, 3, -3.f, 3.f), dy = test::random_vec(n, 4, -1.f, 1.f);
    x[5] = std::numeric_limits<float>::quiet_NaN();
    const auto xi = test::random_ints(n, 5, -32767, 32767);
    std::vector<int16_t> xq(xi.begin(), xi.end());
      const auto mean = lanes(6), inv = lanes(7), k1 = lanes(8), k2 = lanes(9), k3 = lanes(10), a = lanes(11), b = lanes(12);
    std::vector<float> y0(n), y1(n);
    simd::ref::bn_scale_shift(x.data(), y0.data(), a.data(), b.data(), px);
    k.bn_scale_shift.fn(x.data(), y1.data(), a.data(), b.data(), px);
    ASSERT_TRUE(same(y0, y1)) << "scale_shift " << px;
    std::vector<float> c0(16), d0(16), q0(16), l0(16, -0.5f), m0(16, 0.5f), c1 = c0, d1 = d0, q1 = q0, l1 = l0, m1 = m0;
    simd::ref::bn_moments(x.data(), px, c0.data(), d0.data(), q0.data(), l0.data(), m0.data());
    k.bn_moments.fn(x.data(), px, c1.data(), d1.data(), q1.data(), l1.data(), m1.data());
    ASSERT_TRUE(same(c0, c1) && same(d0, d1) && same(q0, q1) && same(l0, l1) && same(m0, m1)) << "moments " << px;
    for (int l = 0; l < 16; ++l) {
      ASSERT_FALSE(std::isnan(l0[l]) || std::isnan(m0[l]));
      float lo = -0.5f, hi = 0.5f;  // the lane's own extremes, NaN skipped
      for (size_t i = 0; i < px; ++i)
        if (!std::isnan(x[i * 16 + l])) { lo = std::min(lo, x[i * 16 + l]); hi = std::max(hi, x[i * 16 + l]); }
      ASSERT_EQ(l0[l], lo);
      ASSERT_EQ(m0[l], hi);
    }
    // Far from zero (mean 1000, spread 1), the run's mean and squared deviations still come out
    // to FP32 accuracy against FP64, with no cancellation (FP32 E[x^2] - E[x]^2 would lose all).
    std::vector<float> far = test::random_vec(n, 17, 999.f, 1001.f);
    k.bn_moments.fn(far.data(), px, c1.data(), d1.data(), q1.data(), l1.data(), m1.data());
    for (int l = 0; l < 16; ++l) {
      double mean = 0, m2 = 0;
      for (size_t i = 0; i < px; ++i) mean += far[i * 16 + l];
      mean /= double(px);
      for (size_t i = 0; i < px; ++i) m2 += (far[i * 16 + l] - mean) * (far[i * 16 + l] - mean);
      EXPECT_NEAR(double(c1[l]) + double(d1[l]) / double(px), mean, 1e-4) << px;
      EXPECT_NEAR(double(q1[l]) - double(d1[l]) * d1[l] / double(px), m2, 1e-5 * std::max(1.0, m2)) << px;
    }
    std::vector<uint16_t> relu_mask(px);
    for (size_t i = 0; i < px; ++i) relu_mask[i] = uint16_t(i * 0x9E37u + 0x1234u);
    for (const uint16_t* mk : {static_cast<const uint16_t*>(nullptr), static_cast<const uint16_t*>(relu_mask.data())})
    for (float scale : {1.f, 0x1p-13f}) {
      const simd::BnCoefficients co{mean.data(), inv.data(), k1.data(), k2.data(), k3.data(), scale};
      std::vector<float> d0 = lanes(15), e0 = lanes(16), d1 = d0, e1 = e0;
      // The gradient's running extremes start from values of their own (a previous run's).
      const std::vector<float> g_start = lanes(18);
      std::vector<float> g0 = g_start, h0 = g_start;
      for (float& v : h0) v += 1.f;
      std::vector<float> g1 = g0, h1 = h0;
      simd::ref::bn_bwd_sums_s16(xq.data(), dy.data(), mk, co, px, d0.data(), e0.data(), g0.data(), h0.data());
      k.bn_bwd_sums_s16.fn(xq.data(), dy.data(), mk, co, px, d1.data(), e1.data(), g1.data(), h1.data());
      ASSERT_TRUE(same(d0, d1) && same(e0, e1)) << "bwd_sums_s16 " << px;
      ASSERT_TRUE(same(g0, g1) && same(h0, h1)) << "bwd_sums_s16 extremes " << px;
      for (int l = 0; l < 16; ++l) {  // the masked gradient's extremes, and the earlier ones
        float lo = g_start[l], hi = lo + 1.f;
        for (size_t i = 0; i < px; ++i) {
          const float g = !mk || (mk[i] >> l) & 1 ? dy[i * 16 + l] : 0.f;
          lo = std::min(lo, g);
          hi = std::max(hi, g);
        }
        ASSERT_EQ(g0[l], lo) << px;
        ASSERT_EQ(h0[l], hi) << px;
      }
      const float a0 = simd::ref::bn_bwd_apply_s16(xq.data(), dy.data(), mk, y0.data(), co, px, 0.25f);
      const float a1 = k.bn_bwd_apply_s16.fn(xq.data(), dy.data(), mk, y1.data(), co, px, 0.25f);
      ASSERT_TRUE(same(y0, y1)) << "bwd_apply_s16 " << px;
      float amax = 0.25f;
      for (float v : y0) amax = std::max(amax, std::fabs(v));
      ASSERT_EQ(a0, a1);
      ASSERT_EQ(a0, amax);
      std::vector<float> xf = dy;  // finite FP32 input
      // dy here is x, which holds a NaN: the extremes pass over it.
      simd::ref::bn_bwd_sums_f32(xf.data(), x.data(), mk, co, px, d0.data(), e0.data(), g0.data(), h0.data());
      k.bn_bwd_sums_f32.fn(xf.data(), x.data(), mk, co, px, d1.data(), e1.data(), g1.data(), h1.data());
      ASSERT_TRUE(same(d0, d1) && same(e0, e1)) << "bwd_sums_f32 " << px;
      ASSERT_TRUE(same(g0, g1) && same(h0, h1)) << "bwd_sums_f32 extremes " << px;
      for (int l = 0; l < 16; ++l) ASSERT_FALSE(std::isnan(g0[l]) || std::isnan(h0[l])) << px;
      y0 = xf, y1 = xf;  // in place: dx over dy
      // x holds a NaN: its dx is NaN, which the max ignores.
      const float b0 = simd::ref::bn_bwd_apply_f32(x.data(), y0.data(), mk, y0.data(), co, px, 0.f);
      const float b1 = k.bn_bwd_apply_f32.fn(x.data(), y1.data(), mk, y1.data(), co, px, 0.f);
      ASSERT_TRUE(same(y0, y1)) << "bwd_apply_f32 " << px;
      ASSERT_EQ(b0, b1);
      ASSERT_FALSE(std::isnan(b0));
    }
  }
}

// A BatchNorm's output recomputed from its saved DFP16 input and quantized into the batch-pair
// layout in one kernel: the reference's bits, which are those of this level's own dequantize,
// scale-shift, ReLU, quantize and interleave in turn; false wherever an element would count.
TEST_P(BatchNormKernels, BatchNormRequantizePairIsTheKernelsInTurn) {
  const auto& k = kernels();
  const std::vector<float> a = lanes(21), b = lanes(22);
  int clean_runs = 0, refused_runs = 0;
  for (size_t px : {size_t(1), size_t(7), size_t(33), size_t(128)})
    for (bool relu : {false, true})
      for (bool two : {false, true})
        // (e_in, e_out): clean; some |q| past 32767; exponents beyond a normal float's 2^k.
        for (auto [e_in, e_out] : {std::pair{-15, -12}, std::pair{-15, -14}, std::pair{-140, -13},
                                   std::pair{120, 118}}) {
          const size_t n = px * 16;
          const auto ia = test::random_ints(n, 30 + uint32_t(px), -32767, 32767);
          const auto ib = test::random_ints(n, 31 + uint32_t(px), -32767, 32767);
          std::vector<int16_t> xa(ia.begin(), ia.end()), xb(ib.begin(), ib.end());
          xa[0] = 0;
          xa[n - 1] = -32767;
          const int16_t* pb = two ? xb.data() : nullptr;
          std::vector<int16_t> d0(2 * n, 7), d1(2 * n, 9);
          int32_t m0[2] = {-1, -1}, m1[2] = {-2, -2};
          const bool r0 = simd::ref::bn_requantize_pair(xa.data(), pb, e_in, a.data(), b.data(), relu, e_out,
                                                        d0.data(), px, m0);
          const bool r1 = k.bn_requantize_pair.fn(xa.data(), pb, e_in, a.data(), b.data(), relu, e_out, d1.data(),
                                                  px, m1);
          const std::string at = std::to_string(px) + " " + std::to_string(relu) + " " + std::to_string(two) + " " +
                                 std::to_string(e_in) + " " + std::to_string(e_out);
          ASSERT_EQ(r0, r1) << at;
          // This level's kernels one after the other, with the counters of the checked path.
          std::vector<float> y(n);
          std::vector<uint16_t> mask(px);
          std::vector<int16_t> q[2] = {std::vector<int16_t>(n), std::vector<int16_t>(n)};
          simd::QuantCounters cnt[2];
          for (int i = 0; i < (two ? 2 : 1); ++i) {
            k.dequantize.fn(i ? xb.data() : xa.data(), y.data(), n, e_in);
            k.bn_scale_shift.fn(y.data(), y.data(), a.data(), b.data(), px);
            if (relu) k.relu_fwd.fn(y.data(), y.data(), mask.data(), n);
            k.quantize.fn(y.data(), q[i].data(), n, e_out, Rounding::nearest_even, 0, 0, &cnt[i]);
          }
          std::vector<int16_t> want(2 * n);
          k.interleave.fn(q[0].data(), two ? q[1].data() : nullptr, want.data(), n);
          const bool counted = cnt[0].saturated || cnt[0].nonfinite || cnt[0].max_abs_q >= 32767 ||
                               cnt[1].saturated || cnt[1].nonfinite || cnt[1].max_abs_q >= 32767;
          ASSERT_EQ(r0, !counted) << at;
          if (!r0) {
            ++refused_runs;
            continue;
          }
          ++clean_runs;
          ASSERT_EQ(d0, want) << at;
          ASSERT_EQ(d1, want) << at;
          ASSERT_EQ(m0[0], cnt[0].max_abs_q) << at;
          ASSERT_EQ(m1[0], cnt[0].max_abs_q) << at;
          ASSERT_EQ(m0[1], two ? cnt[1].max_abs_q : 0) << at;
          ASSERT_EQ(m1[1], m0[1]) << at;
        }
  // Both outcomes ran: the clean pairs and those the caller has to take by the checked path.
  ASSERT_GE(clean_runs, 32);
  ASSERT_GE(refused_runs, 20);
  // A NaN shift lane: refused without a ReLU; with one the NaN is 0, as relu_fwd makes it.
  std::vector<float> nan_b = b;
  nan_b[3] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<int16_t> x(64 * 16, 100);
  std::vector<int16_t> d(2 * x.size());
  int32_t m[2];
  for (bool relu : {false, true}) {
    ASSERT_EQ(relu, k.bn_requantize_pair.fn(x.data(), x.data(), -15, a.data(), nan_b.data(), relu, -12, d.data(), 64, m));
    ASSERT_EQ(relu, simd::ref::bn_requantize_pair(x.data(), x.data(), -15, a.data(), nan_b.data(), relu, -12, d.data(),
                                                  64, m));
  }
}

// The same for one image into the plain layout, with the ReLU's mask: the reference's bits and
// mask, which are those of this level's own dequantize, scale-shift, ReLU and quantize in turn.
TEST_P(BatchNormKernels, BatchNormRequantizeIsTheKernelsInTurn) {
  const auto& k = kernels();
  const std::vector<float> a = lanes(23), b = lanes(24);
  int clean_runs = 0, refused_runs = 0;
  for (size_t px : {size_t(1), size_t(7), size_t(33), size_t(128)})
    for (bool relu : {false, true})
      for (auto [e_in, e_out] : {std::pair{-15, -12}, std::pair{-15, -14}, std::pair{-140, -13},
                                 std::pair{120, 118}}) {
        const size_t n = px * 16;
        const auto ix = test::random_ints(n, 40 + uint32_t(px), -32767, 32767);
        std::vector<int16_t> x(ix.begin(), ix.end());
        x[0] = 0;
        x[n - 1] = -32767;
        std::vector<int16_t> d0(n, 7), d1(n, 9);
        std::vector<uint16_t> mask0(px, 0x5555), mask1(px, 0xAAAA);
        int32_t m0 = -1, m1 = -2;
        const bool r0 = simd::ref::bn_requantize(x.data(), e_in, a.data(), b.data(), relu ? mask0.data() : nullptr,
                                                 e_out, d0.data(), px, &m0);
        const bool r1 = k.bn_requantize.fn(x.data(), e_in, a.data(), b.data(), relu ? mask1.data() : nullptr, e_out,
                                           d1.data(), px, &m1);
        const std::string at =
            std::to_string(px) + " " + std::to_string(relu) + " " + std::to_string(e_in) + " " + std::to_string(e_out);
        ASSERT_EQ(r0, r1) << at;
        // This level's kernels one after the other, with the counters of the checked path.
        std::vector<float> y(n);
        std::vector<uint16_t> mask(px, 0x5555);
        std::vector<int16_t> want(n);
        simd::QuantCounters cnt;
        k.dequantize.fn(x.data(), y.data(), n, e_in);
        k.bn_scale_shift.fn(y.data(), y.data(), a.data(), b.data(), px);
        if (relu) k.relu_fwd.fn(y.data(), y.data(), mask.data(), n);
        k.quantize.fn(y.data(), want.data(), n, e_out, Rounding::nearest_even, 0, 0, &cnt);
        ASSERT_EQ(r0, !(cnt.saturated || cnt.nonfinite || cnt.max_abs_q >= 32767)) << at;
        if (!r0) {
          ++refused_runs;
          continue;
        }
        ++clean_runs;
        if (relu) {
          ASSERT_EQ(mask0, mask) << at;
          ASSERT_EQ(mask1, mask) << at;
        }
        ASSERT_EQ(d0, want) << at;
        ASSERT_EQ(d1, want) << at;
        ASSERT_EQ(m0, cnt.max_abs_q) << at;
        ASSERT_EQ(m1, cnt.max_abs_q) << at;
      }
  ASSERT_GE(clean_runs, 12);
  ASSERT_GE(refused_runs, 10);
  // A NaN shift lane: refused without a ReLU; with one the NaN is 0, as relu_fwd makes it.
  std::vector<float> nan_b = b;
  nan_b[3] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<int16_t> x(64 * 16, 100);
  std::vector<int16_t> d(x.size());
  std::vector<uint16_t> mask(64);
  int32_t m;
  for (bool relu : {false, true}) {
    uint16_t* mk = relu ? mask.data() : nullptr;
    ASSERT_EQ(relu, k.bn_requantize.fn(x.data(), -15, a.data(), nan_b.data(), mk, -12, d.data(), 64, &m));
    ASSERT_EQ(relu, simd::ref::bn_requantize(x.data(), -15, a.data(), nan_b.data(), mk, -12, d.data(), 64, &m));
  }
}

// A BatchNorm's dx quantized as it is computed: the reference's bits, which are those of this
// level's own bn_bwd_apply_s16 and quantize in turn, with the same max|dx|; refused wherever an
// element would count.
TEST_P(BatchNormKernels, BatchNormBackwardRequantizeIsTheKernelsInTurn) {
  const auto& k = kernels();
  const std::vector<float> mean = lanes(25, -1.f, 1.f), inv = lanes(26, 0.5f, 2.f), k1 = lanes(27, -2.f, 2.f),
                           k2 = lanes(28, -0.1f, 0.1f), k3 = lanes(29, -0.5f, 0.5f);
  const simd::BnCoefficients co{mean.data(), inv.data(), k1.data(), k2.data(), k3.data(), std::ldexp(1.f, -14)};
  int clean_runs = 0, refused_runs = 0, clean_tiny = 0;
  for (size_t px : {size_t(1), size_t(7), size_t(33), size_t(128)})
    for (bool relu : {false, true})
      // e_out: clean; some |q| past 32767; beyond a normal float's 2^k.
      for (int e_out : {-12, -15, -140}) {
        const size_t n = px * 16;
        const auto ix = test::random_ints(n, 50 + uint32_t(px), -32767, 32767);
        std::vector<int16_t> x(ix.begin(), ix.end());
        const std::vector<float> dy = test::random_vec(n, 60 + uint32_t(px), -1.f, 1.f);
        std::vector<uint16_t> mask(px);
        for (size_t i = 0; i < px; ++i) mask[i] = static_cast<uint16_t>(0x9E37u * (i + 1));
        const uint16_t* mk = relu ? mask.data() : nullptr;
        // At 2^-140, dx of subnormal size: |q| within range, and a scale no float holds.
        std::vector<float> k1s = k1;
        if (e_out == -140)
          for (float& v : k1s) v *= 2e-39f;
        const simd::BnCoefficients cs{mean.data(), inv.data(), k1s.data(), k2.data(), k3.data(), co.x_scale};
        const float* g = dy.data();
        std::vector<int16_t> d0(n, 7), d1(n, 9);
        int32_t m0 = -1, m1 = -2;
        const float r0 = simd::ref::bn_bwd_requantize(x.data(), g, mk, cs, px, e_out, d0.data(), &m0);
        const float r1 = k.bn_bwd_requantize.fn(x.data(), g, mk, cs, px, e_out, d1.data(), &m1);
        const std::string at = std::to_string(px) + " " + std::to_string(relu) + " " + std::to_string(e_out);
        ASSERT_EQ(r0, r1) << at;
        // This level's kernels one after the other, with the counters of the checked path.
        std::vector<float> dx(n);
        std::vector<int16_t> want(n);
        const float mx = k.bn_bwd_apply_s16.fn(x.data(), g, mk, dx.data(), cs, px, 0.f);
        simd::QuantCounters cnt;
        k.quantize.fn(dx.data(), want.data(), n, e_out, Rounding::nearest_even, 0, 0, &cnt);
        const bool clean = !(cnt.saturated || cnt.nonfinite || cnt.max_abs_q >= 32767);
        ASSERT_EQ(r0 >= 0.f, clean) << at;
        if (!clean) {
          ASSERT_EQ(r0, -1.f) << at;
          ++refused_runs;
          continue;
        }
        ++clean_runs;
        clean_tiny += e_out == -140;
        ASSERT_EQ(r0, mx) << at;
        ASSERT_EQ(d0, want) << at;
        ASSERT_EQ(d1, want) << at;
        ASSERT_EQ(m0, cnt.max_abs_q) << at;
        ASSERT_EQ(m1, cnt.max_abs_q) << at;
      }
  ASSERT_GE(clean_runs, 8);
  ASSERT_GE(clean_tiny, 4);
  ASSERT_GE(refused_runs, 4);
  // A NaN in dy: refused where the mask lets it through, quantized (as 0's dx) where it does not.
  const std::vector<int16_t> x(4 * 16, 100);
  std::vector<float> dy(x.size(), 0.01f);
  dy[5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<int16_t> d(x.size());
  int32_t m;
  for (uint16_t word : {uint16_t(0xFFFF), uint16_t(0xFFDF)}) {
    const std::vector<uint16_t> mask(4, word);
    const bool through = word & (1u << 5);
    EXPECT_EQ(through, k.bn_bwd_requantize.fn(x.data(), dy.data(), mask.data(), co, 4, -12, d.data(), &m) < 0.f);
    EXPECT_EQ(through, simd::ref::bn_bwd_requantize(x.data(), dy.data(), mask.data(), co, 4, -12, d.data(), &m) < 0.f);
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, BatchNormKernels, ::testing::ValuesIn(test::isa_names_from(Isa::avx2)));
