// The precision policy's one home (include/dfp/precision.hpp): resolution per layer, its text
// fields, and the weighted-layer operation each precision chooses (src/layers/weighted_ops.hpp),
// including the kernel table's BF16-operand convolution.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "dfp/context.hpp"
#include "dfp/model.hpp"
#include "dfp/models.hpp"
#include "dfp/precision.hpp"
#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"
#include "tests/common/expect_error.hpp"
#include "tests/common/model_helpers.hpp"

using namespace dfp;

namespace {

PrecisionPolicy mixed_policy() {
  PrecisionPolicy p;
  p.precision = Precision::int16;
  p.overrides = PrecisionPolicy::parse_overrides("fc=bf16,layer1.*=fp16,conv1=fp32", "test");
  p.weights_format = FloatFormat::fp16;
  p.dfp.activations.headroom = 2;
  p.dfp.gradients.rounding = Rounding::stochastic;
  return p;
}

}  // namespace

// Model::build hands each layer what the policy says for its name; nothing else reads the policy.
TEST(Precision, ForLayerResolvesPrecisionFormatsAndStreams) {
  const PrecisionPolicy p = mixed_policy();
  const LayerPrecision conv = p.for_layer("layer2.0.conv1");
  EXPECT_EQ(conv.precision, Precision::int16);
  EXPECT_FALSE(conv.is_float());
  EXPECT_EQ(conv.formats.weights, FloatFormat::fp32);  // class formats belong to float layers only
  EXPECT_EQ(conv.options.activations.headroom, 2);

  const LayerPrecision fc = p.for_layer("fc");
  EXPECT_EQ(fc.precision, Precision::bf16);
  EXPECT_TRUE(fc.is_float());
  EXPECT_EQ(fc.formats.weights, FloatFormat::fp16);  // the policy's class format
  EXPECT_EQ(fc.formats.activations, FloatFormat::bf16);
  EXPECT_EQ(fc.formats.gradients, FloatFormat::bf16);
  EXPECT_FALSE(fc.all_bf16());
  EXPECT_EQ(p.for_layer("layer1.2.conv2").precision, Precision::fp16);
  EXPECT_EQ(p.for_layer("conv1").precision, Precision::fp32);

  // Each layer and class gets a stochastic stream of its own, named after the layer.
  const DfpConvOptions a = conv.options_for("a"), b = conv.options_for("b");
  EXPECT_EQ(a.weights.name, "a.weights");
  EXPECT_EQ(b.gradients.name, "b.gradients");
  EXPECT_NE(a.weights.seed, b.weights.seed);
  EXPECT_NE(a.weights.seed, a.activations.seed);
  EXPECT_EQ(a.gradients.rounding, Rounding::stochastic);
  EXPECT_EQ(conv.options_for("a").weights.seed, a.weights.seed);  // a function of the name alone

  PrecisionPolicy all_bf16;
  all_bf16.precision = Precision::bf16;
  EXPECT_TRUE(all_bf16.for_layer("x").all_bf16());
}

// The checkpoint's meta fields rebuild the same policy; a bad field is named.
TEST(Precision, FieldsRoundTripAndBadFieldsAreNamed) {
  const PrecisionPolicy p = mixed_policy();
  const std::map<std::string, std::string> f = p.fields();
  for (const char* key : {"precision", "overrides", "formats", "headroom", "rounding"}) EXPECT_EQ(f.count(key), 1u) << key;
  const PrecisionPolicy back = PrecisionPolicy::from_fields(f, "checkpoint 'x.dfp'");
  EXPECT_EQ(back.describe(), p.describe());
  EXPECT_EQ(PrecisionPolicy::from_fields({{"precision", "bf16"}}, "o").describe(), [] {
    PrecisionPolicy d;
    d.precision = Precision::bf16;
    return d.describe();
  }());

  auto with = [&](const std::string& key, const std::string& value) {
    std::map<std::string, std::string> g = f;
    g[key] = value;
    return g;
  };
  test::expect_error([&] { PrecisionPolicy::from_fields({{"overrides", ""}}, "checkpoint 'x.dfp'"); },
                     Status::corrupt_data, {"checkpoint 'x.dfp'", "'precision' missing"});
  test::expect_error([&] { PrecisionPolicy::from_fields(with("precision", "int8"), "checkpoint 'x.dfp'"); },
                     Status::invalid_argument, {"checkpoint 'x.dfp' field precision", "int8"});
  test::expect_error([&] { PrecisionPolicy::from_fields(with("headroom", "1,x,2"), "ck"); }, Status::corrupt_data,
                     {"ck field headroom", "'x'"});
  test::expect_error([&] { PrecisionPolicy::from_fields(with("rounding", "nearest,up,nearest"), "ck"); },
                     Status::invalid_argument, {"ck field rounding", "up"});
  test::expect_error([&] { PrecisionPolicy::from_fields(with("formats", "fp8,,"), "ck"); }, Status::invalid_argument,
                     {"ck field formats", "fp8"});
  test::expect_error([&] { PrecisionPolicy::from_fields(with("overrides", "fc"), "ck"); }, Status::invalid_argument,
                     {"ck field overrides", "PATTERN=PRECISION"});
}

