// The fp8, MX, Block DFP and posit16 precisions (dfp/precision.hpp, dfp/float8.hpp, dfp/dfp16.hpp,
// dfp/posit.hpp): a layer's three passes are FP32 passes on
// operands rounded bit-exactly to e4m3/e5m2 at the scales current and delayed scaling choose, its
// numerics records name the formats and scales, the policy's text forms carry the fp8 settings,
// and a network trains.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "dfp/float8.hpp"
#include "dfp/posit.hpp"
#include "dfp/layer_op.hpp"
#include "dfp/model.hpp"
#include "dfp/models.hpp"
#include "dfp/optim.hpp"
#include "dfp/precision.hpp"
#include "tests/common/expect_error.hpp"
#include "tests/common/model_helpers.hpp"
#include "tests/common/reference.hpp"

using namespace dfp;

namespace {

Context& ctx() {
  static Context c(ContextOptions{.threads = 2});
  return c;
}

LayerOpSpec conv_spec() {
  LayerOpSpec s;
  s.in_channels = 20;
  s.out_channels = 12;
  s.kernel = 3;
  s.pad = 1;
  s.name = "conv";
  return s;
}

// A Conv2d (r x r, padded to keep the size) or a Linear from c to k channels.
LayerOpSpec weighted_spec(bool linear, int c, int k, int r, const char* name) {
  LayerOpSpec s;
  s.kind = linear ? LayerOpSpec::Kind::linear : LayerOpSpec::Kind::conv2d;
  s.in_channels = c;
  s.out_channels = k;
  s.kernel = r;
  s.pad = linear ? 0 : r / 2;
  s.name = name;
  return s;
}

float max_abs_of(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

std::vector<float> rounded(const std::vector<float>& v, FloatFormat f, int s) {
  std::vector<float> q(v.size());
  for (size_t i = 0; i < v.size(); ++i) q[i] = round_float8(v[i], f, Overflow::saturate, s, Rounding::nearest_even, 0);
  return q;
}

struct Passes {
  std::vector<float> y, dx, dw;
};
Passes run(LayerOp& op, const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& dy, int n,
           int hw, uint64_t version) {
  Passes p;
  p.y.resize(dy.size());
  p.dx.resize(x.size());
  p.dw.resize(w.size());
  const uint64_t t = op.forward(x.data(), n, hw, hw, w.data(), nullptr, version, p.y.data(), true, true);
  op.backward(t, dy.data(), p.dx.data(), p.dw.data(), nullptr);
  return p;
}

void expect_same_bits(const Passes& a, const Passes& b, const std::string& what) {
  EXPECT_EQ(0, std::memcmp(a.y.data(), b.y.data(), a.y.size() * 4)) << what << " y";
  EXPECT_EQ(0, std::memcmp(a.dx.data(), b.dx.data(), a.dx.size() * 4)) << what << " dx";
  EXPECT_EQ(0, std::memcmp(a.dw.data(), b.dw.data(), a.dw.size() * 4)) << what << " dw";
}

// Whether ResNet-20 halves its loss on a fixed batch of 8 in 25 SGD steps under the policy.
void expect_learns_a_batch(const PrecisionPolicy& p) {
  Model m(ctx(), "resnet20");
  build_model(m, "resnet20", 3, 16, 16, 10);
  m.build(8, p);
  Sgd sgd(ctx(), m, {0.9f, 5e-4f, true});
  const auto x = test::batch_images(m, 9);
  const std::vector<int32_t> y = {1, 2, 3, 4, 5, 6, 7, 8};
  double first = 0, last = 0;
  for (int s = 0; s < 25; ++s) {
    const double loss = m.forward(x.data(), y.data(), 8, true).loss;
    ASSERT_TRUE(std::isfinite(loss)) << s;
    m.backward();
    sgd.step(0.05f);
    if (s == 0) first = loss;
    last = loss;
  }
  EXPECT_LT(last, 0.5 * first) << "first " << first << " last " << last;
  const ClassFormats f = p.for_layer("layer1.0.conv1").formats;
  const std::string format = p.precision == Precision::int16 ? "int16"
                             : f.all(f.weights)              ? std::string(float_format_name(f.weights))
                                                             : f.names();
  EXPECT_EQ(m.numerics().at(1).format, format);
}

}  // namespace

// Forward, backward-data and weight gradient of an fp8 layer are those of the FP32 layer on x and w
// rounded to e4m3 and dy to e5m2, each at its tensor's scale; delayed scaling takes the scale of
// the history's largest maximum, so a tensor that grew saturates.
TEST(Fp8, PassesAreFp32PassesOnOperandsRoundedAtTheirScales) {
  const int n = 3, hw = 6;
  const LayerOpSpec spec = conv_spec();
  const std::vector<float> x = test::random_vec(size_t(n) * 20 * hw * hw, 1, -3.f, 3.f);
  const std::vector<float> w = test::random_vec(size_t(12) * 20 * 9, 2, -0.2f, 0.2f);
  const std::vector<float> dy = test::random_vec(size_t(n) * 12 * hw * hw, 3, -1e-4f, 1e-4f);
  std::vector<float> x4 = x;  // step 2's input: four times larger
  for (float& v : x4) v *= 4;
  PrecisionPolicy f32;
  LayerOp ref(ctx(), spec, f32);
  const FloatFormat e4 = FloatFormat::e4m3, e5 = FloatFormat::e5m2;
  for (Float8Scaling scaling : {Float8Scaling::current, Float8Scaling::delayed, Float8Scaling::none}) {
    SCOPED_TRACE(float8_scaling_name(scaling));
    PrecisionPolicy p;
    p.precision = Precision::fp8;
    p.fp8.scaling = scaling;
    p.fp8.amax_history = 4;
    LayerOp op(ctx(), spec, p);
    auto scale = [&](const std::vector<float>& v, FloatFormat f, float history_max) {
      if (scaling == Float8Scaling::none) return 0;
      return float8_scale_exponent(scaling == Float8Scaling::delayed && history_max > 0 ? history_max : max_abs_of(v), f, 0);
    };
    // Step 1: no history yet, so delayed scaling takes each tensor's own maximum.
    const int sx = scale(x, e4, 0), sw = scale(w, e4, 0), sdy = scale(dy, e5, 0);
    const Passes got = run(op, x, w, dy, n, hw, 1);
    expect_same_bits(got, run(ref, rounded(x, e4, sx), rounded(w, e4, sw), rounded(dy, e5, sdy), n, hw, 1), "step 1");
    LayerNumerics nm;
    ASSERT_TRUE(op.numerics(nm));
    EXPECT_EQ(nm.format, "e4m3/e4m3/e5m2");
    EXPECT_EQ(nm.scaled, scaling != Float8Scaling::none);
    EXPECT_EQ(nm.exp_x, -sx);
    EXPECT_EQ(nm.exp_w, -sw);
    EXPECT_EQ(nm.exp_dy, -sdy);
    if (scaling != Float8Scaling::none) {
      EXPECT_EQ(sdy, 29);  // max|dy| ~ 1e-4 = 0.82 * 2^-13, below e5m2's 57344 = 0.875 * 2^16
    }  // 1e-4 ~ 2^-13.3: e5m2's 57344 ~ 2^15.8

    // Step 2: the input grew fourfold. Current scaling follows it; delayed keeps step 1's scale.
    const int sx2 = scale(x4, e4, max_abs_of(x));
    if (scaling == Float8Scaling::delayed) {
      EXPECT_EQ(sx2, sx);
    } else if (scaling == Float8Scaling::current) {
      EXPECT_EQ(sx2, sx - 2);
    }
    const Passes got2 = run(op, x4, w, dy, n, hw, 1);
    const Passes want2 = run(ref, rounded(x4, e4, sx2), rounded(w, e4, sw), rounded(dy, e5, sdy), n, hw, 2);
    expect_same_bits(got2, want2, "step 2");
    if (scaling == Float8Scaling::delayed) {  // the grown input saturated at 448 * 2^-sx
      const std::vector<float> q = rounded(x4, e4, sx2);
      EXPECT_EQ(max_abs_of(q), std::ldexp(448.f, -sx2));
    }
  }
}

// Per-class formats override the recipe (here all-e4m3, and bf16 gradients beside e4m3 operands).
TEST(Fp8, ClassFormatsOverrideTheHybridRecipe) {
  PrecisionPolicy p;
  p.precision = Precision::fp8;
  EXPECT_EQ(p.for_layer("c").formats.names(), "e4m3/e4m3/e5m2");
  EXPECT_TRUE(p.uses_float8());
  p.gradients_format = FloatFormat::e4m3;
  EXPECT_EQ(p.for_layer("c").formats.names(), "e4m3/e4m3/e4m3");
  p.gradients_format = FloatFormat::bf16;
  EXPECT_EQ(p.for_layer("c").formats.names(), "e4m3/e4m3/bf16");
  PrecisionPolicy bf;
  bf.precision = Precision::bf16;
  EXPECT_FALSE(bf.uses_float8());
  bf.gradients_format = FloatFormat::e5m2;
  EXPECT_TRUE(bf.uses_float8());
  PrecisionPolicy i16;
  i16.precision = Precision::int16;
  i16.overrides = PrecisionPolicy::parse_overrides("fc=fp8", "test");
  EXPECT_TRUE(i16.uses_float8());
  EXPECT_EQ(i16.for_layer("fc").formats.names(), "e4m3/e4m3/e5m2");
  EXPECT_EQ(i16.for_layer("conv1").precision, Precision::int16);
}

// The fp8 settings are a checkpoint field (only where a layer uses an 8-bit format, so that other
// policies' checkpoints keep their bytes), part of describe(), and refused by name when wrong.
TEST(Fp8, SettingsRoundTripAndBadOnesAreNamed) {
  PrecisionPolicy p;
  p.precision = Precision::fp8;
  p.fp8 = {Float8Scaling::current, 16, 2, Overflow::nonfinite};
  const auto f = p.fields();
  ASSERT_EQ(f.count("fp8"), 1u);
  EXPECT_EQ(f.at("fp8"), "current,16,2,nonfinite");
  EXPECT_EQ(PrecisionPolicy::from_fields(f, "ck").fp8, p.fp8);
  EXPECT_NE(p.describe().find("fp8{current,16,2,nonfinite}"), std::string::npos) << p.describe();
  PrecisionPolicy plain;
  plain.precision = Precision::int16;
  EXPECT_EQ(plain.fields().count("fp8"), 0u);
  EXPECT_EQ(plain.describe().find("fp8"), std::string::npos);

  auto with = [&](const std::string& v) {
    auto g = f;
    g["fp8"] = v;
    return g;
  };
  test::expect_error([&] { PrecisionPolicy::from_fields(with("sometimes,16,2,saturate"), "ck"); }, Status::corrupt_data,
                     {"ck field fp8", "unknown fp8 scaling 'sometimes'", "none, current or delayed"});
  test::expect_error([&] { PrecisionPolicy::from_fields(with("current,0,2,saturate"), "ck"); }, Status::corrupt_data,
                     {"ck field fp8 (amax history)", "1..1048576", "'0'"});
  test::expect_error([&] { PrecisionPolicy::from_fields(with("current,16,-1,saturate"), "ck"); }, Status::corrupt_data,
                     {"ck field fp8 (margin)", "'-1'"});
  test::expect_error([&] { PrecisionPolicy::from_fields(with("current,16,2,wrap"), "ck"); }, Status::corrupt_data,
                     {"ck field fp8", "unknown overflow mode 'wrap'"});
  test::expect_error([&] { PrecisionPolicy::from_fields(with("current,16"), "ck"); }, Status::corrupt_data,
                     {"ck field fp8", "SCALING,HISTORY,MARGIN,OVERFLOW"});
  PrecisionPolicy bad = p;
  bad.fp8.amax_history = 0;
  test::expect_error([&] { bad.validate("flags"); }, Status::invalid_argument, {"flags", "fp8 amax history", "got 0"});
  bad = p;
  bad.fp8.margin = 65;
  test::expect_error([&] { bad.validate("flags"); }, Status::invalid_argument, {"flags", "fp8 margin", "0..64"});
}

// ResNet-20 learns a fixed batch in fp8 under each scaling.
TEST(Fp8, SmallResNetLearnsABatchUnderEveryScaling) {
  for (Float8Scaling scaling : {Float8Scaling::current, Float8Scaling::delayed, Float8Scaling::none}) {
    SCOPED_TRACE(float8_scaling_name(scaling));
    PrecisionPolicy p;
    p.precision = Precision::fp8;
    p.fp8.scaling = scaling;
    expect_learns_a_batch(p);
  }
}

// ---- OCP Microscaling --------------------------------------------------------------------------

namespace {
// A plain [n][c][p] tensor rounded block by block by round(block, count, stride): blocks of `size`
// along the channels (at each image and pixel) or along the pixels (at each image and channel;
// along the images for p == 1).
template <class Round>
std::vector<float> blocks_plain(const std::vector<float>& v, int n, int c, int p, bool along_pixels, int size,
                                Round round) {
  std::vector<float> q = v;
  if (!along_pixels) {
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < p; ++j)
        for (int c0 = 0; c0 < c; c0 += size) round(q.data() + (size_t(i) * c + c0) * p + j, std::min(size, c - c0), p);
  } else if (p > 1) {
    for (int i = 0; i < n; ++i)
      for (int ch = 0; ch < c; ++ch)
        for (int p0 = 0; p0 < p; p0 += size) round(q.data() + (size_t(i) * c + ch) * p + p0, std::min(size, p - p0), 1);
  } else {
    for (int ch = 0; ch < c; ++ch)
      for (int i0 = 0; i0 < n; i0 += size) round(q.data() + size_t(i0) * c + ch, std::min(size, n - i0), c);
  }
  return q;
}
// The MX rounding in blocks of 32.
std::vector<float> mx_plain(const std::vector<float>& v, int n, int c, int p, bool along_pixels, FloatFormat f) {
  return blocks_plain(v, n, c, p, along_pixels, kMxBlock,
                      [f](float* b, int count, int stride) { mx_round_block(b, b, size_t(count), size_t(stride), f); });
}
}  // namespace

