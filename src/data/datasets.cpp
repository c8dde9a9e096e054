// Dataset readers: IDX (plain or gzip, via zlib), CIFAR-10 and CIFAR-100 binary, and the
// directory scan of an image folder (its JPEGs are decoded by the Loader: loader.cpp, jpeg.cpp).
//
// Every reader validates before it trusts: header fields are range-checked, counts must agree,
// every label is checked against the class count, a short read names the record it cut, and
// bytes after the declared data are an error (a file longer than its header says is as suspect
// as a shorter one). Nothing is returned unless the whole file was read and checked.
#include "dfp/data.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <iterator>
#include <map>
#include <set>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dfp/status.hpp"
#include "base/random.hpp"

namespace dfp {

namespace fs = std::filesystem;

namespace {

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", v);
  return buf;
}

uint32_t big_endian32(const unsigned char* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

// Throws io_error unless `path` is an existing regular file (or a link to one), saying what it is
// instead: missing, a link to nothing or to a link cycle, a directory, a device, FIFO or socket.
void require_file(const std::string& path, const std::string& what) {
  std::error_code ec, lec;
  const auto lst = fs::symlink_status(path, lec);
  const auto st = fs::status(path, ec);
  if (fs::is_symlink(lst) && !fs::exists(st)) {
    std::error_code rec;
    const fs::path target = fs::read_symlink(path, rec);
    dfp::fail(Status::io_error, in_quotes(path) + ": " + what + " is a link to " + in_quotes(target.string()) +
                                    (ec && ec.value() == ELOOP ? ", a cycle of links" : ", which does not exist") +
                                    "; expected a regular file");
  }
  DFP_CHECK(fs::exists(st), Status::io_error,
            in_quotes(path) + ": " + what + (ec && ec != std::errc::no_such_file_or_directory
                                                 ? " cannot be examined: " + ec.message()
                                                 : std::string(" not found")));
  DFP_CHECK(!fs::is_directory(st), Status::io_error,
            in_quotes(path) + ": " + what + " is a directory; expected a regular file");
  DFP_CHECK(fs::is_regular_file(st), Status::io_error,
            in_quotes(path) + ": " + what + " is not a regular file (a device, FIFO or socket); expected a regular file");
}

void require_dir(const std::string& dir, const std::string& dataset, const std::string& expected) {
  std::error_code ec;
  const auto st = fs::status(dir, ec);
  DFP_CHECK(!ec || ec == std::errc::no_such_file_or_directory, Status::io_error,
            dataset + ": directory " + in_quotes(dir) + " cannot be examined: " + ec.message() + " (expected " +
                expected + " in it)");
  DFP_CHECK(fs::exists(st), Status::io_error,
            dataset + ": directory " + in_quotes(dir) + " does not exist (expected " + expected + " in it)");
  DFP_CHECK(fs::is_directory(st), Status::io_error,
            dataset + ": " + in_quotes(dir) + " is not a directory (expected " + expected + " in it)");
}

// A file read as a byte stream: a file that starts with the gzip magic bytes (1F 8B) is inflated
// (every member of a multi-member stream, as gunzip does), any other file is read as it is, so
// plain and .gz IDX files share one code path. Unlike gunzip, bytes after the last gzip member
// that do not start another member are an error: a file with appended garbage is not trusted.
class ByteReader {
 public:
  explicit ByteReader(const std::string& path) : path_(path), in_(size_t(1) << 18) {
    require_file(path, "IDX file");
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    DFP_CHECK(fd_ >= 0, Status::io_error, in_quotes(path) + ": cannot open: " + std::strerror(errno));
    while (avail_ < 2 && fill_more()) {
    }
    gzip_ = avail_ >= 2 && in_[0] == 0x1F && in_[1] == 0x8B;
    if (gzip_) {
      DFP_CHECK(inflateInit2(&zs_, 16 + MAX_WBITS) == Z_OK, Status::io_error, in_quotes(path) + ": zlib out of memory");
    }
  }
  ~ByteReader() {
    if (gzip_) inflateEnd(&zs_);
    if (fd_ >= 0) ::close(fd_);
  }
  ByteReader(const ByteReader&) = delete;
  ByteReader& operator=(const ByteReader&) = delete;

  // Reads up to n bytes; fewer only at the end of the data or on an error (a corrupt or
  // truncated gzip stream, bytes after it, a failed read), which zlib_error() then describes.
  size_t read(void* dst, size_t n) {
    uint8_t* out = static_cast<uint8_t*>(dst);
    size_t done = 0;
    while (done < n && error_ == Fault::none) {
      if (avail_ == 0 && !fill()) {
        if (gzip_ && !member_done_ && error_ == Fault::none) set(Fault::truncated, "unexpected end of file");
        break;
      }
      if (!gzip_) {
        const size_t k = std::min(n - done, avail_);
        std::memcpy(out + done, in_.data() + pos_, k);
        pos_ += k;
        avail_ -= k;
        done += k;
        continue;
      }
      if (member_done_) {
        // Another member, or the end of the file: anything else is refused.
        while (avail_ < 2 && fill_more()) {
        }
        if (avail_ >= 2 && in_[pos_] == 0x1F && in_[pos_ + 1] == 0x8B) {
          inflateReset(&zs_);
          member_done_ = false;
          continue;
        }
        if (error_ != Fault::none) break;
        struct stat st{};
        const long long size = ::fstat(fd_, &st) == 0 ? (long long)st.st_size : -1;
        const long long at = (long long)(consumed_ - avail_);
        set(Fault::corrupt, std::to_string(size >= 0 ? size - at : (long long)avail_) +
                                " bytes follow the end of the gzip stream at byte " + std::to_string(at) +
                                " and do not start another gzip member; expected the file to end there");
        break;
      }
      zs_.next_in = in_.data() + pos_;
      zs_.avail_in = uInt(avail_);
      zs_.next_out = out + done;
      zs_.avail_out = uInt(std::min<size_t>(n - done, size_t(1) << 30));
      const uInt before_out = zs_.avail_out;
      const int r = inflate(&zs_, Z_NO_FLUSH);
      pos_ += avail_ - zs_.avail_in;
      avail_ = zs_.avail_in;
      done += before_out - zs_.avail_out;
      if (r == Z_STREAM_END) {
        member_done_ = true;
      } else if (r == Z_DATA_ERROR || r == Z_NEED_DICT || r == Z_STREAM_ERROR) {
        set(Fault::corrupt, zs_.msg ? zs_.msg : "invalid deflate data");
      } else if (r == Z_MEM_ERROR) {
        set(Fault::io, "zlib out of memory");
      }
    }
    return done;
  }

  // "" when no error was seen; else its description (", zlib: unexpected end of file", ...).
  std::string zlib_error() const {
    switch (error_) {
      case Fault::none: return "";
      case Fault::io: return ", read error: " + message_;
      case Fault::trailing: return ", " + message_;
      default: return ", zlib: " + message_;
    }
  }

  // A corrupt (not merely truncated) gzip stream or a failed read: a truncated stream is worded
  // as a truncation by the callers instead.
  bool hard_error() const { return error_ != Fault::none && error_ != Fault::truncated; }

  // Throws corrupt_data (io_error for a failed read) naming `where` when hard_error(). The
  // stream is inflated ahead of the caller, so `where` is where the error surfaced, which may be
  // before the damaged bytes (a CRC-32 mismatch covers the whole stream).
  void check(const std::string& where) {
    if (!hard_error()) return;
    const bool io = error_ == Fault::io;
    dfp::fail(io ? Status::io_error : Status::corrupt_data,
              in_quotes(path_) + ": " + (io ? "read failed in " : "corrupt gzip stream, detected while reading ") + where +
                  zlib_error());
  }

 private:
  enum class Fault { none, truncated, corrupt, trailing, io };
  void set(Fault f, const std::string& m) {
    error_ = f == Fault::corrupt && member_done_ ? Fault::trailing : f;
    message_ = m;
  }
  // Refills the empty buffer from the file; false at the end of the file or on a read error.
  bool fill() {
    pos_ = 0;
    return fill_more();
  }
  // Appends to the buffer's unread bytes (moved to its start); false when nothing was added.
  bool fill_more() {
    if (pos_ > 0 && avail_ > 0) std::memmove(in_.data(), in_.data() + pos_, avail_);
    pos_ = 0;
    for (;;) {
      const ssize_t r = ::read(fd_, in_.data() + avail_, in_.size() - avail_);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        set(Fault::io, std::strerror(errno));
        return false;
      }
      avail_ += size_t(r);
      consumed_ += uint64_t(r);
      return r > 0;
    }
  }

  std::string path_;
  int fd_ = -1;
  std::vector<uint8_t> in_;  // raw bytes: in_[pos_, pos_ + avail_) are not yet used
  size_t pos_ = 0, avail_ = 0;
  uint64_t consumed_ = 0;    // raw bytes read from the file so far
  bool gzip_ = false, member_done_ = false;
  z_stream zs_{};
  Fault error_ = Fault::none;
  std::string message_;
};

struct IdxHeader {
  uint32_t count = 0, rows = 1, cols = 1;
  size_t header_bytes = 0;
};

// Reads and checks an IDX header: images (3 dims, magic 0x00000803) or labels (1 dim, magic
// 0x00000801), unsigned-byte data in both.
IdxHeader read_idx_header(ByteReader& in, const std::string& path, bool images) {
  const size_t bytes = images ? 16 : 8;
  const uint32_t magic_expected = images ? 0x00000803u : 0x00000801u;
  const char* kind = images ? "images (unsigned bytes, 3 dimensions: count, rows, cols)"
                            : "labels (unsigned bytes, 1 dimension: count)";
  unsigned char h[16] = {};
  auto truncated = [&](size_t got) {
    return in_quotes(path) + ": truncated IDX header: expected " + std::to_string(bytes) + " bytes (magic number, " +
           (images ? "count, rows, cols" : "count") + "), got " + std::to_string(got) + in.zlib_error();
  };
  // The magic number first, so a wrong kind of file is named as such even when it is shorter
  // than the header expected here (a label file passed as images).
  size_t got = in.read(h, 4);
  in.check("the IDX header");
  DFP_CHECK(got == 4, Status::corrupt_data, truncated(got));
  const uint32_t magic = big_endian32(h);
  if (magic != magic_expected) {
    std::string hint;
    if (magic == (images ? 0x00000801u : 0x00000803u))
      hint = images ? " (this is an IDX label file)" : " (this is an IDX image file)";
    else if ((magic >> 8) == 0x08)
      hint = " (an unsigned-byte IDX file with " + std::to_string(magic & 0xFF) + " dimensions)";
    dfp::fail(Status::corrupt_data, in_quotes(path) + ": wrong magic number " + hex32(magic) +
                                        " in the IDX header, expected " + hex32(magic_expected) + " for " +
                                        kind + hint);
  }
  got = 4 + in.read(h + 4, bytes - 4);
  in.check("the IDX header");
  DFP_CHECK(got == bytes, Status::corrupt_data, truncated(got));
  IdxHeader r;
  r.header_bytes = bytes;
  r.count = big_endian32(h + 4);
  // 2^31 - 1: Dataset::count is an int.
  DFP_CHECK(r.count >= 1 && r.count <= 0x7FFFFFFFu, Status::corrupt_data,
            in_quotes(path) + ": IDX header field 'count' is " + std::to_string(r.count) +
                ", expected 1 .. 2147483647");
  if (images) {
    r.rows = big_endian32(h + 8);
    r.cols = big_endian32(h + 12);
    // Bounds only to reject garbage headers before they size anything; no real IDX image
    // dataset comes near them.
    DFP_CHECK(r.rows >= 1 && r.rows <= 65536, Status::corrupt_data,
              in_quotes(path) + ": IDX header field 'rows' is " + std::to_string(r.rows) + ", expected 1 .. 65536");
    DFP_CHECK(r.cols >= 1 && r.cols <= 65536, Status::corrupt_data,
              in_quotes(path) + ": IDX header field 'cols' is " + std::to_string(r.cols) + ", expected 1 .. 65536");
    const uint64_t total = uint64_t(r.count) * r.rows * r.cols;
    DFP_CHECK(total <= (uint64_t(1) << 37), Status::corrupt_data,
              in_quotes(path) + ": IDX header declares " + std::to_string(r.count) + " images of " +
                  std::to_string(r.rows) + "x" + std::to_string(r.cols) + " = " + std::to_string(total) +
                  " bytes, expected at most 2^37 bytes (a corrupt header?)");
  }
  return r;
}

// Reads `count` records of `record_bytes` after the header into `out`, then requires the end of
// the data. The buffer grows 4 MiB at a time as data arrives (never sized from the header alone),
// so a header that lies about the count or the image size fails as a truncation, not as a huge
// allocation.
void read_idx_records(ByteReader& in, const std::string& path, const IdxHeader& h, size_t record_bytes,
                      const char* record_kind, std::vector<uint8_t>& out) {
  const size_t total = size_t(h.count) * record_bytes;
  out.clear();
  out.reserve(std::min<size_t>(total, size_t(64) << 20));
  const size_t chunk = size_t(4) << 20;
  size_t done = 0;
  while (done < total) {
    const size_t want = std::min(chunk, total - done);
    out.resize(done + want);
    const size_t got = in.read(out.data() + done, want);
    done += got;
    if (got < want) {
      const size_t record = done / record_bytes, partial = done % record_bytes;
      const std::string rec = std::string(record_kind) + " record " + std::to_string(record) + " of " +
                              std::to_string(h.count) + " (0-based)";
      in.check(rec);
      dfp::fail(Status::corrupt_data,
                in_quotes(path) + ": truncated: " +
                    (partial == 0 ? "the data ends before " + rec
                                  : rec + " is cut after " + std::to_string(partial) + " of its " +
                                        std::to_string(record_bytes) + " bytes") +
                    "; expected " + std::to_string(h.header_bytes + total) + " bytes in all, got " +
                    std::to_string(h.header_bytes + done) + in.zlib_error());
    }
  }
  // End of data: this read also makes zlib check the gzip trailer (CRC-32 and length), so a
  // corrupt gzip stream that happened to inflate to the right length is still caught.
  unsigned char extra[64];
  const size_t more = in.read(extra, sizeof extra);
  in.check("the gzip trailer after the last of " + std::to_string(h.count) + " " + record_kind + " records");
  DFP_CHECK(more == 0, Status::corrupt_data,
            in_quotes(path) + ": data continues after the " + std::to_string(h.count) + " " + record_kind +
                " records the header declares: expected the data to end after " +
                std::to_string(h.header_bytes + total) + " bytes");
  // A gzip stream cut exactly at the end of the data but before its trailer.
  const std::string zerr = in.zlib_error();
  DFP_CHECK(zerr.empty(), Status::corrupt_data,
            in_quotes(path) + ": truncated gzip stream after the last of " + std::to_string(h.count) + " " +
                record_kind + " records" + zerr);
}

// ---- CIFAR ------------------------------------------------------------------------------

struct CifarFormat {
  const char* dataset;      // "CIFAR-10" / "CIFAR-100"
  size_t label_bytes;       // 1 (label) / 2 (coarse, fine)
  int coarse_classes;       // 0 / 20
  int classes;              // 10 / 100
  size_t record_bytes() const { return label_bytes + 3072; }
};

// Reads whole-record CIFAR files in the given order into one Dataset.
Dataset read_cifar(const std::vector<std::string>& files, const CifarFormat& fmt, const std::string& name) {
  const size_t rec = fmt.record_bytes();
  const std::string layout = std::to_string(rec) + "-byte " + fmt.dataset + " records (" +
                             (fmt.label_bytes == 1 ? "1 label byte" : "1 coarse + 1 fine label byte") +
                             " + 3072 pixel bytes)";
  // Sizes first: a bad file fails before anything is read, and the pixels are sized once.
  std::vector<size_t> records(files.size());
  size_t total = 0;
  for (size_t f = 0; f < files.size(); ++f) {
    require_file(files[f], std::string(fmt.dataset) + " batch file");
    std::error_code ec;
    const uintmax_t size = fs::file_size(files[f], ec);
    DFP_CHECK(!ec, Status::io_error, in_quotes(files[f]) + ": cannot read its size: " + ec.message());
    DFP_CHECK(size > 0, Status::corrupt_data, in_quotes(files[f]) + ": empty file, expected a whole number of " + layout);
    DFP_CHECK(size % rec == 0, Status::corrupt_data,
              in_quotes(files[f]) + ": size " + std::to_string(size) + " bytes is not a whole number of " + layout +
                  ": record " + std::to_string(size / rec) + " (0-based) is truncated to " +
                  std::to_string(size % rec) + " of its " + std::to_string(rec) + " bytes");
    records[f] = size_t(size / rec);
    total += records[f];
  }
  DFP_CHECK(total <= 0x7FFFFFFFu, Status::invalid_argument,
            std::string(fmt.dataset) + ": " + std::to_string(total) + " records, expected at most 2^31 - 1");

  Dataset d;
  d.name = name;
  for (const std::string& f : files) d.source += (d.source.empty() ? "" : ", ") + f;
  d.count = int(total);
  d.channels = 3;
  d.height = 32;
  d.width = 32;
  d.classes = fmt.classes;
  d.pixels.resize(total * 3072);
  d.labels.resize(total);

  constexpr size_t kChunkRecords = 1024;  // 3 MiB staging buffer, reused across files
  std::vector<uint8_t> buf(kChunkRecords * rec);
  size_t n = 0;  // records stored so far, over all files
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string& path = files[f];
    std::ifstream in(path, std::ios::binary);
    DFP_CHECK(in.is_open(), Status::io_error, in_quotes(path) + ": cannot open: " + std::strerror(errno));
    for (size_t r0 = 0; r0 < records[f]; r0 += kChunkRecords) {
      const size_t nr = std::min(kChunkRecords, records[f] - r0);
      in.read(reinterpret_cast<char*>(buf.data()), std::streamsize(nr * rec));
      const size_t got = size_t(in.gcount());
      DFP_CHECK(got == nr * rec, Status::io_error,
                in_quotes(path) + ": read failed in record " + std::to_string(r0 + got / rec) +
                    " (0-based): expected " + std::to_string(records[f]) + " " + layout +
                    " (did the file change while it was read?)");
      for (size_t r = 0; r < nr; ++r) {
        const uint8_t* src = buf.data() + r * rec;
        if (fmt.coarse_classes > 0)
          DFP_CHECK(src[0] < fmt.coarse_classes, Status::corrupt_data,
                    in_quotes(path) + ": record " + std::to_string(r0 + r) + " (0-based): coarse label byte is " +
                        std::to_string(src[0]) + ", expected 0.." + std::to_string(fmt.coarse_classes - 1));
        const uint8_t label = src[fmt.label_bytes - 1];
        DFP_CHECK(label < fmt.classes, Status::corrupt_data,
                  in_quotes(path) + ": record " + std::to_string(r0 + r) + " (0-based): " +
                      (fmt.coarse_classes > 0 ? "fine label" : "label") + " byte is " + std::to_string(label) +
                      ", expected 0.." + std::to_string(fmt.classes - 1));
        d.labels[n] = label;
        // The record's R, G, B planes are already CHW.
        std::memcpy(d.pixels.data() + n * 3072, src + fmt.label_bytes, 3072);
        ++n;
      }
    }
  }
  return d;
}

