// cuda_bench: steady-state training throughput of the CUDA device (dfp::CudaModel) per model,
// batch and precision, the GPU counterpart of train_bench and of bench/torch_cuda_bench.py.
//
// Each case builds the zoo model on the host, moves it to the GPU, runs --warmup steps, then times
// --steps steps one by one on a host clock (every train_step ends by reading the step's loss back,
// so the GPU is idle between steps: the figure includes the per-step launch and copy-back
// latency, and the staging copy of the batch from pinned host memory). Loss scaling as
// `dfp train` runs it: dynamic from 2^16 for fp16, none for fp32.
//
//   cuda_bench [--cases resnet20:128:32,resnet50:32:224] [--precisions fp16,fp32]
//              [--algos heuristic,benchmark] [--warmup 10] [--steps 50] [--csv FILE]
// --algos: how cuDNN's convolution algorithms are chosen (dfp::CudaOptions::cudnn_benchmark).
// --profile N: N more steps with per-layer timing, printed by layer kind and slowest layers.
// A case is MODEL:BATCH:SIDE (3 x SIDE x SIDE inputs, 10 classes). Prints one line per case and,
// with --csv, writes model,batch,side,precision,algos,median_ms,mean_ms,images_per_second,final_loss.
// Without a usable GPU it prints the reason and exits 0 having measured nothing.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bench/train_case.hpp"
#include "dfp/context.hpp"
#include "dfp/cuda.hpp"
#include "dfp/loss_scale.hpp"
#include "dfp/models.hpp"
#include "dfp/status.hpp"
#include "src/cuda/executor.hpp"

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t end = std::min(s.find(sep, at), s.size());
    if (end > at) out.push_back(s.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

int to_int(const std::string& s, const char* what, long min = 1) {
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end || v < min || v > 1 << 20) {
    std::fprintf(stderr, "cuda_bench: %s '%s' is not a whole number in [%ld, 1048576]\n", what, s.c_str(), min);
    std::exit(2);
  }
  return int(v);
}

