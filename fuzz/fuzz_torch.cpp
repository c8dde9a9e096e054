// Fuzz target: torch.save state_dict files (src/io/torch_file.cpp: the zip container, the pickle,
// the storages). The reader must accept a file whose every tensor it can then read, or throw
// dfp::Error; a file it accepts, written back through dfp's writer, must read back to the same
// names, shapes and values.
#include <cmath>
#include <cstring>
#include <string_view>
#include <vector>

#include "dfp/status.hpp"
#include "src/io/torch_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dfp::torch_format;
  try {
    const TorchFile f = TorchFile::parse(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz input");
    std::vector<std::vector<float>> values;
    std::vector<OutTensor> out;
    for (const TensorRecord& t : f.tensors()) {
      if (t.numel > (1u << 20)) return 0;  // in bounds of its storage, but more than a fuzz run should allocate
      values.emplace_back(t.numel);
      f.read(t, values.back().data());
    }
    for (size_t i = 0; i < f.tensors().size(); ++i)
      out.push_back({f.tensors()[i].name, f.tensors()[i].shape, values[i].data(), 0});
    const std::string bytes = torch_file_bytes(out);
    const TorchFile again = TorchFile::parse(bytes, "written back");
    if (again.tensors().size() != out.size()) __builtin_trap();
    for (size_t i = 0; i < out.size(); ++i) {
      const TensorRecord& t = again.tensors()[i];
      if (t.name != out[i].name || t.shape != out[i].shape) __builtin_trap();
      std::vector<float> back(t.numel);
      again.read(t, back.data());
      if (std::memcmp(back.data(), values[i].data(), back.size() * sizeof(float)) != 0) __builtin_trap();
    }
  } catch (const dfp::Error&) {
  }
  return 0;
}
