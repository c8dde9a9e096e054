// A data-parallel training job as the trainer sees it (src/train/run_setup.cpp and
// step_runner.cpp): this process's rank among the job's, the start-up agreement (same flags, data
// and program everywhere, the same initial weights), the gradient reducer of each step, the
// reductions of the epoch's metrics, and the per-rank state a checkpoint keeps. A lone process (no
// launcher, or one rank) has no Job and trains exactly as before. docs/design/distributed.md
// describes the whole.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dfp/trainer.hpp"
#include "src/parallel/comm.hpp"
#include "src/parallel/data_parallel.hpp"

namespace dfp {
struct Checkpoint;
struct Dataset;
}  // namespace dfp

namespace dfp::parallel {

class Job {
 public:
  // Null when the launcher started one process (or none): the run trains alone. Otherwise joins
  // the job; refuses (the same Error on every rank) a batch that does not divide by the number of
  // ranks, --device cuda, and any run in a build without MPI.
  static std::unique_ptr<Job> join(const TrainConfig& config);
  ~Job();

  int rank() const noexcept { return comm_->rank(); }
  int size() const noexcept { return comm_->size(); }
  const std::string& allreduce() const noexcept { return allreduce_; }
  // Whether the error being thrown is one every rank throws alike (a refusal at start-up): the job
  // then ends normally; any other error on one rank ends the job on every rank (abort).
  bool agreed() const noexcept { return agreed_; }
  [[noreturn]] void abort(const std::string& message) { comm_->abort(message); }

  // The ranks' start-up (reading the data, building the model) compared: when any rank failed
  // (`error` set), every rank throws a RefusalOfEveryRank, reported by the first rank that failed
  // with that message and by each rank whose message differs; the ranks that did not fail end
  // without a word. Collective: every rank calls it once.
  void agree_on_start(const Error* error);
  // Refuses ranks whose settings, data or program differ from rank 0's (a digest of each,
  // compared across ranks), naming the ranks and what differs.
  void check_same_run(const std::string& settings, const Dataset& train, const Dataset& test);
  // Rank 0's parameters and buffers to every rank (the same initial weights everywhere), after
  // checking that every rank starts from the weights rank 0 has (the same --init-from file).
  void broadcast_state(Model& m);
  // Rank 0's BatchNorm running statistics to every rank (before evaluation and checkpoints, so
  // that every rank evaluates, and the checkpoint holds, one model).
  void broadcast_buffers(Model& m);
  // The step's gradient allreduce (GradientReducer), made on first use.
  void attach(const Context& ctx, Model& m, const TrainConfig& config);
  void detach() noexcept;
  // Detaches the job (if any) from the model when it goes out of scope.
  struct Attachment {
    Job* job;
    explicit Attachment(Job* j) : job(j) {}
    ~Attachment() { if (job) job->detach(); }
    Attachment(const Attachment&) = delete;
    Attachment& operator=(const Attachment&) = delete;
  };
  void begin_step(uint64_t step) { reducer_->begin_step(step); }
  bool finish(bool local_finite) { return reducer_->finish(local_finite); }
  const CommStats& stats() const noexcept { return reducer_->stats(); }
  // Refuses to go on when the ranks' weights differ after `epoch` (a digest compared across the
  // ranks): the allreduce gave the ranks different sums, and the job would train N models.
  void check_same_weights(Model& m, int epoch);
  // Sums over the ranks, in place.
  void sum(double* values, int count);

  // What a checkpoint needs beyond rank 0's model: the number of ranks and the allreduce, and each
  // rank's error-feedback residual (gathered to rank 0). Collective: every rank calls it.
  void put_checkpoint(Checkpoint& ck);
  // Refuses a checkpoint of another number of ranks or allreduce, and restores this rank's
  // residual. A lone process calls check_lone_resume instead.
  void get_checkpoint(const Checkpoint& ck, const std::string& path);
  static void check_lone_resume(const Checkpoint& ck, const std::string& path);

 private:
  Job(std::unique_ptr<Comm> comm, const TrainConfig& config);
  [[noreturn]] void refuse(const std::string& message);
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<GradientReducer> reducer_;
  Model* model_ = nullptr;  // attached: its gradient hook, statistics sum and batch offset are the job's
  std::string allreduce_;
  bool error_feedback_ = false;
  bool sync_bn_ = false;
  bool agreed_ = false;
};

}  // namespace dfp::parallel
