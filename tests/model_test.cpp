// Model graph, layers, optimizer, trainer: published parameter counts, FP32 backward of every
// layer against finite differences, INT16 against FP32, determinism, training on Fashion-MNIST,
// checkpoints and resume.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/loss_scale.hpp"
#include "dfp/models.hpp"
#include "dfp/optim.hpp"
#include "dfp/status.hpp"
#include "dfp/trainer.hpp"
#include "simd/kernel_table.hpp"
#include "src/model/layer.hpp"
#include "tests/common/temp_dir.hpp"
#include "tests/common/tolerance.hpp"
#include "tests/common/expect_error.hpp"
#include "tests/common/isa_levels.hpp"
#include "tests/common/reference.hpp"

using namespace dfp;

namespace {

const Context& ctx2() {
  static Context c(ContextOptions{.threads = 2});
  return c;
}

size_t count(const std::string& name, int c, int h, int w, int classes) {
  Model m(ctx2(), name);
  build_model(m, name, c, h, w, classes);
  return m.parameter_count();
}

std::vector<float> batch_images(const Model& m, uint32_t seed) {
  const TensorShape s = m.shape(0);
  std::vector<float> nchw(size_t(m.batch()) * s.c * s.h * s.w);
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : nchw) v = nd(g);
  std::vector<float> b(blocked_size(m.batch(), s.c, s.h, s.w));
  to_blocked(nchw.data(), b.data(), m.batch(), s.c, s.h, s.w);
  return b;
}

// Builds m as a ResNet-20 for 16x16x3 inputs, batch 4, with `pol`, trains it `steps` SGD steps on
// one fixed batch (batch_images(m, 9), labels 1-4), and returns its weights, concatenated.
std::vector<float> train_small_resnet20(Model& m, const PrecisionPolicy& pol, int steps) {
  build_model(m, "resnet20", 3, 16, 16, 10);
  m.build(4, pol);
  Sgd sgd(ctx2(), m, {0.9f, 5e-4f, true});
  const auto x = batch_images(m, 9);
  const std::vector<int32_t> y = {1, 2, 3, 4};
  for (int s = 0; s < steps; ++s) {
    m.forward(x.data(), y.data(), 4, true);
    m.backward();
    sgd.step(0.05f);
  }
  std::vector<float> w;
  for (const Parameter& p : m.parameters()) w.insert(w.end(), p.value, p.value + p.size);
  return w;
}

// Checks d(loss)/d(param) of every parameter tensor of a model against central differences on a
// few entries. The loss is computed in double from FP32 activations; h balances truncation and
// FP32 rounding.
void check_gradients(Model& m, const std::vector<float>& x, const std::vector<int32_t>& y) {
  m.forward(x.data(), y.data(), m.batch(), true);
  m.backward();
  m.set_step(m.step() - 1);  // the finite differences must see the same dropout mask
  std::mt19937 g(7);
  auto loss_at = [&](Parameter& p, size_t i, float v) {
    const float w0 = p.value[i];
    p.value[i] = v;
    m.weights_updated();
    const double l = m.forward(x.data(), y.data(), m.batch(), true).loss;
    p.value[i] = w0;
    m.weights_updated();
    return l;
  };
  int checked = 0, kinks = 0;
  for (Parameter& p : m.parameters()) {
    const std::vector<float> analytic(p.grad, p.grad + p.size);
    for (int t = 0; t < 10; ++t) {
      const size_t i = std::uniform_int_distribution<size_t>(0, p.size - 1)(g);
      if (p.name.find(".bn") != std::string::npos && analytic[i] == 0.f) continue;  // padding lane
      const float w0 = p.value[i];
      const float h = 2e-3f * std::max(1.f, std::fabs(w0));
      const double n1 = (loss_at(p, i, w0 + h) - loss_at(p, i, w0 - h)) / (2.0 * h);
      const double n2 = (loss_at(p, i, w0 + h / 2) - loss_at(p, i, w0 - h / 2)) / double(h);
      // A ReLU or max-pool switch inside [w0-h, w0+h] makes the two estimates disagree: the loss
      // is not differentiable there, so the entry says nothing about the backward pass.
      if (std::fabs(n1 - n2) > 2e-4 + 0.02 * std::fabs(n1)) { ++kinks; continue; }
      ++checked;
      EXPECT_NEAR(analytic[i], n2, 1e-3 + 2e-2 * std::fabs(n2)) << p.name << "[" << i << "]";
    }
  }
  EXPECT_LE(kinks, checked / 4) << "too many non-differentiable points to trust the check";
}

}  // namespace

TEST(Models, PublishedParameterCounts) {
  EXPECT_EQ(count("lenet", 1, 28, 28, 10), 61706u);         // LeCun et al. 1998 (LeNet-5)
  EXPECT_EQ(count("resnet20", 3, 32, 32, 10), 269722u);     // He et al. 2016: 0.27M
  EXPECT_EQ(count("resnet32", 3, 32, 32, 10), 464154u);     // 0.46M
  EXPECT_EQ(count("resnet44", 3, 32, 32, 10), 658586u);     // 0.66M
  EXPECT_EQ(count("resnet56", 3, 32, 32, 10), 853018u);     // 0.85M
  EXPECT_EQ(count("resnet110", 3, 32, 32, 10), 1727962u);   // 1.7M
  EXPECT_EQ(count("resnet18", 3, 224, 224, 1000), 11689512u);  // torchvision
  EXPECT_EQ(count("resnet34", 3, 224, 224, 1000), 21797672u);
  EXPECT_EQ(count("resnet50", 3, 224, 224, 1000), 25557032u);
  EXPECT_EQ(count("vgg11", 3, 224, 224, 1000), 132863336u);
  EXPECT_EQ(count("vgg13", 3, 224, 224, 1000), 133047848u);
  EXPECT_EQ(count("vgg16", 3, 224, 224, 1000), 138357544u);
  EXPECT_EQ(count("vgg19", 3, 224, 224, 1000), 143667240u);
  EXPECT_EQ(count("vgg11bn", 3, 224, 224, 1000), 132868840u);
  EXPECT_EQ(count("vgg13bn", 3, 224, 224, 1000), 133053736u);
  EXPECT_EQ(count("vgg16bn", 3, 224, 224, 1000), 138365992u);
  EXPECT_EQ(count("vgg19bn", 3, 224, 224, 1000), 143678248u);
  // CIFAR stem (3x3 stride 1, no max pool), 10 classes: torchvision's counts less the 7x7 stem
  // and the 1000-way fc, as in the widely used CIFAR ResNet-18/34/50 (11.17M, 21.28M, 23.52M).
  EXPECT_EQ(count("resnet18c", 3, 32, 32, 10), 11173962u);
  EXPECT_EQ(count("resnet34c", 3, 32, 32, 10), 21282122u);
  EXPECT_EQ(count("resnet50c", 3, 32, 32, 10), 23520842u);
  EXPECT_EQ(count("resnext50", 3, 224, 224, 1000), 25028904u);  // torchvision resnext50_32x4d
  // Less the 7x7 stem (9408) and the 1000-way fc (2049000), plus a 3x3 stem (1728) and a 10-way fc.
  EXPECT_EQ(count("resnext50c", 3, 32, 32, 10), 22992714u);
  EXPECT_EQ(count("alexnet", 3, 224, 224, 1000), 62378344u);   // Krizhevsky et al. 2012, one tower
  EXPECT_EQ(count("googlenet", 3, 224, 224, 1000), 6624904u);  // torchvision, no aux classifiers
}

TEST(Models, AcceptSmallAndGrayscaleInputs) {
  for (const std::string& name : model_names()) {
    if (name == "alexnet") continue;  // needs >= 63 pixels by design
    Model m(ctx2(), name);
    EXPECT_NO_THROW(build_model(m, name, 1, 28, 28, 10)) << name;
  }
  Model m(ctx2(), "alexnet");
  EXPECT_THROW(build_model(m, "alexnet", 1, 28, 28, 10), Error);
  // Other ImageNet-sized inputs: 448 pools the 14x14 features to torchvision's 7x7 (the same
  // parameters as at 224); 96 and 256 flatten their 3x3 and 8x8 maps.
  EXPECT_EQ(count("vgg16", 3, 448, 448, 1000), 138357544u);
  EXPECT_EQ(count("vgg11bn", 3, 256, 256, 10), count("vgg11bn", 3, 224, 224, 10) + size_t(512) * (64 - 49) * 4096);
  EXPECT_EQ(count("vgg13", 3, 96, 96, 10), count("vgg13", 3, 224, 224, 10) - size_t(512) * (49 - 9) * 4096);
  Model u(ctx2(), "x");
  EXPECT_THROW(build_model(u, "resnet21", 3, 32, 32, 10), Error);
}

// Per-layer overrides: glob patterns ('*', '?'), the first match wins, and a pattern that names no
// layer is refused with the layer names.
TEST(Policy, OverridesMatchGlobsFirstMatchWinsAndMustMatchALayer) {
  PrecisionPolicy pol;
  pol.precision = Precision::int16;
  pol.overrides = PrecisionPolicy::parse_overrides("layer1.?.conv1=fp32,layer1.*=bf16,,fc=fp32", "test");
  ASSERT_EQ(pol.overrides.size(), 3u);
  Model m(ctx2(), "resnet20");
  build_model(m, "resnet20", 3, 16, 16, 10);
  m.build(2, pol);
  std::map<std::string, std::string> prec;
  for (const LayerNumerics& n : m.numerics()) prec[n.layer] = n.format;
  EXPECT_EQ(prec.count("layer1.0.conv1"), 0u);  // fp32 layers report no numerics
  EXPECT_EQ(prec.count("fc"), 0u);
  EXPECT_EQ(prec["layer1.0.conv2"], "bf16");     // the second pattern
  EXPECT_EQ(prec["layer1.2.conv2"], "bf16");
  EXPECT_EQ(prec["layer2.0.conv1"], "int16");    // no pattern: the policy's precision
  EXPECT_EQ(prec["conv1"], "int16");
  test::expect_error([] { PrecisionPolicy::parse_overrides("conv1", "flag --override"); }, Status::invalid_argument,
                     {"flag --override", "PATTERN=PRECISION", "'conv1'"});
  PrecisionPolicy typo = pol;
  typo.overrides = {{"layer1.*", Precision::fp32}, {"feature.0", Precision::fp32}};
  Model v(ctx2(), "resnet20");
  build_model(v, "resnet20", 3, 16, 16, 10);
  test::expect_error([&] { v.build(2, typo); }, Status::invalid_argument,
                     {"override 'feature.0=fp32' matches no layer", "conv1, conv1.bn"});
}

