// Loader::set_shard, the data of a data-parallel job: each rank's part of every batch, for 2 and
// 3 ranks, is its slice of the batch a lone loader returns (so the parts of an epoch are disjoint
// and cover it, and the global order does not depend on the number of ranks).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "dfp/data.hpp"
#include "dfp/status.hpp"

namespace {

using namespace dfp;

struct Epoch {
  std::vector<std::vector<float>> images;  // per batch
  std::vector<std::vector<int32_t>> labels;
  std::vector<int> sizes;
};

Epoch read_epoch(Loader& l, int epoch, size_t image_floats) {
  Epoch e;
  l.start_epoch(epoch);
  Batch b;
  while (l.next(b)) {
    e.images.emplace_back(b.images, b.images + size_t(b.size) * image_floats);
    e.labels.emplace_back(b.labels, b.labels + b.size);
    e.sizes.push_back(b.size);
  }
  return e;
}

TEST(Shard, PartsOfEachBatchAreSlicesOfTheLoneLoadersBatch) {
  Context ctx(ContextOptions{.threads = 1, .isa = "ref"});
  const Dataset d = make_synthetic(SyntheticSpec{10, 70, 10}, true, 8);
  const size_t image_floats = blocked_size(1, d.channels, d.height, d.width);
  AugmentOptions aug;
  aug.pad = 2;
  aug.hflip = true;
  for (const bool drop_last : {true, false}) {
    Loader lone(ctx, d, 12, true, drop_last, aug, 9);
    const Epoch whole = read_epoch(lone, 1, image_floats);
    for (int parts : {2, 3}) {
      std::vector<Epoch> ranks;
      for (int r = 0; r < parts; ++r) {
        Loader l(ctx, d, 12, true, drop_last, aug, 9);
        l.set_shard(r, parts);
        EXPECT_EQ(l.batch_size(), 12 / parts);
        EXPECT_EQ(l.batches_per_epoch(), lone.batches_per_epoch());
        ranks.push_back(read_epoch(l, 1, image_floats));
      }
      for (size_t b = 0; b < whole.sizes.size(); ++b) {
        std::vector<float> images;
        std::vector<int32_t> labels;
        for (const Epoch& e : ranks) {
          ASSERT_EQ(e.sizes.size(), whole.sizes.size());
          images.insert(images.end(), e.images[b].begin(), e.images[b].end());
          labels.insert(labels.end(), e.labels[b].begin(), e.labels[b].end());
        }
        EXPECT_EQ(labels, whole.labels[b]) << "batch " << b << ", " << parts << " parts";
        EXPECT_TRUE(images == whole.images[b]) << "batch " << b << ", " << parts << " parts";
      }
      if (!drop_last) {  // 70 = 5 * 12 + 10: the last batch's parts are 6+4 (2 parts) or 4+4+2 (3)
        EXPECT_EQ(ranks[parts - 1].sizes.back(), parts == 2 ? 4 : 2);
      }
    }
  }
}

TEST(Shard, RefusesABatchThatDoesNotDivide) {
  Context ctx(ContextOptions{.threads = 1, .isa = "ref"});
  const Dataset d = make_synthetic(SyntheticSpec{10, 40, 10}, true, 8);
  Loader l(ctx, d, 10, true, true, AugmentOptions{}, 1);
  try {
    l.set_shard(0, 3);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a multiple of 3"), std::string::npos) << e.what();
  }
}

}  // namespace
