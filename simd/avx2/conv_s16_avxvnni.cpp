// INT16 micro-kernels with the VEX-encoded VPDPWSSD on YMM (AVX-VNNI, compiled with -mavxvnni).
// See conv_s16_kernels.hpp.
#include "simd/avx2/conv_s16_kernels.hpp"

namespace dfp::simd::avxvnni {
void conv_s16_pixel(const PixelKernelArgs& a) { pixel_entry<DotAvxVnni>(a); }
void conv_s16_pair(const PairKernelArgs& a) { pair_entry<DotAvxVnni>(a); }
void conv_s16_pixel_calls(const PixelKernelArgs* calls, int count) { pixel_calls_entry<DotAvxVnni>(calls, count); }
}  // namespace dfp::simd::avxvnni
