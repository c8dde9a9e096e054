// `dfp compare` end to end on a tiny Fashion-MNIST subset: every artifact is written, and the
// summary table's figures are exactly those of the runs' metrics files.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "dfp/isa.hpp"
#include "apps/dfp/report/report.hpp"
#include "tests/common/temp_dir.hpp"

namespace fs = std::filesystem;

namespace {
std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string l;
  while (std::getline(ss, l)) out.push_back(l);
  return out;
}
// The value of "key": in the last line of a metrics.jsonl file, as written.
std::string last_field(const fs::path& metrics, const std::string& key) {
  const std::vector<std::string> ls = lines(slurp(metrics));
  const std::string& l = ls.back();
  const size_t p = l.find("\"" + key + "\":");
  if (p == std::string::npos) return "";
  const size_t b = p + key.size() + 3, e = l.find_first_of(",}", b);
  return l.substr(b, e - b);
}
bool have_fashion_mnist() { return fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"); }
// The shell command running `dfp ARGS` with its output into `log`.
std::string dfp_command(const std::string& args, const std::string& log) {
  return std::string("'") + DFP_CLI + "' " + args + " > '" + log + "' 2>&1";
}
}  // namespace

TEST(Compare, TinySubsetWritesEveryArtifactAndTheTableEqualsTheMetrics) {
  if (!have_fashion_mnist())
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const dfp::test::TempDir dir("dfp_compare_");
  const fs::path out = dir.path() / "cmp";
  const std::string cmd = dfp_command("compare --model lenet --epochs 2 --batch-size 32 --limit-train 256 --limit-test 64 "
                                      "--threads 2 --numerics-every 2 --precisions fp32,bf16,fp16,fp16-none,int16,fp8,mxfp4,posit16 --out '" +
                                          out.string() + "'",
                                      dir.file("compare.log"));
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(dir.file("compare.log"));
  const std::vector<std::string> labels = {"fp32", "bf16", "fp16", "fp16-none", "int16", "fp8", "mxfp4", "posit16"};
  for (const std::string& l : labels) {
    EXPECT_TRUE(fs::exists(out / l / "metrics.jsonl")) << l;
    EXPECT_TRUE(fs::exists(out / l / "config.json")) << l;
    EXPECT_TRUE(fs::exists(out / l / "checkpoint.dfp")) << l;
    EXPECT_TRUE(fs::exists(out / l / "train.log")) << l;
    EXPECT_EQ(lines(slurp(out / l / "metrics.jsonl")).size(), 2u) << l;
  }
  for (const char* f : {"summary.csv", "summary.md", "report.html"}) EXPECT_GT(fs::file_size(out / f), 100u) << f;
  const bool gnuplot = std::system("command -v gnuplot > /dev/null 2>&1") == 0;
  if (gnuplot) {
    for (const char* p : {"loss", "test_top1", "performance", "sqnr_layers_x", "sqnr_layers_dy", "exp_int16_x", "loss_scale"}) {
      const bool png = fs::exists(out / "plots" / (std::string(p) + ".png"));
      const bool svg = fs::exists(out / "plots" / (std::string(p) + ".svg"));
      EXPECT_TRUE(png || svg) << p;
    }
  }
  // The CSV's figures are the metrics files' own: final top-1, top-5, train loss, loss scale.
  const std::vector<std::string> csv = lines(slurp(out / "summary.csv"));
  ASSERT_EQ(csv.size(), labels.size() + 1);
  const std::vector<std::string> cols = dfp::summary_columns();
  auto col = [&](const std::string& name) {
    for (size_t i = 0; i < cols.size(); ++i)
      if (cols[i] == name) return i;
    ADD_FAILURE() << "no column " << name;
    return size_t(0);
  };
  for (size_t r = 0; r < labels.size(); ++r) {
    std::vector<std::string> cells;
    std::stringstream ss(csv[r + 1]);
    std::string c;
    while (std::getline(ss, c, ',')) cells.push_back(c);
    const fs::path m = out / labels[r] / "metrics.jsonl";
    ASSERT_EQ(cells[col("label")], labels[r]);
    for (auto [column, key] : std::vector<std::pair<std::string, std::string>>{
             {"test_top1", "test_top1"}, {"test_top5", "test_top5"}, {"final_train_loss", "train_loss"},
             {"final_loss_scale", "loss_scale"}, {"skipped_steps", "skipped_steps"}})
      EXPECT_EQ(std::stod(cells[col(column)]), std::stod(last_field(m, key))) << labels[r] << " " << column;
  }
  // The fp8 run records its formats and each tensor's scale exponent.
  const std::string fp8 = slurp(out / "fp8" / "metrics.jsonl");
  EXPECT_NE(fp8.find("\"format\":\"e4m3/e4m3/e5m2\""), std::string::npos);
  EXPECT_NE(fp8.find("\"exp_dy\":"), std::string::npos);
  EXPECT_NE(slurp(out / "summary.md").find("fp8"), std::string::npos);
  // The MX run records its element format and the range of its block scales.
  EXPECT_NE(slurp(out / "mxfp4" / "metrics.jsonl").find("\"format\":\"e2m1\""), std::string::npos);
  // The FP16 run with dynamic scaling started at GradScaler's 2^16; the unscaled ones stay at 1.
  EXPECT_EQ(std::stod(last_field(out / "fp16-none" / "metrics.jsonl", "loss_scale")), 1.0);
  EXPECT_GE(std::stod(last_field(out / "fp16" / "metrics.jsonl", "loss_scale")), 1024.0);
}