// ---- image folder ------------------------------------------------------------------------

bool hidden(const fs::path& p) {
  const std::string n = p.filename().string();
  return !n.empty() && n[0] == '.';
}

bool jpeg_extension(const fs::path& p) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return e == ".jpg" || e == ".jpeg";
}

// Sorted names of the (non-hidden) subdirectories of dir, symlinks followed.
std::vector<std::string> class_folders(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, fs::directory_options::follow_directory_symlink, ec), end; !ec && it != end;
       it.increment(ec)) {
    std::error_code ec2;
    if (!hidden(it->path()) && fs::is_directory(it->path(), ec2)) names.push_back(it->path().filename().string());
  }
  DFP_CHECK(!ec, Status::io_error, "image folder: cannot list directory " + in_quotes(dir.string()) + ": " + ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

// Whether `p` is `root` or lies under it (both canonical).
bool within(const fs::path& p, const fs::path& root) {
  auto r = root.begin(), q = p.begin();
  for (; r != root.end(); ++r, ++q)
    if (q == p.end() || *q != *r) return false;
  return true;
}

// A directory's identity: links and bind mounts aside, the same device and inode are the same
// directory, however it was reached.
struct DirId {
  dev_t dev;
  ino_t ino;
  bool operator<(const DirId& o) const { return dev != o.dev ? dev < o.dev : ino < o.ino; }
};

// Scans one class folder of an image folder's split.
class ClassScan {
 public:
  // split: the split folder (train/ or val/), folder: the class folder in it.
  ClassScan(const fs::path& split, const fs::path& folder) : folder_(folder) {
    std::error_code ec;
    split_canon_ = fs::canonical(split, ec);
    DFP_CHECK(!ec, Status::io_error, "image folder: cannot resolve " + in_quotes(split.string()) + ": " + ec.message());
    class_canon_ = fs::canonical(folder, ec);
    DFP_CHECK(!ec, Status::io_error, "image folder: cannot resolve " + in_quotes(folder.string()) + ": " + ec.message());
  }

  // Every JPEG file under the class folder (recursively, links followed), sorted by path.
  std::vector<std::string> files() {
    enter(folder_);
    std::sort(files_.begin(), files_.end());
    return std::move(files_);
  }

 private:
  void enter(const fs::path& dir) {
    struct stat st{};
    DFP_CHECK(::stat(dir.c_str(), &st) == 0, Status::io_error,
              "image folder: cannot examine " + in_quotes(dir.string()) + ": " + std::strerror(errno));
    DFP_CHECK(visited_.insert(DirId{st.st_dev, st.st_ino}).second, Status::invalid_argument,
              "image folder: " + in_quotes(dir.string()) + " leads to a directory already scanned for class " +
                  in_quotes(folder_.filename().string()) + " (a cycle of links, or two links to one folder); expected " +
                  "each directory under a class folder to be reached once");
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const fs::path& p = it->path();
      if (hidden(p)) continue;
      std::error_code ec2;
      const bool link = it->is_symlink(ec2);
      const auto st2 = fs::status(p, ec2);
      if (ec2 && link) continue;  // a link to nothing, or a link cycle that never reaches a file: no image
      if (link && (fs::is_directory(st2) || jpeg_extension(p))) {
        // A link's target must not be filed under another class of this split, or under the
        // split folder itself (which would reach every class).
        std::error_code ec3;
        const fs::path target = fs::canonical(p, ec3);
        if (!ec3 && within(target, split_canon_) && !within(target, class_canon_))
          dfp::fail(Status::invalid_argument,
                    "image folder: " + in_quotes(p.string()) + " in class folder " + in_quotes(folder_.string()) +
                        " is a link to " + in_quotes(target.string()) + ", which is not in that class folder: its " +
                        "images would be labelled " + in_quotes(folder_.filename().string()) +
                        "; expected links only within the class folder or to places outside " +
                        in_quotes(split_canon_.string()));
      }
      if (fs::is_directory(st2))
        enter(p);
      else if (jpeg_extension(p) && fs::is_regular_file(st2))
        files_.push_back(p.string());
    }
    DFP_CHECK(!ec, Status::io_error, "image folder: cannot list directory " + in_quotes(dir.string()) + ": " + ec.message());
  }

  fs::path folder_, split_canon_, class_canon_;
  std::set<DirId> visited_;
  std::vector<std::string> files_;
};

