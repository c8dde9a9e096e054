// INT16 (DFP16) convolution: planning, operand quantization into the kernels' layouts, the
// INT32-chain bounds, and the drivers of the three passes.
//
// Why one file of ~1600 lines: it is one operator. The plan (layouts, tiles, chain bounds,
// workspaces) is a single Impl that the quantizers, the packers and all three drivers read and
// the drivers must agree on bit for bit; its seams (plan / operands / passes) become files of
// their own once Impl has a header, with the layer folders of issue 28 part 2.
//
// Layouts (int16 unless noted; lanes are 16 channels; "pair" = two int16 that one VPDPWSSD lane
// multiplies-and-adds):
//   xq   [N][CB][Hp][Wp][16]       x, zero border of (pad_h, pad_w): FPROP operand, pairs along C
//   xp   [NP][CB][H][W][16][2]     x, images 2n and 2n+1 interleaved: WTGRAD operand, pairs along N
//                                  (the saved activation; no border: WTGRAD clips each tap instead).
//                                  A strided 1x1 layer without padding keeps only the pixels its
//                                  outputs read: [NP][CB][OH][OW][16][2] (xp_step = the stride)
//   dyq  [N][KB][OHb][OWb][16]     dy, zero border sized for the backward-data taps: BPROP operand
//   dy pairs [rows][cols][16][2]   dy, batch pairs: WTGRAD operand, interleaved from dyq a few rows
//                                  at a time into a stack tile, or read in place from dyp
//   dyp  [NP][KB][OH][OW][16][2]   dy, batch pairs, whole (dy_whole_pairs): WTGRAD operand of a fully
//                                  connected layer, and of a layer without an input-gradient pass
//                                  (a network's first layer), which has no dyq
//   wf   [KB][CB][R*S][8][16][2]   w, lanes = 16 output channels, pairs along C (FPROP)
//   wb   [CB][KB][R*S][8][16][2]   w, lanes = 16 input channels, pairs along K (BPROP)
// xq and dyq live in a workspace that other operators may share, so quantization writes their
// borders as well as their interiors. All of these are in the shape the kernels run, which for a
// layer with few input channels is its column unfolding (see Impl::unfold).
//
// Backward-data with stride s is split into s*s phases (output pixels with equal residues mod s);
// each phase is a stride-1 correlation of dy with the subset of taps that reach it, so no work is
// spent on the zeros a dilated dy would hold.
//
// The weight gradient reduces over positions (image pair, oh, ow) in a fixed number of slices,
// each with its own FP32 partial, summed in slice order: the result does not depend on the
// thread count.
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <xmmintrin.h>  // _mm_prefetch (baseline SSE)

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"
#include "src/aligned_buffer.hpp"
#include "src/atomic_max.hpp"
#include "src/dfp16_internal.hpp"

namespace dfp {

namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int kMaxChain = 1 << 24;  // "unbounded": longer than any reduction
constexpr int kPairTile = 128;      // weight-gradient positions per kernel call (dy pairs: 8 KiB)
constexpr int kWgradKbGroup = 2;    // weight-gradient output blocks sharing one x tile (4: slower, L1)
constexpr int kWgradSlices = 8;     // fixed, so results do not depend on the thread count
// The weight gradient fetches the next step's dy rows ahead only when dy is larger than this
// (a quarter of this CPU's 32 MiB L3): smaller, its rows come from L3, which the hardware
// prefetcher streams well enough, and the burst of prefetches before each call costs more than
// it saves; larger (ResNet-50's 51 MiB layers), the prefetch pays (figures:
// docs/design/kernels.md).
constexpr size_t kDyPrefetchMinBytes = size_t(8) << 20;
// A pixel pass streams the zeros of its tapless phases (non-temporal stores) when its output is
// larger than this: the 32 MiB L3 could not keep them for the next layer anyway. Every other
// output is written normally: streaming those too is slower (docs/performance.md).
constexpr size_t kStreamMinBytes = size_t(32) << 20;
constexpr int kUnfoldBlocks = 4;    // largest column unfolding, in 16-channel blocks
constexpr int kUnfoldPixels = 64;   // pixels per gather tile of the column unfolding
// Rows of at most this many output pixels (VGG's last 2x2 layers on CIFAR) tile across images at
// one position instead: a 2-pixel row tile keeps 4 of 28 accumulators busy, too few to hide
// VPDPWSSD's latency. A tile takes the kernel's 14 images, or 8 where the images' source or output
// lines lie a multiple of 2 KiB apart (a 512-channel layer's: 16 KiB): then 14 lines share one or
// two L1 sets and thrash them (14 images are slower than the rows). With 4-pixel rows the row
// tiles are faster than image tiles. Figures: docs/design/kernels.md, "Tiling and weight packing".
constexpr int kImageTileMaxRow = 2;
constexpr int kImageTileNarrow = 8;

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

// The smallest source bound chain tables measure lengths for: 1/16 of the least largest |q| a
// tensor quantized with this headroom has (the quantizer puts it in [2^(14-h), 2^(15-h))). A call
// whose rows are bounded lower takes this bound's chain, which already flushes 16 times less
// often than the tensor maximum's.
int64_t measure_floor(int headroom) { return std::max<int64_t>(1, (int64_t{1} << (14 - headroom)) / 16); }

int pair_chain(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return kMaxChain;
  return static_cast<int>(std::min<int64_t>(kInt32Max / (2 * a * b), kMaxChain));
}

// The pixel kernel flushes after every `chain` steps counted from the start of each call, so an
// output lane's INT32 sum spans a window of consecutive (input block, tap) units of 8 steps, the
// windows starting at the call's first unit. A lane's sum in a window is at most a (the largest
// |src|) times the L1 norm of its weights over the window's units. The table holds, for
// candidate window lengths n, the largest such L1 norm over all lanes and windows of the pass's
// unit sequence; the chain is the longest n with a * L1(n) <= INT32_MAX. That is the exact bound
// for these weights, and longer than n * (largest single-unit L1) because units differ: with
// uniform random weights it gives chains of 3 units where the per-unit bound gives 2.
struct ChainTable {
  std::vector<int> n;        // candidate window lengths in units, ascending; n[0] = 1
  std::vector<int64_t> l1;   // the largest window L1 norm for each
  int64_t pair_l1 = 0;       // the largest per-step (pair) L1, for chains shorter than a unit
  int unit_steps = 8;        // VPDPWSSD steps per unit: the channel pairs of a block that can be nonzero

  // Candidates: every length up to 16, then steps of a half, and the whole sequence.
  void plan(int units, int steps_per_unit) {
    unit_steps = steps_per_unit;
    n.clear();
    for (int c = 1; c <= units; c = c < 16 ? c + 1 : c + c / 2) n.push_back(c);
    if (n.empty() || n.back() != units) n.push_back(std::max(units, 1));
    DFP_CHECK(n.size() <= kMaxCandidates, Status::internal,
              "chain table: " + std::to_string(n.size()) + " candidate lengths for " + std::to_string(units) + " units");
    l1.assign(n.size(), 0);
  }
  // unit_l1[lane * lane_stride + ib * T + tap]: per-lane L1 of one unit. The sequence is ib in
  // [0, nib) outer, taps[] inner, as the kernel runs it. Lengths past the first that overflows
  // for sources of magnitude a_min are not measured: calls whose bound is below a_min take a_min's
  // chain (measure_floor()).
  // Lanes run on the context's threads, and each lane's windows come from prefix sums over
  // chunks of its unit sequence: one pass over the units, then about units / n differences per
  // candidate n, with each candidate's open window carried from chunk to chunk (a 512-channel 3x3
  // layer has 512 lanes of 288 units; scanning them once per candidate would take a third of its
  // set_weights, serially). The maxima do not depend on how the lanes are split.
  static constexpr size_t kMaxCandidates = 64;  // 16 lengths, then x1.5 steps: enough for 10^6 units
  static constexpr int kPrefixChunk = 1024;     // units per prefix-sum chunk (8 KiB of stack)
  void measure(const Context& ctx, const int32_t* unit_l1, int lanes, int64_t lane_stride, int nib, int T,
               const int32_t* taps, int ntaps, int64_t a_min) {
    const int units = nib * ntaps;
    const size_t nc = n.size();
    std::array<std::atomic<int64_t>, kMaxCandidates> best{};
    const int64_t grain = std::max<int64_t>(1, 8192 / std::max(1, units));  // lanes per task item
    ctx.parallel_for((lanes + grain - 1) / grain, [&](int64_t g0, int64_t g1) {
      int64_t local[kMaxCandidates] = {};
      int64_t open_sum[kMaxCandidates];  // the open (not yet full) window of each candidate
      int open_len[kMaxCandidates];
      int64_t pre[kPrefixChunk + 1];
      for (int64_t lane = g0 * grain; lane < std::min<int64_t>(lanes, g1 * grain); ++lane) {
        const int32_t* u = unit_l1 + lane * lane_stride;
        std::fill_n(open_sum, nc, 0);
        std::fill_n(open_len, nc, 0);
        int ib = 0, t = 0;  // the sequence: ib outer, taps[] inner, as the kernel runs it
        for (int m0 = 0; m0 < units; m0 += kPrefixChunk) {
          const int len = std::min(kPrefixChunk, units - m0);
          pre[0] = 0;
          for (int k = 0; k < len; ++k) {
            pre[k + 1] = pre[k] + u[int64_t(ib) * T + taps[t]];
            if (++t == ntaps) t = 0, ++ib;
          }
          for (size_t i = 0; i < nc; ++i) {
            const int need = n[i] - open_len[i];  // >= 1
            if (need > len) {
              open_sum[i] += pre[len];
              open_len[i] += len;
              continue;
            }
            local[i] = std::max(local[i], open_sum[i] + pre[need]);
            int k = need;
            for (; k + n[i] <= len; k += n[i]) local[i] = std::max(local[i], pre[k + n[i]] - pre[k]);
            open_sum[i] = pre[len] - pre[k];
            open_len[i] = len - k;
          }
        }
        for (size_t i = 0; i < nc; ++i) local[i] = std::max(local[i], open_sum[i]);  // the last, partial window
      }
      for (size_t i = 0; i < nc; ++i) atomic_max(best[i], local[i]);
    });
    for (size_t i = 0; i < nc; ++i) {
      l1[i] = best[i].load();
      if (a_min * l1[i] > kInt32Max) {
        std::fill(l1.begin() + i + 1, l1.end(), std::numeric_limits<int64_t>::max() / 65536);
        break;
      }
    }
  }
  // Steps per INT32 chain for sources of magnitude <= a.
  int chain(int64_t a) const {
    if (a == 0 || l1[0] == 0) return kMaxChain;
    int best = 0;
    for (size_t i = 0; i < n.size() && a * l1[i] <= kInt32Max; ++i) best = n[i];
    if (best > 0) return static_cast<int>(std::min<int64_t>(int64_t(best) * unit_steps, kMaxChain));
    return static_cast<int>(std::max<int64_t>(1, kInt32Max / (a * pair_l1)));  // >= 1: a, pair_l1 <= 32767, 65534
  }
};

// Chains per call. The bound a * L1(n) holds for any a at least the largest |q| a call reads, and
// the quantizer records each row's largest |q|: a call's own rows are typically bounded well
// below the tensor's maximum (by 0.5-0.8 of it on ResNet-20, README), so its chains can be longer. Calls
// look their chain up by their bound's bucket, whose upper edge is the bound rounded up to its top
// 3 significant bits (within 25%): buckets 0-7 hold 0-7 exactly, then 4 per octave up to 32767.
constexpr int kChainBuckets = 56;
constexpr int chain_bucket(int32_t a) {
  if (a < 8) return a;
  const int bl = 32 - __builtin_clz(static_cast<uint32_t>(a));
  return 8 + (bl - 4) * 4 + ((a >> (bl - 3)) - 4);
}
constexpr int32_t bucket_top(int i) {
  if (i < 8) return i;
  const int bl = (i - 8) / 4 + 4, m = (i - 8) % 4 + 4;
  return ((m + 1) << (bl - 3)) - 1;
}
// Every |q| lands in a bucket whose top is at least itself and under 5/4 of it, buckets in order.
constexpr bool buckets_cover() {
  for (int32_t a = 0; a <= 32767; ++a) {
    const int i = chain_bucket(a);
    if (i < 0 || i >= kChainBuckets || bucket_top(i) < a || 4 * bucket_top(i) > 5 * a + 3) return false;
    if (a > 0 && chain_bucket(a - 1) > i) return false;
  }
  return true;
}
static_assert(buckets_cover());

// The chains of one tap sequence (a row group, an edge column): its table, the chain for the
// tensor's largest |q| (set per pass, and reported), and the chain for each bucket of a call's own
// bound (set with the table, once per weight version). override_chain > 0 replaces both.
struct TapChain {
  ChainTable table;
  int steps = 0;
  std::array<int, kChainBuckets> by_bound{};