TEST(Models, GraphDescribesEveryNode) {
  Model m(ctx2(), "resnet20");
  build_model(m, "resnet20", 3, 32, 32, 10);
  const std::vector<LayerSpec> g = m.graph();
  int convs = 0, adds = 0, fcs = 0;
  for (const LayerSpec& s : g) {
    convs += s.kind == "conv";
    adds += s.kind == "add";
    fcs += s.kind == "fc";
    for (int i : s.inputs) EXPECT_LT(i, &s - g.data());  // inputs come first
  }
  EXPECT_EQ(g.front().kind, "input");
  EXPECT_EQ(convs, 19);  // 1 stem + 9 blocks x 2 (option-A shortcuts have no conv)
  EXPECT_EQ(adds, 9);
  EXPECT_EQ(fcs, 1);
  EXPECT_EQ(g[m.loss_node()].kind, "fc");
  EXPECT_EQ(g[m.loss_node()].shape.c, 10);
  EXPECT_EQ(g[1].kernel, 3);
  EXPECT_EQ(g[1].out_channels, 16);
}

TEST(Layers, Fp32BackwardMatchesFiniteDifferences) {
  // conv(+bias), BN, ReLU, max and average pooling, flatten, linear.
  {
    Model m(ctx2(), "a");
    auto x = m.input(3, 8, 8);
    x = m.relu(m.batchnorm(m.conv(x, 5, 3, 1, 1, true, "c1"), "bn1"), "r1");
    x = m.maxpool(x, 2, 2, 0, false, "mp");
    x = m.conv(x, 6, 3, 2, 1, false, "c2");
    x = m.avgpool(x, 2, 1, 0, "ap");
    x = m.linear(m.flatten(x, "fl"), 4, true, "fc");
    m.softmax_cross_entropy(x, 0.1f);
    m.build(3, {});
    check_gradients(m, batch_images(m, 1), {0, 3, 1});
  }
  // Residual add with fan-out, option-A shortcut, global average pool.
  {
    Model m(ctx2(), "b");
    auto x = m.input(2, 6, 6);
    auto a = m.conv(x, 4, 3, 1, 1, false, "c1");
    auto y = m.relu(m.conv(a, 4, 3, 1, 1, false, "c2"), "r");
    auto s = m.add(y, a, "add");  // a feeds c2 and the add: gradient accumulation
    auto z = m.conv(s, 6, 3, 2, 1, false, "c3");
    auto t = m.add(z, m.shortcut_pad(s, 6, 2, "sc"), "add2");
    m.softmax_cross_entropy(m.linear(m.global_avgpool(t, "gap"), 3, true, "fc"));
    m.build(2, {});
    check_gradients(m, batch_images(m, 2), {2, 0});
  }
  // Concat (unaligned channel offsets), LRN, dropout.
  {
    Model m(ctx2(), "c");
    auto x = m.input(3, 5, 5);
    auto a = m.conv(x, 5, 1, 1, 0, true, "a");
    auto b = m.conv(x, 7, 3, 1, 1, true, "b");
    auto c = m.concat({a, b}, "cat");
    c = m.lrn(c, 5, 1e-1f, 0.75f, 2.f, "lrn");
    c = m.dropout(c, 0.3f, "drop");
    m.softmax_cross_entropy(m.linear(m.flatten(c, "fl"), 3, true, "fc"));
    m.build(2, {});
    check_gradients(m, batch_images(m, 3), {1, 2});
  }
  // Grouped convolutions: groups of 2 input and 3 output channels (lanes cut across blocks), and of
  // 16 (whole blocks), each after another conv so that its input gradient matters.
  {
    Model m(ctx2(), "d");
    auto x = m.input(3, 6, 6);
    x = m.conv(x, 6, 3, 1, 1, false, "c0");
    x = m.relu(m.conv(x, 9, 3, 1, 1, true, "g1", 3), "r1");
    x = m.conv(x, 32, 1, 1, 0, false, "c2");
    x = m.conv(x, 32, 3, 2, 1, false, "g3", 2);
    m.softmax_cross_entropy(m.linear(m.global_avgpool(x, "gap"), 3, true, "fc"));
    m.build(2, {});
    check_gradients(m, batch_images(m, 4), {2, 1});
  }
}


namespace {
// Parameter gradients of one batch in fp32 and in `low` (same seed, same data).
void lowp_vs_fp32(const std::function<void(Model&)>& make, int batch, std::vector<std::vector<float>> (&grads)[2],
                  double (&loss)[2], Precision low = Precision::int16, double loss_scale = 1, bool adaptive = false) {
  for (int p = 0; p < 2; ++p) {
    Model m(ctx2(), "r");
    make(m);
    PrecisionPolicy pol;
    pol.precision = p ? low : Precision::fp32;
    m.build(batch, pol);
    if (p) {
      LossScaleOptions o;
      o.mode = adaptive ? LossScaleMode::adaptive : LossScaleMode::fixed;
      m.set_loss_scaling(o);
      m.set_loss_scale(loss_scale);
    }
    const auto x = batch_images(m, 5);
    std::vector<int32_t> y(batch);
    for (int i = 0; i < batch; ++i) y[i] = i % 10;
    loss[p] = m.forward(x.data(), y.data(), batch, true).loss;
    EXPECT_TRUE(m.backward());
    for (const Parameter& q : m.parameters()) grads[p].emplace_back(q.grad, q.grad + q.size);
  }
}
// Cosine similarity of two whole-network gradients (all tensors as one vector).
double cosine(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double dot = 0, n0 = 0, n1 = 0;
  for (size_t t = 0; t < a.size(); ++t)
    for (size_t i = 0; i < a[t].size(); ++i) {
      dot += double(a[t][i]) * b[t][i];
      n0 += double(a[t][i]) * a[t][i];
      n1 += double(b[t][i]) * b[t][i];
    }
  return dot / std::sqrt(n0 * n1);
}
// Batch-8 losses within `loss_tol` (relative) and every parameter gradient tensor within `tol`
// (relative L2) of FP32's, in each low precision (with its static loss scale).
struct TrackCase {
  Precision p;
  double loss_scale, tol, loss_tol;
};
// INT16 keeps the loss within 1e-4 of FP32's, the 8- and 11-bit formats within 1%.
constexpr double kInt16LossRel = 1e-4, kFloatLossRel = 1e-2;
void each_tensor_tracks_fp32(const std::function<void(Model&)>& make, std::initializer_list<TrackCase> cases) {
  for (const TrackCase& c : cases) {
    std::vector<std::vector<float>> g[2];
    double loss[2];
    lowp_vs_fp32(make, 8, g, loss, c.p, c.loss_scale);
    EXPECT_NEAR(loss[0], loss[1], c.loss_tol * loss[0]) << precision_name(c.p);
    for (size_t t = 0; t < g[0].size(); ++t)
      EXPECT_LT(test::rel_l2(g[1][t], g[0][t]), c.tol) << precision_name(c.p) << " " << t;
  }
}
}  // namespace

// Through ReLUs, a pre-activation within one quantization step of zero can switch sides, and
// BatchNorm's backward (which leaves a small residual of large cancelling terms) amplifies such
// switches in single tensors; the gradient as a whole must still point the same way.
TEST(Layers, Int16GradientsTrackFp32ResNet20) {
  std::vector<std::vector<float>> g[2];
  double loss[2];
  lowp_vs_fp32([](Model& m) { build_model(m, "resnet20", 3, 16, 16, 10); }, 8, g, loss);
  EXPECT_NEAR(loss[0], loss[1], 1e-3 * loss[0]);
  EXPECT_GT(cosine(g[0], g[1]), test::kInt16GradCosineNetwork);
}

// Without kinks (conv, BN, average pooling, linear) every gradient tensor follows FP32 closely:
// INT16, and BF16 and FP16 operands with FP32 accumulation within the formats' precision (FP16
// with a loss scale, so that small gradients stay normal).
TEST(Layers, LowPrecisionGradientsTrackFp32WithoutKinks) {
  auto make = [](Model& m) {
    auto x = m.input(3, 16, 16);
    x = m.batchnorm(m.conv(x, 16, 3, 1, 1, false, "c1"), "bn1");
    x = m.conv(x, 32, 3, 2, 1, true, "c2");
    m.softmax_cross_entropy(m.linear(m.global_avgpool(x, "gap"), 10, true, "fc"));
  };
  each_tensor_tracks_fp32(make, {{Precision::int16, 1.0, test::kInt16GradRelL2Smooth, kInt16LossRel},
                                 {Precision::bf16, 1.0, test::kBf16GradRelL2Smooth, kFloatLossRel},
                                 {Precision::fp16, 1024.0, test::kFp16GradRelL2Smooth, kFloatLossRel}});
}

namespace {
// conv0 (C -> C) then a conv of `groups` groups (C -> K), global pooling, a classifier. With
// groups == 1 the second conv is ungrouped; a test sets its weights to a grouped twin's in the
// diagonal blocks, zero elsewhere: the same function.
void grouped_pair(Model& m, int c, int k, int groups) {
  auto x = m.input(c, 7, 7);
  x = m.relu(m.conv(x, c, 3, 1, 1, false, "conv0"), "r0");
  x = m.conv(x, k, 3, 2, 1, true, "conv1", groups);
  m.softmax_cross_entropy(m.linear(m.global_avgpool(x, "gap"), 5, true, "fc"));
}
}  // namespace

