// The dfp program's command line: the flag definitions on their own (how values parse, combine
// and are written to run.toml), and the program end to end (--help, --version, errors, and a run
// repeated from its run.toml).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dfp/models.hpp"
#include "apps/dfp/flags.hpp"
#include "tests/common/expect_error.hpp"
#include "tests/common/files.hpp"
#include "tests/common/temp_dir.hpp"

namespace fs = std::filesystem;
using dfp::test::slurp;

namespace {

// The resolved TrainConfig of `dfp train ARGS` (without the training).
dfp::TrainConfig parse_train(std::vector<std::string> args, const std::string& config_file = "") {
  CLI::App app("", "train");
  dfp::cli::RunFlags run;
  dfp::cli::FlagSet flags(app);
  flags.add(dfp::cli::run_flags(run));
  flags.add(dfp::cli::policy_flags(run));
  flags.add({dfp::cli::out_flag(run.config.out, "out")});
  flags.add_config_flag();
  if (!config_file.empty()) args.insert(args.begin(), {"--config", config_file});
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  app.parse(args);
  flags.apply();
  run.finish();
  return run.config;
}

struct Result {
  int status;
  std::string output;  // stdout and stderr
};
Result dfp_cli(const std::string& args, const dfp::test::TempDir& dir) {
  const std::string log = dir.file("cli.log");
  const int rc = std::system((std::string("'") + DFP_CLI + "' " + args + " > '" + log + "' 2>&1").c_str());
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, slurp(log)};
}

bool have_fashion_mnist() { return fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"); }

// The metrics.jsonl lines without the fields that measure time or memory.
std::vector<std::string> results_of(const std::string& metrics) {
  std::vector<std::string> out;
  for (std::string l : dfp::test::lines_of(metrics)) {
    for (const char* key : {"\"images_per_second\":", "\"data_wait_seconds\":", "\"epoch_seconds\":", "\"peak_rss_kib\":"}) {
      const size_t b = l.find(key);
      if (b == std::string::npos) continue;
      l.erase(b, l.find_first_of(",}", b) - b);
    }
    out.push_back(l);
  }
  return out;
}

}  // namespace

TEST(CliFlags, PyTorchNamesEqualsSignsAndShortFlags) {
  const dfp::TrainConfig c = parse_train({"-a", "vgg16_bn", "-b", "64", "-j", "3", "--wd=0.001", "-p", "7", "--lr=0.1",
                                          "--momentum=0.8", "--learning-rate", "0.2", "--weight-decay", "0.002"});
  EXPECT_EQ(c.model, "vgg16bn");
  EXPECT_EQ(c.batch_size, 64);
  EXPECT_EQ(c.workers, 3);
  EXPECT_EQ(c.print_every, 7);
  EXPECT_EQ(c.lr, 0.2f);  // the last value wins
  EXPECT_EQ(c.momentum, 0.8f);
  EXPECT_EQ(c.weight_decay, 0.002f);
  EXPECT_EQ(parse_train({"--arch=resnext50_32x4d", "--print-freq=3"}).model, "resnext50");
  EXPECT_EQ(parse_train({"--model", "resnet20"}).model, "resnet20");
}

// Every torchvision alias names a model of the zoo; torchvision names dfp shares need none.
TEST(CliFlags, TorchvisionAliasesNameZooModels) {
  const std::vector<std::string> zoo = dfp::model_names();
  for (const char* torch : {"vgg11_bn", "vgg13_bn", "vgg16_bn", "vgg19_bn", "resnext50_32x4d", "resnet18", "resnet34",
                            "resnet50", "vgg11", "vgg16", "alexnet", "googlenet"}) {
    const std::string ours = dfp::cli::model_alias(torch);
    EXPECT_NE(std::find(zoo.begin(), zoo.end(), ours), zoo.end()) << torch << " -> " << ours;
  }
  EXPECT_EQ(dfp::cli::model_alias("resnet101"), "resnet101");  // no such dfp model: refused by the zoo
}

// Values take effect in the order typed: a later flag overrides an earlier one, list flags add up,
// and --keep-fp32 comes after the --override rules whatever the order.
TEST(CliFlags, ValuesTakeEffectInOrder) {
  using dfp::Rounding;
  dfp::TrainConfig c = parse_train({"--rounding", "stochastic", "--weights-rounding", "nearest"});
  EXPECT_EQ(c.policy.dfp.weights.rounding, Rounding::nearest_even);
  EXPECT_EQ(c.policy.dfp.gradients.rounding, Rounding::stochastic);
  c = parse_train({"--weights-rounding", "nearest", "--rounding", "stochastic"});
  EXPECT_EQ(c.policy.dfp.weights.rounding, Rounding::stochastic);
  c = parse_train({"--keep-fp32", "fc", "--precision", "int16", "--override", "conv*=bf16", "--keep-fp32", "conv1",
                   "--milestones", "3,5"});
  ASSERT_EQ(c.policy.overrides.size(), 3u);
  EXPECT_EQ(c.policy.overrides[0].first, "conv*");
  EXPECT_EQ(c.policy.overrides[1].first, "fc");
  EXPECT_EQ(c.policy.overrides[2].first, "conv1");
  EXPECT_EQ(c.milestones, (std::vector<int>{3, 5}));
  c = parse_train({"--headroom", "1", "--weights-headroom", "2"});
  EXPECT_EQ(c.policy.dfp.weights.headroom, 2);
  EXPECT_EQ(c.policy.dfp.activations.headroom, 1);
  EXPECT_EQ(c.policy.dfp.gradients.headroom, 1);
  c = parse_train({"--gradients-headroom", "3", "--headroom", "1"});
  EXPECT_EQ(c.policy.dfp.gradients.headroom, 1);
  c = parse_train({"--loss-scale", "8", "--nesterov", "--no-augment"});
  EXPECT_EQ(c.loss_scale.mode, dfp::LossScaleMode::fixed);
  EXPECT_TRUE(c.nesterov);
  EXPECT_FALSE(c.augment);
}

