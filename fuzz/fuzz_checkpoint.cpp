// Fuzz target: the checkpoint parser. It must return records that fit the file, or throw
// dfp::Error; a parsed checkpoint must write back to bytes that parse to the same contents.
#include <string_view>

#include "dfp/status.hpp"
#include "src/io/checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const dfp::Checkpoint ck =
        dfp::parse_checkpoint(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz input");
    const dfp::Checkpoint again = dfp::parse_checkpoint(dfp::checkpoint_bytes(ck), "written back");
    if (again.meta != ck.meta || again.tensors.size() != ck.tensors.size()) __builtin_trap();
  } catch (const dfp::Error&) {
  }
  return 0;
}
