// Fuzz target: the CIFAR-10 and CIFAR-100 readers. The input is written as data_batch_1.bin (and
// train.bin) of a directory; each reader must return whole records with labels in range or throw
// dfp::Error.
#include "dfp/data.hpp"
#include "dfp/status.hpp"
#include "fuzz/fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const dfp::fuzz::Scratch scratch;
  scratch.put("data_batch_1.bin", data, size);
  scratch.put("train.bin", data, size);
  for (int classes : {10, 100}) {
    try {
      const dfp::Dataset d = classes == 10 ? dfp::load_cifar10(scratch.dir(), true) : dfp::load_cifar100(scratch.dir(), true);
      if (d.classes != classes || d.pixels.size() != size_t(d.count) * 3072 || d.labels.size() != size_t(d.count))
        __builtin_trap();
      for (uint8_t l : d.labels)
        if (l >= classes) __builtin_trap();
    } catch (const dfp::Error&) {
    }
  }
  return 0;
}