// Native BF16 is a kernel-table entry like conv_f32: none at the reference level (the layer then
// rounds its operands and runs conv_f32), oneDNN's primitives above it where oneDNN has JIT code.
TEST(Precision, ConvBf16IsAKernelTableEntry) {
  ConvShape probe;
  probe.N = 4; probe.C = 32; probe.H = 8; probe.W = 8; probe.K = 32; probe.R = 3; probe.S = 3;
  probe.pad_h = probe.pad_w = 1;
  ContextOptions ref;
  ref.threads = 2;
  ref.isa = "ref";
  const Context rc(ref);
  EXPECT_EQ(rc.kernels().conv_bf16.fn(rc.threads(), probe, "probe"), nullptr);
  EXPECT_NE(std::string(rc.kernels().conv_bf16.name).find("none"), std::string::npos);

  const Context& best = test::ctx2();
  if (best.isa() < Isa::avx512bw || std::getenv("ONEDNN_MAX_CPU_ISA"))
    GTEST_SKIP() << "oneDNN 2.6 has BF16 JIT convolutions from AVX-512 up only";
  const auto b = best.kernels().conv_bf16.fn(best.threads(), probe, "probe");
  ASSERT_NE(b, nullptr);
  for (const char* impl : {b->impl_forward(), b->impl_backward_data(), b->impl_backward_weights()})
    EXPECT_EQ(std::string(impl).rfind("onednn:", 0), 0u) << impl;

  // A bf16 ResNet-20 runs its convolutions on that entry, and its classifier on rounded operands.
  Model m(best, "resnet20");
  build_model(m, "resnet20", 3, 16, 16, 10);
  PrecisionPolicy pol;
  pol.precision = Precision::bf16;
  m.build(2, pol);
  m.set_profiling(true);
  const std::vector<float> x = test::batch_images(m, 9);
  const std::vector<int32_t> y = {1, 2};
  m.forward(x.data(), y.data(), 2, true);
  m.backward();
  bool saw_conv = false, saw_fc = false;
  for (const LayerTime& t : m.layer_times()) {
    if (t.layer == "layer1.0.conv1") {
      saw_conv = true;
      EXPECT_EQ(t.implementation.rfind("onednn:", 0), 0u) << t.implementation;
      EXPECT_NE(t.implementation.find(" | "), std::string::npos) << t.implementation;
    }
    if (t.layer == "fc") {
      saw_fc = true;
      EXPECT_EQ(t.implementation.rfind("onednn:", 0), 0u) << t.implementation;
      EXPECT_EQ(t.implementation.find(" | "), std::string::npos) << t.implementation;
    }
  }
  EXPECT_TRUE(saw_conv);
  EXPECT_TRUE(saw_fc);
}

// The run's note names where each pass's exponents vary, the weight gradient's included (its
// operands are sliced per image pair and block whenever their class is `slice`).
TEST(Precision, NotesNameEachPassesExponents) {
  auto note = [](Granularity w, Granularity x, Granularity dy) {
    PrecisionPolicy p;
    p.precision = Precision::int16;
    p.dfp.weights.granularity = w;
    p.dfp.activations.granularity = x;
    p.dfp.gradients.granularity = dy;
    for (const std::string& line : precision_notes(p, test::ctx2()))
      if (line.rfind("int16: shared exponents ", 0) == 0) return line.substr(24);
    return std::string("(no exponents note)");
  };
  const Granularity t = Granularity::tensor, s = Granularity::slice;
  EXPECT_EQ(note(t, t, t), "w per tensor, x per tensor, dy per tensor");
  EXPECT_EQ(note(s, t, t), "w per output channel (forward) and per input channel (backward-data), x per tensor, "
                           "dy per tensor");
  EXPECT_EQ(note(t, s, s), "w per tensor, x per image (forward), dy per image (backward-data); in the weight "
                           "gradient x per image pair and 16-channel block, dy per image pair and 16-channel block "
                           "(fully connected layers: per 16-channel block over the batch)");
  EXPECT_EQ(note(t, s, t), "w per tensor, x per image (forward), dy per tensor; in the weight gradient x per image "
                           "pair and 16-channel block, dy per tensor (fully connected layers: per 16-channel block "
                           "over the batch)");
}
