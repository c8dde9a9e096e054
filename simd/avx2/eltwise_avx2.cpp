// AVX2 element-wise FP32 kernels, bit-identical to simd/ref/eltwise_ref.cpp. A 16-lane group (one
// mask word) is two YMM; a tail shorter than 16 is read and written with VMASKMOVPS, whose
// masked-off lanes neither fault nor store.
#include <immintrin.h>

#include <limits>

#include "simd/kernel_table.hpp"

namespace dfp::simd::avx2 {
namespace {

// All-ones in lanes l < left (of 8).
inline __m256i first_lanes(size_t left) {
  const int k = left >= 8 ? 8 : static_cast<int>(left);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Mask bits 0-7 (h = 0) or 8-15 (h = 1) of a word as all-ones lanes.
inline __m256 bits_to_lanes(uint16_t word, int h) {
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i w = _mm256_set1_epi32(word >> (8 * h));
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(w, bit), bit));
}

// 16 elements from i on (fewer at the tail: absent lanes read 0 and are not written).
struct Group {
  size_t left;
  __m256i m0, m1;
  explicit Group(size_t left_) : left(left_) {
    if (left < 16) {
      m0 = first_lanes(left);
      m1 = first_lanes(left > 8 ? left - 8 : 0);
    }
  }
  __m256 load(const float* p, int h) const {
    if (left >= 16) return _mm256_loadu_ps(p + 8 * h);
    return _mm256_maskload_ps(p + 8 * h, h ? m1 : m0);
  }
  void store(float* p, int h, __m256 v) const {
    if (left >= 16) return _mm256_storeu_ps(p + 8 * h, v);
    _mm256_maskstore_ps(p + 8 * h, h ? m1 : m0, v);
  }
};

inline float reduce_max(__m256 v) {
  alignas(32) float m[8];
  _mm256_store_ps(m, v);
  float r = m[0];
  for (int l = 1; l < 8; ++l) r = m[l] > r ? m[l] : r;
  return r;
}

// y = v > 0 ? v : 0 (maxps would turn -0 and NaN differently from the reference's compare);
// returns the mask bits, and the running max takes y.
inline unsigned relu8(__m256 v, __m256& r, __m256& mx) {
  const __m256 pos = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GT_OQ);
  r = _mm256_and_ps(v, pos);
  mx = _mm256_max_ps(mx, r);
  return static_cast<unsigned>(_mm256_movemask_ps(pos));
}

}  // namespace

float relu_fwd(const float* x, float* y, uint16_t* mask, size_t n) {
  __m256 mx = _mm256_setzero_ps();
  for (size_t i = 0; i < n; i += 16) {
    const Group g(n - i);
    __m256 r0, r1;
    const unsigned lo = relu8(g.load(x + i, 0), r0, mx), hi = relu8(g.load(x + i, 1), r1, mx);
    g.store(y + i, 0, r0);
    g.store(y + i, 1, r1);
    mask[i / 16] = static_cast<uint16_t>(lo | hi << 8);  // absent lanes read 0: their bits are clear
  }
  return reduce_max(mx);
}

float add_relu(const float* a, const float* b, float* y, uint16_t* mask, size_t n) {
  __m256 mx = _mm256_setzero_ps();
  for (size_t i = 0; i < n; i += 16) {
    const Group g(n - i);
    __m256 r0, r1;
    const unsigned lo = relu8(_mm256_add_ps(g.load(a + i, 0), g.load(b + i, 0)), r0, mx);
    const unsigned hi = relu8(_mm256_add_ps(g.load(a + i, 1), g.load(b + i, 1)), r1, mx);
    g.store(y + i, 0, r0);
    g.store(y + i, 1, r1);
    mask[i / 16] = static_cast<uint16_t>(lo | hi << 8);
  }
  return reduce_max(mx);
}

void relu_bwd(const uint16_t* mask, const float* dy, float* dx, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    const Group g(n - i);
    for (int h = 0; h < 2; ++h) g.store(dx + i, h, _mm256_and_ps(g.load(dy + i, h), bits_to_lanes(mask[i / 16], h)));
  }
}

void add(const float* a, const float* b, float* y, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    const Group g(n - i);
    for (int h = 0; h < 2; ++h) g.store(y + i, h, _mm256_add_ps(g.load(a + i, h), g.load(b + i, h)));
  }
}

