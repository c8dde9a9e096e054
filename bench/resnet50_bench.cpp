// ResNet-50 training on ImageNet-sized images (224x224, 1000 classes), steady state: where an
// INT16 step's time goes, set against what the convolution kernels reach on their own.
//
//   resnet50_bench [--batch=16,32] [--precisions=fp32,int16,bf16] [--rounds=3] [--steps=2]
//                  [--threads=2] [--layers] [--no-kernels]
//
// For each batch it builds one model per precision on the same random batch (as train_bench), takes
// one warm-up step of each, then `rounds` rounds in which every precision runs `steps` steps in
// turn, so that all see the same machine state; the per-step figures are medians over the rounds
// and the ratios are medians of the rounds' own ratios (docs/performance.md: the machines are
// shared and their speed drifts). A step is forward, loss, backward and SGD with momentum and
// weight decay (INT16: with the weights' re-quantization and packing).
//
// Then, for INT16, every convolution's time by part (Model::layer_times: quantization of x and
// dy, the three passes) and, unless --no-kernels, each distinct shape's three passes run alone on
// a ConvInt16 of that shape and batch, as conv_bench runs them (operands quantized once, hot
// caches, the fastest of a few repetitions): the "alone" rate. The summary sets the network's
// convolution rate in training against that, and their work over the whole step against the peak
// of the instruction the kernels run, measured at the end of the run (bench/peak.hpp).
//
// Output: a summary per batch (ms per step, images/s, ratios to FP32, the time by layer kind),
// then with --layers a row per convolution. Every figure is in one run, on the CPU printed first.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "bench/conv_layers.hpp"
#include "bench/kind_table.hpp"
#include "bench/peak.hpp"
#include "bench/train_case.hpp"
#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "dfp/isa.hpp"
#include "dfp/precision.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using dfp::bench::convolutions;
using dfp::bench::ConvRow;
using dfp::bench::print_conv_layer_header;
using dfp::bench::print_conv_layer_row;
using dfp::bench::shape_key;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

struct Options {
  std::vector<int> batches = {16, 32};
  std::vector<dfp::Precision> precisions = {dfp::Precision::fp32, dfp::Precision::int16, dfp::Precision::bf16};
  int rounds = 3, steps = 2, threads = 2;
  bool layers = false, kernels = true;
};

std::vector<std::string> split(std::string_view s) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    const size_t e = std::min(s.find(',', b), s.size());
    out.emplace_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

int positive(const std::string& flag, const std::string& v) {
  size_t used = 0;
  int n = 0;
  try {
    n = std::stoi(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || n < 1) throw std::invalid_argument(flag + ": expected a whole number >= 1, got '" + v + "'");
  return n;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    const std::string key = a.substr(0, eq), value = eq == std::string::npos ? "" : a.substr(eq + 1);
    if (key == "--batch") {
      o.batches.clear();
      for (const auto& b : split(value)) o.batches.push_back(positive("--batch", b));
    } else if (key == "--precisions") {
      o.precisions.clear();
      for (const auto& p : split(value)) o.precisions.push_back(dfp::parse_precision(p, "--precisions"));
    } else if (key == "--rounds") {
      o.rounds = positive(key, value);
    } else if (key == "--steps") {
      o.steps = positive(key, value);
    } else if (key == "--threads") {
      o.threads = positive(key, value);
    } else if (a == "--layers") {
      o.layers = true;
    } else if (a == "--no-kernels") {
      o.kernels = false;
    } else {
      throw std::invalid_argument("unknown argument '" + a +
                                  "'; expected --batch=LIST --precisions=LIST --rounds=N --steps=N --threads=N "
                                  "--layers --no-kernels");
    }
  }
  if (std::find(o.precisions.begin(), o.precisions.end(), dfp::Precision::fp32) == o.precisions.end())
    throw std::invalid_argument("--precisions: must include fp32 (the ratios are to FP32)");
  return o;
}

// One model of the comparison, with its step times and its optimizer's share.
struct Contender {
  dfp::Precision precision;
  std::unique_ptr<dfp::bench::TrainRun> run;
  std::vector<double> step_s, opt_s;  // per round: seconds per step, of which the optimizer
};

// The three passes of one shape alone, as conv_bench times them: seconds of the fastest of `reps`.
struct AloneTimes {
  double fwd = 0, bwd_data = 0, bwd_weights = 0;
};