// dfp info names the CPU features, the kernel of every op at the level in force (DFP_ISA too),
// and the library versions.
TEST(Cli, InfoReportsFeaturesKernelsAndLibraries) {
  const dfp::test::TempDir dir("dfp_cli_info_");
  for (const char* isa : {"", "ref"}) {
    const std::string log = dir.file("info.log");
    const std::string cmd = std::string(*isa ? "DFP_ISA=" : "") + isa + " '" + DFP_CLI + "' info > '" + log + "' 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(log);
    const std::string out = slurp(log);
    for (const char* want : {"avx512_vnni=", "avx512_fp16=", "amx_bf16=", "amx_int8=", "kernel level", "quantize", "conv fwd / bwd_data, linear  int16",
                             "conv bwd_weights", "conv all passes              fp32", "linear all passes", "batchnorm",
                             "sgd update", "oneDNN 2.", "oneTBB 20", "xsimd 8.", "zlib 1."})
      EXPECT_NE(out.find(want), std::string::npos) << want << " in\n" << out;
    if (*isa) {
      EXPECT_NE(out.find("kernel level   ref"), std::string::npos) << out;
      EXPECT_NE(out.find("conv_s16s16f32_pixel__ref"), std::string::npos) << out;
    }
    // Each BF16 pass names the implementation oneDNN's primitive reports (on a CPU with AMX tiles,
    // oneDNN 2.6's AMX kernels); where oneDNN has no BF16 JIT code (the ref level, a CPU without
    // AVX-512) the layer runs BF16-rounded operands on the FP32 kernels.
    const dfp::CpuFeatures cpu = dfp::detect_cpu_features();
    if (*isa || !cpu.supports(dfp::Isa::avx512bw)) {
      EXPECT_NE(out.find("conv all passes              bf16   bf16-rounded operands"), std::string::npos) << out;
      continue;
    }
    for (const char* pass : {"conv fwd                     bf16   onednn:", "conv bwd_data                bf16   onednn:",
                             "conv bwd_weights             bf16   onednn:"}) {
      const size_t at = out.find(pass);
      ASSERT_NE(at, std::string::npos) << pass << " in\n" << out;
      if (cpu.amx_bf16 && cpu.os_saves_amx) {
        EXPECT_NE(out.substr(at, out.find('\n', at) - at).find("amx_bf16"), std::string::npos) << out;
      }
    }
  }
}

