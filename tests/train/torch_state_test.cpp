// PyTorch state_dicts into and out of dfp's models (dfp/torch_state.hpp): the name tables, the
// round trip through a file, strict errors that list every mismatch, skip patterns and the
// classifier rule, dfp state files and checkpoints as sources, export from a checkpoint, and
// `--init-from` in the trainer. With /usr/bin/python3 and torch (skipped without): a torchvision
// ResNet-18's logits in dfp, and dfp's file loaded by torchvision with strict=True and back.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/models.hpp"
#include "dfp/optim.hpp"
#include "dfp/state.hpp"
#include "dfp/torch_state.hpp"
#include "dfp/trainer.hpp"
#include "src/io/checkpoint.hpp"
#include "src/io/torch_file.hpp"
#include "tests/common/expect_error.hpp"
#include "tests/common/model_helpers.hpp"
#include "tests/common/python_torch.hpp"
#include "tests/common/temp_dir.hpp"

namespace dfp {
namespace {

using test::batch_images;
using test::ctx2;

PrecisionPolicy fp32() { return PrecisionPolicy{}; }

// Every kind of tensor: conv with bias, a 24-channel BatchNorm (its padding lanes out of view),
// a grouped conv, Linear.
std::unique_ptr<Model> small_net(const Context& ctx, int classes = 10, const std::string& name = "small") {
  auto m = std::make_unique<Model>(ctx, name);
  auto x = m->input(3, 8, 8);
  x = m->relu(m->batchnorm(m->conv(x, 24, 3, 1, 1, true, "conv1"), "bn1"), "relu1");
  x = m->relu(m->conv(x, 32, 3, 2, 1, false, "conv2", 4), "relu2");
  m->softmax_cross_entropy(m->linear(m->global_avgpool(x, "gap"), classes, true, "fc"));
  m->build(4, fp32());
  return m;
}

// A trained step, so that the running statistics are the model's own.
void train_step(Model& m, const Context& ctx) {
  const std::vector<float> x = batch_images(m, 5);
  std::vector<int32_t> y(size_t(m.batch()));
  for (size_t i = 0; i < y.size(); ++i) y[i] = int32_t(i * 3 % 5);
  Sgd sgd(ctx, m, {0.9f, 0.f, false});
  m.forward(x.data(), y.data(), m.batch(), true);
  m.backward();
  sgd.step(0.1f);
}

std::map<std::string, std::vector<float>> values_of(Model& m) {
  std::map<std::string, std::vector<float>> out;
  for (const TensorView& v : m.state()) out[v.name] = std::vector<float>(v.data, v.data + v.size);
  return out;
}

std::map<std::string, std::vector<float>> file_values(const std::string& path) {
  const auto f = torch_format::TorchFile::open(path);
  std::map<std::string, std::vector<float>> out;
  for (const auto& t : f.tensors()) {
    out[t.name].resize(t.numel);
    f.read(t, out[t.name].data());
  }
  return out;
}

// The model's state as torch file tensors, changed by `edit` (name -> shape, values).
std::string write_edited(Model& m, const std::string& path,
                         const std::function<void(std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>&)>& edit) {
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> t;
  for (const TensorView& v : m.state())
    t[v.name] = {std::vector<int64_t>(v.shape.begin(), v.shape.end()), std::vector<float>(v.data, v.data + v.size)};
  edit(t);
  std::vector<torch_format::OutTensor> out;
  for (const auto& [name, sv] : t) out.push_back({name, sv.first, sv.second.data(), 0});
  const std::string bytes = torch_format::torch_file_bytes(out);
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  return path;
}

TEST(TorchState, NameTables) {
  EXPECT_EQ(torch_name("resnet50", "layer1.0.downsample.1.running_var"), "layer1.0.downsample.1.running_var");
  EXPECT_EQ(torch_name("resnext50c", "fc.weight"), "fc.weight");
  // vgg11_bn: features = conv 0, bn 1, relu 2, pool 3, conv 4, bn 5, relu 6, pool 7, conv 8, bn 9, ...
  EXPECT_EQ(torch_name("vgg11bn", "features.0.weight"), "features.0.weight");
  EXPECT_EQ(torch_name("vgg11bn", "features.1.bn.running_mean"), "features.5.running_mean");
  EXPECT_EQ(torch_name("vgg11bn", "features.3.weight"), "features.11.weight");
  EXPECT_EQ(torch_name("vgg11bn", "features.7.bn.bias"), "features.26.bias");
  EXPECT_EQ(torch_name("vgg11", "features.7.bias"), "features.18.bias");
  EXPECT_EQ(torch_name("vgg19", "features.15.weight"), "features.34.weight");
  EXPECT_EQ(torch_name("vgg16", "fc.weight"), "classifier.6.weight");
  EXPECT_EQ(torch_name("vgg16", "classifier.3.bias"), "classifier.3.bias");
  EXPECT_EQ(torch_name("googlenet", "inception3a.branch2.1.weight"), "inception3a.branch2.1.conv.weight");
  EXPECT_EQ(torch_name("googlenet", "conv1.bn.running_var"), "conv1.bn.running_var");
  EXPECT_EQ(torch_name("googlenet", "fc.weight"), "fc.weight");
  EXPECT_EQ(torch_name("alexnet_tv", "fc.bias"), "classifier.6.bias");
  EXPECT_EQ(torch_name("alexnet_tv", "features.10.weight"), "features.10.weight");
  EXPECT_EQ(torch_name("lenet", "fc.weight"), "fc.weight");
}

// Saved, a model's weights load into another model bit for bit; BatchNorm's num_batches_tracked
// is written (the step count) and ignored on loading.
TEST(TorchState, RoundTripThroughAFile) {
  const test::TempDir dir("dfp_torch_state_");
  Context other(ContextOptions{.threads = 2, .seed = 9});
  auto a = small_net(ctx2());
  train_step(*a, ctx2());
  auto b = small_net(other);
  ASSERT_NE(values_of(*a), values_of(*b));
  save_torch_state_dict(*a, dir.file("a.pt"));
  const auto file = file_values(dir.file("a.pt"));
  EXPECT_EQ(file.at("bn1.num_batches_tracked"), std::vector<float>{1.f});
  EXPECT_EQ(file.at("bn1.weight").size(), 24u);
  const WeightsReport r = load_torch_state_dict(*b, dir.file("a.pt"));
  EXPECT_EQ(values_of(*b), values_of(*a));
  EXPECT_EQ(r.loaded.size(), a->state().size());
  EXPECT_EQ(r.ignored, std::vector<std::string>{"bn1.num_batches_tracked"});
  EXPECT_TRUE(r.missing.empty() && r.unexpected.empty() && r.mismatched.empty() && r.skipped.empty());
  const std::vector<float> x = batch_images(*a, 7);
  std::vector<float> pa(40), pb(40);
  a->predict(x.data(), 4, pa.data());
  b->predict(x.data(), 4, pb.data());
  EXPECT_EQ(pa, pb);  // the weights reached the computation (weights_updated)
  EXPECT_EQ(r.lines().front(), "loaded 9 tensors from '" + dir.file("a.pt") + "' (a torch state_dict)");
}

// Strict: one error lists every missing, unexpected and differently shaped tensor, and the model
// keeps its values. strict=false loads the others and reports them.
TEST(TorchState, StrictErrorsListEveryMismatchAndChangeNothing) {
  const test::TempDir dir("dfp_torch_state_");
  auto a = small_net(ctx2());
  Context other(ContextOptions{.threads = 2, .seed = 9});
  auto b = small_net(other);
  const std::string path = write_edited(*a, dir.file("edited.pt"), [](auto& t) {
    t.erase("bn1.running_var");
    t["extra.weight"] = {{2}, {1.f, 2.f}};
    t["fc.weight"] = {{5, 32}, std::vector<float>(160, 0.5f)};
  });
  const auto before = values_of(*b);
  test::expect_error([&] { load_torch_state_dict(*b, path); }, Status::invalid_argument,
                     {"edited.pt", "model 'small'", "missing from the file: bn1.running_var",
                      "in the file but not in the model: extra.weight", "fc.weight: file 5x32, model 10x32"});
  EXPECT_EQ(values_of(*b), before);
  WeightsOptions lenient;
  lenient.strict = false;
  const WeightsReport r = load_torch_state_dict(*b, path, lenient);
  EXPECT_EQ(r.missing, std::vector<std::string>{"bn1.running_var"});
  EXPECT_EQ(r.unexpected, std::vector<std::string>{"extra.weight"});
  EXPECT_EQ(r.mismatched, std::vector<std::string>{"fc.weight: file 5x32, model 10x32"});
  const auto after = values_of(*b), want = values_of(*a);
  EXPECT_EQ(after.at("bn1.running_var"), before.at("bn1.running_var"));
  EXPECT_EQ(after.at("fc.weight"), before.at("fc.weight"));
  EXPECT_EQ(after.at("conv1.weight"), want.at("conv1.weight"));
  EXPECT_EQ(after.at("fc.bias"), want.at("fc.bias"));
}

// Fine-tuning to other classes: the classifier of another shape keeps its initial values when
// asked; skip patterns leave tensors or layers out on both sides.
TEST(TorchState, ClassifierRuleAndSkipPatterns) {
  const test::TempDir dir("dfp_torch_state_");
  auto five = small_net(ctx2(), 5);
  save_torch_state_dict(*five, dir.file("five.pt"));
  Context other(ContextOptions{.threads = 2, .seed = 9});
  auto ten = small_net(other, 10);
  const auto before = values_of(*ten);
  test::expect_error([&] { load_torch_state_dict(*ten, dir.file("five.pt")); }, Status::invalid_argument,
                     {"fc.weight: file 5x32, model 10x32", "fc.bias: file 5, model 10"});
  WeightsOptions o;
  o.skip_mismatched_classifier = true;
  WeightsReport r = load_torch_state_dict(*ten, dir.file("five.pt"), o);
  ASSERT_EQ(r.skipped.size(), 2u);
  EXPECT_EQ(r.skipped[0], "fc.weight: file 5x32, model 10x32 (the classifier: keeps its initial values)");
  EXPECT_EQ(values_of(*ten).at("fc.weight"), before.at("fc.weight"));
  EXPECT_EQ(values_of(*ten).at("conv2.weight"), values_of(*five).at("conv2.weight"));
  // Any other layer of another shape is still an error.
  const std::string wide = write_edited(*five, dir.file("wide.pt"), [](auto& t) {
    t["conv2.weight"] = {{32, 8, 3, 3}, std::vector<float>(32 * 8 * 9)};
  });
  test::expect_error([&] { load_torch_state_dict(*ten, wide, o); }, Status::invalid_argument,
                     {"conv2.weight: file 32x8x3x3, model 32x6x3x3"});
  WeightsOptions skip;
  skip.skip = {"fc", "conv2*"};
  r = load_torch_state_dict(*ten, wide, skip);
  EXPECT_EQ(r.skipped.size(), 3u);  // fc.weight, fc.bias, conv2.weight
  EXPECT_EQ(r.loaded.size(), 6u);
  EXPECT_TRUE(r.unexpected.empty());
}

// dfp's own files are sources too (load_weights tells them by their first bytes): a state file,
// and a training checkpoint, whose optimizer state is not the model's. export_torch_state_dict
// writes a state file's tensors with torchvision's names.
TEST(TorchState, DfpFilesLoadAndExport) {
  const test::TempDir dir("dfp_torch_state_");
  auto a = small_net(ctx2());
  train_step(*a, ctx2());
  save_state(*a, dir.file("a.dfp"));
  Checkpoint ck = read_checkpoint(dir.file("a.dfp"));
  ck.tensors["fc.weight@momentum"] = std::vector<float>(320, 1.f);
  ck.meta["step"] = "12";
  write_checkpoint(dir.file("ck.dfp"), ck);
  for (const char* file : {"a.dfp", "ck.dfp"}) {
    Context other(ContextOptions{.threads = 2, .seed = 9});
    auto b = small_net(other);
    const WeightsReport r = load_weights(*b, dir.file(file));
    EXPECT_EQ(r.format, "dfp");
    EXPECT_EQ(values_of(*b), values_of(*a)) << file;
  }
  export_torch_state_dict(dir.file("ck.dfp"), dir.file("ck.pt"));
  auto exported = file_values(dir.file("ck.pt"));
  EXPECT_EQ(exported.at("bn1.num_batches_tracked"), std::vector<float>{12.f});
  exported.erase("bn1.num_batches_tracked");
  EXPECT_EQ(exported, values_of(*a));
  save_torch_state_dict(*a, dir.file("a.pt"));
  Context other(ContextOptions{.threads = 2, .seed = 9});
  auto b = small_net(other);
  EXPECT_EQ(load_weights(*b, dir.file("a.pt")).format, "torch");
  // A checkpoint without shapes, or without its model's name, cannot be exported.
  ck.meta.erase("state_version");
  write_checkpoint(dir.file("old.dfp"), ck);
  test::expect_error([&] { export_torch_state_dict(dir.file("old.dfp"), dir.file("x.pt")); }, Status::unsupported,
                     {"old.dfp", "state_version"});
  test::expect_error([&] { load_torch_state_dict(*b, dir.file("absent.pt")); }, Status::io_error, {"absent.pt"});
  test::expect_error([&] { load_weights(*b, dir.file("absent.pt")); }, Status::io_error, {"absent.pt"});
  std::ofstream(dir.file("notes.txt")) << "some text";
  test::expect_error([&] { load_weights(*b, dir.file("notes.txt")); }, Status::corrupt_data,
                     {"notes.txt", "neither a torch.save file", "nor a dfp state file"});
  Model unbuilt(ctx2(), "small");
  test::expect_error([&] { load_torch_state_dict(unbuilt, dir.file("a.pt")); }, Status::invalid_argument,
                     {"not built"});
}

// Weights that are not finite are refused when loaded, naming the file, the tensor (the file's
// name and the model's) and the index of the first NaN or Inf; the model keeps its values. A
// weights file that cannot be opened, or is no file, is named as a weights file, not a checkpoint.
TEST(TorchState, NonFiniteWeightsAreRefusedAtLoad) {
  const test::TempDir dir("dfp_torch_state_");
  auto a = small_net(ctx2());
  const std::string nan_pt = write_edited(*a, dir.file("nan.pt"), [](auto& t) {
    t["conv2.weight"].second[5] = std::nanf("");
    t["conv2.weight"].second[9] = INFINITY;
  });
  Context other(ContextOptions{.threads = 2, .seed = 9});
  auto b = small_net(other);
  const auto before = values_of(*b);
  for (const bool strict : {true, false}) {
    WeightsOptions o;
    o.strict = strict;
    test::expect_error([&] { load_torch_state_dict(*b, nan_pt, o); }, Status::numerical_error,
                       {"torch file '" + nan_pt + "': tensor 'conv2.weight' holds NaN at index 5 (its first non-finite "
                        "value, of 1728); expected finite weights"});
    test::expect_error([&] { load_weights(*b, nan_pt, o); }, Status::numerical_error, {"nan.pt", "NaN at index 5"});
  }
  EXPECT_EQ(values_of(*b), before);
  save_state(*a, dir.file("inf.dfp"));
  Checkpoint ck = read_checkpoint(dir.file("inf.dfp"));
  ck.tensors.at("bn1.running_var")[2] = INFINITY;
  write_checkpoint(dir.file("inf.dfp"), ck);
  test::expect_error([&] { load_weights(*b, dir.file("inf.dfp")); }, Status::numerical_error,
                     {"dfp checkpoint '" + dir.file("inf.dfp") + "': tensor 'bn1.running_var' holds +Inf at index 2"});
  // A file skipped by pattern is not read, so its values do not matter.
  WeightsOptions skip;
  skip.skip = {"conv2"};
  EXPECT_NO_THROW(load_torch_state_dict(*b, nan_pt, skip));
  test::expect_error([&] { load_weights(*b, dir.file("absent.pt")); }, Status::io_error,
                     {"weights file '" + dir.file("absent.pt") + "': cannot open", "expected a torch.save state_dict"});
  test::expect_error([&] { load_weights(*b, dir.str()); }, Status::io_error, {"weights file '", "is a directory"});
  test::expect_error([&] { load_weights(*b, "/dev/zero"); }, Status::io_error,
                     {"weights file '/dev/zero': not a regular file"});
}

// A torchvision ResNet-18 (random init, seeded, running statistics from two training batches) in
// dfp's resnet18 gives torchvision's FP32 logits within 1e-4 of their largest; dfp's weights after
// a training step load into torchvision with strict=True, give dfp's logits there, and come back
// through torch.save bit for bit.
TEST(TorchState, TorchvisionResNet18BothWays) {
  if (!test::torch_python_missing().empty()) GTEST_SKIP() << test::torch_python_missing();
  const test::TempDir dir("dfp_torch_state_");
  ASSERT_TRUE(test::run_torch_python(dir.str(), "export", R"(
import sys, torchvision
d = sys.argv[1]
torch.manual_seed(0)
m = torchvision.models.resnet18(num_classes=10)
m.train()
with torch.no_grad():
    for _ in range(2):
        m(torch.randn(8, 3, 32, 32))
m.eval()
torch.save(m.state_dict(), f'{d}/tv.pt')
x = torch.randn(4, 3, 32, 32)
x.numpy().tofile(f'{d}/x.bin')
with torch.no_grad():
    m(x).numpy().tofile(f'{d}/logits.bin')
)"));
  auto read_floats = [&](const std::string& name, size_t n) {
    std::vector<float> v(n);
    std::ifstream(dir.file(name), std::ios::binary).read(reinterpret_cast<char*>(v.data()), std::streamsize(n * 4));
    return v;
  };
  const std::vector<float> x_nchw = read_floats("x.bin", 4 * 3 * 32 * 32), want = read_floats("logits.bin", 40);
  Model m(ctx2(), "resnet18");
  build_model(m, "resnet18", 3, 32, 32, 10);
  m.build(4, fp32());
  const WeightsReport r = load_torch_state_dict(m, dir.file("tv.pt"));
  EXPECT_EQ(r.loaded.size(), m.state().size());
  EXPECT_EQ(r.ignored.size(), 20u);  // num_batches_tracked of the 20 BatchNorms
  std::vector<float> x(blocked_size(4, 3, 32, 32)), got(40);
  to_blocked(x_nchw.data(), x.data(), 4, 3, 32, 32);
  auto close = [](const std::vector<float>& a, const std::vector<float>& b) {
    float top = 0, err = 0;
    for (size_t i = 0; i < a.size(); ++i) top = std::max(top, std::fabs(b[i])), err = std::max(err, std::fabs(a[i] - b[i]));
    return err <= 1e-4f * top;
  };
  m.predict(x.data(), 4, got.data());
  EXPECT_TRUE(close(got, want));

  train_step(m, ctx2());
  m.predict(x.data(), 4, got.data());
  save_torch_state_dict(m, dir.file("dfp.pt"));
  ASSERT_TRUE(test::run_torch_python(dir.str(), "import", R"(
import sys, numpy, torchvision
d = sys.argv[1]
m = torchvision.models.resnet18(num_classes=10)
print(m.load_state_dict(torch.load(f'{d}/dfp.pt'), strict=True))
m.eval()
x = torch.from_numpy(numpy.fromfile(f'{d}/x.bin', dtype=numpy.float32).reshape(4, 3, 32, 32))
with torch.no_grad():
    m(x).numpy().tofile(f'{d}/logits2.bin')
torch.save(m.state_dict(), f'{d}/back.pt')
)"));
  EXPECT_TRUE(close(got, read_floats("logits2.bin", 40)));
  Model back(ctx2(), "resnet18");
  build_model(back, "resnet18", 3, 32, 32, 10);
  back.build(4, fp32());
  load_torch_state_dict(back, dir.file("back.pt"));
  EXPECT_EQ(values_of(back), values_of(m));
}

// --init-from: a LeNet of 5 classes starts a 10-class run on Fashion-MNIST; its classifier keeps
// its initial values (said in the log), the rest is loaded; another layer of another shape is
// refused before anything is written, unless --init-skip names it.
// A first convolution made for other input channels: refused by a strict load with what to do,
// adapted on request as timm's adapt_input_conv does (summed for one channel, else the file's
// channels repeated and scaled by file / model channels); no other layer is adapted.
TEST(TorchState, FirstConvolutionAdaptsToTheInputChannels) {
  const test::TempDir dir("dfp_torch_state_");
  Model rgb(ctx2(), "lenet");
  build_model(rgb, "lenet", 3, 28, 28, 10);
  rgb.build(4, fp32());
  save_torch_state_dict(rgb, dir.file("rgb.pt"));
  const std::vector<TensorView> rgb_state = rgb.state();
  const TensorView w3 = *std::find_if(rgb_state.begin(), rgb_state.end(), [](auto& v) { return v.name == "conv1.weight"; });
  const std::vector<float> file(w3.data, w3.data + w3.size);  // [6][3][5][5]
  for (int channels : {1, 2, 4}) {
    SCOPED_TRACE(channels);
    Model m(ctx2(), "lenet");
    build_model(m, "lenet", channels, 28, 28, 10);
    m.build(4, fp32());
    test::expect_error([&] { load_torch_state_dict(m, dir.file("rgb.pt")); }, Status::invalid_argument,
                       {"conv1.weight: file 6x3x5x5", "the first convolution 'conv1' reads another number of input "
                        "channels", "--init-skip conv1"});
    WeightsOptions o;
    o.adapt_input_channels = true;
    const WeightsReport r = load_torch_state_dict(m, dir.file("rgb.pt"), o);
    ASSERT_EQ(r.adapted.size(), 1u);
    EXPECT_EQ(r.adapted[0].rfind("conv1.weight: file 6x3x5x5, model 6x" + std::to_string(channels) + "x5x5", 0), 0u)
        << r.adapted[0];
    EXPECT_TRUE(r.mismatched.empty());
    std::vector<TensorView> state = m.state();
    const TensorView w = *std::find_if(state.begin(), state.end(), [](auto& v) { return v.name == "conv1.weight"; });
    for (int k = 0; k < 6; ++k)
      for (int c = 0; c < channels; ++c)
        for (int j = 0; j < 25; ++j) {
          float want = 0;
          if (channels == 1)
            for (int f = 0; f < 3; ++f) want += file[size_t((k * 3 + f) * 25 + j)];
          else
            want = file[size_t((k * 3 + c % 3) * 25 + j)] * (3.f / float(channels));
          ASSERT_EQ(w.data[(k * channels + c) * 25 + j], want) << k << " " << c << " " << j;
        }
  }
  // Only the first convolution: a file whose conv2 differs still fails on it.
  Model narrow(ctx2(), "m");
  auto x = narrow.input(3, 8, 8);
  narrow.softmax_cross_entropy(narrow.linear(narrow.flatten(narrow.conv(narrow.conv(x, 4, 3, 1, 1, false, "conv1"), 4, 3, 1, 1, false, "conv2")), 10, true, "fc"));
  narrow.build(2, fp32());
  save_torch_state_dict(narrow, dir.file("narrow.pt"));
  Model other(ctx2(), "m");
  auto y = other.input(3, 8, 8);
  other.softmax_cross_entropy(other.linear(other.flatten(other.conv(other.conv(y, 8, 3, 1, 1, false, "conv1"), 4, 3, 1, 1, false, "conv2")), 10, true, "fc"));
  other.build(2, fp32());
  WeightsOptions o;
  o.adapt_input_channels = true;
  test::expect_error([&] { load_torch_state_dict(other, dir.file("narrow.pt"), o); }, Status::invalid_argument,
                     {"conv1.weight: file 4x3x3x3, model 8x3x3x3", "conv2.weight: file 4x4x3x3, model 4x8x3x3"});
}

TEST(TorchState, InitFromFineTunes) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const test::TempDir dir("dfp_torch_state_");
  Model five(ctx2(), "lenet");
  build_model(five, "lenet", 1, 28, 28, 5);
  five.build(8, fp32());
  save_torch_state_dict(five, dir.file("five.pt"));
  TrainConfig c;
  c.model = "lenet";
  c.epochs = 1;
  c.batch_size = 32;
  c.limit_train = 64;
  c.limit_test = 32;
  c.threads = 2;
  c.init_from = dir.file("five.pt");
  c.out = dir.file("run");
  std::string log;
  train(c, [&](const std::string& s) { log += s + "\n"; });
  EXPECT_NE(log.find("init: loaded 8 tensors from '" + dir.file("five.pt") + "'"), std::string::npos) << log;
  EXPECT_NE(log.find("fc.weight: file 5x84, model 10x84 (the classifier: keeps its initial values)"), std::string::npos)
      << log;
  Model wide(ctx2(), "lenet");
  build_model(wide, "lenet", 3, 28, 28, 10);  // conv1 takes 3 channels
  wide.build(8, fp32());
  save_torch_state_dict(wide, dir.file("rgb.pt"));
  // RGB weights into a one-channel model: the first convolution is adapted (summed over the
  // file's channels, as timm's adapt_input_conv), and the log says so.
  c.init_from = dir.file("rgb.pt");
  c.out = dir.file("adapted");
  log.clear();
  train(c, [&](const std::string& s) { log += s + "\n"; });
  EXPECT_NE(log.find("init: loaded 10 tensors"), std::string::npos) << log;
  EXPECT_NE(log.find("adapted to the model's input channels (1): conv1.weight: file 6x3x5x5, model 6x1x5x5 "
                     "(summed over the file's 3 input channels)"),
            std::string::npos)
      << log;
  c.out = dir.file("skipped");
  c.init_skip = {"conv1"};
  log.clear();
  train(c, [&](const std::string& s) { log += s + "\n"; });
  EXPECT_NE(log.find("init: loaded 8 tensors"), std::string::npos) << log;
  EXPECT_NE(log.find("conv1.weight (skip pattern)"), std::string::npos) << log;
}

}  // namespace
}  // namespace dfp
