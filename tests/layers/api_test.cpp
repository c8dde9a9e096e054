// The model's API for other programs: inference without labels (logits/predict), backward from a
// caller's loss gradient, the input gradient, the named parameter and buffer views, and the model
// state on disk (save_state/load_state).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/models.hpp"
#include "dfp/optim.hpp"
#include "dfp/state.hpp"
#include "src/io/checkpoint.hpp"
#include "tests/common/expect_error.hpp"
#include "tests/common/model_helpers.hpp"
#include "tests/common/temp_dir.hpp"

namespace dfp {
namespace {

using test::batch_images;
using test::cross_entropy_grad;
using test::ctx2;

constexpr Precision kAll[] = {Precision::fp32, Precision::int16, Precision::bf16, Precision::fp16};

PrecisionPolicy policy_of(Precision p) {
  PrecisionPolicy pol;
  pol.precision = p;
  return pol;
}

// A small network with every kind of parameter and buffer: conv (bias), BatchNorm, a grouped conv,
// Linear.
void small_net(Model& m, int classes = 10) {
  auto x = m.input(3, 8, 8);
  x = m.relu(m.batchnorm(m.conv(x, 16, 3, 1, 1, true, "conv1"), "bn1"), "relu1");
  x = m.relu(m.conv(x, 32, 3, 2, 1, false, "conv2", 4), "relu2");
  m.softmax_cross_entropy(m.linear(m.global_avgpool(x, "gap"), classes, true, "fc"));
}

std::vector<int32_t> labels_for(int n, int classes) {
  std::vector<int32_t> y(n);
  for (int i = 0; i < n; ++i) y[i] = (i * 7 + 3) % classes;
  return y;
}

// small_net with `classes` outputs built for `batch` images in precision p, a batch of images
// drawn from `seed`, and labels.
struct SmallCase {
  std::unique_ptr<Model> model;
  std::vector<float> x;
  std::vector<int32_t> y;
};
SmallCase small_case(Precision p, int batch, uint32_t seed, int classes = 10) {
  SmallCase c{std::make_unique<Model>(ctx2(), "small"), {}, labels_for(batch, classes)};
  small_net(*c.model, classes);
  c.model->build(batch, policy_of(p));
  c.x = batch_images(*c.model, seed);
  return c;
}

// The built-in softmax cross-entropy of logits [n][k] in double, as Model::forward computes it.
double mean_cross_entropy(const std::vector<float>& z, const std::vector<int32_t>& y, int n, int k) {
  double loss = 0;
  for (int i = 0; i < n; ++i) {
    const float* r = z.data() + size_t(i) * k;
    const float zmax = *std::max_element(r, r + k);
    double sum = 0;
    for (int c = 0; c < k; ++c) sum += std::exp(double(r[c]) - zmax);
    loss -= r[y[i]] - (zmax + std::log(sum));
  }
  return loss / n;
}

std::vector<std::vector<float>> grads_of(Model& m) {
  std::vector<std::vector<float>> out;
  for (const Parameter& p : m.parameters()) out.emplace_back(p.grad, p.grad + p.size);
  return out;
}

TEST(Api, PredictGivesTheLogitsOfForwardsLoss) {
  for (Precision p : kAll) {
    SCOPED_TRACE(precision_name(p));
    const auto [owned, x, y] = small_case(p, 8, 1);
    Model& m = *owned;
    ASSERT_EQ(m.classes(), 10);
    std::vector<float> z(8 * 10);
    m.predict(x.data(), 8, z.data());
    const StepResult r = m.forward(x.data(), y.data(), 8, false);
    EXPECT_NEAR(mean_cross_entropy(z, y, 8, 10), r.loss, 1e-12 * std::max(1.0, r.loss));
    // Fewer images: the first rows of the full batch, bit for bit where each image's numbers are
    // its own (FP32, BF16, FP16); INT16 shares a DFP16 exponent per tensor over the batch, so the
    // rows agree to the rounding of one exponent step (2^-14 of each tensor's range here).
    for (int count : {1, 3}) {
      std::vector<float> zs(size_t(count) * 10);
      m.predict(x.data(), count, zs.data());
      float range = 0;
      for (int i = 0; i < count * 10; ++i) range = std::max(range, std::fabs(z[i]));
      for (int i = 0; i < count * 10; ++i) {
        if (p == Precision::int16)
          EXPECT_NEAR(zs[i], z[i], 1e-2f * range) << i;
        else
          EXPECT_EQ(zs[i], z[i]) << i;
      }
    }
  }
}

// A NaN or Inf pixel is refused in every precision, naming the image: a ReLU or max pool would
// turn it into finite logits (torch's are NaN), and the model's state stays usable.
TEST(Api, NonFiniteInputsAreRefusedInEveryPrecision) {
  for (Precision p : kAll) {
    SCOPED_TRACE(precision_name(p));
    auto [owned, x, y] = small_case(p, 4, 2);
    Model& m = *owned;
    std::vector<float> z(4 * 10);
    const size_t per_image = x.size() / 4;
    for (const float bad : {std::nanf(""), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()}) {
      std::vector<float> xb = x;
      xb[2 * per_image + 5] = bad;
      test::expect_error([&] { m.predict(xb.data(), 4, z.data()); }, Status::numerical_error,
                         {"model 'small'", "input image 2 of 4", "non-finite", "element 5"});
      test::expect_error([&] { m.forward(xb.data(), y.data(), 4, true); }, Status::numerical_error,
                         {"input image 2 of 4"});
    }
    // Outside the images given (count 2), the rest of the planned batch is not read.
    std::vector<float> xb = x;
    xb[3 * per_image] = std::nanf("");
    m.predict(xb.data(), 2, z.data());
    for (int i = 0; i < 20; ++i) EXPECT_TRUE(std::isfinite(z[i])) << i;
    m.predict(x.data(), 4, z.data());
    for (float v : z) EXPECT_TRUE(std::isfinite(v));
  }
}

// Builder arguments outside what a layer kind accepts are refused by name before the layer
// exists (a zero stride used to reach a division: SIGFPE).
TEST(Api, BuilderRefusesArgumentsOutsideEachLayersRange) {
  auto fresh = [] {
    auto m = std::make_unique<Model>(ctx2(), "b");
    m->input(3, 8, 8);
    return m;
  };
  const Status bad = Status::invalid_argument;
  auto refused = [&](auto&& call, std::vector<std::string> parts) {
    auto m = fresh();
    test::expect_error([&] { call(*m); }, bad, parts);
  };
  refused([](Model& m) { m.conv(0, 8, 3, 0, 1, false, "c"); }, {"model 'b': conv 'c': stride expected >= 1, got 0"});
  refused([](Model& m) { m.conv(0, 8, 3, -1, 1); }, {"conv: stride expected >= 1, got -1"});
  refused([](Model& m) { m.conv(0, 8, 0, 1, 0); }, {"conv: kernel expected >= 1, got 0"});
  refused([](Model& m) { m.conv(0, 8, 3, 1, -1); }, {"conv: padding expected >= 0, got -1"});
  refused([](Model& m) { m.conv(0, -8, 3, 1, 1); }, {"conv: output channels expected >= 1, got -8"});
  refused([](Model& m) { m.maxpool(0, 2, 0, 0); }, {"maxpool: stride expected >= 1, got 0"});
  refused([](Model& m) { m.avgpool(0, 2, 0, 0); }, {"avgpool: stride expected >= 1, got 0"});
  refused([](Model& m) { m.avgpool(0, 0, 1, 0); }, {"avgpool: kernel expected >= 1, got 0"});
  refused([](Model& m) { m.avgpool(0, 2, 2, -1, "p"); }, {"avgpool 'p': padding expected >= 0, got -1"});
  refused([](Model& m) { m.maxpool(0, 3, 1, 2); }, {"maxpool: padding expected at most half the window (1), got 2"});
  refused([](Model& m) { m.avgpool(0, 2, 2, 2); }, {"avgpool: padding expected at most half the window (1), got 2"});
  refused([](Model& m) { m.shortcut_pad(0, 8, 0); }, {"shortcut: stride expected >= 1, got 0"});
  refused([](Model& m) { m.shortcut_pad(0, -2, 1); }, {"shortcut: output channels expected >= 1, got -2"});
  refused([](Model& m) { m.linear(m.flatten(0), -3, true, "fc"); }, {"fc 'fc': output features expected >= 1, got -3"});
  refused([](Model& m) { m.concat({}, "cat"); }, {"concat 'cat': inputs expected at least one node, got none"});
  refused([](Model& m) { m.dropout(0, 1.5f); }, {"dropout: probability expected in [0, 1)"});
  refused([](Model& m) { m.dropout(0, std::nanf("")); }, {"dropout: probability expected in [0, 1)", "nan"});
  refused([](Model& m) { m.lrn(0, 0, 1e-4f, 0.75f, 2.f); }, {"lrn: size expected >= 1, got 0"});
  refused([](Model& m) { m.lrn(0, -5, 1e-4f, 0.75f, 2.f); }, {"lrn: size expected >= 1, got -5"});
  refused([](Model& m) { m.lrn(0, 5, std::nanf(""), 0.75f, 2.f); }, {"lrn: alpha expected a finite number, got nan"});
  refused([](Model& m) { m.lrn(0, 5, 1e-4f, std::numeric_limits<float>::infinity(), 2.f); },
          {"lrn: beta expected a finite number, got inf"});
  refused([](Model& m) { m.lrn(0, 5, 1e-4f, 0.75f, 0.f); }, {"lrn: k and alpha expected k > 0 and alpha >= 0"});
  // A second loss used to replace the first without a word.
  refused(
      [](Model& m) {
        auto z = m.linear(m.global_avgpool(0), 10);
        m.softmax_cross_entropy(z);
        m.softmax_cross_entropy(m.linear(m.global_avgpool(0), 5));
      },
      {"softmax_cross_entropy on node", "but the loss already reads node", "a model has one loss"});
  refused([](Model& m) { m.softmax_cross_entropy(7); }, {"softmax_cross_entropy: node 7 is not a layer of this model"});
  // What the ranges allow still builds: padding of half the window, a one-input concat.
  // Declaring the loss again on its own node sets the smoothing only.
  auto m = fresh();
  auto x = m->maxpool(m->concat({0}), 3, 1, 1);
  x = m->avgpool(x, 2, 2, 1);
  const auto z = m->linear(m->global_avgpool(x), 10);
  m->softmax_cross_entropy(z);
  m->softmax_cross_entropy(z, 0.1f);
  EXPECT_EQ(m->loss_node(), z);
  m->build(2, PrecisionPolicy{});
  EXPECT_EQ(m->shape(x).h, 5);
}

// A batch whose buffers cannot be allocated is an out-of-memory error that says what was being
// built, not a bare std::bad_alloc (the sizes are petabytes: no machine has them).
TEST(Api, OutOfMemoryNamesWhatWasBeingAllocated) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer ends the process on an allocation it cannot serve (allocator_may_return_null=0); "
                  "the normal build runs this test";
#endif
  for (Precision p : kAll) {
    SCOPED_TRACE(precision_name(p));
    Model m(ctx2(), "huge");
    auto x = m.input(3, 224, 224);
    m.softmax_cross_entropy(m.linear(m.global_avgpool(m.conv(x, 64, 3, 1, 1, false, "conv1")), 10));
    test::expect_error([&] { m.build(1 << 20, policy_of(p)); }, Status::out_of_memory,
                       {"model 'huge'", "out of memory", "batch 1048576", "a smaller batch needs less"});
  }
}

TEST(Api, BackwardFromTheCrossEntropyGradientEqualsTheBuiltIn) {
  for (Precision p : {Precision::fp32, Precision::int16}) {
    SCOPED_TRACE(precision_name(p));
    const auto [owned, x, y] = small_case(p, 8, 2);
    Model& m = *owned;
    m.forward(x.data(), y.data(), 8, true);
    ASSERT_TRUE(m.backward());
    const auto builtin = grads_of(m);
    m.set_step(0);  // the same random streams (stochastic rounding) for the second pass
    std::vector<float> z(8 * 10);
    m.logits(x.data(), 8, true, z.data());
    ASSERT_TRUE(m.backward(cross_entropy_grad(z, y, 8, 10).data()));
    const auto from_caller = grads_of(m);
    ASSERT_EQ(builtin.size(), from_caller.size());
    for (size_t i = 0; i < builtin.size(); ++i)
      EXPECT_EQ(0, std::memcmp(builtin[i].data(), from_caller[i].data(), builtin[i].size() * sizeof(float)))
          << m.parameters()[i].name;
    // The built-in backward needs the labels of a labelled forward.
    m.logits(x.data(), 8, true, z.data());
    test::expect_error([&] { m.backward(); }, Status::invalid_argument, {"labelled", "logits"});
  }
}

TEST(Api, ACallersMseLossTrains) {
  for (Precision p : {Precision::fp32, Precision::int16}) {
    SCOPED_TRACE(precision_name(p));
    const auto [owned, x, y] = small_case(p, 8, 3, 4);
    Model& m = *owned;
    Sgd sgd(ctx2(), m, {0.9f, 0.f, false});
    std::vector<float> z(8 * 4), g(8 * 4);
    double first = 0, last = 0;
    for (int step = 0; step < 40; ++step) {
      m.logits(x.data(), 8, true, z.data());
      double loss = 0;  // mean over the batch and the classes of (z - onehot)^2
      for (int i = 0; i < 8 * 4; ++i) {
        const double d = z[i] - (i % 4 == y[i / 4] ? 1.0 : 0.0);
        loss += d * d / (8 * 4);
        g[i] = static_cast<float>(2 * d / (8 * 4));
      }
      if (step == 0) first = loss;
      last = loss;
      ASSERT_TRUE(m.backward(g.data()));
      sgd.step(0.05f);
    }
    EXPECT_LT(last, 0.5 * first) << "first " << first << ", last " << last;
  }
}

TEST(Api, InputGradientMatchesFiniteDifferences) {
  // The input feeds two convolutions (its gradient is a sum of two parts) and a BatchNorm on batch
  // statistics; no ReLU, so the loss is smooth. Poisoned buffers catch a plan that gives the input's
  // gradient bytes another buffer uses.
  Model m(ctx2(), "tiny");
  auto in = m.input(2, 5, 5);
  auto a = m.conv(in, 4, 3, 1, 1, true, "a");
  auto b = m.conv(in, 4, 1, 1, 0, false, "b");
  auto x = m.batchnorm(m.add(a, b, "add"), "bn");
  m.softmax_cross_entropy(m.linear(m.flatten(x, "flat"), 3, true, "fc"));
  m.set_input_grad(true);
  m.set_debug_poison(true);
  m.build(2, policy_of(Precision::fp32));
  auto xs = batch_images(m, 4);
  const std::vector<int32_t> y = {0, 2};
  test::expect_error([&] { std::vector<float> g(50); m.input_grad(g.data()); }, Status::invalid_argument,
                     {"backward"});
  m.forward(xs.data(), y.data(), 2, true);
  m.backward();
  std::vector<float> g(2 * 2 * 5 * 5);
  m.input_grad(g.data());
  const float eps = 1e-2f;
  int checked = 0;
  for (int n = 0; n < 2; ++n)
    for (int c = 0; c < 2; ++c)
      for (int i = 0; i < 25; i += 3) {
        float& v = xs[(size_t(n) * 25 + i) * 16 + c];  // one channel block
        const float keep = v;
        v = keep + eps;
        const double up = m.forward(xs.data(), y.data(), 2, true).loss;
        v = keep - eps;
        const double down = m.forward(xs.data(), y.data(), 2, true).loss;
        v = keep;
        const double fd = (up - down) / (2 * eps);
        const float an = g[(size_t(n) * 2 + c) * 25 + i];
        EXPECT_NEAR(an, fd, 2e-3 + 2e-2 * std::fabs(fd)) << "n " << n << " c " << c << " pixel " << i;
        ++checked;
      }
  EXPECT_EQ(checked, 2 * 2 * 9);
  Model plain(ctx2(), "plain");
  small_net(plain);
  plain.build(2, policy_of(Precision::fp32));
  test::expect_error([&] { plain.input_grad(g.data()); }, Status::invalid_argument, {"set_input_grad"});
}

// Asking for the input gradient leaves the parameter gradients' bits as they were, and INT16's
// input gradient follows FP32's.
TEST(Api, InputGradientLeavesParameterGradientsAlone) {
  std::vector<float> fp32_dx;
  for (Precision p : {Precision::fp32, Precision::int16}) {
    SCOPED_TRACE(precision_name(p));
    std::vector<std::vector<float>> grads[2];
    std::vector<float> dx(size_t(8) * 3 * 8 * 8);
    for (int with : {0, 1}) {
      Model m(ctx2(), "small");
      small_net(m);
      m.set_input_grad(with == 1);
      m.build(8, policy_of(p));
      const auto x = batch_images(m, 7);
      const auto y = labels_for(8, 10);
      m.forward(x.data(), y.data(), 8, true);
      m.backward();
      grads[with] = grads_of(m);
      if (with) m.input_grad(dx.data());
    }
    EXPECT_EQ(grads[0], grads[1]);
    if (p == Precision::fp32) {
      fp32_dx = dx;
      continue;
    }
    double dot = 0, a2 = 0, b2 = 0;
    for (size_t i = 0; i < dx.size(); ++i) {
      dot += double(dx[i]) * fp32_dx[i];
      a2 += double(dx[i]) * dx[i];
      b2 += double(fp32_dx[i]) * fp32_dx[i];
    }
    EXPECT_GT(b2, 0);
    EXPECT_GT(dot / std::sqrt(a2 * b2), 0.99) << "cosine of the INT16 and FP32 input gradients";
  }
}

// The names and shapes of torchvision's resnet18.state_dict() (less num_batches_tracked).
TEST(Api, ViewsHaveTorchNamesAndShapes) {
  Model m(ctx2(), "resnet18");
  build_model(m, "resnet18", 3, 32, 32, 10);
  m.build(1, policy_of(Precision::fp32));
  auto shape = [&](const std::string& name) { return m.tensor(name).shape; };
  EXPECT_EQ(shape("conv1.weight"), (std::vector<int>{64, 3, 7, 7}));
  EXPECT_EQ(shape("layer1.0.conv1.weight"), (std::vector<int>{64, 64, 3, 3}));
  EXPECT_EQ(shape("layer2.0.downsample.0.weight"), (std::vector<int>{128, 64, 1, 1}));
  EXPECT_EQ(shape("bn1.running_mean"), (std::vector<int>{64}));
  EXPECT_EQ(shape("layer4.1.bn2.running_var"), (std::vector<int>{512}));
  EXPECT_EQ(shape("layer3.0.downsample.1.weight"), (std::vector<int>{256}));
  EXPECT_EQ(shape("bn1.weight"), (std::vector<int>{64}));
  EXPECT_EQ(shape("fc.weight"), (std::vector<int>{10, 512}));
  EXPECT_EQ(shape("fc.bias"), (std::vector<int>{10}));
  EXPECT_FALSE(m.tensor("bn1.running_var").trainable);
  EXPECT_TRUE(m.tensor("fc.weight").trainable);
  for (const TensorView& v : m.state()) {
    size_t n = 1;
    for (int d : v.shape) n *= size_t(d);
    EXPECT_EQ(n, v.size) << v.name;
  }
  test::expect_error([&] { m.tensor("layer9.weight"); }, Status::invalid_argument, {"layer9.weight", "conv1.weight"});
}

// A BatchNorm of a channel count that is not a multiple of 16 shows [channels], as PyTorch (its
// padding lanes stay out of view), and its eps is the one it was built with: y = x / sqrt(var + eps)
// with running mean 0.
TEST(Api, BatchNormViewsAndEps) {
  for (const double eps : {1e-5, 0.25}) {
    Model m(ctx2(), "bn24");
    auto x = m.input(24, 1, 1);
    x = m.batchnorm(x, "bn", eps);
    m.softmax_cross_entropy(m.linear(m.flatten(x, "flatten"), 24, false, "fc"));
    m.build(1, policy_of(Precision::fp32));
    for (const char* t : {"bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"}) {
      EXPECT_EQ(m.tensor(t).shape, std::vector<int>{24}) << t;
      EXPECT_EQ(m.tensor(t).size, 24u) << t;
    }
    EXPECT_EQ(m.graph()[1].get<BatchNormParams>().eps, eps);
    const TensorView var = m.tensor("bn.running_var"), fc = m.tensor("fc.weight");
    for (int c = 0; c < 24; ++c) var.data[c] = 0.75f;
    for (int i = 0; i < 24 * 24; ++i) fc.data[i] = i % 25 == 0 ? 1.f : 0.f;  // identity
    m.weights_updated();
    std::vector<float> in(blocked_size(1, 24, 1, 1), 0.f), out(24), plain(24);
    for (int c = 0; c < 24; ++c) plain[size_t(c)] = float(c + 1);
    to_blocked(plain.data(), in.data(), 1, 24, 1, 1);
    m.predict(in.data(), 1, out.data());
    for (int c = 0; c < 24; ++c) EXPECT_FLOAT_EQ(out[size_t(c)], float(c + 1) / std::sqrt(0.75f + float(eps))) << c;
  }
  Model bad(ctx2(), "bad");
  test::expect_error([&] { bad.batchnorm(bad.input(3, 2, 2), "bn", 0.0); }, Status::invalid_argument,
                     {"model 'bad': bn 'bn': eps expected a positive finite number, got 0"});
}

TEST(Api, WritingThroughAViewChangesPredictions) {
  for (Precision p : {Precision::fp32, Precision::int16}) {
    SCOPED_TRACE(precision_name(p));
    const auto [owned, x, y] = small_case(p, 4, 5);
    Model& m = *owned;
    std::vector<float> before(40), after(40);
    m.predict(x.data(), 4, before.data());
    const TensorView w = m.tensor("fc.weight"), b = m.tensor("fc.bias");
    EXPECT_EQ(w.shape, (std::vector<int>{10, 32}));
    for (size_t i = 0; i < w.size; ++i) w.data[i] *= 2;
    m.weights_updated();
    m.predict(x.data(), 4, after.data());
    // Doubling the weights doubles the logits less the bias (to the rounding of the precision).
    for (int i = 0; i < 40; ++i)
      EXPECT_NEAR(after[i] - b.data[i % 10], 2 * (before[i] - b.data[i % 10]), 1e-3 + 1e-2 * std::fabs(before[i])) << i;
    // The views stay the model's storage through training.
    Sgd sgd(ctx2(), m, {0.9f, 0.f, false});
    const float w0 = w.data[0];
    m.forward(x.data(), y.data(), 4, true);
    m.backward();
    sgd.step(0.1f);
    EXPECT_EQ(m.tensor("fc.weight").data, w.data);
    EXPECT_EQ(m.parameters()[m.parameters().size() - 2].value, w.data);
    EXPECT_NE(w.data[0], w0);
  }
}

TEST(Api, SavedStateLoadsIntoAFreshModel) {
  test::TempDir dir("api_state_");
  for (Precision p : kAll) {
    SCOPED_TRACE(precision_name(p));
    const std::string path = dir.file(std::string(precision_name(p)) + ".dfp");
    std::vector<float> expected(40), got(40);
    Context other(ContextOptions{.threads = 2, .seed = 99});  // another initialisation
    Model a(ctx2(), "small");
    small_net(a);
    PrecisionPolicy pol = policy_of(p);
    pol.overrides.push_back({"fc", Precision::fp32});
    a.build(4, pol);
    const auto x = batch_images(a, 6);
    const auto y = labels_for(4, 10);
    Sgd sgd(ctx2(), a, {0.9f, 0.f, false});
    for (int s = 0; s < 2; ++s) {  // BatchNorm's running statistics move too
      a.forward(x.data(), y.data(), 4, true);
      a.backward();
      sgd.step(0.1f);
    }
    a.predict(x.data(), 4, expected.data());
    save_state(a, path);

    const PrecisionPolicy read = read_state_policy(path);
    EXPECT_EQ(read.fields(), pol.fields());
    Model b(other, "small");
    small_net(b);
    b.build(4, read);
    b.predict(x.data(), 4, got.data());
    EXPECT_NE(got, expected);
    load_state(b, path);
    b.predict(x.data(), 4, got.data());
    EXPECT_EQ(got, expected);
  }
}

TEST(Api, BadStateFilesAreRefusedByName) {
  test::TempDir dir("api_state_bad_");
  const std::string path = dir.file("s.dfp");
  Model a(ctx2(), "small");
  small_net(a);
  a.build(2, policy_of(Precision::fp32));
  save_state(a, path);

  Model other(ctx2(), "small");  // another geometry: 5 classes
  small_net(other, 5);
  other.build(2, policy_of(Precision::fp32));
  const std::vector<float> keep(other.tensor("conv1.weight").data, other.tensor("conv1.weight").data + 16 * 27);
  test::expect_error([&] { load_state(other, path); }, Status::corrupt_data, {path, "'fc.weight'", "10x32", "5x32"});
  EXPECT_TRUE(std::equal(keep.begin(), keep.end(), other.tensor("conv1.weight").data)) << "refused, left as it was";

  Model bigger(ctx2(), "bigger");  // a tensor the file lacks
  auto x = bigger.input(3, 8, 8);
  x = bigger.relu(bigger.batchnorm(bigger.conv(x, 16, 3, 1, 1, true, "conv1"), "bn1"), "relu1");
  bigger.softmax_cross_entropy(bigger.linear(bigger.global_avgpool(x, "gap"), 10, true, "head"));
  bigger.build(2, policy_of(Precision::fp32));
  test::expect_error([&] { load_state(bigger, path); }, Status::corrupt_data, {path, "'head.weight'", "missing"});

  std::ifstream f(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const std::string cut = dir.file("cut.dfp");
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  test::expect_error([&] { load_state(a, cut); }, Status::corrupt_data, {cut, "truncated"});
  std::string flipped = bytes;
  flipped[bytes.size() - 20] ^= 1;
  const std::string bad = dir.file("crc.dfp");
  std::ofstream(bad, std::ios::binary) << flipped;
  test::expect_error([&] { load_state(a, bad); }, Status::corrupt_data, {bad, "CRC"});
  test::expect_error([&] { load_state(a, dir.file("none.dfp")); }, Status::io_error, {"none.dfp"});

  Checkpoint ck = read_checkpoint(path);
  ck.meta["state_version"] = std::to_string(kStateVersion + 1);
  const std::string newer = dir.file("newer.dfp");
  write_checkpoint(newer, ck);
  test::expect_error([&] { load_state(a, newer); }, Status::corrupt_data, {newer, "state_version"});
  ck = read_checkpoint(path);
  ck.tensors["bn1.running_var"].pop_back();
  const std::string shorter = dir.file("short.dfp");
  write_checkpoint(shorter, ck);
  test::expect_error([&] { load_state(a, shorter); }, Status::corrupt_data, {shorter, "'bn1.running_var'", "15", "16"});
}

}  // namespace
}  // namespace dfp
