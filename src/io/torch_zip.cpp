// The zip container of torch.save files (see torch_zip.hpp).
#include "src/io/torch_zip.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdio>

#include "dfp/status.hpp"

namespace dfp::torch_format {
namespace {

constexpr uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEndSig = 0x06054b50;
constexpr uint32_t kEnd64Sig = 0x06064b50, kLocator64Sig = 0x07064b50;
constexpr size_t kLocalSize = 30, kCentralSize = 46, kEndSize = 22, kEnd64Size = 56, kLocator64Size = 20;
constexpr uint64_t kMax32 = 0xFFFFFFFFu;
constexpr uint64_t kMaxDirectory = uint64_t{256} << 20;  // a state_dict's directory is kilobytes
// Deflate expands at most about 1032:1: a larger declared size is a lie (or a zip bomb).
constexpr uint64_t kMaxInflateRatio = 1032;

uint16_t u16(const unsigned char* p) { return uint16_t(p[0] | p[1] << 8); }
uint32_t u32(const unsigned char* p) { return uint32_t(u16(p)) | uint32_t(u16(p + 2)) << 16; }
uint64_t u64(const unsigned char* p) { return uint64_t(u32(p)) | uint64_t(u32(p + 4)) << 32; }

void put16(std::string& o, uint64_t v) { o += char(v & 0xFF), o += char(v >> 8 & 0xFF); }
void put32(std::string& o, uint64_t v) { put16(o, v & 0xFFFF), put16(o, v >> 16 & 0xFFFF); }
void put64(std::string& o, uint64_t v) { put32(o, v & kMax32), put32(o, v >> 32); }

uint32_t crc_of(const char* p, size_t n) {
  return uint32_t(crc32_z(0L, reinterpret_cast<const Bytef*>(p), n));
}

// The file as messages name it.
std::string file_of(const std::string& name) { return "torch file '" + name + "'"; }

}  // namespace

namespace {

// The length of the well-formed UTF-8 sequence at p[i] (p has n bytes): 1 to 4, or 0 for none
// (a stray or missing continuation byte, an overlong form, a surrogate, a value past U+10FFFF).
size_t utf8_at(const unsigned char* p, size_t i, size_t n) {
  const unsigned char c = p[i];
  if (c < 0x80) return 1;
  const size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
  if (len == 0 || len > n - i) return 0;
  for (size_t k = 1; k < len; ++k)
    if ((p[i + k] & 0xc0) != 0x80) return 0;
  if ((c == 0xe0 && p[i + 1] < 0xa0) || (c == 0xed && p[i + 1] >= 0xa0) || (c == 0xf0 && p[i + 1] < 0x90) ||
      (c == 0xf4 && p[i + 1] >= 0x90))
    return 0;
  return len;
}

}  // namespace

std::string printable(std::string_view text, size_t max) {
  std::string o;
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = std::min(text.size(), max);
  for (size_t i = 0; i < n;) {
    const size_t len = utf8_at(p, i, n);
    if (len == 0 || (len == 1 && (p[i] < 0x20 || p[i] == 0x7f))) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", p[i]);
      o += hex;
      ++i;
    } else {
      o.append(text.data() + i, len);
      i += len;
    }
  }
  return text.size() > max ? o + "... (" + std::to_string(text.size()) + " bytes)" : o;
}

bool valid_utf8(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = 0, len; i < text.size(); i += len)
    if ((len = utf8_at(p, i, text.size())) == 0) return false;
  return true;
}

struct ZipReader::Source {
  virtual ~Source() = default;
  uint64_t size = 0;
  // Reads n bytes at offset (in range: the caller checked); "" or what failed.
  virtual std::string read(uint64_t offset, void* dst, size_t n) const = 0;
};

namespace {

struct FileSource final : ZipReader::Source {
  int fd = -1;
  ~FileSource() override {
    if (fd >= 0) ::close(fd);
  }
  std::string read(uint64_t offset, void* dst, size_t n) const override {
    char* p = static_cast<char*>(dst);
    while (n > 0) {
      const ssize_t r = ::pread(fd, p, n, off_t(offset));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return std::string("read failed: ") + std::strerror(errno);
      if (r == 0) return "the file ended early (it shrank while being read?)";
      p += r, offset += uint64_t(r), n -= size_t(r);
    }
    return "";
  }
};

struct BytesSource final : ZipReader::Source {
  std::string_view bytes;
  std::string read(uint64_t offset, void* dst, size_t n) const override {
    if (n) std::memcpy(dst, bytes.data() + offset, n);  // an empty entry's dst may be null
    return "";
  }
};

}  // namespace

