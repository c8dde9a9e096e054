// The INT16 convolution's weights: quantized to DFP16, packed into the forward and backward-data
// kernel layouts (wf, wb), and measured for the INT32 chain tables of both pixel-kernel passes.
#include <algorithm>
#include <cmath>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
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
    pack_weights(true, true);
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
// bound their INT32 chains, one (kb, cb, tap) unit per task item: units write disjoint blocks, and
// the maxima do not depend on the order.
void ConvInt16::Impl::pack_weights(bool fwd_layout, bool bwd_layout) {
  std::atomic<int64_t> f_pair_max{0}, b_pair_max{0};
  auto wv = [&](int k, int c, int t) -> int16_t {
    return (k < sh.K && c < sh.C) ? wq[weight_index(k, c, t)] : int16_t{0};
  };
  ctx.parallel_for(int64_t(KB) * CB * T, [&](int64_t u0, int64_t u1) {
    int64_t f_pair = 0, b_pair = 0;
    alignas(64) int16_t v[16][16];  // the unit: v[k lane][c lane], zero past K and C
    for (int64_t u = u0; u < u1; ++u) {
      const int kb = static_cast<int>(u / (int64_t(CB) * T)), cb = static_cast<int>(u / T % CB),
                t = static_cast<int>(u % T);
      // Each weight is read once, for both layouts; a whole unit inside the tensor skips the
      // bounds checks and the index map, which make the loop several times slower
      // (docs/design/kernels.md).
      if (!unfold && kb * 16 + 16 <= sh.K && cb * 16 + 16 <= sh.C) {
        const int16_t* base = wq + (size_t(kb) * 16 * sh.C + size_t(cb) * 16) * T + t;
        for (int l = 0; l < 16; ++l)
          for (int c = 0; c < 16; ++c) v[l][c] = base[(size_t(l) * sh.C + c) * T];
      } else {
        for (int l = 0; l < 16; ++l)
          for (int c = 0; c < 16; ++c) v[l][c] = wv(kb * 16 + l, cb * 16 + c, t);
      }
      int16_t* f = wf.data() + ((size_t(kb) * CB + cb) * T + t) * 256;
      int16_t* b = wb.data() + ((size_t(cb) * KB + kb) * T + t) * 256;
      if (fwd_layout && bwd_layout)
        pack_unit<true, true>(v, f, b, kb, cb, t, f_pair, b_pair);
      else if (fwd_layout)
        pack_unit<true, false>(v, f, b, kb, cb, t, f_pair, b_pair);
      else
        pack_unit<false, true>(v, f, b, kb, cb, t, f_pair, b_pair);
    }
    atomic_max(f_pair_max, f_pair);
    atomic_max(b_pair_max, b_pair);
  });
  // Chain tables. Packing lanes past K (or C) are zero weights: they never lengthen a window.
  if (fwd_layout) measure_chains(fwd, unit_l1_f, f_pair_max.load(), opt.activations.headroom);
  if (bwd_layout) measure_chains(bwd, unit_l1_b, b_pair_max.load(), opt.gradients.headroom);
}

// One unit v[k lane][c lane] into the layouts asked for, with its per-lane L1 norms.
template <bool FWD, bool BWD>
void ConvInt16::Impl::pack_unit(const int16_t (&v)[16][16], int16_t* f, int16_t* b, int kb, int cb, int t,
                                int64_t& f_pair, int64_t& b_pair) {
  for (int l = 0; l < 16; ++l) {
    int32_t fu = 0, bu = 0;
    for (int j = 0; j < 8; ++j) {
      if constexpr (FWD) {
        const int16_t f0 = v[l][2 * j], f1 = v[l][2 * j + 1];  // lane k = l, pair along c
        f[j * 32 + l * 2] = f0;
        f[j * 32 + l * 2 + 1] = f1;
        const int32_t fp = std::abs(int32_t(f0)) + std::abs(int32_t(f1));
        f_pair = std::max<int64_t>(f_pair, fp);
        fu += fp;
      }
      if constexpr (BWD) {
        const int16_t b0 = v[2 * j][l], b1 = v[2 * j + 1][l];  // lane c = l, pair along k
        b[j * 32 + l * 2] = b0;
        b[j * 32 + l * 2 + 1] = b1;
        const int32_t bp = std::abs(int32_t(b0)) + std::abs(int32_t(b1));
        b_pair = std::max<int64_t>(b_pair, bp);
        bu += bp;
      }
    }
    if constexpr (FWD) unit_l1_f[(size_t(kb) * 16 + l) * CB * T + size_t(cb) * T + t] = fu;
    if constexpr (BWD) unit_l1_b[(size_t(cb) * 16 + l) * KB * T + size_t(kb) * T + t] = bu;
  }
}

}  // namespace dfp
