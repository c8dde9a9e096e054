// INT16 convolution micro-kernels, written once and instantiated per dot-product policy:
//   DotVnni: VPDPWSSD            (compiled with -mavx512vnni, conv_s16_vnni.cpp)
//   DotBw:   VPMADDWD + VPADDD   (AVX-512 BW, conv_s16_bw.cpp)
// Both wrap identically on INT32 overflow (which planning rules out), so they produce the same
// bits as each other and as the scalar model in simd/ref/conv_ref.cpp.
//
// Everything here has internal linkage: the two translation units are compiled with different
// ISA flags, and a shared inline symbol could let the linker keep the VNNI copy for the BW path.
//
// Register budget (32 ZMM): up to 28 accumulators + 2 weight registers (pixel kernel), or up to
// 22 accumulators (16 rows, or fewer rows in sets) + 1 activation register (pair kernel). GCC 12
// adds register copies around the _mm512_dpwssd_epi32 intrinsic once many accumulators are live
// (see peers.md), so the VNNI step is inline asm with the accumulator tied in place and the
// activation pair as an embedded broadcast memory operand: one instruction, no copies. The BW
// pixel kernel's step (DotBw::step_tight) is inline asm for the same reason.
#pragma once

#include <immintrin.h>

#include "simd/kernel_table.hpp"

