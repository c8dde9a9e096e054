// dfp: instruction-set levels and CPU feature detection.
#pragma once

#include <string>
#include <string_view>

namespace dfp {

// Kernel levels, lowest first. Every kernel has an entry at each level; a level is usable only
// when the CPU has its features (see CpuFeatures::supports).
enum class Isa {
  ref = 0,         // portable scalar C++: the bit-exact specification of every kernel
  avx2 = 1,        // AVX2 + FMA + F16C on ymm: INT16 dot products as VPMADDWD + VPADDD, or as
                   // the VEX-encoded AVX-VNNI VPDPWSSD where the CPU has avx_vnni (same bits)
  avx512bw = 2,    // AVX-512 F/BW/DQ/VL: INT16 dot products as VPMADDWD + VPADDD
  avx512vnni = 3,  // AVX-512 VNNI: INT16 dot products as VPDPWSSD
};

// Every level, lowest first: the one list that flags, messages and tests take the levels from.
inline constexpr Isa kIsaLevels[] = {Isa::ref, Isa::avx2, Isa::avx512bw, Isa::avx512vnni};

const char* isa_name(Isa isa) noexcept;
// The levels' names joined by `separator`, lowest first: "ref|avx2|avx512bw|avx512vnni" with "|".
std::string isa_names(std::string_view separator);
// Parses a level's name (isa_name); throws dfp::Error(invalid_argument) naming `origin` (for
// example "environment variable DFP_ISA") and the levels otherwise.
Isa parse_isa(std::string_view text, std::string_view origin);

struct CpuFeatures {
  std::string vendor;
  std::string brand;
  bool avx2 = false, fma = false, f16c = false, aes = false;
  bool avx_vnni = false;      // VEX-encoded VPDPWSSD on ymm (Alder Lake, Sapphire Rapids, Zen 5)
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false;
  bool avx512vnni = false, avx512bf16 = false, avx512fp16 = false, vaes = false;
  bool os_saves_ymm = false;  // XGETBV: the OS enabled the XMM and YMM state
  bool os_saves_zmm = false;  // XGETBV: the OS enabled the XMM/YMM and the opmask/ZMM state
  // AMX tiles (Sapphire Rapids and later). dfp's own kernels do not use them; oneDNN's BF16
  // primitives do, which the bf16 precision runs (dfp info shows which implementation runs).
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
  bool os_saves_amx = false;  // XGETBV: the OS enabled the XTILECFG/XTILEDATA state

  bool supports(Isa isa) const noexcept;
  Isa best() const noexcept;
};

// CPUID + XGETBV, read once per call (cheap); no global cache.
CpuFeatures detect_cpu_features();

}  // namespace dfp
