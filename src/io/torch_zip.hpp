// The zip container of torch.save files (torch >= 1.6): a reader of stored and deflated entries,
// ZIP64 included, that checks every offset and size against the file, and a writer of stored
// entries aligned to 64 bytes as PyTorch writes them. Format: docs/design/torch-format.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dfp::torch_format {

// `text` (a name from a file) as messages show it: valid UTF-8 as it is, control characters and
// bytes that are not UTF-8 as \xNN, at most `max` bytes of it (then its length).
std::string printable(std::string_view text, size_t max = 256);
// Whether `text` is well-formed UTF-8 (as Python's str encodes).
bool valid_utf8(std::string_view text);

// Messages of the reader name the file as "torch file '<name>'".

// A zip archive's central directory, over a file or over bytes in memory.
class ZipReader {
 public:
  struct Entry {
    std::string name;
    uint16_t method = 0;  // 0 stored, 8 deflate
    uint32_t crc = 0;
    uint64_t compressed = 0, size = 0;
    uint64_t header_offset = 0;  // of the local header
  };

  // Reads the central directory of the file at `path`; `path` names it in every error. Anything but
  // a regular file is refused without blocking (a FIFO) or reading (a device).
  static ZipReader open_file(const std::string& path);
  // The same over `bytes`, which must outlive the reader; `name` names it in errors.
  static ZipReader open_bytes(std::string_view bytes, const std::string& name);

  const std::vector<Entry>& entries() const noexcept { return entries_; }
  const Entry* find(std::string_view name) const;  // null when absent; a hash lookup
  // The entry's bytes, inflated if deflated, its size and CRC-32 checked. Refuses an entry larger
  // than `limit` bytes before allocating anything.
  std::string read(const Entry& e, uint64_t limit) const;
  const std::string& name() const noexcept { return name_; }

  struct Source;  // the file or the bytes (torch_zip.cpp)

 private:
  ZipReader(std::shared_ptr<const Source> src, std::string name);
  void read_directory();
  void read_at(uint64_t offset, void* dst, size_t n, const std::string& what) const;

  std::shared_ptr<const Source> src_;
  std::string name_;
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> index_;  // name -> position in entries_
};

// Builds an archive of stored entries in memory. Each entry's data starts at a multiple of 64
// bytes (padding in the local header's extra field, as PyTorch's writer does). Sizes or offsets
// past 4 GiB, or force_zip64, write the ZIP64 records.
class ZipWriter {
 public:
  explicit ZipWriter(bool force_zip64 = false) : zip64_(force_zip64) {}
  void add(const std::string& name, std::string_view data);
  // The archive's bytes (the central directory appended); the writer is spent.
  std::string finish();

 private:
  struct Written {
    std::string name;
    uint32_t crc;
    uint64_t size, offset;
  };
  bool zip64_;
  std::string out_;
  std::vector<Written> written_;
};

}  // namespace dfp::torch_format