  void measure(const Context& ctx, const int32_t* unit_l1, int lanes, int64_t lane_stride, int nib, int T,
               const int32_t* taps, int ntaps, int64_t a_min, int64_t pair_l1, int override_chain) {
    table.pair_l1 = pair_l1;
    table.measure(ctx, unit_l1, lanes, lane_stride, nib, T, taps, ntaps, a_min);
    for (int i = 0; i < kChainBuckets; ++i)
      by_bound[size_t(i)] = override_chain ? override_chain : table.chain(bucket_top(i));
  }
  int choose(int64_t a, int override_chain) { return steps = override_chain ? override_chain : table.chain(a); }
  // The chain of a call whose sources are at most `bound` (<= 32767) in magnitude. Both chains are
  // safe for it; the longer one runs.
  int for_bound(int32_t bound) const { return std::max(steps, by_bound[size_t(chain_bucket(bound))]); }
};

// Output rows grouped by the taps that read inside the image. A row at the top or bottom edge
// skips the taps whose input row is padding (zero products: 1/8 of the work of a 3x3 layer on an
// 8x8 image). Taps are ordered by kernel row, so a row's taps are a contiguous range; each group
// has its own chain table because its unit sequence differs.
struct RowTaps {
  std::vector<int> row_group;                    // per output row
  std::vector<std::pair<int, int>> range;        // per group: taps [first, last)
  std::vector<TapChain> chain;                   // per group

  // valid(row, t): whether tap t of that output row reads inside the image. unit_steps: channel
  // pairs per reduction block that the kernel runs.
  template <class Valid>
  void plan(int rows, int ntaps, int nib, int unit_steps, Valid valid) {
    for (int row = 0; row < rows; ++row) {
      int lo = 0, hi = 0;
      while (lo < ntaps && !valid(row, lo)) ++lo;
      hi = lo;
      while (hi < ntaps && valid(row, hi)) ++hi;
      for (int t = hi; t < ntaps; ++t)
        if (valid(row, t)) lo = 0, hi = ntaps;  // not contiguous (never for row-major taps): keep all
      if (lo == hi) lo = hi = 0;
      const auto it = std::find(range.begin(), range.end(), std::make_pair(lo, hi));
      row_group.push_back(static_cast<int>(it - range.begin()));
      if (it == range.end()) {
        range.emplace_back(lo, hi);
        chain.emplace_back();
        chain.back().table.plan(nib * (hi - lo), unit_steps);
      }
    }
  }
};

// Splits n into the fewest blocks of at most m, as even as possible.
void split_blocks(int n, int m, std::vector<int>& start, std::vector<int>& len) {
  const int nb = (n + m - 1) / m;
  start.clear();
  len.clear();
  int s = 0;
  for (int b = 0; b < nb; ++b) {
    const int l = n / nb + (b < n % nb ? 1 : 0);
    start.push_back(s);
    len.push_back(l);
    s += l;
  }
}

// Output columns at the ends of a row whose taps read column padding. A row call runs every tap
// for all of its pixels, so the first and last pixels of a 3x3 layer's rows multiplied zeros in a
// third of their taps: 1/12 of the work on 8-pixel rows, as much as RowTaps saves at the top and
// bottom. Row calls cover the middle columns [lo, ncols - hi); each edge column runs as calls
// down its rows (pixels one row apart) with only the taps that read inside the image. At the
// corners the rows' own padding taps stay: they read the zero border. Each edge column has its
// own tap sequence and so its own chain table.
struct EdgeColumns {
  // A middle narrower than this keeps the whole row in row calls: the calls would be too short
  // to run at the VPDPWSSD rate.
  static constexpr int kMinMiddle = 5;
  struct Column {
    int col = 0;
    std::vector<int64_t> tap_src;
    std::vector<int32_t> tap_wei;
    TapChain chain;
  };
  int lo = 0, hi = 0;
  std::vector<Column> cols;
  std::vector<int> chunk_start, chunk_len;  // the row chunks an edge column's calls take

  // valid(col, t): whether tap t of output column col reads inside the image. It is monotone in
  // col (a kernel window slides right), so the columns whose taps are all valid are contiguous.
  // out_blocks: the pass's 16-lane output blocks; with one, every call is a single-block call
  // and takes up to max_pixels(1) rows.
  template <class Valid>
  void plan(int ncols, int nrows, const std::vector<int64_t>& tap_src, const std::vector<int32_t>& tap_wei, int nib,
            int unit_steps, int out_blocks, Valid valid) {
    const int ntaps = static_cast<int>(tap_wei.size());
    auto full = [&](int c) {
      for (int t = 0; t < ntaps; ++t)
        if (!valid(c, t)) return false;
      return true;
    };
    lo = hi = 0;
    while (lo < ncols && !full(lo)) ++lo;
    while (hi < ncols - lo && !full(ncols - 1 - hi)) ++hi;
    if (ncols - lo - hi < kMinMiddle) {
      lo = hi = 0;
      return;
    }
    for (int c = 0; c < ncols; ++c) {
      if (c == lo) c = ncols - hi;
      if (c >= ncols) break;
      Column col;
      col.col = c;
      for (int t = 0; t < ntaps; ++t)
        if (valid(c, t)) {
          col.tap_src.push_back(tap_src[t]);
          col.tap_wei.push_back(tap_wei[t]);
        }
      col.chain.table.plan(nib * static_cast<int>(col.tap_wei.size()), unit_steps);
      cols.push_back(std::move(col));
    }
    split_blocks(nrows, simd::max_pixels(out_blocks == 1 ? 1 : 2), chunk_start, chunk_len);
  }
  // Kernel calls per image (per phase image, for backward-data), each for every output-block group.
  int64_t calls() const { return int64_t(cols.size()) * static_cast<int64_t>(chunk_start.size()); }
  // Points a call at edge call e's column taps; returns its column, and its first row in r0. The
  // caller sets the chain (Column::chain.for_bound) once it knows the call's bound.
  const Column& use(simd::PixelKernelArgs& a, int64_t e, int& r0) const {
    const int nch = static_cast<int>(chunk_start.size());
    const Column& c = cols[size_t(e / nch)];
    r0 = chunk_start[size_t(e % nch)];
    a.npix = chunk_len[size_t(e % nch)];
    a.tap_src = c.tap_src.data();
    a.tap_wei = c.tap_wei.data();
    a.ntaps = static_cast<int>(c.tap_wei.size());
    return c;
  }
};

// One lattice of output positions of a pixel-kernel pass, with its own taps: the forward pass
// has one (every output pixel), backward-data one per stride phase (the dx rows and columns
// congruent to (ph, pw), each reading its own subset of the taps).
struct Phase {
  int ni = 0, nj = 0;    // its output rows and columns
  int64_t dst_off = 0;   // offset of its output (0, 0) in an image's output block
  std::vector<int64_t> tap_src;
  std::vector<int32_t> tap_wei;
  // Output (i, j) reads source row i * row_step + tap_dr[t] and column j * col_step + tap_dc[t]
  // (the pass's steps): forward r - pad_h and s - pad_w, backward-data the dy offsets.
  std::vector<int> tap_dr, tap_dc;
  // So output rows [i0, i1) read source rows [i0 * row_step + dr_min, (i1 - 1) * row_step + dr_max).
  int dr_min = 0, dr_max = 1;
  RowTaps rows;
  EdgeColumns edges;
};

// 2^e for a pass's product scale; the message is built only on failure (no allocation per pass).
float pow2(int e, const std::string& name, const char* pass) {
  DFP_CHECK(e >= -126 && e <= 127, Status::numerical_error,
            "convolution '" + name + "' " + pass + ": product scale 2^" + std::to_string(e) +
                " is outside the normal FP32 range (operands too small or too large for DFP16 here)");
  return std::ldexp(1.f, e);
}

}  // namespace