// A grouped conv is an ungrouped conv whose weight is block diagonal: the same loss and gradients
// (the diagonal blocks of the dense weight gradient, the input gradient through conv0), and
// PyTorch's [K][C/G][R][S] weight layout. Odd group widths cut channel blocks; 16-channel groups
// do not.
TEST(Layers, GroupedConvIsABlockDiagonalConv) {
  for (auto [c, k, groups] : {std::tuple{20, 15, 5}, std::tuple{32, 48, 2}, std::tuple{12, 12, 12}}) {
    SCOPED_TRACE(std::to_string(c) + "->" + std::to_string(k) + " groups " + std::to_string(groups));
    Model g(ctx2(), "g"), d(ctx2(), "d");
    grouped_pair(g, c, k, groups);
    grouped_pair(d, c, k, 1);
    g.build(3, {});
    d.build(3, {});
    ASSERT_EQ(g.parameters()[1].size, size_t(k) * (c / groups) * 9);
    const int cg = c / groups, kg = k / groups;
    // Offsets of tap block (o, i) of conv1's weight: in the grouped [K][C/G][3][3] and in the
    // dense [K][C][3][3], where it sits in o's group's diagonal block.
    auto grouped_at = [&](int o, int i) { return (size_t(o) * cg + i) * 9; };
    auto dense_at = [&](int o, int i) { return (size_t(o) * c + o / kg * cg + i) * 9; };
    auto& gp = g.parameters();
    auto& dp = d.parameters();
    ASSERT_EQ(gp.size(), dp.size());
    for (size_t p = 0; p < gp.size(); ++p) {
      if (p == 1) {  // conv1.weight: embed [K][C/G][3][3] block-diagonally into [K][C][3][3]
        std::fill(dp[p].value, dp[p].value + dp[p].size, 0.f);
        for (int o = 0; o < k; ++o)
          for (int i = 0; i < cg; ++i)
            std::memcpy(dp[p].value + dense_at(o, i), gp[p].value + grouped_at(o, i), 9 * sizeof(float));
      } else {
        std::memcpy(dp[p].value, gp[p].value, gp[p].size * sizeof(float));
      }
    }
    for (size_t b = 0; b < g.buffers().size(); ++b) *d.buffers()[b].second = *g.buffers()[b].second;
    d.weights_updated();
    const auto x = batch_images(g, 6);
    const std::vector<int32_t> y = {4, 0, 2};
    const double lg = g.forward(x.data(), y.data(), 3, true).loss;
    const double ld = d.forward(x.data(), y.data(), 3, true).loss;
    EXPECT_NEAR(lg, ld, 1e-5 * std::fabs(ld));
    ASSERT_TRUE(g.backward());
    ASSERT_TRUE(d.backward());
    for (size_t p = 0; p < gp.size(); ++p) {
      std::vector<float> want(dp[p].grad, dp[p].grad + dp[p].size);
      if (p == 1) {  // the dense gradient's diagonal blocks, in the grouped layout
        std::vector<float> diag(gp[p].size);
        for (int o = 0; o < k; ++o)
          for (int i = 0; i < cg; ++i)
            std::memcpy(diag.data() + grouped_at(o, i), want.data() + dense_at(o, i), 9 * sizeof(float));
        want = diag;
      }
      EXPECT_LT(test::rel_l2(gp[p].grad, want.data(), want.size()), 1e-5) << gp[p].name;
    }
  }
  Model bad(ctx2(), "m");
  auto x = bad.input(6, 4, 4);
  test::expect_error([&] { bad.conv(x, 8, 3, 1, 1, false, "split", 4); }, Status::invalid_argument,
                     {"conv 'split'", "groups 4", "input channels (6)", "output channels (8)"});
  test::expect_error([&] { bad.conv(x, 8, 3, 1, 1, false, "none", 0); }, Status::invalid_argument,
                     {"conv 'none'", "groups must be at least 1"});
}

// A grouped INT16 conv reports its numerics as one layer's: the exponents of its largest group,
// and the SQNR of the whole tensors, also when a group's input is all zero (its own SQNR is
// undefined, its exponent 0).
TEST(Layers, GroupedConvReportsWholeTensorNumerics) {
  Model m(ctx2(), "m");
  auto x = m.input(3, 6, 6);
  x = m.relu(m.conv(x, 8, 3, 1, 1, false, "c0"), "r0");
  x = m.conv(x, 8, 3, 1, 1, false, "g", 4);
  m.softmax_cross_entropy(m.linear(m.global_avgpool(x, "gap"), 4, true, "fc"));
  PrecisionPolicy pol;
  pol.precision = Precision::int16;
  m.build(2, pol);
  m.set_numerics_interval(1);
  Parameter& c0 = m.parameters()[0];
  std::fill(c0.value, c0.value + 2 * 27, 0.f);  // channels 0 and 1, group 0's input, are zero
  m.weights_updated();
  const auto img = batch_images(m, 8);
  const std::vector<int32_t> y = {0, 2};
  m.forward(img.data(), y.data(), 2, true);
  ASSERT_TRUE(m.backward());
  const std::vector<LayerNumerics> all = m.numerics();
  const auto g = std::find_if(all.begin(), all.end(), [](const LayerNumerics& n) { return n.layer == "g"; });
  const auto c = std::find_if(all.begin(), all.end(), [](const LayerNumerics& n) { return n.layer == "c0"; });
  ASSERT_NE(g, all.end());
  ASSERT_NE(c, all.end());
  EXPECT_TRUE(g->sampled);
  EXPECT_TRUE(std::isfinite(g->sqnr_x_db)) << g->sqnr_x_db;
  EXPECT_GT(g->sqnr_x_db, 60.0);  // DFP16 round-to-nearest: about 14 bits below the largest value
  EXPECT_LT(g->exp_x, 0) << "the largest group's exponent, not the empty group's 0";
  EXPECT_EQ(g->format, "int16");
}

// Grouped convolutions in INT16 (a DFP16 exponent per group), BF16 and FP16 follow FP32 as
// ungrouped ones do, tensor by tensor.
TEST(Layers, GroupedConvLowPrecisionTracksFp32) {
  auto make = [](Model& m) {
    auto x = m.input(3, 16, 16);
    x = m.batchnorm(m.conv(x, 20, 3, 1, 1, false, "c1"), "bn1");
    x = m.conv(x, 30, 3, 2, 1, true, "g2", 5);   // 4 -> 6 channels per group
    x = m.conv(x, 32, 1, 1, 0, false, "g3", 2);  // 15 -> 16
    m.softmax_cross_entropy(m.linear(m.global_avgpool(x, "gap"), 10, true, "fc"));
  };
  each_tensor_tracks_fp32(make, {{Precision::int16, 1.0, test::kInt16GradRelL2Smooth, kInt16LossRel},
                                 {Precision::bf16, 1.0, test::kBf16GradRelL2Smooth, kFloatLossRel},
                                 {Precision::fp16, 1024.0, test::kFp16GradRelL2Smooth, kFloatLossRel}});
}

// A case built to underflow: a classifier with tiny weights makes the gradient reaching the conv
// ~1e-9, below FP16's smallest subnormal (6e-8). Without loss scaling FP16 loses it entirely;
// with GradScaler's initial scale 2^16 it is representable and matches FP32.
TEST(LossScaling, Fp16UnderflowLosesTheGradientUnlessScaled) {
  auto run = [](Precision p, double scale) {
    Model m(ctx2(), "u");
    auto x = m.input(3, 8, 8);
    x = m.conv(x, 16, 3, 1, 1, false, "c1");
    m.softmax_cross_entropy(m.linear(m.global_avgpool(x, "gap"), 10, false, "fc"));
    PrecisionPolicy pol;
    pol.precision = p;
    pol.overrides = {{"fc", Precision::fp32}};
    m.build(8, pol);
    for (Parameter& q : m.parameters())
      if (q.name == "fc.weight")
        for (size_t i = 0; i < q.size; ++i) q.value[i] = 1e-7f * float(int(i % 7) - 3);
    m.weights_updated();
    m.set_loss_scale(scale);
    const auto xs = batch_images(m, 3);
    const std::vector<int32_t> y = {0, 1, 2, 3, 4, 5, 6, 7};
    m.forward(xs.data(), y.data(), 8, true);
    EXPECT_TRUE(m.backward());
    for (Parameter& q : m.parameters())
      if (q.name == "c1.weight") return std::vector<float>(q.grad, q.grad + q.size);
    return std::vector<float>{};
  };
  const std::vector<float> ref = run(Precision::fp32, 1);
  const std::vector<float> lost = run(Precision::fp16, 1);
  const std::vector<float> scaled = run(Precision::fp16, LossScaleOptions{}.initial_scale());
  double ref_norm = 0;
  for (float v : ref) ref_norm += double(v) * v;
  ASSERT_GT(ref_norm, 0);
  for (float v : lost) ASSERT_EQ(v, 0.f) << "the FP16 gradient was expected to underflow to zero";
  EXPECT_LT(test::rel_l2(scaled, ref), test::kFp16GradRelL2Smooth);
}

// Gradients that overflow FP16 under too large a scale are reported, never applied silently.
TEST(LossScaling, Fp16OverflowIsReportedAsNonFinite) {
  Model m(ctx2(), "o");
  build_model(m, "lenet", 1, 28, 28, 10);
  PrecisionPolicy pol;
  pol.precision = Precision::fp16;
  m.build(4, pol);
  m.set_loss_scale(0x1p40);
  const auto xs = batch_images(m, 3);
  const std::vector<int32_t> y = {0, 1, 2, 3};
  m.forward(xs.data(), y.data(), 4, true);
  EXPECT_FALSE(m.backward());
  m.set_loss_scale(256);
  m.forward(xs.data(), y.data(), 4, true);
  EXPECT_TRUE(m.backward());
}

// Adaptive loss scaling multiplies gradients by per-layer powers of two and divides them out
// again: the parameter gradients match FP32 like plain FP16 with a good static scale.
TEST(LossScaling, AdaptiveFp16TracksFp32) {
  std::vector<std::vector<float>> g[2];
  double loss[2];
  lowp_vs_fp32([](Model& m) { build_model(m, "resnet20", 3, 16, 16, 10); }, 8, g, loss, Precision::fp16, 1, true);
  EXPECT_GT(cosine(g[0], g[1]), test::kInt16GradCosineNetwork);
}

