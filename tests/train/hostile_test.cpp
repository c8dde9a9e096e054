// Hostile but realistic use of `dfp train` and `dfp eval` through the library: data whose splits
// disagree, image folders with other class names, two runs or an earlier run in one output
// directory, interrupted checkpoint commits, failed checkpoint writes, diverged losses and
// checkpoints whose fields are out of range. Each is refused with a message naming the file, the
// field and what was expected, or handled so that no file is left half written. The fixtures are
// small IDX and JPEG datasets made here, so every test runs without the real datasets.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <turbojpeg.h>
#include <unistd.h>
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "dfp/context.hpp"
#include "dfp/models.hpp"
#include "dfp/state.hpp"
#include "dfp/status.hpp"
#include "dfp/torch_state.hpp"
#include "dfp/trainer.hpp"
#include "apps/dfp/report/report.hpp"
#include "src/io/checkpoint.hpp"
#include "src/train/run_files.hpp"
#include "dfp/run_lock.hpp"
#include "tests/common/expect_error.hpp"
#include "tests/common/files.hpp"
#include "tests/common/temp_dir.hpp"

using namespace dfp;
namespace fs = std::filesystem;

namespace {

class TempDir : public test::TempDir {
 public:
  TempDir() : test::TempDir("dfp_hostile_test_") {}
};

using test::lines_of;
using test::slurp;

void put_be32(std::string& v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(char(uint8_t(x >> s)));
}

// An MNIST-style directory: `train` 28x28 training images and `test` test images of side
// `test_side`, labels i % 10, pixels a pattern of the label (learnable).
void write_mnist(const std::string& dir, int train, int test, int test_side) {
  fs::create_directories(dir);
  auto write = [&](const std::string& prefix, int count, int side) {
    std::string img, lbl;
    put_be32(img, 0x803);
    put_be32(img, uint32_t(count));
    put_be32(img, uint32_t(side));
    put_be32(img, uint32_t(side));
    put_be32(lbl, 0x801);
    put_be32(lbl, uint32_t(count));
    for (int i = 0; i < count; ++i) {
      const int label = i % 10;
      for (int k = 0; k < side * side; ++k) img.push_back(char(uint8_t((k % side == label * side / 10) ? 220 : (i * 7 + k) % 40)));
      lbl.push_back(char(label));
    }
    std::ofstream(dir + "/" + prefix + "-images-idx3-ubyte", std::ios::binary) << img;
    std::ofstream(dir + "/" + prefix + "-labels-idx1-ubyte", std::ios::binary) << lbl;
  };
  write("train", train, 28);
  write("t10k", test, test_side);
}

TrainConfig mnist_config(const std::string& data, int epochs) {
  TrainConfig c;
  c.model = "lenet";
  c.dataset = "mnist";
  c.data = data;
  c.policy.precision = Precision::fp32;
  c.epochs = epochs;
  c.batch_size = 16;
  c.lr = 0.05f;
  c.threads = 2;
  return c;
}

// A 2-epoch MNIST run in dir/run stopped after its first epoch (a checkpoint and one metrics
// line); the returned config has stop_after reset, so that it runs on to the end.
TrainConfig interrupted_run(const TempDir& dir) {
  write_mnist(dir.str(), 64, 32, 28);
  TrainConfig c = mnist_config(dir.str(), 2);
  c.out = dir.file("run");
  c.stop_after = 1;
  train(c, nullptr);
  c.stop_after = 0;
  return c;
}

std::vector<uint8_t> jpeg_of(int w, int h, int seed) {
  std::vector<uint8_t> px;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      px.insert(px.end(), {uint8_t(x * 255 / w), uint8_t(y * 255 / h), uint8_t((x + y + seed * 40) % 256)});
  tjhandle t = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(tjCompress2(t, px.data(), w, 0, h, TJPF_RGB, &buf, &size, TJSAMP_420, 90, 0), 0) << tjGetErrorStr2(t);
  std::vector<uint8_t> out(buf, buf + size);
  tjFree(buf);
  tjDestroy(t);
  return out;
}

// dir/{train,val}/<class>/ with four JPEGs each.
void write_folder(const std::string& dir, const std::vector<std::string>& classes) {
  for (const char* split : {"train", "val"})
    for (size_t c = 0; c < classes.size(); ++c) {
      const fs::path folder = fs::path(dir) / split / classes[c];
      fs::create_directories(folder);
      for (int i = 0; i < 4; ++i) {
        const std::vector<uint8_t> j = jpeg_of(40 + 8 * i, 32, int(c) * 4 + i);
        std::ofstream(folder / ("img" + std::to_string(i) + ".jpg"), std::ios::binary)
            .write(reinterpret_cast<const char*>(j.data()), std::streamsize(j.size()));
      }
    }
}

std::vector<std::string> temporaries(const std::string& dir) {
  std::vector<std::string> t;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".tmp") t.push_back(e.path().filename().string());
  return t;
}

}  // namespace

