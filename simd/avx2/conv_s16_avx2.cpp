// INT16 micro-kernels with VPMADDWD + VPADDD on YMM (AVX2). See conv_s16_kernels.hpp.
#include <algorithm>

#include "simd/avx2/conv_s16_kernels.hpp"

namespace dfp::simd::avx2 {
void conv_s16_pixel(const PixelKernelArgs& a) { pixel_entry<DotMadd>(a); }
void conv_s16_pair(const PairKernelArgs& a) { pair_entry<DotMadd>(a); }
void conv_s16_pixel_calls(const PixelKernelArgs* calls, int count) { pixel_calls_entry<DotMadd>(calls, count); }

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

namespace {

// Each lane's two words as unsigned magnitudes, added as INT32 (see pair_row_l1).
inline __m256i pair_magnitudes(__m256i v) {
  v = _mm256_abs_epi16(v);
  return _mm256_add_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_srli_epi32(v, 16));
}

// r[0..7] as an 8 x 8 INT32 matrix, transposed in place.
inline void transpose8x8_epi32(__m256i* r) {
  __m256i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
  }
}

inline int32_t max_lane(__m256i m) {
  __m128i h = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  h = _mm_max_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
  h = _mm_max_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(h);
}

}  // namespace

// A unit's 16 rows of 16 weights are 16 YMM registers. Backward-data's pairs along k interleave
// rows 2j and 2j + 1; the forward's pairs along c are the rows' INT32 words transposed (two 8 x 8
// transposes). With several taps a unit's rows are first gathered from the [c][tap] runs, which
// stay in L1 from one tap to the next.
void pack_weights(const PackWeightsArgs& a) {
  alignas(32) int16_t unit[16][16];
  // Lanes 0-7 (s0) and 8-15 (s1) to dst[l * stride].
  auto store_lanes = [](__m256i s0, __m256i s1, int32_t* dst, int64_t stride) {
    alignas(32) int32_t sums[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(sums), s0);
    _mm256_store_si256(reinterpret_cast<__m256i*>(sums + 8), s1);
    for (int l = 0; l < 16; ++l) dst[l * stride] = sums[l];
  };
  __m256i f_max = _mm256_setzero_si256(), b_max = _mm256_setzero_si256();
  for (int t = 0; t < a.taps; ++t) {
    const int16_t* rows = a.src;
    int64_t stride = a.row_stride;
    if (a.taps > 1) {
      for (int l = 0; l < 16; ++l)
        for (int c = 0; c < 16; ++c) unit[l][c] = a.src[l * a.row_stride + c * a.taps + t];
      rows = &unit[0][0];
      stride = 16;
    }
    __m256i r[16];
    for (int l = 0; l < 16; ++l) r[l] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows + l * stride));
    if (a.b) {
      __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
      int16_t* b = a.b + t * 256;
      for (int j = 0; j < 8; ++j) {
        const __m256i lo = _mm256_unpacklo_epi16(r[2 * j], r[2 * j + 1]);
        const __m256i hi = _mm256_unpackhi_epi16(r[2 * j], r[2 * j + 1]);
        const __m256i o0 = _mm256_permute2x128_si256(lo, hi, 0x20), o1 = _mm256_permute2x128_si256(lo, hi, 0x31);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(b + j * 32), o0);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(b + j * 32 + 16), o1);
        const __m256i p0 = pair_magnitudes(o0), p1 = pair_magnitudes(o1);
        s0 = _mm256_add_epi32(s0, p0);
        s1 = _mm256_add_epi32(s1, p1);
        b_max = _mm256_max_epi32(b_max, _mm256_max_epi32(p0, p1));
      }
      store_lanes(s0, s1, a.l1_b + t, a.l1_b_stride);
    }
    if (a.f) {
      transpose8x8_epi32(r);      // r[j]: pair j of lanes 0-7
      transpose8x8_epi32(r + 8);  // r[8 + j]: pair j of lanes 8-15
      __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
      int16_t* f = a.f + t * 256;
      for (int j = 0; j < 8; ++j) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(f + j * 32), r[j]);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(f + j * 32 + 16), r[8 + j]);
        const __m256i p0 = pair_magnitudes(r[j]), p1 = pair_magnitudes(r[8 + j]);
        s0 = _mm256_add_epi32(s0, p0);
        s1 = _mm256_add_epi32(s1, p1);
        f_max = _mm256_max_epi32(f_max, _mm256_max_epi32(p0, p1));
      }
      store_lanes(s0, s1, a.l1_f + t, a.l1_f_stride);
    }
  }
  if (a.f) a.pair_max[0] = std::max(a.pair_max[0], max_lane(f_max));
  if (a.b) a.pair_max[1] = std::max(a.pair_max[1], max_lane(b_max));
}
}  // namespace dfp::simd::avx2
