// Crash safety of `dfp train`: the program is killed with SIGKILL at many points (spread over the
// run's time, on the creation of each checkpoint's temporary file, and right after each
// metrics.jsonl line) and then resumed to the end. After every kill the last checkpoint loads;
// after the resumed run the checkpoint is the uninterrupted run's byte for byte, no temporary file
// is left, and metrics.jsonl holds each epoch once, with the uninterrupted run's losses.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "src/io/checkpoint.hpp"
#include "src/train/run_files.hpp"
#include "tests/common/files.hpp"
#include "tests/common/temp_dir.hpp"

namespace fs = std::filesystem;

namespace {

// Under a sanitizer every step is several times slower: fewer kill points keep the suite's time.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int kTimedKills = 3;
#else
constexpr int kTimedKills = 10;
#endif
constexpr int kEpochs = 3;

using dfp::test::lines_of;
using dfp::test::slurp;

void put_be32(std::string& v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(char(uint8_t(x >> s)));
}

// An MNIST-style directory of 28x28 images, labels i % 10.
void write_mnist(const std::string& dir, int train, int test) {
  fs::create_directories(dir);
  auto write = [&](const std::string& prefix, int count) {
    std::string img, lbl;
    put_be32(img, 0x803);
    put_be32(img, uint32_t(count));
    put_be32(img, 28);
    put_be32(img, 28);
    put_be32(lbl, 0x801);
    put_be32(lbl, uint32_t(count));
    for (int i = 0; i < count; ++i) {
      for (int k = 0; k < 784; ++k) img.push_back(char(uint8_t(k % 28 == (i % 10) * 2 ? 220 : (i * 7 + k) % 50)));
      lbl.push_back(char(i % 10));
    }
    std::ofstream(dir + "/" + prefix + "-images-idx3-ubyte", std::ios::binary) << img;
    std::ofstream(dir + "/" + prefix + "-labels-idx1-ubyte", std::ios::binary) << lbl;
  };
  write("train", train);
  write("t10k", test);
}

// When the parent kills the child.
struct KillAt {
  double seconds = -1;       // this long after the start, or
  int temporary = 0;         // on the creation of the n-th checkpoint temporary file (1-based), or
  int metrics_write = 0;     // right after the n-th write to metrics.jsonl
  std::string describe() const {
    if (seconds >= 0) return "kill after " + std::to_string(seconds) + " s";
    if (temporary) return "kill on checkpoint temporary file " + std::to_string(temporary);
    return "kill after metrics write " + std::to_string(metrics_write);
  }
};

// Runs `dfp train` with `args` into `out` (which must exist), killing it as `kill` says (nullptr:
// never). Returns true when the program exited 0, false when it was killed; fails the test when it
// exited otherwise.
bool run_train(const std::vector<std::string>& args, const std::string& out, const KillAt* kill_at) {
  const int ino = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  EXPECT_GE(ino, 0);
  EXPECT_GE(inotify_add_watch(ino, out.c_str(), IN_CREATE | IN_MODIFY), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    const int log = ::open((out + "/train.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(log, STDOUT_FILENO);
    dup2(log, STDERR_FILENO);
    std::vector<std::string> argv = {DFP_CLI, "train"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> a;
    for (std::string& s : argv) a.push_back(s.data());
    a.push_back(nullptr);
    execv(a[0], a.data());
    _exit(127);
  }
  const auto t0 = std::chrono::steady_clock::now();
  int temporaries = 0, metrics_writes = 0, status = 0;
  bool killed = false;
  for (;;) {
    if (waitpid(pid, &status, WNOHANG) == pid) break;
    pollfd p{ino, POLLIN, 0};
    poll(&p, 1, 2);
    alignas(inotify_event) char buf[4096];
    ssize_t got;
    while ((got = read(ino, buf, sizeof buf)) > 0)
      for (char* e = buf; e < buf + got;) {
        const auto* ev = reinterpret_cast<const inotify_event*>(e);
        const std::string name = ev->len ? ev->name : "";
        if ((ev->mask & IN_CREATE) && name.rfind("checkpoint.dfp.", 0) == 0 && name.size() > 4 &&
            name.compare(name.size() - 4, 4, ".tmp") == 0)
          ++temporaries;
        if ((ev->mask & IN_MODIFY) && name == "metrics.jsonl") ++metrics_writes;
        e += sizeof(inotify_event) + ev->len;
      }
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (kill_at && !killed &&
        ((kill_at->seconds >= 0 && el >= kill_at->seconds) || (kill_at->temporary && temporaries >= kill_at->temporary) ||
         (kill_at->metrics_write && metrics_writes >= kill_at->metrics_write))) {
      ::kill(pid, SIGKILL);
      killed = true;
    }
    if (el > 300) {
      ::kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      close(ino);
      ADD_FAILURE() << "dfp train took more than 300 s";
      return true;  // not a planned kill: the caller goes on to its checks, which then fail
    }
  }
  close(ino);
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) return false;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << "\n" << slurp(out + "/train.log");
  return true;
}

}  // namespace

TEST(CrashSafety, KilledRunsResumeToTheUninterruptedResult) {
  const dfp::test::TempDir dir("dfp_crash_test_");
  const std::string data = dir.file("data");
  write_mnist(data, 640, 64);
  const std::vector<std::string> common = {"--model", "lenet", "--dataset", "mnist", "--data", data, "--precision", "int16",
                                           "--gradients-rounding", "stochastic", "--epochs", std::to_string(kEpochs),
                                           "--batch-size", "16", "--lr", "0.05", "--threads", "2", "--seed", "5",
                                           "--numerics-every", "7"};
  auto with = [&](const std::vector<std::string>& more) {
    std::vector<std::string> a = common;
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  const std::string ref = dir.file("ref");
  fs::create_directories(ref);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(run_train(with({"--out", ref}), ref, nullptr));
  const double run_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string ref_checkpoint = slurp(ref + "/checkpoint.dfp");
  const std::vector<std::string> ref_metrics = lines_of(ref + "/metrics.jsonl");
  ASSERT_EQ(ref_metrics.size(), size_t(kEpochs));

  std::vector<KillAt> kills;
  for (int i = 0; i < kTimedKills; ++i) kills.push_back(KillAt{run_seconds * (i + 0.5) / kTimedKills});
  for (int e = 1; e <= kEpochs; ++e) kills.push_back(KillAt{-1, e, 0});
  for (int e = 1; e <= kEpochs; ++e) kills.push_back(KillAt{-1, 0, e});
  int trial = 0, left_temporary = 0, metrics_ahead = 0;
  for (const KillAt& k : kills) {
    SCOPED_TRACE(k.describe());
    const std::string out = dir.file("run" + std::to_string(trial++));
    fs::create_directories(out);
    const std::string checkpoint = out + "/checkpoint.dfp";
    bool finished = run_train(with({"--out", out}), out, &k);
    // What the kill left: a temporary file (killed inside a checkpoint write), a metrics line of
    // an epoch the checkpoint does not hold (killed between the two writes).
    for (const auto& e : fs::directory_iterator(out)) left_temporary += e.path().extension() == ".tmp";
    if (!finished) {
      const int done = fs::exists(checkpoint) ? std::stoi(dfp::read_checkpoint(checkpoint).meta.at("epochs_done")) : 0;
      metrics_ahead += int(lines_of(out + "/metrics.jsonl").size()) > done;
    }
    // Relaunched until it finishes: from the checkpoint when there is one, else from the start.
    for (int launch = 0; !finished && launch < 3; ++launch) {
      std::vector<std::string> again = {"--out", out};
      if (fs::exists(checkpoint)) {
        // The checkpoint that survived the kill is whole.
        const dfp::Checkpoint ck = dfp::read_checkpoint(checkpoint);
        const int done = std::stoi(ck.meta.at("epochs_done"));
        EXPECT_GE(done, 1);
        EXPECT_LE(done, kEpochs);
        if (done == kEpochs) break;  // killed after its last checkpoint: the run is complete
        again.insert(again.end(), {"--resume", checkpoint});
      } else {
        again.push_back("--overwrite");
      }
      finished = run_train(with(again), out, nullptr);
    }
    EXPECT_EQ(slurp(checkpoint), ref_checkpoint) << "the resumed run's checkpoint differs from the uninterrupted run's";
    for (const auto& e : fs::directory_iterator(out))
      EXPECT_NE(e.path().extension(), ".tmp") << e.path() << " left behind";
    const std::vector<std::string> metrics = lines_of(out + "/metrics.jsonl");
    ASSERT_EQ(metrics.size(), size_t(kEpochs)) << slurp(out + "/metrics.jsonl");
    for (int e = 0; e < kEpochs; ++e) {
      namespace rf = dfp::run_files;
      const rf::EpochRecord got = rf::parse_epoch_line(metrics[size_t(e)], out + "/metrics.jsonl", e + 1);
      const rf::EpochRecord want = rf::parse_epoch_line(ref_metrics[size_t(e)], ref + "/metrics.jsonl", e + 1);
      EXPECT_EQ(got.epoch, e + 1);
      EXPECT_EQ(got.train_loss, want.train_loss) << "train_loss of epoch " << e + 1;
      EXPECT_EQ(got.test_top1, want.test_top1) << "test_top1 of epoch " << e + 1;
      EXPECT_EQ(got.test_loss, want.test_loss) << "test_loss of epoch " << e + 1;
      EXPECT_EQ(got.lr, want.lr) << "lr of epoch " << e + 1;
    }
  }
  std::printf("%zu kills: %d left a checkpoint temporary file, %d a metrics line ahead of the checkpoint\n",
              kills.size(), left_temporary, metrics_ahead);
}