// A test split of another image size: 14x14 crashed the evaluation, 40x40 evaluated misread data.
// Both are refused before training, naming the file and both shapes.
TEST(Hostile, TestImagesOfAnotherSizeAreRefused) {
  for (int side : {14, 40}) {
    TempDir dir;
    write_mnist(dir.str(), 64, 32, side);
    const std::string s = std::to_string(side);
    test::expect_error([&] { train(mnist_config(dir.str(), 1), nullptr); }, Status::invalid_argument,
                       {"t10k-images-idx3-ubyte", s + "x" + s, "train-images-idx3-ubyte", "28x28", "expected the test split"});
  }
}

// Evaluating a checkpoint on data of another shape names the shapes, not a "corrupt" checkpoint.
TEST(Hostile, EvalOnDataOfAnotherShapeNamesTheShapes) {
  TempDir dir, other;
  write_mnist(dir.str(), 64, 32, 28);
  TrainConfig c = mnist_config(dir.str(), 1);
  c.out = dir.file("run");
  train(c, nullptr);
  write_mnist(other.str(), 64, 32, 40);
  test::expect_error([&] { evaluate_checkpoint(c.out + "/checkpoint.dfp", other.str(), 2, nullptr); },
                     Status::invalid_argument,
                     {"checkpoint.dfp", "trained on 1 channel of 28x28 pixels", "40x40", "t10k-images-idx3-ubyte"});
}

// A run owns its output directory: a second run into a directory whose lock is held is refused
// with the holder's PID, and nothing of the second run is written there.
TEST(Hostile, SecondRunIntoALockedDirectoryIsRefused) {
  TempDir dir;
  write_mnist(dir.str(), 64, 32, 28);
  TrainConfig c = mnist_config(dir.str(), 1);
  c.out = dir.file("run");
  fs::create_directories(c.out);
  {
    const RunLock holder(c.out, "test");
    test::expect_error([&] { train(c, nullptr); }, Status::invalid_argument,
                       {"flag --out", c.out, "in use by another dfp run", "PID " + std::to_string(::getpid())});
    EXPECT_FALSE(fs::exists(c.out + "/config.json"));
    EXPECT_FALSE(fs::exists(c.out + "/metrics.jsonl"));
  }
  EXPECT_NO_THROW(train(c, nullptr));  // released with its holder
  // A lock held by another process: its PID is named.
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Raw system calls only: the parent is multi-threaded, so the child must not allocate.
    const int fd = ::open((c.out + "/dfp.lock").c_str(), O_RDWR | O_CREAT, 0666);
    if (fd < 0 || ::flock(fd, LOCK_EX | LOCK_NB) != 0) _exit(1);
    char pid[24];
    const int n = std::snprintf(pid, sizeof pid, "%d\n", int(getpid()));
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid, size_t(n), 0) != n) _exit(1);
    (void)!write(ready[1], "x", 1);
    pause();
    _exit(0);
  }
  close(ready[1]);  // a child that dies before writing makes read() return 0, not block
  ready[1] = -1;
  char x;
  ASSERT_EQ(read(ready[0], &x, 1), 1) << "the lock-holding child failed";
  c.overwrite = true;
  test::expect_error([&] { train(c, nullptr); }, Status::invalid_argument, {"PID " + std::to_string(child)});
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  close(ready[0]);
}

// An output directory that holds an earlier run is refused unless the run resumes it or says
// --overwrite; the refusal names the files found.
TEST(Hostile, EarlierRunIsReplacedOnlyWithOverwrite) {
  TempDir dir;
  write_mnist(dir.str(), 64, 32, 28);
  TrainConfig c = mnist_config(dir.str(), 1);
  c.out = dir.file("run");
  train(c, nullptr);
  const std::string before = slurp(c.out + "/checkpoint.dfp");
  c.seed = 2;
  test::expect_error([&] { train(c, nullptr); }, Status::invalid_argument,
                     {"holds an earlier run", "'checkpoint.dfp'", "--resume", "--overwrite"});
  EXPECT_EQ(slurp(c.out + "/checkpoint.dfp"), before);
  // Resuming another run's checkpoint does not make this directory's run its own.
  TrainConfig other = mnist_config(dir.str(), 2);
  other.out = dir.file("other");
  other.stop_after = 1;
  train(other, nullptr);
  other.resume = other.out + "/checkpoint.dfp";
  other.stop_after = 0;
  other.out = c.out;
  test::expect_error([&] { train(other, nullptr); }, Status::invalid_argument, {"holds an earlier run", "--overwrite"});
  EXPECT_EQ(slurp(c.out + "/checkpoint.dfp"), before);
  c.overwrite = true;
  train(c, nullptr);
  EXPECT_NE(slurp(c.out + "/checkpoint.dfp"), before);
  EXPECT_EQ(lines_of(c.out + "/metrics.jsonl").size(), 1u);
}

