// Data pipeline: dataset readers on generated fixtures (exact round trips; truncated, corrupt and
// inconsistent files each rejected with a message naming the file and the record or field), the
// Loader (coverage, shuffling, determinism across thread counts, augmentation, normalisation,
// layout), image folders of JPEGs encoded here (class discovery, crop geometry, DCT scaling,
// grayscale and CMYK, RandomResizedCrop, bad files), and the real datasets when present.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <functional>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "dfp/data.hpp"
#include "dfp/status.hpp"
#include "tests/common/temp_dir.hpp"
#include "src/counter_rng.hpp"
#include "src/jpeg.hpp"
#include "tests/common/expect_error.hpp"

using namespace dfp;
namespace fs = std::filesystem;

namespace {

Context& ctx1() {
  static Context c(ContextOptions{.threads = 1, .isa = "ref"});
  return c;
}
Context& ctx2() {
  static Context c(ContextOptions{.threads = 2, .isa = "ref"});
  return c;
}

// Fixture directories of this suite (tests/common/temp_dir.hpp).
class TempDir : public test::TempDir {
 public:
  TempDir() : test::TempDir("dfp_data_test_") {}
};

void put_be32(std::vector<uint8_t>& v, uint32_t x) {
  v.push_back(uint8_t(x >> 24));
  v.push_back(uint8_t(x >> 16));
  v.push_back(uint8_t(x >> 8));
  v.push_back(uint8_t(x));
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes, bool gz) {
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

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// Distinct, non-zero-heavy pixel values: a hash of (image, byte).
uint8_t pixel_value(size_t image, size_t k) {
  uint32_t x = uint32_t(image * 2654435761u) ^ uint32_t(k * 40503u + 12345u);
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  x ^= x >> 15;
  return uint8_t(x);
}

struct IdxFixture {
  int count = 7, rows = 5, cols = 4;
  std::vector<uint8_t> pixels, labels;
  IdxFixture() {
    for (int i = 0; i < count; ++i)
      for (int k = 0; k < rows * cols; ++k) pixels.push_back(pixel_value(size_t(i), size_t(k)));
    for (int i = 0; i < count; ++i) labels.push_back(uint8_t((i * 3) % 10));
  }
  std::vector<uint8_t> image_file(uint32_t magic = 0x803, int declared = -1) const {
    std::vector<uint8_t> v;
    put_be32(v, magic);
    put_be32(v, uint32_t(declared < 0 ? count : declared));
    put_be32(v, uint32_t(rows));
    put_be32(v, uint32_t(cols));
    v.insert(v.end(), pixels.begin(), pixels.end());
    return v;
  }
  std::vector<uint8_t> label_file(uint32_t magic = 0x801, int declared = -1) const {
    std::vector<uint8_t> v;
    put_be32(v, magic);
    put_be32(v, uint32_t(declared < 0 ? count : declared));
    v.insert(v.end(), labels.begin(), labels.end());
    return v;
  }
};

// Runs f, requires a dfp::Error with `status` whose message contains every one of `parts`.
using test::expect_error;

std::vector<uint8_t> cifar_record(int label, size_t image, int coarse = -1) {
  std::vector<uint8_t> r;
  if (coarse >= 0) r.push_back(uint8_t(coarse));
  r.push_back(uint8_t(label));
  for (size_t k = 0; k < 3072; ++k) r.push_back(pixel_value(image, k));
  return r;
}

// ---- IDX ----------------------------------------------------------------------------------

void check_idx_round_trip(bool gz) {
  TempDir dir;
  IdxFixture fx;
  const std::string img = dir.file(gz ? "img.gz" : "img"), lbl = dir.file(gz ? "lbl.gz" : "lbl");
  write_bytes(img, fx.image_file(), gz);
  write_bytes(lbl, fx.label_file(), gz);
  const Dataset d = load_idx(img, lbl, 10);
  EXPECT_EQ(d.count, fx.count);
  EXPECT_EQ(d.channels, 1);
  EXPECT_EQ(d.height, fx.rows);
  EXPECT_EQ(d.width, fx.cols);
  EXPECT_EQ(d.classes, 10);
  EXPECT_EQ(d.pixels, fx.pixels);
  EXPECT_EQ(d.labels, fx.labels);
}

// The 200-image fixture of the gzip tests: enough data that the deflate stream has real blocks.
IdxFixture big_fixture() {
  IdxFixture fx;
  fx.count = 200;
  fx.rows = fx.cols = 28;
  fx.pixels.clear();
  fx.labels.clear();
  for (int i = 0; i < fx.count; ++i) {
    for (int k = 0; k < 784; ++k) fx.pixels.push_back(pixel_value(size_t(i), size_t(k)));
    fx.labels.push_back(uint8_t(i % 10));
  }
  return fx;
}

TEST(Idx, PlainRoundTrip) { check_idx_round_trip(false); }
TEST(Idx, GzipRoundTrip) { check_idx_round_trip(true); }

TEST(Idx, TruncatedImageFile) {
  TempDir dir;
  IdxFixture fx;
  auto bytes = fx.image_file();
  bytes.resize(16 + 5 * 20 + 7);  // records 0-4 whole, record 5 cut after 7 of its 20 bytes
  write_bytes(dir.file("short-images"), bytes, false);
  write_bytes(dir.file("labels"), fx.label_file(), false);
  expect_error([&] { load_idx(dir.file("short-images"), dir.file("labels"), 10); }, Status::corrupt_data,
               {"short-images", "image record 5 of 7", "cut after 7 of its 20 bytes", "truncated"});
}

TEST(Idx, TruncatedLabelFile) {
  TempDir dir;
  IdxFixture fx;
  auto bytes = fx.label_file();
  bytes.pop_back();
  write_bytes(dir.file("images"), fx.image_file(), false);
  write_bytes(dir.file("short-labels"), bytes, false);
  expect_error([&] { load_idx(dir.file("images"), dir.file("short-labels"), 10); }, Status::corrupt_data,
               {"short-labels", "ends before label record 6 of 7"});
}

TEST(Idx, TruncatedHeader) {
  TempDir dir;
  IdxFixture fx;
  auto bytes = fx.image_file();
  bytes.resize(10);
  write_bytes(dir.file("stub"), bytes, false);
  write_bytes(dir.file("labels"), fx.label_file(), false);
  expect_error([&] { load_idx(dir.file("stub"), dir.file("labels"), 10); }, Status::corrupt_data,
               {"stub", "header", "16 bytes"});
}

TEST(Idx, TruncatedGzip) {
  TempDir dir;
  const IdxFixture fx = big_fixture();
  write_bytes(dir.file("full.gz"), fx.image_file(), true);
  auto gz = read_bytes(dir.file("full.gz"));
  gz.resize(gz.size() / 2);
  write_bytes(dir.file("cut.gz"), gz, false);
  write_bytes(dir.file("labels.gz"), fx.label_file(), true);
  EXPECT_NO_THROW(load_idx(dir.file("full.gz"), dir.file("labels.gz"), 10));
  expect_error([&] { load_idx(dir.file("cut.gz"), dir.file("labels.gz"), 10); }, Status::corrupt_data,
               {"cut.gz", "truncated", "image record", "of 200", "784 bytes"});
}

TEST(Idx, CorruptGzipTrailer) {
  // The deflate data inflates to the right length but the CRC-32 in the trailer is wrong.
  TempDir dir;
  IdxFixture fx;
  write_bytes(dir.file("img.gz"), fx.image_file(), true);
  auto gz = read_bytes(dir.file("img.gz"));
  gz[gz.size() - 8] ^= 0x55;  // first byte of the CRC-32
  write_bytes(dir.file("bad-crc.gz"), gz, false);
  write_bytes(dir.file("lbl"), fx.label_file(), false);
  expect_error([&] { load_idx(dir.file("bad-crc.gz"), dir.file("lbl"), 10); }, Status::corrupt_data,
               {"bad-crc.gz", "corrupt gzip stream, detected while reading", "incorrect data check"});
}

TEST(Idx, CorruptGzipBody) {
  TempDir dir;
  const IdxFixture fx = big_fixture();
  write_bytes(dir.file("img.gz"), fx.image_file(), true);
  write_bytes(dir.file("lbl.gz"), fx.label_file(), true);
  const auto gz = read_bytes(dir.file("img.gz"));
  // Whatever a flipped byte does to the deflate stream (invalid code, wrong length, wrong CRC),
  // the result is an error naming the file, never data.
  for (size_t at : {gz.size() / 3, gz.size() / 2, gz.size() - 20}) {
    auto bad = gz;
    bad[at] ^= 0xA5;
    write_bytes(dir.file("flipped.gz"), bad, false);
    expect_error([&] { load_idx(dir.file("flipped.gz"), dir.file("lbl.gz"), 10); }, Status::corrupt_data,
                 {"flipped.gz"});
  }
  // Cut exactly before the 8-byte trailer: all pixels inflate, the stream is still incomplete.
  auto cut = gz;
  cut.resize(gz.size() - 8);
  write_bytes(dir.file("no-trailer.gz"), cut, false);
  expect_error([&] { load_idx(dir.file("no-trailer.gz"), dir.file("lbl.gz"), 10); }, Status::corrupt_data,
               {"no-trailer.gz", "truncated"});
}

TEST(Idx, TrailingBytes) {
  TempDir dir;
  IdxFixture fx;
  auto bytes = fx.image_file();
  bytes.push_back(0);
  write_bytes(dir.file("long-images"), bytes, false);
  write_bytes(dir.file("labels"), fx.label_file(), false);
  expect_error([&] { load_idx(dir.file("long-images"), dir.file("labels"), 10); }, Status::corrupt_data,
               {"long-images", "continues after the 7 image records"});
}

TEST(Idx, WrongMagic) {
  TempDir dir;
  IdxFixture fx;
  write_bytes(dir.file("images"), fx.image_file(), false);
  write_bytes(dir.file("labels"), fx.label_file(), false);
  write_bytes(dir.file("bad-images"), fx.image_file(0x12345678), false);
  expect_error([&] { load_idx(dir.file("bad-images"), dir.file("labels"), 10); }, Status::corrupt_data,
               {"bad-images", "magic", "0x12345678", "0x00000803"});
  // Swapped arguments: each file has the other's magic number.
  expect_error([&] { load_idx(dir.file("labels"), dir.file("images"), 10); }, Status::corrupt_data,
               {"labels", "0x00000801", "expected 0x00000803", "label file"});
}

TEST(Idx, LabelOutOfRange) {
  TempDir dir;
  IdxFixture fx;
  fx.labels[3] = 10;
  write_bytes(dir.file("images"), fx.image_file(), false);
  write_bytes(dir.file("bad-labels"), fx.label_file(), false);
  expect_error([&] { load_idx(dir.file("images"), dir.file("bad-labels"), 10); }, Status::corrupt_data,
               {"bad-labels", "record 3", "is 10", "0..9"});
}

TEST(Idx, CountMismatch) {
  TempDir dir;
  IdxFixture fx;
  write_bytes(dir.file("images"), fx.image_file(), false);
  fx.labels.pop_back();
  write_bytes(dir.file("fewer-labels"), fx.label_file(0x801, 6), false);
  expect_error([&] { load_idx(dir.file("images"), dir.file("fewer-labels"), 10); }, Status::corrupt_data,
               {"images", "fewer-labels", "7 images", "6 labels"});
}

TEST(Idx, ImplausibleHeaderFields) {
  TempDir dir;
  IdxFixture fx;
  write_bytes(dir.file("labels"), fx.label_file(), false);
  auto bytes = fx.image_file();
  bytes[8] = 0xFF;  // rows = 0xFF000005
  write_bytes(dir.file("huge-rows"), bytes, false);
  expect_error([&] { load_idx(dir.file("huge-rows"), dir.file("labels"), 10); }, Status::corrupt_data,
               {"huge-rows", "rows"});
  // A header that claims far more images than the file holds fails as a truncation, not an
  // allocation of the claimed size.
  write_bytes(dir.file("lying-count"), fx.image_file(0x803, 100000000), false);
  write_bytes(dir.file("lying-labels"), fx.label_file(0x801, 100000000), false);
  expect_error([&] { load_idx(dir.file("lying-count"), dir.file("lying-labels"), 10); }, Status::corrupt_data,
               {"lying-count", "record 7 of 100000000"});
}

// A header that declares huge images (2 of 60000x60000) over a file of a few bytes fails as a
// truncation without allocating for the declared size (found by fuzz_idx: 2.9 GB for 100 bytes).
TEST(Idx, HugeDeclaredImagesAllocateNothingLarge) {
  TempDir dir;
  IdxFixture fx;
  write_bytes(dir.file("labels"), fx.label_file(0x801, 2), false);
  std::vector<uint8_t> bytes;
  for (uint32_t v : {0x803u, 2u, 60000u, 60000u}) put_be32(bytes, v);
  bytes.resize(bytes.size() + 100, 7);
  write_bytes(dir.file("huge"), bytes, false);
  rusage before{}, after{};
  getrusage(RUSAGE_SELF, &before);
  expect_error([&] { load_idx(dir.file("huge"), dir.file("labels"), 10); }, Status::corrupt_data,
               {"huge", "truncated", "image record 0 of 2", "cut after 100 of its 3600000000 bytes"});
  getrusage(RUSAGE_SELF, &after);
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 256 * 1024) << "peak RSS grew by " << after.ru_maxrss - before.ru_maxrss << " KiB";
}

TEST(Idx, MissingFile) {
  TempDir dir;
  IdxFixture fx;
  write_bytes(dir.file("labels"), fx.label_file(), false);
  expect_error([&] { load_idx(dir.file("nope"), dir.file("labels"), 10); }, Status::io_error, {"nope", "not found"});
}

TEST(Idx, MnistLikeDirectory) {
  TempDir dir;
  IdxFixture fx;
  // Both spellings and both encodings.
  write_bytes(dir.file("train-images-idx3-ubyte.gz"), fx.image_file(), true);
  write_bytes(dir.file("train-labels-idx1-ubyte"), fx.label_file(), false);
  write_bytes(dir.file("t10k-images.idx3-ubyte"), fx.image_file(), false);
  write_bytes(dir.file("t10k-labels.idx1-ubyte.gz"), fx.label_file(), true);
  for (bool train : {true, false}) {
    const Dataset d = load_mnist_like(dir.str(), train, "toy");
    EXPECT_EQ(d.name, "toy");
    EXPECT_EQ(d.count, fx.count);
    EXPECT_EQ(d.classes, 10);
    EXPECT_EQ(d.pixels, fx.pixels);
    EXPECT_EQ(d.labels, fx.labels);
  }
  fs::remove(dir.file("t10k-labels.idx1-ubyte.gz"));
  expect_error([&] { load_mnist_like(dir.str(), false, "toy"); }, Status::io_error,
               {"toy", "t10k-labels-idx1-ubyte", dir.str()});
  expect_error([&] { load_mnist_like(dir.file("absent"), true, "toy"); }, Status::io_error,
               {"absent", "does not exist", "train-images-idx3-ubyte"});
}

// Bytes after the gzip stream that do not start another member are refused (gunzip and zlib's
// gzread skip them silently); a second member, as `cat a.gz b.gz` makes, is read.
TEST(Idx, GzipTrailingGarbage) {
  TempDir dir;
  IdxFixture fx;
  write_bytes(dir.file("img.gz"), fx.image_file(), true);
  write_bytes(dir.file("lbl"), fx.label_file(), false);
  const auto gz = read_bytes(dir.file("img.gz"));
  for (const std::vector<uint8_t>& tail : {std::vector<uint8_t>{'j', 'u', 'n', 'k', '\n'}, std::vector<uint8_t>{0}}) {
    auto bad = gz;
    bad.insert(bad.end(), tail.begin(), tail.end());
    write_bytes(dir.file("garbage.gz"), bad, false);
    expect_error([&] { load_idx(dir.file("garbage.gz"), dir.file("lbl"), 10); }, Status::corrupt_data,
                 {"garbage.gz", std::to_string(tail.size()) + " bytes follow the end of the gzip stream at byte " +
                                    std::to_string(gz.size()),
                  "expected the file to end there"});
  }
  // Two members: the image file split after its header.
  const auto whole = fx.image_file();
  write_bytes(dir.file("head.gz"), std::vector<uint8_t>(whole.begin(), whole.begin() + 16), true);
  write_bytes(dir.file("body.gz"), std::vector<uint8_t>(whole.begin() + 16, whole.end()), true);
  auto two = read_bytes(dir.file("head.gz"));
  const auto body = read_bytes(dir.file("body.gz"));
  two.insert(two.end(), body.begin(), body.end());
  write_bytes(dir.file("two.gz"), two, false);
  EXPECT_EQ(load_idx(dir.file("two.gz"), dir.file("lbl"), 10).pixels, fx.pixels);
}

// An IDX name that exists but is not a file is named for what it is, not reported as missing.
TEST(Idx, PathThatIsNotAFileIsNamedForWhatItIs) {
  TempDir dir;
  IdxFixture fx;
  write_bytes(dir.file("train-images-idx3-ubyte"), fx.image_file(), false);
  write_bytes(dir.file("train-labels-idx1-ubyte"), fx.label_file(), false);
  const std::string img = dir.file("train-images-idx3-ubyte");
  fs::rename(img, dir.file("real"));
  fs::create_directories(img);
  expect_error([&] { load_mnist_like(dir.str(), true, "toy"); }, Status::io_error, {img, "is a directory"});
  fs::remove(img);
  fs::create_symlink("nowhere", img);
  expect_error([&] { load_mnist_like(dir.str(), true, "toy"); }, Status::io_error,
               {img, "is a link to 'nowhere', which does not exist"});
  fs::remove(img);
  fs::create_symlink("/dev/null", img);
  expect_error([&] { load_mnist_like(dir.str(), true, "toy"); }, Status::io_error, {img, "not a regular file"});
  fs::remove(img);
  fs::create_symlink(img, img);
  expect_error([&] { load_mnist_like(dir.str(), true, "toy"); }, Status::io_error, {img, "a cycle of links"});
}

// The test split must have the training split's geometry; the message names both sources.
TEST(Datasets, SplitsOfDifferentGeometryAreRefused) {
  Dataset train, test;
  train.name = test.name = "mnist";
  train.source = "dir/train-images";
  test.source = "dir/t10k-images";
  train.channels = test.channels = 1;
  train.height = train.width = 28;
  test.height = test.width = 14;
  train.classes = test.classes = 10;
  expect_error([&] { check_same_geometry(train, test); }, Status::invalid_argument,
               {"'dir/t10k-images' have 1 channel of 14x14 pixels", "'dir/train-images' 1 channel of 28x28"});
  test.height = test.width = 28;
  EXPECT_NO_THROW(check_same_geometry(train, test));
  test.classes = 9;
  expect_error([&] { check_same_geometry(train, test); }, Status::invalid_argument, {"9 classes", "10 classes"});
}

// ---- CIFAR --------------------------------------------------------------------------------

TEST(Cifar, Cifar10RoundTrip) {
  TempDir dir;
  // Written out of order: batches are read in name order.
  const int labels2[] = {9, 0}, labels1[] = {3, 1, 4}, labels_t[] = {5, 7};
  auto write_batch = [&](const std::string& name, const int* labels, int n, size_t first_image) {
    std::vector<uint8_t> bytes;
    for (int i = 0; i < n; ++i) {
      auto r = cifar_record(labels[i], first_image + size_t(i));
      bytes.insert(bytes.end(), r.begin(), r.end());
    }
    write_bytes(dir.file(name), bytes, false);
  };
  write_batch("data_batch_2.bin", labels2, 2, 3);
  write_batch("data_batch_1.bin", labels1, 3, 0);
  write_batch("test_batch.bin", labels_t, 2, 100);
  write_bytes(dir.file("batches.meta.txt"), {'a', '\n'}, false);

  const Dataset train = load_cifar10(dir.str(), true);
  EXPECT_EQ(train.count, 5);
  EXPECT_EQ(train.channels, 3);
  EXPECT_EQ(train.height, 32);
  EXPECT_EQ(train.width, 32);
  EXPECT_EQ(train.classes, 10);
  EXPECT_EQ(train.labels, (std::vector<uint8_t>{3, 1, 4, 9, 0}));
  for (int i = 0; i < 5; ++i)
    for (size_t k = 0; k < 3072; ++k) ASSERT_EQ(train.image(i)[k], pixel_value(size_t(i), k)) << i << " " << k;

  const Dataset test = load_cifar10(dir.str(), false);
  EXPECT_EQ(test.count, 2);
  EXPECT_EQ(test.labels, (std::vector<uint8_t>{5, 7}));
  EXPECT_EQ(test.image(1)[17], pixel_value(101, 17));
}

TEST(Cifar, Cifar10SizeNotMultipleOfRecord) {
  TempDir dir;
  auto bytes = cifar_record(1, 0);
  auto r2 = cifar_record(2, 1);
  bytes.insert(bytes.end(), r2.begin(), r2.begin() + 100);
  write_bytes(dir.file("data_batch_1.bin"), bytes, false);
  expect_error([&] { load_cifar10(dir.str(), true); }, Status::corrupt_data,
               {"data_batch_1.bin", "3073", "record 1", "100 of its 3073 bytes"});
}

TEST(Cifar, Cifar10LabelOutOfRange) {
  TempDir dir;
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 3; ++i) {
    auto r = cifar_record(i == 2 ? 10 : i, size_t(i));
    bytes.insert(bytes.end(), r.begin(), r.end());
  }
  write_bytes(dir.file("data_batch_1.bin"), bytes, false);
  expect_error([&] { load_cifar10(dir.str(), true); }, Status::corrupt_data,
               {"data_batch_1.bin", "record 2", "label byte is 10", "0..9"});
}

