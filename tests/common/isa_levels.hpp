// The kernel levels that a test comparing levels runs.
#pragma once

#include <cstdlib>
#include <vector>

#include "dfp/isa.hpp"

namespace dfp::test {

// Every level this CPU supports, lowest first; under DFP_ISA (ctest's forced re-runs of a suite,
// tests/CMakeLists.txt) only the forced one, which the default run has already compared with the
// others: the re-runs then do not repeat the default run's work.
inline std::vector<Isa> isa_levels() {
  if (const char* env = std::getenv("DFP_ISA"); env && *env) return {parse_isa(env, "environment variable DFP_ISA")};
  const CpuFeatures cpu = detect_cpu_features();
  std::vector<Isa> out;
  for (Isa isa : kIsaLevels)
    if (cpu.supports(isa)) out.push_back(isa);
  return out;
}

// Every level's name from `from` up (for parameterised suites, whose tests skip the levels the
// CPU lacks).
inline std::vector<const char*> isa_names_from(Isa from) {
  std::vector<const char*> out;
  for (Isa isa : kIsaLevels)
    if (isa >= from) out.push_back(isa_name(isa));
  return out;
}

}  // namespace dfp::test
