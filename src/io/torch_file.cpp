// State_dict files of torch.save (see torch_file.hpp).
#include "src/io/torch_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "dfp/float16.hpp"
#include "dfp/status.hpp"

namespace dfp::torch_format {
namespace {

constexpr uint64_t kMaxPickle = uint64_t{64} << 20;  // a state_dict's pickle is kilobytes per hundred tensors

// What the first bytes say when they are not a zip archive's.
void check_magic(std::string_view head, const std::string& name) {
  const std::string file = "torch file '" + name + "'";
  DFP_CHECK(!head.empty(), Status::corrupt_data, file + ": empty; expected a file written by torch.save");
  DFP_CHECK(static_cast<unsigned char>(head[0]) != 0x80, Status::unsupported,
            file + ": a bare pickle, torch.save's legacy format (torch < 1.6, or _use_new_zipfile_serialization=False); "
                   "load it with torch and save it again with torch >= 1.6's default format");
  DFP_CHECK(head.size() >= 4 && head.substr(0, 4) == std::string_view("PK\x03\x04", 4), Status::corrupt_data,
            file + ": does not start as a zip archive; expected a file written by torch.save (torch >= 1.6)");
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

TorchFile TorchFile::open(const std::string& path) {
  // The first bytes of a regular file say what it is when it is no zip archive; ZipReader refuses
  // anything else by name. Opened without blocking: a FIFO's open waits for a writer.
  if (const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC); fd >= 0) {
    struct stat st {};
    char head[4] = {};
    ssize_t got = -1;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode))
      while ((got = ::pread(fd, head, sizeof head, 0)) < 0 && errno == EINTR) {
      }
    ::close(fd);
    if (got > 0) check_magic(std::string_view(head, size_t(got)), path);
  }
  return TorchFile(ZipReader::open_file(path));
}

TorchFile TorchFile::parse(std::string_view bytes, const std::string& name) {
  check_magic(bytes.substr(0, 4), name);
  return TorchFile(ZipReader::open_bytes(bytes, name));
}

TorchFile::TorchFile(ZipReader zip) : zip_(std::move(zip)) {
  const std::string file = "torch file '" + zip_.name() + "'";
  const auto& entries = zip_.entries();
  DFP_CHECK(!entries.empty() && entries.front().name.find('/') != std::string::npos, Status::unsupported,
            file + ": a zip archive without a folder of records; expected torch.save's (archive/data.pkl, ...)");
  // As torch.load: the first entry's folder is the archive's.
  prefix_ = entries.front().name.substr(0, entries.front().name.find('/') + 1);
  for (const auto& e : entries)
    DFP_CHECK(e.name.compare(0, 5 + prefix_.size(), prefix_ + "code/") != 0 && e.name != prefix_ + "constants.pkl",
              Status::unsupported,
              file + ": a TorchScript archive (torch.jit.save; entry '" + printable(e.name) +
                  "'); save the model's weights with torch.save(model.state_dict(), path)");
  if (const auto* v = zip_.find(prefix_ + "version")) {
    const std::string text = trimmed(zip_.read(*v, 64));
    DFP_CHECK(!text.empty() && text.find_first_not_of("0123456789") == std::string::npos, Status::corrupt_data,
              file + ": record '" + v->name + "' holds '" + printable(text, 16) + "'; expected a format version number");
  }
  if (const auto* b = zip_.find(prefix_ + "byteorder")) {
    const std::string order = trimmed(zip_.read(*b, 64));
    DFP_CHECK(order == "little", Status::unsupported,
              file + ": byte order '" + printable(order, 16) + "'; dfp reads little-endian files only");
  }
  const auto* pkl = zip_.find(prefix_ + "data.pkl");
  DFP_CHECK(pkl, Status::unsupported,
            file + ": no record '" + prefix_ + "data.pkl'; expected a file written by torch.save");
  sd_ = parse_state_dict(zip_.read(*pkl, kMaxPickle), zip_.name());
  // Every storage's entry holds exactly the bytes the pickle declares (so that no entry inflates
  // to more), and the storages together fit the address space.
  uint64_t total = 0;
  for (const StorageRef& s : sd_.storages) {
    const auto* e = zip_.find(prefix_ + "data/" + s.key);
    DFP_CHECK(e, Status::corrupt_data, file + ": storage '" + s.key + "' has no record '" + prefix_ + "data/" + s.key + "'");
    const size_t es = dtype_size(s.dtype);
    DFP_CHECK(s.numel <= UINT64_MAX / es && e->size == s.numel * es, Status::corrupt_data,
              file + ": record '" + e->name + "' has " + std::to_string(e->size) + " bytes; its storage is " +
                  std::to_string(s.numel) + " " + dtype_name(s.dtype) + " values (" + std::to_string(es) + " bytes each)");
    DFP_CHECK(e->size <= SIZE_MAX - total, Status::corrupt_data,
              file + ": its storages declare more than " + std::to_string(SIZE_MAX) + " bytes together");
    total += e->size;
  }
  storage_cache_.resize(sd_.storages.size());
  unread_views_.assign(sd_.storages.size(), 0);
  tensor_read_.assign(sd_.tensors.size(), false);
  for (const TensorRecord& t : sd_.tensors)
    if (t.numel > 0) ++unread_views_[t.storage];
}

