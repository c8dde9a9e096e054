// Scalar reference for the INT16 micro-kernels: a bit-exact model of VPDPWSSD (pairwise INT16
// products, wrapping INT32 accumulation) and of the FP32 flush (convert with round-to-nearest-even,
// then, in a call that adds to dst, one fused multiply-add; in a call that overwrites dst, an add
// to the unscaled partial sum and one multiply by the scale at the end). Loop order differs from
// the vector kernels but every lane sees the same sequence of INT32 additions and flushes, so the
// results are identical.
//
// Verification: when overflow_events is non-null, an INT64 shadow of every accumulator counts
// the steps at which the true sum leaves the INT32 range (the hardware sum would have wrapped).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "simd/kernel_table.hpp"

namespace dfp::simd::ref {
namespace {

// One lane of an INT32 chain: the wrapped hardware value and an exact INT64 shadow.
struct Lane {
  int32_t acc = 0;
  int64_t exact = 0;
  void step(int32_t a0, int32_t b0, int32_t a1, int32_t b1, int64_t* events) {
    const int64_t p = static_cast<int64_t>(a0) * b0 + static_cast<int64_t>(a1) * b1;
    acc = static_cast<int32_t>(static_cast<uint32_t>(acc) + static_cast<uint32_t>(p));
    if (events) {
      exact += p;
      if (exact > std::numeric_limits<int32_t>::max() || exact < std::numeric_limits<int32_t>::min()) {
        ++*events;
        exact = acc;  // count each wrap once; continue from what the hardware holds
      }
    }
  }
  // The chain's sum as the flush converts it (round to nearest even); the chain restarts.
  float take() {
    const float f = static_cast<float>(acc);
    acc = 0;
    exact = 0;
    return f;
  }
};

// One output lane's flushes, as the vector kernels make them (see Flush in
// simd/avx512/conv_s16_kernels.hpp): FMA into dst when the call accumulates; otherwise an unscaled
// FP32 sum (from 0: adding the first chain to 0 is exact), scaled once at the end.
struct LaneOut {
  float* dst;
  float scale;
  bool accumulate;
  float sum = 0.f;
  void flush(Lane& lane) {
    const float f = lane.take();
    if (accumulate)
      *dst = std::fma(f, scale, *dst);
    else
      sum = f + sum;
  }
  // After the last step: the steps since the last flush, then the scale. An accumulating call
  // with no steps leaves dst as it was; an overwriting one writes zero.
  void finish(Lane& lane, int pending) {
    if (pending > 0) flush(lane);
    if (!accumulate) *dst = sum * scale;
  }
};

}  // namespace

void conv_s16_pixel(const PixelKernelArgs& a) {
  for (int ob = 0; ob < a.nob; ++ob) {
    for (int p = 0; p < a.npix; ++p) {
      for (int l = 0; l < 16; ++l) {
        Lane lane;
        float scale = a.scale;
        if (a.pixel_scale) scale = scale * a.pixel_scale[p];
        if (a.lane_scale) scale = scale * a.lane_scale[ob * 16 + l];
        LaneOut out{a.dst + ob * a.dst_ob + p * a.dst_pix + l, scale, a.accumulate};
        int steps = 0;
        for (int ib = 0; ib < a.nib; ++ib) {
          for (int t = 0; t < a.ntaps; ++t) {
            const int16_t* s = a.src + ib * a.src_ib + a.tap_src[t] + p * a.src_pix;
            const int16_t* w = a.wei + ob * a.wei_ob + ib * a.wei_ib + int64_t{a.tap_wei[t]} * 256 + 2 * l;
            for (int j = 0; j < a.pairs; ++j) {
              lane.step(s[2 * j], w[32 * j], s[2 * j + 1], w[32 * j + 1], a.overflow_events);
              if (++steps == a.chain) {
                out.flush(lane);
                steps = 0;
              }
            }
          }
        }
        out.finish(lane, steps);
      }
    }
  }
}

void conv_s16_pixel_calls(const PixelKernelArgs* calls, int count) {
  for (int i = 0; i < count; ++i) conv_s16_pixel(calls[i]);
}

void conv_s16_pair(const PairKernelArgs& a) {
  for (int k = 0; k < a.nk; ++k) {
    for (int l = 0; l < 16; ++l) {
      Lane lane;
      LaneOut out{a.dw + k * a.dw_k + l, a.scale, a.accumulate};
      int steps = 0, chain = a.chain;
      for (int p = 0; p < a.planes; ++p) {
        const int plane_chain = a.plane_chain ? a.plane_chain[p] : a.chain;
        if (plane_chain != kPlaneContinues) {
          if (steps > 0) out.flush(lane);  // the previous plane's last chain
          steps = 0;
          chain = plane_chain;
        }
        for (int r = 0; r < a.rows; ++r) {
          for (int c = 0; c < a.cols; ++c) {
            const int16_t* x = a.x + p * a.x_plane + r * a.x_row + c * a.x_col + 2 * l;
            const int16_t* g = a.dy + p * a.dy_plane + r * a.dy_row + c * a.dy_col + 2 * k;
            lane.step(x[0], g[0], x[1], g[1], a.overflow_events);
            if (++steps == chain) {
              out.flush(lane);
              steps = 0;
            }
          }
        }
      }
      out.finish(lane, steps);
    }
  }
}

void pair_row_l1(const int16_t* pairs, int rows, int cols, int64_t row_stride, int32_t* l1) {
  for (int r = 0; r < rows; ++r) {
    int32_t largest = 0;
    for (int l = 0; l < 16; ++l) {
      int32_t sum = 0;
      for (int c = 0; c < cols; ++c) {
        const int16_t* p = pairs + r * row_stride + c * 32 + 2 * l;
        sum += std::abs(int32_t{p[0]}) + std::abs(int32_t{p[1]});
      }
      largest = std::max(largest, sum);
    }
    l1[r] = largest;
  }
}

// Per lane, prefix sums over chunks of its sequence: one pass over the units, then about
// units / n differences per candidate n, each candidate's open window carried from chunk to chunk
// (a 512-channel 3x3 layer has 512 lanes of 288 units: scanning them once per candidate would
// cost 20 times the work).
void chain_window_max(const ChainWindowArgs& a, int64_t* best) {
  constexpr int kChunk = 1024;  // units per prefix-sum chunk (8 KiB of stack)
  int64_t open_sum[kChainWindowCandidates];  // the open (not yet full) window of each candidate
  int open_len[kChainWindowCandidates];
  int64_t pre[kChunk + 1];
  for (int lane = 0; lane < a.lanes; ++lane) {
    const int32_t* u = a.l1 + lane * a.lane_stride;
    std::fill_n(open_sum, a.nc, 0);
    std::fill_n(open_len, a.nc, 0);
    for (int m0 = 0; m0 < a.units; m0 += kChunk) {
      const int len = std::min(kChunk, a.units - m0);
      pre[0] = 0;
      for (int k = 0; k < len; ++k) pre[k + 1] = pre[k] + u[a.seq[m0 + k]];
      for (int i = 0; i < a.nc; ++i) {
        const int need = a.n[i] - open_len[i];  // >= 1
        if (need > len) {
          open_sum[i] += pre[len];
          open_len[i] += len;
          continue;
        }
        best[i] = std::max(best[i], open_sum[i] + pre[need]);
        int k = need;
        for (; k + a.n[i] <= len; k += a.n[i]) best[i] = std::max(best[i], pre[k + a.n[i]] - pre[k]);
        open_sum[i] = pre[len] - pre[k];
        open_len[i] = len - k;
      }
    }
    for (int i = 0; i < a.nc; ++i) best[i] = std::max(best[i], open_sum[i]);  // the last, partial window
  }
}

void pack_weights(const PackWeightsArgs& a) {
  auto v = [&](int k, int c, int t) { return a.src[k * a.row_stride + int64_t(c) * a.taps + t]; };
  for (int t = 0; t < a.taps; ++t) {
    for (int l = 0; l < 16; ++l) {
      int32_t f_sum = 0, b_sum = 0;
      for (int j = 0; j < 8; ++j) {
        if (a.f) {
          const int16_t f0 = v(l, 2 * j, t), f1 = v(l, 2 * j + 1, t);
          a.f[t * 256 + j * 32 + 2 * l] = f0;
          a.f[t * 256 + j * 32 + 2 * l + 1] = f1;
          const int32_t pair = std::abs(int32_t{f0}) + std::abs(int32_t{f1});
          a.pair_max[0] = std::max(a.pair_max[0], pair);
          f_sum += pair;
        }
        if (a.b) {
          const int16_t b0 = v(2 * j, l, t), b1 = v(2 * j + 1, l, t);
          a.b[t * 256 + j * 32 + 2 * l] = b0;
          a.b[t * 256 + j * 32 + 2 * l + 1] = b1;
          const int32_t pair = std::abs(int32_t{b0}) + std::abs(int32_t{b1});
          a.pair_max[1] = std::max(a.pair_max[1], pair);
          b_sum += pair;
        }
      }
      if (a.f) a.l1_f[l * a.l1_f_stride + t] = f_sum;
      if (a.b) a.l1_b[l * a.l1_b_stride + t] = b_sum;
    }
  }
}

}  // namespace dfp::simd::ref
