// LayerOp (include/dfp/layer_op.hpp): one Conv2d or Linear on plain NCHW tensors. Its passes
// against the FP64 references, the same bits as the layer inside a Model, plans per shape, weight
// loads per version, saved state per ticket, and errors.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/layer_op.hpp"
#include "dfp/model.hpp"
#include "dfp/status.hpp"
#include "tests/common/expect_error.hpp"
#include "tests/common/reference.hpp"
#include "tests/common/tolerance.hpp"

using namespace dfp;

namespace {

Context& ctx() {
  static Context c(ContextOptions{.threads = 2});
  return c;
}

PrecisionPolicy policy(Precision p) {
  PrecisionPolicy pol;
  pol.precision = p;
  return pol;
}

std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }

LayerOpSpec conv_spec(std::string name, int in, int out, int kernel, int stride = 1, int pad = 0, int groups = 1,
                      bool bias = false) {
  LayerOpSpec s;
  s.in_channels = in;
  s.out_channels = out;
  s.kernel = kernel;
  s.stride = stride;
  s.pad = pad;
  s.groups = groups;
  s.bias = bias;
  s.name = std::move(name);
  return s;
}

// The FP64 reference of a grouped convolution with bias: each group a plain convolution.
struct GroupedRef {
  std::vector<double> y, dx, dw, db;
};
GroupedRef grouped_ref(const ConvShape& whole, int groups, const std::vector<float>& x, const std::vector<float>& w,
                       const std::vector<float>& b, const std::vector<float>& dy) {
  ConvShape g = whole;
  g.C = whole.C / groups;
  g.K = whole.K / groups;
  const int OH = whole.OH(), OW = whole.OW();
  const size_t hw = size_t(whole.H) * whole.W, ohw = size_t(OH) * OW, wg = size_t(g.K) * g.C * g.R * g.S;
  GroupedRef r;
  r.y.assign(size_t(whole.N) * whole.K * ohw, 0);
  r.dx.assign(x.size(), 0);
  r.dw.assign(w.size(), 0);
  r.db.assign(whole.K, 0);
  for (int q = 0; q < groups; ++q) {
    std::vector<float> xg(size_t(g.N) * g.C * hw), dyg(size_t(g.N) * g.K * ohw);
    for (int n = 0; n < g.N; ++n) {
      std::memcpy(&xg[size_t(n) * g.C * hw], &x[(size_t(n) * whole.C + size_t(q) * g.C) * hw], g.C * hw * sizeof(float));
      std::memcpy(&dyg[size_t(n) * g.K * ohw], &dy[(size_t(n) * whole.K + size_t(q) * g.K) * ohw],
                  g.K * ohw * sizeof(float));
    }
    const std::vector<float> wg_(w.begin() + q * wg, w.begin() + (q + 1) * wg);
    std::vector<double> y, dx, dw;
    test::conv_fwd_ref(g, xg, wg_, y);
    test::conv_bwd_data_ref(g, dyg, wg_, dx);
    test::conv_bwd_weights_ref(g, xg, dyg, dw);
    for (int n = 0; n < g.N; ++n) {
      for (size_t i = 0; i < g.K * ohw; ++i)
        r.y[(size_t(n) * whole.K + size_t(q) * g.K) * ohw + i] = y[size_t(n) * g.K * ohw + i] + b[q * g.K + i / ohw];
      for (size_t i = 0; i < g.C * hw; ++i) r.dx[(size_t(n) * whole.C + size_t(q) * g.C) * hw + i] = dx[size_t(n) * g.C * hw + i];
    }
    for (size_t i = 0; i < wg; ++i) r.dw[q * wg + i] = dw[i];
  }
  for (int n = 0; n < whole.N; ++n)
    for (int k = 0; k < whole.K; ++k)
      for (size_t i = 0; i < ohw; ++i) r.db[k] += dy[(size_t(n) * whole.K + k) * ohw + i];
  return r;
}

}  // namespace

