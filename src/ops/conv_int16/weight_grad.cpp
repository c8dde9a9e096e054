// The INT16 convolution's weight gradient: the pair kernel reduces x and dy batch pairs over output
// positions, in tiles with dy interleaved (or read in place) and fetched ahead, into FP32 partials
// per output block or per fixed slice of the batch, summed in a fixed order into dW.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <xmmintrin.h>  // _mm_prefetch (baseline SSE)

#include "src/ops/conv_int16/conv_int16_impl.hpp"

namespace dfp {

namespace {

int pair_chain(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return kMaxChain;
  return static_cast<int>(std::min<int64_t>(kInt32Max / (2 * a * b), kMaxChain));
}

// The most rows m such that every run of m consecutive rows of l1[0, n) sums to at most limit
// (0 where one row alone exceeds it; n where all of them fit). In O(n): ext(r), the longest
// run from row r within the limit, comes from two pointers (l1 >= 0), and m holds where
// ext(r) >= m for every r <= n - m, which is checked from m = n down as r's range grows.
int rows_within(const int32_t* l1, int n, int64_t limit) {
  int ext[kPairTile];
  int64_t sum = 0;
  for (int r = 0, j = 0; r < n; ++r) {
    if (j < r) j = r, sum = 0;
    while (j < n && sum + l1[j] <= limit) sum += l1[j++];
    ext[r] = j - r;
    if (j > r) sum -= l1[r];
  }
  int least = ext[0];  // min of ext(r) over r <= n - m
  for (int m = n; m >= 1; --m) {
    least = std::min(least, ext[n - m]);
    if (least >= m) return m;
  }
  return 0;
}

// Cache lines to fetch into L2 ahead of use, a few at a time: up to kRuns contiguous byte runs
// (images x blocks x rows). Narrow layers have more rows per tile than fit; their later rows
// are not fetched ahead, and those layers' dy is small enough to sit in cache anyway.
class DyPrefetch {
 public:
  static constexpr int kRuns = 64;
  void reset() { n_ = run_ = 0; off_ = 0; total_ = 0; }
  void add(const void* p, size_t bytes) {
    if (n_ == kRuns) return;
    // From the line holding the first byte to the line holding the last one.
    const char* first = static_cast<const char*>(p);
    const size_t skew = reinterpret_cast<uintptr_t>(first) % 64;
    runs_[n_++] = {first - skew, bytes + skew};
    total_ += (bytes + skew + 63) / 64;
  }
  size_t lines() const { return total_; }
  void issue(size_t count) {
    for (; count > 0 && run_ < n_; --count) {
      _mm_prefetch(runs_[run_].p + off_, _MM_HINT_T1);
      if ((off_ += 64) >= runs_[run_].bytes) { ++run_; off_ = 0; }
    }
  }