std::string join(const std::vector<std::string>& v, size_t max_items) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max_items; ++i) s += (i ? ", " : "") + in_quotes(v[i]);
  if (v.size() > max_items) s += ", ... (" + std::to_string(v.size()) + " in all)";
  return s;
}

}  // namespace

Dataset load_image_folder(const std::string& dir, bool train, int image_size) {
  DFP_CHECK(image_size >= 1 && image_size <= 8192, Status::invalid_argument,
            "image folder " + in_quotes(dir) + ": image_size is " + std::to_string(image_size) + ", expected 1 .. 8192");
  const std::string layout = "train/ and val/, each with one subdirectory of JPEG files per class";
  require_dir(dir, "image folder", layout);
  const fs::path train_dir = fs::path(dir) / "train";
  const fs::path split_dir = fs::path(dir) / (train ? "train" : "val");
  require_dir(train_dir.string(), "image folder", "one subdirectory of JPEG files per class");
  if (!train) require_dir(split_dir.string(), "image folder", "one subdirectory of JPEG files per class, as in train/");

  Dataset d;
  d.name = "imagenet-folder";
  d.source = split_dir.string();
  d.class_names = class_folders(train_dir);
  DFP_CHECK(!d.class_names.empty(), Status::io_error,
            "image folder: no class folders in " + in_quotes(train_dir.string()) +
                ", expected one subdirectory of JPEG files per class");
  DFP_CHECK(d.class_names.size() <= 0x7FFFFFFFu, Status::invalid_argument, "image folder: too many classes");
  if (!train) {
    // The labels are the positions of the train/ class names: val/ must name the same classes.
    const std::vector<std::string> val = class_folders(split_dir);
    std::vector<std::string> extra, missing;
    std::set_difference(val.begin(), val.end(), d.class_names.begin(), d.class_names.end(), std::back_inserter(extra));
    std::set_difference(d.class_names.begin(), d.class_names.end(), val.begin(), val.end(), std::back_inserter(missing));
    DFP_CHECK(extra.empty(), Status::io_error,
              "image folder: class folder " + in_quotes((split_dir / extra[0]).string()) + " has no counterpart in " +
                  in_quotes(train_dir.string()) + " (val classes not in train: " + join(extra, 5) +
                  "); expected the same class folders in train/ and val/");
    DFP_CHECK(missing.empty(), Status::io_error,
              "image folder: " + in_quotes(split_dir.string()) + " has no folder for the train class " +
                  in_quotes(missing[0]) + " (missing: " + join(missing, 5) +
                  "); expected the same class folders in train/ and val/");
  }
  // Two class names for one folder (a link to another class folder) would give its images two labels.
  std::map<fs::path, std::string> class_of;
  for (const std::string& name : d.class_names) {
    std::error_code ec;
    const fs::path canon = fs::canonical(split_dir / name, ec);
    DFP_CHECK(!ec, Status::io_error,
              "image folder: cannot resolve " + in_quotes((split_dir / name).string()) + ": " + ec.message());
    const auto [it, fresh] = class_of.emplace(canon, name);
    DFP_CHECK(fresh, Status::invalid_argument,
              "image folder: class folders " + in_quotes((split_dir / it->second).string()) + " and " +
                  in_quotes((split_dir / name).string()) + " are the same directory " + in_quotes(canon.string()) +
                  "; expected one folder per class");
  }
  for (size_t c = 0; c < d.class_names.size(); ++c) {
    const fs::path folder = split_dir / d.class_names[c];
    std::vector<std::string> files = ClassScan(split_dir, folder).files();
    DFP_CHECK(!files.empty(), Status::io_error,
              "image folder: class folder " + in_quotes(folder.string()) +
                  " has no JPEG file, expected at least one *.jpg or *.jpeg");
    DFP_CHECK(d.files.size() + files.size() <= 0x7FFFFFFFu, Status::invalid_argument,
              "image folder " + in_quotes(dir) + ": more than 2^31 - 1 images");
    for (auto& f : files) {
      d.files.push_back(std::move(f));
      d.file_labels.push_back(int32_t(c));
    }
  }
  d.count = int(d.files.size());
  d.channels = 3;
  d.height = d.width = image_size;
  d.classes = int(d.class_names.size());
  return d;
}

