// INT16 convolution micro-kernels on 16 YMM registers, written once and instantiated per
// dot-product policy:
//   DotMadd:    VPMADDWD + VPADDD            (AVX2, conv_s16_avx2.cpp)
//   DotAvxVnni: VEX-encoded VPDPWSSD         (AVX-VNNI, conv_s16_avxvnni.cpp, -mavxvnni)
// Both wrap identically on INT32 overflow (which planning rules out; the quantizer never produces
// -32768, so a VPMADDWD pair sum never overflows), so they give the same bits as each other, as
// the AVX-512 kernels and as the scalar model in simd/ref/conv_ref.cpp.
//
// A 16-lane block is two YMM registers (lanes 0-7 and 8-15). The table's contract lets a pixel
// call carry up to max_pixels(nob) pixels and two output blocks, more accumulators than 16 YMM
// hold: the entry splits the call into sub-calls of one output block and at most kMaxPix pixels.
// Every output lane's sum runs over the same steps, in the same order, with the same flush
// points as in the whole call, so the split changes no bit. The pair kernel splits its rows the
// same way.
//
// Everything here has internal linkage (see simd/avx512/conv_s16_kernels.hpp for why).
#pragma once

#include <immintrin.h>

#include <utility>

#include "simd/kernel_table.hpp"

namespace dfp::simd {
namespace {

// One step on one 16-lane block: acc0 += pair(v0, b), acc1 += pair(v1, b), b = the INT16 pair at
// `pair` broadcast to every 32-bit lane. Inline asm, so that the broadcast and product
// temporaries are exactly the registers named here and no accumulator is copied or spilled.
struct DotMadd {
  static constexpr int kTemps = 2;  // the broadcast and one product
  static inline void step2(__m256i& acc0, __m256i& acc1, __m256i v0, __m256i v1, const int16_t* pair) {
    __m256i b, t;
    asm("vpbroadcastd %[m], %[b]\n\t"
        "vpmaddwd %[v0], %[b], %[t]\n\t"
        "vpmaddwd %[v1], %[b], %[b]\n\t"
        "vpaddd %[t], %[a0], %[a0]\n\t"
        "vpaddd %[b], %[a1], %[a1]"
        : [a0] "+x"(acc0), [a1] "+x"(acc1), [b] "=&x"(b), [t] "=&x"(t)
        : [v0] "x"(v0), [v1] "x"(v1), [m] "m"(*reinterpret_cast<const int32_t*>(pair)));
  }
};

struct DotAvxVnni {
  static constexpr int kTemps = 1;  // the broadcast
  // {vex}: the AVX-VNNI encoding (the assembler would otherwise choose the EVEX, AVX512-VNNI one).
  static inline void step2(__m256i& acc0, __m256i& acc1, __m256i v0, __m256i v1, const int16_t* pair) {
    __m256i b;
    asm("vpbroadcastd %[m], %[b]\n\t"
        "%{vex%} vpdpwssd %[v0], %[b], %[a0]\n\t"
        "%{vex%} vpdpwssd %[v1], %[b], %[a1]"
        : [a0] "+x"(acc0), [a1] "+x"(acc1), [b] "=&x"(b)
        : [v0] "x"(v0), [v1] "x"(v1), [m] "m"(*reinterpret_cast<const int32_t*>(pair)));
  }
};

// Pixels per pixel sub-call and rows per pair sub-call: 2 accumulators each, plus 2 operand
// registers (weights, or activations) and the step's temporaries, within 16 YMM.
constexpr int kMaxPix = 6;
constexpr int kMaxRows = 6;

// ---- pixel kernel (forward, backward-data) -------------------------------------------------

// How a flush writes dst: the modes of simd/avx512/conv_s16_kernels.hpp (see Flush there for why
// the overwriting form sums unscaled and scales once; the bits are those of an FMA per flush).
enum class Flush { fma, store, add, store_scale, add_scale, scale };

template <int NPIX>
struct PixelAcc {
  __m256i v[NPIX][2];
};

struct FlushDst {
  float* dst;
  int64_t pix;  // floats between pixels
  float scale;
  const float *lane_scale, *pixel_scale;  // PixelKernelArgs's, at the sub-call's block and pixel
  // The scale of half h at pixel p (PixelKernelArgs::lane_scale): products of powers of two, exact.
  __attribute__((always_inline)) __m256 scale_at(__m256 s, int h, int p) const {
    if (pixel_scale) s = _mm256_mul_ps(s, _mm256_set1_ps(pixel_scale[p]));
    if (lane_scale) s = _mm256_mul_ps(s, _mm256_loadu_ps(lane_scale + 8 * h));
    return s;
  }
};

template <Flush MODE, int NPIX>
__attribute__((always_inline)) inline void pixel_flush(PixelAcc<NPIX>& acc, const FlushDst& fd) {
  const __m256 scale1 = _mm256_set1_ps(fd.scale);
  float* d = fd.dst;
  // Opaque, so that the addresses are stepped here at each flush rather than hoisted out of the
  // call's loops and spilled.
  asm("" : "+r"(d));
#pragma GCC unroll 8
  for (int p = 0; p < NPIX; ++p, d += fd.pix) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      float* o = d + 8 * h;
      __m256i& v = acc.v[p][h];
      const __m256 scale = MODE == Flush::store || MODE == Flush::add ? scale1 : fd.scale_at(scale1, h, p);
      if constexpr (MODE == Flush::scale) {
        _mm256_storeu_ps(o, _mm256_mul_ps(_mm256_loadu_ps(o), scale));
        continue;
      }
      const __m256 f = _mm256_cvtepi32_ps(v);
      __m256 r;
      if constexpr (MODE == Flush::fma) r = _mm256_fmadd_ps(f, scale, _mm256_loadu_ps(o));
      if constexpr (MODE == Flush::store) r = f;
      if constexpr (MODE == Flush::add) r = _mm256_add_ps(f, _mm256_loadu_ps(o));
      if constexpr (MODE == Flush::store_scale) r = _mm256_mul_ps(f, scale);
      if constexpr (MODE == Flush::add_scale) r = _mm256_mul_ps(_mm256_add_ps(f, _mm256_loadu_ps(o)), scale);
      _mm256_storeu_ps(o, r);
      asm("vpxor %0, %0, %0" : "+x"(v));  // zeroed in place, not copied from one zero register
    }
  }
}

