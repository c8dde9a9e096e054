// dfp compare: trains one run per precision spec, each in its own process (so that peak memory,
// oneDNN's caches and the thread pools are those of that run alone), with identical flags, seed
// and data order, into OUT/<spec>/, then writes the comparison report from the runs' metrics files.
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "dfp/dfp16.hpp"
#include "dfp/loss_scale.hpp"
#include "dfp/status.hpp"
#include "dfp/trainer.hpp"
#include "apps/dfp/commands.hpp"
#include "apps/dfp/flags.hpp"
#include "apps/dfp/report/report.hpp"
#include "dfp/run_lock.hpp"

namespace dfp::cli {

namespace {

struct RunSpec {
  std::string label;      // as given: fp32, bf16, fp16, fp16-static, int16, cuda-fp16, ...
  std::string device = "cpu";
  std::string precision;  // fp32 | int16 | bf16 | fp16
  std::string scaling;    // none | static | dynamic | adaptive
  std::string granularity;  // int16: tensor | slice | blockN for every class (--granularity); "" = the flags'
};

bool is_granularity(const std::string& name) {
  for (dfp::Granularity g : {dfp::Granularity::tensor, dfp::Granularity::slice, dfp::Granularity::block32,
                             dfp::Granularity::block64, dfp::Granularity::block128})
    if (name == dfp::granularity_name(g)) return true;
  return false;
}

// "<precision>[-<scaling>][-<granularity>]"; fp16 alone means dynamic scaling (what torch.amp
// users run); int16-slice, int16-tensor and int16-block32 (64, 128) compare DFP16 exponent
// granularities in one report.
RunSpec parse_spec(const std::string& spec) {
  RunSpec r;
  r.label = spec;
  const std::string origin = "flag --precisions item '" + spec + "'";
  std::string rest = spec;
  if (rest.rfind("cuda-", 0) == 0) {  // cuda-fp16, cuda-fp32: the GPU device
    r.device = "cuda";
    rest = rest.substr(5);
  }
  std::vector<std::string> parts(1);
  for (char ch : rest) {
    if (ch == '-') parts.emplace_back();
    else parts.back() += ch;
  }
  r.precision = parts[0];
  dfp::parse_precision(r.precision, origin);
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& p = parts[i];
    if (is_granularity(p)) {
      DFP_CHECK(r.precision == "int16" && r.device == "cpu" && r.granularity.empty(), dfp::Status::invalid_argument,
                origin + ": a granularity (-tensor, -slice, -block32, -block64, -block128) applies once to an int16 "
                         "item, e.g. int16-slice");
      r.granularity = p;
    } else {
      DFP_CHECK(r.scaling.empty(), dfp::Status::invalid_argument,
                origin + ": expected PRECISION[-SCALING][-GRANULARITY], e.g. fp16-static or int16-slice");
      r.scaling = p;
      dfp::parse_loss_scale_mode(r.scaling, origin);
    }
  }
  if (r.scaling.empty()) r.scaling = r.precision == "fp16" ? "dynamic" : "none";
  return r;
}

// Runs argv (argv[0] = program path) with stdout+stderr into `log_path`, echoing each line to our
// stdout prefixed with "[label] ". Returns the exit status (128+signal when killed).
int run_logged(const std::vector<std::string>& argv, const std::string& log_path, const std::string& label) {
  int fds[2];
  DFP_CHECK(pipe(fds) == 0, dfp::Status::io_error, std::string("pipe failed: ") + std::strerror(errno));
  const pid_t pid = fork();
  DFP_CHECK(pid >= 0, dfp::Status::io_error, std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> a;
    for (const std::string& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execvp(a[0], a.data());  // a launcher (mpirun) is found on PATH; dfp itself by its full path
    std::fprintf(stderr, "cannot run %s: %s\n", a[0], std::strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  std::ofstream log(log_path);
  DFP_CHECK(log.good(), dfp::Status::io_error, "cannot write '" + log_path + "'");
  std::string line;
  char buf[4096];
  ssize_t got;
  while ((got = read(fds[0], buf, sizeof buf)) > 0 || (got < 0 && errno == EINTR)) {
    for (ssize_t i = 0; i < got; ++i) {
      if (buf[i] != '\n') { line += buf[i]; continue; }
      log << line << '\n';
      std::printf("[%s] %s\n", label.c_str(), line.c_str());
      std::fflush(stdout);
      line.clear();
    }
  }
  if (!line.empty()) { log << line << '\n'; std::printf("[%s] %s\n", label.c_str(), line.c_str()); }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

struct CompareState {
  RunFlags probe;  // validates the shared flags here, before hours of training
  std::string out = "runs/compare", specs_text = "fp32,bf16,fp16,int16";
  std::vector<std::string> launcher;  // --launcher: the command each run starts under (mpirun -np N)
  FlagSet flags;
  explicit CompareState(CLI::App& app) : flags(app) {}
};

int compare(CompareState& s) {
  std::vector<std::string> pass;  // flags handed to every `dfp train` unchanged
  for (const auto& [flag, value] : s.flags.given()) {
    const std::string a = FlagSet::canonical(*flag);
    DFP_CHECK(a != "--precision" && a != "--loss-scaling" && a != "--label" && a != "--resume" && a != "--device",
              dfp::Status::invalid_argument,
              "flag " + a + " is set per run by --precisions (e.g. --precisions fp32,fp16-static,int16)");
    if (a == "--out" || a == "--precisions" || a == "--launcher") continue;  // compare's own
    pass.push_back(a);
    if (!flag->value.empty()) pass.push_back(value);
  }
  s.flags.apply();
  s.probe.finish();
  const dfp::TrainConfig& probe = s.probe.config;
  const std::string& out = s.out;
  const std::string& specs_text = s.specs_text;
  dfp::validate_train_config(probe);  // the shared settings, before any run starts
  std::vector<RunSpec> specs;
  std::stringstream ss(specs_text);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) {
      specs.push_back(parse_spec(item));
      for (size_t i = 0; i + 1 < specs.size(); ++i)
        DFP_CHECK(specs[i].label != item, dfp::Status::invalid_argument, "flag --precisions: '" + item + "' given twice");
    }
  DFP_CHECK(!specs.empty(), dfp::Status::invalid_argument, "flag --precisions: expected a list like fp32,bf16,fp16,int16");
  for (const RunSpec& r : specs)
    for (const auto& [flag, value] : s.flags.given()) {
      const std::string a = FlagSet::canonical(*flag);
      DFP_CHECK(r.granularity.empty() || a.find("granularity") == std::string::npos, dfp::Status::invalid_argument,
                "flag " + a + " and the --precisions item '" + r.label +
                    "' both set the granularity; give it in one place (e.g. --precisions int16-tensor,int16-slice)");
    }
  // Each run is a child process of compare, which cannot join the launcher's job as a rank; a
  // data-parallel comparison starts each run under the launcher instead (--launcher).
  // Every rank refuses alike: rank 0 says it for the job.
  if (dfp::job_ranks() != 1)
    throw dfp::RefusalOfEveryRank(dfp::Error(dfp::Status::unsupported,
            "dfp compare under mpirun (" + std::to_string(dfp::job_ranks()) +
                " processes) is not supported: compare starts each precision's `dfp train` as a process of its own, "
                "which cannot join the launcher's job. Run compare as one process and have it start each run "
                "data-parallel: dfp compare --launcher \"mpirun -np " + std::to_string(dfp::job_ranks()) +
                "\" ... (add --profile for the communication time and bytes per step); or train each precision "
                "yourself: mpirun -np " + std::to_string(dfp::job_ranks()) +
                " dfp train ... --precision P --label P --out " + out + "/P"), false);
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  DFP_CHECK(!ec, dfp::Status::io_error, "flag --out: cannot create directory '" + out + "': " + ec.message());
  // The comparison owns OUT (each run locks its own OUT/<spec>); runs of an earlier comparison
  // there are replaced only with --overwrite, before any training starts.
  const dfp::RunLock lock(out, "flag --out");
  for (const RunSpec& r : specs)
    DFP_CHECK(probe.overwrite || !dfp::holds_run(out + "/" + r.label), dfp::Status::invalid_argument,
              "flag --out: '" + out + "/" + r.label + "' holds an earlier run; expected a new directory, or --overwrite "
              "to replace the runs of '" + out + "'");
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec);
  DFP_CHECK(!ec, dfp::Status::io_error, "cannot find this program (/proc/self/exe): " + ec.message());
  std::vector<std::string> done, failed;
  for (const RunSpec& r : specs) {
    const std::string dir = out + "/" + r.label;
    std::filesystem::create_directories(dir, ec);
    DFP_CHECK(!ec, dfp::Status::io_error, "flag --out: cannot create directory '" + dir + "': " + ec.message());
    std::vector<std::string> argv = s.launcher;
    argv.insert(argv.end(), {self, "train"});
    argv.insert(argv.end(), pass.begin(), pass.end());
    argv.insert(argv.end(), {"--device", r.device, "--precision", r.precision, "--loss-scaling", r.scaling, "--label", r.label,
                             "--out", dir});
    if (!r.granularity.empty()) argv.insert(argv.end(), {"--granularity", r.granularity});
    const std::string granularity = r.granularity.empty() ? "" : " --granularity " + r.granularity;
    std::printf("== %s: dfp train ... --precision %s --loss-scaling %s%s --out %s\n", r.label.c_str(), r.precision.c_str(),
                r.scaling.c_str(), granularity.c_str(), dir.c_str());
    std::fflush(stdout);
    const int rc = run_logged(argv, dir + "/train.log", r.label);
    if (rc == 0) done.push_back(dir);
    else {
      failed.push_back(r.label);
      std::printf("== %s failed (exit %d); see %s/train.log; continuing with the other precisions\n", r.label.c_str(), rc,
                  dir.c_str());
    }
  }
  std::vector<dfp::RunSummary> runs;
  for (const std::string& d : done) runs.push_back(dfp::read_run(d));
  if (!runs.empty()) {
    std::printf("\n%s", dfp::format_table(runs).c_str());
    const std::string comm = dfp::format_communication(runs);
    if (!comm.empty()) std::printf("\n%s", comm.c_str());
    dfp::write_report(out, runs, print_line);
  }
  if (!failed.empty()) {
    std::string f;
    for (const auto& x : failed) f += (f.empty() ? "" : ", ") + x;
    std::fprintf(stderr, "dfp compare: %zu run(s) failed: %s\n", failed.size(), f.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

Run add_compare(CLI::App& root) {
  CLI::App* app = root.add_subcommand("compare", "train one run per precision, same flags and seed; tabulate and plot");
  app->footer("Each run is a dfp train process with the flags given here, into OUT/<item>/.");
  auto s = std::make_shared<CompareState>(*app);
  CompareState* p = s.get();
  p->flags.add({{"--precisions", "LIST",
                 "runs, e.g. fp32,bf16,fp16,int16: items PRECISION[-none|-static|-dynamic|-adaptive] (fp16 alone = "
                 "fp16-dynamic; cuda-fp16, cuda-fp32 on the GPU); int16-tensor, int16-slice, int16-block32|64|128: that DFP16 granularity "
                 "(--granularity) for the run",
                 [p](const std::string&, const std::string& v) { p->specs_text = v; }, "Run"},
                out_flag(p->out, "directory of the comparison: OUT/<item>/ per run, the report and plots"),
                {"--launcher", "CMD",
                 "start each run under CMD, e.g. \"mpirun -np 4\" (data-parallel runs; with --profile the table "
                 "adds each run's allreduce bytes and time per step)",
                 [p](const std::string& flag, const std::string& v) {
                   std::istringstream words(v);
                   p->launcher.clear();
                   for (std::string w; words >> w;) p->launcher.push_back(w);
                   DFP_CHECK(!p->launcher.empty(), dfp::Status::invalid_argument,
                             "flag " + flag + ": expected a command, e.g. \"mpirun -np 4\", got '" + v + "'");
                 },
                 "Run"}});
  p->flags.add(run_flags(p->probe));
  p->flags.add(policy_flags(p->probe));
  p->flags.show_defaults(p->probe.config);
  return [s] { return compare(*s); };
}

}  // namespace dfp::cli