// The checkpoint records an image folder's class names; eval and resume on a folder with the same
// number of classes under other names are refused, naming the first class that differs.
TEST(Hostile, ClassNamesAreRecordedAndChecked) {
  TempDir dir;
  const std::string a = dir.file("a"), b = dir.file("b");
  write_folder(a, {"cat", "dog"});
  write_folder(b, {"cat", "emu"});
  TrainConfig c = mnist_config(a, 2);
  c.dataset = "imagenet-folder";
  c.image_size = 32;
  c.batch_size = 4;
  c.out = dir.file("run");
  c.stop_after = 1;
  train(c, nullptr);
  const std::string ck = c.out + "/checkpoint.dfp";
  EXPECT_EQ(read_checkpoint(ck).meta.at("class_names"), "cat,dog");
  EXPECT_NO_THROW(evaluate_checkpoint(ck, a, 2, nullptr));
  test::expect_error([&] { evaluate_checkpoint(ck, b, 2, nullptr); }, Status::invalid_argument,
                     {"checkpoint.dfp", "class 1", "'dog' in the checkpoint", "'emu'", b});
  c.data = b;
  c.stop_after = 0;
  c.resume = ck;
  test::expect_error([&] { train(c, nullptr); }, Status::invalid_argument, {"class 1", "'dog'", "'emu'"});
}

// A kill between the metrics line of an epoch and its checkpoint's rename leaves metrics.jsonl an
// epoch ahead of the checkpoint (here: the checkpoint of epoch 1 put back after epoch 2, and a
// line cut in the middle). The resumed run writes each epoch once, with the same fields as the
// uninterrupted run's lines.
TEST(Hostile, MetricsHoldEachEpochOnceAfterAnInterruptedCommit) {
  TempDir dir;
  write_mnist(dir.str(), 64, 32, 28);
  TrainConfig c = mnist_config(dir.str(), 3);
  c.numerics_interval = 3;
  c.policy.precision = Precision::int16;
  c.out = dir.file("whole");
  train(c, nullptr);
  c.out = dir.file("cut");
  c.stop_after = 1;
  train(c, nullptr);
  const std::string ck = c.out + "/checkpoint.dfp", metrics = c.out + "/metrics.jsonl";
  const std::string epoch1 = slurp(ck);
  c.resume = ck;
  c.stop_after = 2;
  train(c, nullptr);
  std::ofstream(ck, std::ios::binary | std::ios::trunc) << epoch1;          // the rename of epoch 2's never happened
  std::ofstream(metrics, std::ios::binary | std::ios::app) << "{\"epoch\":3,\"lr\":0.0";  // a cut line
  c.stop_after = 0;
  train(c, nullptr);
  const std::vector<std::string> whole = lines_of(dir.file("whole") + "/metrics.jsonl"), got = lines_of(metrics);
  ASSERT_EQ(got.size(), 3u) << slurp(metrics);
  for (size_t i = 0; i < got.size(); ++i) {
    const run_files::EpochRecord g = run_files::parse_epoch_line(got[i], metrics, int(i + 1));
    const run_files::EpochRecord w = run_files::parse_epoch_line(whole[i], "whole", int(i + 1));
    EXPECT_EQ(g.epoch, int(i + 1));
    EXPECT_EQ(g.train_loss, w.train_loss) << "epoch " << i + 1;
    // The same fields, per layer too.
    auto keys = [](const std::string& line) {
      std::string k;
      const nlohmann::ordered_json v = nlohmann::ordered_json::parse(line);
      for (const auto& [name, m] : v.items()) k += name + ",";
      for (const auto& l : v.at("layers"))
        for (const auto& [name, m] : l.items()) k += name + ",";
      return k;
    };
    EXPECT_EQ(keys(got[i]), keys(whole[i])) << "epoch " << i + 1;
  }
  EXPECT_EQ(slurp(ck), slurp(dir.file("whole") + "/checkpoint.dfp"));
}

// A checkpoint write that fails leaves no temporary file and the previous checkpoint as it was:
// the rename fails (checkpoint.dfp is a directory), or the disk is full (here: the file size limit).
TEST(Hostile, FailedCheckpointWriteLeavesNoTemporaryFile) {
  TempDir dir;
  Checkpoint ck;
  ck.meta["epochs_done"] = "1";
  ck.tensors["w"] = std::vector<float>(50000, 0.5f);
  const std::string path = dir.file("checkpoint.dfp");
  fs::create_directories(fs::path(path) / "in-the-way");
  test::expect_error([&] { write_checkpoint(path, ck); }, Status::io_error, {"checkpoint.dfp", "rename", "is kept"});
  EXPECT_TRUE(temporaries(dir.str()).empty());
  fs::remove_all(path);

  write_checkpoint(path, ck);
  const std::string good = slurp(path);
  ck.tensors["w"].resize(200000, 1.f);
  EXPECT_TRUE(test::fails_on_a_full_disk(300000, "write failed", [&] { write_checkpoint(path, ck); }));
  EXPECT_TRUE(temporaries(dir.str()).empty());
  EXPECT_EQ(slurp(path), good);
}