TEST(Cifar, Cifar10MissingFiles) {
  TempDir dir;
  expect_error([&] { load_cifar10(dir.str(), true); }, Status::io_error, {"data_batch_*.bin", dir.str()});
  expect_error([&] { load_cifar10(dir.file("absent"), false); }, Status::io_error, {"absent", "test_batch*.bin"});
  write_bytes(dir.file("data_batch_1.bin"), {}, false);
  expect_error([&] { load_cifar10(dir.str(), true); }, Status::corrupt_data, {"data_batch_1.bin", "empty"});
}

// A batch file name that is not a readable file (a directory, a link cycle) is refused, never
// skipped: the split would silently lose its records.
TEST(Cifar, Cifar10BatchThatIsNotAFileIsRefused) {
  TempDir dir;
  std::vector<uint8_t> one = cifar_record(3, 0);
  write_bytes(dir.file("data_batch_1.bin"), one, false);
  fs::create_directories(dir.file("data_batch_2.bin"));
  expect_error([&] { load_cifar10(dir.str(), true); }, Status::io_error, {"data_batch_2.bin", "is a directory"});
  fs::remove(dir.file("data_batch_2.bin"));
  fs::create_symlink(dir.file("data_batch_2.bin"), dir.file("data_batch_2.bin"));
  expect_error([&] { load_cifar10(dir.str(), true); }, Status::io_error, {"data_batch_2.bin", "cycle of links"});
}

