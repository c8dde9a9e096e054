// INT16 micro-kernels with VPMADDWD + VPADDD, for AVX-512 CPUs without VNNI (Skylake-SP).
#include <utility>

#include "simd/avx512/conv_s16_kernels.hpp"

namespace dfp::simd::avx512 {
void conv_s16_pixel_bw(const PixelKernelArgs& a) { pixel_entry<DotBw>(a); }
void conv_s16_pair_bw(const PairKernelArgs& a) { pair_entry<DotBw>(a); }
void conv_s16_pixel_calls_bw(const PixelKernelArgs* calls, int count) { pixel_calls_entry<DotBw>(calls, count); }

// A position is one vector: |v| as unsigned words (VPABSW leaves -32768 as 0x8000 = 32768), each
// lane's two words added as INT32 halves. Two sums alternate positions, for two add chains.
void pair_row_l1(const int16_t* pairs, int rows, int cols, int64_t row_stride, int32_t* l1) {
  const __m512i low = _mm512_set1_epi32(0xFFFF);
  auto add = [&](__m512i s, const int16_t* p) {
    const __m512i v = _mm512_abs_epi16(_mm512_loadu_si512(p));
    return _mm512_add_epi32(s, _mm512_add_epi32(_mm512_and_si512(v, low), _mm512_srli_epi32(v, 16)));
  };
  for (int r = 0; r < rows; ++r) {
    const int16_t* row = pairs + r * row_stride;
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    int c = 0;
    for (; c + 2 <= cols; c += 2) {
      s0 = add(s0, row + c * 32);
      s1 = add(s1, row + c * 32 + 32);
    }
    if (c < cols) s0 = add(s0, row + c * 32);
    l1[r] = _mm512_reduce_max_epi32(_mm512_add_epi32(s0, s1));
  }
}
}  // namespace dfp::simd::avx512
