// INT16 micro-kernels with VPMADDWD + VPADDD, for AVX-512 CPUs without VNNI (Skylake-SP).
#include <utility>

#include "simd/avx512/conv_s16_kernels.hpp"

namespace dfp::simd::avx512 {
void conv_s16_pixel_bw(const PixelKernelArgs& a) { pixel_entry<DotBw>(a); }
void conv_s16_pair_bw(const PairKernelArgs& a) { pair_entry<DotBw>(a); }
}  // namespace dfp::simd::avx512
