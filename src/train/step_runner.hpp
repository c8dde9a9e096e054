// How a training run computes its steps: on the CPU model, on the CUDA device, or as one rank of
// a data-parallel job (the CPU step with the gradient allreduce, and the epoch's metrics summed
// over the ranks). The training loop (trainer.cpp) is the same for all three.
#pragma once

#include <memory>

#include "dfp/data.hpp"
#include "dfp/model.hpp"
#include "src/io/checkpoint.hpp"
#include "src/train/profile.hpp"

namespace dfp {

struct TrainingRun;

// Sums of a pass's batches: loss (times images), top-1 and top-5 hits, images.
struct Totals {
  double loss = 0;
  long c1 = 0, c5 = 0, n = 0;
  void add(const StepResult& r) { loss += r.loss * r.count; c1 += r.correct1; c5 += r.correct5; n += r.count; }
  void add(const Totals& t) { loss += t.loss; c1 += t.c1; c5 += t.c5; n += t.n; }
};

// The test split through the model (inference), from its first batch.
Totals evaluate(Model& m, Loader& loader);

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  // One training step on batch `b` at learning rate `lr`: forward, backward, and the update when
  // the loss scaler finds the gradients finite (otherwise the step is skipped and the scale drops).
  virtual Totals train_step(const Batch& b, float lr) = 0;
  // The test split: the whole job's totals.
  virtual Totals evaluate_test() = 0;
  // The epoch's training totals over the job (in place), before its metrics are taken.
  virtual void end_epoch(Totals& train, int epoch) { (void)train, (void)epoch; }
  // Before a checkpoint is made: the host model holds the weights the run trained.
  virtual void sync_host_model() {}
  // The runner's part of a checkpoint (the job's ranks and residuals). Every rank calls it once
  // per checkpoint, rank 0 with the checkpoint it writes, the others with an empty one.
  virtual void add_to_checkpoint(Checkpoint& ck) { (void)ck; }
  // The per-step profile's communication part, at the end of a profiled run.
  virtual void add_to_profile(StepProfile& p) const { (void)p; }
};

// The runner for `run`: CUDA for --device cuda, data-parallel for a job's rank, else the CPU
// model. With `profile`, the CPU step's times add into it.
std::unique_ptr<StepRunner> make_step_runner(TrainingRun& run, StepProfile* profile);

}  // namespace dfp
