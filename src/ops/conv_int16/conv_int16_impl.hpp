// The INT16 (DFP16) convolution's private header: its Impl, whose plan (layouts, tiles, chain
// bounds, workspaces) the quantizers, the packers and the drivers of the three passes all read,
// and the helper types of that plan. The operator's files, by seam:
//   plan.cpp         the plan: shapes, column unfolding, phases and their taps, tiles, workspace
//   chains.cpp       INT32 chain tables: measured from the packed weights, chosen per pass
//   weights.cpp      weight quantization and packing into both kernel layouts
//   quantize.cpp     quantization of x and dy into their padded and batch-pair layouts
//   pixel_pass.cpp   the pixel-kernel passes: forward and backward-data
//   weight_grad.cpp  the pair-kernel pass: the weight gradient
//   conv_int16.cpp   dfp::ConvInt16, the public class over Impl
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
//                                  connected layer, of a layer without an input-gradient pass
//                                  (a network's first layer), which has no dyq, and of a layer
//                                  whose dyq holds an exponent per image (Granularity::slice)
//   wf   [KB][CB][R*S][8][16][2]   w, lanes = 16 output channels, pairs along C (FPROP)
//   wb   [CB][KB][R*S][8][16][2]   w, lanes = 16 input channels, pairs along K (BPROP); with
//                                  one exponent, wf's values, in the workspace (wbt)
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
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"
#include "src/core/aligned_buffer.hpp"
#include "src/core/atomic_max.hpp"

namespace dfp {

// The plan's helpers. The operator's files use them unqualified, as an anonymous namespace would
// let them; a named one keeps their symbols apart from other translation units' own.
namespace conv_int16_detail {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int kMaxChain = 1 << 24;  // "unbounded": longer than any reduction
constexpr int kPairTile = 128;      // weight-gradient positions per kernel call (dy pairs: 8 KiB)
constexpr int kWgradKbGroup = 2;    // weight-gradient output blocks sharing one x tile (4: slower, L1)
constexpr int kWgradSlices = 8;     // fixed, so results do not depend on the thread count
// Image pairs per weight-gradient call over planes: with 4, a call's x (one input block of each
// pair) stays in L1 across its taps and output blocks; 32 ran ResNet-18c's 4x4 and 8x8 weight
// gradients 10-25% slower (docs/design/kernels.md).
constexpr int kWgradPlanes = 4;
// Output images of at most this many positions (VGG's 2x2 layers on CIFAR) run the weight
// gradient's calls across image pairs (wgrad_across_pairs()): per pair, a 3x3 tap reads one to
// four positions, and a flush after each ran those layers' weight gradients at a quarter of
// their forward's rate. 4x4 images (16) ran slower across pairs than as planes (ResNet-18c's
// 512-channel layers by 15-30%; docs/design/kernels.md): ResNets' images keep their planes.
constexpr int kWgradAcrossPairs = 4;
constexpr int kAcrossPairsChunk = 32;  // image pairs per such call at most
// Such a call's operands, copied next to each other: x of one input block and dy of
// kWgradKbGroup output blocks for its pairs, within this many bytes (in L1).
constexpr size_t kAcrossPairsTileBytes = 24 << 10;
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
// Images whose row calls one pixel-pass item runs over one pass of the weights, at most
// (PixelPass::images_per_item).
constexpr int kMaxImagesPerItem = 3;
// Row calls take the weights of at most this many bytes of output-block groups per item (at least
// one group), so that they stay in L2 across a thread's items (under Zen 2's 512 KiB, the smallest
// L2 of the CPUs dfp runs on).
constexpr int64_t kPixelWeightBytes = int64_t(384) << 10;

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
  // Lanes run on the context's threads, each range through the kernel table's chain_window_max
  // (prefix sums over the unit sequence, a vector of lanes at a time). The maxima do not depend
  // on how the lanes are split.
  static constexpr size_t kMaxCandidates = simd::kChainWindowCandidates;  // 16 lengths, then x1.5 steps: enough for 10^6 units
  std::vector<int32_t> seq;  // the sequence's unit offsets, measure()'s (kept: set_weights allocates nothing again)
  void measure(const Context& ctx, const int32_t* unit_l1, int lanes, int64_t lane_stride, int nib, int T,
               const int32_t* taps, int ntaps, int64_t a_min);
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
  void plan(int rows, int ntaps, int nib, int unit_steps, Valid valid);
};

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
            int unit_steps, int out_blocks, Valid valid);
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