// Runs `steps` more steps with per-layer timing (a device synchronisation around every layer) and
// prints the time per step by layer kind and the slowest layers.
void print_profile(dfp::CudaModel& gpu, dfp::LossScaler& scaler, const dfp::bench::TrainBatch& data, int batch,
                   int steps) {
  dfp::cuda::Executor& ex = gpu.executor();
  ex.set_profile(true);
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) gpu.train_step(data.x.data(), data.y.data(), batch, 0.01f, scaler);
  const double total = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps;
  ex.set_profile(false);
  std::map<std::string, std::pair<double, double>> by_kind;
  std::vector<std::pair<double, std::string>> slowest;
  double layers = 0;
  for (const auto& t : ex.layer_times()) {
    by_kind[t.kind].first += t.forward_ms / steps;
    by_kind[t.kind].second += t.backward_ms / steps;
    layers += (t.forward_ms + t.backward_ms) / steps;
    char row[160];
    std::snprintf(row, sizeof row, "%-28s %-8s fwd %7.3f bwd %7.3f", t.name.c_str(), t.kind.c_str(),
                  t.forward_ms / steps, t.backward_ms / steps);
    slowest.emplace_back((t.forward_ms + t.backward_ms) / steps, row);
  }
  const auto& st = ex.step_times();
  std::printf("  profile over %d steps, ms per step (synchronised per layer: %.3f ms per step in all)\n", steps, total);
  std::printf("  %-10s %8s %8s\n", "kind", "forward", "backward");
  for (const auto& [kind, t] : by_kind) std::printf("  %-10s %8.3f %8.3f\n", kind.c_str(), t.first, t.second);
  std::printf("  layers %.3f, staging %.3f, loss+unscale %.3f, sgd %.3f\n", layers, st.stage_ms / steps,
              st.loss_ms / steps, st.update_ms / steps);
  std::sort(slowest.rbegin(), slowest.rend());
  for (size_t i = 0; i < slowest.size() && i < 12; ++i) std::printf("    %s\n", slowest[i].second.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::string cases = "resnet20:128:32,resnet50:32:224", precisions = "fp16,fp32", algos = "heuristic,benchmark", csv;
  int warmup = 10, steps = 50, profile = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "cuda_bench: flag %s expects a value\n", a.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--cases") cases = v;
    else if (a == "--precisions") precisions = v;
    else if (a == "--algos") algos = v;
    else if (a == "--warmup") warmup = to_int(v, "--warmup");
    else if (a == "--steps") steps = to_int(v, "--steps");
    else if (a == "--profile") profile = to_int(v, "--profile", 0);
    else if (a == "--csv") csv = v;
    else {
      std::fprintf(stderr,
                   "cuda_bench: unknown flag %s (expected --cases, --precisions, --algos, --warmup, --steps, --profile, --csv)\n",
                   a.c_str());
      return 2;
    }
  }
  std::string why;
  if (!dfp::cuda_available(&why)) {
    std::printf("cuda_bench: nothing measured: %s\n", why.c_str());
    return 0;
  }
  FILE* out = nullptr;
  if (!csv.empty()) {
    out = std::fopen(csv.c_str(), "w");
    if (!out) {
      std::fprintf(stderr, "cuda_bench: cannot write --csv '%s'\n", csv.c_str());
      return 2;
    }
    std::fprintf(out, "model,batch,side,precision,algos,median_ms,mean_ms,images_per_second,final_loss\n");
  }
  try {
    const dfp::Context ctx(dfp::ContextOptions{.threads = 2});
    bool described = false;
    for (const std::string& c : split(cases, ',')) {
      const std::vector<std::string> f = split(c, ':');
      if (f.size() != 3) {
        std::fprintf(stderr, "cuda_bench: case '%s' is not MODEL:BATCH:SIDE\n", c.c_str());
        return 2;
      }
      const int batch = to_int(f[1], "batch"), side = to_int(f[2], "side");
      const dfp::bench::TrainCase tc{f[0].c_str(), batch, 3, side, side, 10};
      const dfp::bench::TrainBatch data(tc);
      std::vector<std::pair<std::string, std::string>> runs;  // (precision, algos)
      for (const std::string& p : split(precisions, ','))
        for (const std::string& algo : split(algos, ',')) runs.emplace_back(p, algo);
      for (const auto& [p, algo] : runs) {
        if (algo != "heuristic" && algo != "benchmark") {
          std::fprintf(stderr, "cuda_bench: --algos '%s': expected heuristic or benchmark\n", algo.c_str());
          return 2;
        }
        const dfp::Precision prec = p == "fp16" ? dfp::Precision::fp16 : dfp::Precision::fp32;
        if (p != "fp16" && p != "fp32") {
          std::fprintf(stderr, "cuda_bench: precision '%s': expected fp16 or fp32\n", p.c_str());
          return 2;
        }
        dfp::Model host(ctx, tc.model);
        dfp::build_model(host, tc.model, tc.c, tc.h, tc.w, tc.classes);
        host.build(batch, dfp::PrecisionPolicy{});
        dfp::CudaModel gpu(ctx, host, prec, dfp::SgdOptions{0.9f, 5e-4f, false}, nullptr,
                           dfp::CudaOptions{algo == "benchmark"});
        if (!described) {
          std::printf("device: %s\n", gpu.describe().c_str());
          described = true;
        }
        dfp::LossScaleOptions lso;
        lso.mode = prec == dfp::Precision::fp16 ? dfp::LossScaleMode::dynamic : dfp::LossScaleMode::none;
        dfp::LossScaler scaler(lso);
        for (int s = 0; s < warmup; ++s) gpu.train_step(data.x.data(), data.y.data(), batch, 0.01f, scaler);
        std::vector<double> ms;
        double loss = 0;
        for (int s = 0; s < steps; ++s) {
          const auto t0 = std::chrono::steady_clock::now();
          loss = gpu.train_step(data.x.data(), data.y.data(), batch, 0.01f, scaler).loss;
          ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
        double mean = 0;
        for (double v : ms) mean += v / ms.size();
        std::sort(ms.begin(), ms.end());
        const double median = ms[ms.size() / 2];
        std::printf("%-10s b%-4d %4dx%-4d %-5s %-9s median %8.3f ms  mean %8.3f ms  %9.1f img/s  loss %.4f  skipped %llu\n",
                    tc.model, batch, side, side, p.c_str(), algo.c_str(), median, mean, batch * 1000.0 / median, loss,
                    static_cast<unsigned long long>(scaler.skipped_steps()));
        if (out)
          std::fprintf(out, "%s,%d,%d,%s,%s,%.4f,%.4f,%.2f,%.6f\n", tc.model, batch, side, p.c_str(), algo.c_str(), median, mean,
                       batch * 1000.0 / median, loss);
        if (profile > 0) print_profile(gpu, scaler, data, batch, profile);
        std::fflush(stdout);
      }
    }
  } catch (const dfp::Error& e) {
    std::fprintf(stderr, "cuda_bench: %s\n", e.what());
    if (out) std::fclose(out);
    return 1;
  }
  if (out) std::fclose(out);
  return 0;
}
