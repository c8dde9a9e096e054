// dfp/simd: the kernel table, the one contract between the engine (src/) and the kernels.
//
// Each entry is a plain function pointer plus the name of the implementation chosen for it. The
// table is filled once, when a Context is created, from the CPU's features and the requested
// level (DFP_ISA or ContextOptions::isa). Layers never read CPU flags themselves.
//
// Every kernel has a scalar reference twin in simd/ref/ with the same signature. For the integer
// kernels the twin is a bit-exact model: same INT32 sums, same chain segmentation, same FP32
// flush arithmetic (convert with round-to-nearest-even, then one fused multiply-add), so the
// tests compare ISA kernels to it with tolerance 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "dfp/conv.hpp"
#include "dfp/dfp16.hpp"
#include "dfp/float16.hpp"
#include "dfp/float8.hpp"
#include "dfp/posit.hpp"
#include "dfp/isa.hpp"
#include "base/random.hpp"

namespace dfp::simd {

// ---- DFP16 quantization -------------------------------------------------------------------

struct QuantCounters {
  uint64_t saturated = 0;  // elements clamped to +-32767
  uint64_t nonfinite = 0;  // NaN/Inf inputs (stored as 0)
  int32_t max_abs_q = 0;   // max |dst[i]| (after clamping): the exact operand bound for chains
};

// max|x| over finite elements; adds the count of NaN/Inf elements to *nonfinite.
using MaxAbsFn = float (*)(const float* x, size_t n, uint64_t* nonfinite);
// Rounding statistics of a sampled step (LayerNumerics): x against DFP16 round-to-nearest-even,
// y = x * down, q = nearest-even(y) (|y| >= 32767.5 saturates to +-32767), r = q * up, over
// finite x, as FormatStats (overflow: the saturated elements). The sums run in kStatsLanes lanes
// (element i in lane i % kStatsLanes), added in lane order at the end, each product and sum
// rounded on its own: every level gives the same bits.
inline constexpr int kStatsLanes = 16;
using Dfp16StatsFn = FormatStats (*)(const float* x, size_t n, double down, double up);
// dst[i] = sat16(R(src[i] * 2^-exponent)); stochastic rounding is floor(src[i] * 2^-exponent + u)
// in exact arithmetic, with u = dfp16_rand24(seed, index_base + i) * 2^-24 for element i.
using QuantizeFn = void (*)(const float* src, int16_t* dst, size_t n, int exponent, Rounding rounding,
                            uint64_t seed, uint64_t index_base, QuantCounters* counters);
// Two quantizations of one source, the bits of quantize(src, dst_a, n, exponent_a, ...) and
// quantize(src, dst_b, n, exponent_b, ...) with the same seed and index_base, counted into
// counters_a and counters_b: a tensor quantized for two slicings (Granularity::slice), whose
// stochastic draws the AVX-512 forms then make once.
using Quantize2Fn = void (*)(const float* src, int16_t* dst_a, int16_t* dst_b, size_t n, int exponent_a,
                             int exponent_b, Rounding rounding, uint64_t seed, uint64_t index_base,
                             QuantCounters* counters_a, QuantCounters* counters_b);
using DequantizeFn = void (*)(const int16_t* src, float* dst, size_t n, int exponent);
// dst[2i] = a[i], dst[2i+1] = b[i] (b == nullptr: zeros). Builds the batch-pair layout.
using InterleaveFn = void (*)(const int16_t* a, const int16_t* b, int16_t* dst, size_t n);

// ---- Random numbers -----------------------------------------------------------------------
//
// The counter-based streams (DFP16 stochastic rounding's ARS-5; dropout's and BF16/FP16 rounding's
// multiply hash) are in base/random.hpp, shared with the data pipeline and the CUDA device.
using dfp::ars5;
using dfp::ars_word;
using dfp::Block128;
using dfp::dfp16_rand24;
using dfp::mix32;
using dfp::stochastic_key;
using dfp::stochastic_rand24;
namespace aes_detail = dfp::aes_detail;

// ---- INT16 convolution micro-kernels -------------------------------------------------------
//
// Both kernels compute INT16 x INT16 -> INT32 dot products in the pair form of VPDPWSSD
// (acc += a[2j]*b[2j] + a[2j+1]*b[2j+1] per 32-bit lane) and flush the INT32 sums into FP32
// after at most `chain` steps. A call that adds to its output takes dst = fma(float(acc), scale,
// dst) per flush; one that overwrites sums float(acc) unscaled and multiplies by the scale once,
// at its last flush (the same bits: see Flush in simd/avx512/conv_s16_kernels.hpp; the reference,
// simd/ref/conv_ref.cpp, sums in the same order). Planning chooses `chain` from a bound on the
// actual operands so that no INT32 partial sum can overflow (src/ops/conv_int16/chains.cpp).

// "Pixel" kernel, used by forward propagation and backward-data. Computes, for `npix` output
// pixels and `nob` blocks of 16 output lanes:
//   out[ob][p][l] = sum over ib < nib, tap < ntaps, j < pairs of
//       pair(src[p*src_pix + tap_src[tap] + ib*src_ib + 2j .. +1],
//            wei[ob*wei_ob + ib*wei_ib + tap_wei[tap]*256 + j*32 + 2l .. +1])
// src holds 16 reduction channels (8 pairs) per pixel; wei is [ob][ib][tap][8][16 lanes][2].
// `pairs` < 8 skips channel pairs that are zero padding (a single reduction block of fewer than
// 16 channels, as in a first layer). Steps are ordered (ib, tap, j); a flush happens after every
// `chain` steps and at the end: with accumulate, dst = fma(sum, scale, dst); without, the call
// sums unscaled into dst and scales it once at the end (the bits of an FMA per flush; see Flush in
// simd/avx512/conv_s16_kernels.hpp).
struct PixelKernelArgs {
  const int16_t* src;
  const int16_t* wei;
  float* dst;
  const int64_t* tap_src;  // element offset of each tap in src
  const int32_t* tap_wei;  // weight tap index of each tap
  int ntaps;
  int nib;                 // reduction blocks of 16 channels
  int pairs;               // channel pairs per block that can be nonzero, 1..8: steps per (ib, tap)
  int64_t src_ib;          // src elements between reduction blocks
  int64_t src_pix;         // src elements between consecutive output pixels
  int64_t wei_ob;          // wei elements between output-lane blocks
  int64_t wei_ib;          // wei elements between reduction blocks
  int64_t dst_ob;          // dst floats between output-lane blocks
  int64_t dst_pix;         // dst floats between output pixels
  int npix;                // 1..kMaxPixels(nob)
  int nob;                 // 1 or 2
  int chain;               // steps per INT32 chain, >= 1
  float scale;             // 2^(e_src + e_wei)
  bool accumulate;         // add to dst instead of overwriting it
  int64_t* overflow_events;  // verification (reference only): INT32 range exits, or null
  // Exponents below the tensor level (Granularity::slice): the scale of output lane l of block ob
  // at pixel p is (scale * pixel_scale[p]) * lane_scale[ob * 16 + l], each factor where its
  // pointer is non-null, in that order. The caller passes powers of two whose products are normal
  // FP32, so the scale is exact and the flush keeps its bits (the partial sums stay integer
  // multiples of it). Null: every lane and pixel takes `scale`.
  const float* lane_scale = nullptr;
  const float* pixel_scale = nullptr;
  // Only for an overwriting call with no steps (ntaps == 0) and dst 64-byte aligned: write its
  // zeros with non-temporal stores, which do not read dst's lines for ownership first (a strided
  // layer's backward-data phases that no tap reaches, in outputs far larger than the cache).
  // Same values; the reference ignores it.
  bool stream = false;
};
// ZMM accumulators per call (plus 2 weight regs). The AVX2 kernels (16 YMM registers) split a
// call into sub-calls of fewer pixels and one block each: every output's sum is independent.
inline constexpr int kPixelAccumulators = 28;
inline constexpr int max_pixels(int nob) { return kPixelAccumulators / nob; }

// "Pair-reduction" kernel, used by the weight gradient. Reduction runs over positions whose
// two INT16 values come from two different images (pairs along the batch), so no spatial
// re-layout per tap is needed. For nk <= 16 output rows k and 16 lanes c:
//   dw[k*dw_k + l] += sum over positions q of
//       pair(x[q_off_x + 2l .. +1], dy[q_off_dy + 2k .. +1])
// with positions q = (row < rows, col < cols), q_off = row*row_stride + col*col_stride.
// The INT32 sums are flushed into dw after every `chain` positions and at the end: with
// accumulate, dw = fma(sum, scale, dw) (an add when scale is 1); without, the call sums unscaled
// from its first flush (dw need not be zeroed), scales dw once at the end, and always writes dw.
// The bits are those of an FMA per flush either way (see Flush in simd/avx512/conv_s16_kernels.hpp).
// Planes: `planes` grids of rows x cols positions, plane i's x_plane * i and dy_plane * i further,
// run in order as one sequence, the flush counter starting again at each plane (with the chain
// plane_chain[i], or `chain` where plane_chain is null) and a flush at each plane's end, except
// where plane_chain[i] is kPlaneContinues (i > 0): plane i then continues the chain that plane
// i - 1 ended with, with no flush between them (the caller has bounded their sums together).
// Without continuations and with accumulate that is a call per plane, in order, with dw read once
// and written once: the weight gradient of a small image runs the batch's image pairs as planes
// (docs/design/kernels.md).
inline constexpr int kPlaneContinues = -1;
struct PairKernelArgs {
  const int16_t* x;   // [..][16 c][2 images]
  const int16_t* dy;  // [..][16 k][2 images]
  float* dw;
  int64_t dw_k;
  int nk;             // 1..16
  int rows, cols;
  int64_t x_row, x_col, dy_row, dy_col;
  int chain;
  float scale;
  int64_t* overflow_events;  // verification (reference only), or null
  bool accumulate = true;
  // Lines [prefetch, prefetch_end) to fetch into L2 for a later call, one per position (a hint:
  // no effect on the result; the reference ignores it). Spread over the call's positions rather
  // than issued as a burst before it, which stalls on the full miss queue (docs/design/kernels.md).
  const char* prefetch = nullptr;
  const char* prefetch_end = nullptr;
  // Where not 0, a call over planes fetches a range per plane: plane i the lines of
  // [prefetch, prefetch_end) moved by i * prefetch_plane bytes. With fewer calls than planes to
  // fetch, one range per call (at most a line per position) would leave some planes unfetched.
  int64_t prefetch_plane = 0;
  int planes = 1;
  int64_t x_plane = 0, dy_plane = 0;
  const int* plane_chain = nullptr;
};

// Per-row L1 norms of a pair-layout operand, for the weight gradient's chain bounds. For each of
// `rows` rows of `cols` positions (position c of row r at pairs + r * row_stride + c * 32; 16
// lanes of 2 INT16 values each):
//   l1[r] = max over lanes l of  sum over c of |p[2l]| + |p[2l + 1]|
// exactly, for every INT16 value (|-32768| is 32768). cols <= 32767, so the sums fit INT32. A
// pair-kernel sum over any run of these positions, with the other operand at most a in
// magnitude, is at most a times the runs' l1: a tighter bound than a * max|p| * positions where
// a row's values are mostly far below its largest (gradients are).
using PairRowL1Fn = void (*)(const int16_t* pairs, int rows, int cols, int64_t row_stride, int32_t* l1);

// One block of a convolution's DFP16 weights (16 output channels k by 16 input channels c, every
// tap) into the pixel kernels' two weight layouts, with each unit's per-lane L1 norms (what the
// chain tables are measured from). Row l of the block (output channel l) is at
// src + l * row_stride and holds [16 c][taps]: v[l][c][t] = src[l * row_stride + c * taps + t].
// For each tap t, with j in [0, 8), p in {0, 1}:
//   f[t * 256 + j * 32 + 2l + p] = v[l][2j + p][t]   forward: lane k = l, pairs along c
//   b[t * 256 + j * 32 + 2l + p] = v[2j + p][l][t]   backward-data: lane c = l, pairs along k
//   l1_f[l * l1_f_stride + t] = sum over c of |v[l][c][t]|
//   l1_b[l * l1_b_stride + t] = sum over k of |v[k][l][t]|
// pair_max[0] (f) and pair_max[1] (b) are raised to the largest |v0| + |v1| of a pair written.
// A null f (or b) skips that layout with its norms and pair maximum. Exact for every INT16 value
// (|-32768| is 32768).
struct PackWeightsArgs {
  const int16_t* src;
  int64_t row_stride;
  int taps;
  int16_t* f;
  int16_t* b;
  int32_t* l1_f;
  int64_t l1_f_stride;
  int32_t* l1_b;
  int64_t l1_b_stride;
  int32_t* pair_max;  // [2]
};
using PackWeightsFn = void (*)(const PackWeightsArgs& a);

// INT32 chain bounds (the INT16 convolution's chain tables, from pack_weights' unit L1 norms): for
// each lane l < lanes, the sequence v_l[m] = l1[l * lane_stride + seq[m]] (m < units); for each
// candidate length n[i] (i < nc, at most kChainWindowCandidates), best[i] is raised to the
// largest sum of a v_l over the aligned windows [j * n[i], min((j + 1) * n[i], units)). Each value
// is a unit's L1 norm, 0 .. 16 * 32768. Exact integer sums: every form gives the reference's maxima.
inline constexpr int kChainWindowCandidates = 64;
struct ChainWindowArgs {
  const int32_t* l1;
  int64_t lane_stride;
  int lanes;
  const int32_t* seq;
  int units;
  const int32_t* n;
  int nc;
};
using ChainWindowMaxFn = void (*)(const ChainWindowArgs& a, int64_t* best);

// ---- element-wise FP32 (ReLU, residual add) ---------------------------------------------------
// ReLU keeps one bit per element for its backward pass (bit i % 16 of mask[i / 16] is x[i] > 0)
// instead of its FP32 output: 1/32 of the memory, and backward reads 1/32 of the bytes.
// relu_fwd returns max(y) (0 for an empty or non-positive x): the next layer's DFP16 exponent
// comes for free (NaN gives y = 0).
using ReluFwdFn = float (*)(const float* x, float* y, uint16_t* mask, size_t n);  // y = x > 0 ? x : 0
using ReluBwdFn = void (*)(const uint16_t* mask, const float* dy, float* dx, size_t n);  // dx = bit ? dy : 0
using AddFn = void (*)(const float* a, const float* b, float* y, size_t n);        // y = a + b
// y = relu(a + b) with relu_fwd's mask and max: the bits of add, then relu_fwd on the sum.
using AddReluFn = float (*)(const float* a, const float* b, float* y, uint16_t* mask, size_t n);
// Channel-shifted pixel copy (a channel range moved across 16-lane blocks: the zero-padding
// shortcut's both passes, Concat's and the grouped convolution's gathers): for p < pixels, lane l,
//   out[p * out_step * 16 + l] = keep bit l ? v : 0,  v = l + shift < 16 ? a[p * in_step * 16 + l + shift]
//                                                                      : b[p * in_step * 16 + l + shift - 16]
// where a and b are pixel rows of two consecutive 16-channel blocks (null: zeros), 0 <= shift < 16.
using ShiftLanesFn = void (*)(const float* a, const float* b, int shift, size_t in_step, float* out, size_t out_step,
                              size_t pixels, uint16_t keep);
// Per-lane sums of a run of blocked pixels in FP64, pixel by pixel in order (a bias's gradient:
// dy summed over batch and space, one channel block's planes in turn):
//   acc[l] += x[p * 16 + l] for p = 0, 1, ..., pixels - 1, in that order, for each lane l < 16.
using LaneSumsFn = void (*)(const float* x, size_t pixels, double* acc);
// Max pooling (torch.nn.MaxPool2d) of one output row of one channel block of 16 lanes. rows[r],
// r < k, is input row oh * stride - pad + r (null where that row lies outside the input); its
// pixel iw is at rows[r] + iw * 16, 0 <= iw < in_w. For output pixel o < out_w and lane l, over the
// window's taps t = r * k + c in row-major order whose row is not null and whose column
// iw = o * stride - pad + c lies in [0, in_w): the first tap's value is taken as it is (NaN
// included), a later one only where it is greater (a NaN never is), and
//   y[o * 16 + l] = that value,  arg[o * 16 + l] = its tap  (-inf and 255 for a window of no tap).
struct MaxPoolRowArgs {
  const float* const* rows;
  int k, stride, pad, in_w, out_w;
  float* y;
  uint8_t* arg;
};
using MaxPoolRowFn = void (*)(const MaxPoolRowArgs& a);
// The taps of output pixel o of a pooling window k wide, in window order: f(pixel iw of row r,
// tap r * k + c) for each row r < k where row(r) is not null (pixel iw at row(r) + iw * 16) and each
// column iw = o * stride - pad + c in [0, in_w). Every level's max-pool kernels and the layer's
// average pooling walk their windows with it.
template <class Row, class F>
inline void pool_window(Row&& row, int k, int stride, int pad, int in_w, int o, F&& f) {
  for (int r = 0; r < k; ++r) {
    const auto line = row(r);
    if (!line) continue;
    for (int c = 0; c < k; ++c) {
      const int iw = o * stride - pad + c;
      if (iw >= 0 && iw < in_w) f(line + size_t(iw) * 16, r * k + c);
    }
  }
}
template <class F>
inline void maxpool_taps(const MaxPoolRowArgs& a, int o, F&& f) {
  pool_window([&](int r) { return a.rows[r]; }, a.k, a.stride, a.pad, a.in_w, o, f);
}
// Its backward, into dx's rows (rows[r] as above, of dx): for o = 0, 1, ... in order and each lane l
// whose arg t is not 255, dx at tap t (row t / k, column o * stride - pad + t % k) += dy[o * 16 + l].
// An element of dx takes its additions in output order, as the forward's windows overlap.
struct MaxPoolRowBwdArgs {
  float* const* rows;
  int k, stride, pad, out_w;
  const float* dy;
  const uint8_t* arg;
};
using MaxPoolRowBwdFn = void (*)(const MaxPoolRowBwdArgs& a);

// ---- layout: plain NCHW planes <-> blocked pixels ------------------------------------------------
// A run of `pixels` pixels of one 16-channel block between plain channel planes (channel l of pixel
// p at plain[l * plane + p]) and blocked pixels (blocked[p * 16 + l]), for the lanes l < `lanes`
// (1..16): to_blocked writes the other lanes zero, from_blocked does not read them. Values are
// copied bit for bit. to_blocked returns max|value| over what it copied (0 for nothing; NaN never
// wins the comparison): an INT16 operand's exponent without a pass of its own.
using ToBlockedFn = float (*)(const float* plain, size_t plane, int lanes, float* blocked, size_t pixels);
using FromBlockedFn = void (*)(const float* blocked, int lanes, float* plain, size_t plane, size_t pixels);

// ---- optimizer -----------------------------------------------------------------------------------
// SGD with momentum on FP32 master weights w, velocity v, gradient grad, element by element as
//   g = grad + wd * w;  v = momentum * v + g;  w = w - lr * (nesterov ? g + momentum * v : v)
// in that order of FP32 operations, none fused, in every implementation: the same bits everywhere.
struct SgdArgs {
  float lr, momentum, weight_decay;
  bool nesterov;
};
// Returns max|w| over the updated weights (NaN when any is NaN, inf when any is infinite): the
// shared exponent of their DFP16 copy, measured in the optimizer's pass rather than in a pass of
// its own.
using SgdUpdateFn = float (*)(float* w, const float* grad, float* v, size_t n, const SgdArgs& a);

// ---- BatchNorm over blocked pixels ---------------------------------------------------------------
// A pixel is 16 channels (one zmm, two ymm); per-channel operands (a, b, mean, ...) are 16-lane arrays.
// Every lane runs the same sequence of FP32 operations in every implementation, with no fused
// multiply-add, so the kernels are bit-identical to the references. Sums accumulate into the
// caller's running FP32 lanes (the caller bounds the run length and adds runs into FP64).
using BnScaleShiftFn = void (*)(const float* x, float* y, const float* a, const float* b, size_t pixels);  // y = x*a + b
// Moments of one run of pixels, one pass over memory (the caller keeps the run short enough for
// L1, where the second pass finds it): centre = (sum of x) / pixels, dev = sum(x - centre),
// sq = sum((x - centre)^2) (all overwritten); min = min(min, x), max = max(max, x) (carried, NaN
// never wins). The run's mean is centre + dev / pixels and its sum of squared deviations
// sq - dev^2 / pixels, to be combined across runs in FP64 (Chan et al.): no cancellation.
using BnMomentsFn = void (*)(const float* x, size_t pixels, float* centre, float* dev, float* sq, float* min,
                             float* max);
// Backward, with xhat = (x * x_scale - mean) * inv (x the saved input: DFP16 integers with
// x_scale = 2^e, or FP32 with x_scale = 1):
//   sums:  sdy += dy;  sdyx += dy * (x * x_scale - mean) * inv;  glo, ghi: running min and max of
//          dy (as masked; NaN never wins), from which the caller estimates max|dx| before apply
//   apply: dx = k1 * (dy - k2 - xhat * k3)          (dx may be dy); returns max(max0, |dx|), NaN never winning
// `mask` (one word per pixel, or null) is a fused ReLU's: where its bit is clear dy counts as 0.
struct BnCoefficients {
  const float *mean, *inv, *k1, *k2, *k3;
  float x_scale;
};
using BnBwdSumsS16Fn = void (*)(const int16_t* x, const float* dy, const uint16_t* mask, const BnCoefficients& c,
                                size_t pixels, float* sdy, float* sdyx, float* glo, float* ghi);
using BnBwdSumsF32Fn = void (*)(const float* x, const float* dy, const uint16_t* mask, const BnCoefficients& c,
                                size_t pixels, float* sdy, float* sdyx, float* glo, float* ghi);
using BnBwdApplyS16Fn = float (*)(const int16_t* x, const float* dy, const uint16_t* mask, float* dx,
                                  const BnCoefficients& c, size_t pixels, float max0);
using BnBwdApplyF32Fn = float (*)(const float* x, const float* dy, const uint16_t* mask, float* dx,
                                  const BnCoefficients& c, size_t pixels, float max0);
// A BatchNorm's output computed again from its saved DFP16 input and quantized straight into the
// batch-pair layout that an INT16 conv's weight gradient reads: for `pixels` pixels of one channel
// block of images a and b (b null: the zeros of an odd batch's missing image),
//   y = (x * 2^e_in) * scale + shift, then y > 0 ? y : 0 where relu,
// rounded to nearest (ties to even) at 2^e_out and interleaved as InterleaveFn interleaves: the
// bits of dequantize, bn_scale_shift, relu_fwd, quantize and interleave in turn, with no FP32
// tile between them. max_q[0], max_q[1]: each image's largest |q| (0 for a null b). Returns false
// (dst and max_q then unspecified) where some |q| would reach 32767 or a y is not finite: there the
// caller takes those kernels' own path, which counts and clamps.
using BnRequantizePairFn = bool (*)(const int16_t* a, const int16_t* b, int e_in, const float* scale,
                                    const float* shift, bool relu, int e_out, int16_t* dst, size_t pixels,
                                    int32_t* max_q);
// The same for one image into the plain layout (`pixels` x 16 INT16, an INT16 conv's forward copy
// of x): y = (x * 2^e_in) * scale + shift, then, where mask is not null, the ReLU with relu_fwd's
// mask (one word per pixel), rounded to nearest (ties to even) at 2^e_out; the bits of
// dequantize, bn_scale_shift, relu_fwd and quantize in turn. max_q: the largest |q|. Returns false
// (dst, mask and max_q then unspecified) where some |q| would reach 32767 or a y is not finite.
using BnRequantizeFn = bool (*)(const int16_t* x, int e_in, const float* scale, const float* shift, uint16_t* mask,
                                int e_out, int16_t* dst, size_t pixels, int32_t* max_q);
// A BatchNorm's dx (the INT16 conv before it: its dy) quantized as it is computed: the dx of
// bn_bwd_apply_s16 (max0 0) rounded to nearest (ties to even) at 2^e_out into dst (`pixels` x 16
// INT16), the bits of that kernel and quantize in turn, with no FP32 tile between them. Returns
// max|dx| as bn_bwd_apply_s16 does, and the largest |q| in max_q; returns -1 (dst and max_q then
// unspecified) where some |q| would reach 32767 or a dx is not finite.
using BnBwdRequantizeFn = float (*)(const int16_t* x, const float* dy, const uint16_t* mask, const BnCoefficients& c,
                                    size_t pixels, int e_out, int16_t* dst, int32_t* max_q);

// ---- BF16 / FP16 storage (include/dfp/float16.hpp is the specification) -----------------------
// dst[i] = the 16-bit pattern of src[i] in the format; stochastic rounding draws element i's
// random number as stochastic_rand24(key, index_base + i).
using ToHalfFn = void (*)(const float* src, uint16_t* dst, size_t n, Rounding rounding, uint32_t key,
                          uint64_t index_base);
using HalfToF32Fn = void (*)(const uint16_t* src, float* dst, size_t n);
// dst[i] = src[i] rounded to the format and widened back to FP32 (src == dst allowed).
using RoundToFn = void (*)(const float* src, float* dst, size_t n, Rounding rounding, uint32_t key,
                           uint64_t index_base);

// ---- FP8 (include/dfp/float8.hpp is the specification) ------------------------------------------
// dst[i] = round_float8(src[i], format, overflow, scale_exp, rounding, stochastic_rand24(key,
// index_base + i)) (src == dst allowed); returns max|src[i]| over the finite elements (0 if none),
// what delayed scaling records.
using RoundFp8Fn = float (*)(const float* src, float* dst, size_t n, FloatFormat format, Overflow overflow,
                             int scale_exp, Rounding rounding, uint32_t key, uint64_t index_base);

// ---- posit16 (include/dfp/posit.hpp is the specification) ------------------------------------------
// dst[i] = round_posit16(src[i], es) (src == dst allowed).
using RoundPositFn = void (*)(const float* src, float* dst, size_t n, int es);

// ---- OCP Microscaling blocks (include/dfp/float8.hpp: mx_round_block is the specification) -----
// Each block's rounded values go to the destination (== the source allowed), and the smallest and
// largest X of its finite blocks are folded into *scale_min and *scale_max.
// Blocks across the channels of a blocked (16-lane) tensor: at each of `pixels` pixels, the 16
// lanes of a and, where b is not null, the 16 of b form one block (padding lanes hold zeros,
// which neither move a block's scale nor change).
using MxLanesFn = void (*)(const float* a, const float* b, float* da, float* db, size_t pixels, FloatFormat element,
                           int* scale_min, int* scale_max);
// Blocks along rows: element (r, l) at src[r * row_stride + l] for r < rows, l < lanes; each
// lane's rows in blocks of kMxBlock, the last holding rows % kMxBlock.
using MxRowsFn = void (*)(const float* src, float* dst, size_t rows, size_t lanes, size_t row_stride,
                          FloatFormat element, int* scale_min, int* scale_max);

// ---- Block DFP (include/dfp/dfp16.hpp: dfp16_round_block is the specification) ------------------
// Each block rounded to DFP16 with an exponent of its own and stored back as floats (dst == src
// allowed); the smallest and largest exponent of its finite blocks that hold a nonzero value are
// folded into *exp_min and *exp_max. Nearest-even or biased rounding.
// Blocks across the channels of a blocked (16-lane) tensor: at each of `pixels` pixels, the 16
// lanes of `planes` consecutive planes (plane j at src + j * pixels * 16, planes <= 8) form one
// block.
using Dfp16LanesFn = void (*)(const float* src, float* dst, size_t planes, size_t pixels, int headroom, Rounding r,
                              int* exp_min, int* exp_max);
// Blocks along rows: element (r, l) at src[r * row_stride + l] for r < rows, l < lanes; each lane's
// rows in blocks of `block`, the last holding the rest.
using Dfp16RowsFn = void (*)(const float* src, float* dst, size_t rows, size_t lanes, size_t row_stride,
                             size_t block, int headroom, Rounding r, int* exp_min, int* exp_max);

using PixelKernelFn = void (*)(const PixelKernelArgs&);
// `count` pixel-kernel calls that share their weights: the same wei, wei_ob, wei_ib, nob, taps
// (tap_src, tap_wei, ntaps), nib, pairs, npix, src_pix, dst_ob, dst_pix and accumulate; each
// with its own src, dst, chain, scale, lane_scale and pixel_scale. The results are those of the
// calls one by one, each with its own flush points. Small calls (a 4x4 image's rows: 4 pixels,
// 8 accumulators) read their weights from L2 once per call; a level may run several in one pass
// over the weights instead (docs/design/kernels.md).
using PixelCallsFn = void (*)(const PixelKernelArgs* calls, int count);
using PairKernelFn = void (*)(const PairKernelArgs&);

// ---- FP32 baseline: convolution and inner product -------------------------------------------
// dfp::ConvF32 and dfp::LinearF32 run on a backend made once per layer (oneDNN creates its
// primitives and their weight layouts there, so a call allocates nothing). The table's factory
// picks the backend as it picks any kernel: oneDNN's JIT primitives from avx2 up, the scalar
// reference at `ref` (a `ref` context never runs JIT code, and tests pin the specification).
// Layouts: activations nChw16c, weights [K][C][R][S]; inner product row-major x[N][C], w[K][C],
// y[N][K].
class ConvF32Backend {
 public:
  virtual ~ConvF32Backend() = default;
  virtual const char* impl() const noexcept = 0;  // what runs the passes, e.g. "onednn:jit:avx512_core"
  virtual void set_weights(const float* w_kcrs) = 0;
  virtual void forward(const float* x, float* y) = 0;
  virtual void backward_data(const float* dy, float* dx) = 0;
  virtual void backward_weights(const float* x, const float* dy, float* dw_kcrs) = 0;
  // The buffers forward/backward_data read were written since: backward_weights reads its
  // arguments, not copies of them (ConvF32::inputs_rewritten).
  virtual void inputs_rewritten() = 0;
};
class LinearF32Backend {
 public:
  virtual ~LinearF32Backend() = default;
  virtual const char* impl() const noexcept = 0;
  virtual void set_weights(const float* w_kc) = 0;
  virtual void forward(const float* x_nc, float* y_nk) = 0;
  virtual void backward_data(const float* dy_nk, float* dx_nc) = 0;
  virtual void backward_weights(const float* x_nc, const float* dy_nk, float* dw_kc) = 0;
  virtual void inputs_rewritten() = 0;
};
// BF16-operand convolution with FP32 accumulation and FP32 outputs (the bf16 precision's native
// form): x and dy are BF16 bit patterns in the blocked layout, weights are passed as FP32 values
// already rounded to BF16 (the layer controls their rounding), y, dx and dw are FP32. Each pass
// names what runs it, e.g. "onednn:brg:avx512_core_amx".
class ConvBf16Backend {
 public:
  virtual ~ConvBf16Backend() = default;
  virtual const char* impl_forward() const noexcept = 0;
  virtual const char* impl_backward_data() const noexcept = 0;
  virtual const char* impl_backward_weights() const noexcept = 0;
  virtual void set_weights(const float* w_kcrs) = 0;
  virtual void forward(const uint16_t* x, float* y) = 0;
  virtual void backward_data(const uint16_t* dy, float* dx) = 0;
  virtual void backward_weights(const uint16_t* x, const uint16_t* dy, float* dw_kcrs) = 0;
};
// Throw dfp::Error naming `name` where the backend cannot run the shape. `threads`: the thread
// count of the engine's context, which a oneDNN backend binds OpenMP to before each call.
using ConvF32Factory = std::unique_ptr<ConvF32Backend> (*)(int threads, const ConvShape& shape,
                                                          const std::string& name);
using LinearF32Factory = std::unique_ptr<LinearF32Backend> (*)(int threads, int batch, int in_features,
                                                              int out_features, const std::string& name);
// Null where the level has no BF16-operand convolution for the shape worth running (the `ref`
// level, which runs no JIT code; a shape oneDNN has only its reference implementation for): the
// layer then rounds its operands to BF16 and runs conv_f32, the same arithmetic (products of BF16
// values are exact in FP32, sums in FP32), so this entry changes speed and summation order only.
using ConvBf16Factory = std::unique_ptr<ConvBf16Backend> (*)(int threads, const ConvShape& shape,
                                                            const std::string& name);

template <class F>
struct Entry {
  using Fn = F;
  Fn fn = nullptr;
  const char* name = "";
};

// One member per entry of simd/kernels.inc, in its order.
struct KernelTable {
  Isa isa = Isa::ref;
#define DFP_KERNEL(entry, Fn, reference, reference_name) Entry<Fn> entry;
#include "simd/kernels.inc"
#undef DFP_KERNEL
};

// The xsimd version the element-wise kernels were built with (for `dfp info`): the one translation
// unit that includes xsimd answers, so nothing else needs its headers.
const char* xsimd_version() noexcept;

// Fills a table for `isa` (which the caller has checked `cpu` supports). Within a level, `cpu`
// picks among forms that give the same bits (the VAES or AES-NI stochastic stream).
KernelTable make_kernel_table(Isa isa, const CpuFeatures& cpu);

// Implementations, one set per level (defined in simd/ref, simd/avx2, simd/avx512, simd/onednn),
// declared from the lists (simd/kernels.inc for the references, simd/<level>/kernels.inc) through
// the table's signatures (a function type declares a function): each signature is stated once, at
// its Fn alias above, and a definition that strays from it fails to link.
template <class Fn>
using Signature = std::remove_pointer_t<Fn>;
template <class E>
using EntrySignature = Signature<typename E::Fn>;

#define DFP_KERNEL(entry, Fn, reference, reference_name) namespace ref { Signature<Fn> reference; }
#include "simd/kernels.inc"
#undef DFP_KERNEL
#define DFP_IMPL(level, entry, implementation, name, when) \
  namespace level { EntrySignature<decltype(KernelTable::entry)> implementation; }
#include "simd/onednn/kernels.inc"
#include "simd/avx2/kernels.inc"
#include "simd/avx512/kernels.inc"
#undef DFP_IMPL

}  // namespace dfp::simd
