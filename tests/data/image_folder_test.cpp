// Image folders of JPEGs encoded here: class discovery, labels and order, crop geometry, DCT
// scaling, grayscale and CMYK, determinism across thread counts, RandomResizedCrop, links that
// would loop or relabel, bad files, loader arguments.
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
using test::expect_error;
using test::Epoch;
using test::run_epoch;
using test::toy_dataset;

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

}  // namespace
