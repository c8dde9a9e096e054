// Public DFP16 quantization API: exponent selection, parallel max-abs and quantization over the
// context's threads, and the non-finite policy (the options' names and checks: dfp16_options.cpp).
#include "dfp/dfp16.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "dfp/context.hpp"
#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"
#include "src/core/atomic_max.hpp"
#include "src/numerics/dfp16_internal.hpp"

namespace dfp {

namespace {
constexpr size_t kChunk = 1 << 16;  // elements per parallel task: large enough to stream well

int64_t chunks(size_t n) { return static_cast<int64_t>((n + kChunk - 1) / kChunk); }

}  // namespace

namespace detail {
std::string TensorName::text() const {
  if (layer.empty()) return "tensor '" + std::string(tensor) + "'";
  return "convolution '" + std::string(layer) + "': " + std::string(tensor) + " tensor";
}

void fail_nonfinite(const float* x, size_t n, uint64_t count, TensorName what) {
  std::string where;
  if (x) {
    size_t first = 0;
    while (first < n && std::isfinite(x[first])) ++first;
    where = ", first at element " + std::to_string(first) + (first < n ? " = " + std::to_string(x[first]) : "");
  }
  fail(Status::numerical_error, what.text() + ": " + std::to_string(count) + " non-finite value(s) (NaN/Inf)" + where +
                                    "; DFP16 has no encoding for them");
}

float exponent_max_abs(const Context& ctx, const float* src, size_t n, float known, NonFinitePolicy policy,
                       TensorName what) {
  if (known >= 0.f && std::isfinite(known)) return known;
  uint64_t bad = 0;
  const float m = max_abs(ctx, src, n, &bad);
  if (bad && policy == NonFinitePolicy::error) fail_nonfinite(src, n, bad, what);
  return m;
}
QuantStats quantize_slices(const Context& ctx, const float* src, int16_t* dst, size_t slices, size_t slice_len,
                           const QuantOptions& o, int* exps) {
  o.validate("quantization");
  const auto& k = ctx.kernels();
  std::atomic<uint64_t> saturated{0}, bad{0};
  std::atomic<int32_t> max_q{0}, e_max{std::numeric_limits<int32_t>::min()}, e_min_neg{std::numeric_limits<int32_t>::min()};
  std::atomic<uint32_t> best{0};
  ctx.parallel_for(static_cast<int64_t>(slices), [&](int64_t b, int64_t e) {
    simd::QuantCounters cnt;
    int32_t hi = std::numeric_limits<int32_t>::min(), lo_neg = std::numeric_limits<int32_t>::min();
    uint32_t m_bits = 0;
    for (int64_t s = b; s < e; ++s) {
      const size_t off = size_t(s) * slice_len;
      uint64_t ignored = 0;  // counted by the quantizer below
      const float m = k.max_abs.fn(src + off, slice_len, &ignored);
      const int x = dfp16_exponent(m, o.headroom);
      exps[s] = x;
      hi = std::max(hi, x);
      if (m > 0.f) lo_neg = std::max(lo_neg, -x);
      m_bits = std::max(m_bits, std::bit_cast<uint32_t>(m));
      k.quantize.fn(src + off, dst + off, slice_len, x, o.rounding, o.seed, off, &cnt);
    }
    atomic_add_nonzero(saturated, cnt.saturated);
    atomic_add_nonzero(bad, cnt.nonfinite);
    atomic_max(max_q, cnt.max_abs_q);
    atomic_max(e_max, hi);
    atomic_max(e_min_neg, lo_neg);
    atomic_max(best, m_bits);
  });
  QuantStats st;
  st.exponent = slices ? e_max.load() : 0;
  st.exponent_min = e_min_neg.load() == std::numeric_limits<int32_t>::min() ? st.exponent : -e_min_neg.load();
  st.saturated = saturated.load();
  st.nonfinite = bad.load();
  st.max_abs_int = max_q.load();
  st.max_abs = std::bit_cast<float>(best.load());
  if (st.nonfinite && o.nonfinite == NonFinitePolicy::error)
    fail_nonfinite(src, slices * slice_len, st.nonfinite, TensorName{o.name});
  return st;
}
}  // namespace detail

float max_abs(const Context& ctx, const float* x, size_t n, uint64_t* nonfinite) {
  const auto fn = ctx.kernels().max_abs.fn;
  // Non-negative floats order like their bit patterns, so an atomic max on the bits is exact.
  std::atomic<uint32_t> best{0};
  std::atomic<uint64_t> bad{0};
  ctx.parallel_for(chunks(n), [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      const size_t off = size_t(c) * kChunk;
      uint64_t local_bad = 0;
      const uint32_t m = std::bit_cast<uint32_t>(fn(x + off, std::min(kChunk, n - off), &local_bad));
      atomic_max(best, m);  // non-negative floats order as their bit patterns
      atomic_add_nonzero(bad, local_bad);
    }
  });
  if (nonfinite) *nonfinite += bad.load();
  return std::bit_cast<float>(best.load());
}

QuantStats quantize_dfp16_with_exponent(const Context& ctx, const float* src, int16_t* dst, size_t n, int exponent,
                                        const QuantOptions& o, uint64_t index_base) {
  o.validate("quantization");
  const auto fn = ctx.kernels().quantize.fn;
  std::atomic<uint64_t> saturated{0}, bad{0};
  std::atomic<int32_t> max_q{0};
  ctx.parallel_for(chunks(n), [&](int64_t b, int64_t e) {
    simd::QuantCounters cnt;
    for (int64_t c = b; c < e; ++c) {
      const size_t off = size_t(c) * kChunk;
      fn(src + off, dst + off, std::min(kChunk, n - off), exponent, o.rounding, o.seed, index_base + off, &cnt);
    }
    atomic_add_nonzero(saturated, cnt.saturated);
    atomic_add_nonzero(bad, cnt.nonfinite);
    atomic_max(max_q, cnt.max_abs_q);
  });
  QuantStats st;
  st.exponent = st.exponent_min = exponent;
  st.saturated = saturated.load();
  st.nonfinite = bad.load();
  st.max_abs_int = max_q.load();
  if (st.nonfinite && o.nonfinite == NonFinitePolicy::error) detail::fail_nonfinite(src, n, st.nonfinite, detail::TensorName{o.name});
  return st;
}

QuantStats quantize_dfp16_with_max_abs(const Context& ctx, const float* src, int16_t* dst, size_t n, float known_max,
                                       const QuantOptions& o) {
  o.validate("quantization");
  const float m = detail::exponent_max_abs(ctx, src, n, known_max, o.nonfinite, detail::TensorName{o.name});
  QuantStats st = quantize_dfp16_with_exponent(ctx, src, dst, n, dfp16_exponent(m, o.headroom), o);
  st.max_abs = m;
  return st;
}

QuantStats quantize_dfp16(const Context& ctx, const float* src, int16_t* dst, size_t n, const QuantOptions& o) {
  return quantize_dfp16_with_max_abs(ctx, src, dst, n, -1.f, o);
}

void dequantize_dfp16(const Context& ctx, const int16_t* src, int exponent, float* dst, size_t n) {
  const auto fn = ctx.kernels().dequantize.fn;
  ctx.parallel_for(chunks(n), [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      const size_t off = size_t(c) * kChunk;
      fn(src + off, dst + off, std::min(kChunk, n - off), exponent);
    }
  });
}

}  // namespace dfp