template <int NPIX>
__attribute__((always_inline)) inline void pixel_flush_mid(PixelAcc<NPIX>& acc, const FlushDst& fd, bool accumulate,
                                                           bool flushed) {
  if (accumulate)
    pixel_flush<Flush::fma>(acc, fd);
  else if (flushed)
    pixel_flush<Flush::add>(acc, fd);
  else
    pixel_flush<Flush::store>(acc, fd);
}

// The end of the call: the steps since the last flush (pending), then the scale. An accumulating
// call with no steps leaves dst as it was; an overwriting one writes zero.
template <int NPIX>
__attribute__((always_inline)) inline void pixel_flush_end(PixelAcc<NPIX>& acc, const FlushDst& fd, bool accumulate,
                                                           bool flushed, int pending) {
  if (accumulate) {
    if (pending > 0) pixel_flush<Flush::fma>(acc, fd);
  } else if (pending > 0 || !flushed) {
    if (flushed)
      pixel_flush<Flush::add_scale>(acc, fd);
    else
      pixel_flush<Flush::store_scale>(acc, fd);
  } else {
    pixel_flush<Flush::scale>(acc, fd);
  }
}

// One output block (a.nob is 1 here), NPIX <= kMaxPix pixels. SRC_PIX, UNIT_CHAIN and FULL as in
// simd/avx512/conv_s16_kernels.hpp: a compile-time pixel stride (16, 32) or 0; the chain a whole
// number of (ib, tap) units or checked per step; units of all 8 channel pairs or of a.pairs; ACC:
// whether the call adds to dst, as a constant.
template <class Dot, int NPIX, int SRC_PIX, bool UNIT_CHAIN, bool FULL, bool ACC>
void pixel_kernel(const PixelKernelArgs& a) {
  PixelAcc<NPIX> acc;
#pragma GCC unroll 8
  for (int p = 0; p < NPIX; ++p) acc.v[p][0] = acc.v[p][1] = _mm256_setzero_si256();
  const int64_t src_pix = SRC_PIX ? SRC_PIX : a.src_pix;
  // The tile's output lines, for writing (see the AVX-512 kernel: the first flush then finds
  // them in cache).
#pragma GCC unroll 8
  for (int p = 0; p < NPIX; ++p) asm volatile("prefetchw %0" ::"m"(*(a.dst + p * a.dst_pix)));
  const FlushDst fd{a.dst, a.dst_pix, a.scale, a.lane_scale, a.pixel_scale};
  const bool accumulate = ACC;
  // The loop bounds, strides and tap tables in locals (see pair_kernel).
  const int nib = a.nib, ntaps = a.ntaps, chain = a.chain;
  const int64_t src_ib_step = a.src_ib, wei_ib_step = a.wei_ib;
  const int64_t* const tap_src = a.tap_src;
  const int32_t* const tap_wei = a.tap_wei;
  const int pairs = FULL ? 8 : a.pairs;
  bool flushed = false;
  int pending = 0;  // steps since the last flush
  const int16_t* src_ib = a.src;
  const int16_t* wei_ib = a.wei;
  for (int ib = 0; ib < nib; ++ib, src_ib += src_ib_step, wei_ib += wei_ib_step) {
    for (int t = 0; t < ntaps; ++t) {
      const int16_t* s = src_ib + tap_src[t];
      const int16_t* w = wei_ib + int64_t{tap_wei[t]} * 256;
      const int16_t* sp[SRC_PIX ? 1 : NPIX];
      if constexpr (!SRC_PIX) {
#pragma GCC unroll 8
        for (int p = 0; p < NPIX; ++p) sp[p] = s + p * src_pix;
      }
      auto pix = [&](int p) { return SRC_PIX ? s + p * SRC_PIX : sp[p]; };
#pragma GCC unroll 8
      for (int j = 0; j < pairs; ++j) {
        const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * j));
        const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * j + 16));
