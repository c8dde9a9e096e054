// AVX-512 element-wise FP32 kernels (bit-identical to simd/ref/eltwise_ref.cpp; masked tails).
#include <immintrin.h>

#include <limits>

#include "simd/avx512/vector_loop.hpp"
#include "simd/kernel_table.hpp"

namespace dfp::simd::avx512 {
namespace {

// Transposes the 16 x 16 floats of r (row i = r[i]) in place: 4x4 blocks within each 128-bit lane
// (unpack of singles, then of pairs), then the lanes across rows four apart (two 128-bit shuffles).
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  auto pd = [](__m512 v) { return _mm512_castps_pd(v); };
  __m512 u[16];  // u[4g + j]: 128-bit lane k holds column j + 4k of rows 4g .. 4g + 3
  for (int g = 0; g < 16; g += 4) {
    u[g] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[g]), pd(t[g + 2])));
    u[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[g]), pd(t[g + 2])));
    u[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[g + 1]), pd(t[g + 3])));
    u[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[g + 1]), pd(t[g + 3])));
  }
  for (int j = 0; j < 4; ++j) {
    const __m512 lo01 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x44);  // rows 0-7, columns j, j + 4
    const __m512 hi01 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xEE);  // rows 0-7, columns j + 8, j + 12
    const __m512 lo23 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x44);
    const __m512 hi23 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xEE);
    r[j] = _mm512_shuffle_f32x4(lo01, lo23, 0x88);
    r[j + 4] = _mm512_shuffle_f32x4(lo01, lo23, 0xDD);
    r[j + 8] = _mm512_shuffle_f32x4(hi01, hi23, 0x88);
    r[j + 12] = _mm512_shuffle_f32x4(hi01, hi23, 0xDD);
  }
}
}  // namespace

// The streaming kernels mask only their last, partial vector (vector_loop.hpp).

namespace {
// x > 0 ? x : 0 and its mask word (maxps would turn -0 and NaN differently from the reference's
// compare); returns y.
template <class V>
inline __m512 relu(__m512 x, const V& v, uint16_t& mask) {
  const __mmask16 pos = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ) & v.mask();
  mask = pos;
  return _mm512_maskz_mov_ps(pos, x);
}
}  // namespace

float relu_fwd(const float* x, float* y, uint16_t* mask, size_t n) {
  __m512 mx = _mm512_setzero_ps();
  for_each_vector(n, [&](size_t i, const auto& v) {
    const __m512 r = relu(v.load(x + i), v, mask[i / 16]);
    v.store(y + i, r);
    mx = _mm512_max_ps(mx, r);
  });
  return _mm512_reduce_max_ps(mx);
}

float add_relu(const float* a, const float* b, float* y, uint16_t* mask, size_t n) {
  __m512 mx = _mm512_setzero_ps();
  for_each_vector(n, [&](size_t i, const auto& v) {
    const __m512 r = relu(_mm512_add_ps(v.load(a + i), v.load(b + i)), v, mask[i / 16]);
    v.store(y + i, r);
    mx = _mm512_max_ps(mx, r);
  });
  return _mm512_reduce_max_ps(mx);
}

void relu_bwd(const uint16_t* mask, const float* dy, float* dx, size_t n) {
  for_each_vector(n, [&](size_t i, const auto& v) {
    v.store(dx + i, _mm512_and_ps(v.load(dy + i), mask_lanes(mask[i / 16])));  // dy where the bit is set
  });
}