// The file is written as its records are made (small pieces gathered, a tensor over the 1 MiB
// chunk written directly) and holds exactly checkpoint_bytes(): the same records and CRC.
TEST(Hostile, StreamedCheckpointHoldsItsBytes) {
  TempDir dir;
  Checkpoint ck;
  ck.meta["epochs_done"] = "3";
  ck.tensors["a.small"] = {1.f, -2.f, 3.5f};
  ck.tensors["b.large"] = std::vector<float>(300000, 0.25f);  // 1.2 MB: past the chunk
  ck.tensors["b.large"][123456] = -7.f;
  ck.tensors["c.medium"] = std::vector<float>(200000, -1.f);  // 0.8 MB: gathered, then flushed
  ck.tensors["d.empty"] = {};
  const std::string path = dir.file("checkpoint.dfp");
  write_checkpoint(path, ck);
  const std::string bytes = slurp(path);
  EXPECT_EQ(bytes, checkpoint_bytes(ck));
  const Checkpoint back = parse_checkpoint(bytes, path);
  EXPECT_EQ(back.tensors, ck.tensors);
  EXPECT_EQ(back.meta.at("epochs_done"), "3");
  // A meta field the format cannot hold is refused before anything replaces the file, and no
  // temporary file stays.
  ck.meta["note"] = "two\nlines";
  test::expect_error([&] { write_checkpoint(path, ck); }, Status::invalid_argument, {"meta field 'note'"});
  EXPECT_TRUE(temporaries(dir.str()).empty());
  EXPECT_EQ(slurp(path), bytes);
}

// Borrowed tensors (the trainer's weights and momenta, read where they live) give the same file as
// owned ones, the two maps' records in one order of names; a name in both is refused before
// anything replaces the file.
TEST(Hostile, BorrowedCheckpointTensorsGiveTheOwnedBytes) {
  TempDir dir;
  Checkpoint owned;
  owned.meta["epochs_done"] = "2";
  owned.tensors["a"] = {1.f, 2.f};
  owned.tensors["b"] = std::vector<float>(300000, -0.5f);  // past the 1 MiB chunk
  owned.tensors["c"] = {3.f};
  owned.tensors["d"] = {};
  owned.tensors["e"] = {4.f, 5.f, 6.f};
  Checkpoint mixed;
  mixed.meta = owned.meta;
  for (const char* name : {"a", "c", "e"}) mixed.tensors[name] = owned.tensors.at(name);
  for (const char* name : {"b", "d"}) mixed.borrowed[name] = owned.tensors.at(name);
  const std::string path = dir.file("checkpoint.dfp");
  write_checkpoint(path, mixed);
  EXPECT_EQ(slurp(path), checkpoint_bytes(owned));
  EXPECT_EQ(parse_checkpoint(slurp(path), path).tensors, owned.tensors);
  Checkpoint all_borrowed;
  all_borrowed.meta = owned.meta;
  for (const auto& [name, v] : owned.tensors) all_borrowed.borrowed[name] = v;
  EXPECT_EQ(checkpoint_bytes(all_borrowed), checkpoint_bytes(owned));
  mixed.borrowed["c"] = owned.tensors.at("c");
  test::expect_error([&] { write_checkpoint(path, mixed); }, Status::invalid_argument,
                     {"checkpoint tensor 'c'", "given twice"});
  EXPECT_TRUE(temporaries(dir.str()).empty());
  EXPECT_EQ(slurp(path), checkpoint_bytes(owned));
}

// Temporary files of writers killed before their rename go when a run takes the directory; two
// writers never share a temporary name.
TEST(Hostile, LeftoverTemporaryFilesGoWhenARunTakesTheDirectory) {
  TempDir dir;
  TrainConfig c = interrupted_run(dir);
  std::ofstream(c.out + "/checkpoint.dfp.4242-0badcafe.tmp") << "half a checkpoint";
  std::ofstream(c.out + "/run.toml.4243-0badf00d.tmp") << "model = ";
  c.resume = c.out + "/checkpoint.dfp";
  train(c, nullptr);
  EXPECT_TRUE(temporaries(c.out).empty());
}