#pragma GCC unroll 8
        for (int p = 0; p < NPIX; ++p) Dot::step2(acc.v[p][0], acc.v[p][1], w0, w1, pix(p) + 2 * j);
        if constexpr (!UNIT_CHAIN) {
          if (++pending == chain) {
            pixel_flush_mid(acc, fd, accumulate, flushed);
            flushed = true;
            pending = 0;
          }
        }
      }
      if constexpr (UNIT_CHAIN) {
        pending += pairs;
        if (pending == chain) {
          pixel_flush_mid(acc, fd, accumulate, flushed);
          flushed = true;
          pending = 0;
        }
      }
    }
  }
  pixel_flush_end(acc, fd, accumulate, flushed, pending);
}

template <class Dot, int NPIX, bool ACC>
void pixel_dispatch_stride(const PixelKernelArgs& a) {
  if (a.chain % a.pairs != 0) return pixel_kernel<Dot, NPIX, 0, false, false, ACC>(a);
  if (a.pairs != 8) {
    if (a.src_pix == 16) return pixel_kernel<Dot, NPIX, 16, true, false, ACC>(a);
    return pixel_kernel<Dot, NPIX, 0, false, false, ACC>(a);
  }
  if (a.src_pix == 16) return pixel_kernel<Dot, NPIX, 16, true, true, ACC>(a);
  if (a.src_pix == 32) return pixel_kernel<Dot, NPIX, 32, true, true, ACC>(a);
  pixel_kernel<Dot, NPIX, 0, true, true, ACC>(a);
}

template <class Dot, int... P>
void pixel_dispatch_npix(const PixelKernelArgs& a, std::integer_sequence<int, P...>) {
  using Fn = void (*)(const PixelKernelArgs&);
  static constexpr Fn table[2][sizeof...(P)] = {{&pixel_dispatch_stride<Dot, P + 1, false>...},
                                                {&pixel_dispatch_stride<Dot, P + 1, true>...}};
  table[a.accumulate ? 1 : 0][a.npix - 1](a);
}

