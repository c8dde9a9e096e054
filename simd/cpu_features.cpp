// CPUID/XGETBV feature detection and ISA names.
#include <cpuid.h>

#include <cstring>
#include <string>

#include "dfp/isa.hpp"
#include "dfp/status.hpp"

namespace dfp {

const char* isa_name(Isa isa) noexcept {
  switch (isa) {
    case Isa::ref: return "ref";
    case Isa::avx2: return "avx2";
    case Isa::avx512bw: return "avx512bw";
    case Isa::avx512vnni: return "avx512vnni";
  }
  return "?";
}

std::string isa_names(std::string_view separator) {
  std::string out;
  for (Isa i : kIsaLevels) out.append(out.empty() ? "" : separator).append(isa_name(i));
  return out;
}

Isa parse_isa(std::string_view text, std::string_view origin) {
  for (Isa i : kIsaLevels)
    if (text == isa_name(i)) return i;
  fail(Status::invalid_argument, std::string(origin) + ": unknown kernel level '" + std::string(text) +
                                     "'; expected one of " + isa_names(", "));
}

bool CpuFeatures::supports(Isa isa) const noexcept {
  const bool avx2_level = os_saves_ymm && avx2 && fma && f16c;
  const bool avx512 = avx2_level && os_saves_zmm && avx512f && avx512bw && avx512dq && avx512vl;
  switch (isa) {
    case Isa::ref: return true;
    case Isa::avx2: return avx2_level;
    case Isa::avx512bw: return avx512;
    case Isa::avx512vnni: return avx512 && avx512vnni;
  }
  return false;
}

Isa CpuFeatures::best() const noexcept {
  Isa best = Isa::ref;
  for (Isa i : kIsaLevels)
    if (supports(i)) best = i;
  return best;
}

CpuFeatures detect_cpu_features() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  const unsigned max_leaf = a;
  char vendor[13] = {};
  std::memcpy(vendor + 0, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  f.vendor = vendor;

  __get_cpuid(1, &a, &b, &c, &d);
  const bool osxsave = c & (1u << 27);
  f.fma = c & (1u << 12);
  f.f16c = c & (1u << 29);
  f.aes = c & (1u << 25);
  if (osxsave) {
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    // XMM|YMM (bits 1,2) and opmask|ZMM_Hi256|Hi16_ZMM (bits 5,6,7) enabled by the OS.
    f.os_saves_ymm = (lo & 0x06) == 0x06;
    f.os_saves_zmm = (lo & 0xE6) == 0xE6;
    f.os_saves_amx = (lo & 0x60000) == 0x60000;  // bits 17, 18: XTILECFG, XTILEDATA
  }
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = b & (1u << 5);
    f.avx512f = b & (1u << 16);
    f.avx512dq = b & (1u << 17);
    f.avx512bw = b & (1u << 30);
    f.avx512vl = b & (1u << 31);
    f.avx512vnni = c & (1u << 11);
    f.vaes = c & (1u << 9);
    f.avx512fp16 = d & (1u << 23);
    f.amx_bf16 = d & (1u << 22);
    f.amx_tile = d & (1u << 24);
    f.amx_int8 = d & (1u << 25);
    __cpuid_count(7, 1, a, b, c, d);
    f.avx_vnni = a & (1u << 4);
    f.avx512bf16 = a & (1u << 5);
  }
  unsigned ext = __get_cpuid_max(0x80000000u, nullptr);
  if (ext >= 0x80000004u) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      __get_cpuid(0x80000002u + i, &a, &b, &c, &d);
      std::memcpy(brand + 16 * i + 0, &a, 4);
      std::memcpy(brand + 16 * i + 4, &b, 4);
      std::memcpy(brand + 16 * i + 8, &c, 4);
      std::memcpy(brand + 16 * i + 12, &d, 4);
    }
    f.brand = brand;
    while (!f.brand.empty() && f.brand.back() == ' ') f.brand.pop_back();
  }
  return f;
}

}  // namespace dfp