// Non-finite metrics (a diverged loss, an overflowing loss scale) are written as null: every line
// of metrics.jsonl is JSON, and the report reads the run.
TEST(Hostile, NonFiniteMetricsAreWrittenAsNull) {
  EpochMetrics em;
  em.epoch = 1;
  em.train_loss = std::nan("");
  em.test_loss = INFINITY;
  em.loss_scale = -INFINITY;
  em.lr = 0.1;
  em.epoch_seconds = 2;
  LayerNumerics n;
  n.layer = "conv1";
  n.format = "int16";
  n.sampled = true;
  n.sqnr_x_db = std::nan("");
  const std::string line = metrics_line(em, "precision=int16", {n});
  for (const char* bad : {"nan", "inf"}) EXPECT_EQ(line.find(bad), std::string::npos) << line;
  for (const char* want : {"\"train_loss\":null", "\"test_loss\":null", "\"loss_scale\":null", "\"sqnr_x_db\":null",
                           "\"lr\":0.1,"})
    EXPECT_NE(line.find(want), std::string::npos) << want << " in " << line;
  TempDir dir;
  std::ofstream(dir.file("config.json")) << "{\"model\":\"lenet\",\"epochs\":1}\n";
  std::ofstream(dir.file("metrics.jsonl")) << line << "\n";
  EXPECT_TRUE(std::isnan(read_run(dir.str()).final_train_loss));
}

// Checkpoint fields are range-checked where they are read: a message names the field and the range.
TEST(Hostile, CheckpointFieldsOutOfRangeAreNamed) {
  TempDir dir;
  TrainConfig c = interrupted_run(dir);
  const std::string path = c.out + "/checkpoint.dfp";
  const Checkpoint good = read_checkpoint(path);
  c.resume = dir.file("edited.dfp");
  c.out = dir.file("resumed");  // a copy's run goes to a directory of its own
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"epochs_done", "-1", "meta field 'epochs_done' is '-1'; expected an integer in 1..2"},
      {"epochs_done", "x", "meta field 'epochs_done' is 'x'"},
      {"step", "7", "meta field 'step' is '7'; expected an integer in 4..4"},
      {"height", "0", "meta field 'height' is '0'"},
  };
  for (const auto& [key, value, message] : cases) {
    Checkpoint ck = good;
    ck.meta[key] = value;
    write_checkpoint(c.resume, ck);
    test::expect_error([&] { train(c, nullptr); }, Status::corrupt_data, {"edited.dfp", message});
  }
  // A file of the magic and a CRC only is truncated, not a checksum mismatch.
  std::ofstream(c.resume, std::ios::binary | std::ios::trunc) << slurp(path).substr(0, 12);
  test::expect_error([&] { evaluate_checkpoint(c.resume, "", 2, nullptr); }, Status::corrupt_data,
                     {"edited.dfp", "truncated", "12 bytes"});
}

// A record name or meta key that appears twice is refused: a later copy never shadows the first.
TEST(Hostile, RepeatedCheckpointRecordsAreRefused) {
  Checkpoint ck;
  ck.meta["epochs_done"] = "1";
  ck.tensors["w"] = {1.f, 2.f};
  const std::string good = checkpoint_bytes(ck);
  EXPECT_NO_THROW(parse_checkpoint(good, "good.dfp"));
  // Append a second "w" record (and re-seal the CRC), and a second meta line with the same key.
  auto sealed = [](std::string body) {
    const uint32_t crc = uint32_t(crc32_z(0L, reinterpret_cast<const Bytef*>(body.data()), body.size()));
    body.append(reinterpret_cast<const char*>(&crc), 4);
    return body;
  };
  std::string twice = good.substr(0, good.size() - 4);
  const uint32_t len = 1;
  const uint64_t n = 1;
  const float v = 3.f;
  twice.append(reinterpret_cast<const char*>(&len), 4).append("w").append(reinterpret_cast<const char*>(&n), 8);
  twice.append(reinterpret_cast<const char*>(&v), 4);
  test::expect_error([&] { parse_checkpoint(sealed(twice), "twice.dfp"); }, Status::corrupt_data,
                     {"twice.dfp", "record #3 'w'", "repeats"});
  Checkpoint two_keys;
  two_keys.tensors["w"] = {1.f};
  std::string meta_twice = checkpoint_bytes(two_keys);
  meta_twice = meta_twice.substr(0, meta_twice.size() - 4);
  // The meta record is first: [u32 4]["meta"][u64 count][floats]; rebuild it with a repeated key.
  const std::string text = "a=1\na=2\n";
  std::string body(meta_twice.substr(0, 8));
  const uint32_t mlen = 4;
  const uint64_t mcount = text.size();
  body.append(reinterpret_cast<const char*>(&mlen), 4).append("meta").append(reinterpret_cast<const char*>(&mcount), 8);
  for (char ch : text) {
    const float f = float(static_cast<unsigned char>(ch));
    body.append(reinterpret_cast<const char*>(&f), 4);
  }
  const uint64_t old_count = *reinterpret_cast<const uint64_t*>(meta_twice.data() + 8 + 4 + 4);
  body += meta_twice.substr(8 + 4 + 4 + 8 + old_count * 4);
  test::expect_error([&] { parse_checkpoint(sealed(body), "keys.dfp"); }, Status::corrupt_data,
                     {"keys.dfp", "meta key 'a' appears twice"});
}