TEST(Cifar, Cifar100FineLabels) {
  TempDir dir;
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 4; ++i) {
    auto r = cifar_record(90 + i, size_t(i), 19 - i);
    bytes.insert(bytes.end(), r.begin(), r.end());
  }
  write_bytes(dir.file("train.bin"), bytes, false);
  const Dataset d = load_cifar100(dir.str(), true);
  EXPECT_EQ(d.count, 4);
  EXPECT_EQ(d.classes, 100);
  EXPECT_EQ(d.labels, (std::vector<uint8_t>{90, 91, 92, 93}));
  EXPECT_EQ(d.image(3)[3071], pixel_value(3, 3071));

  bytes.resize(3 * 3074 + 5);
  write_bytes(dir.file("test.bin"), bytes, false);
  expect_error([&] { load_cifar100(dir.str(), false); }, Status::corrupt_data, {"test.bin", "3074", "record 3"});
  bytes.resize(3074);
  bytes[1] = 100;
  write_bytes(dir.file("test.bin"), bytes, false);
  expect_error([&] { load_cifar100(dir.str(), false); }, Status::corrupt_data, {"test.bin", "record 0", "fine label"});
}

TEST(Datasets, DispatchErrors) {
  expect_error([] { load_dataset("svhn", "/x", true); }, Status::invalid_argument,
               {"svhn", "fashion-mnist", "mnist", "cifar10", "cifar100", "imagenet-folder"});
  expect_error([] { load_dataset("cifar10", "/nonexistent/dfp-data", true); }, Status::io_error,
               {"/nonexistent/dfp-data", "data_batch_*.bin"});
  expect_error([] { load_dataset("mnist", "/nonexistent/dfp-data", false); }, Status::io_error,
               {"/nonexistent/dfp-data", "t10k-images-idx3-ubyte"});
  expect_error([] { load_dataset("cifar100", "", true); }, Status::invalid_argument, {"cifar100", "path"});
}

// ---- Loader -------------------------------------------------------------------------------

