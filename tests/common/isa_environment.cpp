// Linked into every test program. ctest re-runs some programs with DFP_ISA forcing a lower kernel
// level (tests/CMakeLists.txt); where this CPU lacks the forced level, every test of the run is
// skipped instead of failing in its first Context.
#include <gtest/gtest.h>

#include <cstdlib>

#include "dfp/context.hpp"
#include "dfp/isa.hpp"

namespace {
class IsaEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* env = std::getenv("DFP_ISA");
    if (!env || !*env) return;
    const dfp::CpuFeatures cpu = dfp::detect_cpu_features();
    if (!cpu.supports(dfp::parse_isa(env, "environment variable DFP_ISA")))
      GTEST_SKIP() << "DFP_ISA=" << env << ": this CPU (" << cpu.brand << ") lacks that kernel level";
  }
};
[[maybe_unused]] ::testing::Environment* const kIsaEnvironment =
    ::testing::AddGlobalTestEnvironment(new IsaEnvironment);
}  // namespace