// Resuming a finished run says so and trains nothing.
TEST(Hostile, ResumeOfAFinishedRunSaysSo) {
  TempDir dir;
  write_mnist(dir.str(), 64, 32, 28);
  TrainConfig c = mnist_config(dir.str(), 1);
  c.out = dir.file("run");
  train(c, nullptr);
  c.resume = c.out + "/checkpoint.dfp";
  std::string log;
  EXPECT_TRUE(train(c, [&](const std::string& s) { log += s + "\n"; }).empty());
  EXPECT_NE(log.find("is of a finished run: all 1 epochs are done; nothing to train"), std::string::npos) << log;
  EXPECT_EQ(lines_of(c.out + "/metrics.jsonl").size(), 1u);
}

// A data path with a line break would split the checkpoint's meta line: refused up front.
TEST(Hostile, DataPathWithALineBreakIsRefused) {
  TrainConfig c = mnist_config("/tmp/a\nb", 1);
  test::expect_error([&] { train(c, nullptr); }, Status::invalid_argument, {"flag --data", "line breaks"});
  Checkpoint ck;
  ck.meta["data"] = "a\nb";
  test::expect_error([&] { checkpoint_bytes(ck); }, Status::invalid_argument, {"meta field 'data'"});
}

// A thread count far beyond any machine is a setting error, not an allocation failure.
TEST(Hostile, ThreadCountIsCapped) {
  TrainConfig c = mnist_config("/nonexistent-dfp-test-dir", 1);
  c.threads = 100000000;
  test::expect_error([&] { train(c, nullptr); }, Status::invalid_argument,
                     {"flag --threads", "at most 1024", "100000000"});
}

// Checkpoint meta values hold any bytes: a data path, class name or layer name in UTF-8 (bytes
// above 127) round-trips, and files written when such bytes were stored as -128..-1 read back as
// the same text. Other values are refused, naming the value.
TEST(Hostile, CheckpointMetaHoldsBytesAbove127) {
  Checkpoint ck;
  ck.meta["data"] = "/tmp/d\xc3\xa4t\xc3\xa4";
  ck.meta["class_names"] = join_names({"caf\xc3\xa9", "\xf0\x9f\x90\x88"});
  ck.meta["all"] = std::string("\x01\x7f\x80\xfe\xff", 5);
  ck.tensors["\xc3\xbcn\xc3\xaf.weight"] = {1.f, 2.f};
  const Checkpoint back = parse_checkpoint(checkpoint_bytes(ck), "utf8.dfp");
  EXPECT_EQ(back.meta, ck.meta);
  EXPECT_EQ(back.tensors, ck.tensors);
  // The meta record as older files hold it: each byte through a signed char.
  auto file_of_meta = [](const std::vector<float>& values) {
    std::string b(kCheckpointMagic, 8);
    const uint32_t len = 4;
    const uint64_t n = values.size();
    b.append(reinterpret_cast<const char*>(&len), 4).append("meta").append(reinterpret_cast<const char*>(&n), 8);
    b.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
    const uint32_t crc = uint32_t(crc32_z(0L, reinterpret_cast<const Bytef*>(b.data()), b.size()));
    return b.append(reinterpret_cast<const char*>(&crc), 4);
  };
  const std::string text = "data=/tmp/d\xc3\xa4t\xc3\xa4\n";
  std::vector<float> old;
  for (const char c : text) old.push_back(float(static_cast<signed char>(c)));
  ASSERT_LT(*std::min_element(old.begin(), old.end()), 0.f);
  EXPECT_EQ(parse_checkpoint(file_of_meta(old), "old.dfp").meta.at("data"), "/tmp/d\xc3\xa4t\xc3\xa4");
  for (const float bad : {-129.f, 256.f, 65.5f}) {
    std::vector<float> v = old;
    v[2] = bad;
    test::expect_error([&] { parse_checkpoint(file_of_meta(v), "bad.dfp"); }, Status::corrupt_data,
                       {"bad.dfp", "meta record value 2 (0-based)", "expected a byte"});
  }
}

// A run on data under a non-ASCII path evaluates from its checkpoint (which names the data).
TEST(Hostile, RunWithANonAsciiDataPathReadsItsCheckpoint) {
  TempDir dir;
  const std::string data = dir.file("d\xc3\xa4t\xc3\xa4");
  write_mnist(data, 64, 32, 28);
  TrainConfig c = mnist_config(data, 1);
  c.out = dir.file("run");
  train(c, nullptr);
  EXPECT_EQ(read_checkpoint(c.out + "/checkpoint.dfp").meta.at("data"), data);
  EXPECT_NO_THROW(evaluate_checkpoint(c.out + "/checkpoint.dfp", "", 2, nullptr));
}