// Each pass of an MX layer is the FP32 pass on operands quantized along that pass's reduction:
// x and w across the input channels (forward), dy and w across the output channels
// (backward-data), x and dy along each image's pixels (weight gradient); a Linear's weight
// gradient along the batch. 40 input channels make a block of 32 and one of 8, 36 pixels a block
// of 32 and one of 4.
TEST(Mx, EachPassQuantizesItsOperandsAlongItsOwnReduction) {
  for (Precision prec : {Precision::mxfp8, Precision::mxfp6, Precision::mxfp4, Precision::mxint8}) {
    SCOPED_TRACE(precision_name(prec));
    PrecisionPolicy p;
    p.precision = prec;
    const ClassFormats f = p.for_layer("x").formats;
    PrecisionPolicy f32;
    for (bool linear : {false, true}) {
      SCOPED_TRACE(linear ? "linear" : "conv");
      const int n = linear ? 40 : 2, c = 40, k = 20, hw = linear ? 1 : 6, r = linear ? 1 : 3;
      const LayerOpSpec spec = weighted_spec(linear, c, k, r, "mx");
      const int px = hw * hw, taps = r * r;
      const std::vector<float> x = test::random_vec(size_t(n) * c * px, 5, -2.f, 2.f);
      const std::vector<float> w = test::random_vec(size_t(k) * c * taps, 6, -0.3f, 0.3f);
      const std::vector<float> dy = test::random_vec(size_t(n) * k * px, 7, -1e-3f, 1e-3f);
      LayerOp op(ctx(), spec, p), ref(ctx(), spec, f32);
      const Passes got = run(op, x, w, dy, n, hw, 1);
      // The weights: [k][c][taps], along c for the forward pass, along k for backward-data.
      const std::vector<float> w_fwd = mx_plain(w, k, c, taps, false, f.weights);
      const std::vector<float> w_bwd = mx_plain(w, 1, k, c * taps, false, f.weights);
      const Passes fwd = run(ref, mx_plain(x, n, c, px, false, f.activations), w_fwd, dy, n, hw, 1);
      EXPECT_EQ(0, std::memcmp(got.y.data(), fwd.y.data(), got.y.size() * 4)) << "forward";
      const Passes bwd = run(ref, x, w_bwd, mx_plain(dy, n, k, px, false, f.gradients), n, hw, 2);
      EXPECT_EQ(0, std::memcmp(got.dx.data(), bwd.dx.data(), got.dx.size() * 4)) << "backward-data";
      const Passes wg = run(ref, mx_plain(x, n, c, px, true, f.activations), w, mx_plain(dy, n, k, px, true, f.gradients),
                            n, hw, 3);
      EXPECT_EQ(0, std::memcmp(got.dw.data(), wg.dw.data(), got.dw.size() * 4)) << "weight gradient";
      LayerNumerics nm;
      op.sample_next_step();
      run(op, x, w, dy, n, hw, 1);
      ASSERT_TRUE(op.numerics(nm));
      EXPECT_TRUE(nm.scaled);
      EXPECT_LE(nm.exp_dy_min.value_or(nm.exp_dy), nm.exp_dy);
      EXPECT_EQ(nm.format, f.all(f.weights) ? std::string(float_format_name(f.weights)) : f.names());
      EXPECT_GT(nm.sqnr_x_db, prec == Precision::mxfp4 ? 5 : 15);
    }
  }
}

