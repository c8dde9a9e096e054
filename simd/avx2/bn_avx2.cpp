// AVX2 BatchNorm kernels: two YMM per blocked pixel (16 channels, lanes 0-7 and 8-15),
// bit-identical to simd/ref/bn_ref.cpp (compiled with -ffp-contract=off, so no multiply-add is
// fused; every lane runs the reference's operations in its order).
#include <immintrin.h>

#include <algorithm>
#include <cmath>

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

// Both halves of a pixel in one iteration: each lane's sums run in the reference's order, and the
// two halves' chains of dependent additions overlap (one half at a time, the loop would wait on
// one addition's latency per half pixel: half the AVX-512 kernel's rate).
template <class T>
void bwd_sums(const T* x, const float* dy, const uint16_t* mask, const BnCoefficients& c, size_t pixels, float* sdy,
              float* sdyx, float* glo, float* ghi) {
  const __m256 xs = _mm256_set1_ps(c.x_scale);
  __m256 mean[2], inv[2], a[2], b[2], lo[2], hi[2];
  for (int h = 0; h < 2; ++h) {
    mean[h] = _mm256_loadu_ps(c.mean + 8 * h), inv[h] = _mm256_loadu_ps(c.inv + 8 * h);
    a[h] = _mm256_loadu_ps(sdy + 8 * h), b[h] = _mm256_loadu_ps(sdyx + 8 * h);
    lo[h] = _mm256_loadu_ps(glo + 8 * h), hi[h] = _mm256_loadu_ps(ghi + 8 * h);
  }
  for (size_t i = 0; i < pixels; ++i)
    for (int h = 0; h < 2; ++h) {
      const __m256 g = load_grad(dy, mask, i, h);
      a[h] = _mm256_add_ps(a[h], g);
      lo[h] = _mm256_min_ps(g, lo[h]);  // second operand on NaN: NaN never wins
      hi[h] = _mm256_max_ps(g, hi[h]);
      const __m256 centred = _mm256_sub_ps(_mm256_mul_ps(load_x(x + i * 16 + 8 * h), xs), mean[h]);
      b[h] = _mm256_add_ps(b[h], _mm256_mul_ps(_mm256_mul_ps(g, centred), inv[h]));
    }
  for (int h = 0; h < 2; ++h) {
    _mm256_storeu_ps(sdy + 8 * h, a[h]);
    _mm256_storeu_ps(sdyx + 8 * h, b[h]);
    _mm256_storeu_ps(glo + 8 * h, lo[h]);
    _mm256_storeu_ps(ghi + 8 * h, hi[h]);
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

// Both halves per iteration, as bwd_sums.
void bn_moments(const float* x, size_t pixels, float* centre, float* dev, float* sq, float* min, float* max) {
  __m256 s[2], lo[2], hi[2];
  for (int h = 0; h < 2; ++h)
    s[h] = _mm256_setzero_ps(), lo[h] = _mm256_loadu_ps(min + 8 * h), hi[h] = _mm256_loadu_ps(max + 8 * h);
  for (size_t i = 0; i < pixels; ++i)
    for (int h = 0; h < 2; ++h) {
      const __m256 v = _mm256_loadu_ps(x + i * 16 + 8 * h);
      s[h] = _mm256_add_ps(s[h], v);
      lo[h] = _mm256_min_ps(v, lo[h]);  // minps/maxps return their second operand when either is NaN
      hi[h] = _mm256_max_ps(v, hi[h]);
    }
  const __m256 n = _mm256_set1_ps(static_cast<float>(pixels));
  const __m256 c[2] = {_mm256_div_ps(s[0], n), _mm256_div_ps(s[1], n)};
  __m256 d[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, q[2] = {d[0], d[1]};
  for (size_t i = 0; i < pixels; ++i)
    for (int h = 0; h < 2; ++h) {
      const __m256 t = _mm256_sub_ps(_mm256_loadu_ps(x + i * 16 + 8 * h), c[h]);
      d[h] = _mm256_add_ps(d[h], t);
      q[h] = _mm256_add_ps(q[h], _mm256_mul_ps(t, t));
    }
  for (int h = 0; h < 2; ++h) {
    _mm256_storeu_ps(centre + 8 * h, c[h]);
    _mm256_storeu_ps(dev + 8 * h, d[h]);
    _mm256_storeu_ps(sq + 8 * h, q[h]);
    _mm256_storeu_ps(min + 8 * h, lo[h]);
    _mm256_storeu_ps(max + 8 * h, hi[h]);
  }
}

void bn_bwd_sums_s16(const int16_t* x, const float* dy, const uint16_t* mask, const BnCoefficients& c, size_t pixels,
                     float* sdy, float* sdyx, float* glo, float* ghi) {
  bwd_sums(x, dy, mask, c, pixels, sdy, sdyx, glo, ghi);
}
void bn_bwd_sums_f32(const float* x, const float* dy, const uint16_t* mask, const BnCoefficients& c, size_t pixels,
                     float* sdy, float* sdyx, float* glo, float* ghi) {
  bwd_sums(x, dy, mask, c, pixels, sdy, sdyx, glo, ghi);
}
float bn_bwd_apply_s16(const int16_t* x, const float* dy, const uint16_t* mask, float* dx, const BnCoefficients& c,
                       size_t pixels, float max0) {
  return bwd_apply(x, dy, mask, dx, c, pixels, max0);
}
float bn_bwd_apply_f32(const float* x, const float* dy, const uint16_t* mask, float* dx, const BnCoefficients& c,
                       size_t pixels, float max0) {
  return bwd_apply(x, dy, mask, dx, c, pixels, max0);
}

// Two ymm per pixel and image. The scales 2^e_in and 2^-e_out multiply as dequantize and quantize
// do, which is exact only where they are normal floats; elsewhere the reference runs. VPACKSSDW
// then a byte shuffle within each 128-bit lane put the two images' channels side by side, which
// is interleave's order.
bool bn_requantize_pair(const int16_t* a, const int16_t* b, int e_in, const float* scale, const float* shift,
                        bool relu, int e_out, int16_t* dst, size_t pixels, int32_t* max_q) {
  if (e_in < -126 || e_in > 127 || -e_out < -126 || -e_out > 127)
    return ref::bn_requantize_pair(a, b, e_in, scale, shift, relu, e_out, dst, pixels, max_q);
  const __m256 s_in = _mm256_set1_ps(std::ldexp(1.f, e_in)), s_out = _mm256_set1_ps(std::ldexp(1.f, -e_out));
  const __m256 va[2] = {_mm256_loadu_ps(scale), _mm256_loadu_ps(scale + 8)};
  const __m256 vb[2] = {_mm256_loadu_ps(shift), _mm256_loadu_ps(shift + 8)};
  const __m256 z = _mm256_setzero_ps(), top = _mm256_set1_ps(32767.f), sign = _mm256_set1_ps(-0.f);
  const __m256i zip = _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15));
  __m256 peak[2] = {z, z}, bad = z;
  // Half h of pixel x, rounded (as a float); a NaN or |q| >= 32767 marks `bad`.
  auto one = [&](const int16_t* x, int h, __m256& pk) {
    const __m256 v = _mm256_mul_ps(load_x(x + 8 * h), s_in);
    __m256 y = _mm256_add_ps(_mm256_mul_ps(v, va[h]), vb[h]);
    if (relu) y = _mm256_and_ps(y, _mm256_cmp_ps(y, z, _CMP_GT_OQ));  // as relu_fwd
    const __m256 q = _mm256_round_ps(_mm256_mul_ps(y, s_out), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 m = _mm256_andnot_ps(sign, q);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(m, top, _CMP_NLT_UQ));
    pk = _mm256_max_ps(pk, m);
    return _mm256_cvtps_epi32(q);
  };
  for (size_t i = 0; i < pixels; ++i)
    for (int h = 0; h < 2; ++h) {
      const __m256i qa = one(a + i * 16, h, peak[0]);
      const __m256i qb = b ? one(b + i * 16, h, peak[1]) : _mm256_setzero_si256();
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i * 32 + h * 16),
                          _mm256_shuffle_epi8(_mm256_packs_epi32(qa, qb), zip));
    }
  if (_mm256_movemask_ps(bad)) return false;
  for (int k = 0; k < 2; ++k) {
    alignas(32) float m[8];
    _mm256_store_ps(m, peak[k]);
    max_q[k] = static_cast<int32_t>(*std::max_element(m, m + 8));
  }
  return true;
}

