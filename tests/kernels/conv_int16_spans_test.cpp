// INT16 convolution fed by a producer's spans: x quantized span by span as a BatchNorm hands it
// over (quantize_input_spans), and the weight gradient's batch-pair copy computed again from the
// producer in the backward pass (recompute_input_pairs), with and without quantized pairs offered.
// The rest of the operator's suite is in conv_int16_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/dfp16.hpp"
#include "dfp/conv.hpp"
#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"
#include "src/core/aligned_buffer.hpp"
#include "tests/common/conv_int16_cases.hpp"
#include "tests/common/expect_error.hpp"
#include "tests/common/isa_levels.hpp"
#include "tests/common/reference.hpp"

using namespace dfp;
using namespace test::conv_int16_cases;

namespace {
// x's spans from a blocked tensor, as a BatchNorm hands them to a conv; counts the calls.
struct Producer {
  const std::vector<float>* xb;
  ConvShape s;
  std::atomic<int> calls{0};
  static void span(void* self, int n, int b, int h, int w0, int count, float* out) {
    auto& p = *static_cast<Producer*>(self);
    ASSERT_LE(count, ConvInt16::kInputSpanPixels);
    const size_t off = ((size_t(n) * channel_blocks(p.s.C) + b) * p.s.H + h) * p.s.W + w0;
    std::memcpy(out, p.xb->data() + off * 16, size_t(count) * 16 * sizeof(float));
    ++p.calls;
  }
  // The spans of images n and n + 1 quantized (the reference's nearest rounding) and interleaved,
  // declining rows h = 1 (mod 3) and whatever the quantization would count, as a producer may.
  std::atomic<int> pair_calls{0};
  static bool pair_span(void* self, int n, int images, int b, int h, int w0, int count, int exponent, int16_t* out,
                        int32_t* max_q) {
    auto& p = *static_cast<Producer*>(self);
    if (h % 3 == 1) return false;
    const size_t len = size_t(count) * 16;
    std::vector<float> f(len);
    std::vector<int16_t> q[2] = {std::vector<int16_t>(len), std::vector<int16_t>(len, 0)};
    for (int i = 0; i < images; ++i) {
      const size_t off = ((size_t(n + i) * channel_blocks(p.s.C) + b) * p.s.H + h) * p.s.W + w0;
      std::memcpy(f.data(), p.xb->data() + off * 16, len * sizeof(float));
      simd::QuantCounters cnt;
      simd::ref::quantize(f.data(), q[i].data(), len, exponent, Rounding::nearest_even, 0, 0, &cnt);
      if (cnt.saturated || cnt.nonfinite || cnt.max_abs_q >= 32767) return false;
      max_q[i] = cnt.max_abs_q;
    }
    if (images == 1) max_q[1] = 0;
    simd::ref::interleave(q[0].data(), images == 2 ? q[1].data() : nullptr, out, len);
    ++p.pair_calls;
    return true;
  }
  // One span quantized (nearest) into x's layout, declining rows h = 1 (mod 3) and whatever the
  // quantization would count.
  std::atomic<int> quantized_calls{0};
  static bool quantized_span(void* self, int n, int b, int h, int w0, int count, int exponent, int16_t* out,
                             int32_t* max_q) {
    auto& p = *static_cast<Producer*>(self);
    if (h % 3 == 1) return false;
    const size_t len = size_t(count) * 16;
    const size_t off = ((size_t(n) * channel_blocks(p.s.C) + b) * p.s.H + h) * p.s.W + w0;
    simd::QuantCounters cnt;
    simd::ref::quantize(p.xb->data() + off * 16, out, len, exponent, Rounding::nearest_even, 0, 0, &cnt);
    if (cnt.saturated || cnt.nonfinite || cnt.max_abs_q >= 32767) return false;
    *max_q = cnt.max_abs_q;
    ++p.quantized_calls;
    return true;
  }
};
}  // namespace

