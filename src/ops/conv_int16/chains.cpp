// INT32 chain bounds of the pixel-kernel passes: each tap sequence's chain table, measured from the
// packed weights' per-lane L1 norms once per weight version, and the chains each pass chooses for
// its sources' largest |q|.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <limits>

#include "src/core/atomic_max.hpp"
#include "src/ops/conv_int16/conv_int16_impl.hpp"

namespace dfp {

namespace {

// The smallest source bound chain tables measure lengths for: 1/16 of the least largest |q| a
// tensor quantized with this headroom has (the quantizer puts it in [2^(14-h), 2^(15-h))). A call
// whose rows are bounded lower takes this bound's chain, which already flushes 16 times less
// often than the tensor maximum's.
int64_t measure_floor(int headroom) { return std::max<int64_t>(1, (int64_t{1} << (14 - headroom)) / 16); }

}  // namespace

namespace conv_int16_detail {

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

void ChainTable::measure(const Context& ctx, const int32_t* unit_l1, int lanes, int64_t lane_stride, int nib, int T,
                         const int32_t* taps, int ntaps, int64_t a_min) {
  const int units = nib * ntaps;
  const size_t nc = n.size();
  // The sequence as unit offsets in a lane's row: ib outer, taps[] inner, as the kernel runs it.
  seq.resize(size_t(units));
  for (int ib = 0, m = 0; ib < nib; ++ib)
    for (int t = 0; t < ntaps; ++t) seq[size_t(m++)] = ib * T + taps[t];
  std::array<std::atomic<int64_t>, kMaxCandidates> best{};
  const auto window_max = ctx.kernels().chain_window_max.fn;
  // Lanes per task item: a multiple of 16, so that the kernel's vectors of lanes are full.
  const int64_t grain = std::max<int64_t>(16, 8192 / std::max(1, units) / 16 * 16);
  ctx.parallel_for((lanes + grain - 1) / grain, [&](int64_t g0, int64_t g1) {
    int64_t local[kMaxCandidates] = {};
    const int64_t l0 = g0 * grain, l1_end = std::min<int64_t>(lanes, g1 * grain);
    window_max(simd::ChainWindowArgs{unit_l1 + l0 * lane_stride, lane_stride, int(l1_end - l0), seq.data(), units,
                                     n.data(), int(nc)},
               local);
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

}  // namespace conv_int16_detail

// Chain tables of every phase's row groups and edge columns, from the per-lane unit L1 norms
// (lanes: the pass's output channels; units: (input block, tap)).
void ConvInt16::Impl::measure_chains(PixelPass& pp, const int32_t* unit_l1, int64_t pair_l1, int headroom) {
  for_each_tap_chain(pp, [&](TapChain& c, const int32_t* taps, int ntaps) {
    c.measure(ctx, unit_l1, pp.out_blocks * 16, int64_t(pp.in_blocks) * T, pp.in_blocks, T, taps, ntaps,
              measure_floor(headroom), pair_l1, opt.chain_override);
  });
}

// Sets every chain of a pass for sources of magnitude <= a (or the override); returns the
// shortest over the sequences that have taps, which the pass reports.
int ConvInt16::Impl::choose_chains(PixelPass& pp, int64_t a) {
  int shortest = kMaxChain;
  for_each_tap_chain(pp, [&](TapChain& c, const int32_t*, int ntaps) {
    const int steps = c.choose(a, opt.chain_override);
    if (ntaps > 0) shortest = std::min(shortest, steps);
  });
  return shortest;
}

}  // namespace dfp
