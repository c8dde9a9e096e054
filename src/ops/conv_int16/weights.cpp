// The INT16 convolution's weights: quantized to DFP16, packed into the forward and backward-data
// kernel layouts (wf, wb), and measured for the INT32 chain tables of both pixel-kernel passes.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "src/core/atomic_max.hpp"
#include "src/ops/conv_int16/conv_int16_impl.hpp"

namespace dfp {

void ConvInt16::Impl::set_weights(const float* w, float known_max) {
  const size_t n = size_t(sh.K) * sh.C * T;
  ensure_workspace();
  stats.w = quantize_dfp16_with_max_abs(ctx, w, wq, n, known_max, step_w);
  // Pack both layouts and measure the L1 norms that bound the INT32 chains, one (kb, cb, tap)
  // unit per task item: units write disjoint blocks, and the maxima do not depend on the order.
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
      for (int l = 0; l < 16; ++l) {
        int32_t fu = 0, bu = 0;
        for (int j = 0; j < 8; ++j) {
          const int16_t f0 = v[l][2 * j], f1 = v[l][2 * j + 1];  // lane k = l, pair along c
          const int16_t b0 = v[2 * j][l], b1 = v[2 * j + 1][l];  // lane c = l, pair along k
          f[j * 32 + l * 2] = f0;
          f[j * 32 + l * 2 + 1] = f1;
          b[j * 32 + l * 2] = b0;
          b[j * 32 + l * 2 + 1] = b1;
          const int32_t fp = std::abs(int32_t(f0)) + std::abs(int32_t(f1));
          const int32_t bp = std::abs(int32_t(b0)) + std::abs(int32_t(b1));
          f_pair = std::max<int64_t>(f_pair, fp);
          b_pair = std::max<int64_t>(b_pair, bp);
          fu += fp;
          bu += bp;
        }
        unit_l1_f[(size_t(kb) * 16 + l) * CB * T + size_t(cb) * T + t] = fu;
        unit_l1_b[(size_t(cb) * 16 + l) * KB * T + size_t(kb) * T + t] = bu;
      }
    }
    atomic_max(f_pair_max, f_pair);
    atomic_max(b_pair_max, b_pair);
  });
  const int64_t f_pair = f_pair_max.load(), b_pair = b_pair_max.load();
  // Chain tables. Packing lanes past K (or C) are zero weights: they never lengthen a window.
  measure_chains(fwd, unit_l1_f, f_pair, opt.activations.headroom);
  measure_chains(bwd, unit_l1_b, b_pair, opt.gradients.headroom);
  have_w = true;
  if (shared_workspace) have_dy = have_x_fwd = false;  // wq overwrote them
}

}  // namespace dfp