// quantize_input_spans gives the bits of quantize_input_with_max_abs on the tensor the spans make
// up: forward output, weight gradient (which reads the batch-pair copy), stats, for nearest and
// stochastic rounding, rows wider than one span (W = 150 > 128) and a strided padded layer; with
// quantized spans offered too (asked at nearest rounding, some declined).
TEST(ConvInt16, InputSpansGiveTheBitsOfTheTensor) {
  Context ctx(ContextOptions{.threads = 2});
  for (const ConvShape& s : {make(3, 20, 3, 150, 24, 3, 3, 1, 1), make(2, 32, 9, 11, 16, 3, 3, 2, 1)})
    for (Rounding r : {Rounding::nearest_even, Rounding::stochastic})
    for (Granularity g : {Granularity::tensor, Granularity::slice}) {  // slice: spans asked for more than once
      DfpConvOptions o;
      o.activations.rounding = r;
      o.activations.seed = 77;
      o.activations.granularity = g;
      const auto [w, xb, dyb, mx] = blocked_case(s, 41, true);
      std::vector<float> y[3], dw[3];
      ConvStats st[3];
      for (int k = 0; k < 3; ++k) {
        ConvInt16 c(ctx, s, o, "spans");
        ASSERT_TRUE(c.accepts_input_spans());
        c.set_step(5);
        c.set_weights(w.data());
        Producer p{&xb, s};
        if (k == 0)
          c.quantize_input_with_max_abs(xb.data(), mx);
        else
          c.quantize_input_spans(&Producer::span, &p, mx, nullptr, k == 2 ? &Producer::quantized_span : nullptr);
        if (k == 2) {  // asked for on the plane path at nearest rounding, declined spans then asked of span()
          const bool asked = r == Rounding::nearest_even && g == Granularity::tensor;
          EXPECT_EQ(p.quantized_calls.load() > 0, asked);
          if (asked) {
            EXPECT_GT(p.calls.load(), 0);
          }
        }
        y[k].assign(blocked_size(s.N, s.K, s.OH(), s.OW()), 0.f);
        dw[k].assign(w.size(), 0.f);
        c.forward(y[k].data());
        c.quantize_grad_output(dyb.data());
        c.backward_weights(dw[k].data());
        st[k] = c.stats();
      }
      for (int k = 1; k < 3; ++k) {
        expect_bits_equal(y[0], y[k], "forward");
        expect_bits_equal(dw[0], dw[k], "backward_weights");
        EXPECT_EQ(st[0].x.exponent, st[k].x.exponent);
        EXPECT_EQ(st[0].x.exponent_min, st[k].x.exponent_min);
        EXPECT_EQ(st[0].x.max_abs_int, st[k].x.max_abs_int);
        EXPECT_EQ(st[0].x.saturated, st[k].x.saturated);
      }
    }
  // A layer with unfolded columns gathers x across columns: spans are refused, naming the layer.
  ConvInt16 first(ctx, make(1, 3, 8, 8, 16, 3, 3, 1, 1), {}, "stem");
  EXPECT_FALSE(first.accepts_input_spans());
  test::expect_error([&] { first.quantize_input_spans(&Producer::span, nullptr, 1.f); }, Status::invalid_argument, {"stem"});
  ConvInt16 c(ctx, make(1, 16, 4, 4, 16, 3, 3, 1, 1), {}, "c");
  EXPECT_THROW(c.quantize_input_spans(&Producer::span, nullptr, -1.f), Error);
  EXPECT_THROW(c.quantize_input_spans(&Producer::span, nullptr, INFINITY), Error);
}

