// The synthetic dataset (random images for measuring speed where no dataset is on disk): its
// shape, its determinism, its spec's errors, and a training run on it.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <string>
#include <unistd.h>

#include "dfp/data.hpp"
#include "dfp/status.hpp"
#include "dfp/trainer.hpp"
#include "tests/common/expect_error.hpp"

using namespace dfp;

TEST(Synthetic, ShapeCountsAndLabelsFollowTheSpec) {
  const Dataset tr = load_dataset("synthetic", "classes=7,train=300,test=50", true, 20);
  EXPECT_EQ(tr.name, "synthetic");
  EXPECT_EQ(tr.count, 300);
  EXPECT_EQ(tr.channels, 3);
  EXPECT_EQ(tr.height, 20);
  EXPECT_EQ(tr.width, 20);
  EXPECT_EQ(tr.classes, 7);
  ASSERT_EQ(tr.pixels.size(), size_t(300) * 3 * 20 * 20);
  std::set<int> seen;
  for (int i = 0; i < tr.count; ++i) {
    ASSERT_LT(tr.label(i), 7);
    seen.insert(tr.label(i));
  }
  EXPECT_EQ(seen.size(), 7u);  // 300 uniform draws miss a class with probability ~1e-19
  std::set<uint8_t> values(tr.pixels.begin(), tr.pixels.end());
  EXPECT_EQ(values.size(), 256u);
  const Dataset te = load_dataset("synthetic", "test=50,classes=7", false, 20);
  EXPECT_EQ(te.count, 50);
  EXPECT_NO_THROW(check_same_geometry(tr, te));
}

TEST(Synthetic, DefaultsAndDeterminism) {
  const Dataset a = load_dataset("synthetic", "", true, 0);
  EXPECT_EQ(a.count, 1024);
  EXPECT_EQ(a.height, 32);
  EXPECT_EQ(a.classes, 10);
  const Dataset b = make_synthetic(SyntheticSpec{}, true, 32);
  EXPECT_EQ(a.pixels, b.pixels);
  EXPECT_EQ(a.labels, b.labels);
  const Dataset t = load_dataset("synthetic", "", false, 0);
  EXPECT_EQ(t.count, 256);
  EXPECT_FALSE(std::equal(t.pixels.begin(), t.pixels.end(), a.pixels.begin()));  // the splits differ
}

TEST(Synthetic, BadSpecsNameTheItem) {
  using test::expect_error;
  expect_error([] { load_dataset("synthetic", "classes=0", true, 8); }, Status::invalid_argument,
               {"synthetic", "classes 0", "[1, 256]"});
  expect_error([] { load_dataset("synthetic", "classes=1000", true, 8); }, Status::invalid_argument,
               {"classes 1000", "[1, 256]"});
  expect_error([] { load_dataset("synthetic", "images=5", true, 8); }, Status::invalid_argument,
               {"'images=5'", "classes=K, train=N or test=M"});
  expect_error([] { load_dataset("synthetic", "train=12x", true, 8); }, Status::invalid_argument,
               {"train", "'12x'", "whole number"});
  expect_error([] { load_dataset("synthetic", "train=0", true, 8); }, Status::invalid_argument,
               {"train=0", "at least 1"});
  expect_error([] { load_dataset("synthetic", "train=999999999", true, 4096); }, Status::invalid_argument,
               {"16 GiB"});
}

// The trainer reads it like any dataset: a short run finishes with metrics and a checkpoint.
TEST(Synthetic, TrainsEndToEnd) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("dfp_test_synthetic_" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  TrainConfig c;
  c.model = "resnet20";
  c.dataset = "synthetic";
  c.data = "classes=10,train=128,test=64";
  c.image_size = 16;
  c.epochs = 1;
  c.batch_size = 32;
  c.threads = 2;
  c.out = dir;
  const auto metrics = train(c, nullptr);
  ASSERT_EQ(metrics.size(), 1u);
  EXPECT_TRUE(std::isfinite(metrics[0].train_loss));
  EXPECT_TRUE(std::filesystem::exists(dir + "/checkpoint.dfp"));
  EXPECT_GT(metrics[0].images_per_second, 0.0);
  std::filesystem::remove_all(dir);
}
