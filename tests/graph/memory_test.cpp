// The memory plan (buffers placed by lifetime in one arena, written before they are read, INT16's
// small FP32 share) and the fusions it allows (BatchNorm+ReLU, inputs taken as spans).
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
#include "tests/common/files.hpp"
#include "tests/common/model_helpers.hpp"

using namespace dfp;
using test::batch_images;
using test::ctx2;
using test::slurp;

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
      {"bn-into-pool",  // BatchNorms feeding pools as spans: input rows through a ring, every one asked for
       [](Model& m) {
         auto x = m.input(3, 9, 9);
         auto a = m.relu(m.batchnorm(m.conv(x, 16, 3, 1, 1, false, "c0"), "bn0"), "r0");
         auto p = m.maxpool(a, 3, 2, 1, false, "mp");  // ResNet's stem pool, on an odd size
         auto b = m.batchnorm(m.conv(p, 4, 3, 1, 1, false, "c1"), "bn1");
         auto q = m.avgpool(b, 2, 2, 0, "ap");  // 5 rows: no window reads the last
         auto c = m.relu(m.batchnorm(m.conv(q, 4, 3, 1, 1, false, "c2"), "bn2"), "r2");
         auto t = m.maxpool(c, 2, 2, 0, true, "mp2");  // ceil mode
         m.softmax_cross_entropy(m.linear(m.flatten(t, "fl"), 3, true, "fc"));
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
                             bool copying_adds = false, Granularity g = Granularity::tensor) {
  Model m(ctx2(), "p");
  make(m);
  m.set_fusion(fusion);
  PrecisionPolicy pol;
  pol.precision = p;
  pol.dfp.weights.granularity = pol.dfp.activations.granularity = pol.dfp.gradients.granularity = g;
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
  // With exponents per slice the producers also hand on each plane's maximum (BatchNorm forward
  // and backward, a residual Add with its ReLU), which must give the exponents the conv measures.
  for (const auto& [name, make] : plan_graphs()) {
    const auto fused = two_steps(make, Precision::int16, false, true, false, Granularity::slice),
               separate = two_steps(make, Precision::int16, false, false, false, Granularity::slice);
    ASSERT_EQ(fused.size(), separate.size());
    EXPECT_EQ(0, std::memcmp(fused.data(), separate.data(), fused.size() * sizeof(float))) << name << " slice";
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

// Which convs take their output gradient as spans from the BatchNorm right after them: with fusion,
// every INT16 conv of ResNet-20 (each is read by its BatchNorm alone); none in FP32, none without
// fusion, none with exponents per slice of dy, and not a conv kept in FP32 or one with a bias.
TEST(Fusion, ConvsTakeTheirGradientAsSpansFromTheBatchNormAfterThem) {
  auto linked = [](Precision p, bool fusion, const char* keep_fp32, Granularity g) {
    Model m(ctx2(), "r");
    build_model(m, "resnet20", 3, 8, 8, 10);
    m.set_fusion(fusion);
    PrecisionPolicy pol;
    pol.precision = p;
    pol.dfp.gradients.granularity = g;
    if (keep_fp32) pol.overrides = {{keep_fp32, Precision::fp32}};
    m.build(2, pol);
    std::vector<std::string> names;
    int convs = 0;
    for (const LayerSpec& s : m.graph()) {
      convs += s.kind == LayerKind::conv;
      if (s.grad_spans) names.push_back(s.name);
    }
    EXPECT_EQ(convs, 19);
    return names;
  };
  const auto all = linked(Precision::int16, true, nullptr, Granularity::tensor);
  EXPECT_EQ(all.size(), 19u);
  EXPECT_TRUE(linked(Precision::int16, false, nullptr, Granularity::tensor).empty());
  EXPECT_TRUE(linked(Precision::fp32, true, nullptr, Granularity::tensor).empty());
  EXPECT_TRUE(linked(Precision::int16, true, nullptr, Granularity::slice).empty());
  auto some = all;
  some.erase(std::find(some.begin(), some.end(), "layer2.1.conv2"));
  EXPECT_EQ(linked(Precision::int16, true, "layer2.1.conv2", Granularity::tensor), some);
  Model m(ctx2(), "bias");
  auto x = m.input(3, 6, 6);
  auto b = m.batchnorm(m.conv(x, 16, 3, 1, 1, true, "biased"), "bn");
  auto c = m.batchnorm(m.conv(b, 16, 3, 1, 1, false, "plain"), "bn2");
  m.softmax_cross_entropy(m.linear(m.flatten(c, "fl"), 3, true, "fc"));
  PrecisionPolicy pol;
  pol.precision = Precision::int16;
  m.build(2, pol);
  std::vector<std::string> names;
  for (const LayerSpec& s : m.graph())
    if (s.grad_spans) names.push_back(s.name);
  EXPECT_EQ(names, std::vector<std::string>{"plain"});
}

// Pools take their input as spans from a BatchNorm (and its ReLU) read by nothing else: every
// max-pool of VGG-11-BN, in every precision, and none without fusion.
TEST(Fusion, PoolsTakeTheirBatchNormInputAsSpans) {
  for (Precision p : {Precision::fp32, Precision::int16})
    for (bool fusion : {true, false}) {
      Model m(ctx2(), "v");
      build_model(m, "vgg11bn", 3, 32, 32, 10);
      m.set_fusion(fusion);
      PrecisionPolicy pol;
      pol.precision = p;
      m.build(2, pol);
      int pools = 0, linked = 0;
      for (const LayerSpec& s : m.graph())
        if (s.kind == LayerKind::maxpool) {
          ++pools;
          linked += s.input_spans;
        }
      EXPECT_EQ(pools, 5);
      EXPECT_EQ(linked, fusion ? 5 : 0) << precision_name(p);
    }
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