// recompute_input_pairs: the weight gradient's batch-pair copy of x is not kept but quantized
// again from the producer in backward_weights(), with the bits of the kept copy (forward, both
// backward passes), for nearest and biased rounding, one exponent or per-slice ones, rows wider
// than one span, an odd batch, a strided padded layer and a 1x1 layer, in a shared workspace that
// something else overwrote between the passes; also where the producer offers the spans already
// quantized into pairs (asked for under nearest rounding only, and declined for some rows). The workspace grows by the copy; a producer that
// changed its values since the forward changes dW (the copy really is computed again). Shapes
// whose copy is of another form (subsampled, unfolded, 1x1 pixels) and stochastic rounding keep it.
TEST(ConvInt16, RecomputedInputPairsGiveTheKeptCopysBits) {
  Context ctx(ContextOptions{.threads = 2});
  for (const ConvShape& s : {make(3, 20, 3, 150, 24, 3, 3, 1, 1), make(2, 32, 9, 11, 16, 3, 3, 2, 1),
                             make(3, 16, 5, 6, 40, 1, 1, 1, 0)})
    for (Rounding r : {Rounding::nearest_even, Rounding::biased})
    for (Granularity g : {Granularity::tensor, Granularity::slice}) {
      DfpConvOptions o;
      o.activations.rounding = r;
      o.activations.granularity = g;
      const auto [w, xb, dyb, mx] = blocked_case(s, 51, true);
      std::vector<float> y[4], dx[4], dw[4];
      size_t ws[4];
      ConvStats st[4];
      // Kept, recomputed, recomputed from changed values, recomputed with quantized pairs offered.
      for (int k = 0; k < 4; ++k) {
        ConvInt16 c(ctx, s, o, "again");
        std::vector<float> xk = xb;  // the producer's values, changed between the passes where k = 2
        Producer p{&xk, s};
        const size_t kept = c.workspace_bytes();
        if (k > 0) {
          ASSERT_TRUE(c.recompute_input_pairs(&Producer::span, &p, k == 3 ? &Producer::pair_span : nullptr));
        }
        ws[k] = c.workspace_bytes();
        AlignedBuffer<std::byte> region(ws[k]);
        c.use_workspace(region.data());
        c.set_step(3);
        c.set_weights(w.data());
        c.quantize_input_spans(&Producer::span, &p, mx);
        y[k].assign(blocked_size(s.N, s.K, s.OH(), s.OW()), 0.f);
        c.forward(y[k].data());
        std::memset(region.data(), 0x5a, ws[k]);  // another layer's use of the region
        if (k == 2) xk[xk.size() / 2 + 16] *= 0.5f;
        const int before = p.calls.load();
        c.quantize_grad_output(dyb.data());
        dx[k].assign(xb.size(), 0.f);
        dw[k].assign(w.size(), 0.f);
        c.backward_data(dx[k].data());
        if (k != 2) {  // nothing to do where k = 0; where k = 2 backward_weights does it
          EXPECT_EQ(c.recompute_input(), k > 0);
        }
        const int recomputed = p.calls.load() + p.pair_calls.load();
        c.backward_weights(dw[k].data());
        st[k] = c.stats();
        EXPECT_EQ(p.calls.load() + p.pair_calls.load() > before, k > 0);
        if (k == 1 || k == 3) {
          EXPECT_EQ(p.calls.load() + p.pair_calls.load(), recomputed);  // not computed twice
        }
        // Quantized pairs are taken where offered under nearest rounding, and the declined rows
        // come as float spans.
        EXPECT_EQ(p.pair_calls.load() > 0, k == 3 && r == Rounding::nearest_even);
        if (k == 3) {
          EXPECT_GT(p.calls.load(), before);
        }
        if (k > 0) {
          EXPECT_GE(ws[k], kept + size_t(s.N + 1) / 2 * 2 * s.H * s.W * channel_blocks(s.C) * 16 * 2);
        }
      }
      expect_bits_equal(y[0], y[1], "forward");
      expect_bits_equal(dx[0], dx[1], "backward_data");
      expect_bits_equal(dw[0], dw[1], "backward_weights");
      expect_bits_equal(y[0], y[3], "forward, pairs offered");
      expect_bits_equal(dx[0], dx[3], "backward_data, pairs offered");
      expect_bits_equal(dw[0], dw[3], "backward_weights, pairs offered");
      EXPECT_NE(0, std::memcmp(dw[0].data(), dw[2].data(), dw[0].size() * sizeof(float)));
      EXPECT_EQ(st[0].chain_wgrad, st[1].chain_wgrad);
      EXPECT_EQ(st[0].chain_wgrad, st[3].chain_wgrad);
    }
  auto refused = [&](const ConvShape& s, DfpConvOptions o, const char* what) {
    ConvInt16 c(ctx, s, o, "kept");
    const size_t ws = c.workspace_bytes();
    EXPECT_FALSE(c.recompute_input_pairs(&Producer::span, nullptr)) << what;
    EXPECT_EQ(c.workspace_bytes(), ws) << what;
  };
  DfpConvOptions stochastic;
  stochastic.activations.rounding = Rounding::stochastic;
  refused(make(2, 16, 6, 6, 16, 3, 3, 1, 1), stochastic, "stochastic");
  refused(make(2, 3, 8, 8, 16, 3, 3, 1, 1), {}, "unfolded");
  refused(make(2, 16, 8, 8, 32, 1, 1, 2, 0), {}, "subsampled");
  refused(make(4, 32, 1, 1, 16, 1, 1, 1, 0), {}, "1x1 pixels");
  ConvInt16 c(ctx, make(1, 16, 4, 4, 16, 3, 3, 1, 1), {}, "c");
  test::expect_error([&] { c.recompute_input_pairs(nullptr, nullptr); }, Status::invalid_argument, {"'c'"});
  AlignedBuffer<std::byte> region(c.workspace_bytes());  // sized without the copy
  c.use_workspace(region.data());
  test::expect_error([&] { c.recompute_input_pairs(&Producer::span, nullptr); }, Status::invalid_argument,
                     {"'c'", "use_workspace"});
}

