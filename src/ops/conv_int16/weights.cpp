// The INT16 convolution's weights: quantized to DFP16, packed into the forward and backward-data
// kernel layouts (wf, wb), and measured for the INT32 chain tables of both pixel-kernel passes.
#include <algorithm>
#include <cmath>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "src/core/atomic_max.hpp"
#include "src/numerics/dfp16_internal.hpp"
#include "src/ops/conv_int16/conv_int16_impl.hpp"

namespace dfp {

void ConvInt16::Impl::set_weights(const float* w, float known_max) {
  const size_t n = size_t(sh.K) * sh.C * T;
  ensure_workspace();
  if (w_slices) {
    // The forward layout from exponents per output channel (rows of the caller's [K][C][R][S]),
    // then backward-data's, which reduces over K, from one exponent.
    stats.w = detail::quantize_slices(ctx, w, wq, size_t(user.K), n / size_t(user.K), step_w, w_out_exp.data());
    for (int k = 0; k < sh.K; ++k) w_out_scale[size_t(k)] = std::ldexp(1.f, w_out_exp[size_t(k)]);
    pack_weights(true, false);
    if (opt.input_gradient) {
      quantize_w_in_channels(w);
      pack_weights(false, true);
    }
  } else {
    stats.w = w_bwd = quantize_dfp16_with_max_abs(ctx, w, wq, n, known_max, step_w);
    pack_weights(true, opt.input_gradient);
  }
  have_w = true;
  if (shared_workspace) have_dy = have_x_fwd = false;  // wq overwrote them
}

// Granularity::slice: w into wq with an exponent per input channel (over every k and tap of the
// caller's [K][C][R][S]), for backward-data, whose lanes are the input channels.
void ConvInt16::Impl::quantize_w_in_channels(const float* w) {
  const auto& kt = ctx.kernels();
  const int C = user.C;
  const size_t taps = size_t(user.R) * user.S;
  // max|w| over finite weights per input channel (the max_abs kernel's result), in one pass in
  // memory order: a kernel call per (k, c) run of R * S weights costs more than its work.
  std::fill(w_in_max.begin(), w_in_max.begin() + C, 0.f);
  for (int k = 0; k < user.K; ++k)
    for (int c = 0; c < C; ++c) {
      const float* run = w + (size_t(k) * C + c) * taps;
      float m = w_in_max[size_t(c)];
      for (size_t t = 0; t < taps; ++t) {
        const float a = std::fabs(run[t]);
        m = a > m && std::isfinite(a) ? a : m;  // non-finite weights: counted by the quantizer
      }
      w_in_max[size_t(c)] = m;
    }
  int hi = std::numeric_limits<int>::min(), lo = std::numeric_limits<int>::max();
  float all = 0.f;
  std::vector<int>& e = w_in_exp;
  for (int c = 0; c < C; ++c) {
    const int x = dfp16_exponent(w_in_max[size_t(c)], step_w.headroom);
    w_user_exp[size_t(c)] = x;
    hi = std::max(hi, x);
    if (w_in_max[size_t(c)] > 0.f) lo = std::min(lo, x);
    all = std::max(all, w_in_max[size_t(c)]);
  }
  // Kernel lane c' reads user channel c' % C where the columns unfold into the channels.
  for (int c = 0; c < sh.C; ++c) {
    e[size_t(c)] = w_user_exp[size_t(unfold ? c % C : c)];
    w_in_scale[size_t(c)] = std::ldexp(1.f, e[size_t(c)]);
  }
  std::atomic<uint64_t> saturated{0}, bad{0};
  std::atomic<int32_t> max_q{0};
  ctx.parallel_for(user.K, [&](int64_t k0, int64_t k1) {
    simd::QuantCounters cnt;
    // Neighbouring channels with one exponent go in one call (the same elements and indices).
    for (int64_t k = k0; k < k1; ++k)
      for (int c = 0, c1; c < C; c = c1) {
        const int e = w_user_exp[size_t(c)];
        for (c1 = c + 1; c1 < C && w_user_exp[size_t(c1)] == e;) ++c1;
        const size_t off = (size_t(k) * C + c) * taps;
        kt.quantize.fn(w + off, wq + off, size_t(c1 - c) * taps, e, step_w.rounding, step_w.seed, off, &cnt);
      }
    atomic_add_nonzero(saturated, cnt.saturated);
    atomic_add_nonzero(bad, cnt.nonfinite);
    atomic_max(max_q, cnt.max_abs_q);
  });
  w_bwd = QuantStats{};
  w_bwd.exponent = C ? hi : 0;
  w_bwd.exponent_min = lo == std::numeric_limits<int>::max() ? w_bwd.exponent : lo;
  w_bwd.saturated = saturated.load();
  w_bwd.nonfinite = bad.load();
  w_bwd.max_abs_int = max_q.load();
  w_bwd.max_abs = all;
}

// Packs wq into the forward (fwd) and backward-data (bwd) layouts and measures the L1 norms that
// bound their INT32 chains, a (kb, cb) block of every tap per task item (the pack_weights kernel):
// blocks write disjoint units, and the maxima do not depend on the order.
void ConvInt16::Impl::pack_weights(bool fwd_layout, bool bwd_layout) {
  std::atomic<int64_t> f_pair_max{0}, b_pair_max{0};
  const auto& kt = ctx.kernels();
  ctx.parallel_for(int64_t(KB) * CB, [&](int64_t u0, int64_t u1) {
    int32_t pair_max[2] = {0, 0};
    alignas(64) int16_t v[16][16];  // an edge unit: v[k lane][c lane], zero past K and C
    for (int64_t u = u0; u < u1; ++u) {
      const int kb = static_cast<int>(u / CB), cb = static_cast<int>(u % CB);
      simd::PackWeightsArgs a{};
      a.f = fwd_layout ? wf.data() + (size_t(kb) * CB + cb) * T * 256 : nullptr;
      a.b = bwd_layout ? wb_pack + (size_t(cb) * KB + kb) * T * 256 : nullptr;
      a.l1_f = unit_l1_f + size_t(kb) * 16 * CB * T + size_t(cb) * T;
      a.l1_f_stride = int64_t(CB) * T;
      a.l1_b = unit_l1_b + size_t(cb) * 16 * KB * T + size_t(kb) * T;
      a.l1_b_stride = int64_t(KB) * T;
      a.pair_max = pair_max;
      if (!unfold && kb * 16 + 16 <= sh.K && cb * 16 + 16 <= sh.C) {
        // A whole block inside the tensor: its rows are runs of the [K][C][taps] weights.
        a.src = wq + (size_t(kb) * 16 * sh.C + size_t(cb) * 16) * T;
        a.row_stride = int64_t(sh.C) * T;
        a.taps = T;
        kt.pack_weights.fn(a);
        continue;
      }
      // Past K or C, or columns unfolded into the channels: each tap's unit through the index
      // map, zero outside the tensor.
      simd::PackWeightsArgs e = a;
      e.src = &v[0][0];
      e.row_stride = 16;
      e.taps = 1;
      for (int t = 0; t < T; ++t) {
        for (int l = 0; l < 16; ++l)
          for (int c = 0; c < 16; ++c) {
            const int k = kb * 16 + l, ch = cb * 16 + c;
            v[l][c] = k < sh.K && ch < sh.C ? wq[weight_index(k, ch, t)] : int16_t{0};
          }
        e.f = a.f ? a.f + size_t(t) * 256 : nullptr;
        e.b = a.b ? a.b + size_t(t) * 256 : nullptr;
        e.l1_f = a.l1_f + t;
        e.l1_b = a.l1_b + t;
        kt.pack_weights.fn(e);
      }
    }
    atomic_max(f_pair_max, int64_t{pair_max[0]});
    atomic_max(b_pair_max, int64_t{pair_max[1]});
  });
  // Chain tables. Packing lanes past K (or C) are zero weights: they never lengthen a window.
  if (fwd_layout) measure_chains(fwd, unit_l1_f, f_pair_max.load(), opt.activations.headroom);
  if (bwd_layout) measure_chains(bwd, unit_l1_b, b_pair_max.load(), opt.gradients.headroom);
}

// wb from wf where both hold one exponent's values (wb_transposed()): per tap, the forward unit
// (kb, cb) has W[k][c] at (c / 2) * 32 + 2k + c % 2 (k, c in the block), and the backward-data unit
// (cb, kb) has it at (k / 2) * 32 + 2c + k % 2: the layouts pack_weights writes from the same
// block, so the copy has its bits. In groups of four values (64 bits), with k = 2j + p and
// c = 2m + q: b's group (j, m) holds [2q + p] what f's group (m, j) holds at [2p + q], an 8x8
// transpose of groups with each group's two middle values swapped.
void ConvInt16::Impl::transpose_wf_to_wb() {
  ctx.parallel_for(int64_t(KB) * CB, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int kb = static_cast<int>(u / CB), cb = static_cast<int>(u % CB);
      const int16_t* f = wf.data() + (size_t(kb) * CB + cb) * T * 256;
      int16_t* b = wbt + (size_t(cb) * KB + kb) * T * 256;
      for (int t = 0; t < T; ++t, f += 256, b += 256)
        for (int j = 0; j < 8; ++j)
          for (int m = 0; m < 8; ++m) {
            uint64_t g;
            std::memcpy(&g, f + m * 32 + j * 4, 8);
            g = (g & 0xFFFF00000000FFFFull) | ((g >> 16) & 0x00000000FFFF0000ull) | ((g << 16) & 0x0000FFFF00000000ull);
            std::memcpy(b + j * 32 + m * 4, &g, 8);
          }
    }
  });
}

}  // namespace dfp