// Headrooms that differ by class are written one per class, and read back; equal ones as one.
TEST(CliFlags, PerClassHeadroomReadsBack) {
  const dfp::test::TempDir dir("dfp_cli_headroom_");
  const dfp::TrainConfig a = parse_train({"--precision", "int16", "--granularity", "slice", "--headroom", "1",
                                          "--weights-headroom", "2", "--out", dir.file("run")});
  fs::create_directories(dir.file("run"));
  dfp::cli::write_run_toml(a.out, dfp::cli::run_toml(a));
  const std::string toml = slurp(dir.file("run/run.toml"));
  for (const char* line : {"weights-headroom = 2\n", "activations-headroom = 1\n", "gradients-headroom = 1\n"})
    EXPECT_NE(toml.find(line), std::string::npos) << toml;
  EXPECT_EQ(toml.find("\nheadroom ="), std::string::npos) << toml;
  const dfp::TrainConfig b = parse_train({}, dir.file("run/run.toml"));
  EXPECT_EQ(b.policy.describe(), a.policy.describe());
  EXPECT_EQ(b.policy.dfp.weights.headroom, 2);
  EXPECT_EQ(b.policy.dfp.activations.headroom, 1);
  EXPECT_EQ(dfp::cli::run_toml(parse_train({"--headroom", "3"})).find("weights-headroom"), std::string::npos);
  EXPECT_NE(dfp::cli::run_toml(parse_train({"--headroom", "3"})).find("\nheadroom = 3\n"), std::string::npos);
}

// run.toml read back gives the same settings; the command line overrides the file.
TEST(CliFlags, RunTomlReadsBackToTheSameSettings) {
  const dfp::test::TempDir dir("dfp_cli_toml_");
  const dfp::TrainConfig a =
      parse_train({"-a", "vgg11_bn", "--precision", "bf16", "--keep-fp32", "fc", "--rounding", "stochastic",
                   "--weights-rounding", "nearest", "--activations-format", "fp16", "--loss-scale", "1024",
                   "--milestones", "2,4", "--schedule", "multistep", "--nesterov", "--no-augment", "--lr", "0.03",
                   "--seed", "9", "--label", "it's", "--data", dir.str(), "--out", dir.file("run"), "--init-from",
                   dir.file("w.pt"), "--init-skip", "fc,layer4*", "--init-skip", "conv1"});
  fs::create_directories(dir.file("run"));
  dfp::cli::write_run_toml(a.out, dfp::cli::run_toml(a));
  const std::string toml = slurp(dir.file("run/run.toml"));
  const dfp::TrainConfig b = parse_train({}, dir.file("run/run.toml"));
  EXPECT_EQ(dfp::cli::run_toml(b), toml);
  EXPECT_EQ(b.policy.describe(), a.policy.describe());
  EXPECT_EQ(b.loss_scale.describe(), a.loss_scale.describe());
  EXPECT_EQ(b.model, "vgg11bn");
  EXPECT_EQ(b.milestones, a.milestones);
  EXPECT_EQ(b.init_from, dir.file("w.pt"));
  EXPECT_EQ(b.init_skip, (std::vector<std::string>{"fc", "layer4*", "conv1"}));
  EXPECT_TRUE(b.nesterov);
  EXPECT_FALSE(b.augment);
  const dfp::TrainConfig c = parse_train({"--seed", "4", "--lr=0.5"}, dir.file("run/run.toml"));
  EXPECT_EQ(c.seed, 4u);
  EXPECT_EQ(c.lr, 0.5f);
  EXPECT_EQ(c.label, "it's");

  std::ofstream(dir.file("bad.toml")) << "lr = 0.1\nlearning_rat = 0.2\n";
  dfp::test::expect_error([&] { parse_train({}, dir.file("bad.toml")); }, dfp::Status::invalid_argument,
                          {"flag --config", "bad.toml", "'learning_rat'", "not a flag of dfp train"});
  dfp::test::expect_error([&] { parse_train({}, dir.file("missing.toml")); }, dfp::Status::invalid_argument,
                          {"flag --config", "missing.toml", "not a readable file"});
  std::ofstream(dir.file("value.toml")) << "batch-size = 'many'\n";
  dfp::test::expect_error([&] { parse_train({}, dir.file("value.toml")); }, dfp::Status::invalid_argument,
                          {"flag --batch-size: expected an integer, got 'many'"});
}