struct ConvInt16::Impl {
  const Context& ctx;
  ConvShape user;  // the caller's shape
  ConvShape sh;    // the shape the kernels run: user's, or its column unfolding
  DfpConvOptions opt;
  std::string name;
  ConvStats stats;
  // Column unfolding, for layers with few input channels (a first layer's 1 or 3): the kernel's S
  // columns move into the channels, c' = s * C + c, and the layer runs as an R x 1 convolution
  // over an input of OW columns with stride 1 and no column padding:
  //   x'[n][c'][h][ow] = x[n][c][h][ow * stride_w + s - pad_w]   (0 outside the image)
  //   w'[k][c'][r]     = w[k][c][r][s]
  // Reduction lanes that would hold 13 padding channels of 16 hold taps instead, which cuts the
  // forward and weight-gradient work by up to S times. Weights and dW are read and written
  // through the index map; x' is gathered row by row as it is quantized; dx is folded back from
  // dx'.
  bool unfold = false;
  AlignedBuffer<float> dx_unfolded;  // dx' (backward_data only: not allocated without input_gradient)

  int CB, KB, NP, T, OH, OW, Hp, Wp;
  bool gemm;  // 1x1 output from 1x1 input: pixels run over the batch
  int pt = 0, pl = 0, OHb = 0, OWb = 0;  // dyq's zero border (top rows, left columns) and padded size
  // Pixel blocks of an output row's middle columns (for 1 or 2 output-lane blocks), planned once.
  struct RowBlocks {
    std::vector<int> start1, len1, start2, len2;
  };
  static RowBlocks row_blocks(int ncols, const EdgeColumns& edges) {
    RowBlocks rb;
    const int middle = ncols - edges.lo - edges.hi;
    split_blocks(middle, simd::max_pixels(1), rb.start1, rb.len1);
    split_blocks(middle, simd::max_pixels(2), rb.start2, rb.len2);
    for (int& s : rb.start1) s += edges.lo;
    for (int& s : rb.start2) s += edges.lo;
    return rb;
  }
  // A pixel-kernel pass: forward (x -> y, one phase) or backward-data (dy -> dx, a phase per
  // stride residue). They differ only in these numbers, so one planner and one driver run both.
  // Output (i, j) of a phase in image n reads its sources at src + n * src_img + i * src_row +
  // j * src_col (plus the tap offsets) and writes output block ob at dst + n * dst_img +
  // ob * dst_ob + dst_off + i * dst_row + j * dst_col.
  struct PixelPass {
    std::vector<Phase> phases;
    std::vector<RowBlocks> blocks;    // per phase
    std::vector<int64_t> row_begin;   // prefix sums over phases of N * (ni rows + edge-column calls)
    std::vector<int64_t> pos_begin;   // prefix sums of ni * nj over phases
    bool image_tiles = false;         // every phase's rows are short: tile over images instead
    int in_channels = 0, in_blocks = 0, out_blocks = 0;
    int row_step = 1, col_step = 1;   // source rows/columns per output row/column
    int src_rows = 0, src_cols = 0;   // the source image (unpadded), for the taps' validity
    int64_t src_img = 0, src_ib = 0, src_row = 0, src_col = 0;
    int64_t dst_img = 0, dst_ob = 0, dst_row = 0, dst_col = 0;
    std::vector<int16_t> img_max;     // per run: each source row's largest |q| over its blocks, [N][src_rows]
  };
  PixelPass fwd, bwd;

  // xp (the batch-pair copy of x) is the activation saved for the weight gradient and persists
  // from forward to backward. The rest is transient and lives in the workspace: xq during the
  // forward pass; dyq, dyp and dw_part during the backward passes.
  AlignedBuffer<int16_t> xp, wf, wb;
  // xp holds every xp_step-th row and column of x (xp_h x xp_w pixels per plane): a 1x1 layer of
  // stride s > 1 without padding reads only those, and reading them in place from a full copy
  // costs its weight gradient half its rate (each pair load a new cache line, half of each line
  // and every other row unused; figures in docs/design/kernels.md).
  // x_row_step / x_col_step: rows and columns of xp between consecutive output positions (the
  // stride, or 1 where xp is subsampled); one indexing serves both forms.
  int xp_step = 1, xp_h = 0, xp_w = 0, x_row_step = 1, x_col_step = 1;
  int16_t* wq = nullptr;  // the unpacked DFP16 weights, in the workspace while set_weights() packs them
  std::vector<std::pair<int, int>> tap_rows, tap_cols;  // per kernel row / column: valid output range
  int16_t *xq = nullptr, *dyq = nullptr, *dyp = nullptr;
  // dy is quantized into the whole batch-pair layout dyp as well as (with a backward-data pass)
  // into dyq, and the weight gradient reads dyp in place: for a fully connected layer, and for a
  // layer without a backward-data pass (options.input_gradient false, as for a network's first
  // layer), which then has no dyq. Otherwise the weight gradient interleaves dy tiles from dyq on
  // every step of its loop, a cost that whole pairs avoid where each tile serves only a few calls
  // (ResNet-20's 3-channel first layer: three; docs/design/kernels.md).
  bool dy_whole_pairs = false;
  // dyp at image pair p, output block kb, output row oh and column ow.
  const int16_t* dyp_at(int p, int kb, int oh, int ow) const {
    return dyp + (((size_t(p) * KB + kb) * OH + oh) * OW + ow) * 32;
  }
  std::vector<int16_t> x_row_max, dy_row_max;  // max|q| of each quantized row: [N][CB][H], [N][KB][OH]
  float* dw_part = nullptr;
  size_t xq_bytes = 0, dyq_bytes = 0, dyp_bytes = 0, dw_part_bytes = 0, wq_bytes = 0;
  AlignedBuffer<std::byte> own_workspace;  // unless the caller provides one
  bool shared_workspace = false;
  // Per-lane unit L1 norms of the packed weights, from which set_weights() measures each phase's
  // INT32 chain tables; they live in the workspace after wq while it packs.
  int32_t *unit_l1_f = nullptr, *unit_l1_b = nullptr;
  size_t unit_l1_bytes = 0;
  bool have_w = false, have_x = false, have_x_fwd = false, have_dy = false;
  // The options each quantization uses at the current step: opt's, with the base seed mixed with
  // the step (the stochastic stream). Kept, not copied per call: QuantOptions holds a name string,
  // and a training step allocates nothing.
  QuantOptions step_w, step_x, step_dy;
  void set_step(uint64_t step) {
    const uint64_t mix = step * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL;
    step_w.seed = opt.weights.seed ^ mix;
    step_x.seed = opt.activations.seed ^ mix;
    step_dy.seed = opt.gradients.seed ^ mix;
  }

  Impl(const Context& c, const ConvShape& s, const DfpConvOptions& o, std::string n)
      : ctx(c), user(s), sh(s), opt(o), name(std::move(n)) {
    user.validate("convolution '" + name + "'");
    // Unfold when the C * S unfolded channels need fewer 16-channel blocks than the S column taps
    // they replace (one block of C < 16 channels per tap), and at most kUnfoldBlocks of them (the
    // gather's stack tile).
    unfold = user.C < 16 && user.S > 1 && channel_blocks(user.C * user.S) < user.S &&
             channel_blocks(user.C * user.S) <= kUnfoldBlocks;
    if (unfold) {
      sh.C = user.C * user.S;
      sh.W = user.OW();
      sh.S = 1;
      sh.stride_w = 1;
      sh.pad_w = 0;
      if (opt.input_gradient) dx_unfolded = AlignedBuffer<float>(blocked_size(sh.N, sh.C, sh.H, sh.W));
    }
    step_w = opt.weights;
    step_x = opt.activations;
    step_dy = opt.gradients;
    set_step(0);
    for (const QuantOptions* q : {&opt.weights, &opt.activations, &opt.gradients}) q->validate("convolution '" + name + "'");
    DFP_CHECK(opt.chain_override >= 0, Status::invalid_argument,
              "convolution '" + name + "': chain_override expected >= 0, got " + std::to_string(opt.chain_override));
    CB = channel_blocks(sh.C);
    KB = channel_blocks(sh.K);
    NP = (sh.N + 1) / 2;
    T = sh.R * sh.S;
    OH = sh.OH();
    OW = sh.OW();
    Hp = sh.H + 2 * sh.pad_h;
    Wp = sh.W + 2 * sh.pad_w;
    gemm = sh.H == 1 && sh.W == 1 && sh.R == 1 && sh.S == 1;

    plan_forward();
    plan_backward_data();
    plan_pixel_pass(fwd);
    plan_pixel_pass(bwd);

    // Unpadded: the weight gradient clips each tap's positions to where x is inside the image
    // (padding taps contribute zero), so the saved activation carries no border.
    if (!gemm && !unfold && sh.R == 1 && sh.S == 1 && sh.pad_h == 0 && sh.pad_w == 0 && sh.stride_h == sh.stride_w &&
        sh.stride_h > 1)
      xp_step = sh.stride_h;
    xp_h = xp_step > 1 ? OH : sh.H;
    xp_w = xp_step > 1 ? OW : sh.W;
    x_row_step = sh.stride_h / xp_step;
    x_col_step = sh.stride_w / xp_step;
    xp = AlignedBuffer<int16_t>(size_t(NP) * CB * xp_h * xp_w * 32);
    for (int r = 0; r < sh.R; ++r) tap_rows.push_back(valid_outputs(r, sh.pad_h, sh.stride_h, sh.H, OH));
    for (int c = 0; c < sh.S; ++c) tap_cols.push_back(valid_outputs(c, sh.pad_w, sh.stride_w, sh.W, OW));
    unit_l1_bytes = round64(size_t(KB) * 16 * CB * T * sizeof(int32_t));  // = CB*16 * KB*T too
    wq_bytes = round64(size_t(sh.K) * sh.C * T * sizeof(int16_t)) + 2 * unit_l1_bytes;
    wf = AlignedBuffer<int16_t>(size_t(KB) * CB * T * 256);
    wb = AlignedBuffer<int16_t>(size_t(CB) * KB * T * 256);
    x_row_max.assign(size_t(sh.N) * CB * sh.H, 0);
    dy_row_max.assign(size_t(sh.N) * KB * OH, 0);
    xq_bytes = round64(size_t(sh.N) * CB * Hp * Wp * 16 * sizeof(int16_t));
    dy_whole_pairs = gemm || !opt.input_gradient;
    dyq_bytes = opt.input_gradient ? round64(size_t(sh.N) * KB * OHb * OWb * 16 * sizeof(int16_t)) : 0;
    dyp_bytes = dy_whole_pairs ? round64(size_t(NP) * KB * OH * OW * 32 * sizeof(int16_t)) : 0;
    dw_part_bytes = round64(size_t(wgrad_partials()) * dw_rows() * dw_row() * sizeof(float));
    use_workspace(nullptr);
  }

