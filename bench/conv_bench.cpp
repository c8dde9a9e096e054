// Convolution throughput: dfp's INT16 (DFP16) kernels against oneDNN FP32 and BF16, per layer of
// bench/conv_shapes.hpp, per pass (fwd, bwd_data, bwd_weights), per thread count.
//
// Benchmark names: conv/<layer>/<pass>/<impl>/threads:<t>/real_time, impl in {int16, onednn_f32,
// onednn_bf16} (Google Benchmark appends "/real_time" because of UseRealTime(): wall time is the
// only fair clock when the work runs on TBB or OpenMP worker threads). Counter GOPS = 2*N*K*C*R*S*OH*OW / wall time, in 1e9 operations per second; the
// label is the implementation that ran. Counter peak_share (int16 and onednn_f32 rows) = GOPS over
// the peak of the instruction that implementation runs (bench/peak.hpp: VPDPWSSD, VPMADDWD + VPADDD
// or FP32 FMA, on zmm or ymm), measured at the row's thread count the first time a row needs it: a
// fraction, which the console prints with "/s" as it does every rate counter.
// bench/ratio_table.py turns the JSON output into the comparison table.
//
// What is timed, per impl:
//   int16       dfp::ConvInt16 on operands quantized once in setup (set_weights, quantize_input,
//               quantize_grad_output), so only forward / backward_data / backward_weights run --
//               the same footing as oneDNN's BF16 timing, whose inputs are already BF16.
//   onednn_*    the method of the peer benchmark (shared/peers/onednn/conv_bench.cpp): every memory
//               descriptor format_tag::any, BF16 src/weights/dst/diff_dst with FP32 diff_weights,
//               backward primitives hinted by the forward one, memories filled in oneDNN's chosen
//               layouts so no reorder is timed.
//
// Extra flags (consumed before Google Benchmark parses the rest):
//   --threads=1,2     thread counts to register (dfp::Context threads = OpenMP threads for oneDNN)
//   --chain=N         every INT16 row's INT32 chain forced to N steps (DfpConvOptions::chain_override;
//                     timing only: the results differ). The uniform operands here give chains of
//                     15-31 steps and several flushes per kernel call; training's gradients give
//                     chains as long as a call (one flush per call), which --chain=4096 stands for.
// Defaults applied unless given on the command line: --benchmark_min_time=0.2.
// Run one thread count with e.g. --benchmark_filter='threads:2/'. Do NOT set OMP_PROC_BIND: it
// pins the calling thread to one core when oneDNN first runs, and the TBB workers that dfp's INT16
// kernels use (created later, per benchmark) inherit that one-core mask, halving INT16 throughput
// on 2 cores. oneDNN measures the same without it on this machine. Run on an otherwise idle machine.
#include <benchmark/benchmark.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "bench/conv_shapes.hpp"
#include "bench/peak.hpp"
#include "dfp/context.hpp"
#include "dfp/conv.hpp"

namespace {

using dfp::ConvShape;
using dfp::bench::ConvLayer;

enum class Pass { fwd, bwd_data, bwd_weights };
constexpr Pass kPasses[] = {Pass::fwd, Pass::bwd_data, Pass::bwd_weights};
const char* pass_name(Pass p) {
  switch (p) {
    case Pass::fwd: return "fwd";
    case Pass::bwd_data: return "bwd_data";
    case Pass::bwd_weights: return "bwd_weights";
  }
  return "?";
}

// ---- buffers ---------------------------------------------------------------------------------

// 64-byte aligned floats, as oneDNN allocates its memories: both sides get the same alignment.
struct FreeDeleter {
  void operator()(float* p) const noexcept { std::free(p); }
};
using AlignedFloats = std::unique_ptr<float[], FreeDeleter>;

AlignedFloats aligned_floats(size_t n) {
  const size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
  float* p = static_cast<float*>(std::aligned_alloc(64, bytes == 0 ? 64 : bytes));
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, bytes == 0 ? 64 : bytes);
  return AlignedFloats(p);
}

// Uniform in [-1, 1): a cheap counter hash, fast enough for the 100 MB VGG tensors.
float uniform_pm1(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ULL + i;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return float(z >> 40) * 0x1.0p-23f - 1.f;
}

