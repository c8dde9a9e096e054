// The INT16 convolution's plan, made once at construction: the shape the kernels run (with the
// column unfolding of few-channel layers), the phases of the forward and backward-data passes with
// their taps, row groups, edge columns and pixel blocks, and the layout of the workspace.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "src/ops/conv_int16/conv_int16_impl.hpp"

namespace dfp {

namespace {

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

}  // namespace

namespace conv_int16_detail {

template <class Valid>
void RowTaps::plan(int rows, int ntaps, int nib, int unit_steps, Valid valid) {
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

template <class Valid>
void EdgeColumns::plan(int ncols, int nrows, const std::vector<int64_t>& tap_src,
                       const std::vector<int32_t>& tap_wei, int nib, int unit_steps, int out_blocks, Valid valid) {
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

}  // namespace conv_int16_detail

ConvInt16::Impl::RowBlocks ConvInt16::Impl::row_blocks(int ncols, const EdgeColumns& edges) {
  RowBlocks rb;
  const int middle = ncols - edges.lo - edges.hi;
  split_blocks(middle, simd::max_pixels(1), rb.start1, rb.len1);
  split_blocks(middle, simd::max_pixels(2), rb.start2, rb.len2);
  for (int& s : rb.start1) s += edges.lo;
  for (int& s : rb.start2) s += edges.lo;
  return rb;
}

ConvInt16::Impl::Impl(const Context& c, const ConvShape& s, const DfpConvOptions& o, std::string n)
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
  for (const QuantOptions* q : {&opt.weights, &opt.activations, &opt.gradients}) {
    q->validate("convolution '" + name + "'");
    // A block's exponent changes along the reduction, which one INT32 chain's flush cannot follow:
    // the layers emulate Block DFP (FP32 sums of the rounded operands).
    DFP_CHECK(!granularity_block(q->granularity), Status::invalid_argument,
              "convolution '" + name + "': " + q->name + " granularity '" + granularity_name(q->granularity) +
                  "': the INT16 convolution takes tensor or slice (Block DFP runs as a layer's emulated operation)");
  }
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
  for (int r = 0; r < sh.R; ++r) tap_rows.push_back(valid_outputs(r, sh.pad_h, sh.stride_h, sh.H, OH));
  for (int c = 0; c < sh.S; ++c) tap_cols.push_back(valid_outputs(c, sh.pad_w, sh.stride_w, sh.W, OW));
  unit_l1_bytes = round64(size_t(KB) * 16 * CB * T * sizeof(int32_t));  // = CB*16 * KB*T too
  wf = AlignedBuffer<int16_t>(size_t(KB) * CB * T * 256);
  x_row_max.assign(size_t(sh.N) * CB * sh.H, 0);
  dy_row_max.assign(size_t(sh.N) * KB * OH, 0);
  x_slices = opt.activations.granularity == Granularity::slice;
  w_slices = opt.weights.granularity == Granularity::slice;
  dy_slices = opt.gradients.granularity == Granularity::slice;
  auto slicing = [&](Slicing& sl, int count, int blocks, bool scales) {
    sl.exp.assign(size_t(count), 0);
    if (scales) sl.scale.assign(size_t(count), 1.f);
    sl.planes.assign(size_t(sh.N) * blocks, 0);
  };
  const int wgrad_slices = wgrad_pairs() ? NP : 1;
  if (x_slices) {
    slicing(x_img, sh.N, CB, true);
    slicing(x_blk, wgrad_slices * CB, CB, false);
    x_fwd_row_max.assign(x_row_max.size(), 0);
  }
  if (dy_slices) {
    if (opt.input_gradient) slicing(dy_img, sh.N, KB, true);
    slicing(dy_blk, wgrad_slices * KB, KB, false);
    dyq_row_max.assign(dy_row_max.size(), 0);
  }
  x_compact = unfold && wgrad_lanes_k() && !x_slices && opt.activations.rounding != Rounding::stochastic &&
              !wgrad_across_pairs();
  if (x_compact) {
    xc_cols = std::max((OW - 1) * user.stride_w + user.S, user.pad_w + user.W);
    xp_col_stride = int64_t(user.stride_w) * user.C * 2;
    xp_block_stride = 32;
    xp_row_stride = int64_t(xc_cols) * user.C * 2;
    xp_pair_stride = int64_t(sh.H) * xp_row_stride;
  } else {
    xp_col_stride = 32;
    xp_row_stride = int64_t(xp_w) * 32;
    xp_block_stride = int64_t(xp_h) * xp_row_stride;
    xp_pair_stride = int64_t(CB) * xp_block_stride;
  }
  // Allocated once the Model has linked the layer (ensure_x_pairs). The pair kernels broadcast
  // only a block's nk channels; a compact copy's 32 elements of slack keep a whole-vector load of
  // the last position's block inside the buffer all the same.
  xp_elems = size_t(NP) * size_t(xp_pair_stride) + (x_compact ? 32 : 0);
  if (x_slices || dy_slices) {
    plane_max.assign(size_t(sh.N) * std::max(CB, KB), 0.f);
    if (gemm) wgrad_scale.assign(size_t(KB) * CB, 1.f);
  }
  // The weights region: wq, then (transposed wb) set_weights()'s packing of wb, then the unit L1
  // tables.
  const size_t wb_elems = size_t(CB) * KB * T * 256;
  wb_bytes = wb_transposed() ? round64(wb_elems * sizeof(int16_t)) : 0;
  if (!wb_transposed() && opt.input_gradient) wb = AlignedBuffer<int16_t>(wb_elems);
  wq_bytes = round64(size_t(sh.K) * sh.C * T * sizeof(int16_t)) + wb_bytes + 2 * unit_l1_bytes;
  if (w_slices) {
    w_out_exp.assign(size_t(sh.K), 0);
    w_out_scale.assign(size_t(KB) * 16, 1.f);
    if (opt.input_gradient) {
      w_in_exp.assign(size_t(sh.C), 0);
      w_in_scale.assign(size_t(CB) * 16, 1.f);
      w_in_max.assign(size_t(user.C), 0.f);
      w_user_exp.assign(size_t(user.C), 0);
    }
  }
  xq_bytes = round64(size_t(sh.N) * CB * Hp * Wp * 16 * sizeof(int16_t));
  dy_whole_pairs = gemm || !opt.input_gradient || dy_slices || wgrad_planes();
  dyq_bytes = opt.input_gradient ? round64(size_t(sh.N) * KB * OHb * OWb * 16 * sizeof(int16_t)) : 0;
  dyp_bytes = dy_whole_pairs ? round64(size_t(NP) * KB * OH * OW * 32 * sizeof(int16_t)) : 0;
  dyp_row_l1.assign(dy_whole_pairs && !gemm ? size_t(NP) * KB * OH : 0, 0);
  dyp_row_l1_prefix.assign(wgrad_planes() ? size_t(NP) * KB * (OH + 1) : 0, 0);
  dyp_pair_max.assign(wgrad_planes() ? size_t(NP) * KB : 0, 0);
  dw_part_bytes = round64(size_t(wgrad_partials()) * dw_rows() * dw_row() * sizeof(float));
  use_workspace(nullptr);
}

// nullptr: the operator owns its region, allocated on first use (not here: a Model builds all
// its operators before handing them the shared one).
void ConvInt16::Impl::use_workspace(void* shared) {
  std::byte* p = static_cast<std::byte*>(shared);
  DFP_CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0, Status::invalid_argument,
            "convolution '" + name + "': workspace must be 64-byte aligned");
  own_workspace = AlignedBuffer<std::byte>();
  xq = dyq = dyp = wq = xr = wbt = nullptr;  // owned: placed on first use
  dw_part = nullptr;
  if (p) place(p, p, p);  // shared: the three regions overlap
  if (p) ensure_x_pairs();  // a Model's layer: before its first step
  shared_workspace = p != nullptr;
  have_x_fwd = have_dy = false;
}

void ConvInt16::Impl::ensure_workspace() {
  if (dyq) return;
  own_workspace = AlignedBuffer<std::byte>(backward_bytes() + wq_bytes + xq_bytes);
  std::byte* p = own_workspace.data();
  place(p, p + backward_bytes(), p + backward_bytes() + wq_bytes);
}

// Points the transient buffers into their regions: dy's copies and the weight-gradient
// partials; the unpacked weights, with the unit L1 tables after them; x's forward copy.
void ConvInt16::Impl::place(std::byte* backward, std::byte* weights, std::byte* input) {
  dyq = reinterpret_cast<int16_t*>(backward);
  dyp = reinterpret_cast<int16_t*>(backward + dyq_bytes);
  dw_part = reinterpret_cast<float*>(backward + dyq_bytes + dyp_bytes);
  xr = again ? reinterpret_cast<int16_t*>(backward + dyq_bytes + dyp_bytes + dw_part_bytes) : nullptr;
  wbt = wb_bytes ? reinterpret_cast<int16_t*>(backward + dyq_bytes + dyp_bytes + dw_part_bytes + xr_bytes) : nullptr;
  wq = reinterpret_cast<int16_t*>(weights);
  wb_pack = wb_transposed() ? reinterpret_cast<int16_t*>(weights + wq_bytes - 2 * unit_l1_bytes - wb_bytes) : wb.data();
  unit_l1_f = reinterpret_cast<int32_t*>(weights + wq_bytes - 2 * unit_l1_bytes);
  unit_l1_b = reinterpret_cast<int32_t*>(weights + wq_bytes - unit_l1_bytes);
  xq = reinterpret_cast<int16_t*>(input);
}

// FPROP: one phase, every output pixel. Output (oh, ow) reads input row oh * stride_h + r - pad_h
// and column ow * stride_w + s - pad_w through tap (r, s); xq carries the padding as a zero border.
void ConvInt16::Impl::plan_forward() {
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
void ConvInt16::Impl::plan_backward_data() {
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
void ConvInt16::Impl::plan_pixel_pass(PixelPass& pp) {
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
  }
  // Short row calls (ResNet-18c's and VGG's 4x4 images: 4 pixels, 8 accumulators) read their
  // weights from L2 once per call: two or three images' calls of a row then run over one pass of
  // them, as many as the kernel's accumulators hold (PixelCallsFn). Each call keeps its own
  // chains and flushes, so the results are the same; a level that cannot run them in one pass
  // (the AVX2 levels, source strides other than 1 and 2) runs them one by one.
  int longest = 0;
  for (const RowBlocks& rb : pp.blocks)
    for (int len : rb.len2) longest = std::max(longest, len);
  pp.images_per_item = 1;
  if (!gemm && !pp.image_tiles && longest > 0 && sh.N > 1)
    pp.images_per_item = std::min(kMaxImagesPerItem, simd::kPixelAccumulators / (2 * longest));
  const int64_t groups = (sh.N + pp.images_per_item - 1) / pp.images_per_item;
  for (Phase& p : pp.phases) {
    pp.row_begin.push_back(rows);
    rows += groups * (p.ni + p.edges.calls());
    p.rows.plan(p.ni, static_cast<int>(p.tap_wei.size()), pp.in_blocks, unit_steps, [&](int i, int t) {
      const int r = i * pp.row_step + p.tap_dr[t];
      return r >= 0 && r < pp.src_rows;
    });
  }
  pp.row_begin.push_back(rows);
  pp.img_max.assign(size_t(sh.N) * pp.src_rows, 0);
}

}  // namespace dfp