TEST(LossScaling, AdaptiveFactorMatchesHandComputedCase) {
  // E[g^2] = 1e-12, E[w^2] = 1e-2, fan_in 144: sigma_o = sqrt(1e-14) * sqrt(72) = 8.485e-7;
  // alpha_lo = 6e-8 / (1.2533e-3 * 8.485e-7) = 56.4; the overflow bound (6e4/144)/(1e-5*0.3)
  // = 1.4e8 does not bind; capped at 16 -> 16; with cap 64 -> 32 (power of two below 56.4);
  // with 512 already accumulated and max_scale 1024 -> 2.
  AdaptiveInputs in;
  in.g_mean_sq = 1e-12; in.w_mean_sq = 1e-2; in.g_max_abs = 1e-5; in.w_max_abs = 0.3; in.fan_in = 144;
  EXPECT_EQ(adaptive_layer_factor(in, FloatFormat::fp16, 16, 1024), 16.0);
  EXPECT_EQ(adaptive_layer_factor(in, FloatFormat::fp16, 64, 1024), 32.0);
  in.scale_so_far = 512;
  EXPECT_EQ(adaptive_layer_factor(in, FloatFormat::fp16, 64, 1024), 2.0);
  // Large gradients: alpha_lo < 1, so no scaling; the overflow bound can push below 1.
  in.scale_so_far = 1;
  in.g_mean_sq = 1; in.g_max_abs = 100; in.w_max_abs = 10;
  EXPECT_EQ(adaptive_layer_factor(in, FloatFormat::fp16, 16, 1024), 0.25);  // (6e4/144)/1000 = 0.417
  EXPECT_EQ(adaptive_layer_factor(in, FloatFormat::fp32, 16, 1024), 1.0);
}

// BF16 runs oneDNN's BF16 primitives: with AMX tiles (TDPBF16PS) where the CPU has them and
// oneDNN takes them, else with VDPBF16PS where the CPU has AVX512_BF16, else in oneDNN's
// emulation of VDPBF16PS. What holds on each CPU:
//   - VDPBF16PS and its emulation give the same bits (the emulation is exact);
//   - AMX tiles sum the same exact products in another order: on a network without kinks the
//     gradients agree with the VDPBF16PS ones to FP32 rounding carried through one step, not bit
//     for bit (through ReLUs and BatchNorm a pre-activation that switches sides moves single
//     gradients far more, as between any two summation orders).
// The tests re-run this binary under ONEDNN_MAX_CPU_ISA (AVX512_CORE: no AVX512_BF16;
// AVX512_CORE_BF16: no AMX) and compare one training step's gradients.
TEST(Bf16, WriteOneStep) {
  const char* out = std::getenv("DFP_TEST_BF16_OUT");
  if (!out) GTEST_SKIP() << "helper of Bf16.EmulationGivesTheSameBits and Bf16.AmxAgreesWithVdpbf16ps";
  Model m(ctx2(), "b");
  const char* net = std::getenv("DFP_TEST_BF16_NET");
  if (net && std::string(net) == "smooth") {  // no kinks: conv, BN, average pooling, linear
    auto x = m.input(16, 16, 16);
    x = m.batchnorm(m.conv(x, 32, 3, 1, 1, false, "c1"), "bn1");
    x = m.conv(x, 64, 3, 2, 1, true, "c2");
    m.softmax_cross_entropy(m.linear(m.global_avgpool(x, "gap"), 10, true, "fc"));
  } else {
    build_model(m, "resnet20", 3, 16, 16, 10);
  }
  PrecisionPolicy pol;
  pol.precision = Precision::bf16;
  m.build(8, pol);
  const auto xs = batch_images(m, 5);
  std::vector<int32_t> y(8);
  for (int i = 0; i < 8; ++i) y[i] = i;
  m.forward(xs.data(), y.data(), 8, true);
  m.backward();
  std::ofstream f(out, std::ios::binary);
  for (const Parameter& q : m.parameters()) f.write(reinterpret_cast<const char*>(q.grad), q.size * sizeof(float));
}

namespace {
// Whether the environment limits oneDNN below `isa` (ONEDNN_MAX_CPU_ISA, as ctest's avx2_only:
// re-run sets it to play an AVX2-only CPU): the tests then skip, as they do on such a CPU.
bool onednn_limited_below(const std::string& isa) {
  const char* limit = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (!limit || !*limit) return false;
  const std::string l = limit;
  if (l == "ALL" || l.find("AMX") != std::string::npos) return false;
  if (isa == "AMX") return true;
  return l.find("BF16") == std::string::npos && l.find("FP16") == std::string::npos;  // isa: AVX512_CORE_BF16
}

// One BF16 training step in a child process with oneDNN limited to `max_isa` ("": unlimited);
// returns its gradients' bytes and its oneDNN verbose log.
// `net`: "resnet20", or "smooth" (no kinks, 16 -> 32 -> 64 channels).
std::pair<std::string, std::string> bf16_step(const std::string& dir, const std::string& name, const std::string& max_isa,
                                              const std::string& net) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe");
  const std::string file = dir + "/" + name;
  const std::string cmd = (max_isa.empty() ? "" : "ONEDNN_MAX_CPU_ISA=" + max_isa + " ") + "DFP_TEST_BF16_NET=" + net +
                          " ONEDNN_VERBOSE=1 DFP_TEST_BF16_OUT='" + file + "' '" + self +
                          "' --gtest_filter=Bf16.WriteOneStep > '" + file + ".log' 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto slurp_file = [](const std::string& f) {
    std::ifstream in(f, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  return {slurp_file(file), slurp_file(file + ".log")};
}
}  // namespace

TEST(Bf16, EmulationGivesTheSameBits) {
  if (!detect_cpu_features().avx512bf16) GTEST_SKIP() << "CPU lacks AVX512_BF16: both runs would be emulated";
  if (onednn_limited_below("AVX512_CORE_BF16")) GTEST_SKIP() << "ONEDNN_MAX_CPU_ISA excludes AVX512_BF16";
  const test::TempDir tmp("dfp_bf16_");
  const auto [native, native_log] = bf16_step(tmp.str(), "native", "AVX512_CORE_BF16", "resnet20");
  const auto [emulated, emulated_log] = bf16_step(tmp.str(), "emulated", "AVX512_CORE", "resnet20");
  EXPECT_NE(native_log.find("avx512_core_bf16"), std::string::npos) << "native run did not use VDPBF16PS";
  EXPECT_EQ(native_log.find("amx"), std::string::npos) << "AVX512_CORE_BF16 run used AMX";
  EXPECT_EQ(emulated_log.find("avx512_core_bf16"), std::string::npos) << "emulated run used VDPBF16PS";
  ASSERT_FALSE(native.empty());
  EXPECT_TRUE(native == emulated) << "BF16 gradients differ between native and emulated runs";
}

TEST(Bf16, AmxAgreesWithVdpbf16ps) {
  const CpuFeatures cpu = detect_cpu_features();
  if (!(cpu.amx_bf16 && cpu.os_saves_amx && cpu.avx512bf16)) GTEST_SKIP() << "CPU lacks AMX-BF16";
  if (onednn_limited_below("AMX")) GTEST_SKIP() << "ONEDNN_MAX_CPU_ISA excludes AMX";
  const test::TempDir tmp("dfp_bf16_amx_");
  const auto [amx, amx_log] = bf16_step(tmp.str(), "amx", "", "smooth");
  const auto [vdp, vdp_log] = bf16_step(tmp.str(), "vdpbf16ps", "AVX512_CORE_BF16", "smooth");
  EXPECT_NE(amx_log.find("avx512_core_amx_bf16"), std::string::npos) << "default run did not use AMX tiles";
  EXPECT_EQ(vdp_log.find("amx"), std::string::npos) << "AVX512_CORE_BF16 run used AMX";
  ASSERT_EQ(amx.size(), vdp.size());
  ASSERT_FALSE(amx.empty());
  std::vector<float> a(amx.size() / sizeof(float)), b(a.size());
  std::memcpy(a.data(), amx.data(), amx.size());
  std::memcpy(b.data(), vdp.data(), vdp.size());
  EXPECT_LE(test::rel_l2(a.data(), b.data(), a.size()), test::kAmxGradRelL2) << "AMX and VDPBF16PS gradients disagree";
}

TEST(Training, SameSeedSameBits) {
  std::vector<float> w[2];
  for (int r = 0; r < 2; ++r) {
    Model m(ctx2(), "d");
    PrecisionPolicy pol;
    pol.precision = Precision::int16;
    pol.dfp.gradients.rounding = Rounding::stochastic;
    w[r] = train_small_resnet20(m, pol, 3);
  }
  ASSERT_EQ(w[0].size(), w[1].size());
  EXPECT_EQ(0, std::memcmp(w[0].data(), w[1].data(), w[0].size() * sizeof(float)));
}

