// The INT16 convolution's pixel-kernel passes, forward (x -> y) and backward-data (dy -> dx): one
// driver runs the planned phases as row calls, edge-column calls or image tiles, each call with the
// chain of the rows it reads; an unfolded layer's dx is folded back from dx'.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>

#include "src/ops/conv_int16/conv_int16_impl.hpp"

namespace dfp {

// img[n * rows + y] = the largest row_max[(n * blocks + b) * rows + y] over the blocks b: the
// bound on every source of image n's row y.
void ConvInt16::Impl::image_row_max(const int16_t* row_max, int blocks, int rows, int16_t* img) const {
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
int ConvInt16::Impl::same_set_lines(int64_t stride, int n) {
  const int64_t r = stride % 4096 / 64;  // set step per line
  const int64_t sets = r == 0 ? 1 : 64 / std::gcd(r, int64_t{64});
  return static_cast<int>((n + sets - 1) / sets);
}

// Runs a pixel-kernel pass from src (quantized with src_stats, per-row maxima row_max
// [N][in_blocks][src_rows]) through the packed weights wei into dst (added to it with
// accumulate). Returns the pass's shortest chain, which it reports.
// Every scale a pass with per-image or per-lane exponents forms, 2^(e_src(n) + e_wei(lane)), and
// each factor, must be normal FP32 for the kernels' products of scales to be exact.
void ConvInt16::Impl::check_scales(const PassScales& sc, const char* pass) const {
  auto range = [](const int* e, int n, int one) {
    if (!e) return std::pair<int, int>{one, one};
    const auto [lo, hi] = std::minmax_element(e, e + n);
    return std::pair<int, int>{*lo, *hi};
  };
  const auto [slo, shi] = range(sc.image_exp, sh.N, sc.src_exponent);
  const auto [wlo, whi] = range(sc.lane_exp, sc.lanes, sc.wei_exponent);
  for (int e : {slo, shi, wlo, whi, slo + wlo, shi + whi}) pow2(e, name, pass);
}

void ConvInt16::Impl::OutputQuantizer::take(const Context& ctx, float* tile, int64_t tile_ob, int nob, int g,
                                             int64_t dst_ob, int64_t elem, int64_t step, int npix) {
  DFP_CHECK(npix <= kOutTilePixels, Status::internal, "forward_quantized: a call of more pixels than its tile");
  const simd::KernelTable& k = ctx.kernels();
  simd::QuantCounters cnt;
  for (int b = 0; b < nob; ++b) {
    float* t = tile + b * tile_ob;
    const int64_t e = elem + (2 * g + b) * dst_ob;
    if (out->bias) {  // as add_bias: y + b, one rounding
      const float* lane = out->bias + (2 * g + b) * 16;
      for (int p = 0; p < npix; ++p)
        for (int l = 0; l < 16; ++l) t[p * 16 + l] += lane[l];
    }
    if (step == 16) {
      k.quantize.fn(t, out->y + e, size_t(npix) * 16, out->exponent, out->rounding, out->seed, uint64_t(e), &cnt);
    } else if (out->rounding != Rounding::stochastic) {  // no stream: the whole tile in one call
      alignas(64) int16_t q[kOutTilePixels * 16];
      k.quantize.fn(t, q, size_t(npix) * 16, out->exponent, out->rounding, 0, 0, &cnt);
      for (int p = 0; p < npix; ++p) std::memcpy(out->y + e + p * step, q + p * 16, 16 * sizeof(int16_t));
    } else {
      for (int p = 0; p < npix; ++p)
        k.quantize.fn(t + p * 16, out->y + e + p * step, 16, out->exponent, out->rounding, out->seed,
                      uint64_t(e + p * step), &cnt);
    }
  }
  atomic_add_nonzero(saturated, cnt.saturated);
  atomic_add_nonzero(nonfinite, cnt.nonfinite);
  atomic_max(max_q, cnt.max_abs_q);
}

int ConvInt16::Impl::run_pixel_pass(PixelPass& pp, const int16_t* src, const QuantStats& src_stats,
                                    const int16_t* row_max, const int16_t* wei, float* dst, bool accumulate,
                                    const char* pass, const PassScales& sc, OutputQuantizer* quantized) {
  const auto fn = pixel_fn();
  const auto calls_fn = pixel_calls_fn();
  simd::PixelKernelArgs base{};
  base.chain = choose_chains(pp, src_stats.max_abs_int);
  if (sc.image || sc.lane) check_scales(sc, pass);
  // With per-image or per-lane scales the kernels multiply them onto base.scale (the other
  // operand's 2^e, or 1).
  base.scale = pow2((sc.image ? 0 : sc.src_exponent) + (sc.lane ? 0 : sc.wei_exponent), name, pass);
  base.accumulate = accumulate;
  // Phases that no tap reaches (a strided layer's backward data) only write zeros: where the
  // output is far larger than the cache, with non-temporal stores, instead of reading each line
  // for ownership first (see PixelKernelArgs::stream).
  const bool stream_zeros = dst && !accumulate && reinterpret_cast<uintptr_t>(dst) % 64 == 0 &&
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
  // Each call's output goes to dst at element off (its image, phase and first position) plus its
  // group's blocks; under forward_quantized, where there is no dst, to a tile, [block][pixel][16],
  // which `quantized` then takes with that same off. A pass is one or the other throughout.
  constexpr int64_t tile_ob = int64_t(kOutTilePixels) * 16;
  auto to_dst = [&](simd::PixelKernelArgs& c, int g, int64_t off, float* tile) {
    if (!quantized) {
      c.dst = dst + off + 2 * g * pp.dst_ob;
      return;
    }
    c.dst = tile;
    c.dst_pix = 16;
    c.dst_ob = tile_ob;
  };
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
      if (sc.image) a.pixel_scale = sc.image + n0;
      if (sc.lane) a.lane_scale = sc.lane + 2 * g * 16;
      a.src = src + n0 * pp.src_img + i * pp.src_row + j * pp.src_col;
      const int64_t off = n0 * pp.dst_img + p.dst_off + i * pp.dst_row + j * pp.dst_col;
      alignas(64) float tile[2 * tile_ob];
      to_dst(a, g, off, tile);
      fn(a);
      // The call's pixels are images, pp.dst_img apart.
      if (quantized) quantized->take(ctx, tile, tile_ob, a.nob, g, pp.dst_ob, off, pp.dst_img, a.npix);
    });
    return base.chain;
  }
  // Per phase and image (or group of images_per_item): the phase's ni row calls (the middle
  // columns), then its edge-column calls, each for output-block groups [g0, g1). Where the weights
  // are larger than kPixelWeightBytes, items take as many groups as fit in it, with the groups
  // outermost: a thread's consecutive items then share those groups' weights in L2 over all
  // images. With every group in each item,
  // ResNet-18c's 512-channel 4x4 layer (4.7 MB of weights, 4 output rows per image) read its
  // weights from L3 once per row and ran its forward at 40% of the INT16 peak, slower than
  // oneDNN's FP32 (docs/design/kernels.md).
  const int64_t group_bytes = wei_group * int64_t(sizeof(int16_t));
  const int span = int(std::clamp<int64_t>(kPixelWeightBytes / group_bytes, 1, ngroups));
  const int64_t row_items = pp.row_begin.back();
  run_calls(row_items * ((ngroups + span - 1) / span), base, [&](simd::PixelKernelArgs& a, int64_t item) {
    const int g0 = int(item / row_items) * span, g1 = std::min(ngroups, g0 + span);
    const int64_t r = item % row_items;
    size_t q = 0;  // the phase of item r
    while (r >= pp.row_begin[q + 1]) ++q;
    const Phase& p = pp.phases[q];
    a.stream = stream_zeros && p.tap_wei.empty();
    // Item r: one call of each of up to images_per_item images, the same row or edge column.
    const int64_t local = r - pp.row_begin[q], per_image = p.ni + p.edges.calls();
    const int n0 = static_cast<int>(local / per_image) * pp.images_per_item;
    const int images = std::min(pp.images_per_item, sh.N - n0);
    const int call = static_cast<int>(local % per_image);
    if (call >= p.ni) {  // an edge column's call: pixels down its rows, image by image
      for (int n = n0; n < n0 + images; ++n) {
        const int16_t* src_n = src + n * pp.src_img;
        if (sc.image) a.scale = base.scale * sc.image[n];  // a call reads one image
        int i0;
        const EdgeColumns::Column& col = p.edges.use(a, call - p.ni, i0);
        a.chain = col.chain.for_bound(bound(p, n, i0, i0 + a.npix));
        a.src_pix = pp.src_row;
        a.dst_pix = pp.dst_row;
        a.src = src_n + i0 * pp.src_row + col.col * pp.src_col;
        const int64_t off = n * pp.dst_img + p.dst_off + i0 * pp.dst_row + col.col * pp.dst_col;
        for (int g = g0; g < g1; ++g) {
          a.nob = std::min(2, pp.out_blocks - 2 * g);
          a.wei = wei + g * wei_group;
          if (sc.lane) a.lane_scale = sc.lane + 2 * g * 16;
          alignas(64) float tile[2 * tile_ob];
          to_dst(a, g, off, tile);
          fn(a);
          if (quantized) quantized->take(ctx, tile, tile_ob, a.nob, g, pp.dst_ob, off, pp.dst_row, a.npix);
        }
      }
      return;
    }
    // Row i of each image: its own taps' chain from its own rows' bound, and its own scale.
    const int i = call;
    simd::PixelKernelArgs calls[kMaxImagesPerItem];
    for (int m = 0; m < images; ++m) {
      simd::PixelKernelArgs& c = calls[m];
      c = a;
      if (sc.image) c.scale = base.scale * sc.image[n0 + m];  // a call reads one image
      c.src_pix = pp.src_col;
      c.dst_pix = pp.dst_col;
      use_row_group(c, p.rows, p.rows.row_group[i], p.tap_src.data(), p.tap_wei.data(), bound(p, n0 + m, i, i + 1));
    }
    const RowBlocks& rb = pp.blocks[q];
    alignas(64) float tiles[kMaxImagesPerItem][2 * tile_ob];  // forward_quantized's
    int64_t offs[kMaxImagesPerItem];
    for (int g = g0; g < g1; ++g) {
      const int nob = std::min(2, pp.out_blocks - 2 * g);
      const auto& bs = nob == 2 ? rb.start2 : rb.start1;
      const auto& bl = nob == 2 ? rb.len2 : rb.len1;
      for (size_t b = 0; b < bs.size(); ++b) {
        for (int m = 0; m < images; ++m) {
          simd::PixelKernelArgs& c = calls[m];
          const int n = n0 + m;
          c.nob = nob;
          c.wei = wei + g * wei_group;
          if (sc.lane) c.lane_scale = sc.lane + 2 * g * 16;
          c.npix = bl[b];
          c.src = src + n * pp.src_img + i * pp.src_row + bs[b] * pp.src_col;
          offs[m] = n * pp.dst_img + p.dst_off + i * pp.dst_row + bs[b] * pp.dst_col;
          to_dst(c, g, offs[m], tiles[m]);
        }
        if (images == 1)
          fn(calls[0]);
        else
          calls_fn(calls, images);
        if (quantized)
          for (int m = 0; m < images; ++m)
            quantized->take(ctx, tiles[m], tile_ob, nob, g, pp.dst_ob, offs[m], pp.dst_col, bl[b]);
      }
    }
  });
  return base.chain;
}