// ResNet-20 learns a fixed batch in each MX precision.
TEST(Mx, SmallResNetLearnsABatchInEachFormat) {
  for (Precision prec : {Precision::mxfp8, Precision::mxfp6, Precision::mxfp4, Precision::mxint8}) {
    SCOPED_TRACE(precision_name(prec));
    PrecisionPolicy p;
    p.precision = prec;
    expect_learns_a_batch(p);
  }
}

// ---- Block DFP -------------------------------------------------------------------------------------

namespace {
// The Block DFP rounding of a plain tensor: DFP16 blocks of `size` (0: one exponent for the whole
// tensor), as the class's options say.
std::vector<float> dfp_plain(const std::vector<float>& v, int n, int c, int p, bool along_pixels, const QuantOptions& q) {
  const int size = granularity_block(q.granularity);
  if (!size) {
    std::vector<float> out(v.size());
    dfp16_round_block(v.data(), out.data(), v.size(), 1, q.headroom, q.rounding);
    return out;
  }
  return blocks_plain(v, n, c, p, along_pixels, size, [&](float* b, int count, int stride) {
    dfp16_round_block(b, b, size_t(count), size_t(stride), q.headroom, q.rounding);
  });
}
}  // namespace

// An int16 layer with block granularities: each pass is the FP32 pass on operands rounded to
// DFP16 blocks along that pass's reduction (MX's axes), a tensor class with one exponent; 136
// channels and 144 pixels leave a partial block at every size.
TEST(BlockDfp, EachPassRoundsItsOperandsToDfp16BlocksAlongItsOwnReduction) {
  struct Setting {
    Granularity w, x, dy;
    int headroom;
    Rounding rounding;
  };
  for (const Setting& st : {Setting{Granularity::block32, Granularity::block32, Granularity::block32, 2, Rounding::nearest_even},
                            Setting{Granularity::block64, Granularity::block64, Granularity::block64, 0, Rounding::nearest_even},
                            Setting{Granularity::block128, Granularity::block128, Granularity::block128, 2, Rounding::biased},
                            Setting{Granularity::tensor, Granularity::block64, Granularity::block32, 1, Rounding::nearest_even},
                            Setting{Granularity::block32, Granularity::tensor, Granularity::tensor, 2, Rounding::biased}}) {
    PrecisionPolicy p, f32;
    p.precision = Precision::int16;
    p.dfp.weights.granularity = st.w;
    p.dfp.activations.granularity = st.x;
    p.dfp.gradients.granularity = st.dy;
    for (QuantOptions* q : {&p.dfp.weights, &p.dfp.activations, &p.dfp.gradients}) {
      q->headroom = st.headroom;
      q->rounding = st.rounding;
    }
    p.validate("test");
    SCOPED_TRACE(p.describe());
    for (bool linear : {false, true}) {
      SCOPED_TRACE(linear ? "linear" : "conv");
      const int n = linear ? 40 : 2, c = 136, k = 20, hw = linear ? 1 : 12, r = linear ? 1 : 3;
      const LayerOpSpec spec = weighted_spec(linear, c, k, r, "bdfp");
      const int px = hw * hw, taps = r * r;
      std::vector<float> x = test::random_vec(size_t(n) * c * px, 5, -2.f, 2.f);
      for (size_t i = 0; i < x.size(); ++i)
        if (i / (size_t(c) * px) % 2) x[i] *= 1e-3f;  // odd images far below the others: blocks apart
      const std::vector<float> w = test::random_vec(size_t(k) * c * taps, 6, -0.3f, 0.3f);
      std::vector<float> dy = test::random_vec(size_t(n) * k * px, 7, -1e-3f, 1e-3f);
      for (size_t i = 0; i < dy.size(); i += 5) dy[i] *= 1e-4f;
      LayerOp op(ctx(), spec, p), ref(ctx(), spec, f32);
      const Passes got = run(op, x, w, dy, n, hw, 1);
      const std::vector<float> w_fwd = dfp_plain(w, k, c, taps, false, p.dfp.weights);
      const std::vector<float> w_bwd = dfp_plain(w, 1, k, c * taps, false, p.dfp.weights);
      const Passes fwd = run(ref, dfp_plain(x, n, c, px, false, p.dfp.activations), w_fwd, dy, n, hw, 1);
      EXPECT_EQ(0, std::memcmp(got.y.data(), fwd.y.data(), got.y.size() * 4)) << "forward";
      const Passes bwd = run(ref, x, w_bwd, dfp_plain(dy, n, k, px, false, p.dfp.gradients), n, hw, 2);
      EXPECT_EQ(0, std::memcmp(got.dx.data(), bwd.dx.data(), got.dx.size() * 4)) << "backward-data";
      const Passes wg = run(ref, dfp_plain(x, n, c, px, true, p.dfp.activations), w,
                            dfp_plain(dy, n, k, px, true, p.dfp.gradients), n, hw, 3);
      EXPECT_EQ(0, std::memcmp(got.dw.data(), wg.dw.data(), got.dw.size() * 4)) << "weight gradient";
      LayerNumerics nm;
      op.sample_next_step();
      run(op, x, w, dy, n, hw, 1);
      ASSERT_TRUE(op.numerics(nm));
      EXPECT_EQ(nm.format, "int16");
      EXPECT_FALSE(nm.scaled);  // exp_* are DFP16 exponents
      EXPECT_EQ(nm.exp_x_min.has_value(), st.x != Granularity::tensor);  // blocks of 1e-3 and of 1 differ
      EXPECT_EQ(nm.exp_w_min.has_value(), st.w != Granularity::tensor);
      EXPECT_GT(nm.sqnr_x_db, 60);
    }
  }
}