// Profiling times every layer's training passes (not evaluation), in graph order with the loss
// last, and leaves the bits alone.
TEST(Profiling, LayerTimesCoverTrainingPassesOnly) {
  std::vector<float> w[2];
  std::vector<LayerTime> times;
  std::vector<LayerSpec> graph;
  for (int r = 0; r < 2; ++r) {
    Model m(ctx2(), "d");
    PrecisionPolicy pol;
    pol.precision = Precision::int16;
    m.set_profiling(r == 1);
    w[r] = train_small_resnet20(m, pol, 2);
    const std::vector<int32_t> y = {1, 2, 3, 4};
    m.forward(batch_images(m, 9).data(), y.data(), 4, false);  // evaluation: not timed
    if (r == 0) {
      EXPECT_TRUE(m.layer_times().empty()) << "profiling off: nothing timed";
      continue;
    }
    times = m.layer_times();
    graph = m.graph();
    m.reset_layer_times();
    EXPECT_TRUE(m.layer_times().empty()) << "reset_layer_times";
  }
  EXPECT_EQ(0, std::memcmp(w[0].data(), w[1].data(), w[0].size() * sizeof(float))) << "profiling changed the bits";
  ASSERT_EQ(times.size(), graph.size()) << "every layer but the input, then the loss";
  const std::string m_kernels_pixel = ctx2().kernels().conv_s16_pixel.name;
  const std::string m_kernels_pair = ctx2().kernels().conv_s16_pair.name;
  for (size_t i = 0; i + 1 < times.size(); ++i) {
    EXPECT_EQ(times[i].layer, graph[i + 1].name);
    EXPECT_EQ(times[i].kind, graph[i + 1].kind);
    EXPECT_EQ(times[i].steps, 2u) << times[i].layer;
    EXPECT_GE(times[i].forward_seconds, 0.0);
    EXPECT_GE(times[i].backward_seconds, 0.0);
    if (times[i].kind == "conv") {
      EXPECT_EQ(times[i].precision, "int16");
      const std::string k = m_kernels_pixel + " | " + m_kernels_pixel + " | " + m_kernels_pair;
      EXPECT_EQ(times[i].implementation, k) << times[i].layer;
      EXPECT_GT(times[i].forward_seconds, 0.0) << times[i].layer;
      EXPECT_GT(times[i].backward_seconds, 0.0) << times[i].layer;
    }
  }
  EXPECT_EQ(times.back().layer, "loss");
  EXPECT_EQ(times.back().steps, 2u);
}

// Sampled rounding statistics: the parallel, libm-free DFP16 measurement counts exactly what a
// serial nearbyint loop counts (ties to even, saturation, underflow, non-finite), and gives the
// same bits at any thread count.
TEST(Numerics, Dfp16StatisticsMatchASerialNearbyintLoop) {
  const int e = -10;  // q = x * 1024
  std::vector<float> x(300001);
  std::mt19937 g(5);
  std::normal_distribution<float> nd(0.f, 8.f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = nd(g);
  for (size_t i = 0; i < 2000; ++i) x[i * 97] = (float(int(i) - 1000) + 0.5f) / 1024.f;  // ties
  x[11] = 32767.5f / 1024.f;                                                            // a tie to 32768: saturates
  x[12] = -32767.49f / 1024.f;
  x[13] = 40.f;                                                                         // saturates
  x[14] = 1e-9f;                                                                        // underflows
  x[15] = 0.f;
  x[16] = std::numeric_limits<float>::infinity();
  x[17] = std::nanf("");
  FormatStats want;
  want.elements = x.size();
  for (const float f : x) {
    const double v = f;
    if (!std::isfinite(v)) { ++want.nonfinite; continue; }
    want.signal += v * v;
    want.nonzero += v != 0;
    double q = std::nearbyint(v * 1024.0);
    if (std::fabs(q) > 32767) { ++want.overflow; q = q > 0 ? 32767 : -32767; }
    const double r = q / 1024.0;
    want.underflow += v != 0 && r == 0;
    want.noise += (v - r) * (v - r);
  }
  Context one(ContextOptions{.threads = 1});
  const FormatStats a = model::measure_dfp16(one, x.data(), x.size(), e);
  const FormatStats b = model::measure_dfp16(ctx2(), x.data(), x.size(), e);
  EXPECT_EQ(a.elements, want.elements);
  EXPECT_EQ(a.nonzero, want.nonzero);
  EXPECT_EQ(a.overflow, want.overflow);
  EXPECT_GE(a.overflow, 2u) << "32767.5 and 40 * 1024 saturate";
  EXPECT_EQ(a.underflow, want.underflow);
  EXPECT_EQ(a.nonfinite, 2u);
  EXPECT_NEAR(a.signal, want.signal, 1e-12 * want.signal);
  EXPECT_NEAR(a.noise, want.noise, 1e-12 * want.noise);
  EXPECT_EQ(0, std::memcmp(&a.signal, &b.signal, sizeof(double)));
  EXPECT_EQ(0, std::memcmp(&a.noise, &b.noise, sizeof(double)));
}

// SGD's update (momentum, Nesterov, weight decay) follows its formula, in FP32 operations none
// fused, and every kernel level gives the reference's bits, at every length (tails included).
TEST(Sgd, UpdateFollowsTheFormulaAtEveryKernelLevel) {
  const CpuFeatures cpu = detect_cpu_features();
  std::mt19937 g(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{1000}})
    for (bool nesterov : {false, true})
      for (float wd : {0.f, 5e-4f}) {
        std::vector<float> w(n), grad(n), v(n);
        for (size_t i = 0; i < n; ++i) { w[i] = nd(g); grad[i] = nd(g); v[i] = nd(g); }
        const simd::SgdArgs a{0.1f, 0.9f, wd, nesterov};
        // The formula, one FP32 operation at a time (volatile: nothing fused or reordered).
        std::vector<float> we(w), ve(v);
        for (size_t i = 0; i < n; ++i) {
          volatile float t = a.weight_decay * we[i];
          const float gi = grad[i] + t;
          t = a.momentum * ve[i];
          ve[i] = t + gi;
          t = a.momentum * ve[i];
          const float step = nesterov ? gi + t : ve[i];
          t = a.lr * step;
          we[i] = we[i] - t;
        }
        for (Isa isa : test::isa_levels()) {
          const simd::KernelTable k = simd::make_kernel_table(isa, cpu);
          std::vector<float> wk(w), vk(v);
          const float max_abs = k.sgd_update.fn(wk.data(), grad.data(), vk.data(), n, a);
          // (n = 0: empty vectors, whose data() may be null, which memcmp must not get.)
          ASSERT_EQ(0, n ? std::memcmp(wk.data(), we.data(), n * sizeof(float)) : 0) << k.sgd_update.name << " n=" << n;
          ASSERT_EQ(0, n ? std::memcmp(vk.data(), ve.data(), n * sizeof(float)) : 0) << k.sgd_update.name << " n=" << n;
          float want = 0.f;
          for (float x : we) want = std::max(want, std::fabs(x));
          ASSERT_EQ(max_abs, want) << k.sgd_update.name << " n=" << n;
        }
      }
  // The maximum it returns is the DFP16 exponent's input: a NaN anywhere (also in a vector tail)
  // must make it NaN, so that the quantizer measures and reports the tensor; infinity stays.
  for (size_t n : {size_t{7}, size_t{16}, size_t{40}})
    for (size_t bad : {size_t{0}, n - 1}) {
      for (Isa isa : test::isa_levels()) {
        const simd::KernelTable k = simd::make_kernel_table(isa, cpu);
        for (float poison : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
          std::vector<float> w(n, 0.5f), grad(n, 0.f), v(n, 0.f);
          grad[bad] = poison;  // the updated weight becomes NaN, or -inf
          const float m = k.sgd_update.fn(w.data(), grad.data(), v.data(), n, {0.1f, 0.9f, 0.f, false});
          if (std::isnan(poison)) EXPECT_TRUE(std::isnan(m)) << k.sgd_update.name << " n=" << n << " at " << bad;
          else EXPECT_EQ(m, std::numeric_limits<float>::infinity()) << k.sgd_update.name << " n=" << n;
        }
      }
    }
}

// The optimizer's pass measures max|w| and hands it to weights_updated(max_abs), which takes the
// INT16 weights' exponent from it: the same exponent as a measured maximum; a reported 4x larger
// maximum moves it by exactly 2; weights_updated() without maxima measures again; a wrong count
// is refused.
TEST(Sgd, ItsMaximumSetsTheWeightExponent) {
  Model m(ctx2(), "m");
  auto x = m.input(3, 6, 6);
  m.softmax_cross_entropy(m.linear(m.global_avgpool(m.conv(x, 16, 3, 1, 1, false, "c"), "gap"), 4, true, "fc"));
  PrecisionPolicy pol;
  pol.precision = Precision::int16;
  m.build(2, pol);
  Sgd sgd(ctx2(), m, {0.9f, 5e-4f, false});
  const auto img = batch_images(m, 3);
  const std::vector<int32_t> y = {1, 3};
  m.forward(img.data(), y.data(), 2, true);
  m.backward();
  sgd.step(0.1f);
  auto exp_w = [&] {
    m.forward(img.data(), y.data(), 2, true);
    return m.numerics().at(0).exp_w;
  };
  const int from_optimizer = exp_w();
  m.weights_updated();
  const int measured = exp_w();
  EXPECT_EQ(from_optimizer, measured);
  const Parameter& w = m.parameters()[0];
  float true_max = 0.f;
  for (size_t i = 0; i < w.size; ++i) true_max = std::max(true_max, std::fabs(w.value[i]));
  std::vector<float> reported(m.parameters().size(), -1.f);
  reported[0] = true_max * 4;  // as if the optimizer had reported a 4x larger weight
  m.weights_updated(reported);
  EXPECT_EQ(exp_w(), measured + 2);
  m.weights_updated();  // nothing reported: measured again
  EXPECT_EQ(exp_w(), measured);
  reported.pop_back();
  test::expect_error([&] { m.weights_updated(reported); }, Status::invalid_argument, {"weights_updated", "one per parameter"});
}

TEST(Schedule, WarmupCosineStepMultistep) {
  LrSchedule s;
  s.base = 0.1f; s.steps_per_epoch = 10; s.total_steps = 100; s.warmup_steps = 10;
  EXPECT_FLOAT_EQ(s.at(0), 0.01f);
  EXPECT_FLOAT_EQ(s.at(9), 0.1f);
  EXPECT_FLOAT_EQ(s.at(10), 0.1f);
  EXPECT_NEAR(s.at(55), 0.05f, 1e-6);
  EXPECT_NEAR(s.at(100), 0.f, 1e-7);
  s.kind = ScheduleKind::multistep; s.warmup_steps = 0; s.milestones = {3, 6};
  EXPECT_FLOAT_EQ(s.at(29), 0.1f);
  EXPECT_NEAR(s.at(30), 0.01f, 1e-8);
  EXPECT_NEAR(s.at(65), 0.001f, 1e-9);
  s.kind = ScheduleKind::step; s.step_epochs = 2;
  EXPECT_NEAR(s.at(45), 0.001f, 1e-9);
  EXPECT_THROW(parse_schedule("linear", "flag --schedule"), Error);
}