std::shared_ptr<const std::string> TorchFile::storage_bytes(const TensorRecord& t) const {
  std::shared_ptr<const std::string>& cached = storage_cache_[t.storage];
  if (!cached) {
    const auto* e = zip_.find(prefix_ + "data/" + sd_.storages[t.storage].key);
    cached = std::make_shared<const std::string>(zip_.read(*e, e->size));
    storage_bytes_read_ += e->size;
  }
  return cached;
}

void TorchFile::read(const TensorRecord& t, float* out) const {
  if (t.numel == 0) return;  // no value to read: its storage may be empty
  const StorageRef& s = sd_.storages[t.storage];
  // Held here too: the cache lets go of the storage once its last view is read.
  const std::shared_ptr<const std::string> keep = storage_bytes(t);
  // One of tensors() (not a copy) counts towards releasing its storage's bytes, once.
  const uintptr_t first = reinterpret_cast<uintptr_t>(sd_.tensors.data()), self = reinterpret_cast<uintptr_t>(&t);
  const size_t index = size_t((self - first) / sizeof(TensorRecord));
  if (self >= first && index < sd_.tensors.size() && &sd_.tensors[index] == &t && !tensor_read_[index]) {
    tensor_read_[index] = true;
    if (--unread_views_[t.storage] == 0) storage_cache_[t.storage].reset();
  }
  const auto* p = reinterpret_cast<const unsigned char*>(keep->data());
  auto value = [&](uint64_t i) -> float {
    const unsigned char* q = p + i * dtype_size(s.dtype);
    switch (s.dtype) {
      case Dtype::float32: {
        float f;
        std::memcpy(&f, q, 4);  // the file is little-endian, as every CPU dfp runs on
        return f;
      }
      case Dtype::float16: return fp16_to_f32(uint16_t(q[0] | q[1] << 8));
      case Dtype::bfloat16: return bf16_to_f32(uint16_t(q[0] | q[1] << 8));
      case Dtype::int64: {
        int64_t v;
        std::memcpy(&v, q, 8);
        return float(v);
      }
    }
    return 0.f;
  };
  // Row-major walk of the shape through the strides (the reader checked the bounds).
  const size_t dims = t.shape.size();
  std::vector<int64_t> idx(dims, 0);
  uint64_t at = t.offset;
  for (uint64_t n = 0; n < t.numel; ++n) {
    out[n] = value(at);
    for (size_t d = dims; d-- > 0;) {
      if (++idx[d] < t.shape[d]) {
        at += uint64_t(t.stride[d]);
        break;
      }
      at -= uint64_t(t.stride[d]) * uint64_t(t.shape[d] - 1);
      idx[d] = 0;
    }
  }
}

std::string torch_file_bytes(const std::vector<OutTensor>& tensors, bool force_zip64) {
  StateDict sd;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const OutTensor& o = tensors[i];
    TensorRecord t;
    t.name = o.name;
    t.storage = i;
    t.shape = o.shape;
    t.stride.assign(o.shape.size(), 1);
    t.numel = 1;
    for (size_t d = o.shape.size(); d-- > 0;) {
      t.stride[d] = int64_t(t.numel);
      t.numel *= uint64_t(o.shape[d]);
    }
    const bool integer = o.values == nullptr;
    DFP_CHECK(!integer || t.numel == 1, Status::invalid_argument,
              "torch state_dict tensor '" + o.name + "': an int64 tensor must be a scalar");
    sd.storages.push_back({std::to_string(i), integer ? Dtype::int64 : Dtype::float32, t.numel});
    sd.tensors.push_back(std::move(t));
  }
  ZipWriter zip(force_zip64);
  zip.add("archive/data.pkl", state_dict_pickle(sd));
  for (size_t i = 0; i < tensors.size(); ++i) {
    const OutTensor& o = tensors[i];
    zip.add("archive/data/" + std::to_string(i),
            o.values ? std::string_view(reinterpret_cast<const char*>(o.values), sd.tensors[i].numel * 4)
                     : std::string_view(reinterpret_cast<const char*>(&o.integer), 8));
  }
  zip.add("archive/version", "3\n");
  return zip.finish();
}

}  // namespace dfp::torch_format