// Forward, input gradient, weight and bias gradients of a strided, padded, grouped convolution whose
// channels cross a 16-channel block, in fp32 and int16, against FP64.
TEST(LayerOp, GroupedConvMatchesReference) {
  const LayerOpSpec spec = conv_spec("g", 20, 6, 3, 2, 1, 2, true);
  ConvShape s;
  s.N = 3; s.C = 20; s.H = 9; s.W = 7; s.K = 6; s.R = s.S = 3; s.stride_h = s.stride_w = 2; s.pad_h = s.pad_w = 1;
  const std::vector<float> x = test::random_vec(size_t(s.N) * s.C * s.H * s.W, 1);
  const std::vector<float> w = test::random_vec(size_t(s.K) * (s.C / 2) * 9, 2);
  const std::vector<float> b = test::random_vec(s.K, 3);
  const std::vector<float> dy = test::random_vec(size_t(s.N) * s.K * s.OH() * s.OW(), 4);
  const GroupedRef r = grouped_ref(s, 2, x, w, b, dy);
  for (Precision p : {Precision::fp32, Precision::int16}) {
    SCOPED_TRACE(precision_name(p));
    LayerOp op(ctx(), spec, policy(p));
    EXPECT_EQ(op.output_shape(3, 9, 7), (std::array<int, 4>{3, 6, 5, 4}));
    std::vector<float> y(r.y.size()), dx(x.size()), dw(w.size()), db(b.size());
    const uint64_t t = op.forward(x.data(), 3, 9, 7, w.data(), b.data(), 1, y.data(), true, true);
    op.backward(t, dy.data(), dx.data(), dw.data(), db.data());
    const double bound = p == Precision::fp32 ? test::kF32RelL2 : test::kInt16GradRelL2Smooth;
    EXPECT_LE(test::rel_l2(y, to_float(r.y)), bound);
    EXPECT_LE(test::rel_l2(dx, to_float(r.dx)), bound);
    EXPECT_LE(test::rel_l2(dw, to_float(r.dw)), bound);
    EXPECT_LE(test::rel_l2(db, to_float(r.db)), bound);
  }
}

