// Checkpoint files (see checkpoint.hpp).
#include "src/io/checkpoint.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <chrono>

#include "dfp/status.hpp"

namespace dfp {
namespace {

namespace fs = std::filesystem;

void put(std::string& buf, const void* p, size_t n) { buf.append(static_cast<const char*>(p), n); }

// A record name as it appears in an error: quoted, at most 64 bytes, non-printable bytes as \xNN
// (a corrupt length field can make the "name" any bytes of the file).
std::string quoted_name(std::string_view name) {
  std::string o = "'";
  for (size_t i = 0; i < std::min<size_t>(name.size(), 64); ++i) {
    const unsigned char ch = static_cast<unsigned char>(name[i]);
    if (ch >= 0x20 && ch < 0x7f) {
      o += char(ch);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", ch);
      o += hex;
    }
  }
  return o + (name.size() > 64 ? "'... (" + std::to_string(name.size()) + " bytes)" : "'");
}

// Writes all of buf to fd; "" or what failed (errno's text).
std::string write_all(int fd, std::string_view buf) {
  size_t done = 0;
  while (done < buf.size()) {
    const ssize_t r = ::write(fd, buf.data() + done, buf.size() - done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return std::string("write failed after ") + std::to_string(done) + " of " + std::to_string(buf.size()) +
                      " bytes: " + std::strerror(errno);
    done += size_t(r);
  }
  return "";
}

// What a file that is not a regular file is, for messages ("a FIFO").
const char* file_kind(mode_t mode) {
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

// Reads n bytes at offset from fd; "" or what failed.
std::string read_exactly(int fd, uint64_t offset, char* dst, size_t n) {
  const size_t want = n;
  while (n > 0) {
    const ssize_t r = ::pread(fd, dst, n, off_t(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return std::string("read failed: ") + std::strerror(errno);
    if (r == 0) return "the file ended after " + std::to_string(want - n) + " of " + std::to_string(want) +
                       " bytes (it shrank while being read?)";
    dst += r, offset += uint64_t(r), n -= size_t(r);
  }
  return "";
}

}  // namespace

void checkpoint_bytes(const Checkpoint& ck, const std::function<void(const void*, size_t)>& sink) {
  std::string meta;
  for (const auto& [k, v] : ck.meta) {
    // One line per field: a line break or a key's '=' would split or shift fields on reading.
    DFP_CHECK(k.find_first_of("=\n") == std::string::npos && v.find('\n') == std::string::npos, Status::invalid_argument,
              "checkpoint meta field '" + k + "': a key without '=' or line breaks and a value without line breaks "
              "expected");
    meta += k + "=" + v + "\n";
  }
  uLong crc = crc32_z(0L, nullptr, 0);
  auto out = [&](const void* p, size_t n) {
    if (n == 0) return;  // an empty tensor's data() may be null, and crc32_z(crc, null, 0) restarts at 0
    crc = crc32_z(crc, static_cast<const Bytef*>(p), n);
    sink(p, n);
  };
  auto record = [&](const std::string& name, const float* data, uint64_t n) {
    const uint32_t len = uint32_t(name.size());
    out(&len, 4);
    out(name.data(), len);
    out(&n, 8);
    out(data, n * sizeof(float));
  };
  out(kCheckpointMagic, 8);
  // Each byte as its value 0..255 (through unsigned char: a plain char is signed on x86, and
  // UTF-8 text has bytes above 127).
  std::vector<float> meta_f(meta.size());
  for (size_t i = 0; i < meta.size(); ++i) meta_f[i] = float(static_cast<unsigned char>(meta[i]));
  record("meta", meta_f.data(), meta_f.size());
  // The two maps' records in one order of names, as one map's would be.
  auto own = ck.tensors.begin();
  auto lent = ck.borrowed.begin();
  while (own != ck.tensors.end() || lent != ck.borrowed.end()) {
    if (lent == ck.borrowed.end() || (own != ck.tensors.end() && own->first < lent->first)) {
      record(own->first, own->second.data(), own->second.size());
      ++own;
      continue;
    }
    DFP_CHECK(own == ck.tensors.end() || own->first != lent->first, Status::invalid_argument,
              "checkpoint tensor '" + lent->first + "' is given twice (owned and borrowed); expected one of each name");
    record(lent->first, lent->second.data(), lent->second.size());
    ++lent;
  }
  const uint32_t crc_bytes = uint32_t(crc);
  sink(&crc_bytes, 4);
}

std::string checkpoint_bytes(const Checkpoint& ck) {
  std::string buf;
  checkpoint_bytes(ck, [&](const void* p, size_t n) { put(buf, p, n); });
  return buf;
}

void write_file_atomically(const std::string& path, std::string_view bytes, const std::string& what) {
  write_file_atomically(path, [&](const auto& write) { return write(bytes.data(), bytes.size()); }, what);
}

void write_file_atomically(const std::string& path, const FileFill& fill, const std::string& what) {
  // A name of this writer alone: two processes writing the same path never share a file.
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, ".%ld-%08x.tmp", long(::getpid()), unsigned(std::chrono::steady_clock::now().time_since_epoch().count()));
  const std::string tmp = path + suffix;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  DFP_CHECK(fd >= 0, Status::io_error,
            what + " '" + tmp + "': cannot create the temporary file: " + std::strerror(errno));
  // The data reaches the disk before the rename, and the rename before we return: after a power
  // loss the path holds the old file or the new one, never a renamed empty file.
  std::string failed;
  try {
    failed = fill([&](const void* p, size_t n) { return write_all(fd, {static_cast<const char*>(p), n}); });
  } catch (...) {  // what fill refused (a checkpoint's bad meta field): no temporary file stays
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (failed.empty() && ::fsync(fd) != 0) failed = std::string("fsync failed: ") + std::strerror(errno);
  if (::close(fd) != 0 && failed.empty()) failed = std::string("close failed: ") + std::strerror(errno);
  if (failed.empty() && ::rename(tmp.c_str(), path.c_str()) != 0)  // atomic on POSIX
    failed = std::string("cannot rename the temporary file over it: ") + std::strerror(errno);
  if (!failed.empty()) {
    ::unlink(tmp.c_str());  // the previous file, if any, stays as it was
    fail(Status::io_error, what + " '" + path + "': " + failed + " (the previous " + what + ", if any, is kept)");
  }
  const std::string dir = fs::path(path).parent_path().string();
  // Some file systems cannot sync a directory: best effort.
  if (const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

// The records go to the file as they are made, small pieces gathered into writes of up to
// kChunk bytes: a copy of the whole file in memory would add its size (twice, while a string
// grows) to the process's peak, which a ResNet-50's 188 MB checkpoint made 570 MB above
// training's.
void write_checkpoint(const std::string& path, const Checkpoint& ck) {
  write_file_atomically(path, [&](const auto& write) {
    constexpr size_t kChunk = size_t(1) << 20;
    std::string pending, failed;
    auto flush = [&] {
      if (failed.empty() && !pending.empty()) failed = write(pending.data(), pending.size());
      pending.clear();
    };
    checkpoint_bytes(ck, [&](const void* p, size_t n) {
      if (pending.size() + n > kChunk) flush();
      if (n >= kChunk) {
        if (failed.empty()) failed = write(p, n);
      } else {
        put(pending, p, n);
      }
    });
    flush();
    return failed;
  }, "checkpoint");
}

void remove_write_temporaries(const std::string& path) {
  const fs::path p(path);
  const std::string stem = p.filename().string() + ".";
  std::error_code ec;
  for (fs::directory_iterator it(p.parent_path().empty() ? fs::path(".") : p.parent_path(), ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n.size() > stem.size() + 4 && n.compare(0, stem.size(), stem) == 0 && n.compare(n.size() - 4, 4, ".tmp") == 0) {
      std::error_code ignored;
      fs::remove(it->path(), ignored);
    }
  }
}

Checkpoint parse_checkpoint(std::string_view buf, const std::string& path) {
  DFP_CHECK(buf.size() >= 8 && std::memcmp(buf.data(), kCheckpointMagic, 8) == 0, Status::corrupt_data,
            "checkpoint '" + path + "': not a dfp checkpoint (expected magic DFPCKPT1 at offset 0)");
  DFP_CHECK(buf.size() >= 12, Status::corrupt_data,
            "checkpoint '" + path + "': truncated: the file has " + std::to_string(buf.size()) +
                " bytes, too few for the 8-byte magic and the 4-byte CRC");
  // Walk the records before checking the CRC, so that a file that ends early is reported as
  // truncated, with the record it ends in, rather than as a bare checksum mismatch. Every length is
  // checked against the bytes left (no arithmetic that could wrap on a corrupt count).
  Checkpoint ck;
  size_t pos = 8;
  const size_t end = buf.size() - 4;
  std::string record;  // "#3 'conv1.weight'": which record a length check is about
  // `count` items of `size` bytes each must fit before the CRC (compared without multiplying, so a
  // corrupt count cannot wrap).
  auto need = [&](uint64_t count, size_t size, const char* what) {
    DFP_CHECK(count <= (end - pos) / size, Status::corrupt_data,
              "checkpoint '" + path + "': truncated: " + what + " of record " + record + " at byte " +
                  std::to_string(pos) + " needs " + std::to_string(count) + (size == 1 ? "" : " floats of 4") +
                  " bytes, but the file (" + std::to_string(buf.size()) + " bytes) has " + std::to_string(end - pos) +
                  " left before its 4-byte CRC (the file ends early, or this length field is corrupt)");
  };
  struct Record {
    std::string name;
    size_t offset;   // of its floats in buf
    uint64_t count;  // floats
  };
  std::vector<Record> records;
  while (pos < end) {
    record = std::string("#").append(std::to_string(records.size() + 1));  // (not "#" + ...: a GCC 12 -Wrestrict false positive)
    uint32_t len;
    need(4, 1, "name length");
    std::memcpy(&len, buf.data() + pos, 4);
    pos += 4;
    need(len, 1, "name");
    std::string name(buf.data() + pos, len);
    record.append(" ").append(quoted_name(name));  // (not " " + ...: a GCC 12 -Wrestrict false positive)
    pos += len;
    uint64_t n;
    need(8, 1, "element count");
    std::memcpy(&n, buf.data() + pos, 8);
    pos += 8;
    need(n, sizeof(float), "data");
    records.push_back({std::move(name), pos, n});
    pos += n * sizeof(float);
  }
  DFP_CHECK(!records.empty(), Status::corrupt_data,
            "checkpoint '" + path + "': truncated: the file has " + std::to_string(buf.size()) +
                " bytes, the magic and a CRC but no record; expected the 'meta' record first");
  uint32_t stored;
  std::memcpy(&stored, buf.data() + buf.size() - 4, 4);
  const uint32_t crc = uint32_t(crc32_z(0L, reinterpret_cast<const Bytef*>(buf.data()), buf.size() - 4));
  DFP_CHECK(crc == stored, Status::corrupt_data,
            "checkpoint '" + path + "': CRC-32 mismatch (stored " + std::to_string(stored) + ", computed " +
                std::to_string(crc) + "): the file is corrupt, or cut short exactly at a record's end");
  DFP_CHECK(records.front().name == "meta", Status::corrupt_data,
            "checkpoint '" + path + "': the first record is " + quoted_name(records.front().name) +
                "; expected 'meta'");
  for (size_t r = 0; r < records.size(); ++r) {
    const Record& rec = records[r];
    // One record per name, and 'meta' first only: a later record never shadows an earlier one.
    DFP_CHECK((rec.name == "meta") == (r == 0) && !ck.tensors.count(rec.name), Status::corrupt_data,
              "checkpoint '" + path + "': record #" + std::to_string(r + 1) + " " + quoted_name(rec.name) +
                  " repeats an earlier record's name; expected each name once");
    std::vector<float> v(rec.count);
    if (rec.count) std::memcpy(v.data(), buf.data() + rec.offset, rec.count * sizeof(float));  // an empty vector's data() may be null
    const std::string& name = rec.name;
    if (name == "meta") {
      std::string text;
      text.reserve(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        // Files written before bytes were stored as 0..255 hold a byte above 127 as its signed
        // char value -128..-1: the same byte.
        DFP_CHECK(v[i] >= -128.f && v[i] <= 255.f && v[i] == std::floor(v[i]), Status::corrupt_data,
                  "checkpoint '" + path + "': meta record value " + std::to_string(i) + " (0-based) is " +
                      std::to_string(v[i]) + "; expected a byte (an integer 0..255, or -128..-1 as older files "
                      "hold bytes above 127)");
        const int byte = int(v[i]);
        text.push_back(char(static_cast<unsigned char>(byte < 0 ? byte + 256 : byte)));
      }
      size_t start = 0;
      while (start < text.size()) {
        size_t nl = text.find('\n', start);
        if (nl == std::string::npos) nl = text.size();
        const std::string line = text.substr(start, nl - start);
        const size_t eq = line.find('=');
        DFP_CHECK(eq != std::string::npos, Status::corrupt_data,
                  "checkpoint '" + path + "': meta line " + quoted_name(line) + " has no '='; expected key=value");
        DFP_CHECK(ck.meta.emplace(line.substr(0, eq), line.substr(eq + 1)).second, Status::corrupt_data,
                  "checkpoint '" + path + "': meta key " + quoted_name(line.substr(0, eq)) +
                      " appears twice; expected each key once");
        start = nl + 1;
      }
    } else {
      ck.tensors[name] = std::move(v);
    }
  }
  return ck;
}

Checkpoint read_checkpoint(const std::string& path) {
  // Opened without blocking (a FIFO would wait for a writer) and checked to be a regular file
  // before anything is read: a device such as /dev/zero never ends.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  DFP_CHECK(fd >= 0, Status::io_error, "checkpoint '" + path + "': cannot open: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  DFP_CHECK(::fstat(fd, &st) == 0, Status::io_error, "checkpoint '" + path + "': cannot stat: " + std::strerror(errno));
  DFP_CHECK(!S_ISDIR(st.st_mode), Status::io_error,
            "checkpoint '" + path + "': is a directory; expected a checkpoint file (checkpoint.dfp in a run's --out)");
  DFP_CHECK(S_ISREG(st.st_mode), Status::io_error,
            "checkpoint '" + path + "': is " + file_kind(st.st_mode) +
                ", not a regular file; expected a checkpoint file (checkpoint.dfp in a run's --out)");
  const uint64_t size = uint64_t(st.st_size);
  // The magic first, so that a large file of something else is refused without reading it.
  std::string buf(std::min<uint64_t>(size, 8), '\0');
  std::string failed = read_exactly(fd, 0, buf.data(), buf.size());
  DFP_CHECK(failed.empty(), Status::io_error, "checkpoint '" + path + "': " + failed);
  DFP_CHECK(buf.size() == 8 && std::memcmp(buf.data(), kCheckpointMagic, 8) == 0, Status::corrupt_data,
            "checkpoint '" + path + "': not a dfp checkpoint (expected magic DFPCKPT1 at offset 0)");
  DFP_CHECK(size <= buf.max_size(), Status::io_error,
            "checkpoint '" + path + "': " + std::to_string(size) + " bytes, more than this machine can hold");
  buf.resize(size_t(size));
  failed = read_exactly(fd, 8, buf.data() + 8, buf.size() - 8);
  DFP_CHECK(failed.empty(), Status::io_error, "checkpoint '" + path + "': " + failed);
  return parse_checkpoint(buf, path);
}

std::string join_names(const std::vector<std::string>& names) {
  std::string o;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i) o += ',';
    for (const char c : names[i]) {
      if (c == '%') o += "%25";
      else if (c == ',') o += "%2C";
      else if (c == '\n') o += "%0A";
      else if (c == '\r') o += "%0D";
      else o += c;
    }
  }
  return o;
}

std::vector<std::string> split_names(const std::string& value, const std::string& what) {
  std::vector<std::string> names(1);
  for (size_t i = 0; i < value.size(); ++i) {
    const char c = value[i];
    if (c == ',') {
      names.emplace_back();
    } else if (c == '%') {
      const std::string code = value.substr(i + 1, 2);
      char d = 0;
      if (code == "25") d = '%';
      else if (code == "2C") d = ',';
      else if (code == "0A") d = '\n';
      else if (code == "0D") d = '\r';
      DFP_CHECK(d != 0, Status::corrupt_data,
                what + ": escape '%" + code + "' at character " + std::to_string(i) + "; expected %25, %2C, %0A or %0D");
      names.back() += d;
      i += 2;
    } else {
      names.back() += c;
    }
  }
  return names;
}

}  // namespace dfp
