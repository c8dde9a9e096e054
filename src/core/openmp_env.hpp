// oneDNN's OpenMP threads and dfp's oneTBB threads take turns on the same cores every layer. With
// libgomp's default wait policy, OpenMP workers spin for a while after each primitive, stealing
// the cores from the TBB loops (BatchNorm, ReLU, DFP16 kernels) that run next (what that costs:
// docs/design/threads.md), so dfp's programs run with OMP_WAIT_POLICY=PASSIVE. libgomp reads the
// policy once, when it is loaded, so programs set it before they start: this re-executes the
// program with the variable set, unless the user set it already (their choice wins). For
// embedders the README gives the same advice.
#pragma once

#include <unistd.h>

#include <cstdlib>

namespace dfp {

inline void reexec_with_passive_openmp(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  if (setenv("OMP_WAIT_POLICY", "PASSIVE", 1) != 0) return;
  execv("/proc/self/exe", argv);  // returns only on failure: then run on with the default policy
}

}  // namespace dfp