ConvInt16::Impl::PassScales ConvInt16::Impl::pass_scales(int src_exponent, int wei_exponent, const Slicing* images,
                                                          const std::vector<float>* lane_scale,
                                                          const std::vector<int>& lane_exp, int lanes) const {
  PassScales sc;
  sc.src_exponent = src_exponent;
  sc.wei_exponent = wei_exponent;
  if (images) {
    sc.image = images->scale.data();
    sc.image_exp = images->exp.data();
  }
  if (lane_scale) {
    sc.lane = lane_scale->data();
    sc.lane_exp = lane_exp.data();
    sc.lanes = lanes;
  }
  return sc;
}

void ConvInt16::Impl::forward(float* y, ConvInt16::QuantizedOutput* quantized) {
  require(have_w, "forward", "set_weights()");
  require(have_x_fwd, "forward", "quantize_input() (since the last quantize_grad_output())");
  const PassScales sc = pass_scales(stats.x.exponent, stats.w.exponent, x_slices ? &x_img : nullptr,
                                    w_slices ? &w_out_scale : nullptr, w_out_exp, sh.K);
  if (!quantized) {
    stats.chain_fwd = run_pixel_pass(fwd, xq, stats.x, (x_slices ? x_fwd_row_max : x_row_max).data(), wf.data(), y,
                                     false, "forward", sc);
    return;
  }
  DFP_CHECK(quantized->y, Status::invalid_argument, "convolution '" + name + "': forward_quantized() with no output");
  OutputQuantizer oq;
  oq.out = quantized;
  stats.chain_fwd = run_pixel_pass(fwd, xq, stats.x, (x_slices ? x_fwd_row_max : x_row_max).data(), wf.data(),
                                   nullptr, false, "forward", sc, &oq);
  quantized->saturated = oq.saturated.load();
  quantized->nonfinite = oq.nonfinite.load();
  quantized->max_abs_q = oq.max_q.load();
}

