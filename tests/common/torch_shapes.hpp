// Valid torch.save files of shapes that stress the reader's costs: tensors viewing one shared
// storage (each storage must be inflated once, not once per tensor), archives of many entries
// (looked up by name, not by a walk of the directory), and the same archives deflated.
// tests/train/torch_format_test.cpp reads them; fuzz/make_corpus.cpp writes small ones as seeds
// of fuzz/corpus/fuzz_torch.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <string>
#include <vector>

#include "src/io/torch_file.hpp"
#include "src/io/torch_pickle.hpp"
#include "src/io/torch_zip.hpp"

namespace dfp::test {

// Tensor i ("t<i>", `numel` values) views elements i * numel ... of one float32 storage, whose
// element k holds k * 0.5: torch.save of views of one flat parameter buffer.
inline std::string shared_storage_file(size_t tensors, uint64_t numel) {
  torch_format::StateDict sd;
  sd.storages.push_back({"0", torch_format::Dtype::float32, tensors * numel});
  for (size_t i = 0; i < tensors; ++i) {
    torch_format::TensorRecord t;
    t.name = std::string("t").append(std::to_string(i));
    t.storage = 0;
    t.shape = {int64_t(numel)};
    t.stride = {1};
    t.offset = i * numel;
    t.numel = numel;
    sd.tensors.push_back(t);
  }
  std::vector<float> values(tensors * numel);
  for (size_t k = 0; k < values.size(); ++k) values[k] = float(k) * 0.5f;
  torch_format::ZipWriter zip;
  zip.add("archive/data.pkl", torch_format::state_dict_pickle(sd));
  zip.add("archive/data/0", std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
  zip.add("archive/version", "3\n");
  return zip.finish();
}

// `tensors` scalars "s<i>" = i, each its own storage and zip entry.
inline std::string many_entries_file(size_t tensors) {
  std::vector<float> values(tensors);
  std::vector<torch_format::OutTensor> out;
  for (size_t i = 0; i < tensors; ++i) {
    values[i] = float(i);
    out.push_back({std::string("s").append(std::to_string(i)), {}, &values[i], 0});  // (not "s" + ...: a GCC 12 -Wrestrict false positive)
  }
  return torch_format::torch_file_bytes(out);
}

// A zip archive of the given entries (name, data), each deflated unless `stored` names it.
// `declared`: when not empty, the size each entry's headers declare (by entry index) in place of
// its real size, so that a stream can inflate to more than its entry says.
inline std::string deflated_zip(const std::vector<std::pair<std::string, std::string>>& entries,
                                const std::vector<uint64_t>& declared = {}) {
  auto put = [](std::string& o, uint64_t v, int n) {
    for (int k = 0; k < n; ++k) o += char(v >> (8 * k) & 0xFF);
  };
  std::string out, dir;
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& [name, data] = entries[i];
    std::string packed(compressBound(uLong(data.size())) + 64, '\0');
    z_stream z{};
    deflateInit2(&z, 9, Z_DEFLATED, -MAX_WBITS, 9, Z_DEFAULT_STRATEGY);
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
    z.avail_in = uInt(data.size());
    z.next_out = reinterpret_cast<Bytef*>(packed.data());
    z.avail_out = uInt(packed.size());
    deflate(&z, Z_FINISH);
    packed.resize(z.total_out);
    deflateEnd(&z);
    const uint32_t crc = uint32_t(crc32_z(0L, reinterpret_cast<const Bytef*>(data.data()), data.size()));
    const uint64_t size = i < declared.size() ? declared[i] : data.size();
    const uint64_t offset = out.size();
    std::string fields;  // version, flags, method 8, time, date, CRC, sizes, name length, extra length
    put(fields, 20, 2), put(fields, 0, 2), put(fields, 8, 2), put(fields, 0, 2), put(fields, 0, 2);
    put(fields, crc, 4), put(fields, packed.size(), 4), put(fields, size, 4), put(fields, name.size(), 2), put(fields, 0, 2);
    put(out, 0x04034b50, 4), out += fields, out += name, out += packed;
    put(dir, 0x02014b50, 4), put(dir, 20, 2), dir += fields;
    put(dir, 0, 2), put(dir, 0, 2), put(dir, 0, 2), put(dir, 0, 4), put(dir, offset, 4);  // comment, disk, attributes
    dir += name;
  }
  const uint64_t dir_offset = out.size();
  out += dir;
  put(out, 0x06054b50, 4), put(out, 0, 2), put(out, 0, 2), put(out, entries.size(), 2), put(out, entries.size(), 2);
  put(out, dir.size(), 4), put(out, dir_offset, 4), put(out, 0, 2);
  return out;
}

// The archive `stored` (dfp's writer: stored entries) with every entry deflated.
inline std::string deflated(const std::string& stored) {
  const auto zip = torch_format::ZipReader::open_bytes(stored, "stored");
  std::vector<std::pair<std::string, std::string>> entries;
  for (const auto& e : zip.entries()) entries.emplace_back(e.name, zip.read(e, e.size));
  return deflated_zip(entries);
}

}  // namespace dfp::test