// 2^e for e in the normal FP32 range, from its bits: the weight gradient takes one per kernel call,
// where std::ldexp's library call showed in profiles.
inline float exp2i(int e) { return std::bit_cast<float>(static_cast<uint32_t>(e + 127) << 23); }

// 2^e for a pass's product scale; the message is built only on failure (no allocation per pass).
inline float pow2(int e, const std::string& name, const char* pass) {
  DFP_CHECK(e >= -126 && e <= 127, Status::numerical_error,
            "convolution '" + name + "' " + pass + ": product scale 2^" + std::to_string(e) +
                " is outside the normal FP32 range (operands too small or too large for DFP16 here)");
  return std::ldexp(1.f, e);
}

}  // namespace conv_int16_detail

using namespace conv_int16_detail;

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
  // A pixel-kernel pass: forward (x -> y, one phase) or backward-data (dy -> dx, a phase per
  // stride residue). They differ only in these numbers, so one planner and one driver run both.
  // Output (i, j) of a phase in image n reads its sources at src + n * src_img + i * src_row +
  // j * src_col (plus the tap offsets) and writes output block ob at dst + n * dst_img +
  // ob * dst_ob + dst_off + i * dst_row + j * dst_col.
  struct PixelPass {
    std::vector<Phase> phases;
    std::vector<RowBlocks> blocks;    // per phase
    // Row calls run images_per_item images at a time (the same row of each, its calls over one
    // pass of the weights: PixelCallsFn) where they are short; items are those groups of images.
    int images_per_item = 1;
    std::vector<int64_t> row_begin;   // prefix sums over phases of groups * (ni rows + edge-column calls)
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
  // forward pass; dyq, dyp and dw_part during the backward passes. Where x's producer computes x
  // again for the weight gradient (recompute_input_pairs), xp is not kept: backward_weights()
  // quantizes x's spans from `again` into xr, in the backward region after dw_part.
  AlignedBuffer<int16_t> xp, wf, wb;
  // Backward-data's weights wb hold the forward's wf transposed where both have one exponent
  // (Granularity::tensor): backward_data() writes them into the backward region (wbt, after xr)
  // from wf, so they do not persist between steps (a ResNet-50's 23.5 M weights: 47 MB); with
  // per-channel exponents (Granularity::slice) wb is its own quantization and persists.
  // set_weights() packs that layout once still, into the weights region (after wq, before the
  // unit L1 tables), for its norms: the chain tables are measured from them. An operator that
  // owns its workspace keeps both regions apart, so it holds wb twice; a Model's layers share one.
  int16_t *wbt = nullptr, *wb_pack = nullptr;
  size_t wb_bytes = 0;
  bool wb_transposed() const { return !w_slices && opt.input_gradient; }
  const int16_t* wb_data() const { return wb_transposed() ? wbt : wb.data(); }
  void transpose_wf_to_wb();
  ConvInt16::InputSpanFn again = nullptr;
  void* again_producer = nullptr;
  ConvInt16::InputPairSpanFn again_pairs = nullptr;
  int16_t* xr = nullptr;
  size_t xr_bytes = 0;
  bool have_xr = false;  // xr holds this backward's copy (since quantize_grad_output())
  const int16_t* x_pairs_data() const { return again ? xr : xp.data(); }
  // xp is allocated when first needed (a shared workspace given, or the first quantization), not
  // at construction: a Model links recompute_input_pairs() after building every layer, and its
  // peak memory would count copies it then frees.
  size_t xp_elems = 0;
  void ensure_x_pairs() {
    if (!again && xp.size() != xp_elems) xp = AlignedBuffer<int16_t>(xp_elems);
  }
  // xp holds every xp_step-th row and column of x (xp_h x xp_w pixels per plane): a 1x1 layer of
  // stride s > 1 without padding reads only those, and reading them in place from a full copy
  // costs its weight gradient half its rate (each pair load a new cache line, half of each line
  // and every other row unused; figures in docs/design/kernels.md).
  // x_row_step / x_col_step: rows and columns of xp between consecutive output positions (the
  // stride, or 1 where xp is subsampled); one indexing serves both forms.
  int xp_step = 1, xp_h = 0, xp_w = 0, x_row_step = 1, x_col_step = 1;
  // An unfolded layer's xp (x_compact) holds x's own rows, not their unfolding: per image pair
  // and row, the xc_cols columns of x with its column padding, C pairs each ([NP][H][xc_cols][C][2]).
  // Unfolded channel c' = s * C + c at output column ow is x's channel c at padded column
  // ow * stride_w + s: at ow * stride_w * C + c' pairs, so a block's 16 channels are 16
  // consecutive pairs and the output columns stride_w * C pairs apart. The weight gradient
  // broadcasts x's channels (lanes over K) and reads only those of a block (nk), so it takes this
  // layout as it is, without the unfolding's copies of each value (a 7x7 stem's: S / stride_w,
  // and 32 lanes for its 21 channels; 51 MB at 224x224, batch 32, against 10). Where the
  // unfolded copies of one value could differ (stochastic rounding draws for each), per-slice
  // exponents, lanes over C or the pairs-innermost order (which copies whole pair planes), xp is
  // the unfolded layout.
  bool x_compact = false;
  int xc_cols = 0;
  // xp's strides in int16 elements: image pair, input block, row (of xp), output column.
  int64_t xp_pair_stride = 0, xp_block_stride = 0, xp_row_stride = 0, xp_col_stride = 32;
  // xp at image pair p, block cb, xp row `row`, output column `col` (xp's column where not
  // compact).
  const int16_t* x_pairs_at(int p, int cb, int64_t row, int64_t col) const {
    return x_pairs_data() + size_t(p) * xp_pair_stride + size_t(cb) * xp_block_stride + row * xp_row_stride +
           col * xp_col_stride;
  }
  void compact_pair_row(const float* x, int p, int y, int e, const QuantOptions& qo);
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
  // The L1 norm (pair_row_l1) of each dyp row, [NP][KB][OH], for the weight gradient's chains:
  // written with dyp while its rows are in L1, where quantization writes dyp whole (not for a
  // fully connected layer, whose chains do not take them).
  std::vector<int32_t> dyp_row_l1;
  int32_t* dyp_row_l1_out() { return dyp_row_l1.empty() ? nullptr : dyp_row_l1.data(); }
  // The weight gradient's calls over planes (wgrad_planes()): dyp_row_l1's prefix sums per image
  // pair and output block, [NP][KB][OH + 1], so a call's chain joins (join_planes) take the sum
  // over any rows in one subtraction. Summed row by row in every call, for every input block and
  // tap, the calls' planning took 10.6% of perf's samples of ResNet-18c's 512-channel 4x4 weight
  // gradient (`conv_bench`), 8.6% with the sums once per pass (docs/measurements.md).
  std::vector<int64_t> dyp_row_l1_prefix;
  // And each image pair's largest |q| per output block (dy_max over its whole plane), [NP][KB]:
  // the calls' chain bound, needed once per input block.
  std::vector<int32_t> dyp_pair_max;
  std::vector<int16_t> x_row_max, dy_row_max;  // max|q| of each quantized row: [N][CB][H], [N][KB][OH]
  // Granularity::slice (DfpConvOptions): an exponent may vary along what a pass does not reduce
  // over, and its kernels' flush takes per-lane or per-image scales. Forward: x per image (xq,
  // with its own row maxima; xp, which the weight gradient reduces over images with, keeps one
  // exponent) and w per output channel (wf; wb keeps one exponent).
  // stats.x and stats.w are the forward operands' quantizations; x_pairs and w_bwd those of xp and
  // wb (the same with one exponent).
  // Backward-data: dy per image (dyq) and w per input channel (wb, lanes of the kernels'
  // channels: an unfolded layer's c' = s * C + c takes channel c's). Weight gradient: x per
  // image pair and input channel block of 16, dy per image pair and output channel block (xp,
  // dyp, which dy then always has): a call reads one image pair and one block of each, so it
  // flushes its INT32 sums with that pair's scale. A fully connected layer reduces over all its
  // pairs in one call, so its blocks keep one exponent over the batch (wgrad_pairs() false), and
  // its partial sums take the block pair's scale where they are summed into dW. An unfolded x's
  // blocks gather columns of one image: its pairs' exponents are its images'.
  // stats.x, stats.w and stats.dy are the quantizations the pixel passes read; x_pairs, dy_pairs
  // those of xp and dyp (the same with one exponent), w_bwd wb's.
  bool x_slices = false, w_slices = false, dy_slices = false;
  struct Slicing {
    std::vector<int> exp;       // per slice (the weight gradient's: [pairs][blocks])
    std::vector<float> scale;   // 2^exp (per image only)
    std::vector<int> planes;    // exp of plane (n, b): [N][blocks]
  };
  Slicing x_img, x_blk, dy_img, dy_blk;
  struct SliceExponents {
    float max_abs = 0.f;
    int img_hi = 0, img_lo = 0, blk_hi = 0, blk_lo = 0;
  };
  std::vector<float> plane_max;                 // max|x| or max|dy| per plane, [N][blocks]
  std::vector<float> wgrad_scale;               // a fully connected backward_weights's per block pair, [KB][CB]
  std::vector<int> w_out_exp, w_in_exp;         // [K], [kernel C]
  std::vector<float> w_out_scale, w_in_scale;   // 2^e; lanes: [blocks * 16], 1 past
  std::vector<int16_t> x_fwd_row_max, dyq_row_max;  // xq's and dyq's row maxima with per-image exponents
  std::vector<float> w_in_max;                  // max|w| per input channel of the caller's weights, [C]
  std::vector<int> w_user_exp;                  // their exponents, [C]
  QuantStats x_pairs, dy_pairs, w_bwd;
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
    constexpr uint64_t kQuantizationStreams = 0x632be59bd9b4e019ULL;
    step_w.seed = step_seed(opt.weights.seed, step, kQuantizationStreams);
    step_x.seed = step_seed(opt.activations.seed, step, kQuantizationStreams);
    step_dy.seed = step_seed(opt.gradients.seed, step, kQuantizationStreams);
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
  size_t backward_bytes() const { return dyq_bytes + dyp_bytes + dw_part_bytes + xr_bytes + wb_bytes; }
  // A shared workspace holds x's forward copy, dy's copies and the unpacked weights in the same
  // bytes; an owned one keeps them apart, so a standalone operator may run its passes in any order.
  size_t workspace_bytes() const { return std::max({xq_bytes, backward_bytes(), wq_bytes}); }

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
  // Granularity::slice: the weight gradient's exponents (x_blk, dy_blk) per image pair, as each
  // call reads one pair; a fully connected layer's call reduces over all pairs: one over the batch.
  bool wgrad_pairs() const { return !gemm; }
  // The weight gradient runs the image pairs as the pair kernel's planes (kWgradPlanes per call)
  // where one tile holds a whole output image and the pairs share one exponent: a call per pair
  // read and wrote its 16 dW rows for a few positions (a 4x4 layer: 16), and ResNet-18c's 4x4
  // layers ran their weight gradient at 28% of the INT16 peak. dy is then quantized into whole
  // pairs (dyp), which the calls read in place. Each pair keeps its own positions and chains; a
  // pair that one chain covers continues the chain of the pair before it in the call where their
  // sums together fit INT32 (join_planes in weight_grad.cpp), and flushes with it.
  bool wgrad_planes() const {
    return !gemm && !x_slices && !dy_slices && OW <= kPairTile && OH <= kPairTile / OW;
  }
  // Images so small that a pair's positions cannot amortise a flush: a call per tap, output row
  // and output block runs the row's positions of every image pair of the task, the pairs
  // innermost, with one INT32 chain across them bounded by the largest |q| of all the pairs it
  // reads (as a fully connected layer's call does). The pairs share one exponent (as for planes),
  // so their sums are in one unit; the flush points, and so the rounding, are those of this
  // order at every kernel level.
  bool wgrad_across_pairs() const {
    return wgrad_planes() && OH * OW <= kWgradAcrossPairs && across_pairs_chunk() > 0;
  }
  // Image pairs per call across pairs: as many as kAcrossPairsTileBytes holds, at most
  // kAcrossPairsChunk.
  int across_pairs_chunk() const {
    const size_t pair_bytes = (size_t(xp_h) * xp_w + size_t(kWgradKbGroup) * OH * OW) * 32 * sizeof(int16_t);
    return int(std::min<size_t>(kAcrossPairsChunk, kAcrossPairsTileBytes / pair_bytes));
  }

  simd::PixelKernelFn pixel_fn() const {
    return opt.verify ? &simd::ref::conv_s16_pixel : ctx.kernels().conv_s16_pixel.fn;
  }
  simd::PixelCallsFn pixel_calls_fn() const {
    return opt.verify ? &simd::ref::conv_s16_pixel_calls : ctx.kernels().conv_s16_pixel_calls.fn;
  }
  simd::PairKernelFn pair_fn() const {
    return opt.verify ? &simd::ref::conv_s16_pair : ctx.kernels().conv_s16_pair.fn;
  }
  void require(bool ok, const char* pass, const char* what) const {
    DFP_CHECK(ok, Status::invalid_argument,
              "convolution '" + name + "': " + pass + " needs " + what + " first");
  }

  // ---- plan (plan.cpp) ----------------------------------------------------------------------
  Impl(const Context& c, const ConvShape& s, const DfpConvOptions& o, std::string n);
  static RowBlocks row_blocks(int ncols, const EdgeColumns& edges);
  void use_workspace(void* shared);
  void ensure_workspace();
  void place(std::byte* backward, std::byte* weights, std::byte* input);
  void plan_forward();
  void plan_backward_data();
  void plan_pixel_pass(PixelPass& pp);

  // ---- weights (weights.cpp) and their chains (chains.cpp) ----------------------------------
  void set_weights(const float* w, float known_max);
  void pack_weights(bool fwd_layout, bool bwd_layout);
  void measure_chains(PixelPass& pp, const int32_t* unit_l1, int64_t pair_l1, int headroom);
  int choose_chains(PixelPass& pp, int64_t a);
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

  // ---- activations and gradients (quantize.cpp) ---------------------------------------------
  struct SpanSource {
    ConvInt16::InputSpanFn fn;
    void* producer;
    ConvInt16::InputPairSpanFn pairs = nullptr;  // the pair-only path's quantized spans, where offered
    ConvInt16::InputQuantSpanFn quantized = nullptr;  // the plane path's, where offered
  };
  // Zeroes a row's border pixels (16 INT16 lanes each). Most borders are one pixel: a fixed-size
  // copy inlines to two stores, cheaper than a memset call per border of every row
  // (docs/design/kernels.md).
  static void zero_pixels(int16_t* p, int pixels) {
    if (pixels == 1)
      std::memset(p, 0, 16 * sizeof(int16_t));
    else if (pixels > 1)
      std::memset(p, 0, size_t(pixels) * 16 * sizeof(int16_t));
  }
  // plane_exp: an exponent per plane (image n, block b: [N][B]) instead of the tensor's; the two
  // images of a batch pair share it. pair_row_l1 (the pair-only form, dst null): the L1 norm of
  // each row of the pair copy, [NP][B][h2], from pair_row_l1 of the kernel table.
  QuantStats quantize_blocked(const float* src, int B, int h, int w, int16_t* dst, int hb, int wb, int top, int left,
                              int16_t* pair, int h2, int w2, int top2, int left2, const QuantOptions& qo,
                              float known_max, int16_t* row_max, bool unfolded_src = false,
                              const SpanSource* spans = nullptr, int pair_step = 1, const int* plane_exp = nullptr,
                              int32_t* pair_row_l1 = nullptr);
  // Granularity::slice: src quantized for both of its slicings in one pass over it: into the
  // padded dst [N][B][hb][wb][16] (border top, left) with plane exponents dst_exp and row maxima
  // dst_row_max, and into the batch-pair copy [NP][B][h2][w2][16][2] with pair_exp (every
  // pair_step-th row and pixel; row maxima pair_row_max over whole rows, as quantize_blocked's).
  // The rows come from src, from src's column unfolding (unfolded_src: gathered once for both
  // copies) or from a producer (spans). The bits of quantize_blocked run once per slicing.
  // pair_row_l1 (pair_step 1): the pair copy's row norms, as quantize_blocked's. Returns the two
  // copies' figures.
  std::pair<QuantStats, QuantStats> quantize_dual(const float* src, int B, int h, int w, int16_t* dst, int hb, int wb,
                                                  int top, int left, const int* dst_exp, int16_t* dst_row_max,
                                                  int16_t* pair, int h2, int w2, int pair_step, const int* pair_exp,
                                                  int16_t* pair_row_max, const QuantOptions& qo, float max_abs,
                                                  bool unfolded_src, const SpanSource* spans,
                                                  int32_t* pair_row_l1 = nullptr);
  __attribute__((noinline)) void quant_span_row(const SpanSource& spans, int n, int b, int y, int w, int16_t* d, int e,
                                                const QuantOptions& qo, size_t index_base,
                                                simd::QuantCounters& cnt) const;
  void quant_unfolded_row(const float* x, int n, int b, int y, int16_t* d, int e, const QuantOptions& qo,
                          size_t index_base, simd::QuantCounters& cnt) const;
  // Block b of pixels [ow0, ow0 + np) of row y of image n of x' (see unfold), np <= kUnfoldPixels,
  // gathered from the caller's x into block (np * 16 floats); returns block.
  const float* gather_unfolded(const float* x, int n, int b, int y, int ow0, int np, float* block) const;
  void quantize_x(const float* x, float known_max, const float* known_planes, const SpanSource* spans);
  void quantize_input(const float* x, float known_max, const float* known_planes);
  void quantize_input_spans(ConvInt16::InputSpanFn fn, void* producer, float max_abs, const float* known_planes,
                            ConvInt16::InputQuantSpanFn quantized);
  void quantize_grad_output(const float* dy, float known_max, const float* known_planes);
  bool recompute_input_pairs(ConvInt16::InputSpanFn fn, void* producer, ConvInt16::InputPairSpanFn pairs);
  bool quantize_grad_output_spans(ConvInt16::GradSpanFn fn, void* producer, float estimate,
                                  ConvInt16::GradQuantSpanFn quantized);
  bool recompute_x_pairs();  // xr from `again`, at the forward's exponent (backward_weights)

  // ---- passes (pixel_pass.cpp, weight_grad.cpp) ---------------------------------------------
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
  // The largest of m[y] over y in [lo, hi) clipped to [0, rows).
  static int32_t span_max(const int16_t* m, int lo, int hi, int rows) {
    int32_t v = 0;
    for (int y = std::max(lo, 0); y < std::min(hi, rows); ++y) v = std::max<int32_t>(v, m[y]);
    return v;
  }
  void image_row_max(const int16_t* row_max, int blocks, int rows, int16_t* img) const;
  static int same_set_lines(int64_t stride, int n);
  // The scales of a pixel pass: 2^(src exponent + weight exponent), with per-image source scales
  // (image, [N]) and per-output-lane weight scales (lane, [out_blocks * 16]) where the operand
  // has them (null: its stats' one exponent).
  struct PassScales {
    int src_exponent = 0, wei_exponent = 0;
    const float* image = nullptr;
    const float* lane = nullptr;
    const int* image_exp = nullptr;  // [N], with image
    const int* lane_exp = nullptr;   // [out channels], with lane
    int lanes = 0;
  };
  // A forward pass's output quantized as it is made (forward_quantized): each call writes its FP32
  // output into a tile on the stack (kOutTilePixels pixels per output block, one tile per image
  // of the call) instead of y, which is then quantized into out.y while it is in L1.
  static constexpr int kOutTilePixels = simd::kPixelAccumulators;
  struct OutputQuantizer {
    ConvInt16::QuantizedOutput* out = nullptr;
    std::atomic<uint64_t> saturated{0}, nonfinite{0};
    std::atomic<int32_t> max_q{0};
    // The tile of one call of output-block group g, nob blocks of npix pixels, tile_ob floats
    // apart: pixel k of block b goes to element elem + (2g + b) * dst_ob + k * step of y.
    void take(const Context& ctx, float* tile, int64_t tile_ob, int nob, int g, int64_t dst_ob, int64_t elem,
              int64_t step, int npix);
  };
  int run_pixel_pass(PixelPass& pp, const int16_t* src, const QuantStats& src_stats, const int16_t* row_max,
                     const int16_t* wei, float* dst, bool accumulate, const char* pass, const PassScales& sc,
                     OutputQuantizer* quantized = nullptr);
  void check_scales(const PassScales& sc, const char* pass) const;
  // A pass's scales: per image where `images` is given, per lane where `lane_scale` is.
  PassScales pass_scales(int src_exponent, int wei_exponent, const Slicing* images,
                         const std::vector<float>* lane_scale, const std::vector<int>& lane_exp, int lanes) const;
  void quantize_x_slices(const float* x, const float* known_planes, const SpanSource* spans);
  void quantize_dy_slices(const float* dy, const float* known_planes);
  QuantStats quantize_dy_blocked(const float* dy, float known_max, const SpanSource* spans);
  void dy_quantized();  // the flags after any quantization of dy
  SliceExponents slice_exponents(const float* src, int B, size_t plane_len, const float* known_planes,
                                 const SpanSource* spans, bool per_block,
                                 int headroom, Slicing& img, Slicing& blk);
  void quantize_w_in_channels(const float* w);
  void forward(float* y, ConvInt16::QuantizedOutput* quantized);
  void backward_data(float* dx_out, bool accumulate);
  void fold_dx(float* dx, bool accumulate) const;
  void backward_weights(float* dw);
};

}  // namespace dfp
