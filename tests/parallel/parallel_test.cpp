// Data-parallel training (`mpirun -np N dfp train`, src/parallel/): N ranks with per-rank batch B/N
// against one process with batch B; the dfp16 allreduce's independence of MPI's reduction
// algorithm; start-up refusal of ranks started differently; a killed or stopped rank ending the
// job with the rank named and the last checkpoint intact; resume with the same N bit for bit and
// refusal of another N. Each test runs Open MPI's mpirun on this machine (--oversubscribe; as root
// with --allow-run-as-root) and is skipped, with the reason, in a build without MPI or where
// mpirun is missing.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "src/io/checkpoint.hpp"
#include "src/train/run_files.hpp"
#include "tests/common/files.hpp"
#include "tests/common/temp_dir.hpp"
#include "tests/common/tolerance.hpp"

namespace fs = std::filesystem;

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

// The launcher of the MPI this build found (CMake's MPIEXEC_EXECUTABLE; mpirun when it found none)
// and whether it is Open MPI's (else MPICH's Hydra, whose mpiexec takes other options).
std::string launcher() { return std::string(DFP_TEST_MPIEXEC).empty() ? "mpirun" : DFP_TEST_MPIEXEC; }
bool open_mpi() {
  static const bool open = [] {
    FILE* p = popen((launcher() + " --version 2>&1").c_str(), "r");
    std::string text;
    char buf[512];
    for (size_t n; p && (n = fread(buf, 1, sizeof buf, p)) > 0;) text.append(buf, n);
    if (p) pclose(p);
    return text.find("Open MPI") != std::string::npos || text.find("OpenRTE") != std::string::npos;
  }();
  return open;
}

// Skips the test when this build or machine cannot run a job.
#define DFP_NEED_MPI()                                                                                  \
  do {                                                                                                  \
    if (!DFP_TEST_HAVE_MPI) GTEST_SKIP() << "dfp was built without MPI (libopenmpi-dev not installed)"; \
    if (kSanitized)                                                                                     \
      GTEST_SKIP() << "sanitizer build: Open MPI's start-up allocations in each rank are leak reports to " \
                      "LeakSanitizer; the jobs run in the normal build";                                 \
    if (std::system(("command -v " + launcher() + " >/dev/null 2>&1").c_str()) != 0)                    \
      GTEST_SKIP() << launcher() << " not found (Debian package openmpi-bin, or mpich)";               \
  } while (0)

class DistDir : public dfp::test::TempDir {
 public:
  DistDir() : TempDir("dfp_dist_test_") {}
};

// A small job: LeNet (no BatchNorm, no dropout) on random 16x16 images, FP32, 1 thread per rank.
std::string train_args(int batch, const std::string& out, const std::string& extra = "", int epochs = 2,
                       const std::string& model = "lenet") {
  return "train --model " + model + " --dataset synthetic --data classes=10,train=192,test=64 --image-size 16 --precision fp32 "
         "--epochs " + std::to_string(epochs) + " --batch-size " + std::to_string(batch) + " --lr 0.05 --threads 1 --workers 1 --seed 5 --out " + out +
         " --print-every 1000 " + extra;
}

// The launch of an N-rank job; `options` are the launcher's. Open MPI refuses root (CI runs as
// root) and more ranks than cores unless told; Hydra does neither.
std::string mpirun(int np, const std::string& options = "") {
  if (!open_mpi()) return launcher() + " -n " + std::to_string(np) + " " + options + " ";
  return launcher() + " --allow-run-as-root --oversubscribe --bind-to none -np " + std::to_string(np) + " " + options + " ";
}

struct Result {
  int status = -1;
  std::string output;
};

