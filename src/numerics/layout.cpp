// NCHW <-> nChw16c conversions and ConvShape helpers.
#include <algorithm>
#include <cstring>
#include <string>

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"

namespace dfp {

double ConvShape::ops() const noexcept {
  return 2.0 * N * K * C * R * S * double(OH()) * OW();
}

void ConvShape::validate(const std::string& what) const {
  auto need = [&](bool ok, const char* field, const std::string& expected, long got) {
    DFP_CHECK(ok, Status::invalid_argument,
              what + ": field " + field + " expected " + expected + ", got " + std::to_string(got));
  };
  need(N >= 1, "N", ">= 1", N);
  need(C >= 1, "C", ">= 1", C);
  need(K >= 1, "K", ">= 1", K);
  need(H >= 1, "H", ">= 1", H);
  need(W >= 1, "W", ">= 1", W);
  need(R >= 1, "R", ">= 1", R);
  need(S >= 1, "S", ">= 1", S);
  need(stride_h >= 1, "stride_h", ">= 1", stride_h);
  need(stride_w >= 1, "stride_w", ">= 1", stride_w);
  need(pad_h >= 0 && pad_h < R, "pad_h", "in [0, R)", pad_h);
  need(pad_w >= 0 && pad_w < S, "pad_w", "in [0, S)", pad_w);
  need(H + 2 * pad_h >= R, "H", ">= R - 2*pad_h", H);
  need(W + 2 * pad_w >= S, "W", ">= S - 2*pad_w", W);
}

void to_blocked(const float* nchw, float* blocked, int n, int c, int h, int w) {
  const int cb = channel_blocks(c);
  const size_t hw = size_t(h) * w;
  for (int in = 0; in < n; ++in)
    for (int b = 0; b < cb; ++b) {
      float* dst = blocked + (size_t(in) * cb + b) * hw * kChannelBlock;
      for (size_t p = 0; p < hw; ++p)
        for (int l = 0; l < kChannelBlock; ++l) {
          const int ch = b * kChannelBlock + l;
          dst[p * kChannelBlock + l] = ch < c ? nchw[(size_t(in) * c + ch) * hw + p] : 0.f;
        }
    }
}

void from_blocked(const float* blocked, float* nchw, int n, int c, int h, int w) {
  const int cb = channel_blocks(c);
  const size_t hw = size_t(h) * w;
  for (int in = 0; in < n; ++in)
    for (int ch = 0; ch < c; ++ch) {
      const float* src = blocked + (size_t(in) * cb + ch / kChannelBlock) * hw * kChannelBlock + ch % kChannelBlock;
      float* dst = nchw + (size_t(in) * c + ch) * hw;
      for (size_t p = 0; p < hw; ++p) dst[p] = src[p * kChannelBlock];
    }
}

namespace {

// f(t, nchw_offset, lanes) for every (image, 16-channel block) plane t of an n x c tensor, one
// plane per task item on the context's threads; the plane's channels start at nchw_offset
// elements of the NCHW tensor, and blocked plane t at t * hw * 16.
template <class F>
void for_each_block_plane(const Context& ctx, int n, int c, size_t hw, F&& f) {
  const int cb = channel_blocks(c);
  ctx.parallel_for(int64_t(n) * cb, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int in = static_cast<int>(t / cb), b = static_cast<int>(t % cb);
      f(size_t(t), (size_t(in) * c + size_t(b) * kChannelBlock) * hw, std::min(kChannelBlock, c - b * kChannelBlock));
    }
  });
}

}  // namespace

// The layout kernels copy each plane's lanes bit for bit (to_blocked zeroes the padding lanes).
void to_blocked(const Context& ctx, const float* nchw, float* blocked, int n, int c, int h, int w) {
  const size_t hw = size_t(h) * w;
  const auto kernel = ctx.kernels().to_blocked.fn;
  for_each_block_plane(ctx, n, c, hw, [&](size_t t, size_t offset, int lanes) {
    kernel(nchw + offset, hw, lanes, blocked + t * hw * kChannelBlock, hw);
  });
}

void from_blocked(const Context& ctx, const float* blocked, float* nchw, int n, int c, int h, int w) {
  const size_t hw = size_t(h) * w;
  const auto kernel = ctx.kernels().from_blocked.fn;
  for_each_block_plane(ctx, n, c, hw, [&](size_t t, size_t offset, int lanes) {
    kernel(blocked + t * hw * kChannelBlock, lanes, nchw + offset, hw, hw);
  });
}

}  // namespace dfp
