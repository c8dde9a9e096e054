// Builds the kernel table for one ISA level from the kernel lists (simd/kernels.inc, the
// references; simd/<level>/kernels.inc, each level's implementations). The only place that maps
// levels to implementations.
#include "simd/kernel_table.hpp"

namespace dfp::simd {

KernelTable make_kernel_table(Isa isa, const CpuFeatures& cpu) {
  KernelTable t;
  t.isa = isa;
  // The scalar reference fills every entry; higher levels replace what they implement.
#define DFP_KERNEL(entry, Fn, reference, reference_name) t.entry = {&ref::reference, reference_name};
#include "simd/kernels.inc"
#undef DFP_KERNEL
#define DFP_IMPL(level, entry, implementation, name, when) \
  if (when) t.entry = {&level::implementation, name};
  if (isa >= Isa::avx2) {
#include "simd/onednn/kernels.inc"
  }
  if (isa == Isa::avx2) {
#include "simd/avx2/kernels.inc"
  }
  if (isa >= Isa::avx512bw) {
#include "simd/avx512/kernels.inc"
  }
#undef DFP_IMPL
  return t;
}

}  // namespace dfp::simd