void check_same_geometry(const Dataset& train, const Dataset& test) {
  auto shape = [](const Dataset& d) {
    return std::to_string(d.channels) + " channel" + (d.channels == 1 ? "" : "s") + " of " + std::to_string(d.height) +
           "x" + std::to_string(d.width) + " pixels, " + std::to_string(d.classes) + " classes";
  };
  DFP_CHECK(train.channels == test.channels && train.height == test.height && train.width == test.width &&
                train.classes == test.classes,
            Status::invalid_argument,
            "dataset " + in_quotes(train.name) + ": the test images " + in_quotes(test.source) + " have " + shape(test) +
                ", the training images " + in_quotes(train.source) + " " + shape(train) +
                "; expected the test split to have the training split's channels, height, width and classes");
}

AugmentOptions image_folder_augment(bool train) {
  AugmentOptions a;
  a.mean = {0.485f, 0.456f, 0.406f};
  a.stddev = {0.229f, 0.224f, 0.225f};
  a.random_resized_crop = train;
  a.hflip = train;
  return a;
}

Dataset load_idx(const std::string& images_file, const std::string& labels_file, int classes) {
  DFP_CHECK(classes >= 1 && classes <= 256, Status::invalid_argument,
            "load_idx(" + in_quotes(images_file) + "): classes is " + std::to_string(classes) +
                ", expected 1 .. 256 (labels are bytes)");
  ByteReader images(images_file);
  ByteReader labels(labels_file);
  const IdxHeader hi = read_idx_header(images, images_file, true);
  const IdxHeader hl = read_idx_header(labels, labels_file, false);
  // Before reading megabytes of pixels: a pair from different splits fails at once.
  DFP_CHECK(hi.count == hl.count, Status::corrupt_data,
            in_quotes(images_file) + " declares " + std::to_string(hi.count) + " images but " + in_quotes(labels_file) +
                " declares " + std::to_string(hl.count) + " labels: expected the same count in both headers");

  Dataset d;
  d.name = fs::path(images_file).filename().string();
  d.source = images_file;
  d.count = int(hi.count);
  d.channels = 1;
  d.height = int(hi.rows);
  d.width = int(hi.cols);
  d.classes = classes;
  read_idx_records(images, images_file, hi, size_t(hi.rows) * hi.cols, "image", d.pixels);
  read_idx_records(labels, labels_file, hl, 1, "label", d.labels);
  for (size_t i = 0; i < d.labels.size(); ++i)
    DFP_CHECK(d.labels[i] < classes, Status::corrupt_data,
              in_quotes(labels_file) + ": label record " + std::to_string(i) + " (0-based) is " +
                  std::to_string(d.labels[i]) + ", expected 0.." + std::to_string(classes - 1));
  return d;
}

