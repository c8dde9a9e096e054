// The element-wise and per-channel operations of the CUDA device, written once for two back ends.
//
// Every operation is a pair: an argument struct of plain data (device pointers as void*, shapes)
// and a functor template XFn<T> whose operator()(i) computes output element i. The GPU back end
// (gpu_backend.cu) launches one thread per index (grid-stride loop) with T = __half (fp16 mode)
// or float (fp32 mode); the host back end (host_backend.cpp) calls the same operator() in a loop
// with T = float. So the indexing and arithmetic that run on the GPU are the ones the GPU-less
// test suite checks against the CPU layers (tests/cuda/cuda_plan_test.cpp).
//
// Layouts on the device: activations and their gradients are NHWC, dense ([N][H][W][C], element
// (n, h, w, c) at ((n*H + h)*W + w)*C + c), stored as T; a flat (N, F, 1, 1) node is a [N][F]
// row-major matrix. Conv weights on the device are KRSC (cuDNN's NHWC filter format), Linear
// weights [K][F] as on the host; both are T copies of FP32 master weights kept in the host layout.
// Every operation computes in FP32 (loss and statistics in FP64) and rounds once when storing T.
//
// Backward operations are written in gather form: one thread per input-gradient element reads
// every output gradient it contributes to, so there are no atomics, results are deterministic, and
// a node with several consumers accumulates (acc = true: dx += ...) instead of needing a second
// buffer.
//
// No CUDA types leak out of this header when it is compiled by the host compiler (DFP_HD is
// empty there and __half is not declared).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "base/random.hpp"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define DFP_HD __host__ __device__
#else
#define DFP_HD
#endif