TEST(Cli, HelpListsCommandsAndFlags) {
  const dfp::test::TempDir dir("dfp_cli_help_");
  for (const char* args : {"--help", "help", "-h"}) {
    const Result r = dfp_cli(args, dir);
    EXPECT_EQ(r.status, 0) << args;
    for (const char* cmd : {"info", "bench", "train", "eval", "compare", "export"})
      EXPECT_NE(r.output.find(cmd), std::string::npos) << cmd;
  }
  const Result train = dfp_cli("train --help", dir);
  EXPECT_EQ(train.status, 0) << train.output;
  for (const char* flag : {"--lr", "-b,--batch-size", "-j,--workers", "--wd,--weight-decay", "-p,--print-every",
                           "-e,--evaluate", "-a,--model,--arch", "--config FILE", "--precision", "--keep-fp32",
                           "--loss-scaling", "--resume", "--out DIR", "vgg16_bn=vgg16bn", "--init-from FILE",
                           "--init-skip"})
    EXPECT_NE(train.output.find(flag), std::string::npos) << flag << " in\n" << train.output;
  for (const char* cmd : {"info", "bench", "eval", "compare"}) {
    const Result r = dfp_cli(std::string(cmd) + " --help", dir);
    EXPECT_EQ(r.status, 0) << cmd;
    EXPECT_NE(r.output.find("--threads"), std::string::npos) << cmd << ":\n" << r.output;
  }
  EXPECT_NE(dfp_cli("compare --help", dir).output.find("--precisions"), std::string::npos);
}

TEST(Cli, VersionPrintsTheProjectVersion) {
  const dfp::test::TempDir dir("dfp_cli_version_");
  const Result r = dfp_cli("--version", dir);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.output.rfind(std::string("dfp ") + DFP_VERSION + "\n", 0), 0u) << r.output;
  EXPECT_NE(r.output.find("oneDNN"), std::string::npos) << r.output;
}

// Unknown flags, commands and bad values: exit 1 (2 for a command) and a message naming them.
TEST(Cli, UnknownFlagsAndBadValuesAreNamed) {
  const dfp::test::TempDir dir("dfp_cli_errors_");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"train --bogus 3", "dfp train: invalid argument: unknown flag '--bogus' (see dfp train --help)"},
      {"eval", "dfp eval: invalid argument: flag --checkpoint: expected the checkpoint FILE"},
      {"export", "dfp export: invalid argument: expected a CHECKPOINT file"},
      {"eval --lr 1", "unknown flag '--lr'"},
      {"train --lr=abc", "flag --lr: expected a number, got 'abc'"},
      {"train -b x", "flag --batch-size: expected an integer, got 'x'"},
      {"train --lr", "--lr"},
      {"train -j -1", "flag --workers: expected loader threads in [0, 1024] (0 = --threads), got -1"},
      {"train --config '" + dir.file("none.toml") + "'", "flag --config"},
      {"train -e", "flag --evaluate: expected --resume FILE"},
      {"compare --precision int16", "flag --precision is set per run by --precisions"},
  };
  for (const auto& [args, message] : cases) {
    const Result r = dfp_cli(args, dir);
    EXPECT_EQ(r.status, 1) << args << ": " << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << ": " << r.output;
    // The program names the command once, before the status.
    const std::string command = "dfp " + args.substr(0, args.find(' ')) + ": ";
    EXPECT_EQ(r.output.find(command, r.output.find(command) + 1), std::string::npos) << args << ": " << r.output;
  }
  const Result r = dfp_cli("trian --lr 0.1", dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("unknown command 'trian'"), std::string::npos) << r.output;
  EXPECT_EQ(dfp_cli("", dir).status, 2);
}

// A run repeated from DIR/run.toml into another directory gives the same checkpoint bytes and
// metrics; -e --resume evaluates a checkpoint as dfp eval does.
TEST(Cli, RunTomlRepeatsTheRun) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const dfp::test::TempDir dir("dfp_cli_repeat_");
  const Result a = dfp_cli("train --arch=lenet --epochs=1 -b 32 --limit-train 128 --limit-test 64 --threads 2 -j 1 "
                           "--lr=0.05 --wd 1e-4 -p 2 --precision int16 --rounding stochastic --keep-fp32 fc --out '" +
                               dir.file("a") + "'",
                           dir);
  ASSERT_EQ(a.status, 0) << a.output;
  ASSERT_TRUE(fs::exists(dir.file("a/run.toml")));
  const Result b = dfp_cli("train --config '" + dir.file("a/run.toml") + "' --out '" + dir.file("b") + "'", dir);
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_EQ(slurp(dir.file("b/checkpoint.dfp")), slurp(dir.file("a/checkpoint.dfp")));
  EXPECT_EQ(slurp(dir.file("b/config.json")), slurp(dir.file("a/config.json")));
  EXPECT_EQ(results_of(dir.file("b/metrics.jsonl")), results_of(dir.file("a/metrics.jsonl")));
  // Into its own directory, the run is refused: it holds a run.
  const Result again = dfp_cli("train --config '" + dir.file("a/run.toml") + "'", dir);
  EXPECT_EQ(again.status, 1);
  EXPECT_NE(again.output.find("holds an earlier run"), std::string::npos) << again.output;

  const Result eval = dfp_cli("eval --threads 2 --checkpoint '" + dir.file("a/checkpoint.dfp") + "'", dir);
  const Result e = dfp_cli("train -e --threads 2 --resume '" + dir.file("a/checkpoint.dfp") + "'", dir);
  ASSERT_EQ(eval.status, 0) << eval.output;
  ASSERT_EQ(e.status, 0) << e.output;
  const size_t at = eval.output.find("test loss");
  ASSERT_NE(at, std::string::npos) << eval.output;
  EXPECT_NE(e.output.find(eval.output.substr(at)), std::string::npos) << e.output;
}