Dataset load_mnist_like(const std::string& dir, bool train, const std::string& name) {
  const std::string prefix = train ? "train" : "t10k";
  const std::string img = prefix + "-images-idx3-ubyte[.gz]", lbl = prefix + "-labels-idx1-ubyte[.gz]";
  require_dir(dir, name, img + " and " + lbl);
  // The official names use "-idx3-ubyte"; some mirrors (and the name inside the official gzip
  // header) use ".idx3-ubyte". Uncompressed first: it is what `gunzip -k` leaves next to the .gz.
  auto find = [&](const std::string& kind, const std::string& dims) {
    const std::string stems[] = {prefix + "-" + kind + "-" + dims + "-ubyte", prefix + "-" + kind + "." + dims + "-ubyte"};
    for (const auto& stem : stems)
      for (const char* ext : {"", ".gz"}) {
        const fs::path p = fs::path(dir) / (stem + ext);
        // Any entry by that name, so that a directory, device or dangling link there is named as
        // such (require_file) rather than reported as missing.
        std::error_code ec;
        if (fs::exists(fs::symlink_status(p, ec))) return p.string();
      }
    dfp::fail(Status::io_error, name + ": no " + stems[0] + "[.gz] (or " + stems[1] + "[.gz]) in " + in_quotes(dir));
  };
  const std::string images = find("images", "idx3");
  const std::string labels = find("labels", "idx1");
  Dataset d = load_idx(images, labels, 10);
  d.name = name;
  return d;
}