ZipReader::ZipReader(std::shared_ptr<const Source> src, std::string name) : src_(std::move(src)), name_(std::move(name)) {
  read_directory();
}

ZipReader ZipReader::open_file(const std::string& path) {
  auto src = std::make_shared<FileSource>();
  src->fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // a FIFO's open does not wait
  DFP_CHECK(src->fd >= 0, Status::io_error, file_of(path) + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  DFP_CHECK(::fstat(src->fd, &st) == 0 && S_ISREG(st.st_mode), Status::io_error,
            file_of(path) + ": not a regular file; expected a file written by torch.save");
  src->size = uint64_t(st.st_size);
  return ZipReader(std::move(src), path);
}

ZipReader ZipReader::open_bytes(std::string_view bytes, const std::string& name) {
  auto src = std::make_shared<BytesSource>();
  src->bytes = bytes;
  src->size = bytes.size();
  return ZipReader(std::move(src), name);
}

void ZipReader::read_at(uint64_t offset, void* dst, size_t n, const std::string& what) const {
  DFP_CHECK(offset <= src_->size && n <= src_->size - offset, Status::corrupt_data,
            file_of(name_) + ": " + what + " at byte " + std::to_string(offset) + " needs " + std::to_string(n) +
                " bytes, but the file has " + std::to_string(src_->size) + " (truncated, or a corrupt offset)");
  const std::string failed = src_->read(offset, dst, n);
  DFP_CHECK(failed.empty(), Status::io_error, file_of(name_) + ": " + what + ": " + failed);
}

void ZipReader::read_directory() {
  const uint64_t size = src_->size;
  const std::string file = file_of(name_);
  DFP_CHECK(size >= kEndSize, Status::corrupt_data,
            file + ": " + std::to_string(size) + " bytes, too short for a zip archive (torch.save writes zip archives)");
  // The end record is in the last 22 + 65535 (the longest comment) bytes.
  const uint64_t tail_size = std::min<uint64_t>(size, kEndSize + 0xFFFF);
  std::string tail(tail_size, '\0');
  read_at(size - tail_size, tail.data(), tail_size, "end of the zip archive");
  const auto* t = reinterpret_cast<const unsigned char*>(tail.data());
  size_t end = std::string::npos;
  for (size_t i = tail_size - kEndSize + 1; i-- > 0;)
    if (u32(t + i) == kEndSig && u16(t + i + 20) <= tail_size - kEndSize - i) {
      end = i;
      break;
    }
  DFP_CHECK(end != std::string::npos, Status::corrupt_data,
            file + ": no zip end-of-directory record: not a zip archive, or truncated (torch.save writes zip archives)");
  const unsigned char* e = t + end;
  const uint64_t end_offset = size - tail_size + end;
  uint64_t count = u16(e + 10), dir_size = u32(e + 12), dir_offset = u32(e + 16);
  DFP_CHECK(u16(e + 4) == 0 && u16(e + 6) == 0 && u16(e + 8) == count, Status::corrupt_data,
            file + ": a multi-part zip archive; expected one file");
  if (count == 0xFFFF || dir_size == kMax32 || dir_offset == kMax32) {  // ZIP64: the real values are in its end record
    DFP_CHECK(end_offset >= kLocator64Size, Status::corrupt_data, file + ": ZIP64 end locator missing before the end record");
    unsigned char loc[kLocator64Size];
    read_at(end_offset - kLocator64Size, loc, kLocator64Size, "ZIP64 end locator");
    DFP_CHECK(u32(loc) == kLocator64Sig, Status::corrupt_data,
              file + ": the end record has ZIP64 markers but no ZIP64 end locator precedes it");
    const uint64_t end64 = u64(loc + 8);
    DFP_CHECK(end64 <= end_offset - kLocator64Size && end_offset - kLocator64Size - end64 >= kEnd64Size,
              Status::corrupt_data, file + ": ZIP64 end record offset " + std::to_string(end64) + " is out of place");
    unsigned char r[kEnd64Size];
    read_at(end64, r, kEnd64Size, "ZIP64 end record");
    DFP_CHECK(u32(r) == kEnd64Sig, Status::corrupt_data,
              file + ": no ZIP64 end record at byte " + std::to_string(end64) + " (the locator points there)");
    count = u64(r + 32);
    dir_size = u64(r + 40);
    dir_offset = u64(r + 48);
    DFP_CHECK(u32(r + 16) == 0 && u32(r + 20) == 0 && u64(r + 24) == count, Status::corrupt_data,
              file + ": a multi-part zip archive; expected one file");
  }
  DFP_CHECK(dir_offset <= end_offset && dir_size <= end_offset - dir_offset, Status::corrupt_data,
            file + ": the central directory (" + std::to_string(dir_size) + " bytes at byte " + std::to_string(dir_offset) +
                ") lies outside the file's " + std::to_string(size) + " bytes (truncated, or corrupt)");
  DFP_CHECK(dir_size <= kMaxDirectory && count <= dir_size / kCentralSize, Status::corrupt_data,
            file + ": " + std::to_string(count) + " entries in a central directory of " + std::to_string(dir_size) +
                " bytes; expected at least 46 bytes per entry and at most " + std::to_string(kMaxDirectory) + " bytes");
  std::string dir(dir_size, '\0');
  read_at(dir_offset, dir.data(), dir_size, "central directory");
  const auto* d = reinterpret_cast<const unsigned char*>(dir.data());
  size_t pos = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const std::string at = file + ": central directory entry " + std::to_string(i + 1) + " of " + std::to_string(count);
    DFP_CHECK(dir_size - pos >= kCentralSize && u32(d + pos) == kCentralSig, Status::corrupt_data,
              at + ": no entry header at directory byte " + std::to_string(pos));
    const unsigned char* h = d + pos;
    const size_t name_len = u16(h + 28), extra_len = u16(h + 30), comment_len = u16(h + 32);
    DFP_CHECK(dir_size - pos - kCentralSize >= name_len + extra_len + comment_len, Status::corrupt_data,
              at + ": its name, extra field and comment run past the directory's end");
    Entry en;
    en.name.assign(reinterpret_cast<const char*>(h + kCentralSize), name_len);
    DFP_CHECK((u16(h + 8) & 1) == 0, Status::unsupported, at + " ('" + printable(en.name) + "'): encrypted; expected a plain entry");
    en.method = u16(h + 10);
    en.crc = u32(h + 16);
    en.compressed = u32(h + 20);
    en.size = u32(h + 24);
    en.header_offset = u32(h + 42);
    // ZIP64 extra field: 8-byte values of the fields marked 0xFFFFFFFF, in this order.
    const bool need[3] = {en.size == kMax32, en.compressed == kMax32, en.header_offset == kMax32};
    uint64_t* field[3] = {&en.size, &en.compressed, &en.header_offset};
    const unsigned char* x = h + kCentralSize + name_len;
    bool found[3] = {!need[0], !need[1], !need[2]};
    for (size_t xp = 0; xp + 4 <= extra_len;) {
      const size_t id = u16(x + xp), len = u16(x + xp + 2);
      DFP_CHECK(len <= extra_len - xp - 4, Status::corrupt_data, at + " ('" + printable(en.name) + "'): extra field runs past its end");
      if (id == 1) {
        size_t v = xp + 4;
        for (int f = 0; f < 3; ++f)
          if (need[f] && v + 8 <= xp + 4 + len) *field[f] = u64(x + v), v += 8, found[f] = true;
      }
      xp += 4 + len;
    }
    DFP_CHECK(found[0] && found[1] && found[2], Status::corrupt_data,
              at + " ('" + printable(en.name) + "'): sizes marked ZIP64 without a ZIP64 extra field holding them");
    entries_.push_back(std::move(en));
    pos += kCentralSize + name_len + extra_len + comment_len;
  }
  index_.reserve(entries_.size());
  for (size_t i = 0; i < entries_.size(); ++i)
    DFP_CHECK(index_.emplace(entries_[i].name, i).second, Status::corrupt_data,
              file + ": entry '" + printable(entries_[i].name) + "' appears twice; expected each name once");
}