namespace {
// dy's spans from a blocked tensor, as a BatchNorm's backward hands them to the conv before it;
// each returns the largest magnitude it wrote. Counts the calls.
struct GradProducer {
  const std::vector<float>* dyb;
  ConvShape s;
  std::atomic<int> calls{0};
  static float span(void* self, int n, int b, int h, int w0, int count, float* out) {
    auto& p = *static_cast<GradProducer*>(self);
    EXPECT_LE(count, ConvInt16::kInputSpanPixels);
    const size_t off = ((size_t(n) * channel_blocks(p.s.K) + b) * p.s.OH() + h) * p.s.OW() + w0;
    std::memcpy(out, p.dyb->data() + off * 16, size_t(count) * 16 * sizeof(float));
    float m = 0.f;
    for (int i = 0; i < count * 16; ++i) m = std::fabs(out[i]) > m ? std::fabs(out[i]) : m;
    ++p.calls;
    return m;
  }
  // One span quantized (nearest), with its largest magnitude, declining rows h = 1 (mod 3) and
  // whatever the quantization would count.
  std::atomic<int> quantized_calls{0};
  static float quantized_span(void* self, int n, int b, int h, int w0, int count, int exponent, int16_t* out,
                              int32_t* max_q) {
    auto& p = *static_cast<GradProducer*>(self);
    if (h % 3 == 1) return -1.f;
    const size_t len = size_t(count) * 16;
    const float* from = p.dyb->data() + (((size_t(n) * channel_blocks(p.s.K) + b) * p.s.OH() + h) * p.s.OW() + w0) * 16;
    simd::QuantCounters cnt;
    simd::ref::quantize(from, out, len, exponent, Rounding::nearest_even, 0, 0, &cnt);
    if (cnt.saturated || cnt.nonfinite || cnt.max_abs_q >= 32767) return -1.f;
    *max_q = cnt.max_abs_q;
    float m = 0.f;
    for (size_t i = 0; i < len; ++i) m = std::fabs(from[i]) > m ? std::fabs(from[i]) : m;
    ++p.quantized_calls;
    return m;
  }
};
}  // namespace