namespace {
bool have_fashion_mnist() { return std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"); }
std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
constexpr char kCheckpointMagicForTest[] = "DFPCKPT1";
// LeNet on the first train_images / test_images of Fashion-MNIST.
TrainConfig lenet_config(Precision p, int epochs, int batch, int train_images, int test_images) {
  TrainConfig c;
  c.model = "lenet";
  c.policy.precision = p;
  c.epochs = epochs;
  c.batch_size = batch;
  c.lr = 0.05f;
  c.limit_train = train_images;
  c.limit_test = test_images;
  c.threads = 2;
  return c;
}
}  // namespace

// A thread count passes through one rule (ContextOptions::validate_threads) wherever it enters: a
// context's options and a training configuration refuse the same values with the same wording,
// each naming its own origin (the command line's --threads: compare_test), and both take 0.
TEST(Training, ThreadCountRuleIsOneEverywhere) {
  test::expect_error([] { Context c(ContextOptions{.threads = -1}); }, Status::invalid_argument,
                     {"ContextOptions.threads", "expected >= 0 (0 = all cores)", "got -1"});
  TrainConfig c = lenet_config(Precision::fp32, 1, 8, 8, 8);
  c.threads = -3;
  test::expect_error([&] { validate_train_config(c); }, Status::invalid_argument,
                     {"flag --threads", "expected >= 0 (0 = all cores)", "got -3"});
  c.threads = 0;
  EXPECT_NO_THROW(validate_train_config(c));
  EXPECT_GE(Context(ContextOptions{.threads = 0}).threads(), 1);
}

// Fashion-MNIST subset: both precisions learn (a stated threshold), and INT16 stays close to FP32.
TEST(Training, FashionMnistSmokeFp32AndInt16) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  double top1[2] = {};
  for (int p = 0; p < 2; ++p) {
    const auto m = train(lenet_config(p ? Precision::int16 : Precision::fp32, 2, 64, 6400, 2000), nullptr);
    top1[p] = m.back().test_top1;
  }
  EXPECT_GT(top1[0], 75.0);  // LeNet after 2 epochs on 6400 images reaches ~80%
  EXPECT_GT(top1[1], 75.0);
  EXPECT_NEAR(top1[0], top1[1], 3.0);
}

TEST(Training, ResumeIsBitIdenticalAndCorruptCheckpointsAreRefused) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  TrainConfig c = lenet_config(Precision::int16, 3, 32, 640, 128);
  c.policy.dfp.gradients.rounding = Rounding::stochastic;
  const test::TempDir ta("dfp_test_a_"), tb("dfp_test_b_");
  const std::string a = ta.str(), b = tb.str();
  c.out = a;
  train(c, nullptr);
  c.out = b;
  c.stop_after = 2;
  train(c, nullptr);
  c.stop_after = 0;
  c.resume = b + "/checkpoint.dfp";
  train(c, nullptr);
  EXPECT_EQ(slurp(a + "/checkpoint.dfp"), slurp(b + "/checkpoint.dfp"));
  // Metrics: one line per epoch, also across the resume.
  std::ifstream mf(b + "/metrics.jsonl");
  int lines = 0;
  for (std::string l; std::getline(mf, l);) ++lines;
  EXPECT_EQ(lines, 3);

  // A flipped byte is caught by the checksum; the message names the file.
  std::string bytes = slurp(a + "/checkpoint.dfp");
  bytes[bytes.size() / 2] ^= 0x5a;
  const std::string bad = a + "/corrupt.dfp";
  std::ofstream(bad, std::ios::binary) << bytes;
  c.resume = bad;
  test::expect_error([&] { train(c, nullptr); }, Status::corrupt_data, {"corrupt.dfp", "CRC-32 mismatch"});
  // A file that ends early is reported as truncated, with the record it ends in, wherever the cut
  // falls (in a tensor's data, in a record header, just before the CRC).
  const std::string whole = slurp(a + "/checkpoint.dfp");
  const std::string cut = a + "/cut.dfp";
  for (size_t keep : {whole.size() / 2, size_t{8 + 4 + 2}, whole.size() - 5, whole.size() - 4}) {
    std::ofstream(cut, std::ios::binary | std::ios::trunc) << whole.substr(0, keep);
    c.resume = cut;
    test::expect_error([&] { train(c, nullptr); }, Status::corrupt_data, {"cut.dfp", "truncated", "record #"});
    test::expect_error([&] { evaluate_checkpoint(cut, "", 2, nullptr); }, Status::corrupt_data, {"cut.dfp", "truncated"});
  }
  // A corrupt name length makes the "name" binary bytes: they are quoted escaped and cut to 64.
  {
    std::string junk(kCheckpointMagicForTest, 8);
    const uint32_t len = 100;
    junk.append(reinterpret_cast<const char*>(&len), 4);
    for (int i = 0; i < 100; ++i) junk.push_back(char(i));
    junk.append(4, '\0');  // where the CRC would be
    std::ofstream(cut, std::ios::binary | std::ios::trunc) << junk;
    test::expect_error([&] { evaluate_checkpoint(cut, "", 2, nullptr); }, Status::corrupt_data,
                       {"cut.dfp", "truncated: element count of record #1 '\\x00\\x01", "'... (100 bytes)"});
  }
  // A corrupt element count (2^62 floats) is refused before anything is allocated for it.
  {
    std::string huge = whole;
    uint32_t len;
    std::memcpy(&len, huge.data() + 8, 4);
    const uint64_t n = uint64_t{1} << 62;
    std::memcpy(huge.data() + 8 + 4 + len, &n, 8);
    std::ofstream(cut, std::ios::binary | std::ios::trunc) << huge;
    test::expect_error([&] { evaluate_checkpoint(cut, "", 2, nullptr); }, Status::corrupt_data,
                       {"cut.dfp", "record #1 'meta'", "needs 4611686018427387904 floats of 4 bytes"});
  }
  // A checkpoint of another configuration is refused, naming every setting that differs (any of
  // them changes the result), with both values.
  c.resume = a + "/checkpoint.dfp";
  c.batch_size = 16;
  test::expect_error([&] { train(c, nullptr); }, Status::invalid_argument, {"--batch-size", "'32'", "'16'"});
  c.batch_size = 32;
  c.lr = 0.1f;
  c.schedule = "step";
  c.limit_train = 320;
  c.label_smoothing = 0.1f;
  test::expect_error([&] { train(c, nullptr); }, Status::invalid_argument,
                     {"other settings", "--lr (field 'lr'): checkpoint '0.05', this run '0.1'",
                      "--schedule", "'cosine'", "--limit-train", "--label-smoothing"});
  c.lr = 0.05f;
  c.schedule = "cosine";
  c.limit_train = 640;
  c.label_smoothing = 0.f;
  // The thread count is not a setting of the result for INT16 layers: a resume with another one
  // runs, with a note (the FP32 library operators may round differently).
  {
    TrainConfig one = c;
    one.threads = 1;
    one.epochs = 3;
    one.out = "";
    std::string log;
    train(one, [&](const std::string& s) { log += s + "\n"; });
    EXPECT_NE(log.find("note: the checkpoint was written with threads 2, this run uses 1"), std::string::npos) << log;
  }
  const EvalResult r = evaluate_checkpoint(a + "/checkpoint.dfp", "", 2, nullptr);
  EXPECT_EQ(r.images, 10000);  // eval uses the whole test split
  EXPECT_GT(r.top1, 40.0);
}

// What a run writes: config.json holds every setting of the result; metrics.jsonl one object per
// epoch with every field the README lists, per-layer DFP16 exponents and counters included;
// without a terminal, progress comes as plain lines. --label-smoothing reaches the loss.
TEST(Training, WritesEverySettingAndMetricAndHonoursLabelSmoothing) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const test::TempDir t("dfp_test_files_");
  TrainConfig c = lenet_config(Precision::int16, 2, 32, 320, 64);
  c.out = t.str();
  c.print_every = 4;
  c.numerics_interval = 5;
  c.milestones = {1};
  c.schedule = "multistep";
  std::string log;
  const auto plain = train(c, [&](const std::string& s) { log += s + "\n"; });
  EXPECT_NE(log.find("precision=int16"), std::string::npos) << log;  // the policy, printed at start
  EXPECT_NE(log.find("] 4/10 loss"), std::string::npos) << log;
  if (!isatty(STDOUT_FILENO)) {  // every 4th step only
    EXPECT_EQ(log.find("] 3/10 loss"), std::string::npos) << log;
  }
  EXPECT_NE(log.find("epoch 2/2 done: train loss"), std::string::npos) << log;
  const std::string cfg = slurp(c.out + "/config.json");
  for (const char* key : {"\"model\":\"lenet\"", "\"lr\":0.05,", "\"schedule\":\"multistep\"",
                          "\"milestones\":\"1\"", "\"gamma\":", "\"step_epochs\":", "\"label_smoothing\":0,",
                          "\"augment\":true", "\"limit_train\":320", "\"image_size\":0", "\"data\":", "\"threads\":2",
                          "\"precision_policy\":\"precision=int16", "\"loss_scaling\":\"none\""})
    EXPECT_NE(cfg.find(key), std::string::npos) << key << " in " << cfg;
  std::ifstream mf(c.out + "/metrics.jsonl");
  int lines = 0;
  for (std::string l; std::getline(mf, l); ++lines)
    for (const char* key : {"\"epoch\":", "\"lr\":", "\"train_loss\":", "\"train_top1\":", "\"test_loss\":",
                            "\"test_top1\":", "\"test_top5\":", "\"images_per_second\":", "\"data_wait_seconds\":",
                            "\"peak_rss_kib\":", "\"precision_policy\":", "{\"layer\":\"conv1\",\"format\":\"int16\",\"exp_x\":",
                            "\"exp_w\":", "\"exp_dy\":", "\"saturated\":0", "\"overflow_events\":0", "\"sqnr_x_db\":"})
      EXPECT_NE(l.find(key), std::string::npos) << key << " in " << l;
  EXPECT_EQ(lines, 2);

  c.out = "";
  c.label_smoothing = 0.2f;
  const auto smoothed = train(c, nullptr);
  // Smoothing raises the loss's floor: with the same seed the first epoch's loss differs.
  EXPECT_NE(plain[0].train_loss, smoothed[0].train_loss);
  EXPECT_GT(smoothed[1].train_loss, plain[1].train_loss);
}

