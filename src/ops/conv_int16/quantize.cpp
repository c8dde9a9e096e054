// The INT16 convolution's activations and gradients: x and dy quantized to DFP16 into the kernels'
// layouts (x's padded copy xq and batch-pair copy xp, dy's padded copy dyq and batch-pair copy dyp),
// with each row's largest |q| for the chain bounds; x from the caller's tensor, its column
// unfolding, or a producer's spans.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>

#include "src/core/atomic_max.hpp"
#include "src/numerics/dfp16_internal.hpp"
#include "src/ops/conv_int16/conv_int16_impl.hpp"

namespace dfp {

// Quantizes a blocked FP32 tensor [N][B][h][w][16] into the interior of a padded int16 tensor
// [N][B][hb][wb][16] at border (top, left), then builds the batch-pair copy [NP][B][h2][w2][16][2]
// (with its own border) from it. known_max: max|src| measured by the tensor's producer (negative
// or non-finite: measured here). The rows come from src, from src's column unfolding
// (unfolded_src) or from a producer (spans).
QuantStats ConvInt16::Impl::quantize_blocked(const float* src, int B, int h, int w, int16_t* dst, int hb, int wb,
                                             int top, int left, int16_t* pair, int h2, int w2, int top2, int left2,
                                             const QuantOptions& qo, float known_max, int16_t* row_max,
                                             bool unfolded_src, const SpanSource* spans, int pair_step,
                                             const int* plane_exp, int32_t* pair_row_l1) {
  // pair_step > 1: the batch-pair copy takes every pair_step-th row and pixel (from row and
  // pixel 0) of the plane copy dst; h2, w2 are then its subsampled sizes.
  // src is the tensor as the caller holds it: with unfolded_src, the caller's x, whose x' rows
  // are gathered as they are quantized.
  const size_t n = unfolded_src ? blocked_size(user.N, user.C, user.H, user.W) : size_t(sh.N) * B * h * w * 16;
  // Spans come from a producer that measured the maximum itself (quantize_input_spans checks it).
  const float m = detail::exponent_max_abs(ctx, src, n, known_max, qo.nonfinite, detail::TensorName{qo.name, name});
  const int e = dfp16_exponent(m, qo.headroom);
  // The exponent of plane (image n, block b); a batch pair's two images share their blocks'.
  auto plane_e = [&](int n, int b) { return plane_exp ? plane_exp[size_t(n) * B + b] : e; };
  const auto quant = ctx.kernels().quantize.fn;
  const auto inter = ctx.kernels().interleave.fn;
  const auto row_l1 = ctx.kernels().pair_row_l1.fn;
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
  // Row y of plane (image n, block b) of src into dst, with its zero border columns; the plane's
  // zero border rows (dst is workspace that other operators wrote in between).
  auto quant_row = [&](int n, int b, int y, simd::QuantCounters& cnt) {
    const size_t r = (size_t(n) * B + b) * h + y;  // the row's index in src
    const int ei = plane_e(n, b);
    int16_t* d = dst + (((size_t(n) * B + b) * hb + y + top) * wb + left) * 16;
    const int32_t q = largest_q(cnt, [&] {
      if (spans)
        quant_span_row(*spans, n, b, y, w, d, ei, qo, r * row_len, cnt);
      else if (unfolded_src)
        quant_unfolded_row(src, n, b, y, d, ei, qo, r * row_len, cnt);
      else
        quant(src + r * row_len, d, row_len, ei, qo.rounding, qo.seed, r * row_len, &cnt);
    });
    if (row_max) row_max[r] = static_cast<int16_t>(q);
    zero_pixels(d - size_t(left) * 16, left);
    zero_pixels(d + row_len, wb - left - w);
  };
  auto plane_borders = [&](int n, int b) {
    int16_t* plane = dst + (size_t(n) * B + b) * hb * wb * 16;
    std::memset(plane, 0, size_t(top) * wb * 16 * sizeof(int16_t));
    std::memset(plane + size_t(top + h) * wb * 16, 0, size_t(hb - top - h) * wb * 16 * sizeof(int16_t));
  };
  // Each row then handed to after_row(y).
  auto quant_plane = [&](int n, int b, simd::QuantCounters& cnt, auto&& after_row) {
    plane_borders(n, b);
    for (int y = 0; y < h; ++y) {
      quant_row(n, b, y, cnt);
      after_row(y);
    }
  };
  // Row y of block b of image pair p in the batch-pair copy, from both images' rows in dst
  // (absent for odd N: zeros); every pair_step-th row and pixel only.
  auto pair_row = [&](int p, int b, int y) {
    if (y % pair_step) return;
    const int16_t* a = dst + (((size_t(2 * p) * B + b) * hb + y + top) * wb + left) * 16;
    const int16_t* a2 = 2 * p + 1 < sh.N ? a + size_t(B) * hb * wb * 16 : nullptr;
    int16_t* d = pair + (((size_t(p) * B + b) * h2 + y / pair_step + top2) * w2 + left2) * 32;
    if (pair_step == 1) {
      inter(a, a2, d, row_len);
      if (pair_row_l1) row_l1(d, 1, w, 0, pair_row_l1 + (size_t(p) * B + b) * h2 + y + top2);
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
  auto count = [&](const simd::QuantCounters& cnt) {
    atomic_add_nonzero(saturated, cnt.saturated);
    atomic_add_nonzero(nonfinite, cnt.nonfinite);
    atomic_max(max_q, cnt.max_abs_q);
  };
  if (!dst) {
    // The batch-pair layout alone (dy without a backward-data pass; x computed again for the
    // weight gradient, from spans): row y of plane b of images 2p and 2p+1 is quantized a piece at
    // a time into an L1 tile per image and interleaved from there. The elements, their stochastic
    // indices and the row maxima are the plane path's.
    DFP_CHECK(pair && !unfolded_src && pair_step == 1, Status::internal,
              "convolution '" + name + "': pair-only quantization of a plain tensor expected");
    constexpr size_t kPiece = size_t(ConvInt16::kInputSpanPixels) * 16;  // elements per image and piece
    // A producer that offers quantized pairs computes them in one pass, where nearest rounding's
    // bits are all it has to give (it declines a piece that would count anything).
    const bool pairs_at_nearest = spans && spans->pairs && qo.rounding == Rounding::nearest_even;
    const bool quantized_at_nearest = spans && spans->quantized && qo.rounding == Rounding::nearest_even;
    ctx.parallel_for(int64_t(NP) * B, [&](int64_t t0, int64_t t1) {
      simd::QuantCounters cnt;
      alignas(64) int16_t tile[2][kPiece];
      alignas(64) float span_tile[kPiece];  // with spans
      for (int64_t t = t0; t < t1; ++t) {
        const int p = static_cast<int>(t / B), b = static_cast<int>(t % B);
        const int images = 2 * p + 1 < sh.N ? 2 : 1;
        for (int y = 0; y < h; ++y) {
          int32_t row_q[2] = {0, 0};
          int16_t* d = pair + (((size_t(p) * B + b) * h2 + y + top2) * w2 + left2) * 32;
          for (size_t o = 0; o < row_len; o += kPiece) {
            const size_t len = std::min(kPiece, row_len - o);
            if (pairs_at_nearest && plane_e(2 * p, b) == plane_e(2 * p + images - 1, b)) {
              int32_t mq[2];
              if (spans->pairs(spans->producer, 2 * p, images, b, y, static_cast<int>(o / 16),
                               static_cast<int>(len / 16), plane_e(2 * p, b), d + o * 2, mq)) {
                for (int i = 0; i < images; ++i) {
                  row_q[i] = std::max(row_q[i], mq[i]);
                  cnt.max_abs_q = std::max(cnt.max_abs_q, mq[i]);
                }
                continue;
              }
            }
            for (int i = 0; i < images; ++i) {
              const size_t r = (size_t(2 * p + i) * B + b) * h + y;  // the row's index in src
              const float* from = src + r * row_len + o;
              int32_t mq;
              if (quantized_at_nearest &&
                  spans->quantized(spans->producer, 2 * p + i, b, y, static_cast<int>(o / 16),
                                   static_cast<int>(len / 16), plane_e(2 * p + i, b), tile[i], &mq)) {
                row_q[i] = std::max(row_q[i], mq);
                cnt.max_abs_q = std::max(cnt.max_abs_q, mq);
                continue;
              }
              if (spans) {
                spans->fn(spans->producer, 2 * p + i, b, y, static_cast<int>(o / 16), static_cast<int>(len / 16),
                          span_tile);
                from = span_tile;
              }
              row_q[i] = std::max(row_q[i], largest_q(cnt, [&] {
                quant(from, tile[i], len, plane_e(2 * p + i, b), qo.rounding, qo.seed, r * row_len + o, &cnt);
              }));
            }
            inter(tile[0], images == 2 ? tile[1] : nullptr, d + o * 2, len);
          }
          if (pair_row_l1) row_l1(d, 1, w, 0, pair_row_l1 + (size_t(p) * B + b) * h2 + y + top2);
          if (row_max)
            for (int i = 0; i < images; ++i) row_max[(size_t(2 * p + i) * B + b) * h + y] = static_cast<int16_t>(row_q[i]);
        }
      }
      count(cnt);
    });
  } else if (pair && unfolded_src && pair_step == 1) {
    // A column unfolding's blocks all come from the same rows of x (a 7x7 stem's two: channels
    // 0-15 and 16-20 of its 21), so a pair's row y is gathered for every block while x's row is
    // in L1, then each block's pair row interleaved; plane by plane, x (103 MB at 224x224,
    // batch 32, mostly the blocked layout's zero lanes) would come from memory once per block.
    // The same elements, stochastic indices, row maxima and borders as the planes below.
    ctx.parallel_for(int64_t(NP), [&](int64_t t0, int64_t t1) {
      simd::QuantCounters cnt;
      for (int64_t t = t0; t < t1; ++t) {
        const int p = static_cast<int>(t), n1 = std::min(sh.N, 2 * p + 2);
        for (int n = 2 * p; n < n1; ++n)
          for (int b = 0; b < B; ++b) plane_borders(n, b);
        for (int y = 0; y < h; ++y) {
          for (int n = 2 * p; n < n1; ++n)
            for (int b = 0; b < B; ++b) quant_row(n, b, y, cnt);
          if (x_compact) {
            compact_pair_row(src, p, y, plane_e(2 * p, 0), qo);
          } else {
            for (int b = 0; b < B; ++b) pair_row(p, b, y);
          }
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
        auto interleave_row = [&](int y) { pair_row(p, b, y); };
        if (2 * p + 1 < sh.N) {
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
  st.exponent = st.exponent_min = e;
  st.max_abs = m;
  st.saturated = saturated.load();
  st.nonfinite = nonfinite.load();
  st.max_abs_int = max_q.load();
  if (st.nonfinite && qo.nonfinite == NonFinitePolicy::error)
    detail::fail_nonfinite(src, n, st.nonfinite, detail::TensorName{qo.name, name});
  return st;
}

std::pair<QuantStats, QuantStats> ConvInt16::Impl::quantize_dual(const float* src, int B, int h, int w, int16_t* dst,
                                                                 int hb, int wb, int top, int left, const int* dst_exp,
                                                                 int16_t* dst_row_max, int16_t* pair, int h2, int w2,
                                                                 int pair_step, const int* pair_exp,
                                                                 int16_t* pair_row_max, const QuantOptions& qo,
                                                                 float max_abs, bool unfolded_src,
                                                                 const SpanSource* spans, int32_t* pair_row_l1) {
  DFP_CHECK(!pair_row_l1 || pair_step == 1, Status::internal,
            "convolution '" + name + "': row norms of a subsampled pair copy");
  const auto quant = ctx.kernels().quantize.fn;
  const auto quant2 = ctx.kernels().quantize2.fn;
  const auto inter = ctx.kernels().interleave.fn;
  const auto row_l1 = ctx.kernels().pair_row_l1.fn;
  std::atomic<uint64_t> saturated[2] = {0, 0}, nonfinite[2] = {0, 0};
  std::atomic<int32_t> max_q[2] = {0, 0};
  const size_t row_len = size_t(w) * 16;
  // A producer's span at most; a gather tile of x' where src is x and the rows are its unfolding.
  const size_t piece = size_t(unfolded_src ? kUnfoldPixels : ConvInt16::kInputSpanPixels) * 16;
  // Plane (image n, block b) of src: row y of it in both copies, a piece at a time, while the
  // piece is in L1; both images of a batch pair go row by row, so that the pair copy's row is
  // interleaved from two L1 tiles. The stochastic index of an element is the same in both copies,
  // and its plane path's (quantize_blocked).
  ctx.parallel_for(int64_t(NP) * B, [&](int64_t t0, int64_t t1) {
    simd::QuantCounters cnt[2];
    constexpr size_t kTile = size_t(ConvInt16::kInputSpanPixels) * 16;
    static_assert(kUnfoldPixels <= ConvInt16::kInputSpanPixels);
    alignas(64) float span_tile[kTile];
    alignas(64) int16_t tile[2][kTile];
    alignas(64) int16_t g[2][kTile];
    for (int64_t t = t0; t < t1; ++t) {
      const int p = static_cast<int>(t / B), b = static_cast<int>(t % B);
      const int images = 2 * p + 1 < sh.N ? 2 : 1;
      int16_t* plane[2];
      for (int i = 0; i < images; ++i) {
        plane[i] = dst + (size_t(2 * p + i) * B + b) * hb * wb * 16;
        std::memset(plane[i], 0, size_t(top) * wb * 16 * sizeof(int16_t));
      }
      for (int y = 0; y < h; ++y) {
        int32_t q_dst[2] = {0, 0}, q_pair[2] = {0, 0};
        int16_t* prow = !pair || y % pair_step ? nullptr : pair + ((size_t(p) * B + b) * h2 + y / pair_step) * w2 * 32;
        for (size_t o = 0; o < row_len; o += piece) {
          const size_t len = std::min(piece, row_len - o);
          const int16_t* paired[2] = {tile[0], tile[1]};  // each image's piece in the pair copy's units
          for (int i = 0; i < images; ++i) {
            const int n = 2 * p + i;
            const size_t r = (size_t(n) * B + b) * h + y;  // the row's index in src
            const float* from = span_tile;
            if (unfolded_src)
              from = gather_unfolded(src, n, b, y, static_cast<int>(o / 16), static_cast<int>(len / 16), span_tile);
            else if (spans)
              spans->fn(spans->producer, n, b, y, static_cast<int>(o / 16), static_cast<int>(len / 16), span_tile);
            else
              from = src + r * row_len + o;
            int16_t* d = plane[i] + ((size_t(y) + top) * wb + left) * 16 + o;
            const size_t e = size_t(n) * B + b;
            // The piece's largest |q| in each copy, then the running maxima take them.
            const int32_t before[2] = {cnt[0].max_abs_q, cnt[1].max_abs_q};
            cnt[0].max_abs_q = cnt[1].max_abs_q = 0;
            if (dst_exp[e] == pair_exp[e] || !pair) {
              // Both copies round at one exponent (a pair's larger image, often): one rounding
              // serves both, the bits of quant2's second output, and its counts go to both.
              const uint64_t sat = cnt[0].saturated, nonfin = cnt[0].nonfinite;
              quant(from, d, len, dst_exp[e], qo.rounding, qo.seed, r * row_len + o, &cnt[0]);
              cnt[1].saturated += cnt[0].saturated - sat;
              cnt[1].nonfinite += cnt[0].nonfinite - nonfin;
              cnt[1].max_abs_q = cnt[0].max_abs_q;
              paired[i] = d;
            } else {
              quant2(from, d, tile[i], len, dst_exp[e], pair_exp[e], qo.rounding, qo.seed, r * row_len + o,
                     &cnt[0], &cnt[1]);
            }
            q_dst[i] = std::max(q_dst[i], cnt[0].max_abs_q);
            q_pair[i] = std::max(q_pair[i], cnt[1].max_abs_q);
            for (int k = 0; k < 2; ++k) cnt[k].max_abs_q = std::max(before[k], cnt[k].max_abs_q);
          }
          if (!prow) continue;
          const int16_t* second = images == 2 ? paired[1] : nullptr;
          if (pair_step == 1) {
            inter(paired[0], second, prow + o * 2, len);
            continue;
          }
          // Every pair_step-th pixel of the piece's: pair pixels [j0, j1).
          const int px0 = static_cast<int>(o / 16), px1 = px0 + static_cast<int>(len / 16);
          const int j0 = (px0 + pair_step - 1) / pair_step, j1 = std::min(w2, (px1 + pair_step - 1) / pair_step);
          for (int j = j0; j < j1; ++j)
            for (int i = 0; i < images; ++i)
              std::memcpy(g[i] + (j - j0) * 16, paired[i] + (size_t(j) * pair_step - px0) * 16, 32);
          if (j1 > j0) inter(g[0], second ? g[1] : nullptr, prow + size_t(j0) * 32, size_t(j1 - j0) * 16);
        }
        if (pair_row_l1) row_l1(prow, 1, w2, 0, pair_row_l1 + (size_t(p) * B + b) * h2 + y);
        for (int i = 0; i < images; ++i) {
          const size_t r = (size_t(2 * p + i) * B + b) * h + y;
          if (dst_row_max) dst_row_max[r] = static_cast<int16_t>(q_dst[i]);
          if (pair_row_max && pair) pair_row_max[r] = static_cast<int16_t>(q_pair[i]);
          int16_t* d = plane[i] + ((size_t(y) + top) * wb + left) * 16;
          zero_pixels(d - size_t(left) * 16, left);
          zero_pixels(d + row_len, wb - left - w);
        }
      }
      for (int i = 0; i < images; ++i)
        std::memset(plane[i] + size_t(top + h) * wb * 16, 0, size_t(hb - top - h) * wb * 16 * sizeof(int16_t));
    }
    for (int k = 0; k < 2; ++k) {
      atomic_add_nonzero(saturated[k], cnt[k].saturated);
      atomic_add_nonzero(nonfinite[k], cnt[k].nonfinite);
      atomic_max(max_q[k], cnt[k].max_abs_q);
    }
  });
  QuantStats st[2];
  for (int k = 0; k < 2; ++k) {
    st[k].max_abs = max_abs;
    st[k].saturated = saturated[k].load();
    st[k].nonfinite = nonfinite[k].load();
    st[k].max_abs_int = max_q[k].load();
  }
  if (st[0].nonfinite && qo.nonfinite == NonFinitePolicy::error)
    detail::fail_nonfinite(src, unfolded_src ? blocked_size(user.N, user.C, user.H, user.W) : size_t(sh.N) * B * h * w * 16,
                           st[0].nonfinite, detail::TensorName{qo.name, name});
  return {st[0], st[1]};
}

// Quantizes block b of row y of image n of x (w pixels) into d, asking the producer for it a span
// at a time into an L1 tile. index_base: the row's first element, for the stochastic stream.
// Out of line: the per-row loop of the plain path stays small enough to inline.
__attribute__((noinline)) void ConvInt16::Impl::quant_span_row(const SpanSource& spans, int n, int b, int y, int w,
                                                               int16_t* d, int e, const QuantOptions& qo,
                                                               size_t index_base, simd::QuantCounters& cnt) const {
  constexpr int kSpan = ConvInt16::kInputSpanPixels;
  alignas(64) float tile[kSpan * 16];
  const auto quant = ctx.kernels().quantize.fn;
  const bool quantized = spans.quantized && qo.rounding == Rounding::nearest_even;
  for (int w0 = 0; w0 < w; w0 += kSpan) {
    const int np = std::min(kSpan, w - w0);
    int32_t mq;
    if (quantized && spans.quantized(spans.producer, n, b, y, w0, np, e, d + size_t(w0) * 16, &mq)) {
      cnt.max_abs_q = std::max(cnt.max_abs_q, mq);
      continue;
    }
    spans.fn(spans.producer, n, b, y, w0, np, tile);
    quant(tile, d + size_t(w0) * 16, size_t(np) * 16, e, qo.rounding, qo.seed, index_base + size_t(w0) * 16, &cnt);
  }
}

// Row y of image pair p of the caller's x into the compact batch-pair copy (x_compact): its
// padded columns, C pairs each, zero outside the image, quantized at exponent e. Rounding is
// deterministic there, so each value is what the unfolded forward copy holds at every place it
// occupies. The quantizer's counts are the forward copy's, already taken.
void ConvInt16::Impl::compact_pair_row(const float* x, int p, int y, int e, const QuantOptions& qo) {
  const int C = user.C;
  const size_t plane = size_t(user.H) * user.W * 16;  // x: [N][1][H][W][16] (C < 16)
  const float* row[2] = {x + size_t(2 * p) * plane + size_t(y) * user.W * 16,
                         2 * p + 1 < user.N ? x + size_t(2 * p + 1) * plane + size_t(y) * user.W * 16 : nullptr};
  int16_t* d = xp.data() + size_t(p) * xp_pair_stride + size_t(y) * xp_row_stride;
  constexpr int kPieceCols = 64;
  alignas(64) float tile[kPieceCols * 16 * 2];  // C <= 15 pairs per column
  simd::QuantCounters ignored;
  for (int c0 = 0; c0 < xc_cols; c0 += kPieceCols) {
    const int nc = std::min(kPieceCols, xc_cols - c0);
    float* t = tile;
    for (int pc = c0; pc < c0 + nc; ++pc) {
      const int w = pc - user.pad_w;
      const bool inside = w >= 0 && w < user.W;
      for (int c = 0; c < C; ++c, t += 2) {
        t[0] = inside ? row[0][size_t(w) * 16 + c] : 0.f;
        t[1] = inside && row[1] ? row[1][size_t(w) * 16 + c] : 0.f;
      }
    }
    const size_t len = size_t(nc) * C * 2;
    ctx.kernels().quantize.fn(tile, d + size_t(c0) * C * 2, len, e, qo.rounding, qo.seed, 0, &ignored);
  }
}

// Quantizes block b of row y of image n of x' (see unfold) into d, gathering it from the
// caller's x (one block: C < 16) a tile of pixels at a time. index_base: the row's first element
// in x', for the stochastic stream.
void ConvInt16::Impl::quant_unfolded_row(const float* x, int n, int b, int y, int16_t* d, int e,
                                         const QuantOptions& qo, size_t index_base,
                                         simd::QuantCounters& cnt) const {
  alignas(64) float block[kUnfoldPixels * 16];
  const auto quant = ctx.kernels().quantize.fn;
  for (int ow0 = 0; ow0 < sh.W; ow0 += kUnfoldPixels) {
    const int np = std::min(kUnfoldPixels, sh.W - ow0);
    const float* src = gather_unfolded(x, n, b, y, ow0, np, block);
    quant(src, d + size_t(ow0) * 16, size_t(np) * 16, e, qo.rounding, qo.seed, index_base + size_t(ow0) * 16, &cnt);
  }
}

const float* ConvInt16::Impl::gather_unfolded(const float* x, int n, int b, int y, int ow0, int np, float* block) const {
  const int C = user.C, S = user.S, W = user.W;
  // Lane l of block b is x' channel u = 16 b + l: column s = u / C, channel c = u % C of x; lanes
  // past S * C are zero. Each lane is read straight from x, at offset off[l] from column s_lo,
  // the block's first. (Copying x's 16-lane pixels to lane offsets s * C and the block out of
  // them leaves each load of the block straddling several overlapping stores, which the core
  // cannot forward: half of a 7x7 stem's quantization time.)
  const int s_lo = 16 * b / C;
  int off[16];
  int lanes = 0;  // lanes [0, lanes) read x, the rest are zero
  for (; lanes < 16 && 16 * b + lanes < S * C; ++lanes) {
    const int u = 16 * b + lanes;
    off[lanes] = (u / C - s_lo) * 16 + u % C;
  }
  const int s_hi = lanes > 0 ? s_lo + off[lanes - 1] / 16 : s_lo;  // the block's last column
  const float* xrow = x + (size_t(n) * user.H + y) * W * 16;
  for (int i = 0; i < np; ++i) {
    float* px = block + size_t(i) * 16;
    const int w_lo = (ow0 + i) * user.stride_w - user.pad_w + s_lo;  // x's column of s_lo
    if (w_lo >= 0 && w_lo + s_hi - s_lo < W) {
      const float* src = xrow + size_t(w_lo) * 16;
      for (int l = 0; l < lanes; ++l) px[l] = src[off[l]];
    } else {
      for (int l = 0; l < lanes; ++l) {
        const int w = w_lo + off[l] / 16;
        px[l] = w >= 0 && w < W ? xrow[size_t(w) * 16 + off[l] % 16] : 0.f;
      }
    }
    for (int l = lanes; l < 16; ++l) px[l] = 0.f;
  }
  return block;
}

// x -> its padded forward copy xq and batch-pair copy xp: from the caller's tensor (gathered
// into its column unfolding where the layer unfolds), or from a producer's spans.
void ConvInt16::Impl::quantize_x(const float* x, float known_max, const float* known_planes, const SpanSource* spans) {
  ensure_workspace();
  ensure_x_pairs();
  if (x_slices) {
    quantize_x_slices(x, known_planes, spans);
  } else {
    stats.x = quantize_blocked(x, CB, sh.H, sh.W, xq, Hp, Wp, sh.pad_h, sh.pad_w, again ? nullptr : xp.data(), xp_h,
                               xp_w, 0, 0, step_x, known_max, x_row_max.data(), unfold && !spans, spans, xp_step);
    x_pairs = stats.x;
  }
  have_x = have_x_fwd = true;
  have_xr = false;
  if (shared_workspace) have_dy = false;  // the workspace now holds x
}

// Granularity::slice: the exponents of every plane (image n, block b) of a tensor of B blocks,
// for each of its two slicings: per image (into img, [N]; null: not wanted) and per image pair
// and block (into blk, [NP][B]; with wgrad_pairs() false one pair, the batch: [B]), from the
// planes' max|src| (plane_len elements each, or the producer's spans; or known_planes, [N][B], as
// the producer measured them: used where every one is finite and >= 0). img.planes and
// blk.planes, [N][B], repeat them per plane for quantize_blocked. per_block false: the planes'
// maxima are their images' (an unfolded x, whose blocks gather columns). Returns max|src| and
// the ranges of both sets of exponents.
ConvInt16::Impl::SliceExponents ConvInt16::Impl::slice_exponents(const float* src, int B, size_t plane_len,
                                                                 const float* known_planes, const SpanSource* spans,
                                                                 bool per_block, int headroom, Slicing& img,
                                                                 Slicing& blk) {
  const auto max_fn = ctx.kernels().max_abs.fn;
  float* pm = plane_max.data();
  const size_t planes = size_t(sh.N) * B;
  if (known_planes && per_block &&
      std::all_of(known_planes, known_planes + planes, [](float m) { return m >= 0.f && std::isfinite(m); })) {
    std::copy_n(known_planes, planes, pm);
  } else if (!per_block) {  // an unfolded x: planes of x' are not planes of the caller's x; whole images
    const size_t img_len = blocked_size(1, user.C, user.H, user.W);
    ctx.parallel_for(sh.N, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        uint64_t ignored = 0;  // non-finite elements: counted by the quantizer
        const float m = max_fn(src + size_t(n) * img_len, img_len, &ignored);
        for (int b = 0; b < B; ++b) pm[size_t(n) * B + b] = m;
      }
    });
  } else {
    ctx.parallel_for(int64_t(sh.N) * B, [&](int64_t t0, int64_t t1) {
      alignas(64) float tile[ConvInt16::kInputSpanPixels * 16];
      for (int64_t t = t0; t < t1; ++t) {
        uint64_t ignored = 0;
        float m = 0.f;
        if (!spans) {
          m = max_fn(src + size_t(t) * plane_len, plane_len, &ignored);
        } else {
          const int n = static_cast<int>(t / B), b = static_cast<int>(t % B);
          for (int y = 0; y < sh.H; ++y)
            for (int w0 = 0; w0 < sh.W; w0 += ConvInt16::kInputSpanPixels) {
              const int np = std::min(ConvInt16::kInputSpanPixels, sh.W - w0);
              spans->fn(spans->producer, n, b, y, w0, np, tile);
              m = std::max(m, max_fn(tile, size_t(np) * 16, &ignored));
            }
        }
        pm[t] = m;
      }
    });
  }
  SliceExponents r;
  float all = 0.f;
  for (size_t t = 0; t < size_t(sh.N) * B; ++t) all = std::max(all, pm[t]);
  r.max_abs = all;
  // One slicing from the maxima m(i) of its slices: exponents, scales, and their range.
  auto slicing = [&](Slicing& sl, int count, auto&& m) {
    int hi = std::numeric_limits<int>::min(), lo = std::numeric_limits<int>::max();
    for (int i = 0; i < count; ++i) {
      const float mi = m(i);
      const int x = dfp16_exponent(mi, headroom);
      sl.exp[size_t(i)] = x;
      if (!sl.scale.empty()) sl.scale[size_t(i)] = std::ldexp(1.f, x);
      hi = std::max(hi, x);
      if (mi > 0.f) lo = std::min(lo, x);
    }
    return std::pair<int, int>{hi, lo == std::numeric_limits<int>::max() ? hi : lo};
  };
  if (!img.exp.empty()) {
    std::tie(r.img_hi, r.img_lo) = slicing(img, sh.N, [&](int n) {
      float m = 0.f;
      for (int b = 0; b < B; ++b) m = std::max(m, pm[size_t(n) * B + b]);
      return m;
    });
    for (int n = 0; n < sh.N; ++n)
      for (int b = 0; b < B; ++b) img.planes[size_t(n) * B + b] = img.exp[size_t(n)];
  }
  // Slice (p, b) of blk: block b of images [2p, 2p + 2), or of the batch.
  const int images = wgrad_pairs() ? 2 : sh.N;
  std::tie(r.blk_hi, r.blk_lo) = slicing(blk, int(blk.exp.size()), [&](int i) {
    const int p = i / B, b = i % B;
    float m = 0.f;
    for (int n = p * images; n < std::min(sh.N, p * images + images); ++n)
      m = std::max(m, pm[size_t(n) * B + b]);
    return m;
  });
  for (int n = 0; n < sh.N; ++n)
    for (int b = 0; b < B; ++b) blk.planes[size_t(n) * B + b] = blk.exp[size_t(n / images) * B + b];
  return r;
}

// Granularity::slice: x's forward copy xq with an exponent per image, and its batch-pair copy xp
// (which the weight gradient reads a pair at a time) one per image pair and 16-channel block, each
// with its own row maxima, in one pass over x (an unfolded x: over its columns, gathered once).
void ConvInt16::Impl::quantize_x_slices(const float* x, const float* known_planes, const SpanSource* spans) {
  const bool unfolded_src = unfold && !spans;
  const SliceExponents r = slice_exponents(x, CB, size_t(sh.H) * sh.W * 16, known_planes, spans, !unfolded_src,
                                           step_x.headroom, x_img, x_blk);
  std::tie(stats.x, x_pairs) = quantize_dual(x, CB, sh.H, sh.W, xq, Hp, Wp, sh.pad_h, sh.pad_w, x_img.planes.data(),
                                             x_fwd_row_max.data(), again ? nullptr : xp.data(), xp_h, xp_w, xp_step,
                                             x_blk.planes.data(), x_row_max.data(), step_x, r.max_abs, unfolded_src,
                                             spans);
  x_pairs.exponent = r.blk_hi;
  x_pairs.exponent_min = r.blk_lo;
  stats.x.exponent = r.img_hi;
  stats.x.exponent_min = r.img_lo;
}

// Granularity::slice: dy's batch pairs dyp, which the weight gradient reads, with an exponent
// per image pair and 16-channel block, and (with a backward-data pass) its padded copy dyq one
// per image, each with its own row maxima, in one pass over dy.
void ConvInt16::Impl::quantize_dy_slices(const float* dy, const float* known_planes) {
  const SliceExponents r = slice_exponents(dy, KB, size_t(OH) * OW * 16, known_planes, nullptr, true,
                                           step_dy.headroom, dy_img, dy_blk);
  if (!opt.input_gradient) {
    dy_pairs = quantize_blocked(dy, KB, OH, OW, nullptr, 0, 0, 0, 0, dyp, OH, OW, 0, 0, step_dy, r.max_abs,
                                dy_row_max.data(), false, nullptr, 1, dy_blk.planes.data(), dyp_row_l1_out());
  } else {
    std::tie(stats.dy, dy_pairs) =
        quantize_dual(dy, KB, OH, OW, dyq, OHb, OWb, pt, pl, dy_img.planes.data(), dyq_row_max.data(), dyp, OH, OW, 1,
                      dy_blk.planes.data(), dy_row_max.data(), step_dy, r.max_abs, false, nullptr,
                      dyp_row_l1_out());
    stats.dy.exponent = r.img_hi;
    stats.dy.exponent_min = r.img_lo;
  }
  dy_pairs.exponent = r.blk_hi;
  dy_pairs.exponent_min = r.blk_lo;
  if (!opt.input_gradient) stats.dy = dy_pairs;
}

void ConvInt16::Impl::quantize_input(const float* x, float known_max, const float* known_planes) {
  quantize_x(x, known_max, known_planes, nullptr);
}

void ConvInt16::Impl::quantize_input_spans(ConvInt16::InputSpanFn fn, void* producer, float max_abs,
                                           const float* known_planes, ConvInt16::InputQuantSpanFn quantized) {
  DFP_CHECK(!unfold, Status::invalid_argument,
            "convolution '" + name + "': quantize_input_spans() on a layer with unfolded columns (C = " +
                std::to_string(user.C) + " < 16); use quantize_input()");
  DFP_CHECK(max_abs >= 0.f && std::isfinite(max_abs), Status::invalid_argument,
            "convolution '" + name + "': quantize_input_spans() needs a finite max_abs >= 0, got " +
                std::to_string(max_abs));
  const SpanSource spans{fn, producer, nullptr, quantized};
  quantize_x(nullptr, max_abs, known_planes, &spans);
}

bool ConvInt16::Impl::recompute_input_pairs(ConvInt16::InputSpanFn fn, void* producer,
                                            ConvInt16::InputPairSpanFn pairs) {
  DFP_CHECK(fn, Status::invalid_argument, "convolution '" + name + "': recompute_input_pairs() needs a function");
  DFP_CHECK(!shared_workspace, Status::invalid_argument,
            "convolution '" + name + "': recompute_input_pairs() after use_workspace(): the region was sized without "
            "the copy it adds; call it first");
  if (unfold || xp_step != 1 || gemm || opt.activations.rounding == Rounding::stochastic) return false;
  again = fn;
  again_producer = producer;
  again_pairs = pairs;
  xr_bytes = round64(xp_elems * sizeof(int16_t));
  xp = AlignedBuffer<int16_t>();
  use_workspace(nullptr);  // the owned region is sized again on first use
  have_x = false;
  return true;
}

// The weight gradient's batch-pair copy of x, from the producer's spans at the exponents the
// forward pass quantized x with (the same max|x|, so the same exponent and bits; with
// Granularity::slice the forward's exponent per image pair and block). With one exponent the row
// maxima are the forward copy's already; with slices this copy's own are measured here, and its
// figures (x_pairs) too.
bool ConvInt16::Impl::recompute_x_pairs() {
  if (!again) return false;
  require(have_x, "recompute_input", "quantize_input()");
  require(have_dy, "recompute_input", "quantize_grad_output()");
  DFP_CHECK(std::isfinite(x_pairs.max_abs) && x_pairs.max_abs >= 0.f, Status::internal,
            "convolution '" + name + "': x's max|x| from the forward pass is not finite");
  const SpanSource spans{again, again_producer, again_pairs};
  const QuantStats st =
      quantize_blocked(nullptr, CB, sh.H, sh.W, nullptr, 0, 0, 0, 0, xr, xp_h, xp_w, 0, 0, step_x, x_pairs.max_abs,
                       x_slices ? x_row_max.data() : nullptr, false, &spans, 1, x_slices ? x_blk.planes.data() : nullptr);
  have_xr = true;
  if (x_slices) {
    x_pairs.saturated = st.saturated;
    x_pairs.nonfinite = st.nonfinite;
    x_pairs.max_abs_int = st.max_abs_int;
  }
  return true;
}

void ConvInt16::Impl::quantize_grad_output(const float* dy, float known_max, const float* known_planes) {
  ensure_workspace();
  if (dy_slices) {
    quantize_dy_slices(dy, known_planes);
  } else {
    stats.dy = quantize_dy_blocked(dy, known_max, nullptr);
    dy_pairs = stats.dy;
  }
  dy_quantized();
}

// dy with one exponent into both backward layouts, from dy or from a producer's spans.
QuantStats ConvInt16::Impl::quantize_dy_blocked(const float* dy, float known_max, const SpanSource* spans) {
  return quantize_blocked(dy, KB, OH, OW, opt.input_gradient ? dyq : nullptr, OHb, OWb, pt, pl,
                          dy_whole_pairs ? dyp : nullptr, OH, OW, 0, 0, step_dy, known_max, dy_row_max.data(), false,
                          spans, 1, nullptr, dyp_row_l1_out());
}

bool ConvInt16::Impl::quantize_grad_output_spans(ConvInt16::GradSpanFn fn, void* producer, float estimate,
                                                 ConvInt16::GradQuantSpanFn quantized) {
  DFP_CHECK(!dy_slices, Status::invalid_argument,
            "convolution '" + name + "': quantize_grad_output_spans() with an exponent per slice of dy; use "
            "quantize_grad_output()");
  DFP_CHECK(fn && estimate >= 0.f && std::isfinite(estimate), Status::invalid_argument,
            "convolution '" + name + "': quantize_grad_output_spans() needs a function and a finite estimate >= 0, got " +
                std::to_string(estimate));
  ensure_workspace();
  // The spans' largest magnitude, over all of them, as the threads ask for them.
  struct Measured {
    ConvInt16::GradSpanFn fn;
    ConvInt16::GradQuantSpanFn quantized;
    void* producer;
    std::atomic<float> max_abs{0.f};
  } measured{fn, quantized, producer};
  const ConvInt16::InputQuantSpanFn measured_quantized = +[](void* m, int n, int b, int h, int w0, int count,
                                                             int exponent, int16_t* out, int32_t* max_q) {
    auto& s = *static_cast<Measured*>(m);
    const float a = s.quantized(s.producer, n, b, h, w0, count, exponent, out, max_q);
    if (a < 0.f) return false;  // refused: the span is asked of fn
    atomic_max(s.max_abs, a);
    return true;
  };
  const SpanSource spans{+[](void* m, int n, int b, int h, int w0, int count, float* out) {
                           auto& s = *static_cast<Measured*>(m);
                           atomic_max(s.max_abs, s.fn(s.producer, n, b, h, w0, count, out));
                         },
                         &measured, nullptr, quantized ? measured_quantized : nullptr};
  stats.dy = quantize_dy_blocked(nullptr, estimate, &spans);
  const float max_abs = measured.max_abs.load();
  const bool held = dfp16_exponent(max_abs, step_dy.headroom) == stats.dy.exponent;
  if (!held) {
    measured.max_abs = 0.f;
    stats.dy = quantize_dy_blocked(nullptr, max_abs, &spans);
  }
  stats.dy.max_abs = max_abs;  // as the tensor's own, not the estimate
  dy_pairs = stats.dy;
  dy_quantized();
  return held;
}

void ConvInt16::Impl::dy_quantized() {
  have_dy = true;
  have_xr = false;  // this backward's copy of x is yet to be computed
  if (shared_workspace) have_x_fwd = false;  // the workspace now holds dy
}

}  // namespace dfp