AloneTimes run_alone(const dfp::Context& ctx, const dfp::ConvShape& s, bool first_layer, int reps) {
  dfp::DfpConvOptions o;
  o.input_gradient = !first_layer;  // as a model builds a network's first layer
  dfp::ConvInt16 conv(ctx, s, o, "alone");
  std::mt19937 g(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> w(size_t(s.K) * s.C * s.R * s.S), x(dfp::blocked_size(s.N, s.C, s.H, s.W)),
      dy(dfp::blocked_size(s.N, s.K, s.OH(), s.OW()));
  for (auto& v : w) v = nd(g) * 0.05f;
  // Random values in the real channels, zeros in the padding lanes (as the blocked layout holds).
  auto fill = [&](std::vector<float>& t, int c, int h, int w) {
    std::vector<float> plain(size_t(s.N) * c * h * w);
    for (auto& v : plain) v = nd(g);
    dfp::to_blocked(plain.data(), t.data(), s.N, c, h, w);
  };
  fill(x, s.C, s.H, s.W);
  fill(dy, s.K, s.OH(), s.OW());
  std::vector<float> y(dy.size()), dx(x.size()), dw(w.size());
  conv.set_weights(w.data());
  conv.quantize_input(x.data());
  conv.quantize_grad_output(dy.data());
  auto best = [&](auto&& pass) {
    pass();  // warm-up
    double t = 1e30;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = Clock::now();
      pass();
      t = std::min(t, seconds_since(t0));
    }
    return t;
  };
  AloneTimes a;
  a.fwd = best([&] { conv.forward(y.data()); });
  if (!first_layer) a.bwd_data = best([&] { conv.backward_data(dx.data()); });
  a.bwd_weights = best([&] { conv.backward_weights(dw.data()); });
  return a;
}

