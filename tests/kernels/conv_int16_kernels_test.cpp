// The INT16 convolution's micro-kernels called directly, against their scalar reference twins:
// the chain tables' window maxima, the AVX2 kernels in both instruction forms (a CPU's table holds
// one), and the pair kernel's planes. Each test runs every level this CPU has itself, so the suite
// has no forced-level re-runs (conv_int16_test.cpp runs the operators built on these kernels).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "dfp/isa.hpp"
#include "simd/kernel_table.hpp"
#include "tests/common/reference.hpp"

using namespace dfp;
using test::random_ints;
using test::random_vec;

namespace {

// Calls fn on a copy of start, its output (dst, a member of the kernel's arguments) pointed at the
// copy, and whether the copy then equals want bit for bit.
template <class Args>
bool same_bits(Args a, float* Args::*dst, void (*fn)(const Args&), const std::vector<float>& start,
               const std::vector<float>& want) {
  std::vector<float> got = start;
  a.*dst = got.data();
  fn(a);
  return std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0;
}

// The pair kernel of every level this CPU runs but the reference, and the AVX2 kernel's two forms
// directly (the table takes only one of them on a CPU with AVX-VNNI).
std::vector<std::pair<std::string, simd::PairKernelFn>> pair_kernels_above_reference() {
  const CpuFeatures cpu = detect_cpu_features();
  std::vector<std::pair<std::string, simd::PairKernelFn>> fns;
  for (Isa isa : kIsaLevels) {
    if (isa == Isa::ref || !cpu.supports(isa)) continue;
    const simd::KernelTable t = simd::make_kernel_table(isa, cpu);
    fns.emplace_back(t.conv_s16_pair.name, t.conv_s16_pair.fn);
  }
  if (cpu.supports(Isa::avx2)) fns.emplace_back("avx2 direct", &simd::avx2::conv_s16_pair);
  if (cpu.supports(Isa::avx2) && cpu.avx_vnni) fns.emplace_back("avxvnni direct", &simd::avxvnni::conv_s16_pair);
  return fns;
}

// The pixel kernel of every level this CPU runs on a (its dst ignored) from start, against the
// reference's result, bit for bit; `what` names the case in a failure.
void expect_pixel_levels_match(simd::PixelKernelArgs a, bool scales, const std::vector<float>& lane_scale,
                               const std::vector<float>& pixel_scale, const std::vector<float>& start,
                               const std::string& what) {
  if (scales) {
    a.lane_scale = lane_scale.data();
    a.pixel_scale = pixel_scale.data();
  }
  std::vector<float> want = start;
  a.dst = want.data();
  simd::ref::conv_s16_pixel(a);
  const CpuFeatures cpu = detect_cpu_features();
  for (Isa isa : kIsaLevels) {
    if (!cpu.supports(isa)) continue;
    const simd::KernelTable t = simd::make_kernel_table(isa, cpu);
    EXPECT_TRUE(same_bits(a, &simd::PixelKernelArgs::dst, t.conv_s16_pixel.fn, start, want))
        << t.conv_s16_pixel.name << what << " scales " << scales;
  }
}

}  // namespace

