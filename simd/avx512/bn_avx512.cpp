// AVX-512 BatchNorm kernels: one zmm per blocked pixel (16 channels), bit-identical to
// simd/ref/bn_ref.cpp (compiled with -ffp-contract=off, so no multiply-add is fused).
#include <immintrin.h>

#include <algorithm>

#include "simd/avx512/vector_loop.hpp"
#include "simd/kernel_table.hpp"

namespace dfp::simd::avx512 {
namespace {

inline __m512 load_x(const float* x) { return _mm512_loadu_ps(x); }
inline __m512 load_x(const int16_t* x) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))));
}

// dy, or 0 where a fused ReLU's mask bit is clear (mask_lanes: not a load masked by the word,
// vector_loop.hpp).
inline __m512 load_grad(const float* dy, const uint16_t* mask, size_t i) {
  const __m512 g = _mm512_loadu_ps(dy + i * 16);
  return mask ? _mm512_and_ps(g, mask_lanes(mask[i])) : g;
}

template <class T>
void bwd_sums(const T* x, const float* dy, const uint16_t* mask, const BnCoefficients& c, size_t pixels, float* sdy,
              float* sdyx, float* glo, float* ghi) {
  const __m512 xs = _mm512_set1_ps(c.x_scale), mean = _mm512_loadu_ps(c.mean), inv = _mm512_loadu_ps(c.inv);
  __m512 a = _mm512_loadu_ps(sdy), b = _mm512_loadu_ps(sdyx);
  __m512 lo = _mm512_loadu_ps(glo), hi = _mm512_loadu_ps(ghi);
  for (size_t i = 0; i < pixels; ++i) {
    const __m512 g = load_grad(dy, mask, i);
    a = _mm512_add_ps(a, g);
    lo = _mm512_min_ps(g, lo);  // second operand on NaN: NaN never wins
    hi = _mm512_max_ps(g, hi);
    const __m512 centred = _mm512_sub_ps(_mm512_mul_ps(load_x(x + i * 16), xs), mean);
    b = _mm512_add_ps(b, _mm512_mul_ps(_mm512_mul_ps(g, centred), inv));
  }
  _mm512_storeu_ps(sdy, a);
  _mm512_storeu_ps(sdyx, b);
  _mm512_storeu_ps(glo, lo);
  _mm512_storeu_ps(ghi, hi);
}

template <class T>
float bwd_apply(const T* x, const float* dy, const uint16_t* mask, float* dx, const BnCoefficients& c, size_t pixels,
                float max0) {
  __m512 mx = _mm512_set1_ps(max0);
  const __m512 xs = _mm512_set1_ps(c.x_scale), mean = _mm512_loadu_ps(c.mean), inv = _mm512_loadu_ps(c.inv);
  const __m512 k1 = _mm512_loadu_ps(c.k1), k2 = _mm512_loadu_ps(c.k2), k3 = _mm512_loadu_ps(c.k3);
  for (size_t i = 0; i < pixels; ++i) {
    const __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(_mm512_mul_ps(load_x(x + i * 16), xs), mean), inv);
    const __m512 g = load_grad(dy, mask, i);
    const __m512 d = _mm512_mul_ps(k1, _mm512_sub_ps(_mm512_sub_ps(g, k2), _mm512_mul_ps(xhat, k3)));
    _mm512_storeu_ps(dx + i * 16, d);
    mx = _mm512_max_ps(_mm512_abs_ps(d), mx);  // second operand on NaN
  }
  return _mm512_reduce_max_ps(mx);
}

}  // namespace

void bn_scale_shift(const float* x, float* y, const float* a, const float* b, size_t pixels) {
  const __m512 va = _mm512_loadu_ps(a), vb = _mm512_loadu_ps(b);
  for (size_t i = 0; i < pixels; ++i)
    _mm512_storeu_ps(y + i * 16, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i * 16), va), vb));
}

