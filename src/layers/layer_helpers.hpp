// Blocked-layout helpers the layer files of src/layers/ share.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "dfp/context.hpp"
#include "simd/kernel_table.hpp"
#include "src/layers/layer.hpp"

namespace dfp::model {

// Per-step stochastic key of one tensor class of one layer (and of Dropout's mask).
inline uint32_t step_key(uint64_t seed, uint64_t step) { return simd::stochastic_key(step_seed(seed, step)); }

inline int cb_of(const TensorShape& s) { return channel_blocks(s.c); }
inline size_t plane(const TensorShape& s) { return size_t(s.h) * s.w * 16; }  // one channel block of one image

// Parallel over (image, channel block) pairs.
template <class F>
void for_blocks(const Context& ctx, int n, int cb, F&& f) {
  ctx.parallel_for(int64_t(n) * cb, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) f(static_cast<int>(i / cb), static_cast<int>(i % cb));
  });
}

// Zeroes lanes c >= C of the last channel block. Planned buffers are reused, so a layer that writes
// channel by channel must clear the padding lanes itself (every layer's outputs have them zero).
inline void zero_padding_lanes(const Context& ctx, float* t, const TensorShape& s) {
  const int used = s.c % 16;
  if (used == 0) return;
  const int CB = cb_of(s);
  ctx.parallel_for(s.n, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      float* p = t + (size_t(n) * CB + CB - 1) * plane(s);
      for (size_t i = 0; i < size_t(s.h) * s.w; ++i) std::fill(p + i * 16 + used, p + i * 16 + 16, 0.f);
    }
  });
}

// dx = dy where the ReLU mask bit is set, else 0 (dx may be dy).
inline void mask_gradient(const Context& ctx, const uint16_t* mask, const float* dy, float* dx, size_t n) {
  const auto fn = ctx.kernels().relu_bwd.fn;
  for_chunks(ctx, n, [&](size_t b, size_t e) { fn(mask + b / 16, dy + b, dx + b, e - b); });
}
// Channel ranges (Concat, ShortcutPad, GroupedConv2d).
// Lanes l of a 16-channel block whose channel first + l lies in [0, c).
inline uint16_t lane_range(int first, int c) {
  uint16_t m = 0;
  for (int l = 0; l < 16; ++l) m |= uint16_t(first + l >= 0 && first + l < c) << l;
  return m;
}

// Channels [c0, c0 + part.c) of the blocked tensor `whole` <-> a blocked tensor of part.c
// channels. A range that starts inside a channel block reads (writes) the lanes of two blocks of
// the whole tensor for each of its own blocks: gathering is the shift_lanes kernel's two-block
// permute (padding lanes of `part` written zero); scattering writes only the range's lanes.
inline void gather_channels(const Context& ctx, const float* whole, const TensorShape& ws, int c0, float* part,
                     const TensorShape& ps) {
  const int pcb = cb_of(ps), wcb = cb_of(ws);
  const auto shift_lanes = ctx.kernels().shift_lanes.fn;
  for_blocks(ctx, ps.n, pcb, [&](int n, int b) {
    const int first = c0 + b * 16, blk = first / 16;
    auto block = [&](int i) { return i < wcb ? whole + (size_t(n) * wcb + i) * plane(ws) : nullptr; };
    shift_lanes(block(blk), block(blk + 1), first % 16, 1, part + (size_t(n) * pcb + b) * plane(ps), 1,
                size_t(ps.h) * ps.w, lane_range(b * 16, ps.c));
  });
}
inline void scatter_channels(const Context& ctx, const float* part, const TensorShape& ps, float* whole, const TensorShape& ws,
                      int c0, bool accumulate) {
  const int pcb = cb_of(ps), wcb = cb_of(ws);
  const size_t pixels = size_t(ps.h) * ps.w;
  // Tasks write disjoint channels (two tasks may share a block of the whole tensor, not a lane).
  for_blocks(ctx, ps.n, pcb, [&](int n, int b) {
    const float* s = part + (size_t(n) * pcb + b) * plane(ps);
    const int first = c0 + b * 16, lanes = std::min(16, ps.c - b * 16);
    const int off = first % 16, to_first = std::min(lanes, 16 - off);
    float* d0 = whole + (size_t(n) * wcb + first / 16) * plane(ws);
    float* d1 = d0 + plane(ws);
    // Contiguous runs: a whole aligned block at once, else per pixel lanes [0, to_first) into d0
    // and the rest into d1 (the mode chosen outside the loops).
    auto put = [accumulate](float* d, const float* src, size_t count) {
      if (accumulate)
        for (size_t l = 0; l < count; ++l) d[l] += src[l];
      else
        std::memcpy(d, src, count * sizeof(float));
    };
    if (off == 0 && lanes == 16) return put(d0, s, plane(ps));
    for (size_t i = 0; i < pixels; ++i) {
      put(d0 + i * 16 + off, s + i * 16, size_t(to_first));
      if (lanes > to_first) put(d1 + i * 16, s + i * 16 + to_first, size_t(lanes - to_first));
    }
  });
}

}  // namespace dfp::model