// Out-of-range settings are refused before any data is read, naming the flag and the value.
TEST(Training, OutOfRangeSettingsNameTheirFlag) {
  const std::vector<std::pair<std::function<void(TrainConfig&)>, std::vector<std::string>>> cases = {
      {[](TrainConfig& c) { c.momentum = -0.5f; }, {"--momentum", "-0.5"}},
      {[](TrainConfig& c) { c.weight_decay = std::nanf(""); }, {"--wd", "nan"}},
      {[](TrainConfig& c) { c.gamma = 0; }, {"--gamma", "> 0"}},
      {[](TrainConfig& c) { c.warmup_epochs = -1; }, {"--warmup-epochs", "-1"}},
      {[](TrainConfig& c) { c.warmup_epochs = 2; }, {"--warmup-epochs", "[0, 1]", "got 2"}},
      {[](TrainConfig& c) { c.image_size = 9000; }, {"--image-size", "[0, 8192]", "9000"}},
      {[](TrainConfig& c) { c.step_epochs = 0; }, {"--step-epochs", ">= 1"}},
      {[](TrainConfig& c) { c.milestones = {30, 20}; }, {"--milestones", "20 at item 2"}},
      {[](TrainConfig& c) { c.label_smoothing = 1.5f; }, {"--label-smoothing", "[0, 1)", "1.5"}},
      {[](TrainConfig& c) { c.label_smoothing = 1.f; }, {"--label-smoothing", "[0, 1)", "got 1"}},
      {[](TrainConfig& c) { c.limit_train = -5; }, {"--limit-train", "-5"}},
      {[](TrainConfig& c) { c.limit_test = -1; }, {"--limit-test", "-1"}},
      {[](TrainConfig& c) { c.print_every = 0; }, {"--print-every", ">= 1"}},
      {[](TrainConfig& c) { c.numerics_interval = -1; }, {"--numerics-every", "-1"}},
      {[](TrainConfig& c) { c.threads = -3; }, {"--threads", "-3"}},
      {[](TrainConfig& c) { c.policy.dfp.gradients.headroom = 20; }, {"--headroom", "20 (gradients)"}},
  };
  for (const auto& [mutate, words] : cases) {
    TrainConfig c = lenet_config(Precision::int16, 1, 32, 64, 64);
    c.data = "/nonexistent-dfp-test-dir";  // validation comes first: no dataset is opened
    mutate(c);
    test::expect_error([&] { train(c, nullptr); }, Status::invalid_argument, words);
  }
}

// --profile: the trainer logs the per-step table and writes profile.json beside the metrics.
TEST(Training, ProfileWritesTableAndJson) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  TrainConfig c = lenet_config(Precision::int16, 1, 32, 320, 64);
  c.profile = true;
  const test::TempDir t("dfp_test_profile_");
  c.out = t.str();
  std::string log;
  train(c, [&](const std::string& s) { log += s + "\n"; });
  EXPECT_NE(log.find("profile: 10 training steps"), std::string::npos) << log;
  // Kinds are listed costliest first, so which comes first depends on the machine's load.
  const size_t kinds = log.find("by kind (forward + backward ms):");
  ASSERT_NE(kinds, std::string::npos) << log;
  EXPECT_NE(log.find(" conv ", kinds), std::string::npos) << log;
  EXPECT_NE(log.find(" fc ", kinds), std::string::npos) << log;
  EXPECT_NE(log.find("optimizer"), std::string::npos) << log;
  const std::string json = slurp(c.out + "/profile.json");
  EXPECT_EQ(json.rfind("{\"steps\":10,", 0), 0u) << json;
  EXPECT_NE(json.find("{\"layer\":\"conv1\",\"kind\":\"conv\",\"precision\":\"int16\",\"implementation\":\"conv_s16"),
            std::string::npos)
      << json;
  EXPECT_NE(log.find("implementation (fwd | bwd_data | bwd_weights)"), std::string::npos) << log;
  EXPECT_NE(json.find("{\"layer\":\"loss\",\"kind\":\"loss\""), std::string::npos) << json;
}

// ---- the memory plan ----------------------------------------------------------------------------

namespace {
// The graphs of the finite-difference test (every layer kind, fan-out, unaligned concat) plus two
// whole models.
std::vector<std::pair<std::string, std::function<void(Model&)>>> plan_graphs() {
  return {
      {"pool-bn-linear",
       [](Model& m) {
         auto x = m.input(3, 8, 8);
         x = m.relu(m.batchnorm(m.conv(x, 5, 3, 1, 1, true, "c1"), "bn1"), "r1");
         x = m.maxpool(x, 3, 2, 1, false, "mp");
         x = m.conv(x, 6, 3, 2, 1, false, "c2");
         x = m.avgpool(x, 2, 1, 0, "ap");
         m.softmax_cross_entropy(m.linear(m.flatten(x, "fl"), 4, true, "fc"), 0.1f);
       }},
      {"fan-out",
       [](Model& m) {
         auto x = m.input(2, 6, 6);
         auto a = m.conv(x, 4, 3, 1, 1, false, "c1");
         auto y = m.relu(m.conv(a, 4, 3, 1, 1, false, "c2"), "r");
         auto s = m.add(y, a, "add");
         auto z = m.conv(s, 6, 3, 2, 1, false, "c3");
         auto t = m.add(z, m.shortcut_pad(s, 6, 2, "sc"), "add2");
         m.softmax_cross_entropy(m.linear(m.global_avgpool(t, "gap"), 3, true, "fc"));
       }},
      {"nested-adds",  // which residual Adds may share their gradient buffer (Model plan_memory)
       [](Model& m) {
         auto x = m.input(2, 6, 6);
         auto a = m.conv(x, 4, 3, 1, 1, false, "c1");
         auto e = m.relu(m.conv(x, 4, 3, 1, 1, false, "c5"), "r5");
         auto b = m.conv(a, 4, 3, 1, 1, false, "c2");
         auto f = m.conv(a, 4, 1, 1, 0, false, "c4");
         auto s1 = m.add(b, a, "add1");  // a is also read after b (by c4): copies
         auto s2 = m.add(s1, m.batchnorm(m.conv(s1, 4, 3, 1, 1, false, "c3"), "bn3"), "add2");  // shares
         auto s3 = m.add(s2, f, "add3");  // shares
         auto s4 = m.add(e, s3, "add4");  // shares; add3, its higher input, then copies
         s4 = m.add(s4, s4, "add5");      // one consumer, two parts
         m.softmax_cross_entropy(m.linear(m.global_avgpool(m.relu(s4, "r"), "gap"), 3, true, "fc"));
       }},
      {"bn-into-add",  // BatchNorms feeding an add as spans, computed there from their inputs
       [](Model& m) {
         auto x = m.input(3, 6, 6);
         // A BatchNorm without a ReLU feeding an INT16 conv (16 channels: not unfolded) as spans.
         auto a = m.conv(m.batchnorm(m.conv(x, 16, 3, 1, 1, false, "c0"), "bn0"), 4, 3, 1, 1, false, "c1");
         auto b = m.batchnorm(a, "bn1");              // not in place: a is read again, by c2
         auto d = m.relu(m.conv(a, 4, 3, 1, 1, false, "c2"), "r2");  // a's last plain reader
         auto e = m.conv(d, 4, 3, 1, 1, false, "c3");  // may take a's bytes but for the spans
         auto s = m.add(b, e, "add1");
         auto f = m.batchnorm(m.conv(s, 4, 1, 1, 0, false, "c4"), "bn4");
         auto g = m.relu(m.batchnorm(m.conv(s, 4, 3, 1, 1, false, "c5"), "bn5"), "r5");
         auto t = m.relu(m.add(f, g, "add2"), "r");  // both inputs as spans, one through a ReLU
         m.softmax_cross_entropy(m.linear(m.global_avgpool(t, "gap"), 3, true, "fc"));
       }},
      {"concat-lrn-dropout",
       [](Model& m) {
         auto x = m.input(3, 5, 5);
         auto c = m.concat({m.conv(x, 5, 1, 1, 0, true, "a"), m.conv(x, 7, 3, 1, 1, true, "b")}, "cat");
         c = m.dropout(m.lrn(c, 5, 1e-1f, 0.75f, 2.f, "lrn"), 0.3f, "drop");
         m.softmax_cross_entropy(m.linear(m.flatten(c, "fl"), 3, true, "fc"));
       }},
      {"grouped",  // groups cutting channel blocks, whole-block groups, a grouped conv read twice
       [](Model& m) {
         auto x = m.input(3, 6, 6);
         auto a = m.relu(m.batchnorm(m.conv(x, 12, 3, 1, 1, false, "c0"), "bn0"), "r0");
         auto b = m.conv(a, 18, 3, 1, 1, true, "g1", 6);
         auto c = m.relu(m.batchnorm(m.conv(a, 32, 1, 1, 0, false, "c2"), "bn2"), "r2");
         auto d = m.conv(c, 18, 3, 2, 1, false, "g3", 2);
         auto e = m.add(m.conv(b, 18, 3, 2, 1, false, "g4", 3), d, "add");
         m.softmax_cross_entropy(m.linear(m.global_avgpool(e, "gap"), 3, true, "fc"));
       }},
      {"resnet20", [](Model& m) { build_model(m, "resnet20", 3, 16, 16, 10); }},
      {"googlenet", [](Model& m) { build_model(m, "googlenet", 3, 32, 32, 10); }},
  };
}

// Losses and parameter gradients of two training steps.
std::vector<float> two_steps(const std::function<void(Model&)>& make, Precision p, bool poison, bool fusion = true,
                             bool copying_adds = false) {
  Model m(ctx2(), "p");
  make(m);
  m.set_fusion(fusion);
  PrecisionPolicy pol;
  pol.precision = p;
  m.build(3, pol);
  m.set_debug_poison(poison);
  if (copying_adds) {
    // Adaptive loss scaling plans every Add with its own copy; with factors capped at 1 it
    // changes no number.
    LossScaleOptions o;
    o.mode = LossScaleMode::adaptive;
    o.adaptive_max_factor = 1;
    m.set_loss_scaling(o);
  }
  Sgd sgd(ctx2(), m, {0.9f, 0.f, false});
  const auto x = batch_images(m, 11);
  const std::vector<int32_t> y = {0, 2, 1};
  std::vector<float> out;
  for (int s = 0; s < 2; ++s) {
    out.push_back(float(m.forward(x.data(), y.data(), 3, true).loss));
    m.backward();
    for (const Parameter& q : m.parameters()) out.insert(out.end(), q.grad, q.grad + q.size);
    sgd.step(0.05f);
  }
  return out;
}
}  // namespace