namespace dfp::simd {
namespace {

struct DotVnni {
  // step() needs no ZMM temporaries (embedded broadcast, in place); step_two needs one.
  static constexpr bool kNoTemps = true;
  static constexpr bool kLatencyBound = true;  // each step waits for the last (VPDPWSSD's latency)
  static inline void step(__m512i& acc, __m512i w, const int16_t* pair) {
    asm("vpdpwssd %[m]%{1to16%}, %[w], %[acc]"
        : [acc] "+v"(acc)
        : [w] "v"(w), [m] "m"(*reinterpret_cast<const int32_t*>(pair)));
  }
  static inline void step_tight(__m512i& acc, __m512i w, const int16_t* pair) { step(acc, w, pair); }
  // Two output blocks' steps on one source pair (the pixel kernel's two blocks): the pair
  // broadcast once into a register, then two register VPDPWSSD, instead of an embedded broadcast
  // in each: half the loads, which on L1-resident operands makes a 3x3 call about 10% faster and
  // a 1x1 call about 15% (docs/design/kernels.md). The same products and sums: the same bits.
  static inline void step_two(__m512i& acc0, __m512i& acc1, __m512i w0, __m512i w1, const int16_t* pair) {
    __m512i t;
    asm("vpbroadcastd %[m], %[t]\n\t"
        "vpdpwssd %[t], %[w0], %[a0]\n\t"
        "vpdpwssd %[t], %[w1], %[a1]"
        : [a0] "+v"(acc0), [a1] "+v"(acc1), [t] "=&v"(t)
        : [w0] "v"(w0), [w1] "v"(w1), [m] "m"(*reinterpret_cast<const int32_t*>(pair)));
  }
  static inline void step_vec(__m512i& acc, __m512i a, __m512i b) {
    asm("vpdpwssd %[b], %[a], %[acc]" : [acc] "+v"(acc) : [a] "v"(a), [b] "v"(b));
  }
};

struct DotBw {
  static constexpr bool kNoTemps = false;  // the broadcast and the VPMADDWD product
  // The products are independent; only the VPADDD (latency 1) waits for the last step.
  static constexpr bool kLatencyBound = false;
  static inline void step(__m512i& acc, __m512i w, const int16_t* pair) {
    const __m512i b = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(pair));
    acc = _mm512_add_epi32(acc, _mm512_madd_epi16(w, b));
  }
  // For kernels whose accumulators fill the register file (the pixel kernel: 28 and 2 weights),
  // inline asm with one temporary for the broadcast and then the product (VPMADDWD has no embedded
  // broadcast): with the intrinsics GCC spills accumulators to the stack there (481 spill
  // instructions in the 2 x 14 variant), which costs the avx512bw level much of its forward and
  // backward-data speed. The pair kernel keeps step(): GCC schedules the broadcasts well ahead
  // there, and this form makes its weight gradients slower (figures: docs/design/kernels.md).
  static inline void step_tight(__m512i& acc, __m512i w, const int16_t* pair) {
    __m512i t;
    asm("vpbroadcastd %[m], %[t]\n\t"
        "vpmaddwd %[w], %[t], %[t]\n\t"
        "vpaddd %[t], %[acc], %[acc]"
        : [acc] "+v"(acc), [t] "=&v"(t)
        : [w] "v"(w), [m] "m"(*reinterpret_cast<const int32_t*>(pair)));
  }
  // Two output blocks' steps on one source pair: one broadcast for both products (see
  // DotVnni::step_two), with the product in a second temporary (32 ZMM in all with the pixel
  // kernel's 28 accumulators and 2 weights).
  static inline void step_two(__m512i& acc0, __m512i& acc1, __m512i w0, __m512i w1, const int16_t* pair) {
    __m512i t, u;
    asm("vpbroadcastd %[m], %[t]\n\t"
        "vpmaddwd %[w0], %[t], %[u]\n\t"
        "vpaddd %[u], %[a0], %[a0]\n\t"
        "vpmaddwd %[w1], %[t], %[u]\n\t"
        "vpaddd %[u], %[a1], %[a1]"
        : [a0] "+v"(acc0), [a1] "+v"(acc1), [t] "=&v"(t), [u] "=&v"(u)
        : [w0] "v"(w0), [w1] "v"(w1), [m] "m"(*reinterpret_cast<const int32_t*>(pair)));
  }
  static inline void step_vec(__m512i& acc, __m512i a, __m512i b) {
    acc = _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
  }
};

// ---- pixel kernel (forward, backward-data) -------------------------------------------------

template <int NOB, int NPIX>
struct PixelAcc {
  __m512i v[NOB * NPIX];
};

// How a flush writes dst. A call that overwrites dst keeps its partial sums unscaled (in units of
// 2^(e_src + e_wei)) and applies the scale once, at its last flush: the mid-chain flushes are then
// a convert and an add rather than a convert and an FMA, which on Zen 4 competes with VPDPWSSD for
// its pipes more than the add does (bench/flush_bench; figures in docs/design/numerics.md). The
// bits are those of an FMA per flush: the partial sums are integers, so in both forms they are
// integer multiples of the scale, normal FP32 when nonzero (the scale is >= 2^-126), and scaling
// by a power of two commutes with rounding there (short of FP32 overflow, where the FMA form
// would stop at inf). A call that adds to dst (accumulate) keeps the FMA: dst holds other
// values there.
enum class Flush {
  fma,         // dst = fma(acc, scale, dst)          every flush of an accumulating call
  store,       // dst = acc                           first flush, more follow
  add,         // dst = acc + dst                     a middle flush
  store_scale, // dst = acc * scale                   the only flush
  add_scale,   // dst = (acc + dst) * scale           the last flush
  scale,       // dst = dst * scale                   after a last flush that fell on the end
};

// Where a pixel kernel's flushes write, copied out of the arguments once per call: read through
// `a` at every flush, GCC reloaded dst and both strides from memory for every accumulator (a
// float store may alias the arguments' `scale`), five integer instructions per accumulator.
struct FlushDst {
  float* dst;
  int64_t ob, pix;  // floats between output-lane blocks, between pixels
  float scale;
  const float *lane_scale, *pixel_scale;  // PixelKernelArgs's: null for one scale
  // The scale of block ob at pixel p (PixelKernelArgs::lane_scale): products of powers of two,
  // exact.
  __attribute__((always_inline)) __m512 scale_at(__m512 s, int ob, int p) const {
    if (pixel_scale) s = _mm512_mul_ps(s, _mm512_set1_ps(pixel_scale[p]));
    if (lane_scale) s = _mm512_mul_ps(s, _mm512_loadu_ps(lane_scale + ob * 16));
    return s;
  }
};

// Whether a call has lane or pixel scales (FlushDst::scale_at): the kernels' SCALES parameter.
inline bool has_scales(const PixelKernelArgs& a) { return a.lane_scale || a.pixel_scale; }

// SCALES: whether the call may have lane or pixel scales (FlushDst::scale_at); without them every
// mode takes `scale` as it is.
template <Flush MODE, int NOB, int NPIX, bool SCALES = true>
__attribute__((always_inline)) inline void pixel_flush(PixelAcc<NOB, NPIX>& acc, const FlushDst& fd) {
  const __m512 scale1 = _mm512_set1_ps(fd.scale);
  float* d = fd.dst;
  // Opaque, so that the 28 addresses are stepped here at each flush (an add per pixel) rather
  // than hoisted out of the call's loops and spilled to the stack.
  asm("" : "+r"(d));
#pragma GCC unroll 32
  for (int p = 0; p < NPIX; ++p, d += fd.pix) {
#pragma GCC unroll 2
    for (int ob = 0; ob < NOB; ++ob) {
      float* o = d + ob * fd.ob;
      __m512i& v = acc.v[ob * NPIX + p];
      const __m512 scale =
          !SCALES || MODE == Flush::store || MODE == Flush::add ? scale1 : fd.scale_at(scale1, ob, p);
      if constexpr (MODE == Flush::scale) {
        _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_loadu_ps(o), scale));
        continue;
      }
      const __m512 f = _mm512_cvtepi32_ps(v);
      __m512 r;
      if constexpr (MODE == Flush::fma) r = _mm512_fmadd_ps(f, scale, _mm512_loadu_ps(o));
      if constexpr (MODE == Flush::store) r = f;
      if constexpr (MODE == Flush::add) r = _mm512_add_ps(f, _mm512_loadu_ps(o));
      if constexpr (MODE == Flush::store_scale) r = _mm512_mul_ps(f, scale);
      if constexpr (MODE == Flush::add_scale) r = _mm512_mul_ps(_mm512_add_ps(f, _mm512_loadu_ps(o)), scale);
      _mm512_storeu_ps(o, r);
      // The zeroing idiom in place ("+v": not merged into one zero register that GCC then copies
      // into each accumulator). Faster than both the copies and the whole flush in asm (which makes
      // GCC route every accumulator through a scratch register); figures: docs/design/kernels.md.
      asm("vpxord %0, %0, %0" : "+v"(v));
    }
  }
}