// Block DFP keeps more of a gradient with a wide range than one exponent per tensor does, and
// a small ResNet learns a batch with it; the policy refuses what has no block form.
TEST(BlockDfp, BlocksKeepWhatOneExponentLosesAndANetworkLearns) {
  const int n = 4, hw = 6;
  std::vector<float> dy = test::random_vec(size_t(n) * 12 * hw * hw, 3, -1.f, 1.f);
  for (size_t i = dy.size() / 2; i < dy.size(); ++i) dy[i] *= 1e-5f;  // two images far below the others
  const std::vector<float> x = test::random_vec(size_t(n) * 20 * hw * hw, 1, -1.f, 1.f);
  const std::vector<float> w = test::random_vec(size_t(12) * 20 * 9, 2, -0.2f, 0.2f);
  double sqnr[2] = {};
  uint64_t underflow[2] = {};
  for (int blocked = 0; blocked < 2; ++blocked) {
    PrecisionPolicy p;
    p.precision = Precision::int16;
    if (blocked) p.dfp.gradients.granularity = Granularity::block32;
    LayerOp op(ctx(), conv_spec(), p);
    op.sample_next_step();
    run(op, x, w, dy, n, hw, 1);
    LayerNumerics nm;
    ASSERT_TRUE(op.numerics(nm));
    sqnr[blocked] = nm.sqnr_dy_db;
    underflow[blocked] = nm.underflow_dy;
  }
  EXPECT_GT(sqnr[1], sqnr[0]);
  EXPECT_LT(underflow[1], underflow[0]);

  PrecisionPolicy p;
  p.precision = Precision::int16;
  p.dfp.gradients.granularity = Granularity::block64;
  expect_learns_a_batch(p);
  p.dfp.gradients.rounding = Rounding::stochastic;
  test::expect_error([&] { p.validate("flags"); }, Status::invalid_argument,
                     {"flags", "gradients granularity 'block64'", "stochastic rounding has no block form"});
  p.dfp.gradients.rounding = Rounding::nearest_even;
  p.dfp.weights.granularity = Granularity::slice;
  test::expect_error([&] { p.validate("flags"); }, Status::invalid_argument,
                     {"flags", "weights granularity 'slice' beside a block granularity"});
  test::expect_error([&] { (void)parse_granularity("block48", "--granularity"); }, Status::invalid_argument,
                     {"--granularity", "block48", "block32"});
  // The INT16 convolution itself has no block form; the layers emulate it.
  ConvShape shape;
  shape.N = 2; shape.C = 16; shape.H = 4; shape.W = 4; shape.K = 16; shape.R = 3; shape.S = 3; shape.pad_h = 1; shape.pad_w = 1;
  DfpConvOptions o;
  o.activations.granularity = Granularity::block128;
  test::expect_error([&] { ConvInt16 conv(ctx(), shape, o, "c"); }, Status::invalid_argument,
                     {"convolution 'c'", "activations granularity 'block128'", "takes tensor or slice"});
}

