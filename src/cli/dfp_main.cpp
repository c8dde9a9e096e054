// dfp command-line program. Subcommands:
//   dfp info [--threads N] [--isa LEVEL]   CPU features, the kernel chosen per op, versions
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
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
  try {
    size_t used = 0;
    const T x = std::is_same_v<T, int> ? T(std::stoi(v, &used)) : T(std::stof(v, &used));
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  dfp::fail(dfp::Status::invalid_argument, "flag " + flag + ": expected " +
                                               (std::is_same_v<T, int> ? "an integer" : "a number") + ", got '" + v + "'");
}
int to_int(const std::string& flag, const std::string& v) { return parse_number<int>(flag, v); }
float to_float(const std::string& flag, const std::string& v) { return parse_number<float>(flag, v); }

int cmd_info(Args& args) {
  dfp::ContextOptions opt;
  std::string a;
  while (args.next(a)) {
    if (a == "--threads") opt.threads = to_int(a, args.value(a));
    else if (a == "--isa") opt.isa = args.value(a);
    else dfp::fail(dfp::Status::invalid_argument, "dfp info: unknown flag '" + a + "' (known: --threads, --isa)");
  }
  dfp::Context ctx(opt);
  const dfp::CpuFeatures& f = ctx.cpu();
  auto yn = [](bool b) { return b ? "yes" : "no"; };
  std::printf("dfp %s\n", DFP_VERSION);
  std::printf("cpu            %s (%s)\n", f.brand.c_str(), f.vendor.c_str());
  std::printf("features       avx2=%s fma=%s f16c=%s avx512f=%s avx512bw=%s avx512dq=%s avx512vl=%s\n", yn(f.avx2),
              yn(f.fma), yn(f.f16c), yn(f.avx512f), yn(f.avx512bw), yn(f.avx512dq), yn(f.avx512vl));
  std::printf("               avx512_vnni=%s avx512_bf16=%s avx512_fp16=%s os_zmm_state=%s\n", yn(f.avx512vnni),
              yn(f.avx512bf16), yn(f.avx512fp16), yn(f.os_saves_zmm));
  std::printf("kernel level   %s (best supported: %s; force with DFP_ISA=ref|avx512bw|avx512vnni)\n",
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
  std::printf("batch-pair layout            dfp16  %s\n", k.interleave.name);
  std::printf("conv fwd / bwd_data, linear  int16  %s\n", k.conv_s16_pixel.name);
  std::printf("conv bwd_weights, linear dW  int16  %s\n", k.conv_s16_pair.name);
  dfp::ConvShape probe;
  probe.N = 2; probe.C = 16; probe.H = 8; probe.W = 8; probe.K = 16; probe.R = 3; probe.S = 3; probe.pad_h = 1; probe.pad_w = 1;
  dfp::ConvF32 f32(ctx, probe, "probe");
  std::printf("conv all passes              fp32   %s\n", f32.kernel_name());
  const dnnl_version_t* v = dnnl_version();
  std::printf("\nlibraries      oneDNN %d.%d.%d (%s runtime)\n", v->major, v->minor, v->patch,
              v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other");
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
    if (a == "--threads") opt.threads = to_int(a, args.value(a));
    else if (a == "--isa") opt.isa = args.value(a);
    else if (a == "--reps") reps = std::max(1, to_int(a, args.value(a)));
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

int cmd_train(Args& args) {
  dfp::TrainConfig c;
  std::string a, overrides, precision;
  while (args.next(a)) {
    if (a == "--model" || a == "-a" || a == "--arch") c.model = args.value(a);
    else if (a == "--dataset") c.dataset = args.value(a);
    else if (a == "--data") c.data = args.value(a);
    else if (a == "--precision") precision = args.value(a);  // resolved below: its values depend on --device
    else if (a == "--device") c.device = args.value(a);
    else if (a == "--loss-scaling") c.loss_scale.mode = dfp::parse_loss_scale_mode(args.value(a), a);
    else if (a == "--loss-scale") c.loss_scale.init_scale = to_float(a, args.value(a));
    else if (a == "--keep-fp32") overrides = args.value(a);
    else if (a == "--headroom") {
      const int h = to_int(a, args.value(a));
      c.policy.dfp.weights.headroom = c.policy.dfp.activations.headroom = c.policy.dfp.gradients.headroom = h;
    } else if (a == "--round-weights") c.policy.dfp.weights.rounding = dfp::parse_rounding(args.value(a), a);
    else if (a == "--round-activations") c.policy.dfp.activations.rounding = dfp::parse_rounding(args.value(a), a);
    else if (a == "--round-gradients") c.policy.dfp.gradients.rounding = dfp::parse_rounding(args.value(a), a);
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
    else if (a == "--threads") c.threads = to_int(a, args.value(a));
    else if (a == "--isa") c.isa = args.value(a);
    else if (a == "--seed") c.seed = static_cast<uint64_t>(to_int(a, args.value(a)));
    else if (a == "--out") c.out = args.value(a);
    else if (a == "--resume") c.resume = args.value(a);
    else if (a == "--limit-train") c.limit_train = to_int(a, args.value(a));
    else if (a == "--limit-test") c.limit_test = to_int(a, args.value(a));
    else if (a == "--print-every") c.print_every = std::max(1, to_int(a, args.value(a)));
    else dfp::fail(dfp::Status::invalid_argument, "dfp train: unknown flag '" + a + "' (see dfp --help)");
  }
  DFP_CHECK(c.device == "cpu" || c.device == "cuda", dfp::Status::invalid_argument,
            "flag --device: expected cpu or cuda, got '" + c.device + "'");
  if (c.device == "cuda") {
    if (!precision.empty()) c.cuda_precision = dfp::parse_cuda_precision(precision, "flag --precision (with --device cuda)");
  } else if (!precision.empty()) {
    c.policy.precision = dfp::parse_precision(precision, "flag --precision");
  }
  // --keep-fp32 conv1,fc  ==  overrides conv1=fp32,fc=fp32
  std::stringstream ss(overrides);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) c.policy.overrides.emplace_back(item, dfp::Precision::fp32);
  dfp::train(c, print_line);
  return 0;
}

int cmd_eval(Args& args) {
  std::string a, ckpt, data;
  int threads = 0;
  while (args.next(a)) {
    if (a == "--checkpoint") ckpt = args.value(a);
    else if (a == "--data") data = args.value(a);
    else if (a == "--threads") threads = to_int(a, args.value(a));
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
      "           flags: --threads N, --isa ref|avx512bw|avx512vnni\n"
      "  bench    short INT16 vs oneDNN FP32 convolution summary (full tables: bench/)\n"
      "           flags: --threads N, --isa LEVEL, --reps N\n"
      "  train    train a model: --model resnet20 --dataset fashion-mnist|mnist|cifar10|cifar100 [--data DIR]\n"
      "           --precision fp32|int16 [--keep-fp32 conv1,fc] [--headroom N] [--round-gradients stochastic]\n"
      "           --epochs N --batch-size N --lr F [--momentum F --wd F --nesterov] --schedule cosine|step|multistep|constant\n"
      "           [--warmup-epochs N --milestones 30,60 --gamma F] --threads N --seed N --out DIR [--resume FILE]\n"
      "           [--limit-train N --limit-test N --label-smoothing F --no-augment]\n"
      "           [--device cpu|cuda: on cuda --precision is fp16 (FP16 + FP32 master weights) or fp32]\n"
      "           [--loss-scaling none|static|dynamic --loss-scale S: fp16 loss scaling, default dynamic from 65536]\n"
      "  eval     --checkpoint FILE [--data DIR]: test loss, top-1, top-5");
}

}  // namespace

int main(int argc, char** argv) {
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