// A flush before the end of the call.
template <int NOB, int NPIX, bool SCALES = true>
__attribute__((always_inline)) inline void pixel_flush_mid(PixelAcc<NOB, NPIX>& acc, const FlushDst& fd,
                                                           bool accumulate, bool flushed) {
  if (accumulate)
    pixel_flush<Flush::fma, NOB, NPIX, SCALES>(acc, fd);
  else if (flushed)
    pixel_flush<Flush::add>(acc, fd);
  else
    pixel_flush<Flush::store>(acc, fd);
}

// The end of a chain's worth of steps: pending counts the steps since the last flush; where it
// reaches the chain, the flush before the end of the call.
template <int NOB, int NPIX, bool SCALES = true>
__attribute__((always_inline)) inline void count_steps(PixelAcc<NOB, NPIX>& acc, const FlushDst& fd, bool accumulate,
                                                       int steps, int chain, int& pending, bool& flushed) {
  pending += steps;
  if (pending == chain) {
    pixel_flush_mid<NOB, NPIX, SCALES>(acc, fd, accumulate, flushed);
    flushed = true;
    pending = 0;
  }
}

// The end of the call: the steps since the last flush (pending), then the scale. An accumulating
// call with no steps leaves dst as it was; an overwriting one writes zero.
template <int NOB, int NPIX, bool SCALES = true>
__attribute__((always_inline)) inline void pixel_flush_end(PixelAcc<NOB, NPIX>& acc, const FlushDst& fd,
                                                           bool accumulate, bool flushed, int pending) {
  if (accumulate) {
    if (pending > 0) pixel_flush<Flush::fma, NOB, NPIX, SCALES>(acc, fd);
  } else if (pending > 0 || !flushed) {
    if (flushed)
      pixel_flush<Flush::add_scale>(acc, fd);
    else
      pixel_flush<Flush::store_scale>(acc, fd);
  } else {
    pixel_flush<Flush::scale>(acc, fd);
  }
}

// Asks for a call's output lines for writing as it starts: the first flush then finds them in
// cache instead of stalling on read-for-ownership misses. It matters where the reduction is short
// and the output large (1x1 layers with K >> C, as ResNet-50's 64 -> 256); prefetching the next
// tile's lines from the driver as well is slower (docs/design/kernels.md).
template <int NOB, int NPIX>
__attribute__((always_inline)) inline void prefetch_tile_for_write(const PixelKernelArgs& a) {
#pragma GCC unroll 32
  for (int ob = 0; ob < NOB; ++ob)
#pragma GCC unroll 32
    for (int p = 0; p < NPIX; ++p) asm volatile("prefetchw %0" ::"m"(*(a.dst + ob * a.dst_ob + p * a.dst_pix)));
}

// SRC_PIX: src elements between output pixels when known at compile time (16 = stride 1,
// 32 = stride 2), or 0 to read it from the arguments.
// UNIT_CHAIN: the chain is a whole number of (ib, tap) units (the common case); otherwise the
// chain is checked after every step (tiny chains: headroom 0 or adversarial data).
// FULL: units of 8 steps (every channel pair), unrolled; otherwise a.pairs steps (a single block
// of fewer than 16 channels), and the per-step variant always reads a.pairs.
// ACC: whether the call adds to dst (PixelKernelArgs::accumulate), as a constant. With the
// accumulating flush in the loop, its scale registers beside 28 accumulators, GCC keeps a dozen
// accumulators on the stack through every (block, tap) unit; the overwriting calls' loop (forward,
// most backward-data) has no FMA flush and keeps them all in registers. The accumulating one keeps
// them too where the call has no lane or pixel scales (SCALES false: the FMA flush's scale is one
// register); with them (Granularity::slice) it still spills.
template <class Dot, int NOB, int NPIX, int SRC_PIX, bool UNIT_CHAIN, bool FULL, bool ACC, bool SCALES = true>
void pixel_kernel(const PixelKernelArgs& a) {
  PixelAcc<NOB, NPIX> acc;
#pragma GCC unroll 32
  for (int i = 0; i < NOB * NPIX; ++i) acc.v[i] = _mm512_setzero_si512();
  const int64_t src_pix = SRC_PIX ? SRC_PIX : a.src_pix;
  prefetch_tile_for_write<NOB, NPIX>(a);
  const FlushDst fd{a.dst, a.dst_ob, a.dst_pix, a.scale, a.lane_scale, a.pixel_scale};
  const bool accumulate = ACC;
  bool flushed = false;
  int pending = 0;  // steps since the last flush
  for (int ib = 0; ib < a.nib; ++ib) {
    const int16_t* src_ib = a.src + ib * a.src_ib;
    const int16_t* wei_ib = a.wei + ib * a.wei_ib;
    for (int t = 0; t < a.ntaps; ++t) {
      const int16_t* s = src_ib + a.tap_src[t];
      const int16_t* w = wei_ib + int64_t{a.tap_wei[t]} * 256;
      const int pairs = FULL ? 8 : a.pairs;
      // With a run-time pixel stride, one pointer per pixel for the tap: computing p * src_pix
      // for each step would take an LEA per step and spill the stride (edge-column calls, pixels a
      // row apart). With a compile-time stride the pixels are displacements from s.
      const int16_t* sp[SRC_PIX ? 1 : NPIX];
      if constexpr (!SRC_PIX) {
#pragma GCC unroll 32
        for (int p = 0; p < NPIX; ++p) sp[p] = s + p * src_pix;
      }
      auto pix = [&](int p) { return SRC_PIX ? s + p * SRC_PIX : sp[p]; };
#pragma GCC unroll 8
      for (int j = 0; j < pairs; ++j) {
        const __m512i w0 = _mm512_loadu_si512(w + 32 * j);
        __m512i w1;
        if constexpr (NOB == 2) w1 = _mm512_loadu_si512(w + a.wei_ob + 32 * j);
#pragma GCC unroll 32
        for (int p = 0; p < NPIX; ++p) {
          if constexpr (NOB == 2)
            Dot::step_two(acc.v[p], acc.v[NPIX + p], w0, w1, pix(p) + 2 * j);
          else
            Dot::step_tight(acc.v[p], w0, pix(p) + 2 * j);
        }
        if constexpr (!UNIT_CHAIN) count_steps(acc, fd, accumulate, 1, a.chain, pending, flushed);
      }
      if constexpr (UNIT_CHAIN) count_steps<NOB, NPIX, SCALES>(acc, fd, accumulate, pairs, a.chain, pending, flushed);
    }
  }
  pixel_flush_end<NOB, NPIX, SCALES>(acc, fd, accumulate, flushed, pending);
}