// count images of CxHxW whose label is their index (so batches identify samples).
Dataset toy_dataset(int count, int c, int h, int w) {
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

Epoch run_epoch(Loader& loader, const Dataset& d, int epoch) {
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

TEST(Loader, EverySampleOncePerEpoch) {
  const Dataset d = toy_dataset(37, 3, 5, 6);
  Loader loader(ctx2(), d, 8, true, false, {}, 42);
  EXPECT_EQ(loader.batches_per_epoch(), 5);
  for (int epoch = 0; epoch < 3; ++epoch) {
    const Epoch e = run_epoch(loader, d, epoch);
    ASSERT_EQ(e.images.size(), 5u);
    std::vector<int32_t> sorted = e.all_labels;
    std::sort(sorted.begin(), sorted.end());
    ASSERT_EQ(sorted.size(), 37u);
    for (int i = 0; i < 37; ++i) EXPECT_EQ(sorted[size_t(i)], i);
    // Each image is its sample's pixels / 255 (no augmentation).
    for (size_t b = 0; b < e.images.size(); ++b) {
      const int n = int(e.images[b].size() / d.image_bytes());
      EXPECT_EQ(n, b + 1 < e.images.size() ? 8 : 5);
      for (int j = 0; j < n; ++j) {
        const int idx = e.labels[b][size_t(j)];
        for (size_t k = 0; k < d.image_bytes(); ++k)
          ASSERT_EQ(e.images[b][size_t(j) * d.image_bytes() + k], float(d.image(idx)[k]) / 255.0f);
      }
    }
    // The short last batch: entries past its size are label -1 and zero images.
    for (int j = 5; j < 8; ++j) EXPECT_EQ(e.labels.back()[size_t(j)], -1);
    const size_t per_image = blocked_size(1, 3, 5, 6);
    for (size_t k = 5 * per_image; k < 8 * per_image; ++k) ASSERT_EQ(e.raw.back()[k], 0.0f);
  }
}

TEST(Loader, DropLast) {
  const Dataset d = toy_dataset(37, 1, 4, 4);
  Loader loader(ctx1(), d, 8, true, true, {}, 7);
  EXPECT_EQ(loader.batches_per_epoch(), 4);
  const Epoch e = run_epoch(loader, d, 0);
  ASSERT_EQ(e.all_labels.size(), 32u);
  EXPECT_EQ(std::set<int32_t>(e.all_labels.begin(), e.all_labels.end()).size(), 32u);
}

TEST(Loader, ShuffleOrderDependsOnSeedAndEpochOnly) {
  const Dataset d = toy_dataset(100, 1, 3, 3);
  Loader a(ctx1(), d, 10, true, false, {}, 5), b(ctx2(), d, 10, true, false, {}, 5), c(ctx1(), d, 10, true, false, {}, 6);
  const auto a0 = run_epoch(a, d, 0).all_labels, a1 = run_epoch(a, d, 1).all_labels;
  const auto b1 = run_epoch(b, d, 1).all_labels, b0 = run_epoch(b, d, 0).all_labels;  // other order of epochs
  const auto c0 = run_epoch(c, d, 0).all_labels;
  EXPECT_EQ(a0, b0);
  EXPECT_EQ(a1, b1);
  EXPECT_NE(a0, a1);
  EXPECT_NE(a0, c0);
  // And it is a real shuffle, not the identity.
  std::vector<int32_t> identity(100);
  for (int i = 0; i < 100; ++i) identity[size_t(i)] = i;
  EXPECT_NE(a0, identity);
  Loader plain(ctx2(), d, 10, false, false, {}, 5);
  EXPECT_EQ(run_epoch(plain, d, 3).all_labels, identity);
}

TEST(Loader, IdenticalBatchesForOneAndTwoThreads) {
  const Dataset d = toy_dataset(203, 3, 8, 8);
  AugmentOptions aug{.pad = 2, .hflip = true, .mean = {0.5f, 0.4f, 0.3f}, .stddev = {0.2f, 0.25f, 0.3f}};
  Loader one(ctx1(), d, 16, true, false, aug, 99), two(ctx2(), d, 16, true, false, aug, 99);
  for (int epoch = 0; epoch < 2; ++epoch) {
    const Epoch e1 = run_epoch(one, d, epoch), e2 = run_epoch(two, d, epoch);
    ASSERT_EQ(e1.raw.size(), e2.raw.size());
    for (size_t b = 0; b < e1.raw.size(); ++b) {
      ASSERT_EQ(std::memcmp(e1.raw[b].data(), e2.raw[b].data(), e1.raw[b].size() * sizeof(float)), 0) << b;
      ASSERT_EQ(e1.labels[b], e2.labels[b]);
    }
  }
}

TEST(Loader, FlipMirrorsTheImage) {
  const Dataset d = toy_dataset(200, 2, 4, 7);
  Loader loader(ctx2(), d, 32, false, false, AugmentOptions{.hflip = true}, 3);
  std::vector<std::vector<bool>> flips;  // [epoch][sample]
  for (int epoch = 0; epoch < 2; ++epoch) {
    const Epoch e = run_epoch(loader, d, epoch);
    std::vector<bool> f(200, false);
    for (size_t b = 0; b < e.images.size(); ++b)
      for (size_t j = 0; j * d.image_bytes() < e.images[b].size(); ++j) {
        const int idx = e.labels[b][j];
        const float* out = e.images[b].data() + j * d.image_bytes();
        bool same = true, mirrored = true;
        for (int c = 0; c < 2; ++c)
          for (int h = 0; h < 4; ++h)
            for (int w = 0; w < 7; ++w) {
              const float v = out[(c * 4 + h) * 7 + w];
              same &= v == float(d.image(idx)[(c * 4 + h) * 7 + w]) / 255.0f;
              mirrored &= v == float(d.image(idx)[(c * 4 + h) * 7 + (6 - w)]) / 255.0f;
            }
        ASSERT_TRUE(same != mirrored) << "sample " << idx << ": neither the original nor its mirror image";
        f[size_t(idx)] = mirrored;
      }
    flips.push_back(f);
  }
  // Binomial(200, 1/2) per epoch: 100 +- 7; 55..145 is a six-sigma band.
  for (const auto& f : flips) {
    const auto n = std::count(f.begin(), f.end(), true);
    EXPECT_GT(n, 55);
    EXPECT_LT(n, 145);
  }
  // The draws are per epoch: a different set of samples is flipped in epoch 1.
  EXPECT_NE(flips[0], flips[1]);
}

TEST(Loader, PadAndRandomCrop) {
  const int H = 6, W = 5, pad = 2;
  const Dataset d = toy_dataset(250, 1, H, W);
  Loader loader(ctx2(), d, 25, true, false, AugmentOptions{.pad = pad}, 11);
  const Epoch e = run_epoch(loader, d, 0);
  std::map<std::pair<int, int>, int> offsets;
  double sum_dy = 0, sum_dx = 0;
  int n = 0;
  for (size_t b = 0; b < e.images.size(); ++b)
    for (size_t j = 0; j * d.image_bytes() < e.images[b].size(); ++j) {
      const int idx = e.labels[b][j];
      const float* out = e.images[b].data() + j * d.image_bytes();
      // Find the crop origin (oy, ox) in the padded image that reproduces the output.
      int found = 0, fy = -1, fx = -1;
      for (int oy = 0; oy <= 2 * pad; ++oy)
        for (int ox = 0; ox <= 2 * pad; ++ox) {
          bool match = true;
          for (int h = 0; h < H && match; ++h)
            for (int w = 0; w < W && match; ++w) {
              const int sy = h + oy - pad, sx = w + ox - pad;
              const float want = (sy >= 0 && sy < H && sx >= 0 && sx < W) ? float(d.image(idx)[sy * W + sx]) / 255.0f : 0.0f;
              match = out[h * W + w] == want;
            }
          if (match) ++found, fy = oy, fx = ox;
        }
      ASSERT_EQ(found, 1) << "sample " << idx;
      ++offsets[{fy, fx}];
      sum_dy += fy;
      sum_dx += fx;
      ++n;
    }
  EXPECT_EQ(n, 250);
  // 25 offsets, 250 draws: each expected 10 times.
  EXPECT_GE(offsets.size(), 23u);
  EXPECT_NEAR(sum_dy / n, pad, 0.35);
  EXPECT_NEAR(sum_dx / n, pad, 0.35);
}

TEST(Loader, NormalisationAndPaddingLanes) {
  // 17 channels: two channel blocks, the second with 15 padding lanes.
  const int C = 17, H = 3, W = 2;
  const Dataset d = toy_dataset(10, C, H, W);
  AugmentOptions aug;
  for (int c = 0; c < C; ++c) {
    aug.mean.push_back(0.1f + 0.03f * float(c));
    aug.stddev.push_back(0.2f + 0.01f * float(c));
  }
  Loader loader(ctx2(), d, 4, true, false, aug, 1);
  const Epoch e = run_epoch(loader, d, 0);
  for (size_t b = 0; b < e.raw.size(); ++b) {
    const float* raw = e.raw[b].data();
    for (int n = 0; n < 4; ++n)
      for (int blk = 0; blk < 2; ++blk)
        for (int p = 0; p < H * W; ++p)
          for (int l = 0; l < 16; ++l) {
            const int c = blk * 16 + l;
            const float v = raw[((size_t(n) * 2 + size_t(blk)) * H * W + size_t(p)) * 16 + size_t(l)];
            if (c >= C) {
              ASSERT_EQ(v, 0.0f) << "padding lane " << l;
              continue;
            }
            const int idx = e.labels[b][size_t(n)];
            if (idx < 0) {
              ASSERT_EQ(v, 0.0f);  // past the end of the short last batch
              continue;
            }
            const float px = float(d.image(idx)[size_t(c) * H * W + size_t(p)]);
            const float want = (px / 255.0f - aug.mean[size_t(c)]) / aug.stddev[size_t(c)];
            ASSERT_NEAR(v, want, 1e-6f * std::max(1.0f, std::fabs(want)));
          }
  }
}

TEST(Loader, RestartAndDestroyMidEpoch) {
  const Dataset d = toy_dataset(64, 3, 8, 8);
  std::vector<int32_t> first_batch;
  {
    Loader loader(ctx2(), d, 4, true, false, {}, 8);
    loader.start_epoch(0);
    Batch b;
    ASSERT_TRUE(loader.next(b));
    first_batch.assign(b.labels, b.labels + b.size);
    ASSERT_TRUE(loader.next(b));
    // Restart in the middle: the same epoch again from its start.
    loader.start_epoch(0);
    ASSERT_TRUE(loader.next(b));
    EXPECT_EQ(std::vector<int32_t>(b.labels, b.labels + b.size), first_batch);
    EXPECT_GE(loader.data_wait_seconds(), 0.0);
    EXPECT_TRUE(std::isfinite(loader.data_wait_seconds()));
  }  // destroyed with batches in flight: must not hang or crash
  {
    Loader loader(ctx1(), d, 4, true, false, {}, 8);  // never started
  }
  Loader moved_from(ctx2(), d, 4, true, false, {}, 8);
  Loader loader = std::move(moved_from);
  loader.start_epoch(0);
  Batch b;
  ASSERT_TRUE(loader.next(b));
  EXPECT_EQ(std::vector<int32_t>(b.labels, b.labels + b.size), first_batch);
}

TEST(Loader, InvalidArguments) {
  const Dataset d = toy_dataset(10, 3, 4, 4);
  expect_error([&] { Loader(ctx1(), d, 0, true, false, {}, 1); }, Status::invalid_argument, {"toy", "batch"});
  expect_error([&] { Loader(ctx1(), d, 11, true, true, {}, 1); }, Status::invalid_argument, {"drop_last"});
  expect_error([&] { Loader(ctx1(), d, 4, true, false, AugmentOptions{.mean = {0.5f}}, 1); },
               Status::invalid_argument, {"mean", "channels = 3"});
  expect_error([&] { Loader(ctx1(), d, 4, true, false, AugmentOptions{.stddev = {1, 0, 1}}, 1); },
               Status::invalid_argument, {"stddev[1]"});
  expect_error([&] { Loader(ctx1(), d, 4, true, false, AugmentOptions{.pad = 5}, 1); }, Status::invalid_argument,
               {"pad"});
  Dataset bad = d;
  bad.classes = 5;
  bad.labels[4] = 7;
  expect_error([&] { Loader(ctx1(), bad, 4, true, false, {}, 1); }, Status::invalid_argument, {"record 4"});
  Loader loader(ctx1(), d, 4, true, false, {}, 1);
  Batch b;
  expect_error([&] { loader.next(b); }, Status::invalid_argument, {"start_epoch"});
}

// ---- image folder (JPEG) ------------------------------------------------------------------

// Packed pixels (1, 3 or 4 bytes each: gray, RGB, CMYK) encoded with TurboJPEG.
std::vector<uint8_t> encode_jpeg(const std::vector<uint8_t>& px, int w, int h, int pixel_format,
                                 int subsamp = TJSAMP_444, int quality = 95) {
  tjhandle t = tjInitCompress();
  EXPECT_NE(t, nullptr);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(t, px.data(), w, 0, h, pixel_format, &buf, &size, subsamp, quality, 0);
  EXPECT_EQ(rc, 0) << tjGetErrorStr2(t);
  std::vector<uint8_t> out(buf, buf + size);
  tjFree(buf);
  tjDestroy(t);
  return out;
}

// An RGB image whose pixel (y, x) is f(y, x) -> {r, g, b}.
template <class F>
std::vector<uint8_t> rgb_image(int w, int h, F&& f) {
  std::vector<uint8_t> px;
  px.reserve(size_t(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const std::array<uint8_t, 3> c = f(y, x);
      px.insert(px.end(), c.begin(), c.end());
    }
  return px;
}

// Smooth colour gradients: a plausible photograph for the codec.
std::vector<uint8_t> gradient_jpeg(int w, int h, int seed) {
  return encode_jpeg(rgb_image(w, h,
                               [&](int y, int x) {
                                 return std::array<uint8_t, 3>{uint8_t(x * 255 / w), uint8_t(y * 255 / h),
                                                               uint8_t((x + y + seed * 40) % 256)};
                               }),
                     w, h, TJPF_RGB, TJSAMP_420, 90);
}

std::vector<uint8_t> gray_jpeg(int w, int h) {
  std::vector<uint8_t> px;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) px.push_back(uint8_t(40 + (x * 160) / w));
  return encode_jpeg(px, w, h, TJPF_GRAY, TJSAMP_GRAY, 95);
}

// train/{cat,dog,emu}/ and val/{cat,dog,emu}/ of JPEGs of several sizes: DCT scaling, a
// grayscale and a CMYK one, a nested folder, and files the scan must skip.
void make_folder(const TempDir& dir) {
  for (const char* split : {"train", "val"})
    for (const char* cls : {"cat", "dog", "emu"}) fs::create_directories(fs::path(dir.str()) / split / cls);
  auto put = [&](const std::string& rel, const std::vector<uint8_t>& bytes) { write_bytes(dir.file(rel), bytes, false); };
  put("train/cat/b.jpg", gradient_jpeg(300, 200, 1));
  put("train/cat/a.jpeg", gradient_jpeg(40, 30, 2));
  put("train/dog/gray.JPEG", gray_jpeg(300, 200));
  put("train/dog/small.jpg", gradient_jpeg(64, 48, 3));
  fs::create_directories(fs::path(dir.str()) / "train/emu/nested");
  put("train/emu/nested/deep.jpg", gradient_jpeg(120, 90, 4));
  std::vector<uint8_t> cmyk;
  for (int i = 0; i < 48 * 40; ++i) cmyk.insert(cmyk.end(), {uint8_t(100 + 3 * (i % 48)), 100, 50, 220});
  put("train/emu/cmyk.jpg", encode_jpeg(cmyk, 48, 40, TJPF_CMYK, TJSAMP_444, 95));
  put("train/emu/notes.txt", {'h', 'i'});       // not a JPEG extension: skipped
  put("train/emu/.hidden.jpg", {'x'});          // hidden: skipped
  fs::create_directories(fs::path(dir.str()) / "train/.cache");  // hidden folder: not a class
  put("val/cat/v1.jpg", gradient_jpeg(80, 60, 5));
  put("val/dog/v2.jpg", gradient_jpeg(60, 80, 6));
  put("val/emu/v3.jpg", gradient_jpeg(50, 50, 7));
}

// The file names (not paths) of a file-backed dataset, in order.
std::vector<std::string> names_of(const Dataset& d) {
  std::vector<std::string> n;
  for (const auto& f : d.files) n.push_back(fs::path(f).filename().string());
  return n;
}

TEST(ImageFolder, ClassesLabelsAndOrder) {
  TempDir dir;
  make_folder(dir);
  const Dataset train = load_image_folder(dir.str(), true, 64);
  EXPECT_TRUE(train.file_backed());
  EXPECT_EQ(train.class_names, (std::vector<std::string>{"cat", "dog", "emu"}));
  EXPECT_EQ(train.classes, 3);
  EXPECT_EQ(train.count, 6);
  EXPECT_EQ(train.channels, 3);
  EXPECT_EQ(train.height, 64);
  EXPECT_EQ(train.width, 64);
  EXPECT_TRUE(train.pixels.empty());
  EXPECT_EQ(names_of(train), (std::vector<std::string>{"a.jpeg", "b.jpg", "gray.JPEG", "small.jpg", "cmyk.jpg", "deep.jpg"}));
  EXPECT_EQ(train.file_labels, (std::vector<int32_t>{0, 0, 1, 1, 2, 2}));
  for (int i = 0; i < train.count; ++i) EXPECT_EQ(train.label(i), train.file_labels[size_t(i)]);
  const Dataset val = load_dataset("imagenet", dir.str(), false);  // default size 224
  EXPECT_EQ(val.height, 224);
  EXPECT_EQ(val.class_names, train.class_names);
  EXPECT_EQ(names_of(val), (std::vector<std::string>{"v1.jpg", "v2.jpg", "v3.jpg"}));
  EXPECT_EQ(val.file_labels, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(load_dataset("folder", dir.str(), true, 96).width, 96);
  EXPECT_EQ(load_dataset("imagenet-folder", dir.str(), true).count, 6);
  expect_error([&] { load_dataset("cifar10", dir.str(), true, 96); }, Status::invalid_argument, {"cifar10", "fixed size"});
  expect_error([&] { load_dataset("imagenet", "", true); }, Status::invalid_argument, {"imagenet", "path"});
  expect_error([&] { load_image_folder(dir.str(), true, 0); }, Status::invalid_argument, {"image_size"});
}

// Decodes one epoch of d (no shuffle) into NCHW floats.
std::vector<float> decode_all(const Context& ctx, const Dataset& d, const AugmentOptions& aug, int batch = 4,
                              int epoch = 0, uint64_t seed = 1) {
  Loader loader(ctx, d, batch, false, false, aug, seed);
  const Epoch e = run_epoch(loader, d, epoch);
  std::vector<float> all;
  for (const auto& b : e.images) all.insert(all.end(), b.begin(), b.end());
  return all;
}

// A dataset of the given files with label 0, without a folder scan.
Dataset file_dataset(const std::vector<std::string>& files, int size) {
  Dataset d;
  d.name = "files";
  d.count = int(files.size());
  d.channels = 3;
  d.height = d.width = size;
  d.classes = 1;
  d.files = files;
  d.file_labels.assign(files.size(), 0);
  return d;
}

// 300x200: rows < 50 green; below them, columns < 150 red, the rest blue.
std::vector<uint8_t> quadrant_jpeg() {
  return encode_jpeg(rgb_image(300, 200,
                               [](int y, int x) {
                                 if (y < 50) return std::array<uint8_t, 3>{0, 255, 0};
                                 return x < 150 ? std::array<uint8_t, 3>{255, 0, 0} : std::array<uint8_t, 3>{0, 0, 255};
                               }),
                     300, 200, TJPF_RGB, TJSAMP_444, 95);
}

TEST(ImageFolder, EvalResizeAndCenterCropGeometry) {
  // Resize(36) + CenterCrop(32) of 300x200 (size 32 -> resize 32 * 256 / 224 = 36): the image
  // becomes 54x36, the crop starts at (top, left) = (2, 11), so output pixel (y, x) shows the
  // original point (11.5 + x, 2.5 + y) * 200 / 36.
  const jpeg::Box box = jpeg::resize_center_crop(200, 300, 36, 32, 32);
  EXPECT_DOUBLE_EQ(box.y, 2 * 200.0 / 36);
  EXPECT_DOUBLE_EQ(box.x, 11 * 300.0 / 54);
  EXPECT_DOUBLE_EQ(box.h, 32 * 200.0 / 36);
  EXPECT_DOUBLE_EQ(box.w, 32 * 300.0 / 54);
  TempDir dir;
  write_bytes(dir.file("q.jpg"), quadrant_jpeg(), false);
  const Dataset d = file_dataset({dir.file("q.jpg")}, 32);
  const std::vector<float> img = decode_all(ctx1(), d, AugmentOptions{});  // plain pixel / 255
  ASSERT_EQ(img.size(), 3u * 32 * 32);
  auto px = [&](int c, int y, int x) { return img[(size_t(c) * 32 + size_t(y)) * 32 + size_t(x)] * 255.0f; };
  const double f = 200.0 / 36;
  int checked = 0;
  for (int y = 0; y < 32; ++y)
    for (int x = 0; x < 32; ++x) {
      const double u = (11.5 + x) * f, v = (2.5 + y) * f;  // original coordinates of the pixel centre
      if (std::fabs(v - 50) < 8 || (v > 50 && std::fabs(u - 150) < 8)) continue;  // near an edge
      const float want_r = v < 50 ? 0 : u < 150 ? 255 : 0, want_g = v < 50 ? 255 : 0, want_b = v < 50 ? 0 : u < 150 ? 0 : 255;
      ASSERT_NEAR(px(0, y, x), want_r, 30) << y << "," << x;
      ASSERT_NEAR(px(1, y, x), want_g, 30) << y << "," << x;
      ASSERT_NEAR(px(2, y, x), want_b, 30) << y << "," << x;
      ++checked;
    }
  EXPECT_GT(checked, 700);
  // The edges fall between output columns 15 | 16 and rows 6 | 7: a crop one pixel off moves them.
  for (int y = 10; y < 32; ++y) {
    EXPECT_GT(px(0, y, 15), 160) << y;
    EXPECT_LT(px(0, y, 16), 95) << y;
  }
  for (int x = 0; x < 32; ++x) {
    EXPECT_GT(px(1, 6, x), 160) << x;
    EXPECT_LT(px(1, 7, x), 95) << x;
  }
}

TEST(ImageFolder, DctScaledDecoding) {
  // Scale choice: the smallest of 1/8, 1/4, 1/2, 1 at which the window keeps >= out pixels per
  // side.
  auto pick = [](int h, int w, jpeg::Box b, int out) {
    const jpeg::Scale s = jpeg::choose_scale(h, w, b, out, out);
    return std::to_string(s.num) + "/" + std::to_string(s.denom);
  };
  EXPECT_EQ(pick(200, 300, jpeg::resize_center_crop(200, 300, 36, 32, 32), 32), "1/4");    // window 178 -> 44
  EXPECT_EQ(pick(375, 500, jpeg::resize_center_crop(375, 500, 256, 224, 224), 224), "1/1");  // 328: 1/2 < 224
  EXPECT_EQ(pick(375, 500, jpeg::Box{0, 0, 375, 500}, 160), "1/2");
  EXPECT_EQ(pick(1024, 1024, jpeg::Box{0, 0, 1024, 1024}, 128), "1/8");
  EXPECT_EQ(pick(1024, 1024, jpeg::Box{0, 0, 1024, 1000}, 128), "1/4");
  EXPECT_EQ(pick(30, 40, jpeg::Box{0, 0, 30, 40}, 64), "1/1");  // upsampled: never above 1
  // A 1x1 image decodes to 1x1 at every factor: the decoder's own choice for 1x1 is 1/1.
  EXPECT_EQ(pick(1, 1, jpeg::Box{0, 0, 1, 1}, 1), "1/1");

  // The decoder really decodes at that scale.
  const std::vector<uint8_t> q = quadrant_jpeg();
  jpeg::Decoder dec;
  dec.set_data(q.data(), q.size(), "quadrant.jpg");
  EXPECT_EQ(dec.width(), 300);
  EXPECT_EQ(dec.height(), 200);
  std::vector<uint8_t> out(32 * 32 * 3);
  dec.render(jpeg::resize_center_crop(200, 300, 36, 32, 32), 32, 32, out.data());
  EXPECT_EQ(dec.decoded_scale().num * 4, dec.decoded_scale().denom);
  EXPECT_EQ(dec.decoded_width(), 75);
  EXPECT_EQ(dec.decoded_height(), 50);
  // At 1/4 the decoded image is the original averaged over 4x4 blocks.
  EXPECT_NEAR(dec.rgb()[(20 * 75 + 10) * 3 + 0], 255, 12);  // red
  EXPECT_NEAR(dec.rgb()[(20 * 75 + 60) * 3 + 2], 255, 12);  // blue
  EXPECT_NEAR(dec.rgb()[(5 * 75 + 40) * 3 + 1], 255, 12);   // green
  // And at full size when asked.
  dec.decode(jpeg::Scale{1, 1});
  EXPECT_EQ(dec.decoded_width(), 300);
  EXPECT_EQ(dec.decoded_height(), 200);
}

TEST(ImageFolder, GrayscaleAndCmyk) {
  TempDir dir;
  write_bytes(dir.file("g.jpg"), gray_jpeg(300, 200), false);
  std::vector<uint8_t> cmyk;
  for (int i = 0; i < 48 * 40; ++i) cmyk.insert(cmyk.end(), {200, 100, 50, 220});
  write_bytes(dir.file("c.jpg"), encode_jpeg(cmyk, 48, 40, TJPF_CMYK, TJSAMP_444, 95), false);
  const Dataset d = file_dataset({dir.file("g.jpg"), dir.file("c.jpg")}, 16);
  const std::vector<float> img = decode_all(ctx2(), d, AugmentOptions{});
  ASSERT_EQ(img.size(), 2u * 3 * 16 * 16);
  for (int k = 0; k < 16 * 16; ++k) {
    // Grayscale: R = G = B, a left-to-right ramp from 40 to 200.
    const float r = img[size_t(k)], g = img[size_t(256 + k)], b = img[size_t(512 + k)];
    ASSERT_EQ(r, g);
    ASSERT_EQ(g, b);
    ASSERT_GT(r * 255, 30);
    ASSERT_LT(r * 255, 210);
    // CMYK (inverted, as libjpeg returns it): R = C * K / 255.
    const float* c = img.data() + 3 * 256;
    ASSERT_NEAR(c[k] * 255, 200 * 220 / 255.0, 4);
    ASSERT_NEAR(c[256 + k] * 255, 100 * 220 / 255.0, 4);
    ASSERT_NEAR(c[512 + k] * 255, 50 * 220 / 255.0, 4);
  }
  EXPECT_LT(img[16 * 2], img[16 * 2 + 15]);  // the ramp increases left to right
}

TEST(ImageFolder, TrainingIsDeterministicAndThreadIndependent) {
  TempDir dir;
  make_folder(dir);
  Dataset d = load_image_folder(dir.str(), true, 48);
  // 4 copies of the 6 files: 24 samples, each with its own draws.
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 6; ++i) {
      d.files.push_back(d.files[size_t(i)]);
      d.file_labels.push_back(d.file_labels[size_t(i)]);
    }
  d.count = int(d.files.size());
  const AugmentOptions aug = image_folder_augment(true);
  EXPECT_TRUE(aug.random_resized_crop);
  EXPECT_TRUE(aug.hflip);
  Loader one(ctx1(), d, 5, true, false, aug, 123), two(ctx2(), d, 5, true, false, aug, 123);
  std::vector<std::vector<float>> epoch_images;
  for (int epoch = 0; epoch < 2; ++epoch) {
    const Epoch e1 = run_epoch(one, d, epoch), e2 = run_epoch(two, d, epoch);
    ASSERT_EQ(e1.raw.size(), 5u);
    ASSERT_EQ(e1.raw.size(), e2.raw.size());
    std::vector<float> all;
    for (size_t b = 0; b < e1.raw.size(); ++b) {
      ASSERT_EQ(std::memcmp(e1.raw[b].data(), e2.raw[b].data(), e1.raw[b].size() * sizeof(float)), 0) << b;
      ASSERT_EQ(e1.labels[b], e2.labels[b]);
      all.insert(all.end(), e1.images[b].begin(), e1.images[b].end());
    }
    for (float v : all) ASSERT_TRUE(std::isfinite(v));
    epoch_images.push_back(std::move(all));
  }
  EXPECT_NE(epoch_images[0], epoch_images[1]);  // new crops (and order) every epoch
  // Copies of one file get different crops within an epoch: sample i and i + 6 (no shuffle).
  const std::vector<float> plain = decode_all(ctx2(), d, aug, 6);
  const size_t per = d.image_bytes();
  for (int i = 0; i < 6; ++i)
    EXPECT_NE(std::vector<float>(plain.begin() + i * per, plain.begin() + (i + 1) * per),
              std::vector<float>(plain.begin() + (i + 6) * per, plain.begin() + (i + 7) * per))
        << i;
  // Evaluation transforms are fixed: the same file always gives the same image.
  const std::vector<float> ev = decode_all(ctx2(), d, image_folder_augment(false), 6);
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(std::vector<float>(ev.begin() + i * per, ev.begin() + (i + 1) * per),
              std::vector<float>(ev.begin() + (i + 18) * per, ev.begin() + (i + 19) * per));
}

// Sample i's augmentation key, as the Loader forms it.
uint64_t mix_key(int i) { return stream_key(7, kAugmentSalt, 0, uint64_t(i)); }

TEST(ImageFolder, RandomResizedCropStatistics) {
  const AugmentOptions a = image_folder_augment(true);
  const int H = 200, W = 300;
  double sum_area = 0;
  std::set<std::pair<int, int>> origins;
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    const jpeg::Box b = jpeg::random_resized_crop(H, W, a, mix_key(i));
    ASSERT_EQ(b.y, std::floor(b.y));
    ASSERT_EQ(b.h, std::floor(b.h));
    ASSERT_GE(b.y, 0);
    ASSERT_GE(b.x, 0);
    ASSERT_GE(b.h, 1);
    ASSERT_GE(b.w, 1);
    ASSERT_LE(b.y + b.h, H);
    ASSERT_LE(b.x + b.w, W);
    const double frac = b.h * b.w / (H * W), ratio = b.w / b.h;
    ASSERT_GE(frac, 0.08 * 0.9);  // rounding of w and h to whole pixels
    ASSERT_LE(ratio, 4.0 / 3 * 1.1);
    ASSERT_GE(ratio, 3.0 / 4 / 1.1);
    sum_area += frac;
    origins.insert({int(b.y), int(b.x)});
    // The same key, the same window.
    const jpeg::Box again = jpeg::random_resized_crop(H, W, a, mix_key(i));
    ASSERT_EQ(again.y, b.y);
    ASSERT_EQ(again.w, b.w);
  }
  // Uniform area fractions in [0.08, 1] average 0.54, but windows that do not fit the 3:2 image
  // are redrawn: torchvision's algorithm, simulated in Python, averages 0.390 here (sd of the
  // mean of 4000 draws: 0.004).
  EXPECT_NEAR(sum_area / n, 0.390, 0.016);
  EXPECT_GT(origins.size(), 1000u);
  // Fallback: nothing fits a 300x100 image at scale 1 and ratio <= 4/3: the central crop of
  // ratio 4/3, 133x100 at x = 83.
  AugmentOptions full = a;
  full.scale_min = full.scale_max = 1.0f;
  const jpeg::Box fb = jpeg::random_resized_crop(100, 300, full, 5);
  EXPECT_EQ(fb.y, 0);
  EXPECT_EQ(fb.h, 100);
  EXPECT_EQ(fb.w, 133);
  EXPECT_EQ(fb.x, 83);
}

TEST(ImageFolder, FlipIsAFairCoin) {
  // Evaluation geometry with hflip on: the left half red or blue tells whether it was flipped.
  TempDir dir;
  write_bytes(dir.file("lr.jpg"),
              encode_jpeg(rgb_image(64, 48,
                                    [](int, int x) {
                                      return x < 32 ? std::array<uint8_t, 3>{255, 0, 0} : std::array<uint8_t, 3>{0, 0, 255};
                                    }),
                          64, 48, TJPF_RGB, TJSAMP_444, 95),
              false);
  const Dataset d = file_dataset(std::vector<std::string>(200, dir.file("lr.jpg")), 16);
  AugmentOptions aug;
  aug.hflip = true;
  std::vector<bool> flips[2];
  for (int epoch = 0; epoch < 2; ++epoch) {
    const std::vector<float> img = decode_all(ctx2(), d, aug, 50, epoch, 9);
    for (int i = 0; i < 200; ++i) {
      const float left_red = img[size_t(i) * 768 + 8 * 16 + 1];  // channel 0, row 8, column 1
      const float right_red = img[size_t(i) * 768 + 8 * 16 + 14];
      ASSERT_NE(left_red > 0.5f, right_red > 0.5f) << i;
      flips[epoch].push_back(left_red < 0.5f);
    }
  }
  for (const auto& f : flips) {
    const auto k = std::count(f.begin(), f.end(), true);
    EXPECT_GT(k, 55);
    EXPECT_LT(k, 145);
  }
  EXPECT_NE(flips[0], flips[1]);
}

TEST(ImageFolder, FolderErrors) {
  {
    TempDir dir;
    make_folder(dir);
    fs::create_directories(fs::path(dir.str()) / "val/fox");
    write_bytes(dir.file("val/fox/f.jpg"), gradient_jpeg(20, 20, 1), false);
    EXPECT_NO_THROW(load_image_folder(dir.str(), true, 32));  // train does not look at val
    expect_error([&] { load_image_folder(dir.str(), false, 32); }, Status::io_error, {"val/fox", "train"});
    fs::remove_all(fs::path(dir.str()) / "val/fox");
    fs::remove_all(fs::path(dir.str()) / "val/emu");
    expect_error([&] { load_image_folder(dir.str(), false, 32); }, Status::io_error, {"val", "'emu'"});
  }
  {
    TempDir dir;
    make_folder(dir);
    fs::create_directories(fs::path(dir.str()) / "train/empty");
    write_bytes(dir.file("train/empty/readme.txt"), {'x'}, false);
    expect_error([&] { load_image_folder(dir.str(), true, 32); }, Status::io_error, {"train/empty", "no JPEG file"});
  }
  {
    TempDir dir;
    fs::create_directories(fs::path(dir.str()) / "train");
    expect_error([&] { load_image_folder(dir.str(), true, 32); }, Status::io_error, {"train", "no class folders"});
  }
  {
    TempDir dir;
    expect_error([&] { load_image_folder(dir.str(), true, 32); }, Status::io_error, {"train", "does not exist"});
    expect_error([&] { load_image_folder(dir.file("nope"), true, 32); }, Status::io_error, {"nope", "does not exist"});
  }
}

// Runs f in a child process that must finish within `seconds`: true when it returned true.
// (A scan that loops forever fails the test instead of hanging the suite.)
bool finishes_in_child(const std::function<bool()>& f, int seconds) {
  const pid_t pid = fork();
  if (pid == 0) _exit(f() ? 0 : 1);
  for (int i = 0; i < seconds * 20; ++i) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) && WEXITSTATUS(status) == 0;
    usleep(50000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  ADD_FAILURE() << "did not finish in " << seconds << " s";
  return false;
}

// Whether f throws dfp::Error(status) whose message holds every part.
bool throws(const std::function<void()>& f, Status status, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const Error& e) {
    bool all = e.status() == status;
    for (const auto& p : parts) all = all && std::string(e.what()).find(p) != std::string::npos;
    if (!all) std::fprintf(stderr, "message: %s\n", e.what());
    return all;
  }
  return false;
}