void bn_moments(const float* x, size_t pixels, float* centre, float* dev, float* sq, float* min, float* max) {
  __m512 s = _mm512_setzero_ps(), lo = _mm512_loadu_ps(min), hi = _mm512_loadu_ps(max);
  for (size_t i = 0; i < pixels; ++i) {
    const __m512 v = _mm512_loadu_ps(x + i * 16);
    s = _mm512_add_ps(s, v);
    lo = _mm512_min_ps(v, lo);  // minps/maxps return their second operand when either is NaN
    hi = _mm512_max_ps(v, hi);
  }
  const __m512 c = _mm512_div_ps(s, _mm512_set1_ps(static_cast<float>(pixels)));
  __m512 d = _mm512_setzero_ps(), q = _mm512_setzero_ps();
  for (size_t i = 0; i < pixels; ++i) {
    const __m512 t = _mm512_sub_ps(_mm512_loadu_ps(x + i * 16), c);
    d = _mm512_add_ps(d, t);
    q = _mm512_add_ps(q, _mm512_mul_ps(t, t));
  }
  _mm512_storeu_ps(centre, c);
  _mm512_storeu_ps(dev, d);
  _mm512_storeu_ps(sq, q);
  _mm512_storeu_ps(min, lo);
  _mm512_storeu_ps(max, hi);
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

// One zmm per pixel and image: the dequantization and the quantization scale by VSCALEFPS, as
// dequantize and quantize do (exact at any exponent); VPACKSSDW then a byte shuffle within each
// 128-bit lane put the two images' channels 4k..4k+3 side by side, which is interleave's order.
bool bn_requantize_pair(const int16_t* a, const int16_t* b, int e_in, const float* scale, const float* shift,
                        bool relu, int e_out, int16_t* dst, size_t pixels, int32_t* max_q) {
  const __m512 ein = _mm512_set1_ps(static_cast<float>(e_in)), neg_eout = _mm512_set1_ps(static_cast<float>(-e_out));
  const __m512 va = _mm512_loadu_ps(scale), vb = _mm512_loadu_ps(shift), z = _mm512_setzero_ps();
  // Words 0-3 (image a) and 4-7 (image b) of each lane, zipped.
  const __m512i zip = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15));
  // A NaN, an infinity or a value beyond INT32 converts to INT32_MIN, whose |.| is 2^31 unsigned.
  auto one = [&](const int16_t* x) {
    const __m512 v = _mm512_scalef_ps(load_x(x), ein);
    __m512 y = _mm512_add_ps(_mm512_mul_ps(v, va), vb);
    if (relu) y = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(y, z, _CMP_GT_OQ), y);  // as relu_fwd
    return _mm512_cvt_roundps_epi32(_mm512_scalef_ps(y, neg_eout), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  };
  __m512i peak_a = _mm512_setzero_si512(), peak_b = _mm512_setzero_si512();
  for (size_t i = 0; i < pixels; ++i) {
    const __m512i qa = one(a + i * 16);
    peak_a = _mm512_max_epu32(peak_a, _mm512_abs_epi32(qa));
    __m512i qb = _mm512_setzero_si512();
    if (b) {
      qb = one(b + i * 16);
      peak_b = _mm512_max_epu32(peak_b, _mm512_abs_epi32(qb));
    }
    _mm512_storeu_si512(dst + i * 32, _mm512_shuffle_epi8(_mm512_packs_epi32(qa, qb), zip));
  }
  max_q[0] = static_cast<int32_t>(std::min(_mm512_reduce_max_epu32(peak_a), 0x7FFFFFFFu));
  max_q[1] = static_cast<int32_t>(std::min(_mm512_reduce_max_epu32(peak_b), 0x7FFFFFFFu));
  return max_q[0] < 32767 && max_q[1] < 32767;
}

// One zmm per pixel, as bn_requantize_pair; the ReLU's mask is the comparison's mask register.
bool bn_requantize(const int16_t* x, int e_in, const float* scale, const float* shift, uint16_t* mask, int e_out,
                   int16_t* dst, size_t pixels, int32_t* max_q) {
  const __m512 ein = _mm512_set1_ps(static_cast<float>(e_in)), neg_eout = _mm512_set1_ps(static_cast<float>(-e_out));
  const __m512 va = _mm512_loadu_ps(scale), vb = _mm512_loadu_ps(shift), z = _mm512_setzero_ps();
  __m512i peak = _mm512_setzero_si512();
  for (size_t i = 0; i < pixels; ++i) {
    const __m512 v = _mm512_scalef_ps(load_x(x + i * 16), ein);
    __m512 y = _mm512_add_ps(_mm512_mul_ps(v, va), vb);
    if (mask) {  // as relu_fwd
      const __mmask16 pos = _mm512_cmp_ps_mask(y, z, _CMP_GT_OQ);
      mask[i] = static_cast<uint16_t>(pos);
      y = _mm512_maskz_mov_ps(pos, y);
    }
    // A NaN, an infinity or a value beyond INT32 converts to INT32_MIN, whose |.| is 2^31 unsigned.
    const __m512i q =
        _mm512_cvt_roundps_epi32(_mm512_scalef_ps(y, neg_eout), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    peak = _mm512_max_epu32(peak, _mm512_abs_epi32(q));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i * 16), _mm512_cvtepi32_epi16(q));
  }
  const uint32_t m = _mm512_reduce_max_epu32(peak);
  *max_q = static_cast<int32_t>(std::min(m, 0x7FFFFFFFu));
  return m < 32767;
}

// bwd_apply's dx, then the quantization of bn_requantize.
float bn_bwd_requantize(const int16_t* x, const float* dy, const uint16_t* mask, const BnCoefficients& c,
                        size_t pixels, int e_out, int16_t* dst, int32_t* max_q) {
  __m512 mx = _mm512_setzero_ps();
  const __m512 xs = _mm512_set1_ps(c.x_scale), mean = _mm512_loadu_ps(c.mean), inv = _mm512_loadu_ps(c.inv);
  const __m512 k1 = _mm512_loadu_ps(c.k1), k2 = _mm512_loadu_ps(c.k2), k3 = _mm512_loadu_ps(c.k3);
  const __m512 neg_eout = _mm512_set1_ps(static_cast<float>(-e_out));
  __m512i peak = _mm512_setzero_si512();
  for (size_t i = 0; i < pixels; ++i) {
    const __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(_mm512_mul_ps(load_x(x + i * 16), xs), mean), inv);
    const __m512 g = load_grad(dy, mask, i);
    const __m512 d = _mm512_mul_ps(k1, _mm512_sub_ps(_mm512_sub_ps(g, k2), _mm512_mul_ps(xhat, k3)));
    mx = _mm512_max_ps(_mm512_abs_ps(d), mx);
    const __m512i q =
        _mm512_cvt_roundps_epi32(_mm512_scalef_ps(d, neg_eout), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    peak = _mm512_max_epu32(peak, _mm512_abs_epi32(q));  // a NaN or infinity: 2^31
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i * 16), _mm512_cvtepi32_epi16(q));
  }
  const uint32_t m = _mm512_reduce_max_epu32(peak);
  if (m >= 32767) return -1.f;
  *max_q = static_cast<int32_t>(m);
  return _mm512_reduce_max_ps(mx);
}

}  // namespace dfp::simd::avx512