template <class Dot, int NOB, int NPIX, bool ACC>
void pixel_dispatch_stride(const PixelKernelArgs& a) {
  // Chains that are not whole units only occur with headroom 0 or adversarial operands: they take
  // the generic-stride, per-step-checked variant, which keeps compile time and code size down.
  if (a.chain % a.pairs != 0) return pixel_kernel<Dot, NOB, NPIX, 0, false, false, ACC>(a);
  if (a.pairs != 8) {
    if (a.src_pix == 16) return pixel_kernel<Dot, NOB, NPIX, 16, true, false, ACC>(a);
    return pixel_kernel<Dot, NOB, NPIX, 0, false, false, ACC>(a);
  }
  // An accumulating call's FMA flush sits in its loop; with the lane and pixel scales' code in it
  // (FlushDst::scale_at) GCC kept a dozen of the 28 accumulators on the stack through the loop.
  if (ACC && !has_scales(a)) {
    if (a.src_pix == 16) return pixel_kernel<Dot, NOB, NPIX, 16, true, true, ACC, false>(a);
    if (a.src_pix == 32) return pixel_kernel<Dot, NOB, NPIX, 32, true, true, ACC, false>(a);
  }
  if (a.src_pix == 16) return pixel_kernel<Dot, NOB, NPIX, 16, true, true, ACC>(a);
  if (a.src_pix == 32) return pixel_kernel<Dot, NOB, NPIX, 32, true, true, ACC>(a);
  pixel_kernel<Dot, NOB, NPIX, 0, true, true, ACC>(a);
}

template <class Dot, int NOB, int... P>
void pixel_dispatch_npix(const PixelKernelArgs& a, std::integer_sequence<int, P...>) {
  using Fn = void (*)(const PixelKernelArgs&);
  static constexpr Fn table[2][sizeof...(P)] = {{&pixel_dispatch_stride<Dot, NOB, P + 1, false>...},
                                                {&pixel_dispatch_stride<Dot, NOB, P + 1, true>...}};
  table[a.accumulate ? 1 : 0][a.npix - 1](a);
}

// One output block (nob 1) at a source pixel stride of 16 whose whole reduction is one INT32
// chain, where the taps come in runs that read consecutive source pixels (a stride-1 3x3 layer's
// rows of taps: tap_src t, t + 16, t + 32, or t, t - 16, t - 32 in backward data). Output pixel
// p of tap g of a run reads source pixel p + g, so each source pair is broadcast once and
// multiplied by the run's 2 or 3 weight vectors into as many pixels' sums: per channel pair
// NPIX + 2 broadcasts and 3 weight loads for 3 * NPIX VPDPWSSD, where pixel_kernel's one block
// takes NPIX + 1 loads for NPIX, which on L1-resident operands holds it to about 70% of the
// two-block kernel's rate. INT32 sums are exact in any order (modulo 2^32, and planning keeps
// them in range), and with one chain the only flush is at the end: the bits of pixel_kernel.
// NPIX accumulators, 3 weight vectors and the broadcast: 32 ZMM at most.
// The run of taps from tap t (at most 3): each tap reads the source one pixel right of the one
// before it (a forward row of taps) or left of it (backward data's flipped taps); `right` says
// which. A tap that continues neither way is a run of one.
struct TapRun {
  int taps;
  bool right;
};
inline TapRun tap_run(const PixelKernelArgs& a, int t) {
  for (int dir : {16, -16}) {
    int g = 1;
    while (g < 3 && t + g < a.ntaps && a.tap_src[t + g] == a.tap_src[t] + dir * g) ++g;
    if (g > 1) return {g, dir > 0};
  }
  return {1, true};
}