// The chain tables' window maxima at every level this CPU runs, against the reference, which the
// test checks against a direct sum of every window: lane counts around the vector widths, unit
// sequences around the vector forms' 256-unit chunks and the reference's 1024, past the INT32
// limit of the vector forms (4096 units, which go to the reference), repeated and scattered
// offsets, the largest unit L1 (16 * 32768) everywhere, and maxima raised from what the caller had.
TEST(ConvInt16, ChainWindowMaxAtEveryLevelMatchesTheReference) {
  const CpuFeatures cpu = detect_cpu_features();
  uint32_t seed = 500;
  for (int units : {1, 7, 255, 256, 257, 600, 1025, 4095, 4100}) {
    for (int lanes : {1, 15, 16, 17, 40}) {
      for (int extreme = 0; extreme < 2; ++extreme) {
        const int64_t stride = units + 11;
        const auto vals = random_ints(size_t(lanes * stride), seed++, 0, 16 * 32768);
        std::vector<int32_t> l1(vals.begin(), vals.end());
        if (extreme) std::fill(l1.begin(), l1.end(), 16 * 32768);
        const auto offs = random_ints(size_t(units), seed++, 0, int(stride) - 1);
        std::vector<int32_t> seq(offs.begin(), offs.end());
        std::vector<int32_t> n;
        for (int c = 1; c <= units; c = c < 16 ? c + 1 : c + c / 2) n.push_back(c);
        if (n.back() != units) n.push_back(units);
        const simd::ChainWindowArgs a{l1.data(), stride, lanes, seq.data(), units, n.data(), int(n.size())};
        std::vector<int64_t> start(n.size());
        for (size_t i = 0; i < n.size(); ++i) start[i] = i % 3 == 0 ? int64_t(1) << 40 : int64_t(i);  // raised, never lowered
        std::vector<int64_t> want = start;
        simd::ref::chain_window_max(a, want.data());
        for (size_t i = 0; i < n.size(); ++i) {
          int64_t top = start[i];
          for (int lane = 0; lane < lanes; ++lane)
            for (int w0 = 0; w0 < units; w0 += n[i]) {
              int64_t sum = 0;
              for (int m = w0; m < std::min(units, w0 + n[i]); ++m) sum += l1[size_t(lane * stride + seq[size_t(m)])];
              top = std::max(top, sum);
            }
          ASSERT_EQ(want[i], top) << "reference, units " << units << " lanes " << lanes << " n " << n[i];
        }
        for (Isa isa : kIsaLevels) {
          if (isa == Isa::ref || !cpu.supports(isa)) continue;
          const simd::KernelTable t = simd::make_kernel_table(isa, cpu);
          std::vector<int64_t> got = start;
          t.chain_window_max.fn(a, got.data());
          ASSERT_EQ(want, got) << t.chain_window_max.name << ", units " << units << " lanes " << lanes << " extreme "
                               << extreme;
        }
      }
    }
  }
}

// The AVX2 micro-kernels, both forms (VPMADDWD + VPADDD, and AVX-VNNI's VPDPWSSD where the CPU has
// it: a CPU picks one, so the table alone would test one), called directly against the scalar
// model on random arguments: every pixel count up to max_pixels(nob) (the kernels split calls
// into sub-calls of at most 6 pixels and one block), both block counts, all strides the
// kernels specialise and others, partial channel pairs, chains of whole units and of single
// steps, accumulating and overwriting, and full-range operands (partial sums past 2^24, so that
// flush rounding shows; chains of more than one step wrap, as the model's do).
TEST(ConvInt16, Avx2MicroKernelsMatchTheScalarModel) {
  const CpuFeatures cpu = detect_cpu_features();
  if (!cpu.supports(Isa::avx2)) GTEST_SKIP() << "CPU lacks AVX2";
  std::vector<std::pair<const char*, simd::PixelKernelFn>> pixel = {{"avx2", &simd::avx2::conv_s16_pixel}};
  std::vector<std::pair<const char*, simd::PairKernelFn>> pair = {{"avx2", &simd::avx2::conv_s16_pair}};
  if (cpu.avx_vnni) {
    pixel.emplace_back("avxvnni", &simd::avxvnni::conv_s16_pixel);
    pair.emplace_back("avxvnni", &simd::avxvnni::conv_s16_pair);
  }
  uint32_t seed = 100;
  auto operands = [&](size_t n) { return test::random_int16(n, seed++); };
  for (int nob : {1, 2}) {
    for (int npix = 1; npix <= simd::max_pixels(nob); ++npix) {
      for (int variant = 0; variant < 4; ++variant) {
        const int nib = 2, ntaps = 3;
        const int pairs = variant == 3 ? 5 : 8;
        const int64_t src_pix = variant == 0 ? 16 : variant == 1 ? 32 : variant == 2 ? 48 : 16;
        const int64_t src_ib = src_pix * simd::max_pixels(1) + 64;
        const int64_t tap_span = 40;
        const std::vector<int16_t> src = operands(size_t(nib * src_ib + 2 * tap_span + 64));
        const int64_t wei_ib = 3 * 256, wei_ob = nib * wei_ib;
        const std::vector<int16_t> wei = operands(size_t(2 * wei_ob));
        const int64_t tap_src[3] = {0, tap_span, 2 * tap_span - 16};
        const int32_t tap_wei[3] = {2, 0, 1};
        for (int chain : {1, 3, 5, 8, 16, 48}) {
          for (bool accumulate : {false, true}) {
            const int64_t dst_pix = 16, dst_ob = 16 * 40;
            std::vector<float> start = random_vec(size_t(2 * dst_ob), seed++, -1e6f, 1e6f);
            simd::PixelKernelArgs a{};
            a.src = src.data(); a.wei = wei.data(); a.tap_src = tap_src; a.tap_wei = tap_wei;
            a.ntaps = ntaps; a.nib = nib; a.pairs = pairs; a.src_ib = src_ib; a.src_pix = src_pix;
            a.wei_ob = wei_ob; a.wei_ib = wei_ib; a.dst_ob = dst_ob; a.dst_pix = dst_pix;
            a.npix = npix; a.nob = nob; a.chain = chain; a.scale = 0x1p-20f; a.accumulate = accumulate;
            std::vector<float> want = start;
            a.dst = want.data();
            simd::ref::conv_s16_pixel(a);
            for (auto [name, fn] : pixel) {
              ASSERT_TRUE(same_bits(a, &simd::PixelKernelArgs::dst, fn, start, want))
                  << name << " pixel nob " << nob << " npix " << npix << " variant " << variant << " chain " << chain
                  << " accumulate " << accumulate;
            }
          }
        }
      }
    }
  }
  for (int nk = 1; nk <= 16; ++nk) {
    for (int chain : {1, 5, 12, 1000}) {
      for (bool accumulate : {false, true}) {
        for (float scale : {1.f, 0x1p-18f}) {
          const int rows = 3, cols = 4;
          const int64_t x_col = 48, x_row = cols * x_col + 32, dy_col = 40, dy_row = cols * dy_col + 8;
          const std::vector<int16_t> x = operands(size_t(rows * x_row + 32));
          const std::vector<int16_t> dy = operands(size_t(rows * dy_row + 32));
          const int64_t dw_k = 24;
          const std::vector<float> start = random_vec(size_t(16 * dw_k), seed++, -1e6f, 1e6f);
          simd::PairKernelArgs a{};
          a.x = x.data(); a.dy = dy.data(); a.dw_k = dw_k; a.nk = nk; a.rows = rows; a.cols = cols;
          a.x_row = x_row; a.x_col = x_col; a.dy_row = dy_row; a.dy_col = dy_col; a.chain = chain;
          a.scale = scale; a.accumulate = accumulate;
          std::vector<float> want = start;
          a.dw = want.data();
          simd::ref::conv_s16_pair(a);
          for (auto [name, fn] : pair) {
            ASSERT_TRUE(same_bits(a, &simd::PairKernelArgs::dw, fn, start, want))
                << name << " pair nk " << nk << " chain " << chain << " accumulate " << accumulate << " scale " << scale;
          }
        }
      }
    }
  }
}