const ZipReader::Entry* ZipReader::find(std::string_view name) const {
  const auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &entries_[it->second];
}

std::string ZipReader::read(const Entry& e, uint64_t limit) const {
  const std::string what = file_of(name_) + ": entry '" + printable(e.name) + "'";
  DFP_CHECK(e.size <= limit, Status::corrupt_data,
            what + " declares " + std::to_string(e.size) + " bytes; expected at most " + std::to_string(limit));
  DFP_CHECK(e.method == 0 || e.method == 8, Status::unsupported,
            what + ": compression method " + std::to_string(e.method) + "; expected 0 (stored) or 8 (deflate)");
  DFP_CHECK(e.method == 8 || e.compressed == e.size, Status::corrupt_data,
            what + ": stored, but its compressed size " + std::to_string(e.compressed) + " differs from its size " +
                std::to_string(e.size));
  DFP_CHECK(e.method == 0 || e.size / kMaxInflateRatio <= e.compressed, Status::corrupt_data,
            what + ": declares " + std::to_string(e.size) + " bytes from " + std::to_string(e.compressed) +
                " deflated ones; deflate cannot expand that much");
  unsigned char h[kLocalSize];
  read_at(e.header_offset, h, kLocalSize, "local header of entry '" + printable(e.name) + "'");
  DFP_CHECK(u32(h) == kLocalSig, Status::corrupt_data,
            what + ": no local header at byte " + std::to_string(e.header_offset) + " (the directory points there)");
  std::string local_name(u16(h + 26), '\0');
  read_at(e.header_offset + kLocalSize, local_name.data(), local_name.size(), "local header of entry '" + printable(e.name) + "'");
  DFP_CHECK(local_name == e.name && u16(h + 8) == e.method, Status::corrupt_data,
            what + ": its local header (name, method) differs from its central directory entry");
  const uint64_t data = e.header_offset + kLocalSize + u16(h + 26) + u16(h + 28);
  DFP_CHECK(data <= src_->size && e.compressed <= src_->size - data, Status::corrupt_data,
            what + ": its " + std::to_string(e.compressed) + " bytes at byte " + std::to_string(data) +
                " run past the file's end (" + std::to_string(src_->size) + " bytes): truncated?");
  std::string out;
  if (e.method == 0) {
    out.resize(e.size);
    read_at(data, out.data(), e.size, "entry '" + printable(e.name) + "'");
  } else {
    out.resize(e.size);
    z_stream z{};
    DFP_CHECK(inflateInit2(&z, -MAX_WBITS) == Z_OK, Status::internal, what + ": zlib inflateInit2 failed");
    std::string chunk(std::min<uint64_t>(e.compressed, 1 << 20), '\0');
    uint64_t in_done = 0;
    int rc = Z_OK;
    z.next_out = reinterpret_cast<Bytef*>(out.data());
    z.avail_out = 0;
    uint64_t out_left = e.size;
    while (rc != Z_STREAM_END) {
      if (z.avail_in == 0 && in_done < e.compressed) {
        const size_t n = size_t(std::min<uint64_t>(chunk.size(), e.compressed - in_done));
        try {
          read_at(data + in_done, chunk.data(), n, "entry '" + printable(e.name) + "'");
        } catch (...) {
          inflateEnd(&z);
          throw;
        }
        in_done += n;
        z.next_in = reinterpret_cast<Bytef*>(chunk.data());
        z.avail_in = uInt(n);
      }
      if (z.avail_out == 0) {
        const uint64_t n = std::min<uint64_t>(out_left, 1u << 30);
        z.avail_out = uInt(n);
        out_left -= n;
      }
      const uInt avail_before = z.avail_in, out_before = z.avail_out;
      rc = inflate(&z, Z_NO_FLUSH);
      const bool stuck = rc == Z_BUF_ERROR && z.avail_in == avail_before && z.avail_out == out_before;
      if ((rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) || stuck) {
        const std::string why = z.msg ? z.msg : (z.avail_out == 0 && out_left == 0 ? "inflates past its declared size"
                                                                                   : "the deflate stream ends early");
        inflateEnd(&z);
        fail(Status::corrupt_data, what + ": cannot inflate: " + why);
      }
    }
    const bool exact = z.avail_out == 0 && out_left == 0;
    inflateEnd(&z);
    DFP_CHECK(exact, Status::corrupt_data,
              what + ": inflates to fewer bytes than its declared " + std::to_string(e.size));
  }
  const uint32_t crc = crc_of(out.data(), out.size());
  DFP_CHECK(crc == e.crc, Status::corrupt_data,
            what + ": CRC-32 mismatch (stored " + std::to_string(e.crc) + ", computed " + std::to_string(crc) +
                "): the file is corrupt");
  return out;
}

