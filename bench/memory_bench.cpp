// Peak memory of training per model and precision, against FP32 measured in the same run.
//
// Each case runs in a child process of its own (this program re-executed with --child), so that
// each has its own peak: the child builds the model, takes two full training steps (forward, loss,
// backward, SGD with re-quantization) on a random batch, and reports its peak resident set
// (VmHWM) minus its resident set just before the model was built -- the memory training itself
// added, as torch.cuda.max_memory_allocated measures it for PyTorch: libraries, the dataset and the
// process image are not counted. The child also reports what the Model planned (MemoryPlan).
// Counters: peak_MiB, fp32_peak_MiB, vs_fp32 (the ratio), arena_MiB, workspace_MiB.
//
// memory/process/<model>/<precision>: the whole process's peak (VmHWM, what `/usr/bin/time -v`
// reports as maximum resident set size) of a child that runs dfp::train as `dfp train --model
// resnet50 --dataset synthetic --data classes=10,train=32,test=8 --image-size 224 -b 32 --epochs 1
// --threads 2 --seed 1 --out <new directory>` does: loaders, evaluation and the checkpoint
// included. Counters: peak_MiB, fp32_peak_MiB, vs_fp32.
#include <benchmark/benchmark.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench/train_case.hpp"
#include "dfp/context.hpp"
#include "dfp/trainer.hpp"

extern char** environ;

namespace {

using Case = dfp::bench::TrainCase;

long status_kib(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field, 0) == 0) return std::stol(line.substr(std::strlen(field)));
  return -1;
}

// In the child: prints "peak_kib arena_bytes workspace_bytes".
int child(const Case& cfg, dfp::Precision precision) {
  dfp::ContextOptions o;
  o.threads = 2;
  dfp::Context ctx(o);
  const dfp::bench::TrainBatch batch(cfg);
  const long base = status_kib("VmRSS:");
  dfp::bench::TrainRun run(ctx, cfg, precision);
  for (int i = 0; i < 2; ++i) run.step(batch, cfg.batch);
  const dfp::MemoryPlan plan = run.model.memory_plan();
  std::printf("%ld %zu %zu\n", status_kib("VmHWM:") - base, plan.arena_bytes, plan.workspace_bytes);
  return 0;
}

// In the child: a whole training run, as the CLI's `dfp train`; prints "peak_kib 0 0".
int child_process(const std::string& model, dfp::Precision precision) {
  std::string dir = (std::filesystem::temp_directory_path() / "dfp_memory_bench_XXXXXX").string();
  if (!mkdtemp(dir.data())) return 3;
  dfp::TrainConfig c;
  c.model = model;
  c.dataset = "synthetic";
  c.data = "classes=10,train=32,test=8";
  c.image_size = 224;
  c.batch_size = 32;
  c.epochs = 1;
  c.threads = 2;
  c.seed = 1;
  c.policy.precision = precision;
  c.out = dir + "/run";
  int rc = 0;
  try {
    dfp::train(c, [](const std::string&) {});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memory_bench: %s\n", e.what());
    rc = 4;
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  if (rc == 0) std::printf("%ld 0 0\n", status_kib("VmHWM:"));
  return rc;
}

struct Measured {
  double peak_mib = 0, arena_mib = 0, workspace_mib = 0;
};

Measured run_child(const std::string& mode, const std::string& model, dfp::Precision precision) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  const std::string self = "/proc/self/exe";
  std::vector<std::string> args = {"memory_bench", mode, model, dfp::precision_name(precision)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid;
  const int rc = posix_spawn(&pid, self.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  Measured m;
  if (rc != 0) { close(fds[0]); return m; }
  std::string out;
  char buf[256];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, size_t(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  long kib = 0;
  size_t arena = 0, ws = 0;
  std::istringstream in(out);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && (in >> kib >> arena >> ws)) {
    m.peak_mib = kib / 1024.0;
    m.arena_mib = arena / 1048576.0;
    m.workspace_mib = ws / 1048576.0;
  }
  return m;
}

const std::vector<Case> kCases = {
    {"resnet20", 128, 3, 32, 32, 10},
    {"resnet50", 32, 3, 224, 224, 1000},
};

// The case's peak and FP32's, each from a child run in `mode`, into the state's counters; false
// where a child failed.
bool measure(benchmark::State& state, const std::string& mode, const std::string& model, dfp::Precision precision,
             Measured& own) {
  Measured fp32;
  for (auto _ : state) {
    fp32 = run_child(mode, model, dfp::Precision::fp32);
    own = precision == dfp::Precision::fp32 ? fp32 : run_child(mode, model, precision);
  }
  if (own.peak_mib <= 0 || fp32.peak_mib <= 0) {
    state.SkipWithError("child process failed");
    return false;
  }
  state.counters["peak_MiB"] = own.peak_mib;
  state.counters["fp32_peak_MiB"] = fp32.peak_mib;
  state.counters["vs_fp32"] = own.peak_mib / fp32.peak_mib;
  return true;
}

void memory(benchmark::State& state, Case cfg, dfp::Precision precision) {
  Measured own;
  if (!measure(state, "--child", cfg.model, precision, own)) return;
  state.counters["arena_MiB"] = own.arena_mib;
  state.counters["workspace_MiB"] = own.workspace_mib;
  state.SetLabel(dfp::bench::case_label(cfg, precision));
}

void process(benchmark::State& state, std::string model, dfp::Precision precision) {
  Measured own;
  if (!measure(state, "--child-process", model, precision, own)) return;
  state.SetLabel(model + " " + dfp::precision_name(precision) + " b32 3x224x224, dfp::train, whole process");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--child") {
    for (const Case& c : kCases)
      if (c.model == std::string(argv[2])) return child(c, dfp::parse_precision(argv[3], "memory_bench"));
    return 2;
  }
  if (argc == 4 && std::string(argv[1]) == "--child-process")
    return child_process(argv[2], dfp::parse_precision(argv[3], "memory_bench"));
  for (const Case& c : kCases)
    for (dfp::Precision p : {dfp::Precision::fp32, dfp::Precision::int16, dfp::Precision::bf16, dfp::Precision::fp16})
      benchmark::RegisterBenchmark(("memory/" + std::string(c.model) + "/" + dfp::precision_name(p)).c_str(), memory, c, p)
          ->Unit(benchmark::kSecond)
          ->UseRealTime()
          ->Iterations(1);
  for (dfp::Precision p : {dfp::Precision::fp32, dfp::Precision::int16})
    benchmark::RegisterBenchmark(("memory/process/resnet50/" + std::string(dfp::precision_name(p))).c_str(), process,
                                 std::string("resnet50"), p)
        ->Unit(benchmark::kSecond)
        ->UseRealTime()
        ->Iterations(1);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