  static size_t round64(size_t b) { return (b + 63) / 64 * 64; }
  // Position in the caller's [K][C][R][S] weights of the kernels' (k, channel c, tap t).
  size_t weight_index(int k, int c, int t) const {
    if (!unfold) return (size_t(k) * sh.C + c) * T + t;
    const int s = c / user.C, cu = c % user.C;  // c = s * C + cu, t = r
    return ((size_t(k) * user.C + cu) * user.R + t) * user.S + s;
  }
  // Channel pairs per reduction block that the pixel kernel runs for a reduction over n channels:
  // all 8, except for a single block of fewer than 16 (a first layer's 1 or 3 channels), whose
  // zero-padding pairs are skipped. The INT32 sums are the same; only zero products go.
  static int pairs_of(int n) { return n >= 16 ? 8 : (n + 1) / 2; }
  // Output positions o in [lo, hi) whose input o * stride + tap - pad lies in [0, in).
  static std::pair<int, int> valid_outputs(int tap, int pad, int stride, int in, int out) {
    int lo = 0, hi = out;
    while (lo < out && lo * stride + tap - pad < 0) ++lo;
    while (hi > lo && (hi - 1) * stride + tap - pad >= in) --hi;
    return {lo, hi};
  }
  size_t backward_bytes() const { return dyq_bytes + dyp_bytes + dw_part_bytes; }
  // A shared workspace holds x's forward copy, dy's copies and the unpacked weights in the same
  // bytes; an owned one keeps them apart, so a standalone operator may run its passes in any order.
  size_t workspace_bytes() const { return std::max({xq_bytes, backward_bytes(), wq_bytes}); }
  // nullptr: the operator owns its region, allocated on first use (not here: a Model builds all
  // its operators before handing them the shared one).
  void use_workspace(void* shared) {
    std::byte* p = static_cast<std::byte*>(shared);
    DFP_CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0, Status::invalid_argument,
              "convolution '" + name + "': workspace must be 64-byte aligned");
    own_workspace = AlignedBuffer<std::byte>();
    xq = dyq = dyp = wq = nullptr;  // owned: placed on first use
    dw_part = nullptr;
    if (p) place(p, p, p);  // shared: the three regions overlap
    shared_workspace = p != nullptr;
    have_x_fwd = have_dy = false;
  }
  void ensure_workspace() {
    if (dyq) return;
    own_workspace = AlignedBuffer<std::byte>(backward_bytes() + wq_bytes + xq_bytes);
    std::byte* p = own_workspace.data();
    place(p, p + backward_bytes(), p + backward_bytes() + wq_bytes);
  }
  // Points the transient buffers into their regions: dy's copies and the weight-gradient
  // partials; the unpacked weights, with the unit L1 tables after them; x's forward copy.
  void place(std::byte* backward, std::byte* weights, std::byte* input) {
    dyq = reinterpret_cast<int16_t*>(backward);
    dyp = reinterpret_cast<int16_t*>(backward + dyq_bytes);
    dw_part = reinterpret_cast<float*>(backward + dyq_bytes + dyp_bytes);
    wq = reinterpret_cast<int16_t*>(weights);
    unit_l1_f = reinterpret_cast<int32_t*>(weights + wq_bytes - 2 * unit_l1_bytes);
    unit_l1_b = reinterpret_cast<int32_t*>(weights + wq_bytes - unit_l1_bytes);
    xq = reinterpret_cast<int16_t*>(input);
  }

  // Weight-gradient orientation. The pair kernel's 16 lanes run over one operand's channels and
  // it broadcasts the other's, one step per broadcast channel: lanes over C (dW rows k, 16 c per
  // row) take CB * K steps per position and tap, lanes over K (rows c, 16 k per row) KB * C. Few-
  // channel layers (an unfolded first layer: C = 9 or 21) take the second: ResNet-20's first conv
  // 9 instead of 16 steps. Integer sums are exact and flushes fall after the same positions, so
  // both give the same bits.
  bool wgrad_lanes_k() const { return !gemm && int64_t(KB) * sh.C < int64_t(CB) * sh.K; }
  // FP32 dW partials: [K16][T][C16], or [C16][T][K16] with lanes over K. A kernel call flushes 16
  // rows; at a row stride that is a multiple of 4 KiB (1x1 layers with C16 = 1024) they all fell
  // in one L1 set and every flush missed, so each row is one cache line longer.
  int64_t dw_rows() const { return wgrad_lanes_k() ? int64_t(CB) * 16 : int64_t(KB) * 16; }
  int64_t dw_row() const { return int64_t(T) * (wgrad_lanes_k() ? KB : CB) * 16 + 16; }
  int slices() const { return std::min(kWgradSlices, NP); }
  // Weight-gradient parallelisation, chosen from the shape alone so results never depend on the
  // thread count: by 16-row output blocks of dW when there are at least 4, else by fixed slices
  // of the image pairs with one FP32 partial each, summed in slice order.
  bool by_output_block() const { return KB >= 4; }
  // FP32 partial buffers of dW: one per slice, or one shared by the output blocks.
  int wgrad_partials() const { return by_output_block() ? 1 : slices(); }

  // FPROP: one phase, every output pixel. Output (oh, ow) reads input row oh * stride_h + r - pad_h
  // and column ow * stride_w + s - pad_w through tap (r, s); xq carries the padding as a zero border.
  void plan_forward() {
    Phase p;
    p.ni = OH;
    p.nj = OW;
    for (int r = 0; r < sh.R; ++r)
      for (int s2 = 0; s2 < sh.S; ++s2) {
        p.tap_src.push_back((int64_t(r) * Wp + s2) * 16);
        p.tap_wei.push_back(r * sh.S + s2);
        p.tap_dr.push_back(r - sh.pad_h);
        p.tap_dc.push_back(s2 - sh.pad_w);
      }
    fwd.phases.push_back(std::move(p));
    fwd.in_channels = sh.C;
    fwd.in_blocks = CB;
    fwd.out_blocks = KB;
    fwd.row_step = sh.stride_h;
    fwd.col_step = sh.stride_w;
    fwd.src_rows = sh.H;
    fwd.src_cols = sh.W;
    fwd.src_ib = int64_t(Hp) * Wp * 16;
    fwd.src_img = int64_t(CB) * fwd.src_ib;
    fwd.src_row = int64_t(sh.stride_h) * Wp * 16;
    fwd.src_col = int64_t(sh.stride_w) * 16;
    fwd.dst_ob = int64_t(OH) * OW * 16;
    fwd.dst_img = int64_t(KB) * fwd.dst_ob;
    fwd.dst_row = int64_t(OW) * 16;
    fwd.dst_col = 16;
  }

  // BPROP: the phases, their taps, and the zero border of dyq that makes every tap read in bounds.
  void plan_backward_data() {
    auto div_exact = [](int a, int b) { return a / b; };  // callers pass multiples of b
    int min_r = 0, max_r = OH - 1, min_c = 0, max_c = OW - 1;
    for (int ph = 0; ph < sh.stride_h; ++ph)
      for (int pw = 0; pw < sh.stride_w; ++pw) {
        Phase p;
        p.ni = ph < sh.H ? (sh.H - ph + sh.stride_h - 1) / sh.stride_h : 0;
        p.nj = pw < sh.W ? (sh.W - pw + sh.stride_w - 1) / sh.stride_w : 0;
        for (int r = 0; r < sh.R; ++r) {
          const int nr = ph + sh.pad_h - r;
          if (((nr % sh.stride_h) + sh.stride_h) % sh.stride_h) continue;
          for (int s2 = 0; s2 < sh.S; ++s2) {
            const int nc = pw + sh.pad_w - s2;
            if (((nc % sh.stride_w) + sh.stride_w) % sh.stride_w) continue;
            const int dr = div_exact(nr, sh.stride_h), dc = div_exact(nc, sh.stride_w);
            // dx(ph + i*sh) reads dy row i + dr for i in [0, ni)
            min_r = std::min(min_r, dr);
            max_r = std::max(max_r, p.ni - 1 + dr);
            min_c = std::min(min_c, dc);
            max_c = std::max(max_c, p.nj - 1 + dc);
            p.tap_src.push_back(dr);  // finished below, once the border is known
            p.tap_src.push_back(dc);
            p.tap_wei.push_back(r * sh.S + s2);
            p.tap_dr.push_back(dr);
            p.tap_dc.push_back(dc);
          }
        }
        p.dst_off = (int64_t(ph) * sh.W + pw) * 16;
        bwd.phases.push_back(std::move(p));
      }
    pt = -min_r;
    pl = -min_c;
    OHb = max_r + 1 + pt;
    OWb = max_c + 1 + pl;
    for (Phase& p : bwd.phases) {
      std::vector<int64_t> off;
      for (size_t t = 0; t < p.tap_wei.size(); ++t)
        off.push_back((int64_t(p.tap_src[2 * t] + pt) * OWb + (p.tap_src[2 * t + 1] + pl)) * 16);
      p.tap_src = std::move(off);
    }
    bwd.in_channels = sh.K;
    bwd.in_blocks = KB;
    bwd.out_blocks = CB;
    bwd.src_rows = OH;
    bwd.src_cols = OW;
    bwd.src_ib = int64_t(OHb) * OWb * 16;
    bwd.src_img = int64_t(KB) * bwd.src_ib;
    bwd.src_row = int64_t(OWb) * 16;
    bwd.src_col = 16;
    bwd.dst_ob = int64_t(sh.H) * sh.W * 16;
    bwd.dst_img = int64_t(CB) * bwd.dst_ob;
    bwd.dst_row = int64_t(sh.stride_h) * sh.W * 16;
    bwd.dst_col = int64_t(sh.stride_w) * 16;
  }

  // The rest of a pass's plan, from its phases' taps: source-row spans, image tiles or row calls,
  // edge columns, row groups and pixel blocks.
  void plan_pixel_pass(PixelPass& pp) {
    const int unit_steps = pairs_of(pp.in_channels);
    int64_t pos = 0, rows = 0;
    pp.image_tiles = true;
    for (const Phase& p : pp.phases) {
      pp.pos_begin.push_back(pos);
      pos += int64_t(p.ni) * p.nj;
      pp.image_tiles = pp.image_tiles && p.nj <= kImageTileMaxRow;
    }
    pp.pos_begin.push_back(pos);
    for (Phase& p : pp.phases) {
      if (!p.tap_dr.empty()) {
        p.dr_min = *std::min_element(p.tap_dr.begin(), p.tap_dr.end());
        p.dr_max = *std::max_element(p.tap_dr.begin(), p.tap_dr.end()) + 1;
      }
      // Edge columns, for passes that run row calls.
      if (!gemm && !pp.image_tiles && p.nj > 0)
        p.edges.plan(p.nj, p.ni, p.tap_src, p.tap_wei, pp.in_blocks, unit_steps, pp.out_blocks, [&](int j, int t) {
          const int c = j * pp.col_step + p.tap_dc[t];
          return c >= 0 && c < pp.src_cols;
        });
      pp.blocks.push_back(p.nj > 0 ? row_blocks(p.nj, p.edges) : RowBlocks{});
      pp.row_begin.push_back(rows);
      rows += int64_t(sh.N) * (p.ni + p.edges.calls());
      p.rows.plan(p.ni, static_cast<int>(p.tap_wei.size()), pp.in_blocks, unit_steps, [&](int i, int t) {
        const int r = i * pp.row_step + p.tap_dr[t];
        return r >= 0 && r < pp.src_rows;
      });
    }
    pp.row_begin.push_back(rows);
    pp.img_max.assign(size_t(sh.N) * pp.src_rows, 0);
  }

  simd::PixelKernelFn pixel_fn() const {
    return opt.verify ? &simd::ref::conv_s16_pixel : ctx.kernels().conv_s16_pixel.fn;
  }
  simd::PairKernelFn pair_fn() const {
    return opt.verify ? &simd::ref::conv_s16_pair : ctx.kernels().conv_s16_pair.fn;
  }

  // ---- weights ----------------------------------------------------------------------------
  void set_weights(const float* w, float known_max) {
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

  // Chain tables of every phase's row groups and edge columns, from the per-lane unit L1 norms
  // (lanes: the pass's output channels; units: (input block, tap)).
  void measure_chains(PixelPass& pp, const int32_t* unit_l1, int64_t pair_l1, int headroom) {
    for_each_tap_chain(pp, [&](TapChain& c, const int32_t* taps, int ntaps) {
      c.measure(ctx, unit_l1, pp.out_blocks * 16, int64_t(pp.in_blocks) * T, pp.in_blocks, T, taps, ntaps,
                measure_floor(headroom), pair_l1, opt.chain_override);
    });
  }
  // Calls f(chain, taps, ntaps) for every tap sequence of a pass: each phase's row groups (a
  // range of its taps) and edge columns (their own taps).
  template <class F>
  static void for_each_tap_chain(PixelPass& pp, F&& f) {
    for (Phase& p : pp.phases) {
      for (size_t g = 0; g < p.rows.range.size(); ++g) {
        const auto [t0, t1] = p.rows.range[g];
        f(p.rows.chain[g], p.tap_wei.data() + t0, t1 - t0);
      }
      for (EdgeColumns::Column& c : p.edges.cols) f(c.chain, c.tap_wei.data(), static_cast<int>(c.tap_wei.size()));
    }
  }

  // ---- activations and gradients -----------------------------------------------------------
  // Zeroes a row's border pixels (16 INT16 lanes each). Most borders are one pixel: a fixed-size
  // copy inlines to two stores, cheaper than a memset call per border of every row
  // (docs/design/kernels.md).
  static void zero_pixels(int16_t* p, int pixels) {
    if (pixels == 1)
      std::memset(p, 0, 16 * sizeof(int16_t));
    else if (pixels > 1)
      std::memset(p, 0, size_t(pixels) * 16 * sizeof(int16_t));
  }
  struct SpanSource {
    ConvInt16::InputSpanFn fn;
    void* producer;
  };
  // Quantizes a blocked FP32 tensor [N][B][h][w][16] into the interior of a padded int16 tensor
  // [N][B][hb][wb][16] at border (top, left), then builds the batch-pair copy [NP][B][h2][w2][16][2]
  // (with its own border) from it. known_max: max|src| measured by the tensor's producer (negative
  // or non-finite: measured here). The rows come from src, from src's column unfolding
  // (unfolded_src) or from a producer (spans).
  QuantStats quantize_blocked(const float* src, int B, int h, int w, int16_t* dst, int hb, int wb, int top, int left,
                              int16_t* pair, int h2, int w2, int top2, int left2, const QuantOptions& qo,
                              float known_max, int16_t* row_max, bool unfolded_src = false,
                              const SpanSource* spans = nullptr, int pair_step = 1) {
    // pair_step > 1: the batch-pair copy takes every pair_step-th row and pixel (from row and
    // pixel 0) of the plane copy dst; h2, w2 are then its subsampled sizes.
    // src is the tensor as the caller holds it: with unfolded_src, the caller's x, whose x' rows
    // are gathered as they are quantized.
    const size_t n = unfolded_src ? blocked_size(user.N, user.C, user.H, user.W) : size_t(sh.N) * B * h * w * 16;
    // Spans come from a producer that measured the maximum itself (quantize_input_spans checks it).
    const float m = detail::exponent_max_abs(ctx, src, n, known_max, qo.nonfinite, detail::TensorName{qo.name, name});
    const int e = dfp16_exponent(m, qo.headroom);
    const auto quant = ctx.kernels().quantize.fn;
    const auto inter = ctx.kernels().interleave.fn;
    std::atomic<uint64_t> saturated{0}, nonfinite{0};
    std::atomic<int32_t> max_q{0};
    const size_t row_len = size_t(w) * 16;
    // Plane (image n, block b) of src into dst, row by row, with its zero border (dst is workspace
    // that other operators wrote in between); each row is then handed to after_row(y). Planes are
    // the parallel unit: per-row work with a 64-bit division or two per row cost as much as
    // quantizing a 32-pixel row.
    // Runs quantize() on one row's elements (or a piece of them) and returns their largest |q|,
    // which cnt's running maximum also takes.
    auto largest_q = [](simd::QuantCounters& cnt, auto&& quantize) {
      const int32_t before = cnt.max_abs_q;
      cnt.max_abs_q = 0;
      quantize();
      const int32_t q = cnt.max_abs_q;
      cnt.max_abs_q = std::max(before, q);
      return q;
    };
    auto quant_plane = [&](int n, int b, simd::QuantCounters& cnt, auto&& after_row) {
      const size_t img_blk = size_t(n) * B + b;
      int16_t* plane = dst + img_blk * hb * wb * 16;
      std::memset(plane, 0, size_t(top) * wb * 16 * sizeof(int16_t));
      for (int y = 0; y < h; ++y) {
        const size_t r = img_blk * h + y;  // the row's index in src
        int16_t* d = plane + ((size_t(y) + top) * wb + left) * 16;
        const int32_t q = largest_q(cnt, [&] {
          if (spans)
            quant_span_row(*spans, n, b, y, w, d, e, qo, r * row_len, cnt);
          else if (unfolded_src)
            quant_unfolded_row(src, n, b, y, d, e, qo, r * row_len, cnt);
          else
            quant(src + r * row_len, d, row_len, e, qo.rounding, qo.seed, r * row_len, &cnt);
        });
        if (row_max) row_max[r] = static_cast<int16_t>(q);
        zero_pixels(d - size_t(left) * 16, left);
        zero_pixels(d + row_len, wb - left - w);
        after_row(y);
      }
      std::memset(plane + size_t(top + h) * wb * 16, 0, size_t(hb - top - h) * wb * 16 * sizeof(int16_t));
    };
    auto count = [&](const simd::QuantCounters& cnt) {
      saturated.fetch_add(cnt.saturated);
      nonfinite.fetch_add(cnt.nonfinite);
      atomic_max(max_q, cnt.max_abs_q);
    };
    if (!dst) {
      // The batch-pair layout alone (dy without a backward-data pass): row y of plane b of images
      // 2p and 2p+1 is quantized a piece at a time into an L1 tile per image and interleaved from
      // there. The elements, their stochastic indices and the row maxima are the plane path's.
      DFP_CHECK(pair && !spans && !unfolded_src, Status::internal,
                "convolution '" + name + "': pair-only quantization of a plain tensor expected");
      constexpr size_t kPiece = 2048;  // int16 per image and piece: 128 pixels
      ctx.parallel_for(int64_t(NP) * B, [&](int64_t t0, int64_t t1) {
        simd::QuantCounters cnt;
        alignas(64) int16_t tile[2][kPiece];
        for (int64_t t = t0; t < t1; ++t) {
          const int p = static_cast<int>(t / B), b = static_cast<int>(t % B);
          const int images = 2 * p + 1 < sh.N ? 2 : 1;
          for (int y = 0; y < h; ++y) {
            int32_t row_q[2] = {0, 0};
            int16_t* d = pair + (((size_t(p) * B + b) * h2 + y + top2) * w2 + left2) * 32;
            for (size_t o = 0; o < row_len; o += kPiece) {
              const size_t len = std::min(kPiece, row_len - o);
              for (int i = 0; i < images; ++i) {
                const size_t r = (size_t(2 * p + i) * B + b) * h + y;  // the row's index in src
                row_q[i] = std::max(row_q[i], largest_q(cnt, [&] {
                  quant(src + r * row_len + o, tile[i], len, e, qo.rounding, qo.seed, r * row_len + o, &cnt);
                }));
              }
              inter(tile[0], images == 2 ? tile[1] : nullptr, d + o * 2, len);
            }
            if (row_max)
              for (int i = 0; i < images; ++i) row_max[(size_t(2 * p + i) * B + b) * h + y] = static_cast<int16_t>(row_q[i]);
          }
        }
        count(cnt);
      });
    } else if (pair) {
      // With the batch-pair copy: plane b of images 2p and 2p+1 (absent for odd N: zeros), each
      // row interleaved once both images have it, while it is still in L1.
      ctx.parallel_for(int64_t(NP) * B, [&](int64_t t0, int64_t t1) {
        simd::QuantCounters cnt;
        for (int64_t t = t0; t < t1; ++t) {
          const int p = static_cast<int>(t / B), b = static_cast<int>(t % B);
          const bool second = 2 * p + 1 < sh.N;
          auto interleave_row = [&](int y) {
            if (y % pair_step) return;
            const int16_t* a = dst + (((size_t(2 * p) * B + b) * hb + y + top) * wb + left) * 16;
            const int16_t* a2 = second ? a + size_t(B) * hb * wb * 16 : nullptr;
            int16_t* d = pair + (((size_t(p) * B + b) * h2 + y / pair_step + top2) * w2 + left2) * 32;
            if (pair_step == 1) {
              inter(a, a2, d, row_len);
              return;
            }
            // Every pair_step-th pixel of both rows, gathered a piece at a time, then interleaved.
            constexpr int kPiecePixels = 64;
            alignas(64) int16_t g[2][kPiecePixels * 16];
            for (int x0 = 0; x0 < w2; x0 += kPiecePixels) {
              const int np = std::min(kPiecePixels, w2 - x0);
              for (int i = 0; i < np; ++i) {
                const size_t from = size_t(x0 + i) * pair_step * 16;
                std::memcpy(g[0] + i * 16, a + from, 32);
                if (a2) std::memcpy(g[1] + i * 16, a2 + from, 32);
              }
              inter(g[0], a2 ? g[1] : nullptr, d + size_t(x0) * 32, size_t(np) * 16);
            }
          };
          if (second) {
            quant_plane(2 * p, b, cnt, [](int) {});
            quant_plane(2 * p + 1, b, cnt, interleave_row);
          } else {
            quant_plane(2 * p, b, cnt, interleave_row);
          }
        }
        count(cnt);
      });
    } else {
      ctx.parallel_for(int64_t(sh.N) * B, [&](int64_t t0, int64_t t1) {
        simd::QuantCounters cnt;
        for (int64_t t = t0; t < t1; ++t) quant_plane(static_cast<int>(t / B), static_cast<int>(t % B), cnt, [](int) {});
        count(cnt);
      });
    }
    QuantStats st;
    st.exponent = e;
    st.max_abs = m;
    st.saturated = saturated.load();
    st.nonfinite = nonfinite.load();
    st.max_abs_int = max_q.load();
    if (st.nonfinite && qo.nonfinite == NonFinitePolicy::error)
      detail::fail_nonfinite(src, n, st.nonfinite, detail::TensorName{qo.name, name});
    return st;
  }

  // Quantizes block b of row y of image n of x (w pixels) into d, asking the producer for it a span
  // at a time into an L1 tile. index_base: the row's first element, for the stochastic stream.
  // Out of line: the per-row loop of the plain path stays small enough to inline.
  __attribute__((noinline)) void quant_span_row(const SpanSource& spans, int n, int b, int y, int w, int16_t* d, int e,
                                                const QuantOptions& qo, size_t index_base,
                                                simd::QuantCounters& cnt) const {
    constexpr int kSpan = ConvInt16::kInputSpanPixels;
    alignas(64) float tile[kSpan * 16];
    const auto quant = ctx.kernels().quantize.fn;
    for (int w0 = 0; w0 < w; w0 += kSpan) {
      const int np = std::min(kSpan, w - w0);
      spans.fn(spans.producer, n, b, y, w0, np, tile);
      quant(tile, d + size_t(w0) * 16, size_t(np) * 16, e, qo.rounding, qo.seed, index_base + size_t(w0) * 16, &cnt);
    }
  }

  // Quantizes block b of row y of image n of x' (see unfold) into d, gathering it from the
  // caller's x (one block: C < 16) a tile of pixels at a time. index_base: the row's first element
  // in x', for the stochastic stream.
  void quant_unfolded_row(const float* x, int n, int b, int y, int16_t* d, int e, const QuantOptions& qo,
                          size_t index_base, simd::QuantCounters& cnt) const {
    static constexpr float kZeros[16] = {};
    const int C = user.C, S = user.S, WD = CB * 16;  // WD: x' pixel width
    // Pixel-major x' (16 lanes of slack: the last copy runs past its pixel), and block b of it.
    alignas(64) float wide[kUnfoldPixels * kUnfoldBlocks * 16 + 16];
    alignas(64) float block[kUnfoldPixels * 16];
    const float* xrow = x + (size_t(n) * user.H + y) * user.W * 16;
    const auto quant = ctx.kernels().quantize.fn;
    for (int ow0 = 0; ow0 < sh.W; ow0 += kUnfoldPixels) {
      const int np = std::min(kUnfoldPixels, sh.W - ow0);
      for (int i = 0; i < np; ++i) {
        float* px = wide + size_t(i) * WD;
        const int w0 = (ow0 + i) * user.stride_w - user.pad_w;
        // 16 lanes from lane s * C: those past C (x's zero padding) are overwritten by the next
        // column's copy, and past S * C cleared below.
        for (int s = 0; s < S; ++s) {
          const int w = w0 + s;
          std::memcpy(px + s * C, w >= 0 && w < user.W ? xrow + size_t(w) * 16 : kZeros, 16 * sizeof(float));
        }
        std::fill(px + S * C, px + WD, 0.f);
      }
      const float* src = wide;
      if (WD > 16) {
        for (int i = 0; i < np; ++i) std::memcpy(block + i * 16, wide + size_t(i) * WD + b * 16, 16 * sizeof(float));
        src = block;
      }
      quant(src, d + size_t(ow0) * 16, size_t(np) * 16, e, qo.rounding, qo.seed, index_base + size_t(ow0) * 16, &cnt);
    }
  }

  // x -> its padded forward copy xq and batch-pair copy xp: from the caller's tensor (gathered
  // into its column unfolding where the layer unfolds), or from a producer's spans.
  void quantize_x(const float* x, float known_max, const SpanSource* spans) {
    ensure_workspace();
    stats.x = quantize_blocked(x, CB, sh.H, sh.W, xq, Hp, Wp, sh.pad_h, sh.pad_w, xp.data(), xp_h, xp_w, 0, 0,
                               step_x, known_max, x_row_max.data(), unfold && !spans, spans, xp_step);
    have_x = have_x_fwd = true;
    if (shared_workspace) have_dy = false;  // the workspace now holds x
  }
  void quantize_input(const float* x, float known_max) { quantize_x(x, known_max, nullptr); }

  void quantize_input_spans(ConvInt16::InputSpanFn fn, void* producer, float max_abs) {
    DFP_CHECK(!unfold, Status::invalid_argument,
              "convolution '" + name + "': quantize_input_spans() on a layer with unfolded columns (C = " +
                  std::to_string(user.C) + " < 16); use quantize_input()");
    DFP_CHECK(max_abs >= 0.f && std::isfinite(max_abs), Status::invalid_argument,
              "convolution '" + name + "': quantize_input_spans() needs a finite max_abs >= 0, got " +
                  std::to_string(max_abs));
    const SpanSource spans{fn, producer};
    quantize_x(nullptr, max_abs, &spans);
  }

  void quantize_grad_output(const float* dy, float known_max) {
    ensure_workspace();
    stats.dy = quantize_blocked(dy, KB, OH, OW, opt.input_gradient ? dyq : nullptr, OHb, OWb, pt, pl,
                                dy_whole_pairs ? dyp : nullptr, OH, OW, 0, 0, step_dy, known_max, dy_row_max.data());
    have_dy = true;
    if (shared_workspace) have_x_fwd = false;  // the workspace now holds dy
  }

  void require(bool ok, const char* pass, const char* what) const {
    DFP_CHECK(ok, Status::invalid_argument,
              "convolution '" + name + "': " + pass + " needs " + what + " first");
  }

  // ---- passes ------------------------------------------------------------------------------
  // Runs call(args, item) for items [0, n) on the context's threads. Each range of items works on
  // its own copy of base, whose overflow counter (verification mode only) is added into stats.
  template <class Args, class Call>
  void run_calls(int64_t n, const Args& base, Call&& call) {
    std::atomic<int64_t> events{0};
    ctx.parallel_for(n, [&](int64_t i0, int64_t i1) {
      int64_t ev = 0;
      Args a = base;
      a.overflow_events = opt.verify ? &ev : nullptr;
      for (int64_t i = i0; i < i1; ++i) call(a, i);
      events += ev;
    });
    stats.overflow_events += events.load();
  }

  // Points a kernel call at the taps of row group rg (a contiguous range of the pass's taps) and
  // that group's chain for sources bounded by `bound` (the largest |q| of the rows the call reads).
  static void use_row_group(simd::PixelKernelArgs& a, const RowTaps& rows, int rg, const int64_t* tap_src,
                            const int32_t* tap_wei, int32_t bound) {
    const auto [t0, t1] = rows.range[rg];
    a.tap_src = tap_src + t0;
    a.tap_wei = tap_wei + t0;
    a.ntaps = t1 - t0;
    a.chain = rows.chain[rg].for_bound(bound);
  }
  // img[n * rows + y] = the largest row_max[(n * blocks + b) * rows + y] over the blocks b: the
  // bound on every source of image n's row y.
  void image_row_max(const int16_t* row_max, int blocks, int rows, int16_t* img) const {
    ctx.parallel_for(sh.N, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        int16_t* d = img + n * rows;
        std::copy_n(row_max + n * blocks * rows, rows, d);
        for (int b = 1; b < blocks; ++b) {
          const int16_t* m = row_max + (n * blocks + b) * rows;
          for (int y = 0; y < rows; ++y) d[y] = std::max(d[y], m[y]);
        }
      }
    });
  }
  // Of n lines `stride` bytes apart, the most that share one L1 set (64 sets of 64-byte lines:
  // addresses 4 KiB apart share a set).
  static int same_set_lines(int64_t stride, int n) {
    const int64_t r = stride % 4096 / 64;  // set step per line
    const int64_t sets = r == 0 ? 1 : 64 / std::gcd(r, int64_t{64});
    return static_cast<int>((n + sets - 1) / sets);
  }
  // The largest of m[y] over y in [lo, hi) clipped to [0, rows).
  static int32_t span_max(const int16_t* m, int lo, int hi, int rows) {
    int32_t v = 0;
    for (int y = std::max(lo, 0); y < std::min(hi, rows); ++y) v = std::max<int32_t>(v, m[y]);
    return v;
  }
  // Sets every chain of a pass for sources of magnitude <= a (or the override); returns the
  // shortest over the sequences that have taps, which the pass reports.
  int choose_chains(PixelPass& pp, int64_t a) {
    int shortest = kMaxChain;
    for_each_tap_chain(pp, [&](TapChain& c, const int32_t*, int ntaps) {
      const int steps = c.choose(a, opt.chain_override);
      if (ntaps > 0) shortest = std::min(shortest, steps);
    });
    return shortest;
  }

  // Runs a pixel-kernel pass from src (quantized with src_stats, per-row maxima row_max
  // [N][in_blocks][src_rows]) through the packed weights wei into dst (added to it with
  // accumulate). Returns the pass's shortest chain, which it reports.
  int run_pixel_pass(PixelPass& pp, const int16_t* src, const QuantStats& src_stats, const int16_t* row_max,
                     const int16_t* wei, float* dst, bool accumulate, const char* pass) {
    const auto fn = pixel_fn();
    simd::PixelKernelArgs base{};
    base.chain = choose_chains(pp, src_stats.max_abs_int);
    base.scale = pow2(src_stats.exponent + stats.w.exponent, name, pass);
    base.accumulate = accumulate;
    // Phases that no tap reaches (a strided layer's backward data) only write zeros: where the
    // output is far larger than the cache, with non-temporal stores, instead of reading each line
    // for ownership first (see PixelKernelArgs::stream).
    const bool stream_zeros = !accumulate && reinterpret_cast<uintptr_t>(dst) % 64 == 0 &&
                              size_t(sh.N) * pp.dst_img * sizeof(float) > kStreamMinBytes;
    base.nib = pp.in_blocks;
    base.pairs = pairs_of(pp.in_channels);
    base.src_ib = pp.src_ib;
    base.wei_ib = int64_t(T) * 256;
    base.wei_ob = int64_t(pp.in_blocks) * base.wei_ib;
    const int64_t wei_group = 2 * base.wei_ob;  // weights of a group of two output blocks
    const int ngroups = (pp.out_blocks + 1) / 2;
    base.dst_ob = pp.dst_ob;
    image_row_max(row_max, pp.in_blocks, pp.src_rows, pp.img_max.data());
    // The largest |q| of the source rows that a phase's output rows [i0, i1) of image n read.
    auto bound = [&](const Phase& p, int n, int i0, int i1) {
      return span_max(pp.img_max.data() + size_t(n) * pp.src_rows, i0 * pp.row_step + p.dr_min,
                      (i1 - 1) * pp.row_step + p.dr_max, pp.src_rows);
    };
    if (pp.image_tiles) {
      // Tiles of images at one output position; items run output-block groups outermost, so a
      // thread's consecutive items share the group's weights (in L2: a fully connected layer
      // reads its weights once, not once per tile). 14 images, or 8 where 14 lines would crowd
      // L1 sets (kImageTileNarrow; a 512 -> 512 layer's 1 KiB rows, 4 lines per set, keep 14).
      // Figures: docs/design/kernels.md.
      base.src_pix = pp.src_img;
      base.dst_pix = pp.dst_img;
      const int wide = simd::max_pixels(2);
      const int per = same_set_lines(pp.src_img * int64_t(sizeof(int16_t)), wide) <= 4 &&
                              same_set_lines(pp.dst_img * int64_t(sizeof(float)), wide) <= 4
                          ? wide
                          : kImageTileNarrow;
      const int64_t nblk = (sh.N + per - 1) / per, per_group = pp.pos_begin.back() * nblk;
      run_calls(ngroups * per_group, base, [&](simd::PixelKernelArgs& a, int64_t r) {
        const int g = static_cast<int>(r / per_group);
        const int64_t pos = r % per_group / nblk;
        const int n0 = static_cast<int>(r % nblk) * per;
        size_t q = 0;
        while (pos >= pp.pos_begin[q + 1]) ++q;
        const Phase& p = pp.phases[q];
        a.stream = stream_zeros && p.tap_wei.empty();
        const int i = static_cast<int>((pos - pp.pos_begin[q]) / p.nj), j = static_cast<int>((pos - pp.pos_begin[q]) % p.nj);
        a.npix = std::min(per, sh.N - n0);
        int32_t tile_bound = 0;  // over the tile's images
        for (int n = n0; n < n0 + a.npix; ++n) tile_bound = std::max(tile_bound, bound(p, n, i, i + 1));
        use_row_group(a, p.rows, p.rows.row_group[i], p.tap_src.data(), p.tap_wei.data(), tile_bound);
        a.nob = std::min(2, pp.out_blocks - 2 * g);
        a.wei = wei + g * wei_group;
        a.src = src + n0 * pp.src_img + i * pp.src_row + j * pp.src_col;
        a.dst = dst + n0 * pp.dst_img + 2 * g * pp.dst_ob + p.dst_off + i * pp.dst_row + j * pp.dst_col;
        fn(a);
      });
      return base.chain;
    }
    // Per phase and image: the phase's ni row calls (the middle columns), then its edge-column calls.
    run_calls(pp.row_begin.back(), base, [&](simd::PixelKernelArgs& a, int64_t r) {
      size_t q = 0;  // the phase of item r
      while (r >= pp.row_begin[q + 1]) ++q;
      const Phase& p = pp.phases[q];
      a.stream = stream_zeros && p.tap_wei.empty();
      const int64_t local = r - pp.row_begin[q], per_image = p.ni + p.edges.calls();
      const int n = static_cast<int>(local / per_image);
      const int16_t* src_n = src + n * pp.src_img;
      float* dst_n = dst + n * pp.dst_img + p.dst_off;
      if (local % per_image >= p.ni) {  // an edge column's call: pixels down its rows
        int i0;
        const EdgeColumns::Column& col = p.edges.use(a, local % per_image - p.ni, i0);
        a.chain = col.chain.for_bound(bound(p, n, i0, i0 + a.npix));
        a.src_pix = pp.src_row;
        a.dst_pix = pp.dst_row;
        a.src = src_n + i0 * pp.src_row + col.col * pp.src_col;
        for (int g = 0; g < ngroups; ++g) {
          a.nob = std::min(2, pp.out_blocks - 2 * g);
          a.wei = wei + g * wei_group;
          a.dst = dst_n + 2 * g * pp.dst_ob + i0 * pp.dst_row + col.col * pp.dst_col;
          fn(a);
        }
        return;
      }
      const int i = static_cast<int>(local % per_image);
      a.src_pix = pp.src_col;
      a.dst_pix = pp.dst_col;
      use_row_group(a, p.rows, p.rows.row_group[i], p.tap_src.data(), p.tap_wei.data(), bound(p, n, i, i + 1));
      const int16_t* src_row = src_n + i * pp.src_row;
      float* dst_row = dst_n + i * pp.dst_row;
      for (int g = 0; g < ngroups; ++g) {
        a.nob = std::min(2, pp.out_blocks - 2 * g);
        const RowBlocks& rb = pp.blocks[q];
        const auto& bs = a.nob == 2 ? rb.start2 : rb.start1;
        const auto& bl = a.nob == 2 ? rb.len2 : rb.len1;
        a.wei = wei + g * wei_group;
        for (size_t b = 0; b < bs.size(); ++b) {
          a.npix = bl[b];
          a.src = src_row + bs[b] * pp.src_col;
          a.dst = dst_row + 2 * g * pp.dst_ob + bs[b] * pp.dst_col;
          fn(a);
        }
      }
    });
    return base.chain;
  }

  void forward(float* y) {
    require(have_w, "forward", "set_weights()");
    require(have_x_fwd, "forward", "quantize_input() (since the last quantize_grad_output())");
    stats.chain_fwd = run_pixel_pass(fwd, xq, stats.x, x_row_max.data(), wf.data(), y, false, "forward");
  }

  void backward_data(float* dx_out, bool accumulate) {
    DFP_CHECK(opt.input_gradient, Status::invalid_argument,
              "convolution '" + name + "': backward_data() called on an operator built with input_gradient = false");
    require(have_w, "backward_data", "set_weights()");
    require(have_dy, "backward_data", "quantize_grad_output()");
    // Unfolded: dx' is scratch, folded into dx_out below.
    stats.chain_bwd = run_pixel_pass(bwd, dyq, stats.dy, dy_row_max.data(), wb.data(),
                                     unfold ? dx_unfolded.data() : dx_out, accumulate && !unfold, "backward_data");
    if (unfold) fold_dx(dx_out, accumulate);
  }

  // dx[n][c][h][w] = sum over (ow, s) with ow * stride_w + s - pad_w = w of dx'[n][s * C + c][h][ow],
  // added in (ow, s) order: the inverse of the unfolding's gather (to what dx holds with accumulate).
  void fold_dx(float* dx, bool accumulate) const {
    const float* du = dx_unfolded.data();
    ctx.parallel_for(int64_t(user.N) * user.H, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t n = r / user.H, y = r % user.H;
        float* d = dx + size_t(r) * user.W * 16;  // C < 16: one block
        if (!accumulate) std::fill(d, d + size_t(user.W) * 16, 0.f);
        for (int ow = 0; ow < sh.W; ++ow)
          for (int s = 0; s < user.S; ++s) {
            const int w = ow * user.stride_w + s - user.pad_w;
            if (w < 0 || w >= user.W) continue;
            for (int c = 0; c < user.C; ++c) {
              const int cu = s * user.C + c;
              d[size_t(w) * 16 + c] += du[((size_t(n) * CB + cu / 16) * sh.H + y) * sh.W * 16 + size_t(ow) * 16 + cu % 16];
            }
          }
      }
    });
  }

  void backward_weights(float* dw) {
    require(have_x, "backward_weights", "quantize_input()");
    require(have_dy, "backward_weights", "quantize_grad_output()");
    const int chain = opt.chain_override ? opt.chain_override : pair_chain(stats.x.max_abs_int, stats.dy.max_abs_int);
    stats.chain_wgrad = chain;
    const float scale = pow2(stats.x.exponent + stats.dy.exponent, name, "backward_weights");
    const auto fn = pair_fn();
    const int ns = wgrad_partials();
    const int64_t dw_k = dw_row();
    const bool lanes_k = wgrad_lanes_k();
    const size_t part = size_t(dw_rows()) * dw_k;  // [K16][T][C16] (lanes_k: [C16][T][K16]), rows padded
    // Tiles of positions per call: enough to amortise the flush; their dy pairs fit a stack tile.
    const int chunk_cols = std::min(OW, kPairTile);
    const int chunk_rows = std::max(1, std::min(OH, kPairTile / chunk_cols));
    const auto inter = ctx.kernels().interleave.fn;
    // A fully connected layer with whole channel blocks whose tasks own whole dW rows writes dW
    // [K][C] in place: no partials to zero, and none to copy (for a large layer those are most of
    // the pass; docs/design/kernels.md).
    const bool direct = gemm && by_output_block() && sh.C % 16 == 0;
    simd::PairKernelArgs base{};
    base.dw_k = direct ? sh.C : dw_k;
    base.nk = 16;
    base.x_row = int64_t(x_row_step) * xp_w * 32;
    base.x_col = int64_t(x_col_step) * 32;
    base.dy_col = 32;
    base.chain = chain;
    // Partials are sums in units of the scale, which sum_into_dw applies: a flush into them is
    // then an add (scale 1), which leaves VPDPWSSD's pipes free, where an FMA would take them. The
    // same bits: every partial is an integer, and scaling by a power of two commutes with
    // rounding in the normal range (multiples of scale >= 2^-126). The direct (in-place) calls
    // scale themselves.
    base.scale = direct ? scale : 1.f;
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
            g.x = xp.data() + (size_t(p0) * CB + cb) * 32;
            g.dy = dyp_at(p0, kb, 0, 0);
            g.dw = acc + size_t(kb) * 16 * g.dw_k + size_t(cb) * 16;
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
      Step step{p0, 0, 0, kb0};
      do {
        const int p = step.p, oh0 = step.oh0, ow0 = step.ow0, kg = step.kg;
        const int oh1 = std::min(OH, oh0 + chunk_rows), ow1 = std::min(OW, ow0 + chunk_cols);
        const int cols = ow1 - ow0;
        const int kg1 = std::min(kb1, kg + kWgradKbGroup);
        a.dy_row = int64_t(dy_whole_pairs ? OW : cols) * 32;
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
        // both images (pair_chain's bound holds for any bounds on |x| and |dy|).
        const int n1 = std::min(sh.N, 2 * p + 2);
        int32_t dy_bound[kWgradKbGroup];
        for (int kb = kg; kb < kg1; ++kb) {
          dy_bound[kb - kg] = 0;
          for (int n = 2 * p; n < n1; ++n)
            dy_bound[kb - kg] = std::max(dy_bound[kb - kg],
                                         span_max(dy_row_max.data() + (size_t(n) * KB + kb) * OH, oh0, oh1, OH));
        }
        // x_row_max counts x's own rows even where xp keeps every xp_step-th one (strided 1x1): the
        // bound over all rows the window spans is conservative and leaves the chains, so the bits,
        // as they were; the gradient loop below indexes xp's rows (x_row_step, xp_h) instead.
        const int ih0 = oh0 * sh.stride_h - sh.pad_h, ih1 = (oh1 - 1) * sh.stride_h - sh.pad_h + sh.R;
        int chains[kWgradKbGroup];
        for (int cb = 0; cb < CB; ++cb) {
          int32_t x_bound = 0;
          for (int n = 2 * p; n < n1; ++n)
            x_bound = std::max(x_bound, span_max(x_row_max.data() + (size_t(n) * CB + cb) * sh.H, ih0, ih1, sh.H));
          for (int kb = kg; kb < kg1; ++kb)
            chains[kb - kg] = opt.chain_override ? chain : std::max(chain, pair_chain(x_bound, dy_bound[kb - kg]));
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
          if (cb + 1 < CB) {
            const int r0 = std::max(0, oh0 * x_row_step - sh.pad_h);
            const int r1 = std::min(xp_h, (oh1 - 1) * x_row_step - sh.pad_h + sh.R);
            next_x = reinterpret_cast<const char*>(xp.data() + ((size_t(p) * CB + cb + 1) * xp_h + r0) * xp_w * 32);
            const size_t lines = size_t(std::max(0, r1 - r0)) * xp_w;  // 64 bytes per position
            const size_t calls = size_t(T) * (kg1 - kg);
            x_share = (lines + calls - 1) / calls * 64;
            x_end = next_x + lines * 64;
          }
          for (int t = 0; t < T; ++t) {
            const int r = t / sh.S, s2 = t % sh.S;
            // This tap's positions inside the image (the rest read padding: zero products).
            const int lo_r = std::max(oh0, tap_rows[r].first), hi_r = std::min(oh1, tap_rows[r].second);
            const int lo_c = std::max(ow0, tap_cols[s2].first), hi_c = std::min(ow1, tap_cols[s2].second);
            if (lo_r >= hi_r || lo_c >= hi_c) continue;
            a.rows = hi_r - lo_r;
            a.cols = hi_c - lo_c;
            a.x = xp.data() + (((size_t(p) * CB + cb) * xp_h + size_t(lo_r) * x_row_step + r - sh.pad_h) * xp_w +
                               size_t(lo_c) * x_col_step + s2 - sh.pad_w) * 32;
            for (int kb = kg; kb < kg1; ++kb) {
              const int16_t* g = dy_whole_pairs ? dyp_at(p, kb, lo_r, lo_c)
                                                : tile[kb - kg] + (size_t(lo_r - oh0) * cols + (lo_c - ow0)) * 32;
              a.prefetch = next_x ? next_x + (size_t(t) * (kg1 - kg) + kb - kg) * x_share : nullptr;
              a.prefetch_end = next_x ? std::min(x_end, a.prefetch + x_share) : nullptr;
              if (lanes_k) {  // lanes over k from the dy tile, x's channel pairs broadcast
                simd::PairKernelArgs b = a;
                b.x = g;
                b.x_row = a.dy_row;
                b.x_col = 32;
                b.dy = a.x;
                b.dy_row = a.x_row;
                b.dy_col = a.x_col;
                b.nk = std::min(16, sh.C - cb * 16);
                b.chain = chains[kb - kg];
                b.dw = acc + size_t(cb) * 16 * dw_k + size_t(t) * KB * 16 + size_t(kb) * 16;
                ahead.issue(share);
                fn(b);
                continue;
              }
              a.dy = g;
              a.chain = chains[kb - kg];
              a.dw = acc + size_t(kb) * 16 * dw_k + size_t(t) * CB * 16 + size_t(cb) * 16;
              ahead.issue(share);
              fn(a);
            }
          }
        }
      } while (next(step));
    };
    if (by_output_block()) {
      // Enough output blocks to share out: each task owns 16 rows of dW over all positions, so
      // there are no partial sums to store or add (large layers would make them memory-bound).
      // Tasks are groups of output blocks that share x tiles (at most kWgradKbGroup, and small
      // enough that every thread gets one). Each kb sees the same calls in the same order however
      // the blocks are grouped, so the result does not depend on the thread count.
      const int group = std::max(1, std::min(kWgradKbGroup, (KB + ctx.threads() - 1) / ctx.threads()));
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
      });
    } else {
      run_calls(ns, base, [&](simd::PairKernelArgs& a, int64_t sl) {
        float* acc = dw_part + size_t(sl) * part;
        if (!gemm) std::memset(acc, 0, part * sizeof(float));
        reduce(a, acc, int(sl * NP / ns), int((sl + 1) * NP / ns), 0, KB);
      });
    }
    if (direct) return;
    // Sum the slices in a fixed order into dW [K][C][R][S], 16 channels at a time: each tap's
    // partials of a channel block are read in order (with taps innermost, a 512-channel 3x3
    // layer would read them 2 KiB apart) and the block's 16 * T results written in order, in L1.
    // partial(k, c, t) is a partial's offset and out(k, c, t) its place in dW; the common layout
    // spells both out, so its loop has no per-element branches or index map (through
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
                dw[out(k, c, t)] = v * scale;
              }
      });
    };
    const auto rows_k = [&](int64_t k, int c, int t) { return size_t(k) * dw_k + size_t(t) * CB * 16 + c; };  // [K16][T][C16]
    const auto mapped = [&](int64_t k, int c, int t) { return weight_index(int(k), c, t); };
    if (T == 1 && !lanes_k && !unfold) {
      // 1x1: a partial's row k is dW's row k (and padding), so whole rows go at a time, slice by
      // slice: the same additions in the same order as v above, in vector form (element by element
      // through the general loop costs large layers a visible share; docs/design/kernels.md).
      ctx.parallel_for(sh.K, [&](int64_t k0, int64_t k1) {
        for (int64_t k = k0; k < k1; ++k) {
          float* out = dw + size_t(k) * sh.C;
          const float* in = dw_part + size_t(k) * dw_k;
          std::memcpy(out, in, size_t(sh.C) * sizeof(float));
          for (int sl = 1; sl < ns; ++sl)
            for (int c = 0; c < sh.C; ++c) out[c] += in[size_t(sl) * part + c];
          for (int c = 0; c < sh.C; ++c) out[c] *= scale;
        }
      });
    } else if (lanes_k) {  // [C16][T][K16]
      sum_into_dw([&](int64_t k, int c, int t) { return size_t(c) * dw_k + size_t(t) * KB * 16 + size_t(k); }, mapped);
    } else if (unfold) {
      sum_into_dw(rows_k, mapped);
    } else {
      sum_into_dw(rows_k, [&](int64_t k, int c, int t) { return (size_t(k) * sh.C + c) * T + t; });
    }
  }
};