// The pair kernel's planes (the weight gradient's image pairs in one call) at every level, and
// the AVX2 kernel's two forms, against the reference; and the reference's planes, accumulating,
// against a call per plane: 1-4 planes of 1-3 rows x 1-5 columns, a chain per plane (dividing
// its positions exactly, shorter, longer, one position) or one for all, every row count, and
// planes that continue the chain of the plane before them (kPlaneContinues) after chains that
// end mid-plane or with it.
// Full-range operands, so every flush point shows in the FP32 rounding; half the cases with a
// prefetch range (the AVX-512 kernels' other form).
TEST(ConvInt16, PairKernelPlanesAreACallPerPlaneAtEveryLevel) {
  const auto fns = pair_kernels_above_reference();
  uint32_t seed = 700;
  auto operands = [&](size_t n) { return test::random_int16(n, seed++); };
  int cases = 0;
  for (int nk : {1, 3, 8, 12, 16}) {
    for (int planes = 1; planes <= 4; ++planes) {
      for (int shape = 0; shape < 3; ++shape) {
        const int rows = 1 + shape, cols = shape == 0 ? 5 : shape == 1 ? 4 : 3;
        const int64_t x_col = 32, x_row = cols * x_col + 64, x_plane = rows * x_row + 96;
        const int64_t dy_col = 40, dy_row = cols * dy_col + 8, dy_plane = rows * dy_row + 32;
        const std::vector<int16_t> x = operands(size_t(planes * x_plane + 32));
        const std::vector<int16_t> dy = operands(size_t(planes * dy_plane + 32));
        const int n = rows * cols;
        for (int chains = 0; chains < 5; ++chains) {
          // chains 0: one for all planes; 1-3: per plane; 4: odd planes continue the even ones'.
          std::vector<int> plane_chain(static_cast<size_t>(planes), 0);
          for (int p = 0; p < planes; ++p)
            plane_chain[size_t(p)] = chains == 1   ? n
                                     : chains == 2 ? 1 + (p * 5 + 2) % (n + 2)
                                     : chains == 3 ? (p % 2 ? 1 : cols)
                                                   : (p % 2 ? simd::kPlaneContinues : 2 + p);
          for (bool accumulate : {false, true}) {
            const int64_t dw_k = 24;
            const std::vector<float> start = random_vec(size_t(16 * dw_k), seed++, -1e6f, 1e6f);
            simd::PairKernelArgs a{};
            a.x = x.data(); a.dy = dy.data(); a.dw_k = dw_k; a.nk = nk; a.rows = rows; a.cols = cols;
            a.x_row = x_row; a.x_col = x_col; a.dy_row = dy_row; a.dy_col = dy_col; a.chain = 3;
            a.scale = 1.f; a.accumulate = accumulate;
            a.planes = planes; a.x_plane = x_plane; a.dy_plane = dy_plane;
            a.plane_chain = chains ? plane_chain.data() : nullptr;
            if (chains % 2) {  // the kernels' prefetching forms (a hint: same result)
              a.prefetch = reinterpret_cast<const char*>(x.data());
              a.prefetch_end = a.prefetch + 64 * (n * planes / 2 + 1);
              if (chains == 3) {  // a range per plane, each within its plane of x
                a.prefetch_end = a.prefetch + 64 * (n / 2 + 1);
                a.prefetch_plane = x_plane * int64_t(sizeof(int16_t));
              }
            }
            std::vector<float> want = start;
            a.dw = want.data();
            simd::ref::conv_s16_pair(a);
            if (accumulate && chains != 4) {  // the reference's planes are its calls, one per plane
              std::vector<float> each = start;
              simd::PairKernelArgs one = a;
              one.planes = 1;
              one.plane_chain = nullptr;
              one.dw = each.data();
              for (int p = 0; p < planes; ++p) {
                one.x = x.data() + p * x_plane;
                one.dy = dy.data() + p * dy_plane;
                one.chain = chains ? plane_chain[size_t(p)] : a.chain;
                simd::ref::conv_s16_pair(one);
              }
              ASSERT_EQ(0, std::memcmp(want.data(), each.data(), want.size() * 4))
                  << "reference planes " << planes << " nk " << nk << " shape " << shape << " chains " << chains;
            }
            for (const auto& [name, fn] : fns) {
              ASSERT_TRUE(same_bits(a, &simd::PairKernelArgs::dw, fn, start, want))
                  << name << " planes " << planes << " nk " << nk << " shape " << shape << " chains " << chains
                  << " accumulate " << accumulate;
            }
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 5 * 4 * 3 * 5 * 2);
}

// A plane that continues the chain before it (kPlaneContinues) adds into the same INT32 sums: one
// flush for the planes together, where a flush per plane rounds each plane's part into dw. Each
// of four planes adds 1 to every output (one position of x and dy at 1); dw starts at 2^24, where
// FP32 steps by 2: a flush per plane adds 1 four times and rounds back to 2^24 each time (ties
// to even), one flush for all four adds 4. At every level and AVX2 form, overwriting and
// accumulating.
TEST(ConvInt16, PairKernelPlanesThatContinueFlushOnceAtEveryLevel) {
  auto fns = pair_kernels_above_reference();
  fns.emplace(fns.begin(), "ref", &simd::ref::conv_s16_pair);
  const int planes = 4, rows = 2, cols = 3;
  const int64_t x_plane = rows * cols * 32, dy_plane = x_plane;
  std::vector<int16_t> x(size_t(planes * x_plane), 0), dy(size_t(planes * dy_plane), 0);
  for (int p = 0; p < planes; ++p)
    for (int i = 0; i < 32; ++i) {  // position (1, 2) of each plane, image 0 only: a product of 1
      x[size_t(p * x_plane + 5 * 32 + i)] = i % 2 == 0 ? 1 : 0;
      dy[size_t(p * dy_plane + 5 * 32 + i)] = i % 2 == 0 ? 1 : 0;
    }
  for (const auto& [name, fn] : fns)
    for (bool join : {false, true})
      for (int nk : {1, 5, 16}) {
        std::vector<int> plane_chain(planes, 1000);
        if (join) plane_chain[1] = plane_chain[2] = plane_chain[3] = simd::kPlaneContinues;
        std::vector<float> dw(16 * 16, 0x1p24f);
        simd::PairKernelArgs a{};
        a.x = x.data(); a.dy = dy.data(); a.dw = dw.data(); a.dw_k = 16; a.nk = nk; a.rows = rows; a.cols = cols;
        a.x_row = cols * 32; a.x_col = 32; a.dy_row = cols * 32; a.dy_col = 32; a.chain = 1000; a.scale = 1.f;
        a.accumulate = true;
        a.planes = planes; a.x_plane = x_plane; a.dy_plane = dy_plane; a.plane_chain = plane_chain.data();
        fn(a);
        for (int k = 0; k < nk; ++k)
          for (int l = 0; l < 16; ++l)
            ASSERT_EQ(dw[size_t(k * 16 + l)], join ? 0x1p24f + 4.f : 0x1p24f)
                << name << (join ? " joined" : " per plane") << " nk " << nk << " row " << k << " lane " << l;
        // Overwriting: the planes' sums (4 either way, exact), scaled once.
        a.accumulate = false;
        a.scale = 0.5f;
        fn(a);
        for (int k = 0; k < nk; ++k) ASSERT_EQ(dw[size_t(k * 16)], 2.f) << name << " overwriting nk " << nk;
      }
}

// Several pixel-kernel calls that share their weights (PixelCallsFn) at every level against the
// reference's calls one by one: the AVX-512 levels run two or three calls of at most 7 or 4
// pixels over one pass of the weights, each call with its own source, output, chain, scale and
// lane and pixel scales; the rest (one output block, partial channel pairs, a source stride
// other than 16, chains not of whole units, more pixels) run the calls one by one. Full-range
// operands, so every call's own flush points show in the FP32 rounding, and chains that differ
// between the calls of one group.
TEST(ConvInt16, PixelCallsAreTheCallsOneByOneAtEveryLevel) {
  const CpuFeatures cpu = detect_cpu_features();
  uint32_t seed = 900;
  auto operands = [&](size_t n) { return test::random_int16(n, seed++); };
  const int nib = 3, ntaps = 3, max_calls = 3;
  const int64_t tap_span = 40, wei_ib = ntaps * 256, wei_ob = nib * wei_ib;
  const int64_t tap_src[ntaps] = {0, tap_span, 2 * tap_span - 16};
  const int32_t tap_wei[ntaps] = {2, 0, 1};
  const std::vector<int16_t> wei = operands(size_t(2 * wei_ob));
  // Powers of two: call k reads lanes from 4k and pixels from k (2 blocks of 16 lanes, 8 pixels).
  std::vector<float> lane_scale(4 * (max_calls - 1) + 32), pixel_scale(max_calls - 1 + 8);
  for (size_t i = 0; i < lane_scale.size(); ++i) lane_scale[i] = std::ldexp(1.f, int(i * 7 % 9) - 4);
  for (size_t i = 0; i < pixel_scale.size(); ++i) pixel_scale[i] = std::ldexp(1.f, int(i * 5 % 7) - 3);
  for (int nob : {1, 2}) {
    for (int npix = 1; npix <= 8; ++npix) {
      // 0: the fused form; 2: the same with a source pixel stride of 32 (stride 2); 1, 3 and 4:
      // what it declines (5 pairs, a one-step chain, a source pixel stride of 48).
      for (int variant = 0; variant < 5; ++variant) {
        const int pairs = variant == 1 ? 5 : 8;
        const int64_t src_pix = variant == 2 ? 32 : variant == 4 ? 48 : 16;
        const int64_t src_ib = src_pix * 8 + 64;
        std::vector<std::vector<int16_t>> src;
        for (int k = 0; k < max_calls; ++k) src.push_back(operands(size_t(nib * src_ib + 2 * tap_span + 64)));
        for (int count = 1; count <= max_calls; ++count) {
          for (bool accumulate : {false, true}) {
            for (bool scales : {false, true}) {
              const int64_t dst_pix = 16, dst_ob = 16 * 8;
              const std::vector<float> start = random_vec(size_t(max_calls * 2 * dst_ob), seed++, -1e6f, 1e6f);
              simd::PixelKernelArgs calls[max_calls];
              std::vector<float> want = start;
              for (int k = 0; k < count; ++k) {
                simd::PixelKernelArgs& a = calls[k];
                a = simd::PixelKernelArgs{};
                a.src = src[size_t(k)].data(); a.wei = wei.data(); a.tap_src = tap_src; a.tap_wei = tap_wei;
                a.ntaps = ntaps; a.nib = nib; a.pairs = pairs; a.src_ib = src_ib; a.src_pix = src_pix;
                a.wei_ob = wei_ob; a.wei_ib = wei_ib; a.dst_ob = dst_ob; a.dst_pix = dst_pix;
                a.npix = npix; a.nob = nob; a.accumulate = accumulate;
                // Chains of whole units (8 steps) that differ between the calls; variant 3 one step.
                a.chain = variant == 3 ? 1 + k : pairs * (1 + 2 * k);
                a.scale = k == 1 ? 0x1p-18f : 0x1p-20f;
                if (scales) {
                  a.lane_scale = lane_scale.data() + 4 * k;
                  a.pixel_scale = pixel_scale.data() + k;
                }
                a.dst = want.data() + size_t(k) * 2 * dst_ob;
                simd::ref::conv_s16_pixel(a);
              }
              for (Isa isa : kIsaLevels) {
                if (!cpu.supports(isa)) continue;
                const simd::KernelTable t = simd::make_kernel_table(isa, cpu);
                std::vector<float> got = start;
                simd::PixelKernelArgs c[max_calls];
                for (int k = 0; k < count; ++k) {
                  c[k] = calls[k];
                  c[k].dst = got.data() + size_t(k) * 2 * dst_ob;
                }
                t.conv_s16_pixel_calls.fn(c, count);
                ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
                    << t.conv_s16_pixel_calls.name << " nob " << nob << " npix " << npix << " variant " << variant
                    << " calls " << count << " accumulate " << accumulate << " scales " << scales;
              }
            }
          }
        }
      }
    }
  }
}

// The pixel kernel at every level against the reference where the chain is near the call's steps
// (nib * ntaps * 8): one unit short of them (a flush in the loop), exactly them and beyond them, in
// both directions, with and without lane and pixel scales (accumulating calls without them take a
// variant of their own), at the two compile-time source strides and the widest tiles.
TEST(ConvInt16, PixelKernelChainsAroundTheCallAtEveryLevel) {
  uint32_t seed = 1300;
  auto operands = [&](size_t n) { return test::random_int16(n, seed++); };
  const int nib = 2, ntaps = 2, steps = nib * ntaps * 8;
  const int64_t tap_span = 48, wei_ib = ntaps * 256, wei_ob = nib * wei_ib;
  const int64_t tap_src[ntaps] = {0, tap_span};
  const int32_t tap_wei[ntaps] = {1, 0};
  const std::vector<int16_t> wei = operands(size_t(2 * wei_ob));
  std::vector<float> lane_scale(32), pixel_scale(28);
  for (size_t i = 0; i < lane_scale.size(); ++i) lane_scale[i] = std::ldexp(1.f, int(i * 7 % 9) - 4);
  for (size_t i = 0; i < pixel_scale.size(); ++i) pixel_scale[i] = std::ldexp(1.f, int(i * 5 % 7) - 3);
  for (int nob : {1, 2}) {
    for (int npix : {1, 5, 14, 28}) {
      if (npix > simd::max_pixels(nob)) continue;
      for (int64_t src_pix : {16, 32}) {
        const int64_t src_ib = src_pix * npix + 2 * tap_span;
        const std::vector<int16_t> src = operands(size_t(nib * src_ib + 64));
        for (int chain : {steps - 8, steps, steps + 8, 1 << 20}) {
          for (bool accumulate : {false, true}) {
            for (bool scales : {false, true}) {
              const int64_t dst_pix = 16, dst_ob = 16 * npix;
              const std::vector<float> start = random_vec(size_t(2 * dst_ob), seed++, -1e6f, 1e6f);
              simd::PixelKernelArgs a{};
              a.src = src.data(); a.wei = wei.data(); a.tap_src = tap_src; a.tap_wei = tap_wei;
              a.ntaps = ntaps; a.nib = nib; a.pairs = 8; a.src_ib = src_ib; a.src_pix = src_pix;
              a.wei_ob = wei_ob; a.wei_ib = wei_ib; a.dst_ob = dst_ob; a.dst_pix = dst_pix;
              a.npix = npix; a.nob = nob; a.accumulate = accumulate; a.chain = chain; a.scale = 0x1p-20f;
              expect_pixel_levels_match(a, scales, lane_scale, pixel_scale, start,
                                        " nob " + std::to_string(nob) + " npix " + std::to_string(npix) +
                                            " src_pix " + std::to_string(src_pix) + " chain " + std::to_string(chain) +
                                            " accumulate " + std::to_string(accumulate));
            }
          }
        }
      }
    }
  }
}

// One output block whose taps come in runs over consecutive source pixels (a stride-1 layer's
// rows of taps) and whose chain covers the call: the AVX-512 VNNI level broadcasts each source
// pair once for the run's taps (pixel_kernel_shared_src). Against the reference at every level:
// 3x3 (runs of 3) and 5x5 (3 then 2), both in either direction (backward data's taps run right
// to left), and taps two pixels apart (runs of 1); one and two input blocks, every pixel count,
// weights in a permuted tap order, chains of exactly the call's steps and beyond (taken) and one
// unit short (declined: a flush inside the call), overwriting and accumulating, with and without
// lane and pixel scales. Full-range operands: the INT32 sums wrap, which leaves them exact
// modulo 2^32 in any order, as the reference's are.
TEST(ConvInt16, PixelKernelSharedSourceRunsAtEveryLevel) {
  uint32_t seed = 1700;
  auto operands = [&](size_t n) { return test::random_int16(n, seed++); };
  std::vector<float> lane_scale(16), pixel_scale(28);
  for (size_t i = 0; i < lane_scale.size(); ++i) lane_scale[i] = std::ldexp(1.f, int(i * 7 % 9) - 4);
  for (size_t i = 0; i < pixel_scale.size(); ++i) pixel_scale[i] = std::ldexp(1.f, int(i * 5 % 7) - 3);
  const int64_t row = 16 * 40;  // source elements between tap rows
  struct Taps {
    int rows, cols, step;  // taps at r * row + c * step, c < cols (from the row's right end: step < 0)
  };
  for (const Taps& k : {Taps{3, 3, 16}, Taps{3, 3, -16}, Taps{5, 5, 16}, Taps{5, 5, -16}, Taps{3, 3, 32}}) {
    const int ntaps = k.rows * k.cols;
    std::vector<int64_t> tap_src;
    std::vector<int32_t> tap_wei;
    for (int r = 0; r < k.rows; ++r)
      for (int c = 0; c < k.cols; ++c) {
        tap_src.push_back(r * row + (k.step > 0 ? c : c - k.cols + 1) * k.step);
        tap_wei.push_back((r * k.cols + c) * 5 % ntaps);  // 5 is prime to 9 and 25: a permutation
      }
    for (int nib : {1, 2}) {
      const int steps = nib * ntaps * 8;
      const int64_t src_ib = k.rows * row + 64, wei_ib = int64_t(ntaps) * 256;
      const std::vector<int16_t> src = operands(size_t(nib * src_ib + 64));
      const std::vector<int16_t> wei = operands(size_t(nib * wei_ib));
      for (int npix = 1; npix <= simd::max_pixels(1); ++npix) {
        for (int chain : {steps - 8, steps, steps + 8, 1 << 20}) {
          for (bool accumulate : {false, true}) {
            for (bool scales : {false, true}) {
              const std::vector<float> start = random_vec(size_t(16 * npix), seed++, -1e6f, 1e6f);
              simd::PixelKernelArgs a{};
              a.src = src.data(); a.wei = wei.data(); a.tap_src = tap_src.data(); a.tap_wei = tap_wei.data();
              a.ntaps = ntaps; a.nib = nib; a.pairs = 8; a.src_ib = src_ib; a.src_pix = 16;
              a.wei_ob = nib * wei_ib; a.wei_ib = wei_ib; a.dst_ob = 16 * npix; a.dst_pix = 16;
              a.npix = npix; a.nob = 1; a.accumulate = accumulate; a.chain = chain; a.scale = 0x1p-20f;
              expect_pixel_levels_match(a, scales, lane_scale, pixel_scale, start,
                                        " taps " + std::to_string(k.rows) + "x" + std::to_string(k.cols) + " step " +
                                            std::to_string(k.step) + " nib " + std::to_string(nib) + " npix " +
                                            std::to_string(npix) + " chain " + std::to_string(chain) +
                                            " accumulate " + std::to_string(accumulate));
            }
          }
        }
      }
    }
  }
}
