// dfp info and dfp bench.
#include <oneapi/dnnl/dnnl.hpp>
#include <oneapi/tbb/version.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "dfp/cuda.hpp"
#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"
#include "apps/dfp/commands.hpp"
#include "apps/dfp/flags.hpp"

namespace dfp::cli {

namespace {

struct InfoState {
  dfp::ContextOptions opt;
  RunFlags policy;
  FlagSet flags;
  explicit InfoState(CLI::App& app) : flags(app) {}
};

int info(InfoState& s) {
  s.flags.apply();
  bool policy_given = false;  // a numerics flag: print what the policy resolves to
  for (const auto& [flag, value] : s.flags.given())
    policy_given |= flag->group == "Numerics";
  s.policy.finish();
  const dfp::ContextOptions& opt = s.opt;
  const dfp::TrainConfig& pc = s.policy.config;
  dfp::Context ctx(opt);
  const dfp::CpuFeatures& f = ctx.cpu();
  auto yn = [](bool b) { return b ? "yes" : "no"; };
  std::printf("dfp %s\n", DFP_VERSION);
  std::printf("cpu            %s (%s)\n", f.brand.c_str(), f.vendor.c_str());
  std::printf("features       avx2=%s fma=%s f16c=%s avx512f=%s avx512bw=%s avx512dq=%s avx512vl=%s\n", yn(f.avx2),
              yn(f.fma), yn(f.f16c), yn(f.avx512f), yn(f.avx512bw), yn(f.avx512dq), yn(f.avx512vl));
  std::printf("               avx_vnni=%s avx512_vnni=%s avx512_bf16=%s avx512_fp16=%s aes=%s vaes=%s\n",
              yn(f.avx_vnni), yn(f.avx512vnni), yn(f.avx512bf16), yn(f.avx512fp16), yn(f.aes), yn(f.vaes));
  std::printf("               amx_tile=%s amx_bf16=%s amx_int8=%s\n", yn(f.amx_tile), yn(f.amx_bf16), yn(f.amx_int8));
  std::printf("               os_ymm_state=%s os_zmm_state=%s os_amx_state=%s\n", yn(f.os_saves_ymm), yn(f.os_saves_zmm),
              yn(f.os_saves_amx));
  std::printf("kernel level   %s (best supported: %s; force with DFP_ISA=%s)\n", dfp::isa_name(ctx.isa()),
              dfp::isa_name(f.best()), dfp::isa_names("|").c_str());
  std::printf("threads        %d (oneTBB arena and OpenMP for oneDNN)\n", ctx.threads());
  std::string why;
  const bool gpu = dfp::cuda_available(&why);
  std::printf("cuda device    %s\n", gpu ? "available (--device cuda)" : ("not available: " + why).c_str());
  const auto& k = ctx.kernels();
  std::printf("\nop / precision                      kernel\n");
  std::printf("max|x| (dfp16 exponent)      f32    %s\n", k.max_abs.name);
  std::printf("quantize                     dfp16  %s\n", k.quantize.name);
  std::printf("dequantize                   dfp16  %s\n", k.dequantize.name);
  std::printf("sampled rounding statistics  dfp16  %s\n", k.dfp16_stats.name);
  std::printf("batch-pair layout            dfp16  %s\n", k.interleave.name);
  std::printf("conv fwd / bwd_data, linear  int16  %s\n", k.conv_s16_pixel.name);
  std::printf("conv bwd_weights, linear dW  int16  %s\n", k.conv_s16_pair.name);
  // A representative convolution (ResNet's 64-channel 3x3 at 28x28, batch 32): what oneDNN's
  // primitives report for it is the implementation that runs, read back, not inferred from flags.
  dfp::ConvShape probe;
  probe.N = 32; probe.C = 64; probe.H = 28; probe.W = 28; probe.K = 64; probe.R = 3; probe.S = 3; probe.pad_h = 1; probe.pad_w = 1;
  dfp::ConvF32 f32(ctx, probe, "probe");
  std::printf("conv all passes              fp32   %s (%s)\n", k.conv_f32.name, f32.kernel_name());
  dfp::LinearF32 fc(ctx, 2, 64, 16, "probe");
  std::printf("linear all passes            fp32   %s (%s)\n", k.linear_f32.name, fc.kernel_name());
  const auto bf = k.conv_bf16.fn(ctx.threads(), probe, "probe");
  if (bf) {
    std::printf("conv fwd                     bf16   %s\n", bf->impl_forward());
    std::printf("conv bwd_data                bf16   %s\n", bf->impl_backward_data());
    std::printf("conv bwd_weights             bf16   %s\n", bf->impl_backward_weights());
  } else {
    std::printf("conv all passes              bf16   bf16-rounded operands on the fp32 kernel\n");
  }
  std::printf("conv all passes              fp16   fp16-rounded operands on the fp32 kernel\n");
  std::printf("bf16/fp16 operand rounding    bf16   %s\n", k.round_bf16.name);
  std::printf("                             fp16   %s\n", k.round_fp16.name);
  std::printf("relu, add+relu               f32    %s, %s\n", k.relu_fwd.name, k.add_relu.name);
  std::printf("batchnorm fwd / bwd          f32    %s, %s, %s\n", k.bn_moments.name, k.bn_bwd_sums_s16.name,
              k.bn_bwd_apply_s16.name);
  std::printf("sgd update                   f32    %s\n", k.sgd_update.name);
  std::printf("\nlibraries      %s\n", library_versions().c_str());
  if (policy_given) {
    std::printf("\npolicy         %s\n", pc.policy.describe().c_str());
    std::printf("loss scaling   %s\n", pc.loss_scale.describe().c_str());
    for (const std::string& n : dfp::precision_notes(pc.policy, ctx)) std::printf("               %s\n", n.c_str());
  }
  return 0;
}

// Median seconds per call of fn over `reps` timed runs (after one warm-up call).
double median_seconds(const std::function<void()>& fn, int reps) {
  fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// A short summary of the INT16 kernels against oneDNN FP32 on ResNet layers. The full per-layer
// comparison with oneDNN BF16 lives in bench/ (Google Benchmark).
int bench(const dfp::ContextOptions& opt, int reps) {
  dfp::Context ctx(opt);
  struct Layer { const char* name; dfp::ConvShape s; };
  auto conv = [](int n, int c, int hw, int k, int r, int stride) {
    dfp::ConvShape s;
    s.N = n; s.C = c; s.H = s.W = hw; s.K = k; s.R = s.S = r;
    s.stride_h = s.stride_w = stride;
    s.pad_h = s.pad_w = r / 2;
    return s;
  };
  const std::vector<Layer> layers = {
      {"resnet20 16x16 32x32 3x3 b128", conv(128, 16, 32, 16, 3, 1)},
      {"resnet20 32x32 16x16 3x3 b128", conv(128, 32, 16, 32, 3, 1)},
      {"resnet20 64x64 8x8 3x3 b128", conv(128, 64, 8, 64, 3, 1)},
      {"resnet50 64x64 56x56 3x3 b8", conv(8, 64, 56, 64, 3, 1)},
      {"resnet50 256x64 56x56 1x1 b8", conv(8, 256, 56, 64, 1, 1)},
  };
  std::printf("INT16 (DFP16, %s) vs oneDNN FP32, %d thread(s), median of %d; GOP/s = 2*N*K*C*R*S*OH*OW / time\n",
              dfp::isa_name(ctx.isa()), ctx.threads(), reps);
  std::printf("%-32s %-11s %9s %9s %7s\n", "layer", "pass", "int16", "fp32", "ratio");
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (const Layer& l : layers) {
    const dfp::ConvShape& s = l.s;
    std::vector<float> x(dfp::blocked_size(s.N, s.C, s.H, s.W)), w(size_t(s.K) * s.C * s.R * s.S),
        dy(dfp::blocked_size(s.N, s.K, s.OH(), s.OW())), y(dy.size()), dx(x.size()), dw(w.size());
    for (auto& v : x) v = u(gen);
    for (auto& v : w) v = 0.1f * u(gen);
    for (auto& v : dy) v = 1e-3f * u(gen);
    dfp::ConvInt16 q(ctx, s);
    dfp::ConvF32 f(ctx, s);
    q.set_weights(w.data());
    f.set_weights(w.data());
    q.quantize_input(x.data());
    q.quantize_grad_output(dy.data());
    const double gop = s.ops() / 1e9;
    const double t16[3] = {median_seconds([&] { q.forward(y.data()); }, reps),
                           median_seconds([&] { q.backward_data(dx.data()); }, reps),
                           median_seconds([&] { q.backward_weights(dw.data()); }, reps)};
    const double t32[3] = {median_seconds([&] { f.forward(x.data(), y.data()); }, reps),
                           median_seconds([&] { f.backward_data(dy.data(), dx.data()); }, reps),
                           median_seconds([&] { f.backward_weights(x.data(), dy.data(), dw.data()); }, reps)};
    const char* pass[3] = {"fwd", "bwd_data", "bwd_weights"};
    for (int p = 0; p < 3; ++p)
      std::printf("%-32s %-11s %9.1f %9.1f %6.2fx\n", l.name, pass[p], gop / t16[p], gop / t32[p], t32[p] / t16[p]);
  }
  return 0;
}



}  // namespace

std::string library_versions() {
  const dnnl_version_t* v = dnnl_version();
  char b[256];
  std::snprintf(b, sizeof b, "oneDNN %d.%d.%d (%s runtime), oneTBB %s, xsimd %s, zlib %s", v->major, v->minor, v->patch,
                v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other", TBB_runtime_version(), dfp::simd::xsimd_version(),
                zlibVersion());
  return b;
}

Run add_info(CLI::App& root) {
  CLI::App* app = root.add_subcommand("info", "CPU features, the kernel chosen per op and precision, library versions");
  app->footer("With --precision and the numerics flags of train: what that policy resolves to on this machine.");
  auto s = std::make_shared<InfoState>(*app);
  s->flags.add({threads_option(s->opt.threads), isa_option(s->opt.isa)});
  s->flags.add(policy_flags(s->policy));
  s->flags.show_defaults(s->policy.config);
  return [s] { return info(*s); };
}

Run add_bench(CLI::App& root) {
  struct State {
    dfp::ContextOptions opt;
    int reps = 5;
    FlagSet flags;
    explicit State(CLI::App& app) : flags(app) {}
  };
  CLI::App* app = root.add_subcommand("bench", "short INT16 vs oneDNN FP32 convolution summary (full tables: bench/)");
  auto s = std::make_shared<State>(*app);
  s->flags.add({threads_option(s->opt.threads), isa_option(s->opt.isa),
                {"--reps", "N", "timed repetitions per pass (the median is shown)",
                 [s = s.get()](const std::string& f, const std::string& v) {
                   s->reps = to_int(f, v);
                   DFP_CHECK(s->reps >= 1, dfp::Status::invalid_argument,
                             "flag " + f + ": expected >= 1, got " + std::to_string(s->reps));
                 }}});
  return [s, app] {
    s->flags.apply();
    return bench(s->opt, s->reps);
  };
}

}  // namespace dfp::cli