// The command line refuses bad flag values with a message naming the flag, and a non-zero exit.
TEST(Cli, BadFlagValuesNameTheFlag) {
  const dfp::test::TempDir dir("dfp_cli_");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"bench --reps 0", "flag --reps: expected >= 1, got 0"},
      {"bench --threads -1", "flag --threads: expected >= 0"},
      {"info --isa avx9", "flag --isa: unknown kernel level 'avx9'"},
      {"train --seed -1", "flag --seed: expected >= 0, got -1"},
      {"train --precision fp8 --fp8-scaling sometimes", "flag --fp8-scaling: unknown fp8 scaling 'sometimes'; expected none, current or delayed"},
      {"train --precision fp8 --fp8-overflow wrap", "flag --fp8-overflow: unknown overflow mode 'wrap'"},
      {"train --precision fp8 --fp8-amax-history 0", "fp8 amax history must be 1..1048576, got 0"},
      {"train --precision fp8 --gradients-format e3m3", "unknown format 'e3m3'; expected fp32, bf16, fp16, e4m3, e5m2, e3m2, e2m3, e2m1, int8, posit16 or posit16es2"},
      {"train --precision mxfp9", "unknown precision 'mxfp9'; expected fp32, int16, bf16, fp16, fp8, mxfp8, mxfp6, mxfp4, mxint8, posit16 or posit16es2"},
      {"train --print-every 0", "flag --print-every: expected >= 1, got 0"},
      {"eval --checkpoint '" + dir.path().string() + "'", "is a directory; expected a checkpoint file"},
      // compare checks the shared settings once, before it starts any run or writes anything
      {"compare --precisions fp32,int16 --momentum -1 --out '" + dir.file("never") + "'",
       "flag --momentum: expected a finite number >= 0, got -1"},
      {"compare --precisions fp32-slice --out '" + dir.file("never") + "'",
       "flag --precisions item 'fp32-slice': a granularity (-tensor, -slice, -block32, -block64, -block128) applies "
       "once to an int16 item"},
      {"compare --precisions fp8-block32 --out '" + dir.file("never") + "'", "item 'fp8-block32': a granularity"},
      {"compare --precisions int16-slice-tensor --out '" + dir.file("never") + "'", "applies once to an int16 item"},
      {"compare --precisions int16-slice --weights-granularity tensor --out '" + dir.file("never") + "'",
       "flag --weights-granularity and the --precisions item 'int16-slice' both set the granularity"},
  };
  for (const auto& [args, message] : cases) {
    const std::string log = dir.file("cli.log");
    const std::string cmd = dfp_command(args, log);
    EXPECT_NE(std::system(cmd.c_str()), 0) << args;
    EXPECT_NE(slurp(log).find(message), std::string::npos) << args << ": " << slurp(log);
  }
  EXPECT_FALSE(fs::exists(dir.file("never"))) << "compare wrote its output directory before refusing a flag";
}

// Hostile flag values get messages that name the flag and what was wrong with the value, never a
// library's internal text (std::bad_alloc, "filesystem error:").
TEST(Cli, HostileValuesAreNamedClearly) {
  const dfp::test::TempDir dir("dfp_cli_hostile_");
  std::ofstream(dir.file("a-file")) << "x";
  std::ofstream(dir.file("short.dfp"), std::ios::binary) << std::string("DFPCKPT1\0\0\0\0", 12);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"train --lr 1e39", "flag --lr: '1e39' is out of range; expected a number of magnitude"},
      {"train --epochs 99999999999", "flag --epochs: '99999999999' is out of range; expected an integer"},
      {"train --out ''", "flag --out: expected a directory, got an empty path"},
      {"compare --out ''", "flag --out: expected a directory, got an empty path"},
      {"train --threads 100000000", "flag --threads: expected at most 1024"},
      {"eval --threads 100000000 --checkpoint x", "flag --threads: expected at most 1024"},
      {"compare --precisions fp32 --out '" + dir.file("a-file") + "'", "cannot create directory"},
      {"eval --checkpoint '" + dir.file("short.dfp") + "'", "truncated: the file has 12 bytes, the magic and a CRC but no record"},
  };
  for (const auto& [args, message] : cases) {
    const std::string log = dir.file("cli.log");
    const std::string cmd = dfp_command(args, log);
    EXPECT_NE(std::system(cmd.c_str()), 0) << args;
    const std::string out = slurp(log);
    EXPECT_NE(out.find(message), std::string::npos) << args << ": " << out;
    for (const char* internal : {"bad_alloc", "filesystem error", "stoi", "stof"})
      EXPECT_EQ(out.find(internal), std::string::npos) << args << ": " << out;
  }
}