// RUNS3: every run is of three taps (a 3x3 layer's middle calls), so the loop over them has one
// path and GCC keeps the accumulators in registers through it (with the branch between run
// lengths it stores and reloads them around each run).
template <int NPIX, bool ACC, bool RUNS3>
void pixel_kernel_shared_src(const PixelKernelArgs& a) {
  PixelAcc<1, NPIX> acc;
#pragma GCC unroll 32
  for (int i = 0; i < NPIX; ++i) acc.v[i] = _mm512_setzero_si512();
  prefetch_tile_for_write<1, NPIX>(a);
  const FlushDst fd{a.dst, a.dst_ob, a.dst_pix, a.scale, a.lane_scale, a.pixel_scale};
  auto bcast = [](const int16_t* pair) {
    __m512i t;
    asm("vpbroadcastd %[m], %[t]" : [t] "=v"(t) : [m] "m"(*reinterpret_cast<const int32_t*>(pair)));
    return t;
  };
  // A run of G taps whose tap g reads s + (p + g) * 16 for output pixel p, with weights w[g].
  auto run = [&]<int G>(const int16_t* s, const int16_t* const* w) __attribute__((always_inline)) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      __m512i wv[G];
#pragma GCC unroll 3
      for (int g = 0; g < G; ++g) wv[g] = _mm512_loadu_si512(w[g] + 32 * j);
#pragma GCC unroll 32
      for (int q = 0; q < NPIX + G - 1; ++q) {
        const __m512i x = bcast(s + q * 16 + 2 * j);
#pragma GCC unroll 3
        for (int g = 0; g < G; ++g)
          if (q - g >= 0 && q - g < NPIX) DotVnni::step_vec(acc.v[q - g], wv[g], x);
      }
    }
  };
  int steps = 0;
  for (int ib = 0; ib < a.nib; ++ib) {
    const int16_t* src_ib = a.src + ib * a.src_ib;
    const int16_t* wei_ib = a.wei + ib * a.wei_ib;
    // The G taps from t, their weights ordered from the one that reads the leftmost pixel.
    auto take = [&]<int G>(int t, bool right) __attribute__((always_inline)) {
      const int16_t* w[G];
      for (int k = 0; k < G; ++k) w[k] = wei_ib + int64_t{a.tap_wei[right ? t + k : t + G - 1 - k]} * 256;
      run.template operator()<G>(src_ib + a.tap_src[right ? t : t + G - 1], w);
    };
    if constexpr (RUNS3) {
      for (int t = 0; t < a.ntaps; t += 3) take.template operator()<3>(t, a.tap_src[t + 1] > a.tap_src[t]);
      steps += 8 * a.ntaps;
      continue;
    }
    for (int t = 0; t < a.ntaps;) {
      const TapRun r = tap_run(a, t);
      if (r.taps == 3)
        take.template operator()<3>(t, r.right);
      else if (r.taps == 2)
        take.template operator()<2>(t, r.right);
      else
        take.template operator()<1>(t, r.right);
      steps += 8 * r.taps;
      t += r.taps;
    }
  }
  pixel_flush_end<1, NPIX>(acc, fd, ACC, false, steps);
}

// Whether pixel_kernel_shared_src takes the call: one block, every channel pair, stride-1 source
// pixels, one chain for all steps, and a first run of three taps in either direction (the rows of
// a 3x3 layer's middle-column calls; an edge column's taps or a 1x1 layer's one tap gain
// nothing).
inline bool shares_src(const PixelKernelArgs& a) {
  return a.nob == 1 && !a.stream && a.pairs == 8 && a.src_pix == 16 && a.ntaps >= 3 &&
         int64_t(a.chain) >= int64_t(a.nib) * a.ntaps * 8 && tap_run(a, 0).taps == 3;
}

// Whether every run of a call that shares_src is of three taps (the kernel's RUNS3 form).
inline bool runs_of_three(const PixelKernelArgs& a) {
  if (a.ntaps % 3) return false;
  for (int t = 0; t < a.ntaps; t += 3)
    if (tap_run(a, t).taps != 3) return false;
  return true;
}

template <int... P>
void pixel_shared_src_dispatch(const PixelKernelArgs& a, std::integer_sequence<int, P...>) {
  using Fn = void (*)(const PixelKernelArgs&);
  static constexpr Fn table[2][2][sizeof...(P)] = {
      {{&pixel_kernel_shared_src<P + 1, false, false>...}, {&pixel_kernel_shared_src<P + 1, true, false>...}},
      {{&pixel_kernel_shared_src<P + 1, false, true>...}, {&pixel_kernel_shared_src<P + 1, true, true>...}}};
  table[runs_of_three(a) ? 1 : 0][a.accumulate ? 1 : 0][a.npix - 1](a);
}