// ---- posit16 -------------------------------------------------------------------------------------

// A posit16 layer's passes are the FP32 passes on x, w and dy rounded to posit16, unscaled; the
// policy refuses stochastic rounding for it; ResNet-20 learns a batch with either exponent size.
TEST(Posit16, PassesAreFp32PassesOnPositOperands) {
  for (Precision prec : {Precision::posit16, Precision::posit16es2}) {
    SCOPED_TRACE(precision_name(prec));
    const int es = prec == Precision::posit16 ? 1 : 2, n = 3, hw = 6;
    const std::vector<float> x = test::random_vec(size_t(n) * 20 * hw * hw, 1, -3.f, 3.f);
    const std::vector<float> w = test::random_vec(size_t(12) * 20 * 9, 2, -0.2f, 0.2f);
    const std::vector<float> dy = test::random_vec(size_t(n) * 12 * hw * hw, 3, -1e-6f, 1e-6f);
    auto posit = [&](std::vector<float> v) {
      for (float& e : v) e = round_posit16(e, es);
      return v;
    };
    PrecisionPolicy p, f32;
    p.precision = prec;
    LayerOp op(ctx(), conv_spec(), p), ref(ctx(), conv_spec(), f32);
    expect_same_bits(run(op, x, w, dy, n, hw, 1), run(ref, posit(x), posit(w), posit(dy), n, hw, 1), "posit16");
    LayerNumerics nm;
    op.sample_next_step();
    run(op, x, w, dy, n, hw, 1);
    ASSERT_TRUE(op.numerics(nm));
    EXPECT_EQ(nm.format, precision_name(prec));
    EXPECT_EQ(nm.underflow, 0u);  // posits do not round a nonzero value to zero
    EXPECT_FALSE(nm.scaled);
    expect_learns_a_batch(p);
    p.dfp.gradients.rounding = Rounding::stochastic;
    test::expect_error([&] { p.validate("flags"); }, Status::invalid_argument,
                       {"flags", "gradients rounding 'stochastic'", "rounds to nearest even only"});
  }
}