Dataset load_cifar10(const std::string& dir, bool train) {
  const std::string pattern = train ? "data_batch_*.bin" : "test_batch*.bin";
  require_dir(dir, "CIFAR-10", pattern + " files");
  const std::string head = train ? "data_batch_" : "test_batch";
  // Every name that matches is a batch file: one that is not a readable regular file (a
  // directory, a dangling link) is refused by read_cifar rather than skipped, so that a split
  // never silently loses a batch.
  std::vector<std::string> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string fname = it->path().filename().string();
    if (fname.size() >= head.size() + 4 && fname.compare(0, head.size(), head) == 0 &&
        fname.compare(fname.size() - 4, 4, ".bin") == 0)
      files.push_back(it->path().string());
  }
  DFP_CHECK(!ec, Status::io_error, "CIFAR-10: cannot list directory " + in_quotes(dir) + ": " + ec.message());
  DFP_CHECK(!files.empty(), Status::io_error, "CIFAR-10: no " + pattern + " file in " + in_quotes(dir));
  // Name order = batch order (data_batch_1 .. data_batch_5), so the sample order is reproducible.
  std::sort(files.begin(), files.end());
  return read_cifar(files, CifarFormat{"CIFAR-10", 1, 0, 10}, "cifar10");
}

Dataset load_cifar100(const std::string& dir, bool train) {
  const std::string file = train ? "train.bin" : "test.bin";
  require_dir(dir, "CIFAR-100", file);
  const std::string path = (fs::path(dir) / file).string();
  std::error_code ec;
  DFP_CHECK(fs::exists(fs::symlink_status(path, ec)), Status::io_error, "CIFAR-100: no " + file + " in " + in_quotes(dir));
  return read_cifar({path}, CifarFormat{"CIFAR-100", 2, 20, 100}, "cifar100");
}