// A call that only writes zeros (no steps, overwriting) with non-temporal stores (see
// PixelKernelArgs::stream): once here, not in every pixel-count instantiation.
inline void pixel_stream_zeros(const PixelKernelArgs& a) {
  for (int p = 0; p < a.npix; ++p)
    for (int ob = 0; ob < a.nob; ++ob) _mm512_stream_ps(a.dst + ob * a.dst_ob + p * a.dst_pix, _mm512_setzero_ps());
  _mm_sfence();  // the stores are weakly ordered: make them visible before the caller's join
}

template <class Dot>
void pixel_entry(const PixelKernelArgs& a) {
  if (a.stream) return pixel_stream_zeros(a);
  if constexpr (Dot::kNoTemps) {  // VNNI: the step takes register operands
    if (shares_src(a)) return pixel_shared_src_dispatch(a, std::make_integer_sequence<int, max_pixels(1)>{});
  }
  if (a.nob == 2)
    pixel_dispatch_npix<Dot, 2>(a, std::make_integer_sequence<int, max_pixels(2)>{});
  else
    pixel_dispatch_npix<Dot, 1>(a, std::make_integer_sequence<int, max_pixels(1)>{});
}

// ---- several pixel-kernel calls over one pass of their weights ------------------------------

// CALLS calls of one output-block group (PixelCallsFn), each of NPIX pixels, two output blocks,
// every channel pair, a source pixel stride of SRC_PIX (16, or 32: stride 2) and chains of whole
// (block, tap) units: each call's accumulators, flushes and scale as pixel_kernel's, the weights
// loaded once for all of them. A 4x4 image's row of 4 pixels (8 accumulators) otherwise reads its
// group's weights (295 KB for 512 channels, 3x3) from L2 for every 4 pixels: on one core, two or
// three such calls ran 1.2-1.5x faster this way (docs/design/kernels.md). SCALES: as pixel_kernel's.
template <class Dot, int NPIX, int CALLS, bool ACC, int SRC_PIX, bool SCALES>
void pixel_calls_kernel(const PixelKernelArgs* c) {
  constexpr int NOB = 2;
  PixelAcc<NOB, NPIX> acc[CALLS];
  FlushDst fd[CALLS];
  const int16_t* src[CALLS];
  int pending[CALLS], chain[CALLS];
  bool flushed[CALLS];
#pragma GCC unroll 4
  for (int k = 0; k < CALLS; ++k) {
#pragma GCC unroll 32
    for (int i = 0; i < NOB * NPIX; ++i) acc[k].v[i] = _mm512_setzero_si512();
    fd[k] = FlushDst{c[k].dst, c[k].dst_ob, c[k].dst_pix, c[k].scale, c[k].lane_scale, c[k].pixel_scale};
    src[k] = c[k].src;
    pending[k] = 0;
    chain[k] = c[k].chain;
    flushed[k] = false;
    prefetch_tile_for_write<NOB, NPIX>(c[k]);
  }
  const PixelKernelArgs& a = c[0];  // the shared weights, taps and strides
  for (int ib = 0; ib < a.nib; ++ib) {
    const int16_t* wei_ib = a.wei + ib * a.wei_ib;
    for (int t = 0; t < a.ntaps; ++t) {
      const int16_t* w = wei_ib + int64_t{a.tap_wei[t]} * 256;
      const int16_t* s[CALLS];
#pragma GCC unroll 4
      for (int k = 0; k < CALLS; ++k) s[k] = src[k] + ib * a.src_ib + a.tap_src[t];
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const __m512i w0 = _mm512_loadu_si512(w + 32 * j);
        const __m512i w1 = _mm512_loadu_si512(w + a.wei_ob + 32 * j);
#pragma GCC unroll 4
        for (int k = 0; k < CALLS; ++k)
#pragma GCC unroll 32
          for (int p = 0; p < NPIX; ++p) {
            Dot::step_two(acc[k].v[p], acc[k].v[NPIX + p], w0, w1, s[k] + p * SRC_PIX + 2 * j);
          }
      }
#pragma GCC unroll 4
      for (int k = 0; k < CALLS; ++k)
        count_steps<NOB, NPIX, SCALES>(acc[k], fd[k], ACC, 8, chain[k], pending[k], flushed[k]);
    }
  }
#pragma GCC unroll 4
  for (int k = 0; k < CALLS; ++k) pixel_flush_end<NOB, NPIX, SCALES>(acc[k], fd[k], ACC, flushed[k], pending[k]);
}

// The calls' form: accumulating or not, and for accumulating calls whether any has lane or pixel
// scales (pixel_kernel's SCALES; the overwriting calls flush with them outside their loop).
template <class Dot, int CALLS, int... P>
void pixel_calls_dispatch(const PixelKernelArgs* c, std::integer_sequence<int, P...>) {
  using Fn = void (*)(const PixelKernelArgs*);
  static constexpr Fn table[3][2][sizeof...(P)] = {
      {{&pixel_calls_kernel<Dot, P + 1, CALLS, false, 16, true>...},
       {&pixel_calls_kernel<Dot, P + 1, CALLS, false, 32, true>...}},
      {{&pixel_calls_kernel<Dot, P + 1, CALLS, true, 16, true>...},
       {&pixel_calls_kernel<Dot, P + 1, CALLS, true, 32, true>...}},
      {{&pixel_calls_kernel<Dot, P + 1, CALLS, true, 16, false>...},
       {&pixel_calls_kernel<Dot, P + 1, CALLS, true, 32, false>...}}};
  bool scales = false;
  for (int k = 0; k < CALLS; ++k) scales |= has_scales(c[k]);
  const int form = !c[0].accumulate ? 0 : scales ? 1 : 2;
  table[form][c[0].src_pix == 16 ? 0 : 1][c[0].npix - 1](c);
}