void fill_plain(float* p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = uniform_pm1(seed, i);
}

// An nChw16c tensor: random channels, zero padding lanes (dfp's layout contract).
AlignedFloats random_blocked(int n, int c, int h, int w, uint64_t seed) {
  const size_t size = dfp::blocked_size(n, c, h, w);
  AlignedFloats t = aligned_floats(size);
  for (size_t i = 0; i < size; ++i) {
    const int lane = int(i % dfp::kChannelBlock);
    const int block = int((i / (size_t(dfp::kChannelBlock) * h * w)) % dfp::channel_blocks(c));
    t[i] = block * dfp::kChannelBlock + lane < c ? uniform_pm1(seed, i) : 0.f;
  }
  return t;
}

dfp::ContextOptions context_options(int threads) {
  dfp::ContextOptions o;
  o.threads = threads;
  return o;
}

dfp::bench::Peaks& peaks() {
  static dfp::bench::Peaks measured;
  return measured;
}

// After the timed loop (not timed): GOPS, and peak_share where the label names an instruction form.
void set_gops_counter(benchmark::State& state, const ConvShape& s, const std::string& label, int threads) {
  // Per-iteration operations; kIsIterationInvariantRate multiplies by iterations and divides by
  // the (real, see UseRealTime) time.
  state.counters["GOPS"] = benchmark::Counter(s.ops() * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  dfp::bench::PeakForm form{};
  if (!dfp::bench::peak_form_of(label, form)) return;
  if (const double peak = peaks().get(form, threads); peak > 0)
    state.counters["peak_share"] = benchmark::Counter(s.ops() * 1e-9 / peak, benchmark::Counter::kIsIterationInvariantRate);
}

// ---- dfp INT16 -------------------------------------------------------------------------------

// --chain: 0 leaves the chains to the operands' bounds.
int chain_override = 0;

void bench_int16(benchmark::State& state, const ConvLayer& layer, Pass pass, int threads) {
  const ConvShape& s = layer.shape;
  try {
    dfp::Context ctx(context_options(threads));
    // A network's first layer (3 input channels here) has no input-gradient pass in training, and
    // a model builds its operator without one (options.input_gradient false: dy goes straight into
    // the weight gradient's layout); its weight-gradient row runs the operator so built.
    dfp::DfpConvOptions options;
    if (pass == Pass::bwd_weights && s.C <= 3) options.input_gradient = false;
    options.chain_override = chain_override;
    dfp::ConvInt16 conv(ctx, s, options, layer.name);
    AlignedFloats w = aligned_floats(size_t(s.K) * s.C * s.R * s.S);
    fill_plain(w.get(), size_t(s.K) * s.C * s.R * s.S, 1);
    AlignedFloats x = random_blocked(s.N, s.C, s.H, s.W, 2);
    AlignedFloats dy = random_blocked(s.N, s.K, s.OH(), s.OW(), 3);
    conv.set_weights(w.get());
    conv.quantize_input(x.get());
    conv.quantize_grad_output(dy.get());

    // The timed pass's output.
    const size_t out_size = pass == Pass::fwd        ? dfp::blocked_size(s.N, s.K, s.OH(), s.OW())
                            : pass == Pass::bwd_data ? dfp::blocked_size(s.N, s.C, s.H, s.W)
                                                     : size_t(s.K) * s.C * s.R * s.S;
    AlignedFloats out = aligned_floats(out_size);
    auto run = [&] {
      switch (pass) {
        case Pass::fwd: conv.forward(out.get()); break;
        case Pass::bwd_data: conv.backward_data(out.get()); break;
        case Pass::bwd_weights: conv.backward_weights(out.get()); break;
      }
    };
    run();  // warm-up, as the peer benchmark does
    for (auto _ : state) run();
    const std::string label = pass == Pass::bwd_weights ? conv.weight_gradient_kernel_name() : conv.kernel_name();
    state.SetLabel(label);
    set_gops_counter(state, s, label, threads);
    // VPDPWSSD steps per INT32 chain (between FP32 flushes): a short chain is flush overhead.
    const dfp::ConvStats& st = conv.stats();
    state.counters["chain"] = pass == Pass::fwd ? st.chain_fwd : pass == Pass::bwd_data ? st.chain_bwd : st.chain_wgrad;
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// ---- oneDNN FP32 / BF16, the peer benchmark's method -------------------------------------------

using dnnl::memory;

void fill_memory(const memory& m, uint64_t seed) {
  // As the peer: uniform [-1, 1) in whatever layout oneDNN chose (padding included: the peer
  // fills the whole buffer), BF16 by truncation.
  const memory::desc d = m.get_desc();
  const size_t bytes = d.get_size();
  void* p = m.get_data_handle();
  switch (d.data_type()) {
    case memory::data_type::f32: fill_plain(static_cast<float*>(p), bytes / 4, seed); break;
    case memory::data_type::bf16: {
      auto* h = static_cast<uint16_t*>(p);
      for (size_t i = 0; i < bytes / 2; ++i) {
        const float v = uniform_pm1(seed, i);
        uint32_t u;
        std::memcpy(&u, &v, 4);
        h[i] = uint16_t(u >> 16);
      }
      break;
    }
    default: std::memset(p, 0, bytes);
  }
}

void bench_onednn(benchmark::State& state, const ConvLayer& layer, Pass pass, int threads, bool bf16) {
  const ConvShape& s = layer.shape;
  using tag = memory::format_tag;
  using dt = memory::data_type;
  try {
    // The Context sets the OpenMP thread count; it must precede primitive creation because the
    // JIT kernels fix their thread partition then.
    dfp::Context ctx(context_options(threads));
    ctx.bind_openmp();
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream strm(eng);
    const dt act = bf16 ? dt::bf16 : dt::f32;
    const dt wei_dt = bf16 ? dt::bf16 : dt::f32;
    const memory::dims src_d = {s.N, s.C, s.H, s.W}, wei_d = {s.K, s.C, s.R, s.S},
                       dst_d = {s.N, s.K, s.OH(), s.OW()};
    const memory::dims strides = {s.stride_h, s.stride_w}, pad = {s.pad_h, s.pad_w};
    const auto algo = dnnl::algorithm::convolution_direct;
    const memory::desc src_md(src_d, act, tag::any), wei_md(wei_d, wei_dt, tag::any), dst_md(dst_d, act, tag::any);

    using Fwd = dnnl::convolution_forward;
    const Fwd::primitive_desc fpd(
        Fwd::desc(dnnl::prop_kind::forward_training, algo, src_md, wei_md, dst_md, strides, pad, pad), eng);

    dnnl::primitive prim;
    std::unordered_map<int, memory> args;
    std::string impl;
    if (pass == Pass::fwd) {
      memory src(fpd.src_desc(), eng), wei(fpd.weights_desc(), eng), dst(fpd.dst_desc(), eng);
      fill_memory(src, 1);
      fill_memory(wei, 2);
      fill_memory(dst, 3);
      prim = Fwd(fpd);
      args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
      impl = fpd.impl_info_str();
    } else if (pass == Pass::bwd_data) {
      using Bd = dnnl::convolution_backward_data;
      const Bd::primitive_desc bpd(Bd::desc(algo, memory::desc(src_d, act, tag::any), wei_md,
                                            memory::desc(dst_d, act, tag::any), strides, pad, pad),
                                   eng, fpd);
      memory dsrc(bpd.diff_src_desc(), eng), ddst(bpd.diff_dst_desc(), eng), wei(bpd.weights_desc(), eng);
      fill_memory(ddst, 4);
      fill_memory(wei, 5);
      prim = Bd(bpd);
      args = {{DNNL_ARG_DIFF_SRC, dsrc}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DIFF_DST, ddst}};
      impl = bpd.impl_info_str();
    } else {
      // Mixed-precision training: BF16 operands, FP32 weight gradient.
      using Bw = dnnl::convolution_backward_weights;
      const Bw::primitive_desc wpd(Bw::desc(algo, memory::desc(src_d, act, tag::any),
                                            memory::desc(wei_d, dt::f32, tag::any),
                                            memory::desc(dst_d, act, tag::any), strides, pad, pad),
                                   eng, fpd);
      memory src(wpd.src_desc(), eng), dwei(wpd.diff_weights_desc(), eng), ddst(wpd.diff_dst_desc(), eng);
      fill_memory(src, 6);
      fill_memory(ddst, 7);
      prim = Bw(wpd);
      args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_WEIGHTS, dwei}, {DNNL_ARG_DIFF_DST, ddst}};
      impl = wpd.impl_info_str();
    }
    if (impl.rfind("ref", 0) == 0) {
      // The reference implementation would take minutes on these layers and measures nothing useful.
      state.SkipWithError(("oneDNN chose its reference implementation '" + impl + "'").c_str());
      return;
    }
    prim.execute(strm, args);  // warm-up
    strm.wait();
    for (auto _ : state) {
      prim.execute(strm, args);
      strm.wait();
    }
    state.SetLabel(impl);
    set_gops_counter(state, s, bf16 ? std::string() : impl, threads);
  } catch (const dnnl::error& e) {
    state.SkipWithError((std::string("oneDNN: ") + e.what()).c_str());
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// ---- registration --------------------------------------------------------------------------

// A whole decimal number in [lo, hi], or false.
bool parse_count(std::string_view text, long lo, long hi, int& out) {
  const std::string item(text);
  char* end = nullptr;
  const long v = std::strtol(item.c_str(), &end, 10);
  if (item.empty() || *end != '\0' || v < lo || v > hi) return false;
  out = int(v);
  return true;
}

std::vector<int> parse_threads(std::string_view text) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    if (!parse_count(text.substr(pos, comma - pos), 1, 1024, out.emplace_back()))
      throw std::invalid_argument("--threads: expected a comma-separated list of counts >= 1, got '" +
                                  std::string(text) + "'");
    pos = comma + 1;
  }
  return out;
}