void ZipWriter::add(const std::string& name, std::string_view data) {
  const uint64_t offset = out_.size();
  const bool local64 = zip64_ || data.size() >= kMax32;
  const uint32_t crc = crc_of(data.data(), data.size());
  std::string extra;
  if (local64) {
    put16(extra, 1), put16(extra, 16), put64(extra, data.size()), put64(extra, data.size());
  }
  // Padding ("FB", as PyTorch's writer) so that the data starts at a multiple of 64 bytes.
  const uint64_t unpadded = offset + kLocalSize + name.size() + extra.size() + 4;
  const size_t pad = size_t((64 - unpadded % 64) % 64);
  put16(extra, 0x4246), put16(extra, pad);
  extra.append(pad, 'Z');
  put32(out_, kLocalSig);
  put16(out_, local64 ? 45 : 20);  // version needed
  put16(out_, 0), put16(out_, 0), put16(out_, 0), put16(out_, 0);  // flags, method (stored), time, date
  put32(out_, crc);
  put32(out_, local64 ? kMax32 : data.size()), put32(out_, local64 ? kMax32 : data.size());
  put16(out_, name.size()), put16(out_, extra.size());
  out_ += name;
  out_ += extra;
  out_.append(data.data(), data.size());
  written_.push_back({name, crc, data.size(), offset});
}