// Two or three calls in one pass where their accumulators fit in registers beside the two weight
// vectors (at most 28) and they take pixel_calls_kernel's form; otherwise the calls one by one. The
// BW step's two temporaries would fill the last two of 32 ZMM; fused, its small images' layers ran
// about as fast (docs/measurements.md, session 47), so it runs them one by one.
template <class Dot>
void pixel_calls_entry(const PixelKernelArgs* c, int count) {
  if constexpr (Dot::kNoTemps) {
    const PixelKernelArgs& a = c[0];
    bool fused = (count == 2 || count == 3) && a.nob == 2 && a.pairs == 8 &&
                 (a.src_pix == 16 || a.src_pix == 32) && 2 * count * a.npix <= kPixelAccumulators;
    for (int k = 0; fused && k < count; ++k)
      fused = c[k].chain % 8 == 0 && !c[k].stream && c[k].src_pix == a.src_pix;
    if (fused) {
      constexpr auto two = std::make_integer_sequence<int, kPixelAccumulators / 4>{};
      constexpr auto three = std::make_integer_sequence<int, kPixelAccumulators / 6>{};
      if (count == 2) return pixel_calls_dispatch<Dot, 2>(c, two);
      return pixel_calls_dispatch<Dot, 3>(c, three);
    }
  }
  for (int k = 0; k < count; ++k) pixel_entry<Dot>(c[k]);
}

// ---- pair kernel (weight gradient) ---------------------------------------------------------