// Four ymm of 4 doubles: each lane's additions in the reference's order (exact conversions).
void lane_sums(const float* x, size_t pixels, double* acc) {
  __m256d a[4];
  for (int k = 0; k < 4; ++k) a[k] = _mm256_loadu_pd(acc + 4 * k);
  for (size_t p = 0; p < pixels; ++p)
    for (int k = 0; k < 4; ++k) a[k] = _mm256_add_pd(a[k], _mm256_cvtps_pd(_mm_loadu_ps(x + p * 16 + 4 * k)));
  for (int k = 0; k < 4; ++k) _mm256_storeu_pd(acc + 4 * k, a[k]);
}
void shift_lanes(const float* a, const float* b, int shift, size_t in_step, float* out, size_t out_step, size_t pixels,
                 uint16_t keep) {
  // Output lane l takes element l + shift of the 32 that a's and b's pixels make, as four blocks
  // of 8 (a's halves, b's halves). Output half h starts at element s = 8h + shift: block q = s / 8
  // at offset r = s % 8, its lanes l < 8 - r from block q and the others from block q + 1, each
  // through one in-lane-crossing permute with indices (l + r) % 8.
  uint16_t k = keep;  // lanes whose source is absent are not kept
  for (int l = 0; l < 16; ++l)
    if (!(l + shift < 16 ? a : b)) k = static_cast<uint16_t>(k & ~(1u << l));
  const int r = shift % 8;
  const __m256i idx = _mm256_and_si256(_mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(r)),
                                       _mm256_set1_epi32(7));
  const __m256 upper = _mm256_castsi256_ps(
      _mm256_cmpgt_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(7 - r)));  // l >= 8 - r
  const __m256 keep0 = bits_to_lanes(k, 0), keep1 = bits_to_lanes(k, 1);
  const int q0 = shift / 8;
  const __m256 z = _mm256_setzero_ps();
  for (size_t p = 0; p < pixels; ++p) {
    const float* pa = a ? a + p * in_step * 16 : nullptr;
    const float* pb = b ? b + p * in_step * 16 : nullptr;
    const __m256 blk[4] = {pa ? _mm256_loadu_ps(pa) : z, pa ? _mm256_loadu_ps(pa + 8) : z, pb ? _mm256_loadu_ps(pb) : z,
                           pb ? _mm256_loadu_ps(pb + 8) : z};
    float* o = out + p * out_step * 16;
    for (int h = 0; h < 2; ++h) {
      const int q = q0 + h;  // <= 2, so q + 1 <= 3
      const __m256 v = _mm256_blendv_ps(_mm256_permutevar8x32_ps(blk[q], idx),
                                        _mm256_permutevar8x32_ps(blk[q + 1], idx), upper);
      _mm256_storeu_ps(o + 8 * h, _mm256_and_ps(v, h ? keep1 : keep0));
    }
  }
}

// Sixteen lanes as two YMM halves; the taps as INT32 lanes (blended with the values' masks),
// packed to bytes at the end.
void maxpool_row(const MaxPoolRowArgs& a) {
  for (int o = 0; o < a.out_w; ++o) {
    __m256 best[2], arg[2];
    for (int h = 0; h < 2; ++h) {
      best[h] = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
      arg[h] = _mm256_castsi256_ps(_mm256_set1_epi32(255));
    }
    bool first = true;
    maxpool_taps(a, o, [&](const float* px, int tap) {
      const __m256 t = _mm256_castsi256_ps(_mm256_set1_epi32(tap));
      for (int h = 0; h < 2; ++h) {
        const __m256 v = _mm256_loadu_ps(px + 8 * h);
        const __m256 gt = first ? _mm256_castsi256_ps(_mm256_set1_epi32(-1)) : _mm256_cmp_ps(v, best[h], _CMP_GT_OQ);
        best[h] = _mm256_blendv_ps(best[h], v, gt);
        arg[h] = _mm256_blendv_ps(arg[h], t, gt);
      }
      first = false;
    });
    _mm256_storeu_ps(a.y + size_t(o) * 16, best[0]);
    _mm256_storeu_ps(a.y + size_t(o) * 16 + 8, best[1]);
    // INT32 taps (0..255) -> INT16 (packs works within 128-bit lanes, the permute restores the
    // order) -> bytes.
    const __m256i w = _mm256_permute4x64_epi64(
        _mm256_packs_epi32(_mm256_castps_si256(arg[0]), _mm256_castps_si256(arg[1])), 0xD8);
    const __m128i b = _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(a.arg + size_t(o) * 16), b);
  }
}
void maxpool_row_bwd(const MaxPoolRowBwdArgs& a) {
  for (int o = 0; o < a.out_w; ++o) {
    const __m128i arg = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.arg + size_t(o) * 16));
    for (int t = 0; t < a.k * a.k; ++t) {
      const __m128i eq = _mm_cmpeq_epi8(arg, _mm_set1_epi8(char(t)));
      if (_mm_movemask_epi8(eq) == 0) continue;
      float* d = a.rows[t / a.k] + size_t(o * a.stride - a.pad + t % a.k) * 16;
      for (int h = 0; h < 2; ++h) {
        const __m256 m = _mm256_castsi256_ps(_mm256_cvtepi8_epi32(h ? _mm_srli_si128(eq, 8) : eq));
        const __m256 v = _mm256_loadu_ps(d + 8 * h);
        _mm256_storeu_ps(d + 8 * h, _mm256_blendv_ps(v, _mm256_add_ps(v, _mm256_loadu_ps(a.dy + size_t(o) * 16 + 8 * h)), m));
      }
    }
  }
}
}  // namespace dfp::simd::avx2