// dfp export --to-torch writes a checkpoint's weights as a torch state_dict, which --init-from
// reads back (as it reads the checkpoint itself); --init-from and --init-skip go to run.toml.
TEST(Cli, ExportAndInitFrom) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const dfp::test::TempDir dir("dfp_cli_export_");
  const std::string common = "train -a lenet --epochs 1 -b 32 --limit-train 64 --limit-test 32 --threads 2 ";
  ASSERT_EQ(dfp_cli(common + "--out '" + dir.file("a") + "'", dir).status, 0);
  const Result ex = dfp_cli("export --to-torch '" + dir.file("a.pt") + "' '" + dir.file("a/checkpoint.dfp") + "'", dir);
  ASSERT_EQ(ex.status, 0) << ex.output;
  EXPECT_NE(ex.output.find("wrote " + dir.file("a.pt")), std::string::npos) << ex.output;
  for (const auto& [from, out] : {std::pair{"a.pt", "b"}, std::pair{"a/checkpoint.dfp", "c"}}) {
    const Result b =
        dfp_cli(common + "--init-from '" + dir.file(from) + "' --init-skip fc --out '" + dir.file(out) + "'", dir);
    ASSERT_EQ(b.status, 0) << b.output;
    EXPECT_NE(b.output.find("init: loaded 8 tensors from"), std::string::npos) << b.output;
  }
  EXPECT_NE(slurp(dir.file("b/run.toml")).find("init-skip = 'fc'"), std::string::npos);
  const Result missing = dfp_cli("export --to-torch '" + dir.file("x.pt") + "'", dir);
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.output.find("expected a CHECKPOINT file"), std::string::npos) << missing.output;
}

// A torchvision name trains the dfp model it names.
TEST(Cli, TorchvisionNameTrainsItsModel) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const dfp::test::TempDir dir("dfp_cli_alias_");
  const Result r = dfp_cli("train -a vgg11_bn --epochs 1 -b 8 --limit-train 8 --limit-test 8 --threads 2 --out '" +
                               dir.file("v") + "'",
                           dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(slurp(dir.file("v/config.json")).find("\"model\":\"vgg11bn\""), std::string::npos)
      << slurp(dir.file("v/config.json"));
  EXPECT_NE(slurp(dir.file("v/run.toml")).find("model = 'vgg11bn'"), std::string::npos);
}

// Hostile command lines and run files: run.toml on a full disk, switch values, the export's
// output, values with TOML's special characters, and config files that are empty, cut off, or
// give a flag twice or as a list.
namespace {

// `dfp train` of a tiny run on synthetic data (a fraction of a second), with `extra` flags.
std::string tiny_run(const std::string& extra) {
  return "train -a lenet --dataset synthetic --data classes=10,train=16,test=8 --image-size 28 --epochs 1 -b 8 "
         "--threads 2 " + extra;
}

std::string write_file(const dfp::test::TempDir& dir, const std::string& name, const std::string& text) {
  std::ofstream(dir.file(name), std::ios::binary) << text;
  return dir.file(name);
}

}  // namespace

// A full disk (here: the file size limit) fails the write of run.toml by name and leaves no
// run.toml: an empty one would repeat as a run of the defaults.
TEST(CliFiles, RunTomlWriteOnAFullDiskFails) {
  const dfp::test::TempDir dir("dfp_cli_full_");
  const std::string toml = dfp::cli::run_toml(parse_train({"--label", "full", "--out", dir.str()}));
  EXPECT_TRUE(dfp::test::fails_on_a_full_disk(64, "run.toml", [&] { dfp::cli::write_run_toml(dir.str(), toml); }));
  EXPECT_FALSE(fs::exists(dir.file("run.toml")));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 0);  // no temporary file
  dfp::cli::write_run_toml(dir.str(), toml);
  EXPECT_EQ(slurp(dir.file("run.toml")), toml);
}

// A config file without any key (a run.toml cut to nothing) is refused rather than read as the
// defaults; a last line without its line break is read, as editors write files.
TEST(CliFiles, EmptyOrTruncatedConfigIsRefused) {
  const dfp::test::TempDir dir("dfp_cli_empty_");
  for (const char* text : {"", "\n\n", "# dfp train --config FILE repeats this run\n  \n"})
    dfp::test::expect_error([&] { parse_train({}, write_file(dir, "e.toml", text)); }, dfp::Status::invalid_argument,
                            {"flag --config", "e.toml", "sets no flags", "truncated"});
  dfp::test::expect_error([&] { parse_train({}, write_file(dir, "t.toml", "model = 'lenet'\nlabel = 'cut")); },
                          dfp::Status::invalid_argument, {"flag --config", "t.toml:2:", "without its closing ' quote"});
  EXPECT_EQ(parse_train({}, write_file(dir, "n.toml", "model = 'lenet'\nlr = 0.5")).lr, 0.5f);
  const Result r = dfp_cli(tiny_run("--config '" + write_file(dir, "e.toml", "") + "' --out '" + dir.file("x") + "'"), dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("sets no flags"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir.file("x")));
  EXPECT_EQ(parse_train({}, write_file(dir, "crlf.toml", "lr = 0.25\r\n")).lr, 0.25f);
}