// quantize_grad_output_spans gives the bits of quantize_grad_output_with_max_abs on the tensor the
// spans make up, with its max|dy|, whatever the estimate: both backward passes and the stats, for
// nearest and stochastic rounding, rows wider than one span (OW = 150 > 128), a strided layer, an
// odd batch and a layer without a backward-data pass. An estimate at the tensor's exponent asks for
// each span once; one above it or below it asks again, and says that it did. The same with
// quantized spans offered too (asked at nearest rounding, some declined and asked of span()).
TEST(ConvInt16, GradOutputSpansGiveTheBitsOfTheTensor) {
  Context ctx(ContextOptions{.threads = 2});
  for (const ConvShape& s : {make(3, 20, 3, 150, 24, 3, 3, 1, 1), make(2, 32, 9, 11, 16, 3, 3, 2, 1)})
    for (bool input_gradient : {true, false})
      for (Rounding r : {Rounding::nearest_even, Rounding::stochastic}) {
        DfpConvOptions o;
        o.gradients.rounding = r;
        o.gradients.seed = 91;
        o.input_gradient = input_gradient;
        const auto [w, xb, dyb, mx] = blocked_case(s, 43, true);
        float dy_max = 0.f;
        for (float v : dyb) dy_max = std::max(dy_max, std::fabs(v));
        ASSERT_GT(dy_max, 0.f);
        const int spans = s.N * channel_blocks(s.K) * s.OH() * ((s.OW() + ConvInt16::kInputSpanPixels - 1) /
                                                                  ConvInt16::kInputSpanPixels);
        for (float factor : {1.f, 2.5f, 0.3f, 0.f}) {
          std::vector<float> dx[3], dw[3];
          ConvStats st[3];
          for (int k = 0; k < 3; ++k) {
            ConvInt16 c(ctx, s, o, "grad spans");
            ASSERT_TRUE(c.accepts_grad_output_spans());
            c.set_step(3);
            c.set_weights(w.data());
            c.quantize_input_with_max_abs(xb.data(), mx);
            GradProducer p{&dyb, s};
            if (k == 0) {
              c.quantize_grad_output_with_max_abs(dyb.data(), dy_max);
            } else if (k == 1) {
              const bool held = c.quantize_grad_output_spans(&GradProducer::span, &p, dy_max * factor);
              EXPECT_EQ(held, factor == 1.f) << factor;
              EXPECT_EQ(p.calls.load(), held ? spans : 2 * spans) << factor;
            } else {
              const bool held =
                  c.quantize_grad_output_spans(&GradProducer::span, &p, dy_max * factor, &GradProducer::quantized_span);
              EXPECT_EQ(held, factor == 1.f) << factor;
              const int asked = p.calls.load() + p.quantized_calls.load();  // each span once from one or the other
              EXPECT_EQ(asked, held ? spans : 2 * spans) << factor;
              EXPECT_EQ(p.quantized_calls.load() > 0, r == Rounding::nearest_even) << factor;
              if (r == Rounding::nearest_even) {
                EXPECT_GT(p.calls.load(), 0) << factor;
              }
            }
            if (input_gradient) {
              dx[k].assign(blocked_size(s.N, s.C, s.H, s.W), 0.f);
              c.backward_data(dx[k].data());
            }
            dw[k].assign(w.size(), 0.f);
            c.backward_weights(dw[k].data());
            st[k] = c.stats();
          }
          for (int k = 1; k < 3; ++k) {
            const std::string what = describe(s) + " factor " + std::to_string(factor) + " variant " + std::to_string(k);
            if (input_gradient) expect_bits_equal(dx[0], dx[k], ("backward_data " + what).c_str());
            expect_bits_equal(dw[0], dw[k], ("backward_weights " + what).c_str());
            EXPECT_EQ(st[0].dy.exponent, st[k].dy.exponent) << what;
            EXPECT_EQ(st[0].dy.max_abs, st[k].dy.max_abs) << what;
            EXPECT_EQ(st[0].dy.max_abs_int, st[k].dy.max_abs_int) << what;
            EXPECT_EQ(st[0].dy.saturated, st[k].dy.saturated) << what;
          }
        }
      }
  // Exponents per slice of dy are not taken from spans; nor is an estimate that is not a finite
  // number >= 0. Each refusal names the layer.
  DfpConvOptions sliced;
  sliced.gradients.granularity = Granularity::slice;
  ConvInt16 per_slice(ctx, make(2, 16, 4, 4, 16, 3, 3, 1, 1), sliced, "sliced");
  EXPECT_FALSE(per_slice.accepts_grad_output_spans());
  test::expect_error([&] { per_slice.quantize_grad_output_spans(&GradProducer::span, nullptr, 1.f); },
                     Status::invalid_argument, {"sliced"});
  ConvInt16 c(ctx, make(1, 16, 4, 4, 16, 3, 3, 1, 1), {}, "c");
  test::expect_error([&] { c.quantize_grad_output_spans(&GradProducer::span, nullptr, -1.f); },
                     Status::invalid_argument, {"'c'"});
  EXPECT_THROW(c.quantize_grad_output_spans(&GradProducer::span, nullptr, NAN), Error);
  EXPECT_THROW(c.quantize_grad_output_spans(nullptr, nullptr, 1.f), Error);
}