 private:
  struct Run { const char* p; size_t bytes; };
  Run runs_[kRuns];
  int n_ = 0, run_ = 0;
  size_t off_ = 0, total_ = 0;
};

}  // namespace

void ConvInt16::Impl::backward_weights(float* dw) {
  require(have_x, "backward_weights", "quantize_input()");
  require(have_dy, "backward_weights", "quantize_grad_output()");
  if (!have_xr) recompute_x_pairs();
  const int chain = opt.chain_override ? opt.chain_override : pair_chain(x_pairs.max_abs_int, dy_pairs.max_abs_int);
  stats.chain_wgrad = chain;
  const float scale = pow2(x_pairs.exponent + dy_pairs.exponent, name, "backward_weights");
  // Granularity::slice: the sums of image pair p, block pair (kb, cb) are in units of
  // 2^(e_x(p, cb) + e_dy(p, kb)). A call reads one image pair and one block of each, so it
  // flushes with that scale, into partials that hold dW's values. A fully connected layer's
  // call reduces over all pairs, which share their blocks' exponents (wgrad_pairs() false): its
  // partial sums are in one block pair's units, and the scale applies where they are summed
  // into dW (or, in place, in the call).
  const bool block_scales = x_slices || dy_slices;
  auto x_exp = [&](int p, int cb) { return x_slices ? x_blk.exp[size_t(p) * CB + cb] : x_pairs.exponent; };
  auto dy_exp = [&](int p, int kb) { return dy_slices ? dy_blk.exp[size_t(p) * KB + kb] : dy_pairs.exponent; };
  const bool call_scales = block_scales && wgrad_pairs();
  if (call_scales) {
    // A pair's calls' scales are normal powers of two when its extreme sums are.
    for (int p = 0; p < NP; ++p) {
      int x_lo = x_exp(p, 0), x_hi = x_lo, dy_lo = dy_exp(p, 0), dy_hi = dy_lo;
      for (int cb = 1; cb < CB; ++cb) x_lo = std::min(x_lo, x_exp(p, cb)), x_hi = std::max(x_hi, x_exp(p, cb));
      for (int kb = 1; kb < KB; ++kb) dy_lo = std::min(dy_lo, dy_exp(p, kb)), dy_hi = std::max(dy_hi, dy_exp(p, kb));
      pow2(x_lo + dy_lo, name, "backward_weights");
      pow2(x_hi + dy_hi, name, "backward_weights");
    }
  } else if (block_scales) {
    for (int kb = 0; kb < KB; ++kb)
      for (int cb = 0; cb < CB; ++cb)
        wgrad_scale[size_t(kb) * CB + cb] = pow2(x_exp(0, cb) + dy_exp(0, kb), name, "backward_weights");
  }
  auto call_scale = [&](int p, int cb, int kb) { return call_scales ? exp2i(x_exp(p, cb) + dy_exp(p, kb)) : 1.f; };
  auto scale_of = [&](int64_t k, int c) {
    return call_scales ? 1.f : block_scales ? wgrad_scale[size_t(k / 16) * CB + size_t(c / 16)] : scale;
  };
  const auto fn = pair_fn();
  const int ns = wgrad_partials();
  const int64_t dw_k = dw_row();
  const bool lanes_k = wgrad_lanes_k();
  const size_t part = size_t(dw_rows()) * dw_k;  // [K16][T][C16] (lanes_k: [C16][T][K16]), rows padded
  // Tiles of positions per call: enough to amortise the flush; their dy pairs fit a stack tile.
  const int chunk_cols = std::min(OW, kPairTile);
  const int chunk_rows = std::max(1, std::min(OH, kPairTile / chunk_cols));
  const auto inter = ctx.kernels().interleave.fn;
  const auto row_l1 = ctx.kernels().pair_row_l1.fn;
  // A fully connected layer with whole channel blocks whose tasks own whole dW rows writes dW
  // [K][C] in place: no partials to zero, and none to copy (for a large layer those are most of
  // the pass; docs/design/kernels.md).
  const bool direct = gemm && by_output_block() && sh.C % 16 == 0;
  simd::PairKernelArgs base{};
  base.dw_k = direct ? sh.C : dw_k;
  base.nk = 16;
  base.x_row = int64_t(x_row_step) * xp_row_stride;
  base.x_col = int64_t(x_col_step) * xp_col_stride;
  base.dy_col = 32;
  base.chain = chain;
  // Partials are sums in units of the scale, which sum_into_dw applies: a flush into them is
  // then an add (scale 1), which leaves VPDPWSSD's pipes free, where an FMA would take them. The
  // same bits: every partial is an integer, and scaling by a power of two commutes with
  // rounding in the normal range (multiples of scale >= 2^-126). The direct (in-place) calls
  // scale themselves, and so do Granularity::slice's calls of one image pair (an FMA each flush:
  // their pairs' units differ).
  base.scale = direct ? scale : 1.f;
  // wgrad_planes(): the calls of kWgradPlanes image pairs at a time as one call over planes, dy
  // read in place from dyp with its stored row norms. The same calls as the loop in `reduce`
  // below, and in the same order for every dW value (pairs ascending), with the same chains:
  // per pair, from that pair's bounds.
  const bool planes = wgrad_planes(), across_pairs = wgrad_across_pairs();
  // The largest |q| over image pairs [p0, p1) of rows [r0, r1) (clipped to the image) of x's
  // input block cb, or of dy's output block kb: a call's chain bound (pair_chain's holds for any
  // bounds on |x| and |dy|).
  auto x_max = [&](int p0, int p1, int cb, int r0, int r1) {
    int32_t m = 0;
    for (int n = 2 * p0; n < std::min(sh.N, 2 * p1); ++n)
      m = std::max(m, span_max(x_row_max.data() + (size_t(n) * CB + cb) * sh.H, r0, r1, sh.H));
    return m;
  };
  auto dy_max = [&](int p0, int p1, int kb, int r0, int r1) {
    int32_t m = 0;
    for (int n = 2 * p0; n < std::min(sh.N, 2 * p1); ++n)
      m = std::max(m, span_max(dy_row_max.data() + (size_t(n) * KB + kb) * OH, r0, r1, OH));
    return m;
  };
  // Tap t's output positions in [oh0, oh1) x [ow0, ow1) that read inside the image (the rest read
  // padding: zero products): a.rows, a.cols and (lo_r, lo_c), the first; a.x at them in image pair
  // p, block cb. False where there are none.
  auto at_tap = [&](simd::PairKernelArgs& a, int t, int p, int cb, int oh0, int oh1, int ow0, int ow1, int& lo_r,
                    int& lo_c) {
    const int r = t / sh.S, s2 = t % sh.S;
    lo_r = std::max(oh0, tap_rows[r].first);
    lo_c = std::max(ow0, tap_cols[s2].first);
    const int hi_r = std::min(oh1, tap_rows[r].second), hi_c = std::min(ow1, tap_cols[s2].second);
    if (lo_r >= hi_r || lo_c >= hi_c) return false;
    a.rows = hi_r - lo_r;
    a.cols = hi_c - lo_c;
    a.x = x_pairs_at(p, cb, int64_t(lo_r) * x_row_step + r - sh.pad_h, int64_t(lo_c) * x_col_step + s2 - sh.pad_w);
    return true;
  };
  // The kernel on a (x, dy, chain and scale set) into dW block (kb, cb) of tap t in acc; with lanes
  // over K (lanes_k), dy's channels take the lanes and x's channel pairs are broadcast.
  auto call = [&](simd::PairKernelArgs& a, float* acc, int t, int cb, int kb) {
    if (!lanes_k) {
      a.dw = acc + size_t(kb) * 16 * dw_k + size_t(t) * CB * 16 + size_t(cb) * 16;
      fn(a);
      return;
    }
    simd::PairKernelArgs b = a;
    b.x = a.dy;
    b.x_row = a.dy_row;
    b.x_col = a.dy_col;
    b.x_plane = a.dy_plane;
    b.dy = a.x;
    b.dy_row = a.x_row;
    b.dy_col = a.x_col;
    b.dy_plane = a.x_plane;
    b.nk = std::min(16, sh.C - cb * 16);
    b.dw = acc + size_t(cb) * 16 * dw_k + size_t(t) * KB * 16 + size_t(kb) * 16;
    fn(b);
  };
  // A plane that one chain covers continues the chain of the plane before it (kPlaneContinues)
  // where their sums together stay within INT32, so a 4x4 layer's pairs flush once per few pairs
  // rather than once per pair (VGG-11-BN's 4x4 weight gradients 10-13% faster, ResNet-18c's
  // 5-9%; docs/measurements.md, session 48). A plane's sum in any lane is at most its x bound
  // times the L1 norm, over the dy rows it reads, of its largest dy lane (both images; dyp's
  // stored row norms), and at most its x bound times its dy bound times two per position.
  auto join_planes = [&](int* plane_chain, int np, int q0, int kb, int i, int lo_r, int rows, int cols,
                         const int32_t* x_bound, const int32_t (*dy_bound)[kWgradKbGroup]) {
    const int64_t positions = int64_t(rows) * cols;
    int64_t open = -1;  // the bound of the sums of the chain that the last plane ended with; -1: none
    for (int q = 0; q < np; ++q) {
      if (plane_chain[q] < positions) {  // flushes within the plane: its chain ends it
        open = -1;
        continue;
      }
      const int64_t* prefix = dyp_row_l1_prefix.data() + (size_t(q0 + q) * KB + kb) * (OH + 1);
      const int64_t l1 = prefix[lo_r + rows] - prefix[lo_r];
      const int64_t bound =
          std::min(int64_t{x_bound[q]} * l1, 2 * int64_t{x_bound[q]} * dy_bound[q][i] * positions);
      if (open >= 0 && open + bound <= kInt32Max) {
        plane_chain[q] = simd::kPlaneContinues;
        open += bound;
      } else {
        open = bound;
      }
    }
  };
  if (planes && !across_pairs) {  // dyp_pair_max for the chains, dyp_row_l1_prefix for join_planes
    for (int p = 0; p < NP; ++p)
      for (int kb = 0; kb < KB; ++kb) dyp_pair_max[size_t(p) * KB + kb] = dy_max(p, p + 1, kb, 0, OH);
    if (!opt.chain_override)
      for (size_t pk = 0; pk < size_t(NP) * KB; ++pk) {
        const int32_t* row_l1 = dyp_row_l1.data() + pk * OH;
        int64_t* prefix = dyp_row_l1_prefix.data() + pk * (OH + 1);
        prefix[0] = 0;
        for (int oh = 0; oh < OH; ++oh) prefix[oh + 1] = prefix[oh] + row_l1[oh];
      }
  }
  auto reduce_planes = [&](simd::PairKernelArgs& a, float* acc, int p0, int p1, int kb0, int kb1) {
    int plane_chain[kWgradPlanes];
    int32_t x_bound[kWgradPlanes], dy_bound[kWgradPlanes][kWgradKbGroup];
    int chains[kWgradPlanes][kWgradKbGroup], l1_rows[kWgradPlanes][kWgradKbGroup];
    const int ih0 = -sh.pad_h, ih1 = (OH - 1) * sh.stride_h - sh.pad_h + sh.R;
    a.dy_row = int64_t(OW) * 32;
    a.x_plane = xp_pair_stride;
    a.dy_plane = int64_t(KB) * OH * OW * 32;
    a.plane_chain = plane_chain;
    // Input block, then pairs: each dW block's partials take every pair's calls while they are
    // in L1 (kWgradKbGroup blocks of every tap: 18 KiB for 3x3), where with the pairs outermost
    // each group of kWgradPlanes pairs read and wrote all of the task's partials again (590 KiB
    // for a 512-channel 3x3 layer: ResNet-18c's 4x4 one ran 1.2x slower, docs/design/kernels.md).
    // Each dW value sees the same calls in the same order, so the same bits.
    for (int kg = kb0; kg < kb1; kg += kWgradKbGroup) {
      const int kg1 = std::min(kb1, kg + kWgradKbGroup);
      for (int cb = 0; cb < CB; ++cb) {
        for (int q0 = p0; q0 < p1; q0 += kWgradPlanes) {
          const int np = std::min(p1 - q0, kWgradPlanes);
          a.planes = np;
          for (int q = 0; q < np; ++q) {
            const int p = q0 + q;
            x_bound[q] = x_max(p, p + 1, cb, ih0, ih1);
            for (int kb = kg; kb < kg1; ++kb) {
              const int i = kb - kg;
              dy_bound[q][i] = dyp_pair_max[size_t(p) * KB + kb];
              chains[q][i] = opt.chain_override ? chain : std::max(chain, pair_chain(x_bound[q], dy_bound[q][i]));
              l1_rows[q][i] = opt.chain_override || chains[q][i] >= OH * OW
                                  ? 0
                                  : rows_within(dyp_row_l1.data() + (size_t(p) * KB + kb) * OH, OH, kInt32Max / x_bound[q]);
            }
          }
          // The x planes of the block that runs next (the next pairs of this input block, else the
          // first pairs of the next one) are fetched into L2 while these calls compute: each call a
          // contiguous share of one plane, the planes shared out over the calls in order; where
          // there are fewer calls than planes (1x1 layers: one tap, two output blocks), each call
          // a share of every plane, plane q's while it computes its own plane q (a call fetches
          // at most a line per position, so one plane each would leave the others unfetched).
          int next_q0 = q0 + kWgradPlanes, next_cb = cb;
          if (next_q0 >= p1) next_q0 = p0, ++next_cb;
          const int next_np = next_cb < CB && !x_compact ? std::min(p1 - next_q0, kWgradPlanes) : 0;
          const int ncalls = T * (kg1 - kg);
          const size_t plane_bytes = size_t(xp_block_stride) * sizeof(int16_t);
          const bool per_plane = next_np == np && ncalls < np;
          a.prefetch_plane = per_plane ? int64_t(xp_pair_stride) * int64_t(sizeof(int16_t)) : 0;
          const size_t plane_part = (plane_bytes / size_t(ncalls) + 63) / 64 * 64;  // per_plane: each call's
          // Plane q goes to calls [first[q], first[q + 1]) in shares of share[q] bytes (none where
          // there are fewer calls than planes); the calls run in order, so each finds its plane by
          // stepping q (no division per call).
          int first[kWgradPlanes + 1];
          size_t share[kWgradPlanes];
          if (next_np > 0 && !per_plane) {
            for (int q = 0; q <= next_np; ++q) first[q] = int((int64_t(q) * ncalls + next_np - 1) / next_np);
            for (int q = 0; q < next_np; ++q)
              share[q] = (plane_bytes / size_t(std::max(1, first[q + 1] - first[q])) + 63) / 64 * 64;
          }
          int pq = 0;
          auto plane_share = [&](int c, const char*& from, const char*& to) {
            from = to = nullptr;
            if (next_np == 0) return;
            if (per_plane) {  // plane 0's part; plane q's is prefetch_plane * q further
              const char* plane = reinterpret_cast<const char*>(x_pairs_at(next_q0, next_cb, 0, 0));
              from = plane + size_t(c) * plane_part;
              to = std::min(plane + plane_bytes, from + plane_part);
              return;
            }
            while (pq + 1 < next_np && c >= first[pq + 1]) ++pq;  // past the planes that have no call
            const char* plane = reinterpret_cast<const char*>(x_pairs_at(next_q0 + pq, next_cb, 0, 0));
            from = plane + size_t(c - first[pq]) * share[pq];
            to = std::min(plane + plane_bytes, from + share[pq]);
          };
          for (int t = 0; t < T; ++t) {
            int lo_r, lo_c;
            if (!at_tap(a, t, q0, cb, 0, OH, 0, OW, lo_r, lo_c)) continue;
            for (int kb = kg; kb < kg1; ++kb) {
              const int i = kb - kg;
              plane_share(t * (kg1 - kg) + i, a.prefetch, a.prefetch_end);
              for (int q = 0; q < np; ++q) {  // as call_chain in `reduce`
                const int m = l1_rows[q][i];
                plane_chain[q] = m >= a.rows ? kMaxChain : std::max(chains[q][i], m * a.cols);
              }
              if (!opt.chain_override) join_planes(plane_chain, np, q0, kb, i, lo_r, a.rows, a.cols, x_bound, dy_bound);
              a.dy = dyp_at(q0, kb, lo_r, lo_c);
              call(a, acc, t, cb, kb);
            }
          }
        }
      }
    }
    a.planes = 1;  // plane_chain is this call's
    a.plane_chain = nullptr;
    a.prefetch = a.prefetch_end = nullptr;
    a.prefetch_plane = 0;
  };
  // wgrad_across_pairs(): across_pairs_chunk() pairs of [p0, p1) as one call's columns, its
  // rows the tap's output columns, so that the two accumulator sets alternate over pairs. In xp
  // and dyp consecutive pairs lie a whole plane apart (8 KiB for a 512-channel 2x2 layer: every
  // pair's line in one L1 set), so each chunk's pairs are first copied next to each other: x of
  // one input block, dy of the group's output blocks.
  auto reduce_across_pairs = [&](simd::PairKernelArgs& a, float* acc, int p0, int p1, int kb0, int kb1) {
    DFP_CHECK(!x_compact, Status::internal, "convolution '" + name + "': pairs innermost on a compact x copy");
    const int ih0 = -sh.pad_h, ih1 = (OH - 1) * sh.stride_h - sh.pad_h + sh.R;
    const size_t x_pair = size_t(xp_block_stride), dy_pair = size_t(OH) * OW * 32;  // one plane of one block
    const int chunk = across_pairs_chunk();
    alignas(64) int16_t tiles[kAcrossPairsTileBytes / sizeof(int16_t)];
    int16_t* const xt = tiles;
    auto dyt = [&](int i) { return tiles + (size_t(chunk) * (x_pair + i * dy_pair)); };
    a.x_col = int64_t(x_pair);
    a.dy_col = int64_t(dy_pair);
    a.x_row = int64_t(x_col_step) * 32;
    a.dy_row = 32;
    int32_t dy_bound[kWgradKbGroup];
    for (int c0 = p0; c0 < p1; c0 += chunk) {
      const int c1 = std::min(p1, c0 + chunk);
      for (int kg = kb0; kg < kb1; kg += kWgradKbGroup) {
        const int kg1 = std::min(kb1, kg + kWgradKbGroup);
        for (int kb = kg; kb < kg1; ++kb) {
          for (int p = c0; p < c1; ++p)
            std::memcpy(dyt(kb - kg) + (p - c0) * dy_pair, dyp_at(p, kb, 0, 0), dy_pair * sizeof(int16_t));
          dy_bound[kb - kg] = dy_max(c0, c1, kb, 0, OH);
        }
        for (int cb = 0; cb < CB; ++cb) {
          const int16_t* x_cb = x_pairs_at(c0, cb, 0, 0);
          for (int p = c0; p < c1; ++p)
            std::memcpy(xt + (p - c0) * x_pair, x_pairs_at(p, cb, 0, 0), x_pair * sizeof(int16_t));
          const int32_t x_bound = x_max(c0, c1, cb, ih0, ih1);
          for (int t = 0; t < T; ++t)
            for (int oh = 0; oh < OH; ++oh) {
              int lo_r, lo_c;
              if (!at_tap(a, t, c0, cb, oh, oh + 1, 0, OW, lo_r, lo_c)) continue;
              a.x = xt + (a.x - x_cb);
              a.rows = a.cols;  // at_tap's columns of the row: the call's rows
              a.cols = c1 - c0;
              for (int kb = kg; kb < kg1; ++kb) {
                a.chain = opt.chain_override ? chain : std::max(chain, pair_chain(x_bound, dy_bound[kb - kg]));
                a.dy = dyt(kb - kg) + (size_t(oh) * OW + lo_c) * 32;
                call(a, acc, t, cb, kb);
              }
            }
        }
      }
    }
  };
  // All reduction work for image pairs [p0, p1) and output blocks [kb0, kb1), into acc.
  auto reduce = [&](simd::PairKernelArgs& a, float* acc, int p0, int p1, int kb0, int kb1) {
    if (gemm) {  // fully connected: positions are the image pairs, one call per dW block
      simd::PairKernelArgs g = a;
      g.rows = p1 - p0;
      g.cols = 1;
      g.x_row = int64_t(CB) * 32;
      g.dy_row = int64_t(KB) * 32;
      g.x_col = g.dy_col = 0;
      g.accumulate = false;  // the block's only call: acc is not zeroed
      for (int kb = kb0; kb < kb1; ++kb)
        for (int cb = 0; cb < CB; ++cb) {
          g.nk = std::min(16, sh.K - kb * 16);
          g.x = x_pairs_data() + (size_t(p0) * CB + cb) * 32;
          g.dy = dyp_at(p0, kb, 0, 0);
          g.dw = acc + size_t(kb) * 16 * g.dw_k + size_t(cb) * 16;
          if (direct && block_scales) g.scale = wgrad_scale[size_t(kb) * CB + cb];
          fn(g);
        }
      return;
    }
    // dy pairs of one tile of positions for up to kWgradKbGroup output blocks. The output blocks
    // are the innermost loop, so each x tile (one cb and tap, in L1) serves all of them: with kb
    // outermost, 1x1 layers with many channels re-streamed x from memory once per kb.
    alignas(64) int16_t tile[kWgradKbGroup][kPairTile * 32 + 32];
    // Row oh, columns from ow0, of output block kb of image n in dyq.
    auto dy_row = [&](int n, int kb, int oh, int ow0) {
      return dyq + (((size_t(n) * KB + kb) * OHb + oh + pt) * OWb + ow0 + pl) * 16;
    };
    // The work runs in steps: image pair p, the tile of output positions at (oh0, ow0), and the
    // group of output blocks from kg, kg fastest. next() advances a step and says whether one
    // follows, so the prefetch below targets exactly the step that runs next.
    struct Step {
      int p, oh0, ow0, kg;
    };
    auto next = [&](Step& st) {
      if ((st.kg += kWgradKbGroup) < kb1) return true;
      st.kg = kb0;
      if ((st.ow0 += chunk_cols) < OW) return true;
      st.ow0 = 0;
      if ((st.oh0 += chunk_rows) < OH) return true;
      st.oh0 = 0;
      return ++st.p < p1;
    };
    // Where dy is larger than kDyPrefetchMinBytes, the dy rows of the next step are fetched into
    // L2 while this one computes, a share before each kernel call: interleaving them straight
    // from memory stalls on the whole tile (docs/design/kernels.md). Otherwise `ahead` stays
    // empty.
    DyPrefetch ahead;
    const bool prefetch_dy = (dy_whole_pairs ? dyp_bytes : dyq_bytes) > kDyPrefetchMinBytes;
    auto plan_ahead = [&](Step st) {
      ahead.reset();
      if (!prefetch_dy || !next(st)) return;
      const int oh1 = std::min(OH, st.oh0 + chunk_rows), ow1 = std::min(OW, st.ow0 + chunk_cols);
      for (int kb = st.kg; kb < std::min(kb1, st.kg + kWgradKbGroup); ++kb)
        for (int oh = st.oh0; oh < oh1; ++oh) {
          if (dy_whole_pairs) {  // the kernel reads dyp's rows in place: fetch those
            ahead.add(dyp_at(st.p, kb, oh, st.ow0), size_t(ow1 - st.ow0) * 64);
            continue;
          }
          for (int n = 2 * st.p; n < std::min(sh.N, 2 * st.p + 2); ++n)
            ahead.add(dy_row(n, kb, oh, st.ow0), size_t(ow1 - st.ow0) * 32);
        }
    };
    if (p0 >= p1) return;  // an empty slice (fewer image pairs than slices)
    if (across_pairs) return reduce_across_pairs(a, acc, p0, p1, kb0, kb1);
    if (planes) return reduce_planes(a, acc, p0, p1, kb0, kb1);
    Step step{p0, 0, 0, kb0};
    do {
      const int p = step.p, oh0 = step.oh0, ow0 = step.ow0, kg = step.kg;
      const int oh1 = std::min(OH, oh0 + chunk_rows), ow1 = std::min(OW, ow0 + chunk_cols);
      const int cols = ow1 - ow0;
      const int kg1 = std::min(kb1, kg + kWgradKbGroup);
      a.dy_row = int64_t(dy_whole_pairs ? OW : cols) * 32;
      // dy pairs of output block kb at (oh, ow) of this step: in place in dyp, or in its tile.
      auto dy_at = [&](int kb, int oh, int ow) -> const int16_t* {
        return dy_whole_pairs ? dyp_at(p, kb, oh, ow) : tile[kb - kg] + (size_t(oh - oh0) * cols + (ow - ow0)) * 32;
      };
      // Images 2p and 2p+1 (absent for odd N: zeros), interleaved once for all cb and taps
      // (unless quantization wrote them so, whole, into dyp).
      if (!dy_whole_pairs)
        for (int kb = kg; kb < kg1; ++kb)
          for (int oh = oh0; oh < oh1; ++oh) {
            const int16_t* i0 = dy_row(2 * p, kb, oh, ow0);
            const int16_t* i1 = 2 * p + 1 < sh.N ? dy_row(2 * p + 1, kb, oh, ow0) : nullptr;
            inter(i0, i1, tile[kb - kg] + size_t(oh - oh0) * cols * 32, size_t(cols) * 16);
          }
      plan_ahead(step);
      const size_t share = ahead.lines() / (size_t(CB) * T * (kg1 - kg)) + 1;
      // Chains for this step's sources: the largest |q| of the rows it reads, per block, over
      // both images.
      int32_t dy_bound[kWgradKbGroup];
      for (int kb = kg; kb < kg1; ++kb) dy_bound[kb - kg] = dy_max(p, p + 1, kb, oh0, oh1);
      // Longer chains from dy's L1 norms (not with a forced chain): a kernel call's INT32 sum over
      // any of its positions is at most its x bound times the L1 norm, over those positions, of
      // its dy lanes, which is at most the sum of the tile rows' l1 they lie in (both images,
      // the largest lane). A chain of m whole call rows then holds where every m consecutive tile
      // rows' l1 sum to at most INT32_MAX / x_bound: the kernel flushes every `chain` positions
      // from the call's first, so at the ends of rows. A row of gradients mostly lies far below
      // its largest value, so this allows several rows where the bound from the largest |q|
      // (pair_chain) allows a few positions: at headroom 1 with exponents per image pair, 4.
      // The norms are measured for a block only once some call would take a chain shorter than
      // the tile (with one exponent per tensor, the bound from the maxima mostly covers it).
      // Where the tile's rows are dyp's whole rows, quantization wrote their norms with dyp.
      const int nrows = oh1 - oh0;
      const bool stored_l1 = dy_whole_pairs && cols == OW;
      int32_t dy_l1_tile[kWgradKbGroup][kPairTile];
      const int32_t* dy_l1[kWgradKbGroup] = {};
      // x_row_max counts x's own rows even where xp keeps every xp_step-th one (strided 1x1): the
      // bound over all rows the window spans is conservative and leaves the chains, so the bits,
      // as they were; the gradient loop below indexes xp's rows (x_row_step, xp_h) instead.
      const int ih0 = oh0 * sh.stride_h - sh.pad_h, ih1 = (oh1 - 1) * sh.stride_h - sh.pad_h + sh.R;
      int chains[kWgradKbGroup], l1_rows[kWgradKbGroup];
      // A call's chain: l1_rows whole rows where that is longer than the bound from the maxima.
      auto call_chain = [&](int i, int rows, int cols_read) {
        const int m = l1_rows[i];
        return m >= rows ? kMaxChain : std::max(chains[i], m * cols_read);
      };
      for (int cb = 0; cb < CB; ++cb) {
        const int32_t x_bound = x_max(p, p + 1, cb, ih0, ih1);
        for (int kb = kg; kb < kg1; ++kb) {
          const int i = kb - kg;
          chains[i] = opt.chain_override ? chain : std::max(chain, pair_chain(x_bound, dy_bound[i]));
          l1_rows[i] = 0;
          if (opt.chain_override || chains[i] >= nrows * cols) continue;
          if (!dy_l1[i]) {
            if (stored_l1) {
              dy_l1[i] = dyp_row_l1.data() + (size_t(p) * KB + kb) * OH + oh0;
            } else {
              row_l1(dy_at(kb, oh0, ow0), nrows, cols, a.dy_row, dy_l1_tile[i]);
              dy_l1[i] = dy_l1_tile[i];
            }
          }
          l1_rows[i] = rows_within(dy_l1[i], nrows, kInt32Max / x_bound);  // x_bound > 0: chains[i] is finite
        }
        // The next input block's rows of this tile are a plane away: a new stream that the
        // hardware prefetcher finds only after a few misses, from L3 or memory where the layer
        // has many channels or large planes. The kernel calls of this block fetch it while they
        // compute, a share each, a line per position: a burst before the block's calls would
        // stall on the full miss queue, and the rest would miss. Stride-1 3x3 layers, which
        // reuse x across taps, neither gain nor lose (figures: docs/design/kernels.md).
        // The range is the next block's whole rows (xp_w wide) whatever the column tile, so a
        // layer wider than kPairTile (VGG's 224) fetches those rows once per column tile: a hint
        // repeated, not a wrong result.
        const char *next_x = nullptr, *x_end = nullptr;
        size_t x_share = 0;  // bytes per call
        // After the last block, the first block of the next step's tile, where that is a new
        // tile (with only the output blocks changed, the tile's x is still in L2): with few
        // blocks (64 channels: 4) a cold first block was a quarter of them.
        Step after = step;
        const bool new_tile = cb + 1 == CB && next(after) && (after.p != p || after.oh0 != oh0 || after.ow0 != ow0);
        if ((cb + 1 < CB || new_tile) && !x_compact) {  // a compact x: the next block's pairs are in the same lines
          const int xo0 = cb + 1 < CB ? oh0 : after.oh0;
          const int xo1 = cb + 1 < CB ? oh1 : std::min(OH, after.oh0 + chunk_rows);
          const int r0 = std::max(0, xo0 * x_row_step - sh.pad_h);
          const int r1 = std::min(xp_h, (xo1 - 1) * x_row_step - sh.pad_h + sh.R);
          const int16_t* x_next = cb + 1 < CB ? x_pairs_at(p, cb + 1, r0, 0) : x_pairs_at(after.p, 0, r0, 0);
          next_x = reinterpret_cast<const char*>(x_next);
          const size_t lines = size_t(std::max(0, r1 - r0)) * xp_w;  // 64 bytes per position
          const size_t calls = size_t(T) * (kg1 - kg);
          x_share = (lines + calls - 1) / calls * 64;
          x_end = next_x + lines * 64;
        }
        for (int t = 0; t < T; ++t) {
          int lo_r, lo_c;
          if (!at_tap(a, t, p, cb, oh0, oh1, ow0, ow1, lo_r, lo_c)) continue;
          for (int kb = kg; kb < kg1; ++kb) {
            a.dy = dy_at(kb, lo_r, lo_c);
            a.prefetch = next_x ? next_x + (size_t(t) * (kg1 - kg) + kb - kg) * x_share : nullptr;
            a.prefetch_end = next_x ? std::min(x_end, a.prefetch + x_share) : nullptr;
            a.chain = call_chain(kb - kg, a.rows, a.cols);
            a.scale = call_scale(p, cb, kb);
            ahead.issue(share);
            call(a, acc, t, cb, kb);
          }
        }
      }
    } while (next(step));
  };
  // The common layout's partials, [K16][T][C16], into dW [K][C][T] for rows [k0, k1): as
  // sum_into_dw below (16 channels at a time, each tap's partials read in order, the slices
  // summed in order), with the pointers stepped and, for T > 1, one scale (a convolution's is
  // per layer). Through sum_into_dw's index lambdas and per-element scale, ResNet-18c's
  // 512-channel 4x4 layer spent 15% of its weight gradient here (perf; docs/design/kernels.md).
  const float layer_scale = call_scales ? 1.f : scale;
  auto common_rows = [&](int64_t k0, int64_t k1) {
    const int64_t tap = int64_t(CB) * 16;
    for (int64_t k = k0; k < k1; ++k) {
      const float* in = dw_part + size_t(k) * dw_k;
      float* out = dw + size_t(k) * sh.C * T;
      if (T == 1) {
        // 1x1: a partial's row k is dW's row k (and padding), so whole rows go at a time, slice by
        // slice: the additions of the loop below, in the same order, in vector form (element by
        // element, large layers spent a visible share here; docs/design/kernels.md).
        // A fully connected layer's scales may differ per block pair (Granularity::slice).
        std::memcpy(out, in, size_t(sh.C) * sizeof(float));
        for (int sl = 1; sl < ns; ++sl)
          for (int c = 0; c < sh.C; ++c) out[c] += in[size_t(sl) * part + c];
        for (int c = 0; c < sh.C; ++c) out[c] *= scale_of(k, c);
        continue;
      }
      for (int c0 = 0; c0 < sh.C; c0 += 16) {
        const int c1 = std::min(sh.C, c0 + 16);
        for (int t = 0; t < T; ++t) {
          const float* row = in + t * tap;
          float* o = out + t;
          if (ns == 1) {
            for (int c = c0; c < c1; ++c) o[size_t(c) * T] = row[c] * layer_scale;
            continue;
          }
          for (int c = c0; c < c1; ++c) {
            float v = row[c];
            for (int sl = 1; sl < ns; ++sl) v += row[size_t(sl) * part + c];
            o[size_t(c) * T] = v * layer_scale;
          }
        }
      }
    }
  };
  // By output blocks (one partial), a task writes its own rows of dW as it ends, while its
  // partials are still in L2: a pass over all of them afterwards read them back from memory
  // (9 MiB for a 512-channel 3x3 layer).
  const bool rows_in_task = by_output_block() && !direct && !lanes_k && !unfold;
  if (by_output_block()) {
    // Enough output blocks to share out: each task owns 16 rows of dW over all positions, so
    // there are no partial sums to store or add (large layers would make them memory-bound).
    // Tasks are groups of output blocks that share x tiles (at most kWgradKbGroup), small enough
    // that with several threads each gets about four: with one task per thread (64-channel
    // layers) or two, a thread whose tasks ran slower left the other waiting, 2.5-4% of the pass.
    // Each kb sees the same calls in the same order however the blocks are grouped, so the
    // result does not depend on the thread count.
    const int threads = ctx.threads();
    const int group = threads == 1 ? kWgradKbGroup : std::clamp(KB / (4 * threads), 1, kWgradKbGroup);
    run_calls((KB + group - 1) / group, base, [&](simd::PairKernelArgs& a, int64_t g) {
      const int kb0 = int(g) * group, kb1 = std::min(KB, kb0 + group);
      float* acc = direct ? dw : dw_part;
      if (gemm) {
        // Nothing to zero: every dW block has one call, which stores.
      } else if (lanes_k) {  // this group's lane blocks of every row and tap
        for (int64_t row = 0; row < dw_rows(); ++row)
          for (int t = 0; t < T; ++t)
            std::memset(acc + row * dw_k + size_t(t) * KB * 16 + size_t(kb0) * 16, 0,
                        size_t(kb1 - kb0) * 16 * sizeof(float));
      } else {
        std::memset(acc + size_t(kb0) * 16 * dw_k, 0, size_t(kb1 - kb0) * 16 * dw_k * sizeof(float));
      }
      reduce(a, acc, 0, NP, kb0, kb1);
      if (rows_in_task) common_rows(int64_t(kb0) * 16, std::min<int64_t>(sh.K, int64_t(kb1) * 16));
    });
  } else {
    run_calls(ns, base, [&](simd::PairKernelArgs& a, int64_t sl) {
      float* acc = dw_part + size_t(sl) * part;
      if (!gemm) std::memset(acc, 0, part * sizeof(float));
      reduce(a, acc, int(sl * NP / ns), int((sl + 1) * NP / ns), 0, KB);
    });
  }
  if (direct || rows_in_task) return;
  // Sum the slices in a fixed order into dW [K][C][R][S], 16 channels at a time: each tap's
  // partials of a channel block are read in order (with taps innermost, a 512-channel 3x3
  // layer would read them 2 KiB apart) and the block's 16 * T results written in order, in L1.
  // partial(k, c, t) is a partial's offset and out(k, c, t) its place in dW, for the layouts
  // with an index map; the common layout has its own loop in the same order (common_rows; through
  // weight_index(), large layers spend much of their weight gradient here;
  // docs/design/kernels.md).
  auto sum_into_dw = [&](auto partial, auto out) {
    ctx.parallel_for(sh.K, [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k)
        for (int c0 = 0; c0 < sh.C; c0 += 16)
          for (int t = 0; t < T; ++t)
            for (int c = c0; c < std::min(sh.C, c0 + 16); ++c) {
              const size_t off = partial(k, c, t);
              float v = dw_part[off];
              for (int sl = 1; sl < ns; ++sl) v += dw_part[size_t(sl) * part + off];
              dw[out(k, c, t)] = v * scale_of(k, c);
            }
    });
  };
  const auto rows_k = [&](int64_t k, int c, int t) { return size_t(k) * dw_k + size_t(t) * CB * 16 + c; };  // [K16][T][C16]
  const auto mapped = [&](int64_t k, int c, int t) { return weight_index(int(k), c, t); };
  if (lanes_k) {  // [C16][T][K16]
    sum_into_dw([&](int64_t k, int c, int t) { return size_t(c) * dw_k + size_t(t) * KB * 16 + size_t(k); }, mapped);
  } else if (unfold) {
    sum_into_dw(rows_k, mapped);
  } else {
    ctx.parallel_for(sh.K, common_rows);
  }
}

}  // namespace dfp
