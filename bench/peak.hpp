// The instruction peaks of the CPU a benchmark runs on, measured when it runs: what a kernel's
// GOP/s is a share of. Each form is one instruction (or the VPMADDWD + VPADDD pair that stands for
// one INT16 multiply-accumulate where VNNI is absent) on enough independent accumulators to hide
// its latency, in inline asm with fixed registers, so that the compiler adds nothing; every thread
// runs the loop at once and the figure is the total over the wall time (best of three). Ops count
// as conv_bench counts them: 2 per multiply-add (a VPDPWSSD on zmm is 64, an FMA on ymm 16).
// ../shared/peers/microbench/peak.cpp measures the AVX-512 forms the same way; this adds the ymm
// forms the avx2 level runs, and picks the form of the kernel that ran (its table name).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dfp/isa.hpp"

namespace dfp::bench {

enum class PeakForm {
  vpdpwssd_zmm,  // AVX-512 VNNI
  vpmaddwd_zmm,  // AVX-512BW: VPMADDWD + VPADDD
  vpdpwssd_ymm,  // AVX-VNNI (VEX)
  vpmaddwd_ymm,  // AVX2: VPMADDWD + VPADDD
  fma_zmm,       // FP32 FMA, AVX-512
  fma_ymm,       // FP32 FMA, AVX2
};

inline const char* peak_form_name(PeakForm f) {
  switch (f) {
    case PeakForm::vpdpwssd_zmm: return "VPDPWSSD zmm";
    case PeakForm::vpmaddwd_zmm: return "VPMADDWD+VPADDD zmm";
    case PeakForm::vpdpwssd_ymm: return "VPDPWSSD ymm (AVX-VNNI)";
    case PeakForm::vpmaddwd_ymm: return "VPMADDWD+VPADDD ymm";
    case PeakForm::fma_zmm: return "FP32 FMA zmm";
    case PeakForm::fma_ymm: return "FP32 FMA ymm";
  }
  return "?";
}

inline bool cpu_runs(PeakForm f, const CpuFeatures& cpu) {
  const bool zmm = cpu.avx512f && cpu.avx512bw && cpu.os_saves_zmm;
  switch (f) {
    case PeakForm::vpdpwssd_zmm: return zmm && cpu.avx512vnni;
    case PeakForm::vpmaddwd_zmm: return zmm;
    case PeakForm::vpdpwssd_ymm: return cpu.avx_vnni && cpu.os_saves_ymm;
    case PeakForm::vpmaddwd_ymm: return cpu.avx2 && cpu.os_saves_ymm;
    case PeakForm::fma_zmm: return zmm;
    case PeakForm::fma_ymm: return cpu.avx2 && cpu.fma && cpu.os_saves_ymm;
  }
  return false;
}

// The form a kernel of dfp's table or a oneDNN FP32 implementation ran, from its name: dfp's end in
// "__<level>_<instruction>" ("..._28acc__avx512vnni_vpdpwssd"), oneDNN's name the ISA
// ("jit:avx512_core", "brgconv:avx512_core", "jit_1x1:avx2"). False where the name does not say
// (the reference level, oneDNN's GEMM fallback).
inline bool peak_form_of(const std::string& name, PeakForm& out) {
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (has("avx512vnni_vpdpwssd")) out = PeakForm::vpdpwssd_zmm;
  else if (has("avx512bw_vpmaddwd")) out = PeakForm::vpmaddwd_zmm;
  else if (has("avxvnni_vpdpwssd")) out = PeakForm::vpdpwssd_ymm;
  else if (has("avx2_vpmaddwd")) out = PeakForm::vpmaddwd_ymm;
  else if (has("__")) return false;  // dfp's, of another form (the reference)
  else if (has("avx512")) out = PeakForm::fma_zmm;
  else if (has("avx2")) out = PeakForm::fma_ymm;
  else return false;
  return true;
}

namespace peak_detail {

#define DFP_PEAK_CLOBBER_YMM \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", \
      "xmm13", "xmm14", "xmm15"
#define DFP_PEAK_CLOBBER_ZMM                                                                                      \
  DFP_PEAK_CLOBBER_YMM, "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", \
      "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31"

// One loop per form, NAME(iters) for the CPU features TARGET: zero the registers of ZERO_LIST
// (accumulators and operands), then per iteration STEP for each accumulator r of LOOP_LIST; it
// returns OPS, the ops of one iteration. The VPMADDWD forms multiply into product register 1r
// (zmm10-19, ymm10-15) and add that into r.
#define DFP_PEAK_FORM(NAME, TARGET, ZERO_LIST, ZERO, LOOP_LIST, STEP, CLOBBER, OPS)                               \
  __attribute__((target(TARGET))) inline double NAME(int64_t iters) {                                           \
    asm volatile(".irp r," ZERO_LIST "\n\t" ZERO "\n\t.endr\n\t1:\n\t.irp r," LOOP_LIST "\n\t" STEP "\n\t.endr\n\t" \
                 "dec %[n]\n\tjnz 1b"                                                                            \
                 : [n] "+r"(iters)                                                                               \
                 :                                                                                               \
                 : "cc", CLOBBER);                                                                               \
    return OPS;                                                                                                  \
  }
#define DFP_PEAK_ZERO_ZMM "vpxord %%zmm\\r, %%zmm\\r, %%zmm\\r"
#define DFP_PEAK_ZERO_YMM "vpxor %%ymm\\r, %%ymm\\r, %%ymm\\r"
DFP_PEAK_FORM(vpdpwssd_zmm, "avx512f,avx512bw,avx512vnni",
              "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,30,31", DFP_PEAK_ZERO_ZMM,
              "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23",
              "vpdpwssd %%zmm30, %%zmm31, %%zmm\\r", DFP_PEAK_CLOBBER_ZMM, 24.0 * 64)
DFP_PEAK_FORM(vpmaddwd_zmm, "avx512f,avx512bw", "0,1,2,3,4,5,6,7,8,9,30,31", DFP_PEAK_ZERO_ZMM,
              "0,1,2,3,4,5,6,7,8,9", "vpmaddwd %%zmm30, %%zmm31, %%zmm1\\r\n\tvpaddd %%zmm1\\r, %%zmm\\r, %%zmm\\r",
              DFP_PEAK_CLOBBER_ZMM, 10.0 * 64)
DFP_PEAK_FORM(vpdpwssd_ymm, "avx2,avxvnni", "0,1,2,3,4,5,6,7,8,9,10,11,14,15", DFP_PEAK_ZERO_YMM,
              "0,1,2,3,4,5,6,7,8,9,10,11", "%{vex%} vpdpwssd %%ymm14, %%ymm15, %%ymm\\r", DFP_PEAK_CLOBBER_YMM, 12.0 * 32)
DFP_PEAK_FORM(vpmaddwd_ymm, "avx2", "0,1,2,3,4,5,8,9", DFP_PEAK_ZERO_YMM, "0,1,2,3,4,5",
              "vpmaddwd %%ymm8, %%ymm9, %%ymm1\\r\n\tvpaddd %%ymm1\\r, %%ymm\\r, %%ymm\\r", DFP_PEAK_CLOBBER_YMM, 6.0 * 32)
DFP_PEAK_FORM(fma_zmm, "avx512f", "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,30,31", DFP_PEAK_ZERO_ZMM,
              "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15", "vfmadd231ps %%zmm30, %%zmm31, %%zmm\\r", DFP_PEAK_CLOBBER_ZMM,
              16.0 * 32)
DFP_PEAK_FORM(fma_ymm, "avx2,fma", "0,1,2,3,4,5,6,7,8,9,10,11,14,15", DFP_PEAK_ZERO_YMM, "0,1,2,3,4,5,6,7,8,9,10,11",
              "vfmadd231ps %%ymm14, %%ymm15, %%ymm\\r", DFP_PEAK_CLOBBER_YMM, 12.0 * 16)
#undef DFP_PEAK_FORM
#undef DFP_PEAK_ZERO_ZMM
#undef DFP_PEAK_ZERO_YMM
#undef DFP_PEAK_CLOBBER_ZMM
#undef DFP_PEAK_CLOBBER_YMM

// Runs `iters` iterations of the form's loop; returns the ops of one iteration.
inline double run(PeakForm f, int64_t iters) {
  switch (f) {
    case PeakForm::vpdpwssd_zmm: return vpdpwssd_zmm(iters);
    case PeakForm::vpmaddwd_zmm: return vpmaddwd_zmm(iters);
    case PeakForm::vpdpwssd_ymm: return vpdpwssd_ymm(iters);
    case PeakForm::vpmaddwd_ymm: return vpmaddwd_ymm(iters);
    case PeakForm::fma_zmm: return fma_zmm(iters);
    case PeakForm::fma_ymm: return fma_ymm(iters);
  }
  return 0;
}

// GOP/s of `threads` threads running `iters` iterations each, started together; seconds: the
// wall time it took.
inline double timed(PeakForm f, int threads, int64_t iters, double& seconds) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  std::vector<double> ops(size_t(threads), 0.0);
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      ++ready;
      while (!go.load(std::memory_order_acquire)) {
      }
      ops[size_t(t)] = run(f, iters);
    });
  while (ready.load() < threads) std::this_thread::yield();
  const auto t0 = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double total = 0;
  for (double o : ops) total += o * double(iters);
  return total / seconds / 1e9;
}

}  // namespace peak_detail

// GOP/s of `threads` threads running form f at once: the best of three runs of about 0.2 s each
// (after a calibration run, which also brings the cores up to their clock). 0 where the CPU cannot
// run f.
inline double measure_peak(PeakForm f, int threads) {
  if (!cpu_runs(f, detect_cpu_features()) || threads < 1) return 0;
  double seconds = 0;
  int64_t iters = 1 << 20;
  peak_detail::timed(f, threads, iters, seconds);
  iters = std::max<int64_t>(1 << 16, int64_t(double(iters) * 0.2 / std::max(seconds, 1e-6)));
  double best = 0;
  for (int r = 0; r < 3; ++r) best = std::max(best, peak_detail::timed(f, threads, iters, seconds));
  return best;
}

// Measured peaks by (form, threads), each measured once, when first asked for.
class Peaks {
 public:
  double get(PeakForm f, int threads) {
    const auto key = std::make_pair(int(f), threads);
    auto it = known_.find(key);
    if (it == known_.end()) it = known_.emplace(key, measure_peak(f, threads)).first;
    return it->second;
  }

 private:
  std::map<std::pair<int, int>, double> known_;
};

}  // namespace dfp::bench