std::string ZipWriter::finish() {
  const uint64_t dir_offset = out_.size();
  for (const Written& w : written_) {
    const bool big = zip64_ || w.size >= kMax32 || w.offset >= kMax32;
    put32(out_, kCentralSig);
    put16(out_, big ? 45 : 20), put16(out_, big ? 45 : 20);  // version made by, needed
    put16(out_, 0), put16(out_, 0), put16(out_, 0), put16(out_, 0);  // flags, method, time, date
    put32(out_, w.crc);
    put32(out_, big ? kMax32 : w.size), put32(out_, big ? kMax32 : w.size);
    put16(out_, w.name.size()), put16(out_, big ? 28 : 0), put16(out_, 0);  // name, extra, comment lengths
    put16(out_, 0), put16(out_, 0), put32(out_, 0);  // disk, internal and external attributes
    put32(out_, big ? kMax32 : w.offset);
    out_ += w.name;
    if (big) put16(out_, 1), put16(out_, 24), put64(out_, w.size), put64(out_, w.size), put64(out_, w.offset);
  }
  const uint64_t dir_size = out_.size() - dir_offset, count = written_.size();
  const bool big = zip64_ || count >= 0xFFFF || dir_size >= kMax32 || dir_offset >= kMax32;
  if (big) {
    const uint64_t end64 = out_.size();
    put32(out_, kEnd64Sig), put64(out_, kEnd64Size - 12), put16(out_, 45), put16(out_, 45);
    put32(out_, 0), put32(out_, 0), put64(out_, count), put64(out_, count), put64(out_, dir_size), put64(out_, dir_offset);
    put32(out_, kLocator64Sig), put32(out_, 0), put64(out_, end64), put32(out_, 1);
  }
  put32(out_, kEndSig), put16(out_, 0), put16(out_, 0);
  put16(out_, big ? 0xFFFF : count), put16(out_, big ? 0xFFFF : count);
  put32(out_, big ? kMax32 : dir_size), put32(out_, big ? kMax32 : dir_offset);
  put16(out_, 0);
  written_.clear();
  return std::move(out_);
}

}  // namespace dfp::torch_format