// Switches take true|false in any case, 1|0, yes|no, on|off, on the command line and in a config
// file; any other value is refused by name; the last value wins.
TEST(CliFiles, SwitchValuesAreTruthValuesOnly) {
  const dfp::test::TempDir dir("dfp_cli_switch_");
  for (const char* v : {"true", "True", "TRUE", "1", "yes", "On"}) {
    EXPECT_TRUE(parse_train({std::string("--nesterov=") + v}).nesterov) << v;
    EXPECT_FALSE(parse_train({std::string("--no-augment=") + v}).augment) << v;
    EXPECT_TRUE(parse_train({}, write_file(dir, "on.toml", std::string("nesterov = ") + v + "\n")).nesterov) << v;
    EXPECT_FALSE(parse_train({}, write_file(dir, "on.toml", std::string("no-augment = '") + v + "'\n")).augment) << v;
  }
  for (const char* v : {"false", "False", "FALSE", "0", "no", "OFF"}) {
    EXPECT_FALSE(parse_train({std::string("--nesterov=") + v}).nesterov) << v;
    EXPECT_TRUE(parse_train({std::string("--no-augment=") + v}).augment) << v;
    EXPECT_FALSE(parse_train({}, write_file(dir, "off.toml", std::string("nesterov = ") + v + "\n")).nesterov) << v;
    EXPECT_TRUE(parse_train({}, write_file(dir, "off.toml", std::string("no-augment = \"") + v + "\"\n")).augment) << v;
    EXPECT_FALSE(parse_train({}, write_file(dir, "off.toml", std::string("verify-overflow = ") + v + "\n"))
                     .policy.dfp.verify) << v;
  }
  for (const char* v : {"flase", "3", "-1", "y", "truee"}) {
    dfp::test::expect_error([&] { parse_train({std::string("--nesterov=") + v}); }, dfp::Status::invalid_argument,
                            {"flag --nesterov", std::string("'") + v + "'", "true|false", "yes|no", "on|off"});
    dfp::test::expect_error([&] { parse_train({std::string("--no-augment=") + v}); }, dfp::Status::invalid_argument,
                            {"flag --no-augment", std::string("'") + v + "'"});
    dfp::test::expect_error(
        [&] { parse_train({}, write_file(dir, "bad.toml", std::string("lr = 0.1\nnesterov = ") + v + "\n")); },
        dfp::Status::invalid_argument, {"flag --config", "bad.toml:2:", "'nesterov'", std::string("'") + v + "'", "true|false"});
    dfp::test::expect_error(
        [&] { parse_train({}, write_file(dir, "bad.toml", std::string("no-augment = '") + v + "'\n")); },
        dfp::Status::invalid_argument, {"bad.toml:1:", "'no-augment'", std::string("'") + v + "'"});
  }
  EXPECT_FALSE(parse_train({"--nesterov", "--nesterov=false"}).nesterov);
  EXPECT_TRUE(parse_train({"--nesterov=no", "--nesterov"}).nesterov);
  EXPECT_FALSE(parse_train({"--nesterov=off"}, write_file(dir, "on.toml", "nesterov = true\n")).nesterov);
  const Result r = dfp_cli("train --nesterov=False --epochs=x", dir);  // the switch parses, the number does not
  EXPECT_NE(r.output.find("flag --epochs"), std::string::npos) << r.output;
  const Result bad = dfp_cli(tiny_run("--nesterov=flase --out '" + dir.file("x") + "'"), dir);
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.output.find("flag --nesterov: expected a switch value"), std::string::npos) << bad.output;
}

// dfp export refuses an output that is its checkpoint (by any path) or a file that is not a
// regular one, which the rename would replace.
TEST(CliFiles, ExportRefusesItsCheckpointAndSpecialFiles) {
  const dfp::test::TempDir dir("dfp_cli_export_self_");
  ASSERT_EQ(dfp_cli(tiny_run("--out '" + dir.file("a") + "'"), dir).status, 0);
  const std::string ck = dir.file("a/checkpoint.dfp"), good = slurp(ck);
  fs::create_symlink(ck, dir.file("link.dfp"));
  for (const std::string& out : {ck, dir.file("link.dfp"), dir.file("a/../a/./checkpoint.dfp")}) {
    const Result r = dfp_cli("export --to-torch '" + out + "' '" + ck + "'", dir);
    EXPECT_EQ(r.status, 1) << out << ": " << r.output;
    EXPECT_NE(r.output.find("flag --to-torch: '" + out + "' is the checkpoint"), std::string::npos) << r.output;
    EXPECT_EQ(slurp(ck), good);
  }
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  fs::create_directories(dir.file("d"));
  for (const std::string& out : {dir.file("fifo"), dir.file("d")}) {
    const Result r = dfp_cli("export --to-torch '" + out + "' '" + ck + "'", dir);
    EXPECT_EQ(r.status, 1) << out << ": " << r.output;
    EXPECT_NE(r.output.find("exists and is not a regular file"), std::string::npos) << r.output;
  }
  EXPECT_EQ(fs::status(dir.file("fifo")).type(), fs::file_type::fifo);
  write_file(dir, "old.pt", "old");
  EXPECT_EQ(dfp_cli("export --to-torch '" + dir.file("old.pt") + "' '" + ck + "'", dir).status, 0);  // a file to replace
  EXPECT_NE(slurp(dir.file("old.pt")), "old");
}