// Links inside an image folder: a cycle (two links to '.') is refused instead of scanned forever; a
// link to the split folder or to another class folder is refused instead of labelling that
// folder's images with this class; a link to a folder outside the split is followed.
TEST(ImageFolder, LinksNeverLoopOrRelabel) {
  {
    TempDir dir;
    make_folder(dir);
    fs::create_directory_symlink(".", dir.file("train/cat/l1"));
    fs::create_directory_symlink(".", dir.file("train/cat/l2"));
    EXPECT_TRUE(finishes_in_child(
        [&] {
          return throws([&] { load_image_folder(dir.str(), true, 32); }, Status::invalid_argument,
                        {"train/cat/l", "already scanned for class 'cat'", "cycle"});
        },
        30));
  }
  for (const char* target : {"..", "../dog", "../dog/.."}) {
    TempDir dir;
    make_folder(dir);
    fs::create_directory_symlink(target, dir.file("train/cat/loop"));
    EXPECT_TRUE(finishes_in_child(
        [&] {
          return throws([&] { load_image_folder(dir.str(), true, 32); }, Status::invalid_argument,
                        {"train/cat/loop", "not in that class folder", "would be labelled 'cat'"});
        },
        30))
        << target;
  }
  {
    TempDir dir, outside;
    make_folder(dir);
    write_bytes(outside.file("more.jpg"), gradient_jpeg(30, 30, 9), false);
    fs::create_directory_symlink(outside.path(), dir.file("train/cat/more"));
    fs::create_symlink(dir.file("train/cat/a.jpeg"), dir.file("train/cat/again.jpg"));  // within the class: kept
    const Dataset d = load_image_folder(dir.str(), true, 32);
    std::map<std::string, int> label;
    for (int i = 0; i < d.count; ++i) label[fs::path(d.files[size_t(i)]).filename().string()] = d.label(i);
    EXPECT_EQ(label.at("more.jpg"), 0);
    EXPECT_EQ(label.at("again.jpg"), 0);
    EXPECT_EQ(d.count, 8);  // six of make_folder, more.jpg, again.jpg
    // A file link to another class's image is refused like a folder link.
    fs::create_symlink(dir.file("train/dog/small.jpg"), dir.file("train/cat/stolen.jpg"));
    expect_error([&] { load_image_folder(dir.str(), true, 32); }, Status::invalid_argument,
                 {"train/cat/stolen.jpg", "would be labelled 'cat'"});
  }
  {
    TempDir dir;
    make_folder(dir);
    fs::create_directory_symlink("dog", dir.file("train/wolf"));
    expect_error([&] { load_image_folder(dir.str(), true, 32); }, Status::invalid_argument,
                 {"train/dog", "train/wolf", "same directory"});
  }
}

