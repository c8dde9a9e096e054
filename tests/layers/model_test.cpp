// Model graph and layers: published parameter counts, FP32 backward of every layer against finite
// differences, INT16/BF16/FP16 against FP32, loss scaling, BF16 implementations, determinism,
// profiling. The optimizer's tests are in tests/train/optim_test.cpp, the trainer's in
// training_test.cpp, the memory plan's and fusion's in tests/graph/memory_test.cpp.
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
#include "src/layers/layer.hpp"
#include "tests/common/temp_dir.hpp"
#include "tests/common/tolerance.hpp"
#include "tests/common/expect_error.hpp"
#include "tests/common/isa_levels.hpp"
#include "tests/common/reference.hpp"
#include "tests/common/model_helpers.hpp"

using namespace dfp;
using test::batch_images;
using test::ctx2;

namespace {

size_t count(const std::string& name, int c, int h, int w, int classes) {
  Model m(ctx2(), name);
  build_model(m, name, c, h, w, classes);
  return m.parameter_count();
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
  EXPECT_EQ(count("alexnet_tv", 3, 224, 224, 1000), 61100840u);  // torchvision's alexnet
  EXPECT_EQ(count("googlenet", 3, 224, 224, 1000), 6624904u);  // torchvision, no aux classifiers
}

TEST(Models, AcceptSmallAndGrayscaleInputs) {
  for (const std::string& name : model_names()) {
    if (name == "alexnet" || name == "alexnet_tv") continue;  // needs >= 63 pixels by design
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
    convs += s.kind == LayerKind::conv;
    adds += s.kind == LayerKind::add;
    fcs += s.kind == LayerKind::linear;
    for (int i : s.inputs) EXPECT_LT(i, &s - g.data());  // inputs come first
  }
  EXPECT_EQ(g.front().kind, LayerKind::input);
  EXPECT_EQ(convs, 19);  // 1 stem + 9 blocks x 2 (option-A shortcuts have no conv)
  EXPECT_EQ(adds, 9);
  EXPECT_EQ(fcs, 1);
  EXPECT_EQ(g[m.loss_node()].kind, LayerKind::linear);
  EXPECT_EQ(g[m.loss_node()].shape.c, 10);
  EXPECT_EQ(g[1].get<ConvParams>().kernel, 3);
  EXPECT_EQ(g[1].get<ConvParams>().out_channels, 16);
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

// Under the INT16 policy a BatchNorm saves its input as DFP16 in the pass that takes its moments,
// at the exponent of the step before (the exponent seldom changes), and where this step's
// exponent differs quantizes it again. Either way a step gives the bits of a model that runs it
// first (with no exponent from before): inputs scaled by 4 and back move the exponent by two
// (steps 2, 4 and 5 mispredict, 1 and 3 predict).
TEST(Layers, Int16BatchNormSavedInputGivesTheSameBitsWhateverTheExponentBefore) {
  auto make = [](Model& m) {
    auto x = m.input(8, 12, 12);
    x = m.relu(m.batchnorm(m.conv(x, 32, 3, 1, 1, false, "c1"), "bn1"), "r1");
    x = m.conv(x, 16, 3, 1, 1, false, "c2");
    m.softmax_cross_entropy(m.linear(m.global_avgpool(x, "gap"), 10, true, "fc"));
  };
  PrecisionPolicy pol;
  pol.precision = Precision::int16;
  Model a(test::ctx2(), "a");
  make(a);
  a.build(4, pol);
  const std::vector<float> base = test::batch_images(a, 11);
  const std::vector<int32_t> y = {1, 3, 5, 7};
  for (int step = 0; step < 6; ++step) {
    const float scale = step == 2 || step == 3 ? 4.f : step == 4 ? 0.25f : 1.f;
    std::vector<float> xs = base;
    for (float& v : xs) v *= scale;
    Model b(test::ctx2(), "b");
    make(b);
    b.build(4, pol);
    for (size_t i = 0; i < a.parameters().size(); ++i)
      std::copy_n(a.parameters()[i].value, a.parameters()[i].size, b.parameters()[i].value);
    b.weights_updated();
    a.set_step(uint64_t(step));
    b.set_step(uint64_t(step));
    const double loss_a = a.forward(xs.data(), y.data(), 4, true).loss;
    const double loss_b = b.forward(xs.data(), y.data(), 4, true).loss;
    ASSERT_EQ(std::memcmp(&loss_a, &loss_b, sizeof(double)), 0) << "step " << step;
    a.backward();
    b.backward();
    for (size_t i = 0; i < a.parameters().size(); ++i) {
      const Parameter &pa = a.parameters()[i], &pb = b.parameters()[i];
      ASSERT_EQ(std::memcmp(pa.grad, pb.grad, pa.size * sizeof(float)), 0) << pa.name << ", step " << step;
    }
  }
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

// An INT16 grouped conv's time by part is its groups' summed, and is reset with the layer times.
TEST(Profiling, GroupedInt16ConvReportsItsGroupsParts) {
  Model m(ctx2(), "g");
  grouped_pair(m, 32, 48, 2);
  PrecisionPolicy pol;
  pol.precision = Precision::int16;
  m.build(3, pol);
  m.set_profiling(true);
  const auto x = batch_images(m, 6);
  const std::vector<int32_t> y = {4, 0, 2};
  m.forward(x.data(), y.data(), 3, true);
  ASSERT_TRUE(m.backward());
  LayerTime conv1;
  for (const LayerTime& t : m.layer_times())
    if (t.layer == "conv1") conv1 = t;
  ASSERT_EQ(conv1.steps, 1u);
  const LayerTime::Int16Parts& p = conv1.int16;
  EXPECT_GT(p.quantize_x, 0.0);
  EXPECT_GT(p.forward, 0.0);
  EXPECT_GT(p.quantize_dy, 0.0);
  EXPECT_GT(p.backward_data, 0.0);
  EXPECT_GT(p.backward_weights, 0.0);
  EXPECT_LE(p.quantize_x + p.forward, conv1.forward_seconds);
  EXPECT_LE(p.quantize_dy + p.backward_data + p.backward_weights, conv1.backward_seconds);
  m.reset_layer_times();
  m.forward(x.data(), y.data(), 3, true);
  ASSERT_TRUE(m.backward());
  for (const LayerTime& t : m.layer_times())
    if (t.layer == "conv1") {
      EXPECT_LE(t.int16.forward, t.forward_seconds) << "reset_layer_times resets the groups' parts";
    }
}

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
// with GradScaler's initial scale 2^16 it is representable and matches FP32. The sampled
// numerics name the operand that lost it: every nonzero dy value, no x value.
TEST(LossScaling, Fp16UnderflowLosesTheGradientUnlessScaled) {
  LayerNumerics c1_numerics;
  auto run = [&](Precision p, double scale) {
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
    m.set_numerics_interval(1);
    const auto xs = batch_images(m, 3);
    const std::vector<int32_t> y = {0, 1, 2, 3, 4, 5, 6, 7};
    m.forward(xs.data(), y.data(), 8, true);
    EXPECT_TRUE(m.backward());
    for (const LayerNumerics& n : m.numerics())
      if (n.layer == "c1") c1_numerics = n;
    for (Parameter& q : m.parameters())
      if (q.name == "c1.weight") return std::vector<float>(q.grad, q.grad + q.size);
    return std::vector<float>{};
  };
  const std::vector<float> ref = run(Precision::fp32, 1);
  const std::vector<float> lost = run(Precision::fp16, 1);
  const LayerNumerics unscaled = c1_numerics;
  const std::vector<float> scaled = run(Precision::fp16, LossScaleOptions{}.initial_scale());
  double ref_norm = 0;
  for (float v : ref) ref_norm += double(v) * v;
  ASSERT_GT(ref_norm, 0);
  for (float v : lost) ASSERT_EQ(v, 0.f) << "the FP16 gradient was expected to underflow to zero";
  EXPECT_LT(test::rel_l2(scaled, ref), test::kFp16GradRelL2Smooth);

  ASSERT_TRUE(unscaled.sampled);
  EXPECT_GT(unscaled.nonzero_dy, 0u);
  EXPECT_EQ(unscaled.underflow_dy, unscaled.nonzero_dy);
  EXPECT_GT(unscaled.nonzero_x, 0u);
  EXPECT_EQ(unscaled.underflow_x, 0u);
  EXPECT_EQ(unscaled.underflow, unscaled.underflow_x + unscaled.underflow_w + unscaled.underflow_dy);
  EXPECT_EQ(unscaled.nonzero, unscaled.nonzero_x + unscaled.nonzero_w + unscaled.nonzero_dy);
  ASSERT_TRUE(c1_numerics.sampled);  // scaled: most of the gradient is representable
  EXPECT_LT(c1_numerics.underflow_dy, unscaled.underflow_dy / 10);
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
  int spans_timed = 0, recomputed_timed = 0;  // convs whose x a BatchNorm's forward quantized; computed again
  int dy_spans_timed = 0;                     // convs whose dy a BatchNorm's backward quantized
  for (size_t i = 0; i + 1 < times.size(); ++i) {
    EXPECT_EQ(times[i].layer, graph[i + 1].name);
    EXPECT_EQ(times[i].kind, graph[i + 1].kind_name());
    EXPECT_EQ(times[i].steps, 2u) << times[i].layer;
    EXPECT_GE(times[i].forward_seconds, 0.0);
    EXPECT_GE(times[i].backward_seconds, 0.0);
    if (times[i].kind == "conv") {
      EXPECT_EQ(times[i].precision, "int16");
      const std::string k = m_kernels_pixel + " | " + m_kernels_pixel + " | " + m_kernels_pair;
      EXPECT_EQ(times[i].implementation, k) << times[i].layer;
      EXPECT_GT(times[i].forward_seconds, 0.0) << times[i].layer;
      EXPECT_GT(times[i].backward_seconds, 0.0) << times[i].layer;
      // Its parts: each pass timed, and each within the time that holds it: a conv whose input a
      // BatchNorm hands over span by span quantizes it inside that BatchNorm's forward, and
      // computes its batch-pair copy again in its own backward.
      const LayerTime::Int16Parts& p = times[i].int16;
      EXPECT_GT(p.forward, 0.0) << times[i].layer;
      EXPECT_GT(p.quantize_dy, 0.0) << times[i].layer;
      EXPECT_GT(p.backward_weights, 0.0) << times[i].layer;
      EXPECT_GT(p.quantize_x, 0.0) << times[i].layer;
      EXPECT_TRUE(graph[i + 1].input_spans || p.quantize_x_in_producer == 0.0) << times[i].layer;
      spans_timed += p.quantize_x_in_producer > 0.0;
      recomputed_timed += p.quantize_x_in_backward > 0.0;
      const double x_fwd = p.quantize_x - p.quantize_x_in_producer - p.quantize_x_in_backward;
      EXPECT_GE(x_fwd, -1e-9) << times[i].layer;
      EXPECT_LE(x_fwd + p.forward, times[i].forward_seconds) << times[i].layer;
      // dy quantized inside the BatchNorm's backward where that BatchNorm hands it over as spans.
      EXPECT_TRUE(graph[i + 1].grad_spans || p.quantize_dy_in_producer == 0.0) << times[i].layer;
      dy_spans_timed += p.quantize_dy_in_producer > 0.0;
      const double dy_own = p.quantize_dy - p.quantize_dy_in_producer;
      EXPECT_GE(dy_own, -1e-9) << times[i].layer;
      EXPECT_LE(dy_own + p.quantize_x_in_backward + p.backward_data + p.backward_weights, times[i].backward_seconds)
          << times[i].layer;
      if (i > 0) {
        EXPECT_GT(p.backward_data, 0.0) << times[i].layer;  // the first conv has none
      }
    } else if (times[i].kind == "fc") {
      EXPECT_GT(times[i].int16.forward, 0.0) << "an INT16 Linear runs the same operator";
    } else {
      EXPECT_EQ(times[i].int16.forward + times[i].int16.quantize_x, 0.0) << times[i].layer << ": not an INT16 conv";
    }
  }
  // ResNet-20's second conv of every block takes its BatchNorm's output as spans and computes its
  // weight gradient's copy again.
  EXPECT_GT(spans_timed, 0);
  EXPECT_GT(recomputed_timed, 0);
  EXPECT_GT(dy_spans_timed, 0);
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

// A data-parallel job's rank draws the dropout masks of its images as one process with the whole
// batch draws them (Model::set_batch_offset): images 2-3 run as a batch of their own at offset 2
// get the logits they get as images 2-3 of the whole batch (up to FP32 summation order), in the
// same training step.
TEST(Layers, DropoutMasksFollowTheImagesPlaceInTheGlobalBatch) {
  // The same model (weights and dropout seeds come from the context's seed) at batch 4 and 2.
  const auto make = [](Model& m, int batch) {
    auto x = m.input(3, 5, 5);
    x = m.dropout(m.conv(x, 16, 3, 1, 1, true, "conv"), 0.5f, "drop");
    m.softmax_cross_entropy(m.linear(m.flatten(x, "fl"), 4, true, "fc"));
    m.build(batch, {});
    m.set_step(7);
  };
  Model whole(ctx2(), "drop"), part(ctx2(), "drop");
  make(whole, 4);
  make(part, 2);
  const std::vector<float> images = batch_images(whole, 11);
  const size_t image = images.size() / 4;
  std::vector<float> all(4 * 4), mine(2 * 4), unshifted(2 * 4);
  whole.logits(images.data(), 4, true, all.data());
  part.set_batch_offset(2);
  part.logits(images.data() + 2 * image, 2, true, mine.data());
  // The same masks; oneDNN's FP32 kernels may sum a batch of 2 and of 4 in other orders.
  const std::vector<float> want(all.begin() + 8, all.end());
  EXPECT_LE(test::rel_l2(mine, want), test::kF32RelL2);
  // At offset 0 the same images draw the masks of images 0-1: other logits.
  part.set_batch_offset(0);
  part.logits(images.data() + 2 * image, 2, true, unshifted.data());
  EXPECT_GT(test::rel_l2(unshifted, want), 100 * test::kF32RelL2);
  EXPECT_THROW(part.set_batch_offset(-1), Error);
}