void run_batch(const Options& opt, int batch) {
  dfp::ContextOptions co;
  co.threads = opt.threads;
  dfp::Context ctx(co);
  const dfp::bench::TrainCase cfg{"resnet50", batch, 3, 224, 224, 1000};
  const dfp::bench::TrainBatch data(cfg);
  std::vector<Contender> cs;
  for (dfp::Precision p : opt.precisions) {
    cs.push_back({p, std::make_unique<dfp::bench::TrainRun>(ctx, cfg, p), {}, {}});
    cs.back().run->step(data, batch);  // warm-up: first-touch of every buffer, oneDNN's JIT
  }
  // Rounds: every precision `steps` steps in turn. Profiling is on throughout (two clock reads per
  // layer and pass, and per INT16 part).
  for (Contender& c : cs) {
    c.run->model.set_profiling(true);
    c.run->model.reset_layer_times();
  }
  for (int r = 0; r < opt.rounds; ++r)
    for (Contender& c : cs) {
      double opt_s = 0;
      const auto t0 = Clock::now();
      for (int i = 0; i < opt.steps; ++i) {
        c.run->model.forward(data.x.data(), data.y.data(), batch, true);
        c.run->model.backward();
        const auto o0 = Clock::now();
        c.run->sgd.step(0.01f);
        opt_s += seconds_since(o0);
      }
      c.step_s.push_back(seconds_since(t0) / opt.steps);
      c.opt_s.push_back(opt_s / opt.steps);
    }
  const Contender& f32 = cs.front().precision == dfp::Precision::fp32
                             ? cs.front()
                             : *std::find_if(cs.begin(), cs.end(), [](const Contender& c) { return c.precision == dfp::Precision::fp32; });
  std::printf("\n== ResNet-50, batch %d, 3x224x224, %d threads: %d rounds of %d steps per precision ==\n", batch,
              opt.threads, opt.rounds, opt.steps);
  std::printf("%-6s %10s %9s %12s %12s\n", "", "ms/step", "images/s", "vs fp32", "optimizer ms");
  for (const Contender& c : cs) {
    std::vector<double> ratio;
    for (size_t r = 0; r < c.step_s.size(); ++r) ratio.push_back(f32.step_s[r] / c.step_s[r]);
    const double ms = median(c.step_s) * 1e3;
    std::printf("%-6s %10.1f %9.2f %11.3fx %12.1f\n", dfp::precision_name(c.precision), ms, batch / (ms / 1e3),
                median(ratio), median(c.opt_s) * 1e3);
  }

  // Time by layer kind (per step), for every precision.
  std::vector<dfp::bench::KindColumn> columns;
  for (const Contender& c : cs)
    columns.push_back({dfp::precision_name(c.precision), c.run->model.layer_times(), median(c.opt_s) * 1e3});
  dfp::bench::print_kind_table(columns);

  // INT16 convolutions by part, against the same shapes alone.
  const auto i16 = std::find_if(cs.begin(), cs.end(), [](const Contender& c) { return c.precision == dfp::Precision::int16; });
  if (i16 == cs.end()) return;
  const std::vector<ConvRow> rows = convolutions(i16->run->model, batch);
  std::map<std::string, dfp::LayerTime> by_name, f32_by_name;
  for (const dfp::LayerTime& t : i16->run->model.layer_times()) by_name[t.layer] = t;
  for (const dfp::LayerTime& t : f32.run->model.layer_times()) f32_by_name[t.layer] = t;
  std::map<std::string, AloneTimes> alone;
  if (opt.kernels)
    for (size_t i = 0; i < rows.size(); ++i) {
      const std::string key = shape_key(rows[i].shape) + (i == 0 ? " first" : "");
      if (!alone.count(key)) alone[key] = run_alone(ctx, rows[i].shape, i == 0, 3);
    }
  double ops_all = 0, in_training = 0, passes_only = 0, alone_all = 0, quant = 0, f32_conv = 0;
  if (opt.layers) print_conv_layer_header(opt.kernels);
  for (size_t i = 0; i < rows.size(); ++i) {
    const dfp::LayerTime& t = by_name.at(rows[i].name);
    const dfp::LayerTime::Int16Parts& p = t.int16;
    const double per = 1.0 / double(t.steps), ops = rows[i].shape.ops();
    const bool first = i == 0;
    const AloneTimes a = opt.kernels ? alone.at(shape_key(rows[i].shape) + (first ? " first" : "")) : AloneTimes{};
    const double passes = (p.forward + p.backward_data + p.backward_weights) * per;
    const double f32_ms = (f32_by_name.at(rows[i].name).forward_seconds + f32_by_name.at(rows[i].name).backward_seconds) /
                          double(f32_by_name.at(rows[i].name).steps) * 1e3;
    const double passes_ops = ops * (first ? 2 : 3);
    ops_all += passes_ops;
    passes_only += passes;
    quant += dfp::bench::own_quantization(p).total() * per;  // within the layer's own time
    in_training += (t.forward_seconds + t.backward_seconds) * per;
    alone_all += a.fwd + a.bwd_data + a.bwd_weights;
    f32_conv += f32_ms / 1e3;
    if (opt.layers) {
      char alone_text[64] = "";
      auto gops = [&](double sec) { return sec > 0 ? ops / sec / 1e9 : 0.0; };
      if (opt.kernels)
        std::snprintf(alone_text, sizeof alone_text, "%.0f/%.0f/%.0f", gops(a.fwd), gops(a.bwd_data), gops(a.bwd_weights));
      print_conv_layer_row(rows[i], t, f32_by_name.at(rows[i].name), first, alone_text);
    }
  }
  std::printf("\nINT16 convolutions over the network (%zu layers, %.0f GOP per step):\n", rows.size(), ops_all / 1e9);
  std::printf("  in training, whole layer time %8.1f ms/step  %6.0f GOP/s\n", in_training * 1e3, ops_all / in_training / 1e9);
  std::printf("    of which quantization of x and dy %6.1f ms (x and dy quantized inside a BatchNorm's forward or backward are not in it)\n",
              quant * 1e3);
  std::printf("  the three passes alone in training %6.1f ms/step  %6.0f GOP/s\n", passes_only * 1e3, ops_all / passes_only / 1e9);
  if (opt.kernels)
    std::printf("  the same shapes by themselves       %6.1f ms/step  %6.0f GOP/s  (training reaches %.1f%% of it; "
                "passes only %.1f%%)\n",
                alone_all * 1e3, ops_all / alone_all / 1e9, 100.0 * alone_all / in_training, 100.0 * alone_all / passes_only);
  std::printf("  FP32 convolutions in training       %6.1f ms/step  %6.0f GOP/s  (INT16 layers %.2fx)\n", f32_conv * 1e3,
              ops_all / f32_conv / 1e9, f32_conv / in_training);
  // Issue 45's measure: the INT16 convolutions' work over the whole step, as a share of the peak
  // of the instruction their kernels run (bench/peak.hpp), measured now at the run's threads.
  const double step_s = median(i16->step_s);
  dfp::bench::PeakForm form{};
  const double peak = dfp::bench::peak_form_of(by_name.at(rows[0].name).implementation, form)
                          ? dfp::bench::measure_peak(form, opt.threads)
                          : 0.0;
  std::printf("  over the whole INT16 step           %6.1f ms/step  %6.0f GOP/s", step_s * 1e3, ops_all / step_s / 1e9);
  if (peak > 0)
    std::printf("  (%.1f%% of the %s peak measured now: %.0f GOP/s at %d threads)", 100.0 * ops_all / step_s / 1e9 / peak,
                dfp::bench::peak_form_name(form), peak, opt.threads);
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opt = parse(argc, argv);
    const dfp::CpuFeatures cpu = dfp::detect_cpu_features();
    // The level a context chooses (DFP_ISA may hold it below the CPU's best).
    const dfp::Context level{dfp::ContextOptions{}};
    std::printf("CPU: %s (%s); AMX-BF16 %s; kernels: %s\n", cpu.brand.c_str(), cpu.vendor.c_str(),
                cpu.amx_bf16 && cpu.os_saves_amx ? "yes" : "no", dfp::isa_name(level.isa()));
    for (int b : opt.batches) run_batch(opt, b);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resnet50_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