// Any value reads back from run.toml as it was: '#', both quotes, backslashes, '=', control
// characters and UTF-8 text, through the flags and through the program.
TEST(CliFiles, RunTomlRoundTripsAnyValue) {
  const dfp::test::TempDir dir("dfp_cli_roundtrip_");
  const std::vector<std::string> labels = {"exp#1", "it's \"quoted\" # not a comment", "C:\\runs\\x\\", "a=b,c=d",
                                           "Größe λ → ✓", "tab\there", "line\nbreak\r\x01\x7f", "[x]", " spaced "};
  for (const std::string& label : labels) {
    const dfp::TrainConfig a = parse_train({"--label", label, "--out", dir.file("h#1 'x'\\y"), "--data", label});
    const std::string toml = dfp::cli::run_toml(a);
    const std::string file = write_file(dir, "run.toml", toml);
    const dfp::TrainConfig b = parse_train({}, file);
    EXPECT_EQ(b.label, label) << toml;
    EXPECT_EQ(b.data, label);
    EXPECT_EQ(b.out, a.out);
    EXPECT_EQ(dfp::cli::run_toml(b), toml);
  }
  // TOML's escapes as a person writes them.
  EXPECT_EQ(parse_train({}, write_file(dir, "esc.toml", "label = \"\\u00fc\\U0001F600\\\"#\\\\\" # comment\n")).label,
            "ü😀\"#\\");
  EXPECT_EQ(parse_train({}, write_file(dir, "lit.toml", "label = 'a#b\\n' # comment\n")).label, "a#b\\n");

  const std::string out = dir.file("h#1");
  const Result a = dfp_cli(tiny_run("--label 'exp#1 \"ü\"' --out '" + out + "'"), dir);
  ASSERT_EQ(a.status, 0) << a.output;
  const Result b = dfp_cli("train --config '" + out + "/run.toml' --out '" + dir.file("b") + "'", dir);
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_FALSE(fs::exists(dir.file("h")));
  const dfp::TrainConfig again = parse_train({}, dir.file("b/run.toml"));
  EXPECT_EQ(again.label, "exp#1 \"ü\"");
  EXPECT_EQ(slurp(dir.file("b/checkpoint.dfp")), slurp(out + "/checkpoint.dfp"));
}

// A flag given twice, an array or an unquoted comma list for a flag of one value, and what a
// TOML reader would not take are refused with the file and the line; a list flag takes an array.
TEST(CliFiles, ConfigRefusesDuplicatesAndListsForOneValue) {
  const dfp::test::TempDir dir("dfp_cli_dup_");
  using Case = std::pair<std::string, std::vector<std::string>>;
  const std::vector<Case> cases = {
      {"lr = 0.1\nmodel = 'lenet'\nlr = 0.2\n", {"c.toml:3:", "'lr' sets --lr again (line 1: 'lr')"}},
      {"lr = 0.1\nlearning-rate = 0.2\n", {"c.toml:2:", "'learning-rate' sets --lr again (line 1: 'lr')"}},
      {"init-skip = 'fc'\ninit-skip = 'conv1'\n", {"c.toml:2:", "line 1", "init-skip = ['a', 'b']"}},
      {"model = ['lenet', 'resnet20']\n", {"c.toml:1:", "'model' is an array; --model takes one value"}},
      {"lr = [0.1]\n", {"c.toml:1:", "'lr' is an array"}},
      {"model = lenet,resnet20\n", {"c.toml:1:", "unquoted list; --model takes one value"}},
      {"data = classes=10,train=8\n", {"c.toml:1:", "unquoted list; --data", "quote it"}},
      {"lr = 0.1 0.2\n", {"c.toml:1:", "unquoted value with a blank"}},
      {"label = 'exp#1\n", {"c.toml:1:", "without its closing ' quote"}},
      {"label = \"a\\qb\"\n", {"c.toml:1:", "unknown escape '\\q'"}},
      {"label = \"\\uD800\"\n", {"c.toml:1:", "bad escape"}},
      {"label = 'a' 'b'\n", {"c.toml:1:", "unexpected text after the value of 'label'"}},
      {"lr =\n", {"c.toml:1:", "'lr' has no value"}},
      {"override = ['fc=fp32'\n", {"c.toml:1:", "does not close on its line"}},
      {"[train]\nlr = 0.1\n", {"c.toml:1:", "section"}},
      {"train.lr = 0.1\n", {"c.toml:1:", "dotted key"}},
      {"lr: 0.1\n", {"c.toml:1:", "expected '=' after 'lr'"}},
  };
  for (const auto& [text, parts] : cases) {
    std::vector<std::string> all = {"flag --config"};
    all.insert(all.end(), parts.begin(), parts.end());
    dfp::test::expect_error([&] { parse_train({}, write_file(dir, "c.toml", text)); }, dfp::Status::invalid_argument, all);
  }
  const dfp::TrainConfig c = parse_train(
      {}, write_file(dir, "list.toml",
                     "init-skip = ['fc', \"layer4*\",]  # list flags\noverride = ['conv*=bf16', 'fc=fp32']\n"
                     "milestones = [2, 4]\nkeep-fp32 = conv1,conv2\ndata = 'classes=10,train=8'\nprecision = int16\n"));
  EXPECT_EQ(c.init_skip, (std::vector<std::string>{"fc", "layer4*"}));
  ASSERT_EQ(c.policy.overrides.size(), 4u);
  EXPECT_EQ(c.policy.overrides[1].first, "fc");
  EXPECT_EQ(c.policy.overrides[3].first, "conv2");
  EXPECT_EQ(c.milestones, (std::vector<int>{2, 4}));
  EXPECT_EQ(c.data, "classes=10,train=8");
  EXPECT_EQ(parse_train({}, write_file(dir, "milestones.toml", "milestones = 3,5\n")).milestones, (std::vector<int>{3, 5}));
}