// A comparison into a directory of an earlier one is refused before any training, and replaces it
// with --overwrite (as scripts/run.sh passes).
TEST(Compare, EarlierComparisonIsReplacedOnlyWithOverwrite) {
  if (!have_fashion_mnist())
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const dfp::test::TempDir dir("dfp_compare_again_");
  const std::string base = std::string("'") + DFP_CLI +
                           "' compare --model lenet --epochs 1 --batch-size 32 --limit-train 64 --limit-test 32 "
                           "--threads 2 --precisions fp32 --out '" + dir.file("cmp") + "'";
  const std::string log = dir.file("compare.log");
  ASSERT_EQ(std::system((base + " > '" + log + "' 2>&1").c_str()), 0) << slurp(log);
  const std::string first = slurp(dir.file("cmp/fp32/checkpoint.dfp"));
  EXPECT_NE(std::system((base + " --seed 2 > '" + log + "' 2>&1").c_str()), 0);
  EXPECT_NE(slurp(log).find("holds an earlier run"), std::string::npos) << slurp(log);
  EXPECT_EQ(slurp(log).find("== fp32"), std::string::npos) << "a run started: " << slurp(log);
  EXPECT_EQ(slurp(dir.file("cmp/fp32/checkpoint.dfp")), first);
  ASSERT_EQ(std::system((base + " --seed 2 --overwrite > '" + log + "' 2>&1").c_str()), 0) << slurp(log);
  EXPECT_NE(slurp(dir.file("cmp/fp32/checkpoint.dfp")), first);
}

// int16-tensor, int16-slice and int16-block32 items compare DFP16 granularities in one report:
// each run trains with its own (recorded in its config.json), and the report names it.
TEST(Compare, Int16GranularitiesSideBySide) {
  if (!have_fashion_mnist())
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const dfp::test::TempDir dir("dfp_compare_granularity_");
  const fs::path out = dir.path() / "cmp";
  const std::string cmd = dfp_command("compare --model lenet --epochs 1 --batch-size 32 --limit-train 128 --limit-test 32 "
                                      "--threads 2 --numerics-every 2 --precisions int16,int16-slice,int16-block32 --out '" +
                                          out.string() + "'",
                                      dir.file("compare.log"));
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(dir.file("compare.log"));
  const std::string tensor_config = slurp(out / "int16" / "config.json"), slice_config = slurp(out / "int16-slice" / "config.json");
  for (const char* g : {"weights{", "activations{", "gradients{"}) {
    const size_t t = tensor_config.find(g), s = slice_config.find(g);
    ASSERT_NE(t, std::string::npos) << tensor_config;
    ASSERT_NE(s, std::string::npos) << slice_config;
    EXPECT_NE(tensor_config.substr(t, tensor_config.find('}', t) - t).find("granularity=tensor"), std::string::npos) << g;
    EXPECT_NE(slice_config.substr(s, slice_config.find('}', s) - s).find("granularity=slice"), std::string::npos) << g;
  }
  const std::string block_config = slurp(out / "int16-block32" / "config.json");
  EXPECT_NE(block_config.find("granularity=block32"), std::string::npos) << block_config;
  EXPECT_EQ(block_config.find("granularity=tensor"), std::string::npos) << block_config;
  EXPECT_NE(slurp(dir.file("compare.log")).find("== int16-slice: dfp train ... --precision int16 --loss-scaling none "
                                                "--granularity slice --out"),
            std::string::npos);
  const std::string sqnr = slurp(out / "plots" / "sqnr_layers_dy.gp");
  EXPECT_NE(sqnr.find("title 'int16 (tensor)'"), std::string::npos) << sqnr;
  EXPECT_NE(sqnr.find("title 'int16-slice (slice: w, x, dy)'"), std::string::npos) << sqnr;
  EXPECT_NE(sqnr.find("title 'int16-block32 (block32: w, x, dy)'"), std::string::npos) << sqnr;
  const std::string csv = slurp(out / "summary.csv");
  EXPECT_NE(csv.find(",tensor\n"), std::string::npos) << csv;
  EXPECT_NE(csv.find(",\"slice: w, x, dy\"\n"), std::string::npos) << csv;
}
