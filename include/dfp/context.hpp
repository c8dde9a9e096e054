// dfp: the execution context.
//
// There is no global state in dfp. A Context owns everything a computation needs from its
// environment: the worker threads (dfp's parallel loops and oneDNN's primitives run on one OpenMP
// pool, the one PyTorch's loops also use when dfp is loaded beside it, so no pool's idle threads
// take the cores from another's work), the kernel table chosen once from the CPU's features, the
// base random seed, and the log sink.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>

#include "dfp/isa.hpp"

namespace dfp {

namespace simd {
struct KernelTable;  // simd/kernel_table.hpp: the contract between the engine and the kernels
}

enum class LogLevel { warning, info, debug };
using LogSink = std::function<void(LogLevel, std::string_view)>;

struct ContextOptions {
  // Worker threads of dfp's loops and oneDNN's primitives. 0: the cores this process may use.
  int threads = 0;
  // The one rule for a thread count, which every entry point applies (this struct, TrainConfig,
  // the command line's --threads): 0 .. kMaxThreads, 0 meaning every core this process may use.
  // Throws invalid_argument naming `origin` ("ContextOptions.threads", "flag --threads") and the
  // value.
  static void validate_threads(int threads, const std::string& origin);
  // The most threads a context takes: each thread gets per-thread buffers sized by the model, so
  // a mistyped count must fail as a setting, not as an allocation.
  static constexpr int kMaxThreads = 1024;
  // Kernel level: "" = the environment variable DFP_ISA if set, else the best the CPU supports.
  // Otherwise "ref", "avx2", "avx512bw" or "avx512vnni"; a level the CPU lacks is an error.
  // "avx2-vpmaddwd" is the avx2 level in its VPMADDWD + VPADDD form where the CPU has AVX-VNNI
  // (what an AVX2 CPU without it runs; same bits).
  std::string isa;
  // Base seed for every random stream (stochastic rounding, initialisation, shuffling).
  uint64_t seed = 1;
  // Where messages go. Default: nowhere (a library does not print).
  LogSink log;
};

class Context {
 public:
  explicit Context(const ContextOptions& options = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int threads() const noexcept;
  Isa isa() const noexcept;
  const CpuFeatures& cpu() const noexcept;
  const simd::KernelTable& kernels() const noexcept;
  uint64_t seed() const noexcept;
  void log(LogLevel level, std::string_view message) const;

  // Runs body(begin, end) over disjoint chunks covering [0, n) on this context's threads.
  // Results must not depend on how [0, n) is chunked: every caller writes disjoint outputs.
  // The body is taken by reference, not copied into a std::function: a training step makes
  // hundreds of these calls and allocates nothing.
  template <class Body>
  void parallel_for(int64_t n, Body&& body) const {
    using B = std::remove_reference_t<Body>;
    parallel_for_ref(n, RangeRef{const_cast<void*>(static_cast<const void*>(&body)),
                                 [](void* b, int64_t lo, int64_t hi) { (*static_cast<B*>(b))(lo, hi); }});
  }

  // Makes oneDNN (OpenMP) use this context's thread count on the calling thread. Called by the
  // oneDNN-backed kernels before each primitive runs.
  void bind_openmp() const;

 private:
  struct RangeRef {
    void* body;
    void (*call)(void*, int64_t, int64_t);
  };
  void parallel_for_ref(int64_t n, RangeRef body) const;

  struct Impl;
  std::unique_ptr<Impl> impl_;
};


}  // namespace dfp
