// Data pipeline: dataset readers on generated fixtures (exact round trips; truncated, corrupt and
// inconsistent files each rejected with a message naming the file and the record or field), the
// Loader (coverage, shuffling, determinism across thread counts, augmentation, normalisation,
// layout), and the real datasets when present. Image folders of JPEGs: image_folder_test.cpp.
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
#include "base/random.hpp"
#include "src/data/jpeg.hpp"
#include "tests/common/data_fixtures.hpp"
#include "tests/common/expect_error.hpp"

using namespace dfp;
namespace fs = std::filesystem;

namespace {

Context& ctx1() { return test::data_ctx1(); }
Context& ctx2() { return test::data_ctx2(); }
using TempDir = test::DataTempDir;
using test::write_bytes;

void put_be32(std::vector<uint8_t>& v, uint32_t x) {
  v.push_back(uint8_t(x >> 24));
  v.push_back(uint8_t(x >> 16));
  v.push_back(uint8_t(x >> 8));
  v.push_back(uint8_t(x));
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

using test::pixel_value;

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

using test::toy_dataset;
using test::Epoch;
using test::run_epoch;

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
  // `three`: a thread count of the loader's own (dfp train -j 3) on a one-thread context.
  Loader one(ctx1(), d, 16, true, false, aug, 99), two(ctx2(), d, 16, true, false, aug, 99),
      three(ctx1(), d, 16, true, false, aug, 99, 3);
  for (int epoch = 0; epoch < 2; ++epoch) {
    const Epoch e1 = run_epoch(one, d, epoch);
    for (Loader* other : {&two, &three}) {
      const Epoch e2 = run_epoch(*other, d, epoch);
      ASSERT_EQ(e1.raw.size(), e2.raw.size());
      for (size_t b = 0; b < e1.raw.size(); ++b) {
        ASSERT_EQ(std::memcmp(e1.raw[b].data(), e2.raw[b].data(), e1.raw[b].size() * sizeof(float)), 0) << b;
        ASSERT_EQ(e1.labels[b], e2.labels[b]);
      }
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
