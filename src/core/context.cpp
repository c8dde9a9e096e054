// Context: threads (oneTBB arena + OpenMP thread count), kernel table, seed, log sink.
#include "dfp/context.hpp"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <tbb/task_scheduler_observer.h>

#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"

namespace dfp {

// OpenMP with OMP_PROC_BIND pins the thread that first runs a parallel region (our caller) to one
// core. Threads created afterwards inherit that one-core mask, so TBB's workers would all share
// the caller's core. This observer gives every thread entering our arena the affinity mask the
// process had when the Context was created.
class AffinityRestorer : public tbb::task_scheduler_observer {
 public:
  AffinityRestorer(tbb::task_arena& arena, const cpu_set_t& mask) : tbb::task_scheduler_observer(arena), mask_(mask) {
    observe(true);
  }
  ~AffinityRestorer() override { observe(false); }
  void on_scheduler_entry(bool is_worker) override {
    if (is_worker) sched_setaffinity(0, sizeof(mask_), &mask_);
  }

 private:
  cpu_set_t mask_;
};

struct Context::Impl {
  int threads = 1;
  CpuFeatures cpu;
  simd::KernelTable kernels;
  uint64_t seed = 1;
  LogSink log;
  tbb::task_arena arena;
  std::unique_ptr<AffinityRestorer> restorer;
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
  if (!requested.empty()) {
    const Isa want = parse_isa(requested, origin);
    DFP_CHECK(impl_->cpu.supports(want), Status::unsupported,
              origin + ": kernel level '" + requested + "' needs CPU features this CPU (" + impl_->cpu.brand +
                  ") lacks; the best it supports is '" + isa_name(impl_->cpu.best()) + "'");
    isa = want;
  }
  impl_->kernels = simd::make_kernel_table(isa, impl_->cpu);
  impl_->arena.initialize(impl_->threads);
  cpu_set_t mask;
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0)
    impl_->restorer = std::make_unique<AffinityRestorer>(impl_->arena, mask);
  bind_openmp();
}

Context::~Context() {
  if (impl_) impl_->restorer.reset();  // stop observing before the arena goes away
}

int Context::threads() const noexcept { return impl_->threads; }
Isa Context::isa() const noexcept { return impl_->kernels.isa; }
const CpuFeatures& Context::cpu() const noexcept { return impl_->cpu; }
const simd::KernelTable& Context::kernels() const noexcept { return impl_->kernels; }
uint64_t Context::seed() const noexcept { return impl_->seed; }

void Context::log(LogLevel level, std::string_view message) const {
  if (impl_->log) impl_->log(level, message);
}

void Context::parallel_for_ref(int64_t n, RangeRef body) const {
  if (n <= 0) return;
  if (impl_->threads == 1 || n == 1) {
    body.call(body.body, 0, n);
    return;
  }
  impl_->arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, 1),
                      [&](const tbb::blocked_range<int64_t>& r) { body.call(body.body, r.begin(), r.end()); });
  });
}

void Context::bind_openmp() const { omp_set_num_threads(impl_->threads); }

void reexec_with_passive_openmp(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  if (setenv("OMP_WAIT_POLICY", "PASSIVE", 1) != 0) return;
  execv("/proc/self/exe", argv);  // returns only on failure
}

}  // namespace dfp
