// torch.save files without torch: the zip container, the strict pickle reader and the writer
// (src/train/torch_*.cpp). Files written by PyTorch at test time (skipped without it) read back to
// their values; files dfp writes load in PyTorch; hostile files are refused with errors that name
// the file and the fault, and no truncation or corrupted byte crashes the reader.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "dfp/float16.hpp"
#include "dfp/status.hpp"
#include "src/io/torch_file.hpp"
#include "tests/common/expect_error.hpp"
#include "tests/common/files.hpp"
#include "tests/common/python_torch.hpp"
#include "tests/common/temp_dir.hpp"
#include "tests/common/torch_hostile.hpp"
#include "tests/common/torch_shapes.hpp"

namespace dfp {
namespace {

using torch_format::OutTensor;
using torch_format::TensorRecord;
using torch_format::TorchFile;

// name -> (shape, values) of every tensor of a file.
std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> contents(const TorchFile& f) {
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> out;
  for (const TensorRecord& t : f.tensors()) {
    std::vector<float> v(t.numel);
    f.read(t, v.data());
    out[t.name] = {t.shape, v};
  }
  return out;
}

// w[i][j] = (4i + j) / 4 - 1: exact in float16 and bfloat16 too.
std::vector<float> w34() {
  std::vector<float> w(12);
  for (int i = 0; i < 12; ++i) w[i] = float(i) * 0.25f - 1.f;
  return w;
}

TEST(TorchFormat, WrittenFilesReadBack) {
  const std::vector<float> w = w34();
  const std::vector<float> scalar = {2.5f};
  for (const bool zip64 : {false, true}) {
    const std::string bytes = torch_format::torch_file_bytes(
        {{"a", {3, 4}, w.data(), 0}, {"n", {}, nullptr, 7}, {"s", {}, scalar.data(), 0}, {"e", {0, 3}, w.data(), 0}},
        zip64);
    EXPECT_EQ(bytes.find("PK\x06\x06") != std::string::npos, zip64);  // the ZIP64 end record
    const TorchFile f = TorchFile::parse(bytes, "written");
    ASSERT_EQ(f.tensors().size(), 4u);
    EXPECT_EQ(f.tensors()[0].name, "a");  // the order written
    EXPECT_EQ(f.dtype(f.tensors()[1]), torch_format::Dtype::int64);
    auto c = contents(f);
    EXPECT_EQ(c["a"].first, (std::vector<int64_t>{3, 4}));
    EXPECT_EQ(c["a"].second, w);
    EXPECT_EQ(c["n"].first, std::vector<int64_t>{});
    EXPECT_EQ(c["n"].second, std::vector<float>{7.f});
    EXPECT_EQ(c["s"].second, scalar);
    EXPECT_TRUE(c["e"].second.empty());
  }
}

// Each hostile file of tests/common/torch_hostile.hpp (also the fuzz target's seeds) is refused
// with its status, naming the file and what is wrong.
TEST(TorchFormat, HostileFilesAreRefusedClearly) {
  for (const test::HostileTorchFile& h : test::hostile_torch_files()) {
    SCOPED_TRACE(h.name);
    std::vector<std::string> says = h.says;
    says.push_back("hostile-" + h.name);
    test::expect_error([&] { contents(TorchFile::parse(h.bytes, "hostile-" + h.name)); }, h.status, says);
  }
}

// Every prefix of a valid file is an error (its end record is gone). Every byte flipped is an error
// naming the file, or reads the same tensors (a byte nothing depends on: padding, a time stamp):
// the pickle and the values are CRC-checked, every size and offset bounds-checked.
TEST(TorchFormat, TruncationsAndFlippedBytesAreErrorsNotCrashes) {
  const std::vector<float> w = w34();
  const std::string good = torch_format::torch_file_bytes({{"a", {3, 4}, w.data(), 0}, {"n", {}, nullptr, 7}});
  for (size_t n = 0; n < good.size(); ++n)
    EXPECT_THROW(contents(TorchFile::parse(std::string_view(good).substr(0, n), "cut")), Error) << n;
  const auto want = contents(TorchFile::parse(good, "good"));
  for (size_t i = 0; i < good.size(); ++i) {
    std::string b = good;
    b[i] ^= 0x5A;
    try {
      EXPECT_EQ(contents(TorchFile::parse(b, "flipped")), want) << "byte " << i;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'flipped'"), std::string::npos) << e.what();
    }
  }
}

TEST(TorchFormat, FilesThatCannotBeReadAreNamed) {
  const test::TempDir dir("dfp_torch_format_");
  test::expect_error([&] { TorchFile::open(dir.file("absent.pt")); }, Status::io_error, {"absent.pt", "cannot open"});
  test::expect_error([&] { TorchFile::open(dir.str()); }, Status::io_error, {dir.str(), "not a regular file"});
  // A device is refused before a byte is read, and a FIFO without a writer does not block.
  test::expect_error([&] { TorchFile::open("/dev/zero"); }, Status::io_error,
                     {"torch file '/dev/zero'", "not a regular file"});
  ASSERT_EQ(::mkfifo(dir.file("fifo.pt").c_str(), 0600), 0);
  test::expect_error([&] { TorchFile::open(dir.file("fifo.pt")); }, Status::io_error,
                     {"torch file '" + dir.file("fifo.pt") + "'", "not a regular file"});
}

// Tensors that view one storage (as torch.save writes views of one flat buffer) read the
// storage's entry once: the bytes read are the storage's, not the storage's per tensor. Stored
// and deflated alike; the values are the views'.
TEST(TorchFormat, SharedStorageIsReadOnce) {
  const size_t tensors = 64;
  const uint64_t numel = 256;
  const std::string stored = test::shared_storage_file(tensors, numel);
  for (const std::string& bytes : {stored, test::deflated(stored)}) {
    const TorchFile f = TorchFile::parse(bytes, "shared");
    ASSERT_EQ(f.tensors().size(), tensors);
    auto c = contents(f);
    EXPECT_EQ(f.storage_bytes_read(), tensors * numel * sizeof(float));
    for (size_t i = 0; i < tensors; ++i) {
      const auto& v = c["t" + std::to_string(i)].second;
      ASSERT_EQ(v.size(), numel);
      EXPECT_EQ(v.front(), float(i * numel) * 0.5f);
      EXPECT_EQ(v.back(), float(i * numel + numel - 1) * 0.5f);
    }
    // Read again, the tensors read the storage again (its bytes are not held past their last view).
    contents(f);
    EXPECT_EQ(f.storage_bytes_read(), 2 * tensors * numel * sizeof(float));
  }
}

// An archive of 20,000 entries: every storage is found by name (a hash lookup: a walk of the
// directory per storage would take 20,000 x 20,000 name comparisons) and reads its own value.
TEST(TorchFormat, ManyEntriesAreFoundByName) {
  const size_t n = 20000;
  const std::string bytes = test::many_entries_file(n);
  const TorchFile f = TorchFile::parse(bytes, "many");
  ASSERT_EQ(f.tensors().size(), n);
  float v = -1.f;
  for (size_t i = 0; i < n; ++i) {
    const TensorRecord& t = f.tensors()[i];
    ASSERT_EQ(t.name, "s" + std::to_string(i));
    f.read(t, &v);
    ASSERT_EQ(v, float(i));
  }
  EXPECT_EQ(f.storage_bytes_read(), n * sizeof(float));
}

// Names from the file appear in messages as valid UTF-8: other bytes as \xNN. A state_dict key
// that is not UTF-8 (Python writes every str as UTF-8) is refused, naming the file and the key.
TEST(TorchFormat, KeysThatAreNotUtf8AreRefusedEscaped) {
  using namespace std::string_literals;
  test::expect_error([&] { TorchFile::parse(test::torch_archive(test::torch_pickle("X\x02\0\0\0w\xff"s + test::torch_tensor_pickle())), "bad-key"); },
                     Status::corrupt_data, {"torch file 'bad-key'", "state_dict key 'w\\xff' is not valid UTF-8"});
  // A valid UTF-8 key reads as it is.
  const std::string utf8 = test::torch_archive(test::torch_pickle("X\x03\0\0\0\xc3\xbcw"s + test::torch_tensor_pickle()));
  const TorchFile f = TorchFile::parse(utf8, "utf8");
  EXPECT_EQ(f.tensors().at(0).name, "\xc3\xbcw");
  EXPECT_EQ(torch_format::printable("a\xc3\xbc\xff\n\xed\xa0\x80"), "a\xc3\xbc\\xff\\x0a\\xed\\xa0\\x80");
  EXPECT_TRUE(torch_format::valid_utf8("\xf0\x9f\x98\x80"));
  EXPECT_FALSE(torch_format::valid_utf8("\xc0\x80"));  // overlong
}

// A training checkpoint (a dict of the state_dict and other things) is refused with the keys it
// holds and what to save instead, both where its other things are data dfp reads (ints, dicts)
// and where they are not (a list, a float: refused at their opcode).
TEST(TorchFormat, TrainingCheckpointsAreRefusedWithTheHint) {
  using namespace std::string_literals;
  auto text = [](const std::string& s) { return "X"s + char(s.size()) + "\0\0\0"s + s; };
  const std::string sd = "ccollections\nOrderedDict\n)R(" + text("w") + test::torch_tensor_pickle() + "u";
  // {'epoch': 3, 'model': state_dict}
  const std::string dict_only = "\x80\x02}(" + text("epoch") + "K\x03" + text("model") + sd + "u.";
  test::expect_error([&] { contents(TorchFile::parse(test::torch_archive(dict_only), "ck.pt")); }, Status::unsupported,
                     {"torch file 'ck.pt'", "'epoch' is an int (a training checkpoint", "the keys 'epoch', 'model'",
                      "torch.save(model.state_dict(), path)", "torch.save(checkpoint['model'], path)"});
  // {'model': state_dict, 'optimizer': {'param_groups': [...]}}: refused at the list's opcode.
  const std::string with_list = "\x80\x02}(" + text("model") + sd + text("optimizer") + "}(" + text("param_groups") + "]";
  test::expect_error([&] { contents(TorchFile::parse(test::torch_archive(with_list + "u.u."), "opt.pt")); },
                     Status::unsupported,
                     {"torch file 'opt.pt'", "opcode 0x5d", "the keys 'model', 'optimizer'",
                      "torch.save(model.state_dict(), path)", "torch.save(checkpoint['model'], path)"});
}

// PyTorch reads dfp's files (plain and ZIP64), and dfp reads PyTorch's: float32, float16,
// bfloat16, int64, a Parameter, views (transposed, offset), pickle protocol 4, deflated entries,
// a module's state_dict with its _metadata.
TEST(TorchFormat, PyTorchReadsDfpFilesAndDfpReadsPyTorchFiles) {
  if (!test::torch_python_missing().empty()) GTEST_SKIP() << test::torch_python_missing();
  const test::TempDir dir("dfp_torch_format_");
  const std::vector<float> w = w34();
  for (const bool zip64 : {false, true}) {
    const std::string bytes = torch_format::torch_file_bytes({{"a", {3, 4}, w.data(), 0}, {"n", {}, nullptr, 7}}, zip64);
    std::ofstream(dir.file(zip64 ? "dfp64.pt" : "dfp.pt"), std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  }
  ASSERT_TRUE(test::run_torch_python(dir.str(), "fixtures", R"(
import collections, sys, zipfile
import torch.nn as nn
d = sys.argv[1]
w = torch.arange(12, dtype=torch.float32).reshape(3, 4) * 0.25 - 1
for name in ('dfp.pt', 'dfp64.pt'):
    sd = torch.load(f'{d}/{name}')
    assert list(sd) == ['a', 'n'], list(sd)
    assert torch.equal(sd['a'], w), sd['a']
    assert sd['n'].dtype == torch.int64 and sd['n'].shape == () and sd['n'].item() == 7, sd['n']
sd = collections.OrderedDict(f32=w, f16=w.half(), bf16=w.bfloat16(), t=w.t(), row=w[1], n=torch.tensor(5),
                             p=nn.Parameter(w.clone()), s=torch.tensor(2.5))
torch.save(sd, f'{d}/torch.pt')
torch.save(sd, f'{d}/torch4.pt', pickle_protocol=4)
with zipfile.ZipFile(f'{d}/torch.pt') as src, zipfile.ZipFile(f'{d}/deflated.pt', 'w', zipfile.ZIP_DEFLATED) as dst:
    for i in src.infolist():
        dst.writestr(i.filename, src.read(i.filename))
m = nn.Sequential(nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3))
torch.save(m.state_dict(), f'{d}/module.pt')
)"));
  for (const char* name : {"torch.pt", "torch4.pt", "deflated.pt"}) {
    SCOPED_TRACE(name);
    const TorchFile f = TorchFile::open(dir.file(name));
    auto c = contents(f);
    ASSERT_EQ(c.size(), 8u);
    EXPECT_EQ(f.tensors()[1].name, "f16");  // the file's order
    EXPECT_EQ(f.dtype(f.tensors()[1]), torch_format::Dtype::float16);
    EXPECT_EQ(f.dtype(f.tensors()[2]), torch_format::Dtype::bfloat16);
    for (const char* same : {"f32", "f16", "bf16", "p"}) {
      EXPECT_EQ(c[same].first, (std::vector<int64_t>{3, 4})) << same;
      EXPECT_EQ(c[same].second, w) << same;
    }
    EXPECT_EQ(c["t"].first, (std::vector<int64_t>{4, 3}));
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j) EXPECT_EQ(c["t"].second[size_t(j * 3 + i)], w[size_t(i * 4 + j)]);
    EXPECT_EQ(c["row"].second, std::vector<float>(w.begin() + 4, w.begin() + 8));
    EXPECT_EQ(c["n"].second, std::vector<float>{5.f});
    EXPECT_EQ(c["s"].first, std::vector<int64_t>{});
    EXPECT_EQ(c["s"].second, std::vector<float>{2.5f});
  }
  auto m = contents(TorchFile::open(dir.file("module.pt")));
  ASSERT_EQ(m.size(), 7u);
  EXPECT_EQ(m["0.weight"].first, (std::vector<int64_t>{3, 2, 1, 1}));
  EXPECT_EQ(m["1.running_var"].second, std::vector<float>(3, 1.f));
  EXPECT_EQ(m["1.num_batches_tracked"].second, std::vector<float>{0.f});
}

}  // namespace
}  // namespace dfp
