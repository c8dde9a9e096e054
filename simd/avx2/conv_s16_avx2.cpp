// INT16 micro-kernels with VPMADDWD + VPADDD on YMM (AVX2). See conv_s16_kernels.hpp.
#include "simd/avx2/conv_s16_kernels.hpp"

namespace dfp::simd::avx2 {
void conv_s16_pixel(const PixelKernelArgs& a) { pixel_entry<DotMadd>(a); }
void conv_s16_pair(const PairKernelArgs& a) { pair_entry<DotMadd>(a); }
}  // namespace dfp::simd::avx2