Result run(const std::string& command) {
  Result r;
  FILE* p = popen(("timeout 300 " + command + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::map<std::string, std::vector<float>> tensors(const std::string& path) {
  return dfp::read_checkpoint(path).tensors;
}

// max over the model's tensors of ||a - b|| / ||b||: the weights, and with momentum their momenta.
double max_rel_l2(const std::string& a_path, const std::string& b_path, bool momentum = true) {
  const auto a = tensors(a_path), b = tensors(b_path);
  double worst = 0;
  for (const auto& [name, bv] : b) {
    if (name.rfind("dist.", 0) == 0 || (!momentum && name.find("@momentum") != std::string::npos)) continue;
    const auto it = a.find(name);
    EXPECT_NE(it, a.end()) << name;
    if (it == a.end() || it->second.size() != bv.size()) return INFINITY;
    double d = 0, s = 0;
    for (size_t i = 0; i < bv.size(); ++i) {
      d += double(it->second[i] - bv[i]) * (it->second[i] - bv[i]);
      s += double(bv[i]) * bv[i];
    }
    worst = std::max(worst, std::sqrt(d / std::max(s, 1e-30)));
  }
  return worst;
}

bool same_bits(const std::string& a_path, const std::string& b_path) {
  return tensors(a_path) == tensors(b_path);
}

TEST(Dist, RanksWithPartsOfTheBatchMatchOneProcessWithTheWholeBatch) {
  DFP_NEED_MPI();
  DistDir d;
  const std::string one = d.path().string() + "/one", two = d.path().string() + "/two", three = d.path().string() + "/three";
  const std::string dfp = DFP_CLI;
  Result r = run(dfp + " " + train_args(24, one));
  ASSERT_EQ(r.status, 0) << r.output;
  r = run(mpirun(2) + dfp + " " + train_args(24, two));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("data-parallel job: 2 ranks, global batch 24 (12 per rank)"), std::string::npos) << r.output;
  r = run(mpirun(3) + dfp + " " + train_args(24, three));
  ASSERT_EQ(r.status, 0) << r.output;
  // Only the summation order differs (per-rank means averaged, vs one mean over the batch).
  EXPECT_LE(max_rel_l2(two + "/checkpoint.dfp", one + "/checkpoint.dfp"), dfp::test::kDataParallelRelL2);
  EXPECT_LE(max_rel_l2(three + "/checkpoint.dfp", one + "/checkpoint.dfp"), dfp::test::kDataParallelRelL2);
  // Rank 0 alone writes the run's files.
  EXPECT_EQ(dfp::test::lines_of(two + "/metrics.jsonl").size(), 2u);
}

// --sync-bn at several points of a training: from the weights, BatchNorm parameters and running
// statistics one process reaches after 0, 1, 2 and 3 steps (gamma and beta no longer 1 and 0), one
// step of N = 2 and N = 3 ranks against one step of one process. Each step starts from the same
// weights: two trajectories are not compared, because ResNet-20's are chaotic here (the FP32
// allreduce's rounding moves a conv output by 1e-6, that flips a fused ReLU's mask bit for an
// output within 1e-6 of 0, and BatchNorm's backward spreads the changed sum(dy) over the channel;
// one process at 1 and 2 threads parts the same way; docs/design/distributed.md).
TEST(Dist, SyncBnRanksMatchOneProcessWithTheWholeBatchAtEveryStep) {
  DFP_NEED_MPI();
  DistDir d;
  const std::string dir = d.path().string(), dfp = DFP_CLI;
  // ResNet-20: BatchNorm after every convolution; each epoch is one step of the same 24 images.
  const auto args = [](const std::string& out, int epochs, const std::string& extra) {
    return train_args(24, out, extra + " --limit-train 24 --schedule constant", epochs, "resnet20");
  };
  for (int k = 0; k < 4; ++k) {
    const std::string at = dir + "/at" + std::to_string(k), init = k ? " --init-from " + at + "/checkpoint.dfp" : "";
    if (k) {
      ASSERT_EQ(run(dfp + " " + args(at, k, "")).status, 0);  // one process's state after k steps
    }
    const std::string one = dir + "/one" + std::to_string(k), two = dir + "/two" + std::to_string(k),
                      three = dir + "/three" + std::to_string(k);
    Result r = run(dfp + " " + args(one, 1, init));
    ASSERT_EQ(r.status, 0) << r.output;
    r = run(mpirun(2) + dfp + " " + args(two, 1, "--sync-bn" + init));
    ASSERT_EQ(r.status, 0) << r.output;
    r = run(mpirun(3) + dfp + " " + args(three, 1, "--sync-bn" + init));
    ASSERT_EQ(r.status, 0) << r.output;
    // The weights, the momenta (here the step's gradients) and the running statistics.
    EXPECT_LE(max_rel_l2(two + "/checkpoint.dfp", one + "/checkpoint.dfp"), dfp::test::kDataParallelSyncBnRelL2) << "step " << k;
    EXPECT_LE(max_rel_l2(three + "/checkpoint.dfp", one + "/checkpoint.dfp"), dfp::test::kDataParallelSyncBnRelL2) << "step " << k;
    if (k != 2) continue;
    // Without it each rank normalises by its own part's statistics: another training.
    const std::string own = dir + "/own";
    ASSERT_EQ(run(mpirun(2) + dfp + " " + args(own, 1, init)).status, 0);
    EXPECT_GT(max_rel_l2(own + "/checkpoint.dfp", one + "/checkpoint.dfp"), 10 * dfp::test::kDataParallelSyncBnRelL2);
  }
}

// Dropout masks follow the image's place in the global batch (Model::set_batch_offset): GoogLeNet
// (BatchNorm, dropout 0.2 before its classifier), one step with --sync-bn, matches one process.
// With each rank drawing masks for its own part's indices it was 0.74 apart.
TEST(Dist, RanksOfAModelWithDropoutMatchOneProcess) {
  DFP_NEED_MPI();
  DistDir d;
  const std::string one = d.path().string() + "/one", two = d.path().string() + "/two";
  const auto args = [](const std::string& out) {
    return "train --model googlenet --dataset synthetic --data classes=10,train=8,test=8 --image-size 32 "
           "--precision fp32 --epochs 1 --batch-size 8 --lr 0.01 --threads 1 --workers 1 --seed 5 --out " + out;
  };
  Result r = run(std::string(DFP_CLI) + " " + args(one));
  ASSERT_EQ(r.status, 0) << r.output;
  r = run(mpirun(2) + DFP_CLI + " " + args(two) + " --sync-bn");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_LE(max_rel_l2(two + "/checkpoint.dfp", one + "/checkpoint.dfp"), dfp::test::kDataParallelSyncBnRelL2);
}

TEST(Dist, Dfp16AllreduceDoesNotDependOnMpisReductionAlgorithm) {
  DFP_NEED_MPI();
  DistDir d;
  const std::string dfp = DFP_CLI;
  std::vector<std::string> outs;
  // Open MPI's libnbc MPI_Iallreduce: 1 ring, 2 binomial tree; MPICH's: recursive doubling, ring.
  // The partial sums of three ranks are formed in other orders, which the INT16 sum does not see.
  for (int algorithm : {1, 2}) {
    outs.push_back(d.path().string() + "/alg" + std::to_string(algorithm));
    const std::string choice =
        open_mpi() ? "--mca coll_libnbc_iallreduce_algorithm " + std::to_string(algorithm)
                   : std::string("-genv MPIR_CVAR_IALLREDUCE_INTRA_ALGORITHM ") +
                         (algorithm == 1 ? "sched_recursive_doubling" : "tsp_ring");
    const Result r = run(mpirun(3, choice) + dfp + " " + train_args(24, outs.back(), "--allreduce dfp16 --bucket-kib 16"));
    ASSERT_EQ(r.status, 0) << r.output;
  }
  EXPECT_TRUE(same_bits(outs[0] + "/checkpoint.dfp", outs[1] + "/checkpoint.dfp"));
  // And it is the same training as fp32's, within the stochastic rounding of the gradients.
  const std::string one = d.path().string() + "/one";
  ASSERT_EQ(run(dfp + " " + train_args(24, one)).status, 0);
  EXPECT_LE(max_rel_l2(outs[0] + "/checkpoint.dfp", one + "/checkpoint.dfp", false), dfp::test::kDataParallelDfp16RelL2);
}

TEST(Dist, RanksStartedWithOtherFlagsAreRefused) {
  DFP_NEED_MPI();
  DistDir d;
  const std::string dfp = DFP_CLI, out = d.path().string() + "/run";
  const Result r = run(mpirun(1) + dfp + " " + train_args(24, out) + " : -np 1 " + dfp + " " +
                       train_args(24, out, "--lr 0.1"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("rank 1 started with other flags"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out + "/checkpoint.dfp"));
}

// --profile: rank 0's profile.json holds the allreduce's bytes and times over the run's steps.
TEST(Dist, ProfileJsonHoldsTheCommunicationPerStep) {
  DFP_NEED_MPI();
  DistDir d;
  std::map<std::string, dfp::run_files::ProfileRecord> prof;
  for (const std::string format : {"fp32", "dfp16"}) {
    const std::string out = d.path().string() + "/" + format;
    const Result r = run(mpirun(2) + DFP_CLI + " " + train_args(24, out, "--profile --allreduce " + format, 1));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("communication (2 ranks, " + format + " allreduce)"), std::string::npos) << r.output;
    prof[format] = dfp::run_files::parse_profile(dfp::test::slurp(out + "/profile.json"), out + "/profile.json");
  }
  for (const auto& [format, p] : prof) {
    ASSERT_TRUE(p.communication) << format;
    const dfp::run_files::ProfileCommRecord& c = *p.communication;
    EXPECT_EQ(p.steps, 8u);  // 192 images, batch 24
    EXPECT_EQ(c.ranks, 2);
    EXPECT_EQ(c.allreduce, format);
    EXPECT_GT(c.fp32_bytes, 0u);
    EXPECT_EQ(c.fp32_bytes % p.steps, 0u);  // the same gradients every step
    EXPECT_GT(c.in_flight_seconds, 0.0);
    EXPECT_GE(c.exposed_seconds, 0.0);
    EXPECT_LE(c.exposed_seconds, p.step_seconds);
  }
  // fp32 sends its 4 bytes per gradient; dfp16 2 bytes plus one 4-byte max per bucket.
  EXPECT_EQ(prof["fp32"].communication->bytes, prof["fp32"].communication->fp32_bytes);
  EXPECT_EQ(prof["dfp16"].communication->fp32_bytes, prof["fp32"].communication->fp32_bytes);
  EXPECT_LE(double(prof["dfp16"].communication->bytes), 0.51 * double(prof["fp32"].communication->bytes));
  // A one-process run has no communication record.
  const std::string one = d.path().string() + "/one";
  ASSERT_EQ(run(std::string(DFP_CLI) + " " + train_args(24, one, "--profile", 1)).status, 0);
  EXPECT_FALSE(dfp::run_files::parse_profile(dfp::test::slurp(one + "/profile.json"), one + "/profile.json").communication);
}

// dfp compare starts each run as a child process, which cannot be a rank of the job: refused with
// what to run instead, before it creates anything.
TEST(Dist, CompareUnderMpirunIsRefusedSayingWhatToRun) {
  DFP_NEED_MPI();
  DistDir d;
  const std::string out = d.path().string() + "/cmp";
  const Result r = run(mpirun(2) + DFP_CLI + " compare --precisions fp32,int16 --model lenet --dataset synthetic "
                       "--data classes=10,train=192,test=64 --image-size 16 --epochs 1 --batch-size 24 --out " + out);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("dfp compare under mpirun (2 processes) is not supported"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("mpirun -np 2 dfp train ... --precision P --label P --out " + out + "/P"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(out));
}

// compare --launcher starts each precision's run as a job of the launcher: every run trains on 2
// ranks (its profile.json says so), the runs' final weights are those of the same job started by
// hand, and the comparison tabulates each run's allreduce bytes and time per step.
TEST(Dist, CompareStartsEachRunUnderTheLauncher) {
  DFP_NEED_MPI();
  DistDir d;
  const std::string out = d.path().string() + "/cmp", by_hand = d.path().string() + "/hand";
  std::string launch = mpirun(2);
  while (!launch.empty() && launch.back() == ' ') launch.pop_back();
  const std::string flags = " --model lenet --dataset synthetic --data classes=10,train=192,test=64 --image-size 16 "
                            "--epochs 1 --batch-size 24 --lr 0.05 --threads 1 --workers 1 --seed 5 --profile "
                            "--allreduce dfp16 --print-every 1000";
  const Result r = run(std::string(DFP_CLI) + " compare --launcher \"" + launch + "\" --precisions fp32,int16" + flags +
                       " --out " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("gradient allreduce per training step"), std::string::npos) << r.output;
  for (const char* p : {"fp32", "int16"}) {
    const dfp::run_files::ProfileRecord prof =
        dfp::run_files::parse_profile(dfp::test::slurp(out + "/" + p + "/profile.json"), p);
    ASSERT_TRUE(prof.communication.has_value()) << p;
    EXPECT_EQ(prof.communication->ranks, 2) << p;
    EXPECT_EQ(prof.communication->allreduce, "dfp16") << p;
    EXPECT_GT(prof.communication->bytes, 0u) << p;
    // The table's row of this run: its label, 2 ranks, dfp16.
    const std::string row = "\n" + std::string(p) + " ";
    size_t at = r.output.find("gradient allreduce per training step");
    at = at == std::string::npos ? at : r.output.find(row, at);
    if (at != std::string::npos) ++at;
    ASSERT_NE(at, std::string::npos) << r.output;
    EXPECT_NE(r.output.substr(at, r.output.find('\n', at) - at).find("dfp16"), std::string::npos) << r.output;
  }
  // The int16 run is the job one would start by hand.
  const Result h = run(mpirun(2) + DFP_CLI + " train --precision int16" + flags + " --out " + by_hand);
  ASSERT_EQ(h.status, 0) << h.output;
  EXPECT_TRUE(same_bits(out + "/int16/checkpoint.dfp", by_hand + "/checkpoint.dfp"));
}

TEST(Dist, IndivisibleBatchIsRefused) {
  DFP_NEED_MPI();
  DistDir d;
  const Result r = run(mpirun(3) + DFP_CLI + " " + train_args(32, d.path().string() + "/run"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("expected a multiple of 3"), std::string::npos) << r.output;
}

// Starts `command` in the background with its output in `log`; returns the shell's pid (exec'd
// into mpirun).
pid_t start(const std::string& command, const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", ("exec " + command + " >" + log + " 2>&1").c_str(), nullptr);
    _exit(127);
  }
  return pid;
}

// The pid of rank `rank` among the launcher's descendants (Open MPI starts the ranks itself,
// Hydra through a proxy), found by its rank in the environment (OMPI_COMM_WORLD_RANK, PMI_RANK).
pid_t rank_pid(pid_t launcher, int rank) {
  std::map<pid_t, pid_t> parent;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string s((std::istreambuf_iterator<char>(stat)), {});
    const size_t close = s.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(s.substr(close + 2));
    char state;
    int ppid = 0;
    rest >> state >> ppid;
    parent[pid_t(std::stoi(name))] = pid_t(ppid);
  }
  const std::string r = std::to_string(rank) + '\0';
  for (const auto& [pid, ppid] : parent) {
    bool below = false;
    for (pid_t up = ppid; up > 1 && !below; up = parent.count(up) ? parent[up] : 0) below = up == launcher;
    if (!below) continue;
    std::ifstream env("/proc/" + std::to_string(pid) + "/environ");
    const std::string vars = '\0' + std::string((std::istreambuf_iterator<char>(env)), {});
    const std::string pmi("\0PMI_RANK=", 10);
    if (vars.find("OMPI_COMM_WORLD_RANK=" + r) != std::string::npos || vars.find(pmi + r) != std::string::npos)
      return pid;
  }
  return -1;
}

// Waits for the job's exit; -1 if it has not ended within `seconds`.
int wait_exit(pid_t pid, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  int status = 0;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds) {
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

// A job with a checkpoint after every epoch, stopped once the first one exists by `signal` to rank 1.
struct Interrupted {
  int exit = 0;
  double seconds = 0;
  std::string log;
};
Interrupted interrupt_rank1(const std::string& out, int signal, const std::string& extra) {
  fs::create_directories(out);
  const std::string log = out + "/../job.log";
  const pid_t job = start(mpirun(2) + DFP_CLI + " " + train_args(24, out, extra, 40), log);
  const auto t0 = std::chrono::steady_clock::now();
  while (!fs::exists(out + "/checkpoint.dfp") &&
         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 120)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const pid_t victim = rank_pid(job, 1);
  EXPECT_GT(victim, 0) << "rank 1 not found among mpirun's children";
  if (victim > 0) kill(victim, signal);
  const auto t1 = std::chrono::steady_clock::now();
  Interrupted r;
  r.exit = wait_exit(job, 60);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  if (victim > 0 && signal == SIGSTOP) kill(victim, SIGKILL);
  r.log = dfp::test::slurp(log);
  return r;
}

TEST(Dist, KilledRankEndsTheJobAndTheCheckpointResumesBitForBit) {
  DFP_NEED_MPI();
  DistDir d;
  const std::string out = d.path().string() + "/run", whole = d.path().string() + "/whole";
  const std::string flags = "--schedule constant --allreduce dfp16 --error-feedback";  // per-rank residuals to keep
  const Interrupted r = interrupt_rank1(out, SIGKILL, flags);
  EXPECT_NE(r.exit, 0) << r.log;
  EXPECT_GE(r.exit, 0) << "the job did not end within 60 s of the kill\n" << r.log;
  // Open MPI's mpirun names the rank. MPICH's Hydra ends the job too but names a process ID ("PID
  // 2728 RUNNING AT host"), which is rank 1's or, when rank 0 ended first, rank 0's.
  if (open_mpi()) EXPECT_NE(r.log.find("rank 1"), std::string::npos) << r.log;
  else EXPECT_NE(r.log.find("BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES"), std::string::npos) << r.log;
  const dfp::Checkpoint ck = dfp::read_checkpoint(out + "/checkpoint.dfp");  // intact: it loads (CRC checked)
  EXPECT_EQ(ck.meta.at("ranks"), "2");
  // Another number of ranks, or a lone process, is refused.
  const std::string resume = flags + " --resume " + out + "/checkpoint.dfp";
  Result other = run(mpirun(3) + DFP_CLI + " " + train_args(24, out, resume, 40));
  EXPECT_NE(other.status, 0);
  EXPECT_NE(other.output.find("written by a job of 2 rank(s); this job has 3"), std::string::npos) << other.output;
  other = run(std::string(DFP_CLI) + " " + train_args(24, out, resume, 40));
  EXPECT_NE(other.status, 0);
  EXPECT_NE(other.output.find("resume it with mpirun -np 2"), std::string::npos) << other.output;
  // Resumed with the same N, the run ends with the uninterrupted run's bits.
  const Result resumed = run(mpirun(2) + DFP_CLI + " " + train_args(24, out, resume, 40));
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  const Result uninterrupted = run(mpirun(2) + DFP_CLI + " " + train_args(24, whole, flags, 40));
  ASSERT_EQ(uninterrupted.status, 0) << uninterrupted.output;
  EXPECT_TRUE(same_bits(out + "/checkpoint.dfp", whole + "/checkpoint.dfp")) << "interrupted after epoch "
                                                                              << ck.meta.at("epochs_done");
}

TEST(Dist, StoppedRankEndsTheJobWithinTheTimeoutNamingIt) {
  DFP_NEED_MPI();
  DistDir d;
  const Interrupted r = interrupt_rank1(d.path().string() + "/run", SIGSTOP, "--dist-timeout 3");
  EXPECT_GE(r.exit, 0) << "the job did not end within 60 s of the stop\n" << r.log;
  EXPECT_NE(r.exit, 0) << r.log;
  EXPECT_NE(r.log.find("no answer from rank 1"), std::string::npos) << r.log;
  EXPECT_LT(r.seconds, 3 + 10 + 10) << "timeout + grace + slack";
  dfp::read_checkpoint(d.path().string() + "/run/checkpoint.dfp");
}

// A rank started from other weights (its own --init-from) is refused naming the rank, rather
// than silently taking rank 0's.
TEST(Dist, RanksStartedFromOtherWeightsAreRefused) {
  DFP_NEED_MPI();
  DistDir d;
  const std::string dfp = DFP_CLI, out = d.path().string() + "/run", init = d.path().string() + "/init";
  const Result w = run(dfp + " " + train_args(24, init, "", 1));
  ASSERT_EQ(w.status, 0) << w.output;
  const Result r = run(mpirun(1) + dfp + " " + train_args(24, out) + " : -np 1 " + dfp + " " +
                       train_args(24, out, "--init-from " + init + "/checkpoint.dfp"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("rank 1 starts from other weights than rank 0 (flag --init-from"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out + "/checkpoint.dfp"));
  const Result same = run(mpirun(2) + dfp + " " + train_args(24, out, "--init-from " + init + "/checkpoint.dfp"));
  EXPECT_EQ(same.status, 0) << same.output;
}

}  // namespace

// A job's refusal is printed once, not once per rank, and without the command named twice: a flag
// out of range (read before the ranks join), a batch that does not divide by the ranks (refused
// as they join), an unknown flag, and data or a model that no rank can load.
TEST(Dist, RefusalsArePrintedOnce) {
  DFP_NEED_MPI();
  DistDir d;
  const std::string out = d.path().string() + "/run";
  auto count = [](const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {train_args(24, out, "--epochs 0"), "flag --epochs: expected >= 1, got 0"},
      {train_args(32, out), "expected a multiple of 3"},
      {train_args(24, out, "--bogus"), "unknown flag '--bogus'"},
      // Every rank reads the data: a wrong --data fails them all, and the job says it once.
      {train_args(24, out, "--dataset mnist --image-size 0 --data /nonexistent-dfp-data"), "'/nonexistent-dfp-data' does not exist"},
      {train_args(24, out, "--model bogus"), "unknown model 'bogus'"},
  };
  for (const auto& [args, message] : cases) {
    const Result r = run(mpirun(3) + DFP_CLI + " " + args);
    EXPECT_NE(r.status, 0) << args;
    EXPECT_EQ(count(r.output, message), 1u) << args << ":\n" << r.output;
    EXPECT_EQ(r.output.find("dfp train: dfp train"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("invalid argument: dfp train:"), std::string::npos) << r.output;
  }
}

// Under mpirun each rank writes into a pseudo-terminal of the launcher's, even when the job's
// output goes to a file: the progress comes as whole lines (no carriage returns), with the job's
// images per second, and names the loss and top-1 as rank 0's part of the batch.
TEST(Dist, ProgressUnderTheLauncherIsWholeLinesOfTheJob) {
  DFP_NEED_MPI();
  DistDir d;
  const Result r = run(mpirun(2) + DFP_CLI + " " + train_args(24, d.path().string() + "/run", "--print-every 2", 1));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.find('\r'), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(rank 0's part)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("epoch 1/1 done"), std::string::npos) << r.output;
}