// A call that only writes zeros, with non-temporal stores (see PixelKernelArgs::stream).
inline void pixel_stream_zeros(const PixelKernelArgs& a) {
  for (int p = 0; p < a.npix; ++p)
    for (int ob = 0; ob < a.nob; ++ob) {
      float* o = a.dst + ob * a.dst_ob + p * a.dst_pix;
      _mm256_stream_ps(o, _mm256_setzero_ps());
      _mm256_stream_ps(o + 8, _mm256_setzero_ps());
    }
  _mm_sfence();  // the stores are weakly ordered: make them visible before the caller's join
}

// Sub-calls of one output block and at most kMaxPix pixels, the pixels spread evenly over them
// (14 pixels: 5, 5, 4, so that no sub-call is left with too few accumulators to hide latency).
template <class Dot>
void pixel_entry(const PixelKernelArgs& a) {
  if (a.stream) return pixel_stream_zeros(a);
  const int chunks = (a.npix + kMaxPix - 1) / kMaxPix;
  for (int ob = 0; ob < a.nob; ++ob) {
    PixelKernelArgs sub = a;
    sub.nob = 1;
    sub.wei = a.wei + ob * a.wei_ob;
    int p0 = 0;
    for (int c = 0; c < chunks; ++c) {
      const int n = (a.npix - p0) / (chunks - c);
      sub.src = a.src + p0 * a.src_pix;
      sub.dst = a.dst + ob * a.dst_ob + p0 * a.dst_pix;
      if (a.lane_scale) sub.lane_scale = a.lane_scale + ob * 16;
      if (a.pixel_scale) sub.pixel_scale = a.pixel_scale + p0;
      sub.npix = n;
      pixel_dispatch_npix<Dot>(sub, std::make_integer_sequence<int, kMaxPix>{});
      p0 += n;
    }
  }
}

// PixelCallsFn: the calls one by one. The 12-accumulator kernel has no registers to spare for a
// second call's accumulators.
template <class Dot>
void pixel_calls_entry(const PixelKernelArgs* calls, int count) {
  for (int i = 0; i < count; ++i) pixel_entry<Dot>(calls[i]);
}

// ---- pair kernel (weight gradient) ---------------------------------------------------------

// NK <= kMaxRows rows k of 16 lanes. Flushes as the AVX-512 pair kernel's: a call that overwrites
// dw sums unscaled from its first flush and scales at its last; one that accumulates takes an FMA,
// or an add where the scale is 1 (the same bits). PREFETCH: the call fetches a.prefetch's lines,
// one per position (the next input block's x, which the hardware prefetcher finds only after a
// few misses: a 1x1 layer's calls otherwise wait on x from L3 or memory).
template <class Dot, int NK, bool PREFETCH>
void pair_kernel(const PairKernelArgs& a) {
  __m256i acc[NK][2];
#pragma GCC unroll 8
  for (int k = 0; k < NK; ++k) acc[k][0] = acc[k][1] = _mm256_setzero_si256();
  const bool fma_flush = a.accumulate && a.scale != 1.f;
  bool first = !a.accumulate;
  auto flush = [&](bool last) __attribute__((always_inline)) {
    const __m256 scale = _mm256_set1_ps(a.scale);
#pragma GCC unroll 8
    for (int k = 0; k < NK; ++k) {
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m256 f = _mm256_cvtepi32_ps(acc[k][h]);
        float* d = a.dw + k * a.dw_k + 8 * h;
        __m256 r = first ? f : fma_flush ? _mm256_fmadd_ps(f, scale, _mm256_loadu_ps(d))
                                         : _mm256_add_ps(f, _mm256_loadu_ps(d));
        if (last && !a.accumulate) r = _mm256_mul_ps(r, scale);
        _mm256_storeu_ps(d, r);
        acc[k][h] = _mm256_setzero_si256();
      }
    }
    first = false;
  };
  // The strides and the chain in locals, the position pointers stepped: read through `a` in the
  // loop, GCC reloaded them and multiplied per position (the inline asm's memory operands may
  // alias the arguments), a dozen scalar instructions beside 12 dot-product steps.
  const int64_t x_col = a.x_col, dy_col = a.dy_col, x_row = a.x_row, dy_row = a.dy_row;
  const int rows = a.rows, cols = a.cols;
  int pending = 0, chain = a.chain;
  const char* pf = a.prefetch;  // branch-free: once the range is done, its last line again
  const char* const pf_end = a.prefetch_end;
  for (int p = 0; p < a.planes; ++p) {
    const int plane_chain = a.plane_chain ? a.plane_chain[p] : a.chain;
    if (plane_chain != kPlaneContinues) {
      if (pending > 0) flush(false);  // the previous plane's last chain
      pending = 0;
      chain = plane_chain;
    }
    const int16_t* xr = a.x + p * a.x_plane;
    const int16_t* gr = a.dy + p * a.dy_plane;
    for (int r = 0; r < rows; ++r, xr += x_row, gr += dy_row) {
      const int16_t* xp = xr;
      const int16_t* g = gr;
      for (int c = 0; c < cols; ++c, xp += x_col, g += dy_col) {
        const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp));
        const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp + 16));