// New users' first runs: `--help` shows each flag's default and the zoo's models; a run without
// --out says that it saves nothing; output that is not a terminal gets whole progress lines, never
// a carriage return.
TEST(CliFirstRuns, HelpShowsDefaultsAndEveryModel) {
  const dfp::test::TempDir dir("dfp_cli_defaults_");
  const Result r = dfp_cli("train --help", dir);
  ASSERT_EQ(r.status, 0) << r.output;
  // The help line of a flag (CLI11 may wrap a long one onto the next line).
  auto help_of = [&](const std::string& names) {
    const size_t at = r.output.find("  " + names + " ");
    if (at == std::string::npos) return std::string();
    const size_t end = r.output.find("\n  -", at + 1);
    return r.output.substr(at, end == std::string::npos ? std::string::npos : end - at);
  };
  const std::vector<std::pair<std::string, std::string>> defaults = {
      {"--epochs", "(default: 10)"},          {"-b,--batch-size", "(default: 128)"},
      {"--lr,--learning-rate", "(default: 0.1)"}, {"--precision", "(default: fp32)"},
      {"--schedule", "(default: cosine)"},    {"-a,--model,--arch", "(default: resnet20)"},
      {"--wd,--weight-decay", "(default: 5e-04)"}, {"--seed", "(default: 1)"},
      {"--dataset", "(default: fashion-mnist)"}, {"-p,--print-every,--print-freq", "(default: 50)"}};
  for (const auto& [flag, shown] : defaults)
    EXPECT_NE(help_of(flag).find(shown), std::string::npos) << flag << ": '" << help_of(flag) << "'";
  const std::string model = help_of("-a,--model,--arch");
  for (const std::string& name : dfp::model_names())
    EXPECT_NE(model.find(name), std::string::npos) << name << " not in '" << model << "'";
  EXPECT_NE(model.find("alexnet_tv"), std::string::npos) << model;
  EXPECT_NE(dfp_cli("info --help", dir).output.find("(default: fp32)"), std::string::npos);
}

TEST(CliFirstRuns, RunWithoutOutSaysItSavesNothingAndPipesGetNoCarriageReturns) {
  const dfp::test::TempDir dir("dfp_cli_first_");
  const Result r = dfp_cli(tiny_run("-p 1"), dir);  // the output goes to a file
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("no --out DIR: this run saves nothing"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find('\r'), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("epoch 1/1 [="), std::string::npos) << r.output;  // progress as whole lines
  const Result saved = dfp_cli(tiny_run("--out '" + dir.file("a") + "'"), dir);
  ASSERT_EQ(saved.status, 0) << saved.output;
  EXPECT_EQ(saved.output.find("saves nothing"), std::string::npos) << saved.output;
}

// On a terminal the progress line is redrawn in place: every step's line starts with '\r', and the
// next message (the epoch's line) starts on a line of its own.
TEST(CliFirstRuns, TerminalGetsOneProgressLineRedrawnInPlace) {
  int terminal = -1;
  const pid_t pid = forkpty(&terminal, nullptr, nullptr, nullptr);
  ASSERT_GE(pid, 0) << std::strerror(errno);
  if (pid == 0) {
    const std::string args = std::string("'") + DFP_CLI + "' " + tiny_run("-p 100 --data classes=10,train=32,test=8");
    execl("/bin/sh", "sh", "-c", args.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(terminal, buf, sizeof buf)) > 0;) out.append(buf, size_t(n));  // EIO at the child's end
  close(terminal);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  for (int step = 1; step <= 4; ++step) {  // -p 100 does not thin a terminal's redraws
    const std::string line = "\repoch 1/1 [" + std::string(size_t(24 * step / 4), '=');
    EXPECT_NE(out.find(line), std::string::npos) << "step " << step << ": " << out;
  }
  const size_t done = out.find("epoch 1/1 done");
  ASSERT_NE(done, std::string::npos) << out;
  EXPECT_EQ(out.substr(done - 2, 2), "\r\n") << out;  // the terminal's newline, after the last redraw
  EXPECT_NE(out.rfind("eta", done), std::string::npos) << out;
}