// Two ymm per pixel, as bn_requantize_pair (the reference where the scales are not normal
// floats); VPACKSSDW's 128-bit lanes put back in order by VPERMQ.
bool bn_requantize(const int16_t* x, int e_in, const float* scale, const float* shift, uint16_t* mask, int e_out,
                   int16_t* dst, size_t pixels, int32_t* max_q) {
  if (e_in < -126 || e_in > 127 || -e_out < -126 || -e_out > 127)
    return ref::bn_requantize(x, e_in, scale, shift, mask, e_out, dst, pixels, max_q);
  const __m256 s_in = _mm256_set1_ps(std::ldexp(1.f, e_in)), s_out = _mm256_set1_ps(std::ldexp(1.f, -e_out));
  const __m256 va[2] = {_mm256_loadu_ps(scale), _mm256_loadu_ps(scale + 8)};
  const __m256 vb[2] = {_mm256_loadu_ps(shift), _mm256_loadu_ps(shift + 8)};
  const __m256 z = _mm256_setzero_ps(), top = _mm256_set1_ps(32767.f), sign = _mm256_set1_ps(-0.f);
  __m256 peak = z, bad = z;
  for (size_t i = 0; i < pixels; ++i) {
    __m256i q[2];
    int bits = 0;
    for (int h = 0; h < 2; ++h) {
      const __m256 v = _mm256_mul_ps(load_x(x + i * 16 + 8 * h), s_in);
      __m256 y = _mm256_add_ps(_mm256_mul_ps(v, va[h]), vb[h]);
      if (mask) {  // as relu_fwd
        const __m256 pos = _mm256_cmp_ps(y, z, _CMP_GT_OQ);
        bits |= _mm256_movemask_ps(pos) << (8 * h);
        y = _mm256_and_ps(y, pos);
      }
      const __m256 r = _mm256_round_ps(_mm256_mul_ps(y, s_out), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m256 m = _mm256_andnot_ps(sign, r);
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(m, top, _CMP_NLT_UQ));
      peak = _mm256_max_ps(peak, m);
      q[h] = _mm256_cvtps_epi32(r);
    }
    if (mask) mask[i] = static_cast<uint16_t>(bits);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i * 16),
                        _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8));
  }
  if (_mm256_movemask_ps(bad)) return false;
  alignas(32) float m[8];
  _mm256_store_ps(m, peak);
  *max_q = static_cast<int32_t>(*std::max_element(m, m + 8));
  return true;
}