namespace dfp::cuda {

// ---- element access and helpers ---------------------------------------------------------------

DFP_HD inline float ld(const float* p, size_t i) { return p[i]; }
DFP_HD inline void st(float* p, size_t i, float v) { p[i] = v; }
#if defined(__CUDACC__)
DFP_HD inline float ld(const __half* p, size_t i) { return __half2float(p[i]); }
DFP_HD inline void st(__half* p, size_t i, float v) { p[i] = __float2half_rn(v); }
#endif

template <class T>  // float or double
DFP_HD inline bool is_finite(T v) {
#if defined(__CUDA_ARCH__)
  return isfinite(v);
#else
  return std::isfinite(v);
#endif
}

// Index of (n, c, h, w) in the host's blocked layout [N][ceil(C/16)][H][W][16].
DFP_HD inline size_t blocked_index(int C, int H, int W, int n, int c, int h, int w) {
  const int cb = (C + 15) / 16;
  return ((((size_t)n * cb + c / 16) * H + h) * W + w) * 16 + (c % 16);
}

// Decomposes an NHWC index.
struct Nhwc {
  int n, h, w, c;
};
DFP_HD inline Nhwc nhwc_of(size_t i, int H, int W, int C) {
  Nhwc r;
  r.c = (int)(i % C);
  size_t rest = i / C;
  r.w = (int)(rest % W);
  rest /= W;
  r.h = (int)(rest % H);
  r.n = (int)(rest / H);
  return r;
}
DFP_HD inline size_t nhwc_index(int H, int W, int C, int n, int h, int w, int c) {
  return (((size_t)n * H + h) * W + w) * C + c;
}

// The CPU's counter-based random numbers are base/random.hpp's (mix32, stochastic_key,
// stochastic_rand24), host and device, so dropout masks on the device equal the CPU's.
// The key of a dropout layer with seed `seed` at training step `step` (step_key in src/layers/layer_helpers.hpp).
inline uint32_t dropout_key(uint64_t seed, uint64_t step) { return stochastic_key(step_seed(seed, step)); }

// Upper bound on the partial sums a per-channel reduction may use (ReduceArgs::scratch holds
// kReduceParts * 2 * C doubles).
constexpr int kReduceParts = 1024;

// ---- parameters ------------------------------------------------------------------------------
// All FP32 master values, gradients and momentum live in three flat device arrays, one segment per
// host Parameter in Model::parameters() order. Conv/Linear weights also have a T copy (and a T
// gradient from cuDNN/cuBLAS) in flat device arrays at `dev`.
struct ParamSeg {
  uint64_t begin = 0, size = 0;  // range in the flat master arrays
  uint64_t dev = 0;              // offset in the flat device weight/gradient arrays (kind 1, 2)
  int kind = 0;                  // 0: FP32 gradient written in place in the master gradient array
                                 // 1: T device copy, same layout; 2: T device copy, KCRS <-> KRSC
  int C = 0, RS = 0;             // kind 2: input channels, kernel taps
  float wd = 0.f;                // weight decay
};

DFP_HD inline int find_seg(const ParamSeg* segs, int nsegs, uint64_t i) {
  int lo = 0, hi = nsegs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (segs[mid].begin <= i) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}
// Device-copy index of element j (host layout) of a segment.
DFP_HD inline uint64_t dev_index(const ParamSeg& s, uint64_t j) {
  if (s.kind != 2) return s.dev + j;
  const uint64_t crs = (uint64_t)s.C * s.RS;
  const uint64_t k = j / crs, rem = j % crs, c = rem / s.RS, rs = rem % s.RS;
  return s.dev + (k * s.RS + rs) * s.C + c;
}

// What one step reports back to the host (one small copy per step).
struct StepStats {
  double loss = 0;            // sum over the counted images
  int correct1 = 0, correct5 = 0;
  int nonfinite_logits = 0;   // images whose loss is not finite
  int found_inf = 0;          // a parameter gradient was not finite after unscaling
};

// ---- operation list ----------------------------------------------------------------------------
#define DFP_CUDA_OPS(X)                                                                              \
  X(ToNhwc) X(BiasAdd) X(Relu) X(ReluBwd) X(Add2) X(Copy) X(PoolFwd) X(PoolBwd) X(GapFwd) X(GapBwd)  \
  X(FlattenFwd) X(FlattenBwd) X(ConcatFwd) X(ConcatBwd) X(DropoutFwd) X(DropoutBwd) X(LrnFwd)        \
  X(LrnBwd) X(ShortcutFwd) X(ShortcutBwd) X(BnMean) X(BnFinalizeTrain) X(BnFinalizeEval) X(BnApply)  \
  X(BnBwdFinalize) X(BnBwdData) X(SumOut) X(SoftmaxCe) X(LossSum) X(Unscale) X(SgdCast) X(Cast)

enum class Op {
#define DFP_ENUM(name) name,
  DFP_CUDA_OPS(DFP_ENUM)
#undef DFP_ENUM
};

#define DFP_OP(name) static constexpr Op kOp = Op::name;

// The staged batch (NHWC FP32) -> the input activation (NHWC T). i over N*H*W*C.
struct ToNhwcArgs {
  DFP_OP(ToNhwc)
  const float* src; void* dst;
};
template <class T> struct ToNhwcFn {
  ToNhwcArgs a;
  DFP_HD void operator()(size_t i) const { st((T*)a.dst, i, a.src[i]); }
};

// y[i] += b[i % C] (conv and linear bias; b FP32). i over rows*C.
struct BiasAddArgs {
  DFP_OP(BiasAdd)
  void* y; const float* b; int C;
};
template <class T> struct BiasAddFn {
  BiasAddArgs a;
  DFP_HD void operator()(size_t i) const { st((T*)a.y, i, ld((const T*)a.y, i) + a.b[i % a.C]); }
};

// y = x > 0 ? x : 0 (NaN -> 0, as the CPU kernel).
struct ReluArgs {
  DFP_OP(Relu)
  const void* x; void* y;
};
template <class T> struct ReluFn {
  ReluArgs a;
  DFP_HD void operator()(size_t i) const {
    const float v = ld((const T*)a.x, i);
    st((T*)a.y, i, v > 0.f ? v : 0.f);
  }
};

// dx (+)= y > 0 ? dy : 0.
struct ReluBwdArgs {
  DFP_OP(ReluBwd)
  const void* y; const void* dy; void* dx; bool acc;
};
template <class T> struct ReluBwdFn {
  ReluBwdArgs a;
  DFP_HD void operator()(size_t i) const {
    const float g = ld((const T*)a.y, i) > 0.f ? ld((const T*)a.dy, i) : 0.f;
    st((T*)a.dx, i, a.acc ? ld((const T*)a.dx, i) + g : g);
  }
};

// y = a + b.
struct Add2Args {
  DFP_OP(Add2)
  const void* a; const void* b; void* y;
};
template <class T> struct Add2Fn {
  Add2Args a;
  DFP_HD void operator()(size_t i) const { st((T*)a.y, i, ld((const T*)a.a, i) + ld((const T*)a.b, i)); }
};

// dst (+)= src (the residual add's backward, dropout in evaluation).
struct CopyArgs {
  DFP_OP(Copy)
  const void* src; void* dst; bool acc;
};
template <class T> struct CopyFn {
  CopyArgs a;
  DFP_HD void operator()(size_t i) const {
    const float g = ld((const T*)a.src, i);
    st((T*)a.dst, i, a.acc ? ld((const T*)a.dst, i) + g : g);
  }
};

// Max / average pooling (Pool in src/layers/pool.cpp): windows k x k, stride s, padding p; positions outside
// the input are skipped; the average divides by k*k (count_include_pad); max records the first
// maximum in window order (row-major) for backward, as the CPU's backward selects it.
struct PoolArgs {
  DFP_OP(PoolFwd)
  const void* x; void* y; uint8_t* argmax;  // argmax: window position, max pooling only
  int N, C, H, W, OH, OW, k, s, p;
  bool max;
};
using PoolFwdArgs = PoolArgs;
template <class T> struct PoolFwdFn {
  PoolArgs a;
  DFP_HD void operator()(size_t i) const {
    const Nhwc o = nhwc_of(i, a.OH, a.OW, a.C);
    const T* x = (const T*)a.x;
    float acc = a.max ? -INFINITY : 0.f;
    int arg = -1;
    for (int r = 0; r < a.k; ++r) {
      const int ih = o.h * a.s + r - a.p;
      if (ih < 0 || ih >= a.H) continue;
      for (int q = 0; q < a.k; ++q) {
        const int iw = o.w * a.s + q - a.p;
        if (iw < 0 || iw >= a.W) continue;
        const float v = ld(x, nhwc_index(a.H, a.W, a.C, o.n, ih, iw, o.c));
        if (a.max) {
          if (arg < 0) arg = r * a.k + q;  // an all -inf/NaN window: its first position
          if (v > acc) { acc = v; arg = r * a.k + q; }
        } else {
          acc += v;
        }
      }
    }
    if (a.max) {
      a.argmax[i] = (uint8_t)(arg < 0 ? 0 : arg);
      st((T*)a.y, i, acc);
    } else {
      st((T*)a.y, i, acc * (1.f / (float)(a.k * a.k)));
    }
  }
};

// Gather form: input position (ih, iw) collects dy of every window that contains it (max: only
// where it is the window's recorded maximum). i over N*H*W*C.
struct PoolBwdArgs {
  DFP_OP(PoolBwd)
  const void* dy; void* dx; const uint8_t* argmax;
  int N, C, H, W, OH, OW, k, s, p;
  bool max, acc;
};
template <class T> struct PoolBwdFn {
  PoolBwdArgs a;
  DFP_HD void operator()(size_t i) const {
    const Nhwc x = nhwc_of(i, a.H, a.W, a.C);
    const T* dy = (const T*)a.dy;
    // Windows oh with oh*s - p <= ih <= oh*s - p + k - 1.
    const int hp = x.h + a.p, wp = x.w + a.p;
    const int oh0 = hp - a.k + 1 > 0 ? (hp - a.k + a.s) / a.s : 0, oh1 = hp / a.s;
    const int ow0 = wp - a.k + 1 > 0 ? (wp - a.k + a.s) / a.s : 0, ow1 = wp / a.s;
    const float inv = 1.f / (float)(a.k * a.k);
    float g = 0.f;
    for (int oh = oh0; oh <= oh1 && oh < a.OH; ++oh)
      for (int ow = ow0; ow <= ow1 && ow < a.OW; ++ow) {
        const size_t o = nhwc_index(a.OH, a.OW, a.C, x.n, oh, ow, x.c);
        if (a.max) {
          const int pos = (x.h - (oh * a.s - a.p)) * a.k + (x.w - (ow * a.s - a.p));
          if (a.argmax[o] == pos) g += ld(dy, o);
        } else {
          g += ld(dy, o) * inv;
        }
      }
    st((T*)a.dx, i, a.acc ? ld((const T*)a.dx, i) + g : g);
  }
};

// Global average pooling: y[n][c] = sum_hw x / HW (FP32 sum in pixel order, as the CPU). i over N*C.
struct GapFwdArgs {
  DFP_OP(GapFwd)
  const void* x; void* y; int C, HW;
};
template <class T> struct GapFwdFn {
  GapFwdArgs a;
  DFP_HD void operator()(size_t i) const {
    const size_t n = i / a.C, c = i % a.C;
    const T* x = (const T*)a.x;
    float acc = 0.f;
    for (int j = 0; j < a.HW; ++j) acc += ld(x, (n * a.HW + j) * a.C + c);
    st((T*)a.y, i, acc / (float)a.HW);
  }
};
struct GapBwdArgs {
  DFP_OP(GapBwd)
  const void* dy; void* dx; int C, HW; bool acc;
};
template <class T> struct GapBwdFn {
  GapBwdArgs a;
  DFP_HD void operator()(size_t i) const {
    const size_t c = i % a.C, n = i / ((size_t)a.C * a.HW);
    const float g = ld((const T*)a.dy, n * a.C + c) / (float)a.HW;
    st((T*)a.dx, i, a.acc ? ld((const T*)a.dx, i) + g : g);
  }
};

// Flatten: feature (c*H + h)*W + w of image n, as torch.flatten of NCHW. i over N*C*H*W (output).
struct FlattenFwdArgs {
  DFP_OP(FlattenFwd)
  const void* x; void* y; int C, H, W;
};
template <class T> struct FlattenFwdFn {
  FlattenFwdArgs a;
  DFP_HD void operator()(size_t i) const {
    const size_t F = (size_t)a.C * a.H * a.W, n = i / F, f = i % F;
    const int c = (int)(f / ((size_t)a.H * a.W)), hw = (int)(f % ((size_t)a.H * a.W));
    st((T*)a.y, i, ld((const T*)a.x, nhwc_index(a.H, a.W, a.C, (int)n, hw / a.W, hw % a.W, c)));
  }
};
struct FlattenBwdArgs {
  DFP_OP(FlattenBwd)
  const void* dy; void* dx; int C, H, W; bool acc;
};
template <class T> struct FlattenBwdFn {
  FlattenBwdArgs a;
  DFP_HD void operator()(size_t i) const {
    const Nhwc p = nhwc_of(i, a.H, a.W, a.C);
    const size_t F = (size_t)a.C * a.H * a.W;
    const float g = ld((const T*)a.dy, p.n * F + ((size_t)p.c * a.H + p.h) * a.W + p.w);
    st((T*)a.dx, i, a.acc ? ld((const T*)a.dx, i) + g : g);
  }
};

// Channel concatenation of up to kMaxConcat inputs. i over rows*Cout.
constexpr int kMaxConcat = 8;
struct ConcatFwdArgs {
  DFP_OP(ConcatFwd)
  const void* x[kMaxConcat]; int c[kMaxConcat]; int count; void* y; int Cout;
};
template <class T> struct ConcatFwdFn {
  ConcatFwdArgs a;
  DFP_HD void operator()(size_t i) const {
    const size_t row = i / a.Cout;
    int c = (int)(i % a.Cout), j = 0;
    while (j + 1 < a.count && c >= a.c[j]) c -= a.c[j++];
    st((T*)a.y, i, ld((const T*)a.x[j], row * a.c[j] + c));
  }
};
// Gradient of one input (channels [off, off + Ci) of the output). i over rows*Ci.
struct ConcatBwdArgs {
  DFP_OP(ConcatBwd)
  const void* dy; void* dx; int Ci, Cout, off; bool acc;
};
template <class T> struct ConcatBwdFn {
  ConcatBwdArgs a;
  DFP_HD void operator()(size_t i) const {
    const size_t row = i / a.Ci, c = i % a.Ci;
    const float g = ld((const T*)a.dy, row * a.Cout + a.off + c);
    st((T*)a.dx, i, a.acc ? ld((const T*)a.dx, i) + g : g);
  }
};

// Inverted dropout with the CPU's mask: element (n, c, h, w) is kept when
// rand24(key, blocked index) * 2^-24 >= p. i over N*H*W*C.
struct DropoutArgs {
  DFP_OP(DropoutFwd)
  const void* x; void* y; int N, C, H, W; uint32_t key; float p; bool train;
};
using DropoutFwdArgs = DropoutArgs;
DFP_HD inline bool dropout_keep(const DropoutArgs& a, size_t i) {
  const Nhwc q = nhwc_of(i, a.H, a.W, a.C);
  const size_t b = blocked_index(a.C, a.H, a.W, q.n, q.c, q.h, q.w);
  return (float)stochastic_rand24(a.key, b) * 0x1p-24f >= a.p;
}
template <class T> struct DropoutFwdFn {
  DropoutArgs a;
  DFP_HD void operator()(size_t i) const {
    const float v = ld((const T*)a.x, i);
    if (!a.train || a.p == 0.f) st((T*)a.y, i, v);
    else st((T*)a.y, i, dropout_keep(a, i) ? v * (1.f / (1.f - a.p)) : 0.f);
  }
};
struct DropoutBwdArgs {
  DFP_OP(DropoutBwd)
  DropoutArgs d;  // x = dy, y = dx
  bool acc;
};
template <class T> struct DropoutBwdFn {
  DropoutBwdArgs a;
  DFP_HD void operator()(size_t i) const {
    const float g = dropout_keep(a.d, i) ? ld((const T*)a.d.x, i) * (1.f / (1.f - a.d.p)) : 0.f;
    st((T*)a.d.y, i, a.acc ? ld((const T*)a.d.y, i) + g : g);
  }
};

// Local response normalisation across channels, torch.nn.LocalResponseNorm (Lrn in src/layers/lrn.cpp):
// window [c - size/2, c + (size-1)/2] clipped to [0, C); scale = k + alpha/size * sum x^2;
// y = x * scale^-beta. scale is kept (FP32) for backward.
struct LrnArgs {
  DFP_OP(LrnFwd)
  const void* x; void* y; float* scale; const void* dy; void* dx;
  int C, size; float alpha, beta, k; bool acc;
};
using LrnFwdArgs = LrnArgs;
DFP_HD inline int lrn_lo(const LrnArgs& a, int c) { return c - a.size / 2 > 0 ? c - a.size / 2 : 0; }
DFP_HD inline int lrn_hi(const LrnArgs& a, int c) { return c + (a.size - 1) / 2 < a.C - 1 ? c + (a.size - 1) / 2 : a.C - 1; }
template <class T> struct LrnFwdFn {
  LrnArgs a;
  DFP_HD void operator()(size_t i) const {
    const int c = (int)(i % a.C);
    const size_t base = i - c;
    const T* x = (const T*)a.x;
    double sum = 0;
    for (int j = lrn_lo(a, c); j <= lrn_hi(a, c); ++j) {
      const float v = ld(x, base + j);
      sum += (double)v * v;
    }
    const float sc = (float)(a.k + (double)(a.alpha / a.size) * sum);
    a.scale[i] = sc;
    st((T*)a.y, i, ld(x, i) * powf(sc, -a.beta));
  }
};
struct LrnBwdArgs {
  DFP_OP(LrnBwd)
  LrnArgs l;
};
template <class T> struct LrnBwdFn {
  LrnBwdArgs b;
  DFP_HD void operator()(size_t i) const {
    const LrnArgs& a = b.l;
    const int c = (int)(i % a.C);
    const size_t base = i - c;
    const T *dy = (const T*)a.dy, *y = (const T*)a.y;
    double acc = 0;
    const int j0 = c - a.size > 0 ? c - a.size : 0, j1 = c + a.size < a.C - 1 ? c + a.size : a.C - 1;
    for (int j = j0; j <= j1; ++j) {
      if (c < lrn_lo(a, j) || c > lrn_hi(a, j)) continue;
      acc += (double)ld(dy, base + j) * ld(y, base + j) / a.scale[base + j];
    }
    const float g = (float)(ld(dy, i) * powf(a.scale[i], -a.beta) -
                            2.0 * a.alpha * a.beta / a.size * ld((const T*)a.x, i) * acc);
    st((T*)a.dx, i, a.acc ? ld((const T*)a.dx, i) + g : g);
  }
};

// ResNet option-A shortcut: y[n, oh, ow, c + off] = x[n, oh*s, ow*s, c], zero channels around.
struct ShortcutArgs {
  DFP_OP(ShortcutFwd)
  const void* x; void* y; int C, H, W, Cout, OH, OW, s; bool acc;
};
using ShortcutFwdArgs = ShortcutArgs;
template <class T> struct ShortcutFwdFn {
  ShortcutArgs a;
  DFP_HD void operator()(size_t i) const {  // i over the output
    const Nhwc o = nhwc_of(i, a.OH, a.OW, a.Cout);
    const int c = o.c - (a.Cout - a.C) / 2;
    const float v = (c >= 0 && c < a.C) ? ld((const T*)a.x, nhwc_index(a.H, a.W, a.C, o.n, o.h * a.s, o.w * a.s, c)) : 0.f;
    st((T*)a.y, i, v);
  }
};
struct ShortcutBwdArgs {
  DFP_OP(ShortcutBwd)
  ShortcutArgs s;  // x = dy (output shape), y = dx (input shape)
};
template <class T> struct ShortcutBwdFn {
  ShortcutBwdArgs b;
  DFP_HD void operator()(size_t i) const {  // i over the input
    const ShortcutArgs& a = b.s;
    const Nhwc p = nhwc_of(i, a.H, a.W, a.C);
    float g = 0.f;
    if (p.h % a.s == 0 && p.w % a.s == 0)
      g = ld((const T*)a.x, nhwc_index(a.OH, a.OW, a.Cout, p.n, p.h / a.s, p.w / a.s, p.c + (a.Cout - a.C) / 2));
    st((T*)a.y, i, a.acc ? ld((const T*)a.y, i) + g : g);
  }
};

// ---- per-channel reductions (BatchNorm statistics, bias gradients) ------------------------------
// out[c] = sum over rows of term a(r, c), out[C + c] = sum of term b(r, c), in FP64 (terms FP32).
enum class Reduce { sum, sqdev, bn_bwd };
struct ReduceArgs {
  Reduce kind;
  const void* x;        // sum, sqdev, bn_bwd: the activation (sum: any rows x C tensor)
  const void* dy;       // bn_bwd
  const float* mean;    // sqdev, bn_bwd
  const float* invstd;  // bn_bwd
  size_t rows;
  int C;
  double* out;          // 2*C
  double* scratch;      // kReduceParts * 2 * C (GPU partial sums)
};
template <class T>
DFP_HD inline void reduce_term(const ReduceArgs& a, size_t r, int c, float& u, float& v) {
  const size_t i = r * a.C + c;
  const float x = ld((const T*)a.x, i);
  switch (a.kind) {
    case Reduce::sum: u = x; v = 0.f; break;
    case Reduce::sqdev: { const float d = x - a.mean[c]; u = d * d; v = 0.f; break; }
    case Reduce::bn_bwd: {
      const float g = ld((const T*)a.dy, i);
      u = g;
      v = g * (x - a.mean[c]) * a.invstd[c];
      break;
    }
  }
}

// ---- BatchNorm (BatchNorm in src/layers/batchnorm.cpp: the layer's eps (LayerSpec::eps), momentum 0.1,
// two-pass variance, running variance unbiased) ------------------------------------------------
constexpr double kBnMomentum = 0.1;

// mean[c] = sum[c] / m. i over C.
struct BnMeanArgs {
  DFP_OP(BnMean)
  const double* sums; float* mean; double m;
};
template <class T> struct BnMeanFn {
  BnMeanArgs a;
  DFP_HD void operator()(size_t c) const { a.mean[c] = (float)(a.sums[c] / a.m); }
};
// From the squared deviations: invstd, and the running statistics. i over C.
struct BnFinalizeTrainArgs {
  DFP_OP(BnFinalizeTrain)
  const double* sums; const float* mean; float* invstd; float* running_mean; float* running_var; double m; double eps;
};
template <class T> struct BnFinalizeTrainFn {
  BnFinalizeTrainArgs a;
  DFP_HD void operator()(size_t c) const {
    const double var = a.sums[c] / a.m;
    a.invstd[c] = (float)(1.0 / sqrt(var + a.eps));
    a.running_mean[c] = (float)((1 - kBnMomentum) * a.running_mean[c] + kBnMomentum * a.mean[c]);
    a.running_var[c] = (float)((1 - kBnMomentum) * a.running_var[c] +
                               kBnMomentum * var * a.m / (a.m - 1 > 1 ? a.m - 1 : 1.0));
  }
};
struct BnFinalizeEvalArgs {
  DFP_OP(BnFinalizeEval)
  float* mean; float* invstd; const float* running_mean; const float* running_var; double eps;
};
template <class T> struct BnFinalizeEvalFn {
  BnFinalizeEvalArgs a;
  DFP_HD void operator()(size_t c) const {
    a.mean[c] = a.running_mean[c];
    a.invstd[c] = (float)(1.f / sqrt(a.running_var[c] + a.eps));
  }
};
// y = x * (gamma * invstd) + (beta - mean * gamma * invstd). i over rows*C.
struct BnApplyArgs {
  DFP_OP(BnApply)
  const void* x; void* y; const float* gamma; const float* beta; const float* mean; const float* invstd; int C;
};
template <class T> struct BnApplyFn {
  BnApplyArgs a;
  DFP_HD void operator()(size_t i) const {
    const int c = (int)(i % a.C);
    const float s = a.gamma[c] * a.invstd[c], b = a.beta[c] - a.mean[c] * s;
    st((T*)a.y, i, ld((const T*)a.x, i) * s + b);
  }
};
// Parameter gradients (into the master gradient array) and the two dx coefficients. i over C.
struct BnBwdFinalizeArgs {
  DFP_OP(BnBwdFinalize)
  const double* sums; float* ggamma; float* gbeta; float* k23; int C; double m;
};
template <class T> struct BnBwdFinalizeFn {
  BnBwdFinalizeArgs a;
  DFP_HD void operator()(size_t c) const {
    const double sdy = a.sums[c], sdyx = a.sums[a.C + c];
    a.ggamma[c] = (float)sdyx;
    a.gbeta[c] = (float)sdy;
    a.k23[c] = (float)(sdy / a.m);
    a.k23[a.C + c] = (float)(sdyx / a.m);
  }
};
// dx (+)= gamma*invstd * (dy - sum(dy)/m - xhat * sum(dy*xhat)/m). i over rows*C.
struct BnBwdDataArgs {
  DFP_OP(BnBwdData)
  const void* x; const void* dy; void* dx; const float* gamma; const float* mean; const float* invstd;
  const float* k23; int C; bool acc;
};
template <class T> struct BnBwdDataFn {
  BnBwdDataArgs a;
  DFP_HD void operator()(size_t i) const {
    const int c = (int)(i % a.C);
    const float inv = a.invstd[c];
    const float xhat = (ld((const T*)a.x, i) - a.mean[c]) * inv;
    const float g = a.gamma[c] * inv * (ld((const T*)a.dy, i) - a.k23[c] - xhat * a.k23[a.C + c]);
    st((T*)a.dx, i, a.acc ? ld((const T*)a.dx, i) + g : g);
  }
};

// dst[c] = (float) sums[c] (bias gradients). i over C.
struct SumOutArgs {
  DFP_OP(SumOut)
  const double* sums; float* dst;
};
template <class T> struct SumOutFn {
  SumOutArgs a;
  DFP_HD void operator()(size_t c) const { a.dst[c] = (float)a.sums[c]; }
};

// ---- loss ---------------------------------------------------------------------------------------
// Softmax cross-entropy with label smoothing, per image, in FP64 (Model::Impl::forward/backward):
// loss[n], top-1/top-5 hits (rank of the label's logit, ties broken by class index), and in
// training dlogits = (p - target) / batch * scale (scale: the loss scale). i over the counted images.
struct SoftmaxCeArgs {
  DFP_OP(SoftmaxCe)
  const void* logits; const int32_t* labels; void* dlogits;  // dlogits: null in evaluation
  double* loss; int* hit1; int* hit5;
  int K, batch; float smoothing, scale;
};
template <class T> struct SoftmaxCeFn {
  SoftmaxCeArgs a;
  DFP_HD void operator()(size_t n) const {
    const T* z = (const T*)a.logits + n * a.K;
    const int y = a.labels[n];
    float zmax = ld(z, 0);
    for (int k = 1; k < a.K; ++k) zmax = ld(z, k) > zmax ? ld(z, k) : zmax;
    double sum = 0;
    for (int k = 0; k < a.K; ++k) sum += exp((double)ld(z, k) - zmax);
    const double lse = zmax + log(sum);
    double l = 0;
    int rank = 0;
    const float zy = ld(z, y);
    for (int k = 0; k < a.K; ++k) {
      const float zk = ld(z, k);
      const double logp = zk - lse;
      const double target = (k == y ? 1.0 - a.smoothing : 0.0) + (double)a.smoothing / a.K;
      l -= target * logp;
      rank += (zk > zy) || (zk == zy && k < y);
      if (a.dlogits) {
        const float p = (float)exp(logp);
        st((T*)a.dlogits, n * a.K + k, (float)((p - target) / a.batch) * a.scale);
      }
    }
    a.loss[n] = l;
    a.hit1[n] = rank < 1;
    a.hit5[n] = rank < 5;
  }
};
// One thread: sums the per-image results in image order, resets found_inf. i = 0 only.
struct LossSumArgs {
  DFP_OP(LossSum)
  const double* loss; const int* hit1; const int* hit5; int count; StepStats* out;
};
template <class T> struct LossSumFn {
  LossSumArgs a;
  DFP_HD void operator()(size_t) const {
    StepStats s;
    for (int n = 0; n < a.count; ++n) {
      s.loss += a.loss[n];
      s.correct1 += a.hit1[n];
      s.correct5 += a.hit5[n];
      s.nonfinite_logits += !is_finite(a.loss[n]);
    }
    *a.out = s;
  }
};

// ---- parameter updates ---------------------------------------------------------------------------
// grad[i] = (device or in-place gradient) * inv_scale, in the host layout; a non-finite result sets
// *found_inf (every writer stores the same 1). i over all master elements.
struct UnscaleArgs {
  DFP_OP(Unscale)
  const ParamSeg* segs; int nsegs; const void* dgrad; float* grad; float inv_scale; int* found_inf;
};
template <class T> struct UnscaleFn {
  UnscaleArgs a;
  DFP_HD void operator()(size_t i) const {
    const ParamSeg& s = a.segs[find_seg(a.segs, a.nsegs, i)];
    const float g = s.kind == 0 ? a.grad[i] : ld((const T*)a.dgrad, dev_index(s, i - s.begin));
    const float u = g * a.inv_scale;
    a.grad[i] = u;
    if (!is_finite(u)) *a.found_inf = 1;
  }
};
// torch.optim.SGD (Sgd::step in optim.cpp): g' = g + wd*w; v = m*v + g'; w -= lr*(nesterov ? g' + m*v : v);
// then the T device copy of the new weight. i over all master elements.
struct SgdCastArgs {
  DFP_OP(SgdCast)
  const ParamSeg* segs; int nsegs; float* w; const float* grad; float* v; void* wdev;
  float lr, momentum; bool nesterov;
};
template <class T> struct SgdCastFn {
  SgdCastArgs a;
  DFP_HD void operator()(size_t i) const {
    const ParamSeg& s = a.segs[find_seg(a.segs, a.nsegs, i)];
    const float g = a.grad[i] + s.wd * a.w[i];
    const float v = a.momentum * a.v[i] + g;
    a.v[i] = v;
    const float w = a.w[i] - a.lr * (a.nesterov ? g + a.momentum * v : v);
    a.w[i] = w;
    if (s.kind != 0) st((T*)a.wdev, dev_index(s, i - s.begin), w);
  }
};
// The T device copies of the master weights (after an upload). i over all master elements.
struct CastArgs {
  DFP_OP(Cast)
  const ParamSeg* segs; int nsegs; const float* w; void* wdev;
};
template <class T> struct CastFn {
  CastArgs a;
  DFP_HD void operator()(size_t i) const {
    const ParamSeg& s = a.segs[find_seg(a.segs, a.nsegs, i)];
    if (s.kind != 0) st((T*)a.wdev, dev_index(s, i - s.begin), a.w[i]);
  }
};

#undef DFP_OP

}  // namespace dfp::cuda