// A LayerOp gives the bits of the same layer inside a Model: here a conv whose 1x1 output is the
// model's logits (so Model::logits, backward(logits_grad) and input_grad show all three passes), in
// int16 (whose plain input the LayerOp quantizes span by span) and fp32, grouped and not.
TEST(LayerOp, SameBitsAsTheLayerInAModel) {
  const int n = 4, c = 20, hw = 4, k = 10;
  const std::vector<float> x = test::random_vec(size_t(n) * c * hw * hw, 5);
  const std::vector<float> dz = test::random_vec(size_t(n) * k, 6);
  for (int groups : {1, 2})
    for (Precision p : {Precision::int16, Precision::fp32}) {
      SCOPED_TRACE(std::string(precision_name(p)) + " groups " + std::to_string(groups));
      Model m(ctx(), "one");
      m.softmax_cross_entropy(m.conv(m.input(c, hw, hw), k, hw, 1, 0, true, "conv", groups));
      m.set_input_grad(true);
      m.build(n, policy(p));
      std::vector<float> xb(blocked_size(n, c, hw, hw)), z(size_t(n) * k), dx(x.size());
      to_blocked(x.data(), xb.data(), n, c, hw, hw);
      m.logits(xb.data(), n, true, z.data());
      m.backward(dz.data());
      m.input_grad(dx.data());
      const TensorView w = m.tensor("conv.weight"), b = m.tensor("conv.bias");

      LayerOp op(ctx(), conv_spec("conv", c, k, hw, 1, 0, groups, true), policy(p));
      std::vector<float> y(z.size()), dx2(x.size()), dw(w.size), db(b.size);
      const uint64_t t = op.forward(x.data(), n, hw, hw, w.data, b.data, 1, y.data(), true, true);
      op.backward(t, dz.data(), dx2.data(), dw.data(), db.data());
      EXPECT_EQ(0, std::memcmp(y.data(), z.data(), z.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(dx2.data(), dx.data(), dx.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(dw.data(), w.grad, dw.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(db.data(), b.grad, db.size() * sizeof(float)));
      LayerNumerics mine, model;
      ASSERT_EQ(op.numerics(mine), p != Precision::fp32);
      if (p == Precision::int16) {
        model = m.numerics().at(0);
        EXPECT_EQ(mine.exp_x, model.exp_x);
        EXPECT_EQ(mine.exp_w, model.exp_w);
        EXPECT_EQ(mine.exp_dy, model.exp_dy);
        EXPECT_EQ(mine.layer, "conv");
      }
    }
}

// A Linear on row-major [n][in] rows, with and without its input gradient.
TEST(LayerOp, LinearMatchesReference) {
  const int n = 5, in = 37, out = 11;
  const std::vector<float> x = test::random_vec(size_t(n) * in, 7), w = test::random_vec(size_t(out) * in, 8);
  const std::vector<float> b = test::random_vec(out, 9), dy = test::random_vec(size_t(n) * out, 10);
  std::vector<double> y(size_t(n) * out), dx(x.size()), dw(w.size());
  for (int i = 0; i < n; ++i)
    for (int o = 0; o < out; ++o) {
      double acc = b[o];
      for (int f = 0; f < in; ++f) {
        acc += double(x[i * in + f]) * w[o * in + f];
        dx[i * in + f] += double(dy[i * out + o]) * w[o * in + f];
        dw[o * in + f] += double(dy[i * out + o]) * x[i * in + f];
      }
      y[i * out + o] = acc;
    }
  LayerOpSpec spec;
  spec.kind = LayerOpSpec::Kind::linear;
  spec.in_channels = in;
  spec.out_channels = out;
  spec.bias = true;
  spec.name = "fc";
  for (Precision p : {Precision::fp32, Precision::int16, Precision::bf16}) {
    SCOPED_TRACE(precision_name(p));
    LayerOp op(ctx(), spec, policy(p));
    const double bound = p == Precision::fp32 ? test::kF32RelL2
                         : p == Precision::int16 ? test::kInt16GradRelL2Smooth
                                                 : test::kBf16GradRelL2Smooth;
    std::vector<float> yo(y.size()), dxo(x.size()), dwo(w.size()), dbo(out);
    for (bool input_grad : {true, false}) {
      const uint64_t t = op.forward(x.data(), n, 1, 1, w.data(), b.data(), 1, yo.data(), true, input_grad);
      op.backward(t, dy.data(), input_grad ? dxo.data() : nullptr, dwo.data(), dbo.data());
      EXPECT_LE(test::rel_l2(yo, to_float(y)), bound);
      EXPECT_LE(test::rel_l2(dwo, to_float(dw)), bound);
      if (input_grad) {
        EXPECT_LE(test::rel_l2(dxo, to_float(dx)), bound);
      }
    }
    EXPECT_EQ(op.plans(), 2u);  // one with the input gradient's buffers, one without
  }
}

// Plans per input shape (the least recently used dropped beyond kMaxPlans), weights loaded once per
// version and plan, and a training forward's state held until another forward of its shape.
TEST(LayerOp, PlansWeightVersionsAndTickets) {
  LayerOp op(ctx(), conv_spec("p", 3, 4, 3, 1, 1), policy(Precision::int16));
  const std::vector<float> w = test::random_vec(4 * 3 * 9, 11);
  std::vector<float> x = test::random_vec(6 * 3 * 5 * 5, 12), y(6 * 4 * 5 * 5), dw(w.size());
  const uint64_t t1 = op.forward(x.data(), 2, 5, 5, w.data(), nullptr, 7, y.data(), true, false);
  op.forward(x.data(), 2, 5, 5, w.data(), nullptr, 7, y.data(), false, false);  // inference: same plan, same weights
  EXPECT_EQ(op.plans(), 1u);
  EXPECT_EQ(op.times().weight_loads, 1u);
  EXPECT_FALSE(op.holds(t1));  // the inference pass replaced the saved state
  test::expect_error([&] { op.backward(t1, y.data(), nullptr, dw.data(), nullptr); }, Status::invalid_argument,
                     {"layer 'p'", "no longer held", "forward again"});
  const uint64_t t2 = op.forward(x.data(), 2, 5, 5, w.data(), nullptr, 8, y.data(), true, false);
  EXPECT_EQ(op.times().weight_loads, 2u);  // a new version
  EXPECT_TRUE(op.holds(t2));
  op.backward(t2, y.data(), nullptr, dw.data(), nullptr);
  op.backward(t2, y.data(), nullptr, dw.data(), nullptr);  // again (retain_graph): the state stays
  test::expect_error([&] { op.backward(t2, y.data(), y.data(), dw.data(), nullptr); }, Status::invalid_argument,
                     {"dx", "without input_grad"});
  for (int batch = 1; batch <= 5; ++batch) op.forward(x.data(), batch, 5, 5, w.data(), nullptr, 8, y.data(), false, false);
  EXPECT_EQ(op.plans(), LayerOp::kMaxPlans);
  EXPECT_EQ(op.times().weight_loads, 6u);  // batch 2 had version 8; 1, 3, 4, 5 load it once each
  EXPECT_EQ(op.steps(), 2u);
}

TEST(LayerOp, ErrorsNameTheLayerAndTheField) {
  LayerOpSpec spec = conv_spec("bad", 6, 4, 3, 1, 0, 4);
  test::expect_error([&] { LayerOp(ctx(), spec, {}); }, Status::invalid_argument, {"layer 'bad'", "in_channels", "groups"});
  spec.groups = 1;
  spec.pad = 3;
  test::expect_error([&] { LayerOp(ctx(), spec, {}); }, Status::invalid_argument, {"layer 'bad'", "padding", "3"});
  spec.pad = 0;
  LayerOp op(ctx(), spec, {});
  test::expect_error([&] { op.output_shape(1, 2, 9); }, Status::invalid_argument, {"layer 'bad'", "kernel 3 larger"});
  std::vector<float> x(6 * 9), w(op.weight_count()), y(4);
  test::expect_error([&] { op.forward(x.data(), 1, 3, 3, w.data(), x.data(), 1, nullptr, false, false); },
                     Status::invalid_argument, {"layer 'bad'", "needs x, y"});
  PrecisionPolicy p;
  p.precision = Precision::fp32;
  p.dfp.weights.rounding = Rounding::biased;
  p.weights_format = FloatFormat::bf16;
  test::expect_error([&] { LayerOp(ctx(), spec, p); }, Status::invalid_argument, {"layer 'bad' policy"});
}

// The sized calls check every buffer against the shapes of the call (backward: of its forward's)
// before touching any: a dy or dx planned for a smaller batch than the forward's is refused, not
// overrun.
TEST(LayerOp, SizedCallsRefuseBuffersOfOtherSizes) {
  LayerOp op(ctx(), conv_spec("sized", 3, 4, 3, 1, 1), policy(Precision::int16));
  const std::vector<float> w = test::random_vec(op.weight_count(), 21);
  const std::vector<float> x = test::random_vec(2 * 3 * 5 * 5, 22);
  std::vector<float> y(2 * 4 * 5 * 5), dx(x.size()), dw(w.size()), b(4);
  test::expect_error([&] { op.forward(std::span(x).first(3 * 5 * 5 + 1), 2, 5, 5, w, {}, 1, y, true, true); },
                     Status::invalid_argument, {"layer 'sized'", "x holds 76 floats", "needs 150"});
  test::expect_error([&] { op.forward(x, 2, 5, 5, std::span(w).first(5), {}, 1, y, true, true); },
                     Status::invalid_argument, {"weights holds 5"});
  test::expect_error([&] { op.forward(x, 2, 5, 5, w, b, 1, y, true, true); }, Status::invalid_argument,
                     {"bias holds 4", "needs 0"});
  test::expect_error([&] { op.forward(x, 2, 5, 5, w, {}, 1, std::span(y).first(100), true, true); },
                     Status::invalid_argument, {"y holds 100", "needs 200"});
  EXPECT_EQ(op.times().forwards, 0u);  // nothing ran
  const uint64_t t = op.forward(x, 2, 5, 5, w, {}, 1, y, true, true);
  EXPECT_EQ(op.input_shape(t), (std::array<int, 4>{2, 3, 5, 5}));
  const std::span<float> dy(y);
  test::expect_error([&] { op.backward(t, dy.first(100), std::span(dx).first(75), dw, {}); }, Status::invalid_argument,
                     {"layer 'sized'", "dy holds 100", "needs 200"});
  test::expect_error([&] { op.backward(t, dy, std::span(dx).first(75), dw, {}); }, Status::invalid_argument,
                     {"dx holds 75", "needs 150"});
  test::expect_error([&] { op.backward(t, dy, dx, std::span(dw).first(1), {}); }, Status::invalid_argument,
                     {"grad_weights holds 1"});
  test::expect_error([&] { op.backward(t, dy, dx, dw, b); }, Status::invalid_argument, {"grad_bias holds 4"});
  EXPECT_EQ(op.times().backwards, 0u);
  op.backward(t, dy, dx, dw, {});
  EXPECT_EQ(op.times().backwards, 1u);
  op.forward(x, 2, 5, 5, w, {}, 1, y, false, false);  // replaces the held state
  test::expect_error([&] { op.input_shape(t); }, Status::invalid_argument, {"no longer held"});
}