void add(const float* a, const float* b, float* y, size_t n) {
  for_each_vector(n, [&](size_t i, const auto& v) { v.store(y + i, _mm512_add_ps(v.load(a + i), v.load(b + i))); });
}
// Two zmm of 8 doubles: each lane's additions in the reference's order (exact conversions).
void lane_sums(const float* x, size_t pixels, double* acc) {
  __m512d lo = _mm512_loadu_pd(acc), hi = _mm512_loadu_pd(acc + 8);
  for (size_t p = 0; p < pixels; ++p) {
    lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm256_loadu_ps(x + p * 16)));
    hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_loadu_ps(x + p * 16 + 8)));
  }
  _mm512_storeu_pd(acc, lo);
  _mm512_storeu_pd(acc + 8, hi);
}
void shift_lanes(const float* a, const float* b, int shift, size_t in_step, float* out, size_t out_step, size_t pixels,
                 uint16_t keep) {
  // Lane l takes element l + shift of the 32 that a's and b's pixels make: one two-source permute.
  const __m512i idx = _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                       _mm512_set1_epi32(shift));
  // Lanes whose source is absent are not kept.
  __mmask16 k = keep;
  for (int l = 0; l < 16; ++l)
    if (!(l + shift < 16 ? a : b)) k &= static_cast<__mmask16>(~(1u << l));
  const __m512 z = _mm512_setzero_ps();
  for (size_t p = 0; p < pixels; ++p) {
    const __m512 va = a ? _mm512_loadu_ps(a + p * in_step * 16) : z;
    const __m512 vb = b ? _mm512_loadu_ps(b + p * in_step * 16) : z;
    _mm512_storeu_ps(out + p * out_step * 16, _mm512_maskz_permutex2var_ps(k, va, idx, vb));
  }
}

// 16 pixels at a time: the lanes' 16-pixel rows are loaded, transposed into the pixels' 16-lane
// rows, and stored.
float to_blocked(const float* plain, size_t plane, int lanes, float* blocked, size_t pixels) {
  const __m512 magnitude = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  __m512 mx = _mm512_setzero_ps();
  __m512 r[16];
  for (size_t p = 0; p < pixels; p += 16) {
    const __mmask16 m = tail_mask(pixels - p);
    for (int l = 0; l < 16; ++l) {
      r[l] = l < lanes ? _mm512_maskz_loadu_ps(m, plain + size_t(l) * plane + p) : _mm512_setzero_ps();
      mx = _mm512_max_ps(_mm512_and_ps(r[l], magnitude), mx);  // NaN never wins, as in the reference
    }
    transpose16(r);
    const size_t count = pixels - p < 16 ? pixels - p : 16;
    for (size_t i = 0; i < count; ++i) _mm512_storeu_ps(blocked + (p + i) * 16, r[i]);
  }
  return _mm512_reduce_max_ps(mx);
}

void from_blocked(const float* blocked, int lanes, float* plain, size_t plane, size_t pixels) {
  __m512 r[16];
  for (size_t p = 0; p < pixels; p += 16) {
    const __mmask16 m = tail_mask(pixels - p);
    const size_t count = pixels - p < 16 ? pixels - p : 16;
    for (size_t i = 0; i < 16; ++i) r[i] = i < count ? _mm512_loadu_ps(blocked + (p + i) * 16) : _mm512_setzero_ps();
    transpose16(r);
    for (int l = 0; l < lanes; ++l) _mm512_mask_storeu_ps(plain + size_t(l) * plane + p, m, r[l]);
  }
}
void maxpool_row(const MaxPoolRowArgs& a) {
  for (int o = 0; o < a.out_w; ++o) {
    __m512 best = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    __m128i arg = _mm_set1_epi8(char(255));
    bool first = true;
    maxpool_taps(a, o, [&](const float* px, int tap) {
      const __m512 v = _mm512_loadu_ps(px);
      const __mmask16 gt = first ? __mmask16(0xFFFF) : _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);
      best = _mm512_mask_mov_ps(best, gt, v);
      arg = _mm_mask_mov_epi8(arg, gt, _mm_set1_epi8(char(tap)));
      first = false;
    });
    _mm512_storeu_ps(a.y + size_t(o) * 16, best);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(a.arg + size_t(o) * 16), arg);
  }
}
void maxpool_row_bwd(const MaxPoolRowBwdArgs& a) {
  for (int o = 0; o < a.out_w; ++o) {
    const __m512 g = _mm512_loadu_ps(a.dy + size_t(o) * 16);
    const __m128i arg = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.arg + size_t(o) * 16));
    for (int t = 0; t < a.k * a.k; ++t) {
      const __mmask16 m = _mm_cmpeq_epi8_mask(arg, _mm_set1_epi8(char(t)));
      if (!m) continue;
      float* d = a.rows[t / a.k] + size_t(o * a.stride - a.pad + t % a.k) * 16;
      const __m512 v = _mm512_loadu_ps(d);
      _mm512_storeu_ps(d, _mm512_mask_add_ps(v, m, v, g));
    }
  }
}
}  // namespace dfp::simd::avx512
