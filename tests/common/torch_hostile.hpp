// Hostile torch.save files, each built from a valid one with one thing wrong, and what the reader
// must say about it: tests/train/torch_format_test.cpp checks the errors, fuzz/make_corpus.cpp
// writes them as seeds of fuzz/corpus/fuzz_torch.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dfp/status.hpp"
#include "src/io/torch_file.hpp"
#include "src/io/torch_zip.hpp"
#include "tests/common/torch_shapes.hpp"

namespace dfp::test {

struct HostileTorchFile {
  std::string name;
  std::string bytes;
  Status status;
  std::vector<std::string> says;  // what the message must name
};

// An archive of `pickle` as archive/data.pkl, a storage archive/data/0 of six float32 values,
// the version record and `extra` entries.
inline std::string torch_archive(const std::string& pickle, std::vector<std::pair<std::string, std::string>> extra = {}) {
  torch_format::ZipWriter zip;
  zip.add("archive/data.pkl", pickle);
  const float values[6] = {1.f, 2.f, 3.f, 4.f, 5.f, 6.f};
  zip.add("archive/data/0", std::string(reinterpret_cast<const char*>(values), sizeof values));
  zip.add("archive/version", "3\n");
  for (const auto& [name, data] : extra) zip.add(name, data);
  return zip.finish();
}

// The pickle expression of a tensor viewing storage ('storage', FloatStorage, "0", "cpu", numel)
// from `offset` with `size` and `stride` (pickled tuples).
inline std::string torch_tensor_pickle(uint64_t numel = 6, const std::string& size = "K\x06\x85", uint64_t offset = 0,
                                       const std::string& stride = "K\x01\x85") {
  using namespace std::string_literals;
  auto integer = [](uint64_t v) {
    std::string o = "\x8a\x08";
    for (int k = 0; k < 8; ++k) o += char(v >> (8 * k) & 0xFF);
    return o;
  };
  return "ctorch._utils\n_rebuild_tensor_v2\n((X\x07\0\0\0storagectorch\nFloatStorage\nX\x01\0\0\0"
         "0X\x03\0\0\0cpu"s + integer(numel) + "tQ" + integer(offset) + size + stride + "\x89"
         "ccollections\nOrderedDict\n)RtR";
}

// The pickle of an OrderedDict with `items` (pickled keys and values, e.g. a key 'w' and a
// tensor), `before` after the protocol.
inline std::string torch_pickle(const std::string& items = std::string("X\x01\0\0\0w", 6) + torch_tensor_pickle(),
                                const std::string& before = "") {
  using namespace std::string_literals;
  return "\x80\x02"s + before + "ccollections\nOrderedDict\n)R(" + items + "u.";
}

inline std::vector<HostileTorchFile> hostile_torch_files() {
  using namespace std::string_literals;
  using S = Status;
  const std::string w = "X\x01\0\0\0w"s;
  std::vector<HostileTorchFile> c;
  const std::string good = torch_archive(torch_pickle());
  auto patched = [&](size_t at, const std::string& bytes) {  // `good` with bytes replaced at `at`
    std::string b = good;
    b.replace(at, bytes.size(), bytes);
    return b;
  };
  const size_t end = good.size() - 22;          // the end-of-directory record
  const size_t pkl = good.find("PK\x01\x02");  // the central directory entry of archive/data.pkl
  c.push_back({"empty", "", S::corrupt_data, {"empty"}});
  c.push_back({"legacy-pickle", "\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"s, S::unsupported,
               {"legacy format", "torch >= 1.6"}});
  c.push_back({"not-zip", "not a torch file at all, just text", S::corrupt_data, {"does not start as a zip archive"}});
  c.push_back({"cut-in-half", good.substr(0, good.size() / 2), S::corrupt_data, {"no zip end-of-directory record"}});
  c.push_back({"entry-count", patched(end + 8, "\xfe\xff\xfe\xff"), S::corrupt_data, {"65534 entries"}});
  c.push_back({"directory-offset", patched(end + 16, "\0\0\0\x7f"s), S::corrupt_data,
               {"central directory", "outside the file"}});
  // data.pkl declares 1 MiB stored, 32 MiB deflated from 16 bytes, a local header past the end.
  c.push_back({"huge-size", patched(pkl + 20, "\0\0\x10\0\0\0\x10\0"s), S::corrupt_data,
               {"archive/data.pkl", "run past the file's end"}});
  std::string bomb = patched(pkl + 20, "\x10\0\0\0\0\0\0\x02"s);
  bomb[pkl + 10] = 8;
  c.push_back({"deflate-bomb", bomb, S::corrupt_data, {"archive/data.pkl", "deflate cannot expand that much"}});
  c.push_back({"local-offset", patched(pkl + 42, "\xff\xff\xff\x7f"), S::corrupt_data,
               {"local header of entry 'archive/data.pkl'", "truncated"}});
  c.push_back({"crc", patched(64 + 10, "\xff"), S::corrupt_data, {"archive/data.pkl", "CRC-32 mismatch"}});
  c.push_back({"opcode", torch_archive(torch_pickle(w + torch_tensor_pickle(), "G")), S::unsupported,
               {"opcode 0x47 ('G')", "refused"}});
  c.push_back({"global", torch_archive(torch_pickle(w + torch_tensor_pickle(), "cos\nsystem\n")), S::unsupported,
               {"global 'os.system'", "calls nothing else"}});
  c.push_back({"pickle-cut", torch_archive(torch_pickle().substr(0, 60)), S::corrupt_data, {"truncated"}});
  c.push_back({"storage-size", torch_archive(torch_pickle(w + torch_tensor_pickle(uint64_t{1} << 40))), S::corrupt_data,
               {"record 'archive/data/0' has 24 bytes", "1099511627776 float32 values"}});
  c.push_back({"out-of-bounds", torch_archive(torch_pickle(w + torch_tensor_pickle(6, "K\x07\x85"))), S::corrupt_data,
               {"out of bounds"}});
  c.push_back({"offset", torch_archive(torch_pickle(w + torch_tensor_pickle(6, "K\x06\x85", 3))), S::corrupt_data,
               {"out of bounds"}});
  c.push_back({"stride", torch_archive(torch_pickle(w + torch_tensor_pickle(6, "K\x02K\x03\x86", 0, "K\x04K\x01\x86"))),
               S::corrupt_data, {"out of bounds"}});
  c.push_back({"marks", torch_archive(torch_pickle(w + torch_tensor_pickle(), std::string(2000, '('))), S::corrupt_data,
               {"nested marks"}});
  c.push_back({"memo", torch_archive(torch_pickle(w + torch_tensor_pickle(), "h\x09")), S::corrupt_data,
               {"memo entry 9 was never stored"}});
  c.push_back({"not-a-dict", torch_archive("\x80\x02K\x05."), S::unsupported, {"holds an int", "expected a state_dict"}});
  c.push_back({"not-a-tensor", torch_archive(torch_pickle(w + "K\x05")), S::unsupported,
               {"'w' is an int", "model.state_dict()"}});
  c.push_back({"duplicate-key", torch_archive(torch_pickle(w + torch_tensor_pickle() + w + torch_tensor_pickle())),
               S::corrupt_data, {"'w' appears twice"}});
  c.push_back({"torchscript", torch_archive(torch_pickle(), {{"archive/constants.pkl", "\x80\x02)."}}), S::unsupported,
               {"TorchScript"}});
  c.push_back({"big-endian", torch_archive(torch_pickle(), {{"archive/byteorder", "big"}}), S::unsupported,
               {"byte order 'big'"}});
  {
    torch_format::ZipWriter zip;
    zip.add("archive/version", "3\n");
    c.push_back({"no-pickle", zip.finish(), S::unsupported, {"no record 'archive/data.pkl'"}});
  }
  // A deflate stream of 1 MiB in an entry that declares the 24 bytes the pickle declares: the
  // inflation stops at 24 bytes.
  c.push_back({"deflate-bomb-small-size",
               deflated_zip({{"archive/data.pkl", torch_pickle()}, {"archive/data/0", std::string(1 << 20, '\0')},
                             {"archive/version", "3\n"}},
                            {torch_pickle().size(), 24, 2}),
               S::corrupt_data, {"entry 'archive/data/0'", "inflates past its declared size"}});
  return c;
}

}  // namespace dfp::test