namespace {

// "classes=K,train=N,test=M" (any subset, any order) over the defaults.
SyntheticSpec parse_synthetic_spec(const std::string& spec) {
  SyntheticSpec s;
  const std::string where = "dataset 'synthetic': --data " + in_quotes(spec);
  size_t at = 0;
  while (at < spec.size()) {
    size_t end = spec.find(',', at);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(at, end - at);
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    int* field = key == "classes" ? &s.classes : key == "train" ? &s.train : key == "test" ? &s.test : nullptr;
    DFP_CHECK(field && eq != std::string::npos, Status::invalid_argument,
              where + ": item " + in_quotes(item) + " is not classes=K, train=N or test=M");
    const std::string value = item.substr(eq + 1);
    const bool digits = !value.empty() && value.size() <= 9 &&
                        std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; });
    DFP_CHECK(digits, Status::invalid_argument, where + ": " + key + " " + in_quotes(value) + " is not a whole number");
    *field = std::stoi(value);
    at = end + 1;
  }
  // In-memory labels are bytes.
  DFP_CHECK(s.classes >= 1 && s.classes <= 256, Status::invalid_argument,
            where + ": classes " + std::to_string(s.classes) + " outside [1, 256]");
  DFP_CHECK(s.train >= 1 && s.test >= 1, Status::invalid_argument,
            where + ": expected train and test counts of at least 1, got train=" + std::to_string(s.train) +
                " test=" + std::to_string(s.test));
  return s;
}

}  // namespace

