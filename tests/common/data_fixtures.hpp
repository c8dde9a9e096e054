// What the data suites share: reference-level contexts of 1 and 2 threads (loader output must not
// depend on the count), a fixture directory, a file writer (plain or gzip), small datasets, and one epoch of a
// Loader's batches.
#pragma once

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "dfp/data.hpp"
#include "tests/common/temp_dir.hpp"

namespace dfp::test {

inline Context& data_ctx1() {
  static Context c(ContextOptions{.threads = 1, .isa = "ref"});
  return c;
}
inline Context& data_ctx2() {
  static Context c(ContextOptions{.threads = 2, .isa = "ref"});
  return c;
}

// Fixture directories of the data suites (tests/common/temp_dir.hpp).
class DataTempDir : public TempDir {
 public:
  DataTempDir() : TempDir("dfp_data_test_") {}
};

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes, bool gz) {
  if (gz) {
    gzFile f = gzopen(path.c_str(), "wb6");
    ASSERT_NE(f, nullptr) << path;
    ASSERT_EQ(gzwrite(f, bytes.data(), unsigned(bytes.size())), int(bytes.size()));
    ASSERT_EQ(gzclose(f), Z_OK);
  } else {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    ASSERT_TRUE(out.good()) << path;
  }
}

// Distinct, non-zero-heavy pixel values: a hash of (image, byte).
inline uint8_t pixel_value(size_t image, size_t k) {
  uint32_t x = uint32_t(image * 2654435761u) ^ uint32_t(k * 40503u + 12345u);
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  x ^= x >> 15;
  return uint8_t(x);
}

// count images of CxHxW whose label is their index (so batches identify samples).
inline Dataset toy_dataset(int count, int c, int h, int w) {
  Dataset d;
  d.name = "toy";
  d.count = count;
  d.channels = c;
  d.height = h;
  d.width = w;
  d.classes = 256;
  for (int i = 0; i < count; ++i) {
    for (size_t k = 0; k < d.image_bytes(); ++k) d.pixels.push_back(uint8_t(1 + pixel_value(size_t(i), k) % 255));
    d.labels.push_back(uint8_t(i % 256));
  }
  return d;
}

// All batches of one epoch, as NCHW floats and labels.
struct Epoch {
  std::vector<std::vector<float>> images;  // per batch, NCHW of `size` images
  std::vector<std::vector<float>> raw;     // per batch, the blocked buffer as produced
  std::vector<std::vector<int32_t>> labels;
  std::vector<int32_t> all_labels;
};

inline Epoch run_epoch(Loader& loader, const Dataset& d, int epoch) {
  Epoch e;
  loader.start_epoch(epoch);
  Batch b;
  const size_t per_image = blocked_size(1, d.channels, d.height, d.width);
  while (loader.next(b)) {
    const size_t floats = per_image * size_t(loader.batch_size());
    e.raw.emplace_back(b.images, b.images + floats);
    std::vector<float> nchw(size_t(b.size) * d.image_bytes());
    from_blocked(b.images, nchw.data(), b.size, d.channels, d.height, d.width);
    e.images.push_back(std::move(nchw));
    e.labels.emplace_back(b.labels, b.labels + loader.batch_size());
    e.all_labels.insert(e.all_labels.end(), b.labels, b.labels + b.size);
  }
  EXPECT_FALSE(loader.next(b));  // stays exhausted
  return e;
}

}  // namespace dfp::test