// forward_quantized: the output quantized as each kernel call makes it has the bits of forward(),
// the bias added, then quantize() at the same exponent, over every edge shape (row calls, edge
// columns, image tiles, unfolded columns, groups of images per item, a partial last output block)
// at every kernel level; the counters are quantize()'s over the whole output: an exponent one
// below max|y|'s with no headroom saturates the largest values, and a NaN in the bias shows as
// non-finite outputs. Stochastic rounding draws element i's number i. exponent_holds() says
// whether the exponent is max|y|'s (false at the edges of its binade, where max|q| leaves it
// open). The FP32 y is not written, and forward() still runs on the same operands afterwards.
TEST(ConvInt16, ForwardQuantizedGivesTheBitsOfForwardThenQuantize) {
  for (Isa level : test::isa_levels()) {
    Context ctx(ContextOptions{.threads = 2, .isa = isa_name(level)});
    uint32_t seed = 300;
    for (const ConvShape& s : edge_shapes())
      for (bool bias : {false, true})
        for (Rounding r : {Rounding::nearest_even, Rounding::stochastic}) {
          SCOPED_TRACE(std::string(isa_name(level)) + " " + describe(s) + (bias ? " bias " : " ") + rounding_name(r));
          const auto [w, xb, dyb, mx] = blocked_case(s, ++seed, false);
          ConvInt16 c(ctx, s, {}, "fwdq");
          c.set_weights(w.data());
          c.quantize_input(xb.data());
          const size_t n = blocked_size(s.N, s.K, s.OH(), s.OW());
          std::vector<float> b(size_t(channel_blocks(s.K)) * 16, 0.f);
          if (bias)
            for (int k = 0; k < s.K; ++k) b[size_t(k)] = 0.01f * float(k % 7) - 0.03f;
          std::vector<float> y(n, -1.f);
          c.forward(y.data());
          if (bias)
            for (size_t i = 0; i < n; ++i) y[i] += b[(i / (16 * size_t(s.OH()) * s.OW())) % channel_blocks(s.K) * 16 + i % 16];
          uint64_t nf = 0;
          const float y_max = simd::ref::max_abs(y.data(), n, &nf);
          ASSERT_EQ(nf, 0u);
          for (bool over : {false, true}) {  // over: one bit more than max|y| has
            const int e = over ? dfp16_exponent(y_max, 0) - 1 : dfp16_exponent(y_max, kDfpDefaultHeadroom);
            std::vector<int16_t> want(n), got(n, 12345);
            simd::QuantCounters cnt;
            simd::ref::quantize(y.data(), want.data(), n, e, r, 99, 0, &cnt);
            ConvInt16::QuantizedOutput q;
            q.y = got.data();
            q.exponent = e;
            q.rounding = r;
            q.seed = 99;
            q.bias = bias ? b.data() : nullptr;
            c.forward_quantized(q);
            ASSERT_EQ(0, std::memcmp(want.data(), got.data(), n * sizeof(int16_t))) << "exponent " << e;
            // The exponent of max|y| holds, unless max|q| lies at its binade's edge; one below does not.
            const int32_t lo = 1 << (14 - kDfpDefaultHeadroom), hi = 1 << (15 - kDfpDefaultHeadroom);
            if (!over && y_max > 0.f) {
              EXPECT_EQ(q.exponent_holds(kDfpDefaultHeadroom), cnt.max_abs_q != lo && cnt.max_abs_q != hi);
            }
            if (over) {
              EXPECT_FALSE(q.exponent_holds(kDfpDefaultHeadroom));
            }
            EXPECT_EQ(q.saturated, cnt.saturated);
            EXPECT_EQ(q.nonfinite, 0u);
            EXPECT_EQ(q.max_abs_q, cnt.max_abs_q);
            if (over && y_max > 0.f) {
              EXPECT_GT(q.saturated, 0u);
            }
          }
          std::vector<float> again(n, -1.f);
          c.forward(again.data());
          if (bias)
            for (size_t i = 0; i < n; ++i)
              again[i] += b[(i / (16 * size_t(s.OH()) * s.OW())) % channel_blocks(s.K) * 16 + i % 16];
          expect_bits_equal(y, again, "forward after forward_quantized");
        }
    // A NaN in the bias: the quantized output counts the non-finite values (stored as 0), and
    // its exponent does not hold.
    const ConvShape s = make(2, 16, 6, 6, 32, 3, 3, 1, 1);
    const auto [w, xb, dyb, mx] = blocked_case(s, 7, false);
    ConvInt16 c(ctx, s, {}, "nan");
    c.set_weights(w.data());
    c.quantize_input(xb.data());
    const size_t n = blocked_size(s.N, s.K, s.OH(), s.OW());
    std::vector<float> y(n), b(32, 0.f);
    b[3] = NAN;
    c.forward(y.data());
    for (size_t i = 0; i < n; ++i) y[i] += b[(i / (16 * size_t(s.OH()) * s.OW())) % 2 * 16 + i % 16];
    uint64_t nf = 0;
    const float y_max = simd::ref::max_abs(y.data(), n, &nf);
    ASSERT_EQ(nf, uint64_t(s.N) * s.OH() * s.OW());
    std::vector<int16_t> got(n);
    ConvInt16::QuantizedOutput q;
    q.y = got.data();
    q.exponent = dfp16_exponent(y_max, kDfpDefaultHeadroom);
    q.bias = b.data();
    c.forward_quantized(q);
    EXPECT_EQ(q.nonfinite, nf);
    EXPECT_FALSE(q.exponent_holds(kDfpDefaultHeadroom));
  }
  // exponent_holds(): max|q| strictly inside the binade that headroom h gives, every value finite.
  ConvInt16::QuantizedOutput h;
  for (int headroom : {0, 1, 2, 3}) {
    const int32_t lo = 1 << (14 - headroom), hi = std::min(1 << (15 - headroom), 32767);
    for (int32_t m : {0, lo - 1, lo, lo + 1, hi - 1, hi, hi + 1}) {
      h.max_abs_q = m;
      h.nonfinite = 0;
      EXPECT_EQ(h.exponent_holds(headroom), m > lo && m < hi) << headroom << " " << m;
      h.nonfinite = 1;
      EXPECT_FALSE(h.exponent_holds(headroom));
    }
  }
  Context ctx(ContextOptions{.threads = 2});
  ConvInt16 c(ctx, make(1, 16, 4, 4, 16, 3, 3, 1, 1), {}, "no_output");
  const auto [w, xb, dyb, mx] = blocked_case(make(1, 16, 4, 4, 16, 3, 3, 1, 1), 3, false);
  c.set_weights(w.data());
  c.quantize_input(xb.data());
  ConvInt16::QuantizedOutput q;
  test::expect_error([&] { c.forward_quantized(q); }, Status::invalid_argument, {"no_output"});
}
