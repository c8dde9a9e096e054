// The trainer: the thread-count rule, Fashion-MNIST training, bit-identical resume and corrupt
// checkpoints, what a run writes (config, metrics, profile), out-of-range settings.
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
#include "src/io/checkpoint.hpp"
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

namespace {
bool have_fashion_mnist() { return std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"); }
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

// Delayed FP8 scaling's amax histories are training state: the checkpoint keeps them (a history of
// 4 wraps within an epoch), so a resumed run is the uninterrupted one bit for bit; a history that is
// not a layer's or holds a NaN is refused by name.
TEST(Training, Fp8DelayedScalingResumesBitIdentically) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  TrainConfig c = lenet_config(Precision::fp8, 3, 32, 320, 64);
  c.policy.fp8.amax_history = 4;
  const test::TempDir ta("dfp_test_a_"), tb("dfp_test_b_");
  const std::string a = ta.str(), b = tb.str();
  c.out = a;
  train(c, nullptr);
  c.out = b;
  c.stop_after = 2;
  train(c, nullptr);
  Checkpoint ck = read_checkpoint(b + "/checkpoint.dfp");
  ASSERT_EQ(ck.tensors.count("conv1.activations@fp8_amax_history"), 1u);
  EXPECT_EQ(ck.tensors.at("conv1.gradients@fp8_amax_history").size(), 4u);
  c.stop_after = 0;
  c.resume = b + "/checkpoint.dfp";
  train(c, nullptr);
  const Checkpoint whole = read_checkpoint(a + "/checkpoint.dfp"), resumed = read_checkpoint(b + "/checkpoint.dfp");
  EXPECT_EQ(whole.meta, resumed.meta);
  for (const auto& [name, values] : whole.tensors)
    EXPECT_TRUE(resumed.tensors.count(name) && resumed.tensors.at(name) == values) << name << " differs";
  EXPECT_TRUE(slurp(a + "/checkpoint.dfp") == slurp(b + "/checkpoint.dfp"));

  const std::string bad = a + "/bad.dfp";
  c.out = a;
  c.resume = bad;
  Checkpoint nan = ck;
  nan.tensors.at("conv1.weights@fp8_amax_history")[0] = std::numeric_limits<float>::quiet_NaN();
  write_checkpoint(bad, nan);
  test::expect_error([&] { train(c, nullptr); }, Status::corrupt_data,
                     {"bad.dfp", "FP8 amax history 'conv1.weights'", "nan", "expected finite values >= 0"});
  Checkpoint stray = ck;
  stray.tensors["conv9.weights@fp8_amax_history"] = {1.f};
  write_checkpoint(bad, stray);
  test::expect_error([&] { train(c, nullptr); }, Status::corrupt_data,
                     {"bad.dfp", "FP8 amax history 'conv9.weights'", "belongs to no layer"});
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
// progress comes to the log as plain lines. --label-smoothing reaches the loss.
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
  EXPECT_EQ(log.find("] 3/10 loss"), std::string::npos) << log;  // every 4th step only
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
// A progress callback sees every step of every epoch, in order, with the epoch's running means;
// the log then gets no progress lines (the caller draws them), and progress_text is the line the
// log gets otherwise.
TEST(Training, StepCallbackSeesEveryStepAndTakesOverTheProgressLines) {
  TrainConfig c;
  c.model = "lenet";
  c.dataset = "synthetic";
  c.epochs = 2;
  c.batch_size = 16;
  c.limit_train = 80;
  c.limit_test = 32;
  c.threads = 1;
  c.print_every = 1;
  std::vector<StepProgress> seen;
  std::string log;
  TrainCallbacks hooks;
  hooks.log = [&](const std::string& s) { log += s + "\n"; };
  hooks.on_step = [&](const StepProgress& p) { seen.push_back(p); };
  const auto epochs = train(c, hooks);
  ASSERT_EQ(epochs.size(), 2u);
  ASSERT_EQ(seen.size(), 10u);
  for (size_t k = 0; k < seen.size(); ++k) {
    const StepProgress& p = seen[k];
    EXPECT_EQ(p.epoch, int(k / 5) + 1);
    EXPECT_EQ(p.epochs, 2);
    EXPECT_EQ(p.step, int(k % 5) + 1);
    EXPECT_EQ(p.steps, 5);
    EXPECT_TRUE(std::isfinite(p.loss) && p.loss > 0) << p.loss;
    EXPECT_GE(p.top1, 0);
    EXPECT_LE(p.top1, 100);
    EXPECT_GT(p.images_per_second, 0);
    EXPECT_EQ(p.loss_scale, 0);  // no loss scaling
    EXPECT_FALSE(p.part_of_job);
  }
  // The last step's running means are the epoch's.
  EXPECT_NEAR(seen[4].loss, epochs[0].train_loss, 1e-9);
  EXPECT_NEAR(seen[9].top1, epochs[1].train_top1, 1e-9);
  EXPECT_EQ(log.find("] 1/5 loss"), std::string::npos) << log;
  EXPECT_NE(log.find("epoch 2/2 done"), std::string::npos) << log;
  StepProgress p = seen[2];
  p.loss = 0.5, p.top1 = 81.25, p.images_per_second = 790, p.eta_seconds = 4, p.loss_scale = 1024;
  EXPECT_EQ(progress_text(p), "epoch 1/2 [==============          ] 3/5 loss 0.5000 top1 81.25% 790 img/s eta 4s scale 1024");
  // Without a callback, the same lines reach the log every print_every steps.
  log.clear();
  c.epochs = 1;
  c.print_every = 2;
  train(c, [&](const std::string& s) { log += s + "\n"; });
  EXPECT_NE(log.find("] 2/5 loss"), std::string::npos) << log;
  EXPECT_NE(log.find("] 5/5 loss"), std::string::npos) << log;  // the epoch's last step
  EXPECT_EQ(log.find("] 3/5 loss"), std::string::npos) << log;
}

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