// One epoch of d, with 1 and with 2 threads, must fail with corrupt_data naming all of parts.
void expect_loader_error(const Dataset& d, const std::vector<std::string>& parts) {
  for (const Context* ctx : {&ctx1(), &ctx2()}) {
    Loader loader(*ctx, d, 2, false, false, image_folder_augment(true), 1);
    expect_error(
        [&] {
          loader.start_epoch(0);
          Batch b;
          while (loader.next(b)) {
          }
        },
        Status::corrupt_data, parts);
  }
}

TEST(ImageFolder, BadFilesNameTheFile) {
  TempDir dir;
  fs::create_directories(fs::path(dir.str()) / "train/a");
  const std::vector<uint8_t> good = gradient_jpeg(300, 200, 1);
  write_bytes(dir.file("train/a/good.jpg"), good, false);
  // Cut in half: the header is intact, the entropy-coded data ends early.
  write_bytes(dir.file("train/a/half.jpg"), std::vector<uint8_t>(good.begin(), good.begin() + long(good.size() / 2)),
              false);
  Dataset d = load_image_folder(dir.str(), true, 32);
  ASSERT_EQ(names_of(d), (std::vector<std::string>{"good.jpg", "half.jpg"}));
  expect_loader_error(d, {"half.jpg", "sample 1", "class 'a'", "truncated", "expected a complete"});

  // Cut inside the header.
  write_bytes(dir.file("train/a/half.jpg"), std::vector<uint8_t>(good.begin(), good.begin() + 100), false);
  expect_loader_error(d, {"half.jpg", "sample 1", "header"});

  // Not a JPEG at all, and a PNG named .jpg.
  write_bytes(dir.file("train/a/half.jpg"), {'h', 'e', 'l', 'l', 'o'}, false);
  expect_loader_error(d, {"half.jpg", "not a JPEG", "68 65", "FF D8"});
  write_bytes(dir.file("train/a/half.jpg"), {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'}, false);
  expect_loader_error(d, {"half.jpg", "PNG", "FF D8"});

  // Empty, and missing (removed after the scan).
  write_bytes(dir.file("train/a/half.jpg"), {}, false);
  expect_loader_error(d, {"half.jpg", "empty file"});
  fs::remove(dir.file("train/a/half.jpg"));
  for (const Context* ctx : {&ctx1(), &ctx2()}) {
    Loader loader(*ctx, d, 2, false, false, image_folder_augment(false), 1);
    expect_error(
        [&] {
          loader.start_epoch(0);
          Batch b;
          while (loader.next(b)) {
          }
        },
        Status::io_error, {"half.jpg", "cannot open"});
  }

  // Corrupt entropy-coded data in the middle of the scan.
  std::vector<uint8_t> bad = good;
  for (size_t k = bad.size() / 2; k < bad.size() / 2 + 64; ++k) bad[k] = 0xFF;
  bad[bad.size() / 2 + 64] = 0x12;  // FF 12: not a valid marker
  write_bytes(dir.file("train/a/half.jpg"), bad, false);
  expect_loader_error(d, {"half.jpg", "corrupt or truncated JPEG"});

  // Repaired, it loads.
  write_bytes(dir.file("train/a/half.jpg"), good, false);
  Loader loader(ctx2(), d, 2, false, false, image_folder_augment(true), 1);
  EXPECT_EQ(run_epoch(loader, d, 0).all_labels, (std::vector<int32_t>{0, 0}));
}

TEST(ImageFolder, LoaderArguments) {
  TempDir dir;
  make_folder(dir);
  const Dataset d = load_image_folder(dir.str(), true, 32);
  expect_error([&] { Loader(ctx1(), d, 2, true, false, AugmentOptions{.pad = 2}, 1); }, Status::invalid_argument,
               {"pad", "file-backed"});
  AugmentOptions a = image_folder_augment(true);
  a.scale_min = 0;
  expect_error([&] { Loader(ctx1(), d, 2, true, false, a, 1); }, Status::invalid_argument, {"scale"});
  a = image_folder_augment(false);
  a.resize = 16;
  expect_error([&] { Loader(ctx1(), d, 2, true, false, a, 1); }, Status::invalid_argument, {"resize"});
  Dataset bad = d;
  bad.file_labels[3] = 3;
  expect_error([&] { Loader(ctx1(), bad, 2, true, false, {}, 1); }, Status::invalid_argument, {"file 3", "small.jpg"});
  // Labels are not bytes here: ImageNet has 1000 classes.
  Dataset many = file_dataset({d.files[0], d.files[1]}, 16);
  many.classes = 1000;
  many.file_labels = {999, 300};
  Loader wide(ctx1(), many, 2, false, false, image_folder_augment(false), 1);
  EXPECT_EQ(run_epoch(wide, many, 0).all_labels, (std::vector<int32_t>{999, 300}));
  const Dataset mem = toy_dataset(4, 3, 8, 8);
  expect_error([&] { Loader(ctx1(), mem, 2, true, false, image_folder_augment(true), 1); }, Status::invalid_argument,
               {"random_resized_crop", "file-backed"});
}

// ---- real data ----------------------------------------------------------------------------

std::vector<int> class_counts(const Dataset& d) {
  std::vector<int> n(size_t(d.classes), 0);
  for (uint8_t l : d.labels) ++n[l];
  return n;
}

TEST(RealData, FashionMnist) {
  if (!fs::exists("/usr/share/datasets/fashion-mnist")) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const Dataset train = load_dataset("fashion-mnist", "", true);
  const Dataset test = load_dataset("fashion-mnist", "", false);
  EXPECT_EQ(train.count, 60000);
  EXPECT_EQ(test.count, 10000);
  for (const Dataset* d : {&train, &test}) {
    EXPECT_EQ(d->classes, 10);
    EXPECT_EQ(d->channels, 1);
    EXPECT_EQ(d->height, 28);
    EXPECT_EQ(d->width, 28);
  }
  // Fashion-MNIST is balanced: 6000 / 1000 per class.
  for (int n : class_counts(train)) EXPECT_EQ(n, 6000);
  for (int n : class_counts(test)) EXPECT_EQ(n, 1000);
}

const char* shared_data() {
  const char* p = std::getenv("DFP_SHARED_DATA");
  return (p && *p && fs::is_directory(p)) ? p : nullptr;
}

TEST(RealData, Mnist) {
  const char* root = shared_data();
  if (!root || !fs::is_directory(fs::path(root) / "mnist")) GTEST_SKIP() << "DFP_SHARED_DATA/mnist not available";
  const std::string dir = (fs::path(root) / "mnist").string();
  const Dataset train = load_dataset("mnist", dir, true);
  const Dataset test = load_dataset("mnist", dir, false);
  EXPECT_EQ(train.count, 60000);
  EXPECT_EQ(test.count, 10000);
  EXPECT_EQ(train.height, 28);
  // Class counts documented in shared/data/README.md.
  const auto ntr = class_counts(train), nte = class_counts(test);
  EXPECT_EQ(ntr[0], 5923);
  EXPECT_EQ(ntr[1], 6742);
  EXPECT_EQ(ntr[2], 5958);
  EXPECT_EQ(nte[0], 980);
  EXPECT_EQ(nte[1], 1135);
  EXPECT_EQ(nte[2], 1032);

  // The loader on real data: one epoch of the test set with augmentation, every sample once.
  Loader loader(ctx2(), test, 128, true, false, AugmentOptions{.pad = 2, .mean = {0.1307f}, .stddev = {0.3081f}}, 1);
  loader.start_epoch(0);
  Batch b;
  int seen = 0, batches = 0;
  while (loader.next(b)) seen += b.size, ++batches;
  EXPECT_EQ(seen, 10000);
  EXPECT_EQ(batches, loader.batches_per_epoch());
  EXPECT_GE(loader.data_wait_seconds(), 0.0);
}

TEST(RealData, CifarPartial) {
  const char* root = shared_data();
  if (!root || !fs::is_directory(fs::path(root) / "cifar-10-partial"))
    GTEST_SKIP() << "DFP_SHARED_DATA/cifar-10-partial not available";
  const std::string dir = (fs::path(root) / "cifar-10-partial").string();
  const Dataset train = load_dataset("cifar10", dir, true);
  const Dataset test = load_dataset("cifar10", dir, false);
  EXPECT_EQ(train.count, 8068);
  EXPECT_EQ(test.count, 1017);
  EXPECT_EQ(train.channels, 3);
  EXPECT_EQ(train.height, 32);
  EXPECT_EQ(train.classes, 10);
  // Every class occurs in both splits.
  for (int n : class_counts(train)) EXPECT_GT(n, 0);
  for (int n : class_counts(test)) EXPECT_GT(n, 0);
}

}  // namespace