Dataset make_synthetic(const SyntheticSpec& spec, bool train, int image_size) {
  DFP_CHECK(image_size >= 1 && image_size <= 8192, Status::invalid_argument,
            "dataset 'synthetic': image size " + std::to_string(image_size) + " outside [1, 8192]");
  const int count = train ? spec.train : spec.test;
  const size_t image = size_t(3) * image_size * image_size;
  DFP_CHECK(size_t(count) <= (size_t(1) << 34) / image, Status::invalid_argument,
            "dataset 'synthetic': " + std::to_string(count) + " images of " + std::to_string(image) +
                " bytes exceed 16 GiB; expected fewer images (--data train=N,test=M)");
  Dataset d;
  d.name = "synthetic";
  d.source = "synthetic " + std::string(train ? "train" : "test") + " split";
  d.count = count;
  d.channels = 3;
  d.height = d.width = image_size;
  d.classes = spec.classes;
  d.pixels.resize(image * size_t(count));
  // splitmix64 over (split, index): the same images for every run, thread count and machine.
  uint64_t state = train ? 0x5EED0001u : 0x5EED0002u;
  auto next = [&state] {
    const uint64_t r = mix64(state);  // splitmix64's next(): the mix of the state, then a step
    state += kGoldenGamma;
    return r;
  };
  for (size_t i = 0; i < d.pixels.size(); i += 8) {
    const uint64_t r = next();
    for (size_t b = 0; b < 8 && i + b < d.pixels.size(); ++b) d.pixels[i + b] = uint8_t(r >> (8 * b));
  }
  d.labels.resize(size_t(count));
  for (uint8_t& l : d.labels) l = uint8_t(next() % uint64_t(spec.classes));
  return d;
}

Dataset load_dataset(const std::string& name, const std::string& path, bool train, int image_size) {
  static const char* const kKnown =
      "fashion-mnist, mnist, cifar10, cifar100, imagenet-folder (or imagenet, folder), synthetic";
  const bool folder = name == "imagenet-folder" || name == "imagenet" || name == "folder";
  const bool synthetic = name == "synthetic";
  const bool known =
      folder || synthetic || name == "fashion-mnist" || name == "mnist" || name == "cifar10" || name == "cifar100";
  DFP_CHECK(known, Status::invalid_argument,
            "dataset " + in_quotes(name) + " is unknown; expected one of: " + kKnown);
  if (synthetic) return make_synthetic(parse_synthetic_spec(path), train, image_size == 0 ? 32 : image_size);
  DFP_CHECK(folder || image_size == 0, Status::invalid_argument,
            "dataset " + in_quotes(name) + ": image size " + std::to_string(image_size) +
                " requested, but its images have a fixed size; expected 0 (image sizes apply to imagenet-folder and synthetic)");
  if (folder) {
    DFP_CHECK(!path.empty(), Status::invalid_argument,
              "dataset " + in_quotes(name) + ": expected the path of its directory (with train/ and val/), got an empty path");
    return load_image_folder(path, train, image_size == 0 ? 224 : image_size);
  }
  if (name == "fashion-mnist")
    return load_mnist_like(path.empty() ? "/usr/share/datasets/fashion-mnist" : path, train, name);
  DFP_CHECK(!path.empty(), Status::invalid_argument,
            "dataset " + in_quotes(name) + ": expected the path of its directory, got an empty path");
  if (name == "mnist") return load_mnist_like(path, train, name);
  if (name == "cifar10") return load_cifar10(path, train);
  return load_cifar100(path, train);
}

}  // namespace dfp