// PREFETCH: the call fetches a.prefetch's lines (instantiated for 16 rows: the convolution calls
// that carry them; the others keep a loop without it: the fully connected weight gradients, 16
// positions per call, would lose to the extra instructions).
template <class Dot, int NK, bool PREFETCH = false>
void pair_kernel(const PairKernelArgs& a) {
  // Few rows leave too few independent VPDPWSSD chains to hide its latency (12 or more needed, see
  // peers.md; ResNet stems' weight gradients run 9 and 5 rows): consecutive positions then rotate
  // over SETS accumulator sets, added together at each flush. The INT32 sums are exact, so the
  // flushed values, and the flush points, are those of one set. The BW step needs no sets: its
  // VPMADDWD products are independent, and the VPADDD that chains them has a latency of 1. With
  // the VNNI sets it would spill its 8- to 11-row kernels; one set is faster
  // (docs/design/kernels.md).
  constexpr int SETS = !Dot::kLatencyBound ? 1 : NK <= 4 ? 3 : NK <= 11 ? 2 : 1;
  // Where the registers allow (INT32 sets, FP32 sums, x and the scale: at most 31 ZMM, and only
  // with VNNI: the BW step's temporaries made GCC spill; checked in the disassembly), the FP32
  // sums stay in registers between flushes and dW is read once and written once per call: a flush
  // is then arithmetic only, instead of a load, an FMA and a store per row. Same operations in
  // the same order, so the same bits.
  constexpr bool REG_SUMS = Dot::kNoTemps && NK * SETS + NK + 2 <= 31;
  __m512i acc[SETS][NK];
#pragma GCC unroll 3
  for (int s = 0; s < SETS; ++s)
#pragma GCC unroll 16
    for (int k = 0; k < NK; ++k) acc[s][k] = _mm512_setzero_si512();
  const __m512 scale = _mm512_set1_ps(a.scale);
  // Flushes as the pixel kernel's (see Flush): a call that overwrites dw sums unscaled and scales
  // at the end; one that accumulates takes an FMA, or an add where the scale is 1 (the same bits:
  // the convolution's weight gradient sums in units of the scale and scales its slices' sum).
  const bool fma_flush = a.accumulate && a.scale != 1.f;
  bool first = !a.accumulate;
  __m512 sum_f[REG_SUMS ? NK : 1];
  if constexpr (REG_SUMS) {
#pragma GCC unroll 16
    for (int k = 0; k < NK; ++k) sum_f[k] = a.accumulate ? _mm512_loadu_ps(a.dw + k * a.dw_k) : _mm512_setzero_ps();
  }
  // One lambda with the mode tested per row (predictable branches): a lambda per mode, chosen per
  // flush, put the accumulators on the stack. `last`: the call's final flush, which in a call
  // that overwrites dw also applies the scale (a separate scaling pass over dw would cost calls
  // that flush only a few times, as the large fully connected weight gradients';
  // docs/design/kernels.md).
  auto flush = [&](bool last) __attribute__((always_inline)) {
#pragma GCC unroll 16
    for (int k = 0; k < NK; ++k) {
      __m512i sum = acc[0][k];
#pragma GCC unroll 3
      for (int s = 1; s < SETS; ++s) sum = _mm512_add_epi32(sum, acc[s][k]);
      const __m512 f = _mm512_cvtepi32_ps(sum);
      float* d = a.dw + k * a.dw_k;
      const __m512 old = REG_SUMS ? sum_f[REG_SUMS ? k : 0] : first ? f : _mm512_loadu_ps(d);
      __m512 r = first ? f : fma_flush ? _mm512_fmadd_ps(f, scale, old) : _mm512_add_ps(f, old);
      if (last && !a.accumulate) r = _mm512_mul_ps(r, scale);
      if constexpr (REG_SUMS)
        sum_f[k] = r;
      else
        _mm512_storeu_ps(d, r);
#pragma GCC unroll 3
      for (int s = 0; s < SETS; ++s) acc[s][k] = _mm512_setzero_si512();
    }
    first = false;
  };
  // The scalar work per position is kept small: its instructions share ports with the eight
  // VPDPWSSD (a countdown to the next flush, one fused decrement-and-branch; the prefetch pointer
  // by a conditional move, three instructions where pf += (pf + 64 < end) ? 64 : 0 compiles to six).
  int chain = 0;  // the chain of the current plane
  int left = 0;   // its steps before the next flush: chain - left since the last one
  // Branch-free, one prefetch per position: once the range is done, its last line again (with
  // _mm_prefetch under a branch, GCC copied all 16 accumulators to other registers around every
  // step and spilled one).
  const char* pf = a.prefetch;
  const char* pf_end = a.prefetch_end;
  // Strides and counts in locals, each row's pointers stepped from the last: read through `a`
  // inside the loops, GCC loads them again and computes the pointers anew at every row, which
  // slows the rows of 3 to 14 positions of small images by 10-25% (docs/design/kernels.md).
  const int rows = a.rows, cols = a.cols;
  const int64_t x_col = a.x_col, dy_col = a.dy_col, x_row = a.x_row, dy_row = a.dy_row;
  for (int p = 0; p < a.planes; ++p) {
    const int plane_chain = a.plane_chain ? a.plane_chain[p] : a.chain;
    if (plane_chain != kPlaneContinues) {
      if (left != chain) flush(false);  // the previous plane's last chain
      chain = left = plane_chain;
    }
    if constexpr (PREFETCH) {
      if (a.prefetch_plane != 0) {  // this plane's range
        pf = a.prefetch + p * a.prefetch_plane;
        pf_end = a.prefetch_end + p * a.prefetch_plane;
      }
    }
    const int16_t* xr = a.x + p * a.x_plane;
    const int16_t* gr = a.dy + p * a.dy_plane;
    for (int r = 0; r < rows; ++r, xr += x_row, gr += dy_row) {
      for (int c0 = 0; c0 < cols; c0 += SETS) {
#pragma GCC unroll 3
        for (int s = 0; s < SETS; ++s) {
          const int c = c0 + s;
          if (c >= cols) break;
          const __m512i xv = _mm512_loadu_si512(xr + c * x_col);
          const int16_t* g = gr + c * dy_col;
#pragma GCC unroll 16
          for (int k = 0; k < NK; ++k) Dot::step(acc[s][k], xv, g + 2 * k);
          if constexpr (PREFETCH) {
            asm volatile("prefetcht1 %0" ::"m"(*pf));
            const char* next = pf + 64;
            pf = next < pf_end ? next : pf;
          }
          if (--left == 0) { flush(false); left = chain; }
        }
      }
    }
  }
  const bool tail = left != chain || first;  // steps since the last flush, or none flushed yet
  if (tail) flush(true);
  // Where the last flush fell on the last step, an overwriting call scales here.
#pragma GCC unroll 16
  for (int k = 0; k < NK; ++k) {
    float* d = a.dw + k * a.dw_k;
    if constexpr (REG_SUMS)
      _mm512_storeu_ps(d, a.accumulate || tail ? sum_f[k] : _mm512_mul_ps(sum_f[k], scale));
    else if (!a.accumulate && !tail)
      _mm512_storeu_ps(d, _mm512_mul_ps(_mm512_loadu_ps(d), scale));
  }
}

template <class Dot, int... K>
void pair_entry_impl(const PairKernelArgs& a, std::integer_sequence<int, K...>) {
  using Fn = void (*)(const PairKernelArgs&);
  static constexpr Fn table[] = {&pair_kernel<Dot, K + 1>...};
  table[a.nk - 1](a);
}

template <class Dot>
void pair_entry(const PairKernelArgs& a) {
  // 16 rows run as one call with one accumulator set, their FP32 sums in dW (34 registers with
  // them in registers): per position one x load and 16 steps. Two 8-row calls over the same
  // positions, each with two sets and its sums in registers, load x twice and pay the position's
  // scalar work twice per 16 steps: on the Xeon (Sapphire Rapids class) the 16-row call runs
  // 1.25x faster on L1-resident operands, and the weight gradients with training's chains (a flush
  // per call) 1.0-1.6x faster (docs/design/kernels.md).
  if (a.nk == 16 && a.prefetch < a.prefetch_end) return pair_kernel<Dot, 16, true>(a);
  pair_entry_impl<Dot>(a, std::make_integer_sequence<int, 16>{});
}

}  // namespace
}  // namespace dfp::simd
