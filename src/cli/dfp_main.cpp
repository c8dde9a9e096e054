// dfp command-line program. Subcommands:
//   dfp info [--threads N] [--isa LEVEL]   CPU features, the kernel chosen per op, versions
#include <oneapi/dnnl/dnnl.hpp>
#include <oneapi/tbb/version.h>
#include <zlib.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "dfp/cuda.hpp"
#include "dfp/loss_scale.hpp"
#include "dfp/models.hpp"
#include "dfp/status.hpp"
#include "dfp/trainer.hpp"
#include "src/core/openmp_env.hpp"
#include "src/train/run_lock.hpp"
#include "src/report/report.hpp"
#include "simd/kernel_table.hpp"

namespace {

struct Args {
  std::vector<std::string> items;
  size_t pos = 0;
  bool next(std::string& out) {
    if (pos >= items.size()) return false;
    out = items[pos++];
    return true;
  }
  std::string value(const std::string& flag) {
    DFP_CHECK(pos < items.size(), dfp::Status::invalid_argument, "flag " + flag + " expects a value");
    return items[pos++];
  }
};

// Parses a whole flag value as T (int or float); anything left over or unparsable is an error
// naming the flag.
template <class T>
T parse_number(const std::string& flag, const std::string& v) {
  constexpr bool integer = std::is_same_v<T, int>;
  try {
    size_t used = 0;
    const T x = integer ? T(std::stoi(v, &used)) : T(std::stof(v, &used));
    if (used == v.size()) return x;
  } catch (const std::out_of_range&) {
    dfp::fail(dfp::Status::invalid_argument,
              "flag " + flag + ": '" + v + "' is out of range; expected " +
                  (integer ? "an integer in -2147483648..2147483647" : "a number of magnitude 1.2e-38 .. 3.4e38, or 0"));
  } catch (const std::invalid_argument&) {
  }
  dfp::fail(dfp::Status::invalid_argument,
            "flag " + flag + ": expected " + (integer ? "an integer" : "a number") + ", got '" + v + "'");
}
int to_int(const std::string& flag, const std::string& v) { return parse_number<int>(flag, v); }
float to_float(const std::string& flag, const std::string& v) { return parse_number<float>(flag, v); }
// --threads N (0 = all cores) and --isa LEVEL, checked here so that the error names the flag.
int threads_flag(const std::string& flag, const std::string& v) {
  const int n = to_int(flag, v);
  dfp::ContextOptions::validate_threads(n, "flag " + flag);
  return n;
}
std::string isa_flag(const std::string& flag, const std::string& v) {
  dfp::parse_isa(v, "flag " + flag);
  return v;
}

// The numerics knobs shared by train, compare and info: precision, per-layer overrides, per
// tensor class formats, rounding and headroom, the INT16 chain policy, loss scaling. Returns
// false when `a` is not one of them. `keep_fp32` collects --keep-fp32 lists (applied by
// finish_policy, so that the order of flags does not matter).
struct ScaleFlags {
  bool mode_set = false;
};

bool policy_flag(const std::string& a, Args& args, dfp::TrainConfig& c, std::string& keep_fp32, ScaleFlags& scale_set) {
  dfp::PrecisionPolicy& p = c.policy;
  dfp::QuantOptions* cls[3] = {&p.dfp.weights, &p.dfp.activations, &p.dfp.gradients};
  if (a == "--precision") p.precision = dfp::parse_precision(args.value(a), "flag --precision");
  else if (a == "--keep-fp32") keep_fp32 += (keep_fp32.empty() ? "" : ",") + args.value(a);
  else if (a == "--override") {
    const auto more = dfp::PrecisionPolicy::parse_overrides(args.value(a), "flag --override");
    p.overrides.insert(p.overrides.end(), more.begin(), more.end());
  } else if (a == "--headroom") {
    const int h = to_int(a, args.value(a));
    for (auto* q : cls) q->headroom = h;
  } else if (a == "--round-weights" || a == "--weights-rounding") p.dfp.weights.rounding = dfp::parse_rounding(args.value(a), a);
  else if (a == "--round-activations" || a == "--activations-rounding")
    p.dfp.activations.rounding = dfp::parse_rounding(args.value(a), a);
  else if (a == "--round-gradients" || a == "--gradients-rounding")
    p.dfp.gradients.rounding = dfp::parse_rounding(args.value(a), a);
  else if (a == "--rounding") {
    const dfp::Rounding r = dfp::parse_rounding(args.value(a), a);
    for (auto* q : cls) q->rounding = r;
  } else if (a == "--weights-format") p.weights_format = dfp::parse_float_format(args.value(a), a);
  else if (a == "--activations-format") p.activations_format = dfp::parse_float_format(args.value(a), a);
  else if (a == "--gradients-format") p.gradients_format = dfp::parse_float_format(args.value(a), a);
  else if (a == "--int16-chain") {
    const std::string v = args.value(a);
    p.dfp.chain_override = v == "bound" ? 0 : to_int(a, v);
    DFP_CHECK(p.dfp.chain_override >= 0, dfp::Status::invalid_argument, "flag --int16-chain: expected 'bound' or N >= 1");
  } else if (a == "--verify-overflow") p.dfp.verify = true;
  else if (a == "--loss-scaling") {
    c.loss_scale.mode = dfp::parse_loss_scale_mode(args.value(a), a);
    scale_set.mode_set = true;
  } else if (a == "--loss-scale") {
    c.loss_scale.init_scale = to_float(a, args.value(a));
    if (!scale_set.mode_set) c.loss_scale.mode = dfp::LossScaleMode::fixed;  // apex: a number means static
  } else if (a == "--scale-growth-interval") c.loss_scale.growth_interval = to_int(a, args.value(a));
  else return false;
  return true;
}

void finish_policy(dfp::TrainConfig& c, const std::string& keep_fp32, const ScaleFlags& scale) {
  std::stringstream ss(keep_fp32);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) c.policy.overrides.emplace_back(item, dfp::Precision::fp32);
  c.policy.validate(dfp::kPolicyFlags);
}

