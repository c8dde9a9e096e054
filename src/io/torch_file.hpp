// A state_dict file as torch.save writes it (torch >= 1.6): a zip archive of <prefix>/data.pkl
// (torch_pickle.hpp), one entry <prefix>/data/<key> per storage (little-endian raw values) and
// <prefix>/version. Reading validates the whole structure when the file is opened -- every
// storage present with its declared size, every tensor in its storage's bounds -- and reads
// values only when asked, tensor by tensor. Format: docs/design/torch-format.md.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "src/io/torch_pickle.hpp"
#include "src/io/torch_zip.hpp"

namespace dfp::torch_format {

class TorchFile {
 public:
  // Opens a file written by torch.save(state_dict, path). Errors name the file ("torch file
  // '<path>'"): Error(io_error) when it cannot be read or is not a regular file, Error(corrupt_data) for a damaged archive or pickle, Error(unsupported)
  // for a well-formed file that is not a state_dict of float16/bfloat16/float32/int64 tensors
  // (the pre-1.6 format, a TorchScript archive, a checkpoint dict, another dtype).
  static TorchFile open(const std::string& path);
  // The same over bytes in memory (which must outlive the TorchFile); `name` names them in errors.
  static TorchFile parse(std::string_view bytes, const std::string& name);

  const std::vector<TensorRecord>& tensors() const noexcept { return sd_.tensors; }
  Dtype dtype(const TensorRecord& t) const { return sd_.storages[t.storage].dtype; }
  // The tensor's values as FP32 in row-major order of its shape (float16/bfloat16 widened
  // exactly, int64 converted), into out[t.numel]. Reads (inflates and CRC-checks) its storage's
  // entry once for all the tensors of tensors() that view it: the bytes are kept until each of
  // them has been read. Not for concurrent calls.
  void read(const TensorRecord& t, float* out) const;
  const std::string& name() const noexcept { return zip_.name(); }
  // The bytes of storage entries read (inflated) so far: each storage's once, when every tensor
  // is read once.
  uint64_t storage_bytes_read() const noexcept { return storage_bytes_read_; }

 private:
  TorchFile(ZipReader zip);
  std::shared_ptr<const std::string> storage_bytes(const TensorRecord& t) const;  // from the cache, or read
  ZipReader zip_;
  std::string prefix_;  // the archive's folder, e.g. "archive/"
  StateDict sd_;
  // Per storage: its bytes while tensors viewing it remain unread, and how many remain.
  mutable std::vector<std::shared_ptr<const std::string>> storage_cache_;
  mutable std::vector<size_t> unread_views_;
  mutable std::vector<bool> tensor_read_;  // per tensor of sd_.tensors
  mutable uint64_t storage_bytes_read_ = 0;
};

// One tensor to write: FP32 values (float32) or one integer (an int64 scalar, e.g. BatchNorm's
// num_batches_tracked), with torch's shape.
struct OutTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float* values = nullptr;  // null: the int64 scalar `integer`
  int64_t integer = 0;
};

// The bytes of torch.save(OrderedDict(tensors)) as torch 1.13 writes them: archive/data.pkl,
// archive/data/<i> per tensor, archive/version "3". force_zip64: the ZIP64 records even when the
// sizes do not need them (tests).
std::string torch_file_bytes(const std::vector<OutTensor>& tensors, bool force_zip64 = false);

}  // namespace dfp::torch_format