// A BatchNorm or residual Add that applies the ReLU reading its output gives the same bits as the
// two layers, forward and backward, in every precision; a ReLU after a conv, or after a layer whose
// output is also read elsewhere, stays a layer of its own.
TEST(Fusion, BatchNormReluGivesTheSameBitsAsTwoLayers) {
  for (const auto& [name, make] : plan_graphs())
    for (Precision p : {Precision::fp32, Precision::int16, Precision::bf16, Precision::fp16}) {
      const auto fused = two_steps(make, p, false, true), separate = two_steps(make, p, false, false);
      ASSERT_EQ(fused.size(), separate.size());
      EXPECT_EQ(0, std::memcmp(fused.data(), separate.data(), fused.size() * sizeof(float)))
          << name << " " << precision_name(p);
    }
  Model m(ctx2(), "f");
  auto x = m.input(3, 6, 6);
  auto b = m.batchnorm(m.conv(x, 4, 3, 1, 1, false, "c"), "bn");
  auto r1 = m.relu(b, "r1");                                 // bn also read by the add: not fused
  auto b2 = m.batchnorm(m.add(r1, b, "add"), "bn2");
  auto r2 = m.relu(b2, "r2");                                // fused
  auto r3 = m.relu(m.conv(r2, 4, 3, 1, 1, false, "c2"), "r3");  // after a conv: not fused
  auto r4 = m.relu(m.add(r3, r2, "add2"), "r4");                // after a residual add: fused
  m.softmax_cross_entropy(m.linear(m.flatten(r4, "fl"), 3, true, "fc"));
  m.build(2, PrecisionPolicy{});
  std::vector<std::string> fused;
  for (const LayerSpec& s : m.graph())
    if (s.fused) fused.push_back(s.name);
  EXPECT_EQ(fused, (std::vector<std::string>{"r2", "r4"}));
}

// A layer may read one tensor twice (add(x, x): two parts of x's gradient, summed) if it is that
// tensor's last reader; otherwise both parts would need x's one spare buffer, and build() says so.
TEST(Memory, LayerReadingATensorTwiceMustBeItsLastReader) {
  Model m(ctx2(), "twice");
  auto x = m.input(3, 4, 4);
  auto a = m.conv(x, 4, 3, 1, 1, false, "c1");
  auto d = m.add(a, a, "double");
  m.softmax_cross_entropy(m.linear(m.global_avgpool(m.add(d, a, "late"), "gap"), 3, true, "fc"));
  test::expect_error([&] { m.build(2, PrecisionPolicy{}); }, Status::unsupported, {"'double' reads 'c1' twice", "'late'"});
}

// Which layers take an input as spans from the BatchNorm before them: with fusion, every ResNet-20
// block's add (bn2, read by nothing else) in every precision, and in INT16 every block's second
// conv (its input is bn1 + ReLU, read by nothing else); not the first convs (their input also
// feeds the shortcut), not a conv kept in FP32.
TEST(Fusion, LayersTakeTheirBatchNormInputAsSpans) {
  auto linked = [](Precision p, bool fusion, const char* keep_fp32) {
    Model m(ctx2(), "r");
    build_model(m, "resnet20", 3, 8, 8, 10);
    m.set_fusion(fusion);
    PrecisionPolicy pol;
    pol.precision = p;
    if (keep_fp32) pol.overrides = {{keep_fp32, Precision::fp32}};
    m.build(2, pol);
    std::vector<std::string> names;
    for (const LayerSpec& s : m.graph())
      if (s.input_spans) names.push_back(s.name);
    return names;
  };
  std::vector<std::string> adds, both;
  for (int stage = 1; stage <= 3; ++stage)
    for (int b = 0; b < 3; ++b) {
      const std::string block = "layer" + std::to_string(stage) + "." + std::to_string(b);
      adds.push_back(block + ".add");
      both.push_back(block + ".conv2");
      both.push_back(block + ".add");
    }
  EXPECT_EQ(linked(Precision::int16, true, nullptr), both);
  EXPECT_TRUE(linked(Precision::int16, false, nullptr).empty());
  EXPECT_EQ(linked(Precision::fp32, true, nullptr), adds);
  both.erase(std::find(both.begin(), both.end(), "layer2.1.conv2"));
  EXPECT_EQ(linked(Precision::int16, true, "layer2.1.conv2"), both);
}

// Every buffer the plan shares is written before it is read: with every fresh buffer and the
// workspace filled with NaN, training gives the same bits as without (and no NaN).
TEST(Memory, PlannedBuffersAreWrittenBeforeTheyAreRead) {
  for (const auto& [name, make] : plan_graphs())
    for (Precision p : {Precision::fp32, Precision::int16, Precision::bf16, Precision::fp16}) {
      const auto clean = two_steps(make, p, false), poisoned = two_steps(make, p, true);
      ASSERT_EQ(clean.size(), poisoned.size());
      for (float v : clean) ASSERT_TRUE(std::isfinite(v)) << name << " " << precision_name(p);
      EXPECT_EQ(0, std::memcmp(clean.data(), poisoned.data(), clean.size() * sizeof(float)))
          << name << " " << precision_name(p);
    }
}

// Residual Adds whose inputs read the Add's own gradient buffer give the bits of the plan in which
// each Add copies its gradient to its inputs (poisoned, so a sharer reading what another wrote over
// would show).
TEST(Memory, SharedAddGradientsGiveTheCopyingPlansBits) {
  for (const auto& [name, make] : plan_graphs())
    for (Precision p : {Precision::fp32, Precision::int16, Precision::bf16, Precision::fp16}) {
      const auto shared = two_steps(make, p, true), copied = two_steps(make, p, true, true, true);
      ASSERT_EQ(shared.size(), copied.size());
      EXPECT_EQ(0, std::memcmp(shared.data(), copied.data(), shared.size() * sizeof(float)))
          << name << " " << precision_name(p);
    }
}

// Lifetimes let buffers share bytes, and in INT16 (16-bit copies saved by the layers) almost no FP32
// activation outlives the forward pass.
TEST(Memory, ArenaSharesBytesAndInt16KeepsLittleFp32) {
  MemoryPlan plan[2];
  for (int i = 0; i < 2; ++i) {
    Model m(ctx2(), "r");
    build_model(m, "resnet20", 3, 32, 32, 10);
    PrecisionPolicy pol;
    pol.precision = i ? Precision::int16 : Precision::fp32;
    m.build(8, pol);
    plan[i] = m.memory_plan();
    EXPECT_LT(plan[i].arena_bytes, plan[i].unshared_bytes / 2) << i;
  }
  EXPECT_LT(plan[1].arena_bytes, plan[0].arena_bytes / 3);
  std::printf("arena bytes: fp32 %zu, int16 %zu (unshared %zu); workspace fp32 %zu, int16 %zu\n", plan[0].arena_bytes,
              plan[1].arena_bytes, plan[0].unshared_bytes, plan[0].workspace_bytes, plan[1].workspace_bytes);
}

// An INT16 conv that reads a node another layer also reads (each ResNet block's first conv, beside
// the shortcut) adds its part of that node's gradient into the gradient itself: no buffer is
// planned for the part. FP32 convs, and every conv under adaptive loss scaling (per-layer scales),
// write the part into a buffer of its own, summed after.
TEST(Memory, Int16ConvsAddTheirGradientPartInPlace) {
  auto unshared = [](Precision p, const char* keep_fp32, bool adaptive) {
    Model m(ctx2(), "r");
    build_model(m, "resnet20", 3, 32, 32, 10);
    PrecisionPolicy pol;
    pol.precision = p;
    if (keep_fp32) pol.overrides = {{keep_fp32, Precision::fp32}};
    m.build(8, pol);
    if (adaptive) {
      LossScaleOptions o;
      o.mode = LossScaleMode::adaptive;
      m.set_loss_scaling(o);
    }
    return m.memory_plan().unshared_bytes;
  };
  // The nine block inputs, FP32: 4 of 16 x 32 x 32 (stage 1, and stage 2's first block), 3 of
  // 32 x 16 x 16, 2 of 64 x 8 x 8.
  const size_t parts = size_t(8) * 4 * (4 * 16 * 32 * 32 + 3 * 32 * 16 * 16 + 2 * 64 * 8 * 8);
  const size_t fp32 = unshared(Precision::fp32, nullptr, false);
  EXPECT_EQ(fp32 - unshared(Precision::int16, nullptr, false), parts);
  EXPECT_EQ(fp32 - unshared(Precision::int16, "layer1.0.conv1", false), parts - size_t(8) * 4 * 16 * 32 * 32);
  EXPECT_EQ(fp32, unshared(Precision::int16, nullptr, true));
}

// backward() consumes what a training forward saved: a second backward, or one after an
// evaluation forward, is refused.
TEST(Memory, BackwardNeedsItsOwnTrainingForward) {
  Model m(ctx2(), "r");
  build_model(m, "resnet20", 3, 16, 16, 10);
  m.build(2, {});
  const auto x = batch_images(m, 1);
  const std::vector<int32_t> y = {0, 1};
  m.forward(x.data(), y.data(), 2, true);
  EXPECT_TRUE(m.backward());
  EXPECT_THROW(m.backward(), Error);
  m.forward(x.data(), y.data(), 2, true);
  m.forward(x.data(), y.data(), 2, false);
  EXPECT_THROW(m.backward(), Error);
}
