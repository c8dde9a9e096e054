// The cost of the INT16 kernels' INT32 -> FP32 flush, in isolation: why a flush mid-call converts
// and adds (simd/avx512/conv_s16_kernels.hpp, Flush) instead of converting and multiply-adding.
//
// One thread runs 24 independent VPDPWSSD accumulators (embedded broadcast, as the pixel kernel's
// steps) and flushes all 24 every `chain` steps into 24 L1-resident FP32 lines:
//   none      no flush (the VPDPWSSD rate alone)
//   fma       convert, FMA with the scale and the line, store, zero   (the alternative)
//   add       convert, add the line, store, zero                       (the kernels' flush)
//   check     the largest |accumulator| over all 24 (VPABSD + VPMAXUD each, then across lanes),
//             compared and branched on, no flush: what a run-time overflow check that let a
//             call skip flushes would cost (about the add flush's cost, and it would have to
//             run more often than the flush it replaces, so the kernels do not use it;
//             docs/performance.md)
// Inline asm with fixed registers (accumulators zmm0-23, the flush's scratch zmm28, 29), so that
// the compiler adds nothing. Counter Gsteps = VPDPWSSD per ns; compare the modes of one run (the
// VM is noisy). Skipped without AVX-512 VNNI.
#include <benchmark/benchmark.h>

#include <immintrin.h>

#include <cstdint>

#include "dfp/isa.hpp"

namespace {

#define DFP_ACCS "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23"
#define DFP_STEPS ".irp r," DFP_ACCS "\n\tvpdpwssd (%[src])%{1to16%}, %%zmm30, %%zmm\\r\n\t.endr\n\t"

enum Mode { kNone, kFma, kAdd, kCheck };

// One round: `chain` steps on all 24 accumulators, then FLUSH; `iters` rounds.
#define DFP_RUN(FLUSH)                                                                                          \
  asm volatile("1:\n\tmov %[chain], %[n]\n\t2:\n\t" DFP_STEPS "dec %[n]\n\tjnz 2b\n\t" FLUSH "dec %[it]\n\tjnz 1b" \
               : [it] "+r"(iters), [n] "=&r"(scratch)                                                          \
               : [chain] "r"(chain), [src] "r"(src), [out] "r"(out), [scale] "v"(scale)                        \
               : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", \
                 "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", \
                 "xmm21", "xmm22", "xmm23", "xmm28", "xmm29", "xmm30")
// Each accumulator \r: convert into zmm28, COMBINE it with the accumulator's line, store, zero.
#define DFP_FLUSH(COMBINE)                                                                        \
  ".irp r," DFP_ACCS "\n\tvcvtdq2ps %%zmm\\r, %%zmm28\n\t" COMBINE "\n\t"                          \
  "vmovaps %%zmm28, \\r*64(%[out])\n\tvpxord %%zmm\\r, %%zmm\\r, %%zmm\\r\n\t.endr\n\t"

template <Mode M>
__attribute__((target("avx512f,avx512vnni"))) void run(int64_t iters, int chain, const int32_t* src, float* out) {
  int scratch;
  const __m512 scale = _mm512_set1_ps(0x1p-20f);  // a DFP16 product scale: normal results
  if constexpr (M == kNone) DFP_RUN("");
  if constexpr (M == kFma) DFP_RUN(DFP_FLUSH("vfmadd213ps \\r*64(%[out]), %[scale], %%zmm28"));  // * scale + line
  if constexpr (M == kAdd) DFP_RUN(DFP_FLUSH("vaddps \\r*64(%[out]), %%zmm28, %%zmm28"));
  // The branch is never taken (the maximum stays far below INT32_MAX); it makes the result used.
  if constexpr (M == kCheck)
    DFP_RUN("vpabsd %%zmm0, %%zmm28\n\t"
            ".irp r,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23\n\t"
            "vpabsd %%zmm\\r, %%zmm29\n\tvpmaxud %%zmm29, %%zmm28, %%zmm28\n\t.endr\n\t"
            "vextracti64x4 $1, %%zmm28, %%ymm29\n\tvpmaxud %%ymm29, %%ymm28, %%ymm28\n\t"
            "vextracti32x4 $1, %%ymm28, %%xmm29\n\tvpmaxud %%xmm29, %%xmm28, %%xmm28\n\t"
            "vpshufd $0x4e, %%xmm28, %%xmm29\n\tvpmaxud %%xmm29, %%xmm28, %%xmm28\n\t"
            "vpshufd $0xb1, %%xmm28, %%xmm29\n\tvpmaxud %%xmm29, %%xmm28, %%xmm28\n\t"
            "vmovd %%xmm28, %k[n]\n\tcmp $0x7fffffff, %k[n]\n\tje 1b\n\t");
}

template <Mode M>
void flush(benchmark::State& state) {
  if (!dfp::detect_cpu_features().supports(dfp::Isa::avx512vnni)) {
    state.SkipWithError("this CPU lacks AVX-512 VNNI");
    return;
  }
  const int chain = static_cast<int>(state.range(0));
  alignas(64) static int32_t src[16] = {0x00030005};
  alignas(64) static float out[24 * 16] = {};
  const int64_t rounds = 4096 / chain;  // about 100k VPDPWSSD per iteration
  for (auto _ : state) run<M>(rounds, chain, src, out);
  state.counters["Gsteps"] =
      benchmark::Counter(double(rounds) * chain * 24 * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(flush<kNone>)->Name("flush/none")->ArgName("chain")->Arg(8)->Arg(16)->Arg(24)->Arg(48)->UseRealTime();
BENCHMARK(flush<kFma>)->Name("flush/fma")->ArgName("chain")->Arg(8)->Arg(16)->Arg(24)->Arg(48)->UseRealTime();
BENCHMARK(flush<kAdd>)->Name("flush/add")->ArgName("chain")->Arg(8)->Arg(16)->Arg(24)->Arg(48)->UseRealTime();
BENCHMARK(flush<kCheck>)->Name("flush/check")->ArgName("chain")->Arg(8)->Arg(16)->Arg(24)->Arg(48)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
