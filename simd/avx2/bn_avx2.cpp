// AVX2 BatchNorm kernels: two YMM per blocked pixel (16 channels, lanes 0-7 and 8-15),
// bit-identical to simd/ref/bn_ref.cpp (compiled with -ffp-contract=off, so no multiply-add is
// fused; every lane runs the reference's operations in its order).
#include <immintrin.h>

#include "simd/kernel_table.hpp"

namespace dfp::simd::avx2 {
namespace {

inline __m256 load_x(const float* x) { return _mm256_loadu_ps(x); }
inline __m256 load_x(const int16_t* x) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x))));
}

// dy's half h of pixel i, or 0 where a fused ReLU's mask bit is clear.
inline __m256 load_grad(const float* dy, const uint16_t* mask, size_t i, int h) {
  const __m256 g = _mm256_loadu_ps(dy + i * 16 + 8 * h);
  if (!mask) return g;
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i w = _mm256_set1_epi32(mask[i] >> (8 * h));
  return _mm256_and_ps(g, _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(w, bit), bit)));
}

inline __m256 abs_ps(__m256 x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.f), x); }

template <class T>
void bwd_sums(const T* x, const float* dy, const uint16_t* mask, const BnCoefficients& c, size_t pixels, float* sdy,
              float* sdyx) {
  const __m256 xs = _mm256_set1_ps(c.x_scale);
  for (int h = 0; h < 2; ++h) {
    const __m256 mean = _mm256_loadu_ps(c.mean + 8 * h), inv = _mm256_loadu_ps(c.inv + 8 * h);
    __m256 a = _mm256_loadu_ps(sdy + 8 * h), b = _mm256_loadu_ps(sdyx + 8 * h);
    for (size_t i = 0; i < pixels; ++i) {
      const __m256 g = load_grad(dy, mask, i, h);
      a = _mm256_add_ps(a, g);
      const __m256 centred = _mm256_sub_ps(_mm256_mul_ps(load_x(x + i * 16 + 8 * h), xs), mean);
      b = _mm256_add_ps(b, _mm256_mul_ps(_mm256_mul_ps(g, centred), inv));
    }
    _mm256_storeu_ps(sdy + 8 * h, a);
    _mm256_storeu_ps(sdyx + 8 * h, b);
  }
}

template <class T>
float bwd_apply(const T* x, const float* dy, const uint16_t* mask, float* dx, const BnCoefficients& c, size_t pixels,
                float max0) {
  __m256 mx = _mm256_set1_ps(max0);
  const __m256 xs = _mm256_set1_ps(c.x_scale);
  __m256 mean[2], inv[2], k1[2], k2[2], k3[2];
  for (int h = 0; h < 2; ++h) {
    mean[h] = _mm256_loadu_ps(c.mean + 8 * h), inv[h] = _mm256_loadu_ps(c.inv + 8 * h);
    k1[h] = _mm256_loadu_ps(c.k1 + 8 * h), k2[h] = _mm256_loadu_ps(c.k2 + 8 * h), k3[h] = _mm256_loadu_ps(c.k3 + 8 * h);
  }
  for (size_t i = 0; i < pixels; ++i)
    for (int h = 0; h < 2; ++h) {
      const __m256 xhat = _mm256_mul_ps(_mm256_sub_ps(_mm256_mul_ps(load_x(x + i * 16 + 8 * h), xs), mean[h]), inv[h]);
      const __m256 g = load_grad(dy, mask, i, h);
      const __m256 d = _mm256_mul_ps(k1[h], _mm256_sub_ps(_mm256_sub_ps(g, k2[h]), _mm256_mul_ps(xhat, k3[h])));
      _mm256_storeu_ps(dx + i * 16 + 8 * h, d);
      mx = _mm256_max_ps(abs_ps(d), mx);  // second operand on NaN: NaN never wins
    }
  alignas(32) float m[8];
  _mm256_store_ps(m, mx);
  float r = m[0];
  for (int l = 1; l < 8; ++l) r = m[l] > r ? m[l] : r;
  return r;
}

}  // namespace

void bn_scale_shift(const float* x, float* y, const float* a, const float* b, size_t pixels) {
  const __m256 a0 = _mm256_loadu_ps(a), a1 = _mm256_loadu_ps(a + 8);
  const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
  for (size_t i = 0; i < pixels; ++i) {
    _mm256_storeu_ps(y + i * 16, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i * 16), a0), b0));
    _mm256_storeu_ps(y + i * 16 + 8, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i * 16 + 8), a1), b1));
  }
}

void bn_moments(const float* x, size_t pixels, float* centre, float* dev, float* sq, float* min, float* max) {
  for (int h = 0; h < 2; ++h) {
    __m256 s = _mm256_setzero_ps(), lo = _mm256_loadu_ps(min + 8 * h), hi = _mm256_loadu_ps(max + 8 * h);
    for (size_t i = 0; i < pixels; ++i) {
      const __m256 v = _mm256_loadu_ps(x + i * 16 + 8 * h);
      s = _mm256_add_ps(s, v);
      lo = _mm256_min_ps(v, lo);  // minps/maxps return their second operand when either is NaN
      hi = _mm256_max_ps(v, hi);
    }
    const __m256 c = _mm256_div_ps(s, _mm256_set1_ps(static_cast<float>(pixels)));
    __m256 d = _mm256_setzero_ps(), q = _mm256_setzero_ps();
    for (size_t i = 0; i < pixels; ++i) {
      const __m256 t = _mm256_sub_ps(_mm256_loadu_ps(x + i * 16 + 8 * h), c);
      d = _mm256_add_ps(d, t);
      q = _mm256_add_ps(q, _mm256_mul_ps(t, t));
    }
    _mm256_storeu_ps(centre + 8 * h, c);
    _mm256_storeu_ps(dev + 8 * h, d);
    _mm256_storeu_ps(sq + 8 * h, q);
    _mm256_storeu_ps(min + 8 * h, lo);
    _mm256_storeu_ps(max + 8 * h, hi);
  }
}

void bn_bwd_sums_s16(const int16_t* x, const float* dy, const uint16_t* mask, const BnCoefficients& c, size_t pixels,
                     float* sdy, float* sdyx) {
  bwd_sums(x, dy, mask, c, pixels, sdy, sdyx);
}
void bn_bwd_sums_f32(const float* x, const float* dy, const uint16_t* mask, const BnCoefficients& c, size_t pixels,
                     float* sdy, float* sdyx) {
  bwd_sums(x, dy, mask, c, pixels, sdy, sdyx);
}
float bn_bwd_apply_s16(const int16_t* x, const float* dy, const uint16_t* mask, float* dx, const BnCoefficients& c,
                       size_t pixels, float max0) {
  return bwd_apply(x, dy, mask, dx, c, pixels, max0);
}
float bn_bwd_apply_f32(const float* x, const float* dy, const uint16_t* mask, float* dx, const BnCoefficients& c,
                       size_t pixels, float max0) {
  return bwd_apply(x, dy, mask, dx, c, pixels, max0);
}

}  // namespace dfp::simd::avx2