#pragma GCC unroll 8
        for (int k = 0; k < NK; ++k) Dot::step2(acc[k][0], acc[k][1], x0, x1, g + 2 * k);
        if constexpr (PREFETCH) {
          asm volatile("prefetcht1 %0" ::"m"(*pf));
          const char* next = pf + 64;
          pf = next < pf_end ? next : pf;
        }
        if (++pending == chain) {
          flush(false);
          pending = 0;
        }
      }
    }
  }
  const bool tail = pending > 0 || first;  // steps since the last flush, or none flushed yet
  if (tail) flush(true);
  if (!a.accumulate && !tail) {  // the last flush fell on the last step: scale here
    const __m256 scale = _mm256_set1_ps(a.scale);
#pragma GCC unroll 8
    for (int k = 0; k < NK; ++k)
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        float* d = a.dw + k * a.dw_k + 8 * h;
        _mm256_storeu_ps(d, _mm256_mul_ps(_mm256_loadu_ps(d), scale));
      }
  }
}

template <class Dot, int... K>
void pair_dispatch_nk(const PairKernelArgs& a, std::integer_sequence<int, K...>) {
  using Fn = void (*)(const PairKernelArgs&);
  static constexpr Fn table[2][sizeof...(K)] = {{&pair_kernel<Dot, K + 1, false>...},
                                                {&pair_kernel<Dot, K + 1, true>...}};
  table[a.prefetch != nullptr][a.nk - 1](a);
}

// Sub-calls of at most kMaxRows rows, spread evenly (16 rows: 6, 5, 5). The first sub-call, which
// streams x from wherever it is (the others find it in L1), fetches the prefetch hint's lines
// (they have no effect on the result). Calls over image planes (plane_chain set) fetch none: at
// these levels their loop is bound by the multiply-adds, not by x, and the fetch's instructions
// cost it (ResNet-18c's 512-channel 4x4 weight gradient 5-7% slower with them on Zen 5 at both
// avx2 forms, docs/design/kernels.md).
template <class Dot>
void pair_entry(const PairKernelArgs& a) {
  const int chunks = (a.nk + kMaxRows - 1) / kMaxRows;
  PairKernelArgs sub = a;
  int k0 = 0;
  for (int c = 0; c < chunks; ++c) {
    const int n = (a.nk - k0) / (chunks - c);
    sub.dy = a.dy + 2 * k0;
    sub.dw = a.dw + k0 * a.dw_k;
    sub.nk = n;
    if (c > 0 || a.plane_chain) sub.prefetch = sub.prefetch_end = nullptr;
    pair_dispatch_nk<Dot>(sub, std::make_integer_sequence<int, kMaxRows>{});
    k0 += n;
  }
}

}  // namespace
}  // namespace dfp::simd