// A run stopped before its first checkpoint leaves config.json and metrics.jsonl: the plain retry
// takes the directory over. --resume with a larger --epochs extends a finished run.
TEST(CliFirstRuns, RetryAfterAnInterruptedFirstEpochAndResumeWithMoreEpochs) {
  const dfp::test::TempDir dir("dfp_cli_retry_");
  const std::string out = dir.file("run");
  ASSERT_EQ(dfp_cli(tiny_run("--out '" + out + "'"), dir).status, 0);
  // What a run killed in its first epoch leaves.
  fs::remove(out + "/checkpoint.dfp");
  std::ofstream(out + "/metrics.jsonl", std::ios::trunc).flush();
  const Result retry = dfp_cli(tiny_run("--out '" + out + "'"), dir);
  ASSERT_EQ(retry.status, 0) << retry.output;
  EXPECT_NE(retry.output.find("this run takes it over"), std::string::npos) << retry.output;
  ASSERT_TRUE(fs::exists(out + "/checkpoint.dfp"));
  // The finished run refuses a plain retry, naming the checkpoint to resume.
  const Result again = dfp_cli(tiny_run("--out '" + out + "'"), dir);
  EXPECT_EQ(again.status, 1);
  EXPECT_NE(again.output.find("--resume " + out + "/checkpoint.dfp to continue it"), std::string::npos) << again.output;
  const Result more = dfp_cli(tiny_run("--epochs 2 --resume '" + out + "/checkpoint.dfp' --out '" + out + "'"), dir);
  ASSERT_EQ(more.status, 0) << more.output;
  EXPECT_NE(more.output.find("extending the run of 1 epochs to 2"), std::string::npos) << more.output;
  EXPECT_EQ(dfp::test::lines_of(out + "/metrics.jsonl").size(), 2u);
  EXPECT_NE(slurp(out + "/run.toml").find("epochs = 2\n"), std::string::npos);
  const Result fewer = dfp_cli(tiny_run("--resume '" + out + "/checkpoint.dfp' --out '" + out + "'"), dir);
  EXPECT_EQ(fewer.status, 1);
  EXPECT_NE(fewer.output.find("flag --epochs 1: checkpoint"), std::string::npos) << fewer.output;
}

// The library's train() writes run.toml (the Python binding's runs too): `dfp train --config`
// reads it back to the same settings and repeats the run.
TEST(CliFirstRuns, LibraryRunsWriteTheRunToml) {
  const dfp::test::TempDir dir("dfp_cli_libtoml_");
  dfp::TrainConfig c;
  c.model = "lenet";
  c.dataset = "synthetic";
  c.data = "classes=10,train=16,test=8";
  c.image_size = 28;
  c.epochs = 1;
  c.batch_size = 8;
  c.threads = 2;
  c.lr = 0.03f;
  c.label = "it's lib";
  c.out = dir.file("lib");
  dfp::train(c, nullptr);
  const std::string toml = slurp(c.out + "/run.toml");
  ASSERT_FALSE(toml.empty());
  const dfp::TrainConfig back = parse_train({}, c.out + "/run.toml");
  EXPECT_EQ(dfp::cli::run_toml(back), toml);
  EXPECT_EQ(back.lr, 0.03f);
  EXPECT_EQ(back.label, "it's lib");
  const Result r = dfp_cli("train --config '" + c.out + "/run.toml' --out '" + dir.file("cli") + "'", dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(slurp(dir.file("cli/checkpoint.dfp")), slurp(c.out + "/checkpoint.dfp"));
}

// dfp info --precision bf16 gives one account of what a BF16 convolution runs on: the kernel table's
// line and the policy's note agree, also where oneDNN has no BF16 code (ONEDNN_MAX_CPU_ISA=AVX2, as
// on a CPU without AVX-512) and where it emulates BF16 on AVX-512.
TEST(CliFirstRuns, InfoBf16TellsOneStory) {
  const dfp::test::TempDir dir("dfp_cli_bf16_");
  for (const char* isa : {"", "AVX2", "AVX512_CORE"}) {
    SCOPED_TRACE(isa);
    const std::string env = *isa ? std::string("ONEDNN_MAX_CPU_ISA=") + isa + " " : std::string();
    const std::string log = dir.file("info.log");
    ASSERT_EQ(std::system((env + "'" + DFP_CLI + "' info --threads 1 --precision bf16 > '" + log + "' 2>&1").c_str()), 0);
    const std::string out = slurp(log);
    const size_t note = out.find("bf16: formats w/x/dy bf16/bf16/bf16; ");
    ASSERT_NE(note, std::string::npos) << out;
    const std::string says = out.substr(note, out.find('\n', note) - note);
    if (out.find("bf16   bf16-rounded operands on the fp32 kernel") != std::string::npos) {
      EXPECT_NE(says.find("operands rounded to BF16 on the FP32 oneDNN convolutions"), std::string::npos) << out;
      EXPECT_EQ(says.find("emulates"), std::string::npos) << out;
    } else if (out.find("onednn:jit_bf16:avx512_core_bf16") != std::string::npos ||
               out.find("avx512_core_amx") != std::string::npos) {  // avx512_core_amx, avx512_core_amx_bf16
      EXPECT_NE(says.find("native"), std::string::npos) << out;
    } else {
      EXPECT_NE(says.find("EMULATED"), std::string::npos) << out;
    }
    if (std::string(isa) == "AVX2") {  // oneDNN has no BF16 JIT code below AVX-512
      EXPECT_NE(out.find("bf16   bf16-rounded operands on the fp32 kernel"), std::string::npos) << out;
    }
  }
}