// A checkpoint path that is no regular file is refused before anything is read from it: a
// device that never ends, a FIFO without a writer (no hang), a directory.
TEST(Hostile, CheckpointPathsThatAreNotFilesAreRefused) {
  TempDir dir;
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/dev/zero", "is a character device, not a regular file"},
      {dir.file("fifo"), "is a FIFO (named pipe), not a regular file"},
      {dir.str(), "is a directory"},
  };
  for (const auto& [path, says] : cases) {
    SCOPED_TRACE(path);
    test::expect_error([&] { read_checkpoint(path); }, Status::io_error,
                       {"checkpoint '" + path + "'", says, "expected a checkpoint file"});
    test::expect_error([&] { evaluate_checkpoint(path, "", 2, nullptr); }, Status::io_error, {path, says});
  }
  // A large file of something else is refused by its first bytes.
  std::ofstream(dir.file("big.bin"), std::ios::binary) << std::string(1 << 20, 'x');
  test::expect_error([&] { read_checkpoint(dir.file("big.bin")); }, Status::corrupt_data,
                     {"big.bin", "not a dfp checkpoint (expected magic DFPCKPT1 at offset 0)"});
}

// --init-from errors say the flag and what kind of file failed: a weights file that cannot be
// opened or is not a file, a damaged torch file, a damaged dfp checkpoint, and weights that are
// not finite (refused at load, with the tensor and the index, not later as a diverged loss).
// Nothing is written for a refused run.
TEST(Hostile, InitFromErrorsNameTheFlagAndTheFile) {
  TempDir dir;
  write_mnist(dir.str(), 64, 32, 28);
  TrainConfig c = mnist_config(dir.str(), 1);
  c.out = dir.file("run");
  Context ctx(ContextOptions{.threads = 2});
  Model lenet(ctx, "lenet");
  build_model(lenet, "lenet", 1, 28, 28, 10);
  lenet.build(16, PrecisionPolicy{});
  save_torch_state_dict(lenet, dir.file("good.pt"));
  save_state(lenet, dir.file("good.dfp"));
  std::ofstream(dir.file("cut.pt"), std::ios::binary) << slurp(dir.file("good.pt")).substr(0, 200);
  std::ofstream(dir.file("cut.dfp"), std::ios::binary) << slurp(dir.file("good.dfp")).substr(0, 100);
  // A NaN in the torch file's conv2.weight at index 7, a -Inf in the dfp file's fc.bias at 3.
  lenet.tensor("conv2.weight").data[7] = std::nanf("");
  save_torch_state_dict(lenet, dir.file("nan.pt"));
  lenet.tensor("conv2.weight").data[7] = 0.f;
  lenet.tensor("fc.bias").data[3] = -INFINITY;
  save_state(lenet, dir.file("inf.dfp"));
  const std::vector<std::tuple<std::string, Status, std::vector<std::string>>> cases = {
      {"absent.pt", Status::io_error, {"flag --init-from: weights file '", "absent.pt': cannot open", "torch.save"}},
      {"", Status::io_error, {"flag --init-from: weights file '", "is a directory"}},
      {"cut.pt", Status::corrupt_data, {"flag --init-from: torch file '", "cut.pt'"}},
      {"cut.dfp", Status::corrupt_data, {"flag --init-from: checkpoint '", "cut.dfp': truncated"}},
      {"nan.pt", Status::numerical_error,
       {"flag --init-from: torch file '", "nan.pt': tensor 'conv2.weight' holds NaN at index 7", "expected finite"}},
      {"inf.dfp", Status::numerical_error,
       {"flag --init-from: dfp checkpoint '", "inf.dfp': tensor 'fc.bias' holds -Inf at index 3"}},
  };
  for (const auto& [file, status, says] : cases) {
    SCOPED_TRACE(file);
    c.init_from = file.empty() ? dir.str() : dir.file(file);
    test::expect_error([&] { train(c, nullptr); }, status, says);
    EXPECT_FALSE(fs::exists(c.out));
  }
  c.init_from = dir.file("good.pt");
  EXPECT_NO_THROW(train(c, nullptr));
}