void ConvInt16::Impl::backward_data(float* dx_out, bool accumulate) {
  DFP_CHECK(opt.input_gradient, Status::invalid_argument,
            "convolution '" + name + "': backward_data() called on an operator built with input_gradient = false");
  require(have_w, "backward_data", "set_weights()");
  require(have_dy, "backward_data", "quantize_grad_output()");
  if (wb_transposed()) transpose_wf_to_wb();
  // Unfolded: dx' is scratch, folded into dx_out below.
  const PassScales sc = pass_scales(stats.dy.exponent, w_bwd.exponent, dy_slices ? &dy_img : nullptr,
                                    w_slices ? &w_in_scale : nullptr, w_in_exp, sh.C);
  stats.chain_bwd = run_pixel_pass(bwd, dyq, stats.dy, (dy_slices ? dyq_row_max : dy_row_max).data(), wb_data(),
                                   unfold ? dx_unfolded.data() : dx_out, accumulate && !unfold, "backward_data", sc);
  if (unfold) fold_dx(dx_out, accumulate);
}

// dx[n][c][h][w] = sum over (ow, s) with ow * stride_w + s - pad_w = w of dx'[n][s * C + c][h][ow],
// added in (ow, s) order: the inverse of the unfolding's gather (to what dx holds with accumulate).
void ConvInt16::Impl::fold_dx(float* dx, bool accumulate) const {
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

}  // namespace dfp
