// Writes the seed corpus of the fuzz targets (fuzz/corpus/<target>/) from dfp's own writers and
// the formats data.hpp documents: `fuzz_make_corpus DIR`. Each seed is small and valid (or
// nearly: a few seeds are the error cases the readers name), so that mutations start inside the
// formats' structure.
#include <turbojpeg.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dfp/model.hpp"
#include "dfp/trainer.hpp"
#include "src/io/checkpoint.hpp"
#include "src/train/run_files.hpp"
#include "src/io/torch_file.hpp"
#include "tests/common/torch_hostile.hpp"
#include "tests/common/torch_shapes.hpp"

namespace fs = std::filesystem;
using Bytes = std::string;

namespace {

void put(const fs::path& dir, const std::string& name, const Bytes& b) {
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary | std::ios::trunc).write(b.data(), std::streamsize(b.size()));
}

void be32(Bytes& v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(char(uint8_t(x >> s)));
}

Bytes gzip(const Bytes& in) {
  z_stream z{};
  deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  Bytes out(deflateBound(&z, uLong(in.size())) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = uInt(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = uInt(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// IDX images (count x rows x cols) and labels, as the fuzz_idx input: u32 split, images, labels.
Bytes idx_pair(int count, int rows, int cols, bool gz) {
  Bytes img, lbl;
  be32(img, 0x803);
  be32(img, uint32_t(count));
  be32(img, uint32_t(rows));
  be32(img, uint32_t(cols));
  for (int i = 0; i < count * rows * cols; ++i) img.push_back(char(uint8_t(i * 37)));
  be32(lbl, 0x801);
  be32(lbl, uint32_t(count));
  for (int i = 0; i < count; ++i) lbl.push_back(char(i % 10));
  if (gz) {
    img = gzip(img);
    lbl = gzip(lbl);
  }
  const uint32_t n = uint32_t(img.size());
  Bytes out(4, '\0');
  std::memcpy(out.data(), &n, 4);
  return out + img + lbl;
}

Bytes cifar(int records, int label_bytes) {
  Bytes b;
  for (int r = 0; r < records; ++r) {
    for (int l = 0; l < label_bytes; ++l) b.push_back(char(r % 10));
    for (int k = 0; k < 3072; ++k) b.push_back(char(uint8_t(k + r)));
  }
  return b;
}

Bytes jpeg(int w, int h, int pixel_format, int subsamp, int quality) {
  const int ps = tjPixelSize[pixel_format];
  std::vector<uint8_t> px(size_t(w) * h * ps);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < ps; ++c) px[(size_t(y) * w + x) * ps + c] = uint8_t(x * 7 + y * 3 + c * 50);
  tjhandle t = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  tjCompress2(t, px.data(), w, 0, h, pixel_format, &buf, &size, subsamp, quality, 0);
  Bytes out(reinterpret_cast<char*>(buf), size);
  tjFree(buf);
  tjDestroy(t);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_corpus DIR\n");
    return 2;
  }
  const fs::path root = argv[1];
  put(root / "fuzz_idx", "plain-3x4x5", idx_pair(3, 4, 5, false));
  put(root / "fuzz_idx", "gzip-3x4x5", idx_pair(3, 4, 5, true));
  put(root / "fuzz_idx", "plain-1x28x28", idx_pair(1, 28, 28, false));
  put(root / "fuzz_idx", "gzip-2x28x28", idx_pair(2, 28, 28, true));

  put(root / "fuzz_cifar", "cifar10-2", cifar(2, 1));
  put(root / "fuzz_cifar", "cifar100-1", cifar(1, 2));
  put(root / "fuzz_cifar", "cut", cifar(1, 1).substr(0, 100));

  put(root / "fuzz_jpeg", "rgb-420-40x30", jpeg(40, 30, TJPF_RGB, TJSAMP_420, 90));
  put(root / "fuzz_jpeg", "rgb-444-17x9", jpeg(17, 9, TJPF_RGB, TJSAMP_444, 75));
  put(root / "fuzz_jpeg", "gray-24x24", jpeg(24, 24, TJPF_GRAY, TJSAMP_GRAY, 80));
  put(root / "fuzz_jpeg", "cmyk-16x16", jpeg(16, 16, TJPF_CMYK, TJSAMP_444, 90));

  dfp::Checkpoint ck;
  ck.meta = {{"model", "lenet"}, {"epochs_done", "1"}, {"class_names", dfp::join_names({"cat", "dog,wolf"})}};
  ck.tensors["conv1.weight"] = {0.5f, -1.f, 2.f};
  ck.tensors["conv1.weight@momentum"] = {0.f, 0.f, 0.f};
  put(root / "fuzz_checkpoint", "small", dfp::checkpoint_bytes(ck));
  ck.tensors.clear();
  put(root / "fuzz_checkpoint", "meta-only", dfp::checkpoint_bytes(ck));
  // Meta bytes above 127 (UTF-8 names), as 128..255 and as older files hold them, -128..-1.
  ck.meta = {{"data", "/tmp/d\xc3\xa4t\xc3\xa4"}, {"class_names", dfp::join_names({"caf\xc3\xa9", "\xf0\x9f\x90\x88"})}};
  Bytes utf8 = dfp::checkpoint_bytes(ck);
  put(root / "fuzz_checkpoint", "meta-utf8", utf8);
  uint64_t meta_count;
  std::memcpy(&meta_count, utf8.data() + 16, 8);
  for (uint64_t i = 0; i < meta_count; ++i) {
    float v;
    std::memcpy(&v, utf8.data() + 24 + 4 * i, 4);
    if (v > 127.f) v -= 256.f;
    std::memcpy(utf8.data() + 24 + 4 * i, &v, 4);
  }
  const uint32_t crc = uint32_t(crc32_z(0L, reinterpret_cast<const Bytef*>(utf8.data()), utf8.size() - 4));
  std::memcpy(utf8.data() + utf8.size() - 4, &crc, 4);
  put(root / "fuzz_checkpoint", "meta-signed-bytes", utf8);

  {
    using dfp::torch_format::OutTensor;
    const float w[6] = {0.5f, -1.f, 2.f, 0.25f, -0.f, 3.5f};
    put(root / "fuzz_torch", "two-tensors",
        dfp::torch_format::torch_file_bytes({{"conv1.weight", {2, 1, 1, 3}, w, 0}, {"bn1.num_batches_tracked", {}, nullptr, 7}}));
    put(root / "fuzz_torch", "zip64", dfp::torch_format::torch_file_bytes({{"fc.bias", {6}, w, 0}}, true));
    put(root / "fuzz_torch", "empty-dict", dfp::torch_format::torch_file_bytes({}));
    // The shapes whose cost must not grow with the tensor count: views of one shared storage
    // (read once), many entries (found by name), and the same deflated.
    put(root / "fuzz_torch", "shared-storage", dfp::test::shared_storage_file(8, 4));
    put(root / "fuzz_torch", "shared-storage-deflated", dfp::test::deflated(dfp::test::shared_storage_file(8, 4)));
    put(root / "fuzz_torch", "many-entries", dfp::test::many_entries_file(120));
    for (const auto& h : dfp::test::hostile_torch_files())
      if (!h.bytes.empty()) put(root / "fuzz_torch", "hostile-" + h.name, h.bytes);
  }

  dfp::EpochMetrics em;
  em.epoch = 2;
  em.train_loss = 0.25;
  em.test_top1 = 91.5;
  em.lr = 0.1;
  dfp::LayerNumerics n;
  n.layer = "conv1";
  n.format = "int16";
  n.sampled = true;
  put(root / "fuzz_json", "metrics-line", dfp::metrics_line(em, "precision=int16 \"q\"\t\\", {n}));
  put(root / "fuzz_json", "values", "[true,false,null,-0.5e-3,\"\\u00e9\\ud83d\\ude00\",{\"a\":[]}]");
  dfp::run_files::ConfigRecord config;
  config.add_string("model", "lenet");
  config.add_literal("batch_size", "64");
  config.add_literal("lr", "0.05");
  config.add_literal("nesterov", "false");
  put(root / "fuzz_json", "config", dfp::run_files::to_text(config));
  dfp::run_files::ProfileRecord profile;
  profile.steps = 10;
  profile.step_seconds = 0.0673291;
  profile.layers = {{"conv1", "conv", "int16", "conv_s16 | a | b", 0.0115143, 0.00820382, 10}};
  put(root / "fuzz_json", "profile", dfp::run_files::to_text(profile));
  return 0;
}
