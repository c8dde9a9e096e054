// The kernel table as simd/kernels.inc and the level lists (simd/<level>/kernels.inc) make it: at
// every level and with every feature-chosen form, each entry has a function and a name of its own,
// taken from that level or a lower one.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "bench/peak.hpp"
#include "dfp/isa.hpp"
#include "simd/kernel_table.hpp"

using namespace dfp;

namespace {

struct Row {
  const char* entry;
  bool has_fn;
  std::string name, reference_name;
};

// Every entry of `t`, from the list that declares them.
std::vector<Row> rows_of(const simd::KernelTable& t) {
  std::vector<Row> rows;
#define DFP_KERNEL(entry, Fn, reference, reference_name) \
  rows.push_back({#entry, t.entry.fn != nullptr, t.entry.name, reference_name});
#include "simd/kernels.inc"
#undef DFP_KERNEL
  return rows;
}

// The implementation tags (after "__") a table of level `isa` may hold.
std::set<std::string> tags_up_to(Isa isa) {
  std::set<std::string> tags = {"ref", "none"};
  if (isa >= Isa::avx2) tags.insert({"onednn", "avx2", "avxvnni"});
  if (isa >= Isa::avx512bw) tags.insert({"avx512", "avx512bw"});
  if (isa >= Isa::avx512vnni) tags.insert("avx512vnni");
  return tags;
}

}  // namespace

TEST(KernelTable, EveryEntryHasAFunctionAndANameOfItsLevelAtEveryLevelAndForm) {
  const CpuFeatures cpu = detect_cpu_features();
  // The features that choose among forms of one level, each off in turn (the forms a CPU without
  // it gets); the table is only made here, not run.
  std::vector<std::pair<std::string, CpuFeatures>> forms = {{"as detected", cpu}};
  for (auto [what, off] : {std::pair<const char*, bool CpuFeatures::*>{"no aes", &CpuFeatures::aes},
                           {"no vaes", &CpuFeatures::vaes}, {"no avx_vnni", &CpuFeatures::avx_vnni}}) {
    CpuFeatures f = cpu;
    f.*off = false;
    forms.emplace_back(what, f);
  }
  int tables = 0;
  for (Isa isa : kIsaLevels) {
    if (!cpu.supports(isa)) continue;
    for (const auto& [form, features] : forms) {
      const simd::KernelTable t = simd::make_kernel_table(isa, features);
      EXPECT_EQ(t.isa, isa);
      const std::vector<Row> rows = rows_of(t);
      ASSERT_GT(rows.size(), 30u);
      std::set<std::string> names;
      for (const Row& r : rows) {
        const std::string where = std::string(isa_name(isa)) + " (" + form + "): " + r.entry + " = " + r.name;
        EXPECT_TRUE(r.has_fn) << where;
        EXPECT_TRUE(names.insert(r.name).second) << where << ": a name two entries share";
        const size_t at = r.name.find("__");
        ASSERT_NE(at, std::string::npos) << where;
        const std::string tag = r.name.substr(at + 2, r.name.find('_', at + 2) - at - 2);
        EXPECT_TRUE(tags_up_to(isa).count(tag)) << where << ": tag '" << tag << "' is not of this level or below";
        if (isa == Isa::ref) {
          EXPECT_EQ(r.name, r.reference_name) << where;
        }
      }
      ++tables;
    }
  }
  EXPECT_GE(tables, 4);  // the reference level in every form at least
}

// The levels as flags, messages and tests list them: one list, lowest first, each name parsing
// back to its level.
TEST(KernelTable, LevelNamesComeFromOneList) {
  EXPECT_EQ(isa_names("|"), "ref|avx2|avx512bw|avx512vnni");
  for (Isa isa : kIsaLevels) EXPECT_EQ(parse_isa(isa_name(isa), "test"), isa);
  EXPECT_EQ(detect_cpu_features().supports(Isa::ref), true);
}

// The benchmarks' shares of peak (bench/peak.hpp) take the instruction from the kernel's name: at
// every level and form but the reference, both INT16 convolution kernels name one this CPU runs,
// and its measured peak is positive (the asm loop runs); oneDNN's FP32 names map to FMA.
TEST(KernelTable, ConvolutionKernelNamesSayTheInstructionTheirPeakIsOf) {
  const CpuFeatures cpu = detect_cpu_features();
  CpuFeatures no_vnni = cpu;
  no_vnni.avx_vnni = false;
  std::set<int> forms;
  for (Isa isa : kIsaLevels) {
    if (!cpu.supports(isa)) continue;
    for (const CpuFeatures& features : {cpu, no_vnni}) {
      const simd::KernelTable t = simd::make_kernel_table(isa, features);
      for (const std::string name : {t.conv_s16_pixel.name, t.conv_s16_pair.name}) {
        bench::PeakForm form{};
        EXPECT_EQ(bench::peak_form_of(name, form), isa != Isa::ref) << name;
        if (isa == Isa::ref) continue;
        EXPECT_TRUE(bench::cpu_runs(form, cpu)) << name;
        forms.insert(int(form));
      }
    }
  }
  for (int f : forms) EXPECT_GT(bench::measure_peak(bench::PeakForm(f), 1), 0.0) << bench::peak_form_name(bench::PeakForm(f));
  bench::PeakForm form{};
  ASSERT_TRUE(bench::peak_form_of("jit:avx512_core", form));
  EXPECT_EQ(form, bench::PeakForm::fma_zmm);
  ASSERT_TRUE(bench::peak_form_of("jit_1x1:avx2", form));
  EXPECT_EQ(form, bench::PeakForm::fma_ymm);
  EXPECT_FALSE(bench::peak_form_of("x64:gemm:jit", form));
}
