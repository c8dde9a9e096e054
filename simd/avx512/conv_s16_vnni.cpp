// INT16 micro-kernels with VPDPWSSD (compiled with -mavx512vnni). See conv_s16_kernels.hpp.
#include <utility>

#include "simd/avx512/conv_s16_kernels.hpp"

namespace dfp::simd::avx512vnni {
void conv_s16_pixel(const PixelKernelArgs& a) { pixel_entry<DotVnni>(a); }
void conv_s16_pair(const PairKernelArgs& a) { pair_entry<DotVnni>(a); }
void conv_s16_pixel_calls(const PixelKernelArgs* calls, int count) { pixel_calls_entry<DotVnni>(calls, count); }
}  // namespace dfp::simd::avx512vnni