// A run stopped in its first epoch (Ctrl-C through the stop check, a signal, a data error) leaves
// config.json and metrics.jsonl but no checkpoint: the plain retry takes the directory over and
// says so. A directory with the metrics of more than one epoch and no checkpoint is refused
// without suggesting a --resume of a checkpoint that is not there.
TEST(Hostile, RunStoppedInItsFirstEpochIsTakenOverByTheRetry) {
  TempDir dir;
  write_mnist(dir.str(), 64, 32, 28);
  TrainConfig c = mnist_config(dir.str(), 1);
  c.out = dir.file("run");
  EXPECT_TRUE(train(c, nullptr, {}, [] { return true; }).empty());
  ASSERT_TRUE(fs::exists(c.out + "/config.json"));
  ASSERT_TRUE(fs::exists(c.out + "/metrics.jsonl"));
  ASSERT_FALSE(fs::exists(c.out + "/checkpoint.dfp"));
  EXPECT_FALSE(holds_run(c.out));
  std::string log;
  EXPECT_EQ(train(c, [&](const std::string& s) { log += s + "\n"; }).size(), 1u);
  EXPECT_NE(log.find("of a run that finished no epoch (no checkpoint); this run takes it over"), std::string::npos) << log;
  EXPECT_TRUE(fs::exists(c.out + "/checkpoint.dfp"));
  EXPECT_EQ(lines_of(c.out + "/metrics.jsonl").size(), 1u);
  EXPECT_TRUE(holds_run(c.out));

  // The metrics of two epochs without their checkpoint: a run's record, which only --overwrite replaces.
  TrainConfig two = mnist_config(dir.str(), 2);
  two.out = dir.file("two");
  train(two, nullptr);
  fs::remove(two.out + "/checkpoint.dfp");
  ASSERT_EQ(lines_of(two.out + "/metrics.jsonl").size(), 2u);
  EXPECT_TRUE(holds_run(two.out));
  try {
    train(two, nullptr);
    ADD_FAILURE() << "a directory with two epochs' metrics was taken over";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("holds an earlier run"), std::string::npos) << what;
    EXPECT_NE(what.find("no checkpoint to resume"), std::string::npos) << what;
    EXPECT_EQ(what.find("--resume"), std::string::npos) << what;
    EXPECT_NE(what.find("--overwrite"), std::string::npos) << what;
  }
}

// --resume with a larger --epochs extends a run: the epochs after the checkpoint's are trained,
// metrics.jsonl keeps the earlier ones, the log says what it means for the schedule, and the
// checkpoint and config.json record the plan, so that the extended run, interrupted and resumed
// with the same --epochs, gives the checkpoint of the uninterrupted extension. A smaller
// --epochs is refused.
TEST(Hostile, ResumeWithMoreEpochsExtendsTheRun) {
  TempDir dir;
  write_mnist(dir.str(), 64, 32, 28);
  TrainConfig c = mnist_config(dir.str(), 1);
  c.out = dir.file("run");
  train(c, nullptr);
  c.epochs = 2;
  c.resume = c.out + "/checkpoint.dfp";
  std::string log;
  const std::vector<EpochMetrics> more = train(c, [&](const std::string& s) { log += s + "\n"; });
  ASSERT_EQ(more.size(), 1u);
  EXPECT_EQ(more[0].epoch, 2);
  EXPECT_NE(log.find("extending the run of 1 epochs to 2 (--epochs 2): the cosine schedule now spans 2 epochs"),
            std::string::npos) << log;
  const std::vector<std::string> lines = lines_of(c.out + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(run_files::parse_epoch_line(lines[0], "metrics", 1).epoch, 1);
  EXPECT_EQ(run_files::parse_epoch_line(lines[1], "metrics", 2).epoch, 2);
  const Checkpoint ck = read_checkpoint(c.out + "/checkpoint.dfp");
  EXPECT_EQ(ck.meta.at("epochs"), "2");
  EXPECT_EQ(ck.meta.at("epochs_done"), "2");
  EXPECT_EQ(ck.meta.at("epochs_plan"), "0:1,1:2");
  EXPECT_NE(slurp(c.out + "/config.json").find("\"epochs_plan\":\"0:1,1:2\""), std::string::npos);
  log.clear();
  EXPECT_TRUE(train(c, [&](const std::string& s) { log += s + "\n"; }).empty());  // the same --epochs: nothing to do
  EXPECT_NE(log.find("all 2 epochs are done; nothing to train"), std::string::npos) << log;
  c.epochs = 1;
  test::expect_error([&] { train(c, nullptr); }, Status::invalid_argument,
                     {"flag --epochs 1", "is of a run of 2 epochs (2 done)", "never shortens"});

  // Extended to 3 epochs in one go, or stopped after epoch 2 and resumed: the same checkpoint.
  TrainConfig a = mnist_config(dir.str(), 1), b = a;
  a.out = dir.file("a");
  b.out = dir.file("b");
  for (TrainConfig* r : {&a, &b}) {
    train(*r, nullptr);
    r->epochs = 3;
    r->resume = r->out + "/checkpoint.dfp";
  }
  train(a, nullptr);
  b.stop_after = 2;
  train(b, nullptr);
  b.stop_after = 0;
  log.clear();
  train(b, [&](const std::string& s) { log += s + "\n"; });
  EXPECT_EQ(log.find("extending"), std::string::npos) << log;  // the checkpoint's run has 3 epochs now
  const Checkpoint ca = read_checkpoint(a.out + "/checkpoint.dfp"), cb = read_checkpoint(b.out + "/checkpoint.dfp");
  EXPECT_EQ(ca.tensors, cb.tensors);
  EXPECT_EQ(ca.meta.at("epochs_plan"), "0:1,1:3");
  EXPECT_EQ(cb.meta.at("epochs_plan"), "0:1,1:3");
  EXPECT_EQ(lines_of(b.out + "/metrics.jsonl").size(), 3u);
}