// bwd_apply's dx, then the quantization of bn_requantize (the reference where 2^-e_out is not a
// normal float).
float bn_bwd_requantize(const int16_t* x, const float* dy, const uint16_t* mask, const BnCoefficients& c,
                        size_t pixels, int e_out, int16_t* dst, int32_t* max_q) {
  if (-e_out < -126 || -e_out > 127) return ref::bn_bwd_requantize(x, dy, mask, c, pixels, e_out, dst, max_q);
  const __m256 xs = _mm256_set1_ps(c.x_scale), s_out = _mm256_set1_ps(std::ldexp(1.f, -e_out));
  const __m256 z = _mm256_setzero_ps(), top = _mm256_set1_ps(32767.f);
  __m256 mean[2], inv[2], k1[2], k2[2], k3[2];
  for (int h = 0; h < 2; ++h) {
    mean[h] = _mm256_loadu_ps(c.mean + 8 * h), inv[h] = _mm256_loadu_ps(c.inv + 8 * h);
    k1[h] = _mm256_loadu_ps(c.k1 + 8 * h), k2[h] = _mm256_loadu_ps(c.k2 + 8 * h), k3[h] = _mm256_loadu_ps(c.k3 + 8 * h);
  }
  __m256 mx = z, peak = z, bad = z;
  for (size_t i = 0; i < pixels; ++i) {
    __m256i q[2];
    for (int h = 0; h < 2; ++h) {
      const __m256 xhat = _mm256_mul_ps(_mm256_sub_ps(_mm256_mul_ps(load_x(x + i * 16 + 8 * h), xs), mean[h]), inv[h]);
      const __m256 g = load_grad(dy, mask, i, h);
      const __m256 d = _mm256_mul_ps(k1[h], _mm256_sub_ps(_mm256_sub_ps(g, k2[h]), _mm256_mul_ps(xhat, k3[h])));
      mx = _mm256_max_ps(abs_ps(d), mx);
      const __m256 r = _mm256_round_ps(_mm256_mul_ps(d, s_out), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m256 m = abs_ps(r);
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(m, top, _CMP_NLT_UQ));  // a NaN too
      peak = _mm256_max_ps(peak, m);
      q[h] = _mm256_cvtps_epi32(r);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i * 16),
                        _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8));
  }
  if (_mm256_movemask_ps(bad)) return -1.f;
  alignas(32) float m[8], p[8];
  _mm256_store_ps(m, mx);
  _mm256_store_ps(p, peak);
  *max_q = static_cast<int32_t>(*std::max_element(p, p + 8));
  return *std::max_element(m, m + 8);
}

}  // namespace dfp::simd::avx2
