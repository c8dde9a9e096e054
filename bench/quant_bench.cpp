// DFP16 quantization throughput (GB/s), with a same-run memory-bandwidth anchor.
//   copy_f32               memcpy of FP32: 4 B read + 4 B written per element (the anchor)
//   quantize_known_exp     FP32 -> DFP16 with the exponent known (max fused into the producer):
//                          4 B read + 2 B written per element
//   quantize_two_pass      max-abs pass + quantize pass: 8 B read + 2 B written per element
//   max_abs                the reduction alone: 4 B read per element
// Counter GBps = bytes moved / wall time; tensors of 256 MiB of FP32, 8x this machine's 32 MiB L3
// (at 64 MiB a third of a quantization's traffic stays in L3 and it outruns the copy).
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/dfp16.hpp"

namespace {

constexpr size_t kElems = size_t(64) << 20;  // 256 MiB of FP32

struct Data {
  std::vector<float> x, y;
  std::vector<int16_t> q;
  Data() : x(kElems), y(kElems), q(kElems) {
    std::mt19937 g(1);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& v : x) v = nd(g);
  }
};
Data& data() {
  static Data d;
  return d;
}

dfp::Context& context(int threads) {
  static dfp::Context c1(dfp::ContextOptions{.threads = 1}), c2(dfp::ContextOptions{.threads = 2});
  return threads == 1 ? c1 : c2;
}

void set_rate(benchmark::State& st, double bytes_per_elem) {
  st.counters["GBps"] =
      benchmark::Counter(bytes_per_elem * double(kElems) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void copy_f32(benchmark::State& st) {
  Data& d = data();
  dfp::Context& ctx = context(int(st.range(0)));
  for (auto _ : st)
    ctx.parallel_for(64, [&](int64_t b, int64_t e) {
      const size_t c = kElems / 64;
      std::memcpy(d.y.data() + b * c, d.x.data() + b * c, (e - b) * c * sizeof(float));
    });
  set_rate(st, 8);
}

void quantize_known_exp(benchmark::State& st) {
  Data& d = data();
  dfp::Context& ctx = context(int(st.range(0)));
  dfp::QuantOptions o;
  o.rounding = st.range(1) ? dfp::Rounding::stochastic : dfp::Rounding::nearest_even;
  const int e = dfp::dfp16_exponent(8.f, o.headroom);
  for (auto _ : st) dfp::quantize_dfp16_with_exponent(ctx, d.x.data(), d.q.data(), kElems, e, o);
  set_rate(st, 6);
  st.SetLabel(dfp::rounding_name(o.rounding));
}

void quantize_two_pass(benchmark::State& st) {
  Data& d = data();
  dfp::Context& ctx = context(int(st.range(0)));
  dfp::QuantOptions o;
  for (auto _ : st) dfp::quantize_dfp16(ctx, d.x.data(), d.q.data(), kElems, o);
  set_rate(st, 10);
}

void max_abs(benchmark::State& st) {
  Data& d = data();
  dfp::Context& ctx = context(int(st.range(0)));
  for (auto _ : st) benchmark::DoNotOptimize(dfp::max_abs(ctx, d.x.data(), kElems, nullptr));
  set_rate(st, 4);
}

}  // namespace

BENCHMARK(copy_f32)->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(quantize_known_exp)->ArgNames({"threads", "stochastic"})->ArgsProduct({{1, 2}, {0, 1}})->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(quantize_two_pass)->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(max_abs)->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
