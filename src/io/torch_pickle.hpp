// The pickle inside torch.save files (data.pkl): a strict reader of the opcodes torch.save emits
// for a state_dict, and a writer of the same. It runs no Python and calls no global: the few
// globals a state_dict names (collections.OrderedDict, torch._utils._rebuild_tensor_v2 and
// _rebuild_parameter, torch.FloatStorage / HalfStorage / BFloat16Storage / LongStorage) are
// recognised by name and rebuilt as data; any other global or opcode is refused, naming the file,
// the byte and the opcode. Format: docs/design/torch-format.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dfp::torch_format {

enum class Dtype : uint8_t { float32, float16, bfloat16, int64 };
const char* dtype_name(Dtype d) noexcept;  // torch's: float32, float16, bfloat16, int64
size_t dtype_size(Dtype d) noexcept;

// A storage the pickle names by persistent id: the archive's entry data/<key>.
struct StorageRef {
  std::string key;  // letters, digits and '_' only (it becomes part of an entry name)
  Dtype dtype = Dtype::float32;
  uint64_t numel = 0;
};

// A tensor of the state_dict: a strided view of a storage, in bounds (checked by the reader).
struct TensorRecord {
  std::string name;
  size_t storage = 0;  // index into StateDict::storages
  std::vector<int64_t> shape, stride;
  uint64_t offset = 0;  // in elements
  uint64_t numel = 0;   // product of shape
};

struct StateDict {
  std::vector<StorageRef> storages;
  std::vector<TensorRecord> tensors;  // in the file's order
};

// Parses a state_dict's data.pkl. `what` names the file in errors (Error(corrupt_data) for a
// malformed pickle, Error(unsupported) for a well-formed one that is not a state_dict of
// tensors, e.g. another global).
StateDict parse_state_dict(std::string_view pickle, const std::string& what);

// The data.pkl of an OrderedDict of the given tensors, each a contiguous view from offset 0 of
// its storage (torch.save's protocol 2, as torch.load reads it).
std::string state_dict_pickle(const StateDict& sd);

}  // namespace dfp::torch_format