void register_all(const std::vector<int>& thread_counts) {
  // Layer, then pass, then threads, then impl: the three implementations of one comparison run
  // back to back, under the same machine conditions.
  for (const ConvLayer& layer : dfp::bench::kConvLayers)
    for (Pass pass : kPasses)
      for (int t : thread_counts) {
        const std::string tail = "/threads:" + std::to_string(t);
        const std::string head = std::string("conv/") + layer.name + "/" + pass_name(pass) + "/";
        benchmark::RegisterBenchmark((head + "int16" + tail).c_str(),
                                     [&layer, pass, t](benchmark::State& st) { bench_int16(st, layer, pass, t); })
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
        for (bool bf16 : {false, true})
          benchmark::RegisterBenchmark((head + (bf16 ? "onednn_bf16" : "onednn_f32") + tail).c_str(),
                                       [&layer, pass, t, bf16](benchmark::State& st) {
                                         bench_onednn(st, layer, pass, t, bf16);
                                       })
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
      }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> thread_counts = {1, 2};
  bool has_min_time = false;
  std::vector<char*> args;
  args.push_back(argv[0]);
  for (int i = 1; i < argc; ++i) {
    const std::string_view a(argv[i]);
    if (a.rfind("--threads=", 0) == 0) {
      try {
        thread_counts = parse_threads(a.substr(std::strlen("--threads=")));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "conv_bench: %s\n", e.what());
        return 2;
      }
      continue;
    }
    if (a.rfind("--chain=", 0) == 0) {
      const std::string_view v = a.substr(std::strlen("--chain="));
      if (!parse_count(v, 1, 1 << 20, chain_override)) {
        std::fprintf(stderr, "conv_bench: --chain: expected a step count in [1, 1048576], got '%s'\n",
                     std::string(v).c_str());
        return 2;
      }
      continue;
    }
    if (a.rfind("--benchmark_min_time=", 0) == 0) has_min_time = true;
    args.push_back(argv[i]);
  }
  // Default measuring time per benchmark; a per-benchmark MinTime() would override the command
  // line, so the default goes in as a flag instead.
  std::string min_time_flag = "--benchmark_min_time=0.2";
  if (!has_min_time) args.insert(args.begin() + 1, min_time_flag.data());
  int n = int(args.size());
  args.push_back(nullptr);

  register_all(thread_counts);
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
