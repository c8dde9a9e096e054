// Context: threads (dfp's parallel loops and oneDNN's on one OpenMP pool), kernel table, seed, log sink.
#include "dfp/context.hpp"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <string>

#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"

namespace dfp {

struct Context::Impl {
  int threads = 1;
  CpuFeatures cpu;
  simd::KernelTable kernels;
  uint64_t seed = 1;
  LogSink log;
};

static int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return 1;
}

void ContextOptions::validate_threads(int threads, const std::string& origin) {
  DFP_CHECK(threads >= 0, Status::invalid_argument,
            origin + ": expected >= 0 (0 = all cores), got " + std::to_string(threads));
  DFP_CHECK(threads <= kMaxThreads, Status::invalid_argument,
            origin + ": expected at most " + std::to_string(kMaxThreads) + " (0 = all cores), got " +
                std::to_string(threads));
}

Context::Context(const ContextOptions& o) : impl_(std::make_unique<Impl>()) {
  ContextOptions::validate_threads(o.threads, "ContextOptions.threads");
  impl_->threads = o.threads > 0 ? o.threads : available_cores();
  impl_->cpu = detect_cpu_features();
  impl_->seed = o.seed;
  impl_->log = o.log;

  Isa isa = impl_->cpu.best();
  std::string origin;
  std::string requested = o.isa;
  if (!requested.empty()) {
    origin = "ContextOptions.isa";
  } else if (const char* env = std::getenv("DFP_ISA"); env && *env) {
    requested = env;
    origin = "environment variable DFP_ISA";
  }
  // "avx2-vpmaddwd": the avx2 level in the form a CPU without AVX-VNNI runs (VPMADDWD + VPADDD),
  // so that such CPUs (AMD Zen 2/3, Intel Haswell to Skylake client) can be measured on one that has it.
  CpuFeatures kernel_cpu = impl_->cpu;
  if (requested == "avx2-vpmaddwd") {
    requested = "avx2";
    kernel_cpu.avx_vnni = false;
  }
  if (!requested.empty()) {
    const Isa want = parse_isa(requested, origin);
    DFP_CHECK(impl_->cpu.supports(want), Status::unsupported,
              origin + ": kernel level '" + requested + "' needs CPU features this CPU (" + impl_->cpu.brand +
                  ") lacks; the best it supports is '" + isa_name(impl_->cpu.best()) + "'");
    isa = want;
  }
  impl_->kernels = simd::make_kernel_table(isa, kernel_cpu);
  bind_openmp();
}

Context::~Context() = default;

int Context::threads() const noexcept { return impl_->threads; }
Isa Context::isa() const noexcept { return impl_->kernels.isa; }
const CpuFeatures& Context::cpu() const noexcept { return impl_->cpu; }
const simd::KernelTable& Context::kernels() const noexcept { return impl_->kernels; }
uint64_t Context::seed() const noexcept { return impl_->seed; }

void Context::log(LogLevel level, std::string_view message) const {
  if (impl_->log) impl_->log(level, message);
}

// dfp's loops run on the OpenMP pool that oneDNN's primitives (and, inside PyTorch, torch's own
// loops) use: one team of threads takes every parallel region in turn, so no pool's idle threads
// spin on the cores another pool's loop needs, whatever OMP_WAIT_POLICY says (docs/design/threads.md).
// Chunks handed out dynamically let a thread that finishes early take another (the chunks of a
// pass differ in cost at image borders and in a last partial channel block, and a busy VM slows
// one thread or the other). With 4 per thread, the threads of ResNet-18c's INT16 convolution
// passes waited for each other 3.3% of their time; with 16, 0.9%, and the chunks' own work did
// not grow (docs/measurements.md, session 43). Which thread runs a chunk never changes a result.
void Context::parallel_for_ref(int64_t n, RangeRef body) const {
  if (n <= 0) return;
  const int threads = impl_->threads;
  // Inside another parallel region (a caller's own OpenMP loop) the loop runs on its thread alone,
  // as nested OpenMP regions do.
  if (threads == 1 || n == 1 || omp_in_parallel()) {
    body.call(body.body, 0, n);
    return;
  }
  constexpr int64_t kChunksPerThread = 16;
  const int team = int(std::min<int64_t>(threads, n));
  const int64_t chunks = std::min<int64_t>(n, team * kChunksPerThread);
  std::exception_ptr error;  // an exception may not leave an OpenMP region: the first one is rethrown
#pragma omp parallel for num_threads(team) schedule(dynamic, 1)
  for (int64_t c = 0; c < chunks; ++c) {
    try {
      body.call(body.body, n * c / chunks, n * (c + 1) / chunks);
    } catch (...) {
#pragma omp critical(dfp_parallel_for_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

void Context::bind_openmp() const { omp_set_num_threads(impl_->threads); }


}  // namespace dfp
