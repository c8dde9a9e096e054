// Fuzz target: the IDX reader (plain and gzip). Input: a little-endian u32 n, then n bytes of the
// image file, then the label file (n is taken modulo the bytes left). The reader must return a
// dataset consistent with its headers or throw dfp::Error; anything else is a finding.
#include <cstring>

#include "dfp/data.hpp"
#include "dfp/status.hpp"
#include "fuzz/fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const dfp::fuzz::Scratch scratch;
  if (size < 4) return 0;
  uint32_t n;
  std::memcpy(&n, data, 4);
  const size_t rest = size - 4, split = rest == 0 ? 0 : n % (rest + 1);
  const std::string images = scratch.put("images", data + 4, split);
  const std::string labels = scratch.put("labels", data + 4 + split, rest - split);
  try {
    const dfp::Dataset d = dfp::load_idx(images, labels, 10);
    if (d.pixels.size() != size_t(d.count) * d.image_bytes() || d.labels.size() != size_t(d.count)) __builtin_trap();
    for (uint8_t l : d.labels)
      if (l >= 10) __builtin_trap();
  } catch (const dfp::Error&) {
  }
  return 0;
}