ConvInt16::ConvInt16(const Context& ctx, const ConvShape& shape, const DfpConvOptions& options, std::string name)
    : impl_(std::make_unique<Impl>(ctx, shape, options, std::move(name))) {}
ConvInt16::~ConvInt16() = default;
ConvInt16::ConvInt16(ConvInt16&&) noexcept = default;
ConvInt16& ConvInt16::operator=(ConvInt16&&) noexcept = default;

const ConvShape& ConvInt16::shape() const noexcept { return impl_->user; }
const ConvStats& ConvInt16::stats() const noexcept { return impl_->stats; }
const char* ConvInt16::kernel_name() const noexcept {
  return impl_->opt.verify ? "conv_s16s16f32__ref_int64_shadow" : impl_->ctx.kernels().conv_s16_pixel.name;
}
const char* ConvInt16::weight_gradient_kernel_name() const noexcept {
  return impl_->opt.verify ? "conv_s16s16f32__ref_int64_shadow" : impl_->ctx.kernels().conv_s16_pair.name;
}
void ConvInt16::set_step(uint64_t step) { impl_->set_step(step); }
void ConvInt16::set_weights(const float* w) { impl_->set_weights(w, -1.f); }
void ConvInt16::set_weights_with_max_abs(const float* w, float max_abs) { impl_->set_weights(w, max_abs); }
void ConvInt16::quantize_input(const float* x) { impl_->quantize_input(x, -1.f); }
void ConvInt16::quantize_input_with_max_abs(const float* x, float max_abs) { impl_->quantize_input(x, max_abs); }
bool ConvInt16::accepts_input_spans() const noexcept { return !impl_->unfold; }
void ConvInt16::quantize_input_spans(InputSpanFn fn, void* producer, float max_abs) {
  impl_->quantize_input_spans(fn, producer, max_abs);
}
void ConvInt16::quantize_grad_output_with_max_abs(const float* dy, float max_abs) {
  impl_->quantize_grad_output(dy, max_abs);
}
void ConvInt16::quantize_grad_output(const float* dy) { impl_->quantize_grad_output(dy, -1.f); }
void ConvInt16::forward(float* y) { impl_->forward(y); }
size_t ConvInt16::workspace_bytes() const noexcept { return impl_->workspace_bytes(); }
void ConvInt16::use_workspace(void* p) { impl_->use_workspace(p); }
void ConvInt16::backward_data(float* dx, bool accumulate) { impl_->backward_data(dx, accumulate); }
void ConvInt16::backward_weights(float* dw) { impl_->backward_weights(dw); }

}  // namespace dfp
