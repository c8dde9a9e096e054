// INT16 micro-kernels with VPMADDWD + VPADDD on YMM (AVX2). See conv_s16_kernels.hpp.
#include "simd/avx2/conv_s16_kernels.hpp"

namespace dfp::simd::avx2 {
void conv_s16_pixel(const PixelKernelArgs& a) { pixel_entry<DotMadd>(a); }
void conv_s16_pair(const PairKernelArgs& a) { pair_entry<DotMadd>(a); }

// A position is two vectors (lanes 0-7, 8-15): |v| as unsigned words (VPABSW leaves -32768 as
// 0x8000 = 32768), each lane's two words added as INT32 halves.
void pair_row_l1(const int16_t* pairs, int rows, int cols, int64_t row_stride, int32_t* l1) {
  const __m256i low = _mm256_set1_epi32(0xFFFF);
  auto add = [&](__m256i s, const int16_t* p) {
    const __m256i v = _mm256_abs_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm256_add_epi32(s, _mm256_add_epi32(_mm256_and_si256(v, low), _mm256_srli_epi32(v, 16)));
  };
  for (int r = 0; r < rows; ++r) {
    const int16_t* row = pairs + r * row_stride;
    __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
    for (int c = 0; c < cols; ++c) {
      lo = add(lo, row + c * 32);
      hi = add(hi, row + c * 32 + 16);
    }
    __m256i m = _mm256_max_epi32(lo, hi);
    __m128i h = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
    h = _mm_max_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
    l1[r] = _mm_cvtsi128_si32(h);
  }
}
}  // namespace dfp::simd::avx2