int cmd_info(Args& args) {
  dfp::ContextOptions opt;
  dfp::TrainConfig pc;
  std::string a, keep;
  bool policy_given = false;
  ScaleFlags scale_set;
  while (args.next(a)) {
    if (a == "--threads") opt.threads = threads_flag(a, args.value(a));
    else if (a == "--isa") opt.isa = isa_flag(a, args.value(a));
    else if (policy_flag(a, args, pc, keep, scale_set)) policy_given = true;
    else dfp::fail(dfp::Status::invalid_argument, "dfp info: unknown flag '" + a + "' (known: --threads, --isa, --precision and the numerics flags of dfp train)");
  }
  finish_policy(pc, keep, scale_set);
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
  std::printf("kernel level   %s (best supported: %s; force with DFP_ISA=ref|avx2|avx512bw|avx512vnni)\n",
              dfp::isa_name(ctx.isa()), dfp::isa_name(f.best()));
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
  const dnnl_version_t* v = dnnl_version();
  std::printf("\nlibraries      oneDNN %d.%d.%d (%s runtime), oneTBB %s, xsimd %s, zlib %s\n", v->major, v->minor,
              v->patch, v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other", TBB_runtime_version(),
              dfp::simd::xsimd_version(), zlibVersion());
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
int cmd_bench(Args& args) {
  dfp::ContextOptions opt;
  int reps = 5;
  std::string a;
  while (args.next(a)) {
    if (a == "--threads") opt.threads = threads_flag(a, args.value(a));
    else if (a == "--isa") opt.isa = isa_flag(a, args.value(a));
    else if (a == "--reps") {
      reps = to_int(a, args.value(a));
      DFP_CHECK(reps >= 1, dfp::Status::invalid_argument, "flag --reps: expected >= 1, got " + std::to_string(reps));
    }
    else dfp::fail(dfp::Status::invalid_argument, "dfp bench: unknown flag '" + a + "' (known: --threads, --isa, --reps)");
  }
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


void print_line(const std::string& s) {
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}

// The flags of one training run (shared by train and compare). Returns false for unknown flags.
bool train_flag(const std::string& a, Args& args, dfp::TrainConfig& c) {
  if (a == "--model" || a == "-a" || a == "--arch") c.model = args.value(a);
  else if (a == "--dataset") c.dataset = args.value(a);
  else if (a == "--data") c.data = args.value(a);
  else if (a == "--image-size") c.image_size = to_int(a, args.value(a));
  else if (a == "--epochs") c.epochs = to_int(a, args.value(a));
  else if (a == "--batch-size" || a == "-b") c.batch_size = to_int(a, args.value(a));
  else if (a == "--lr") c.lr = to_float(a, args.value(a));
  else if (a == "--momentum") c.momentum = to_float(a, args.value(a));
  else if (a == "--wd" || a == "--weight-decay") c.weight_decay = to_float(a, args.value(a));
  else if (a == "--nesterov") c.nesterov = true;
  else if (a == "--schedule") c.schedule = args.value(a);
  else if (a == "--warmup-epochs") c.warmup_epochs = to_int(a, args.value(a));
  else if (a == "--milestones") {
    std::string v = args.value(a), item;
    std::stringstream ss(v);
    while (std::getline(ss, item, ',')) c.milestones.push_back(to_int(a, item));
  } else if (a == "--gamma") c.gamma = to_float(a, args.value(a));
  else if (a == "--step-epochs") c.step_epochs = to_int(a, args.value(a));
  else if (a == "--label-smoothing") c.label_smoothing = to_float(a, args.value(a));
  else if (a == "--no-augment") c.augment = false;
  else if (a == "--profile") c.profile = true;
  else if (a == "--threads") c.threads = to_int(a, args.value(a));  // range: validate_train_config
  else if (a == "--isa") c.isa = isa_flag(a, args.value(a));
  else if (a == "--seed") {
    const int seed = to_int(a, args.value(a));
    DFP_CHECK(seed >= 0, dfp::Status::invalid_argument, "flag --seed: expected >= 0, got " + std::to_string(seed));
    c.seed = static_cast<uint64_t>(seed);
  }
  else if (a == "--out") {
    c.out = args.value(a);
    DFP_CHECK(!c.out.empty(), dfp::Status::invalid_argument, "flag --out: expected a directory, got an empty path");
  } else if (a == "--overwrite") c.overwrite = true;
  else if (a == "--limit-train") c.limit_train = to_int(a, args.value(a));
  else if (a == "--limit-test") c.limit_test = to_int(a, args.value(a));
  else if (a == "--print-every") c.print_every = to_int(a, args.value(a));
  else if (a == "--numerics-every") c.numerics_interval = to_int(a, args.value(a));
  else if (a == "--device") c.device = args.value(a);
  else return false;
  return true;
}

int cmd_train(Args& args) {
  dfp::TrainConfig c;
  std::string a, keep;
  ScaleFlags scale_set;
  while (args.next(a)) {
    if (train_flag(a, args, c) || policy_flag(a, args, c, keep, scale_set)) continue;
    if (a == "--resume") c.resume = args.value(a);
    else if (a == "--label") c.label = args.value(a);
    else dfp::fail(dfp::Status::invalid_argument, "dfp train: unknown flag '" + a + "' (see dfp --help)");
  }
  finish_policy(c, keep, scale_set);
  dfp::train(c, print_line);
  return 0;
}

// ---- dfp compare ------------------------------------------------------------------------------
// Trains one run per precision spec, each in its own process (so that peak memory, oneDNN's
// caches and the thread pools are those of that run alone), with identical flags, seed and data
// order, into OUT/<spec>/, then writes the comparison report from the runs' metrics files.

struct RunSpec {
  std::string label;      // as given: fp32, bf16, fp16, fp16-static, int16, cuda-fp16, ...
  std::string device = "cpu";
  std::string precision;  // fp32 | int16 | bf16 | fp16
  std::string scaling;    // none | static | dynamic | adaptive
};

// "<precision>[-<scaling>]"; fp16 alone means dynamic scaling (what torch.amp users run).
RunSpec parse_spec(const std::string& spec) {
  RunSpec r;
  r.label = spec;
  std::string rest = spec;
  if (rest.rfind("cuda-", 0) == 0) {  // cuda-fp16, cuda-fp32: the GPU device
    r.device = "cuda";
    rest = rest.substr(5);
  }
  const size_t dash = rest.find('-');
  r.precision = rest.substr(0, dash);
  dfp::parse_precision(r.precision, "flag --precisions item '" + spec + "'");
  r.scaling = dash == std::string::npos ? (r.precision == "fp16" ? "dynamic" : "none") : rest.substr(dash + 1);
  dfp::parse_loss_scale_mode(r.scaling, "flag --precisions item '" + spec + "'");
  return r;
}

// Runs argv (argv[0] = program path) with stdout+stderr into `log_path`, echoing each line to our
// stdout prefixed with "[label] ". Returns the exit status (128+signal when killed).
int run_logged(const std::vector<std::string>& argv, const std::string& log_path, const std::string& label) {
  int fds[2];
  DFP_CHECK(pipe(fds) == 0, dfp::Status::io_error, std::string("dfp compare: pipe failed: ") + std::strerror(errno));
  const pid_t pid = fork();
  DFP_CHECK(pid >= 0, dfp::Status::io_error, std::string("dfp compare: fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> a;
    for (const std::string& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execv(a[0], a.data());
    std::fprintf(stderr, "cannot run %s: %s\n", a[0], std::strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  std::ofstream log(log_path);
  DFP_CHECK(log.good(), dfp::Status::io_error, "dfp compare: cannot write '" + log_path + "'");
  std::string line;
  char buf[4096];
  ssize_t got;
  while ((got = read(fds[0], buf, sizeof buf)) > 0 || (got < 0 && errno == EINTR)) {
    for (ssize_t i = 0; i < got; ++i) {
      if (buf[i] != '\n') { line += buf[i]; continue; }
      log << line << '\n';
      std::printf("[%s] %s\n", label.c_str(), line.c_str());
      std::fflush(stdout);
      line.clear();
    }
  }
  if (!line.empty()) { log << line << '\n'; std::printf("[%s] %s\n", label.c_str(), line.c_str()); }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int cmd_compare(Args& args) {
  std::vector<std::string> pass;  // flags handed to every `dfp train` unchanged
  std::string a, out = "runs/compare", specs_text = "fp32,bf16,fp16,int16";
  dfp::TrainConfig probe;  // validates the shared flags here, before hours of training
  std::string keep;
  ScaleFlags scale_set;
  while (args.next(a)) {
    if (a == "--precisions") { specs_text = args.value(a); continue; }
    if (a == "--out") {
      out = args.value(a);
      DFP_CHECK(!out.empty(), dfp::Status::invalid_argument, "flag --out: expected a directory, got an empty path");
      continue;
    }
    DFP_CHECK(a != "--precision" && a != "--loss-scaling" && a != "--label" && a != "--resume" && a != "--device",
              dfp::Status::invalid_argument,
              "dfp compare: flag " + a + " is set per run by --precisions (e.g. --precisions fp32,fp16-static,int16)");
    const size_t before = args.pos;
    if (!train_flag(a, args, probe) && !policy_flag(a, args, probe, keep, scale_set))
      dfp::fail(dfp::Status::invalid_argument, "dfp compare: unknown flag '" + a + "' (see dfp --help)");
    pass.push_back(a);
    for (size_t i = before; i < args.pos; ++i) pass.push_back(args.items[i]);
  }
  dfp::validate_train_config(probe);  // the shared settings, before any run starts
  std::vector<RunSpec> specs;
  std::stringstream ss(specs_text);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) {
      specs.push_back(parse_spec(item));
      for (size_t i = 0; i + 1 < specs.size(); ++i)
        DFP_CHECK(specs[i].label != item, dfp::Status::invalid_argument, "flag --precisions: '" + item + "' given twice");
    }
  DFP_CHECK(!specs.empty(), dfp::Status::invalid_argument, "flag --precisions: expected a list like fp32,bf16,fp16,int16");
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  DFP_CHECK(!ec, dfp::Status::io_error, "flag --out: cannot create directory '" + out + "': " + ec.message());
  // The comparison owns OUT (each run locks its own OUT/<spec>); runs of an earlier comparison
  // there are replaced only with --overwrite, before any training starts.
  const dfp::RunLock lock(out, "flag --out");
  for (const RunSpec& r : specs)
    DFP_CHECK(probe.overwrite || !dfp::holds_run(out + "/" + r.label), dfp::Status::invalid_argument,
              "flag --out: '" + out + "/" + r.label + "' holds an earlier run; expected a new directory, or --overwrite "
              "to replace the runs of '" + out + "'");
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec);
  DFP_CHECK(!ec, dfp::Status::io_error, "dfp compare: cannot find this program (/proc/self/exe): " + ec.message());
  std::vector<std::string> done, failed;
  for (const RunSpec& r : specs) {
    const std::string dir = out + "/" + r.label;
    std::filesystem::create_directories(dir, ec);
    DFP_CHECK(!ec, dfp::Status::io_error, "flag --out: cannot create directory '" + dir + "': " + ec.message());
    std::vector<std::string> argv = {self, "train"};
    argv.insert(argv.end(), pass.begin(), pass.end());
    argv.insert(argv.end(), {"--device", r.device, "--precision", r.precision, "--loss-scaling", r.scaling, "--label", r.label,
                             "--out", dir});
    std::printf("== %s: dfp train ... --precision %s --loss-scaling %s --out %s\n", r.label.c_str(), r.precision.c_str(),
                r.scaling.c_str(), dir.c_str());
    std::fflush(stdout);
    const int rc = run_logged(argv, dir + "/train.log", r.label);
    if (rc == 0) done.push_back(dir);
    else {
      failed.push_back(r.label);
      std::printf("== %s failed (exit %d); see %s/train.log; continuing with the other precisions\n", r.label.c_str(), rc,
                  dir.c_str());
    }
  }
  std::vector<dfp::RunSummary> runs;
  for (const std::string& d : done) runs.push_back(dfp::read_run(d));
  if (!runs.empty()) {
    std::printf("\n%s", dfp::format_table(runs).c_str());
    dfp::write_report(out, runs, print_line);
  }
  if (!failed.empty()) {
    std::string f;
    for (const auto& x : failed) f += (f.empty() ? "" : ", ") + x;
    std::fprintf(stderr, "dfp compare: %zu run(s) failed: %s\n", failed.size(), f.c_str());
    return 1;
  }
  return 0;
}

int cmd_eval(Args& args) {
  std::string a, ckpt, data;
  int threads = 0;
  while (args.next(a)) {
    if (a == "--checkpoint") ckpt = args.value(a);
    else if (a == "--data") data = args.value(a);
    else if (a == "--threads") threads = threads_flag(a, args.value(a));
    else dfp::fail(dfp::Status::invalid_argument, "dfp eval: unknown flag '" + a + "' (known: --checkpoint, --data, --threads)");
  }
  DFP_CHECK(!ckpt.empty(), dfp::Status::invalid_argument, "dfp eval: --checkpoint FILE is required");
  const dfp::EvalResult r = dfp::evaluate_checkpoint(ckpt, data, threads, print_line);
  std::printf("test loss %.4f top1 %.2f%% top5 %.2f%% (%d images)\n", r.loss, r.top1, r.top5, r.images);
  return 0;
}

void usage() {
  std::puts(
      "usage: dfp <command> [flags]\n"
      "commands:\n"
      "  info     CPU features, kernels chosen per op and precision, library versions\n"
      "           flags: --threads N, --isa ref|avx2|avx512bw|avx512vnni, --precision P and the numerics flags\n"
      "           of train: prints what that policy resolves to on this machine\n"
      "  bench    short INT16 vs oneDNN FP32 convolution summary (full tables: bench/)\n"
      "           flags: --threads N, --isa LEVEL, --reps N\n"
      "  train    train a model: --model resnet20 --dataset fashion-mnist|mnist|cifar10|cifar100 [--data DIR]\n"
      "           (or --dataset imagenet-folder --data DIR with DIR/train/<class>/*.jpg, DIR/val/... [--image-size 224])\n"
      "           --precision fp32|int16|bf16|fp16 [--keep-fp32 conv1,fc] [--override 'layer*=bf16']\n"
      "           numerics: [--weights-format|--activations-format|--gradients-format fp32|bf16|fp16]\n"
      "           [--rounding|--weights-rounding|--activations-rounding|--gradients-rounding nearest|stochastic|biased]\n"
      "           [--headroom N] [--int16-chain bound|N] [--verify-overflow] [--numerics-every N]\n"
      "           loss scaling: [--loss-scaling none|static|dynamic|adaptive] [--loss-scale S] [--scale-growth-interval N]\n"
      "           --epochs N --batch-size N --lr F [--momentum F --wd F --nesterov] --schedule cosine|step|multistep|constant\n"
      "           [--warmup-epochs N --milestones 30,60 --gamma F] --threads N --seed N --out DIR [--resume FILE]\n"
      "           [--overwrite: replace the run DIR holds; without it (or --resume) such a DIR is refused]\n"
      "           [--limit-train N --limit-test N --label-smoothing F --no-augment]\n"
      "           [--profile: time each layer's forward and backward and the optimizer; a table at the end, DIR/profile.json]\n"
      "           [--device cpu|cuda: on cuda --precision is fp16 (FP16 + FP32 master weights, AMP-like) or fp32]\n"
      "  eval     --checkpoint FILE [--data DIR]: test loss, top-1, top-5\n"
      "  compare  train one run per precision with the same seed, data order and flags, then tabulate and plot:\n"
      "           --precisions fp32,bf16,fp16,int16 (items PRECISION[-none|-static|-dynamic|-adaptive]; fp16 alone =\n"
      "           fp16-dynamic; cuda-fp16, cuda-fp32 on the GPU) --out DIR, plus any flag of train (model, data, epochs, numerics, --loss-scale S)");
}

}  // namespace

int main(int argc, char** argv) {
  dfp::reexec_with_passive_openmp(argv);
  Args args;
  for (int i = 1; i < argc; ++i) args.items.emplace_back(argv[i]);
  std::string cmd;
  if (!args.next(cmd) || cmd == "-h" || cmd == "--help" || cmd == "help") {
    usage();
    return cmd.empty() ? 2 : 0;
  }
  try {
    if (cmd == "info") return cmd_info(args);
    if (cmd == "bench") return cmd_bench(args);
    if (cmd == "train") return cmd_train(args);
    if (cmd == "eval") return cmd_eval(args);
    if (cmd == "compare") return cmd_compare(args);
    std::fprintf(stderr, "dfp: unknown command '%s'\n", cmd.c_str());
    usage();
    return 2;
  } catch (const dfp::Error& e) {
    std::fprintf(stderr, "dfp %s: %s: %s\n", cmd.c_str(), dfp::status_name(e.status()), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dfp %s: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}
