// The chain tables' window maxima (kernel_table.hpp, ChainWindowMaxFn) written once with xsimd,
// instantiated per level in a translation unit compiled for it (simd/avx512/chain_xsimd.cpp,
// simd/avx2/chain_xsimd_avx2.cpp). The reference's algorithm on a batch of lanes at a time: each
// unit of the lanes' sequences is one gather, the prefix sums and window maxima are vector
// operations, and the windows' bounds are the same for every lane. Sums are INT32: exact while
// units * 16 * 32768 < 2^31 (the largest unit L1 is 16 * 32768); longer sequences, and lane
// strides past INT32 offsets, go to the reference.
//
// Internal linkage: the translation units are compiled with different ISA flags (see
// simd/avx512/conv_s16_kernels.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include <xsimd/xsimd.hpp>

#include "simd/kernel_table.hpp"

namespace dfp::simd {
namespace {
template <class Arch>
void chain_window_max_simd(const ChainWindowArgs& a, int64_t* best) {
  using B = xsimd::batch<int32_t, Arch>;
  constexpr int S = int(B::size);
  constexpr int kChunk = 256;  // units per prefix-sum chunk: 257 vectors of stack
  const bool exact = int64_t(a.units) * (16 * 32768) < (int64_t{1} << 31);
  const bool offsets = int64_t(S - 1) * a.lane_stride < (int64_t{1} << 30);
  if (!exact || !offsets || a.nc > kChainWindowCandidates) return ref::chain_window_max(a, best);
  alignas(64) int32_t lane_offset[S];
  for (int l = 0; l < S; ++l) lane_offset[l] = int32_t(l * a.lane_stride);
  const B offset = B::load_aligned(lane_offset);
  B open_sum[kChainWindowCandidates], top[kChainWindowCandidates];
  int open_len[kChainWindowCandidates];
  B pre[kChunk + 1];
  int lane = 0;
  for (; lane + S <= a.lanes; lane += S) {
    const int32_t* u = a.l1 + lane * a.lane_stride;
    for (int i = 0; i < a.nc; ++i) open_sum[i] = top[i] = B(0), open_len[i] = 0;
    for (int m0 = 0; m0 < a.units; m0 += kChunk) {
      const int len = std::min(kChunk, a.units - m0);
      pre[0] = B(0);
      for (int k = 0; k < len; ++k) pre[k + 1] = pre[k] + B::gather(u + a.seq[m0 + k], offset);
      for (int i = 0; i < a.nc; ++i) {
        const int n = a.n[i], need = n - open_len[i];  // >= 1
        if (need > len) {
          open_sum[i] += pre[len];
          open_len[i] += len;
          continue;
        }
        B t = xsimd::max(top[i], open_sum[i] + pre[need]);
        int k = need;
        for (; k + n <= len; k += n) t = xsimd::max(t, pre[k + n] - pre[k]);
        top[i] = t;
        open_sum[i] = pre[len] - pre[k];
        open_len[i] = len - k;
      }
    }
    alignas(64) int32_t lanes[S];
    for (int i = 0; i < a.nc; ++i) {
      xsimd::max(top[i], open_sum[i]).store_aligned(lanes);  // with the last, partial window
      for (int l = 0; l < S; ++l) best[i] = std::max<int64_t>(best[i], lanes[l]);
    }
  }
  if (lane < a.lanes) {  // the last lanes, fewer than a vector's
    ChainWindowArgs rest = a;
    rest.l1 += lane * a.lane_stride;
    rest.lanes = a.lanes - lane;
    ref::chain_window_max(rest, best);
  }
}
}  // namespace
}  // namespace dfp::simd
