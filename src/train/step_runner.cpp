// The three ways a training step runs (src/train/step_runner.hpp).
#include "src/train/step_runner.hpp"

#include <chrono>

#include "dfp/cuda.hpp"
#include "src/parallel/job.hpp"
#include "src/train/run_setup.hpp"

namespace dfp {
namespace {

// The CPU model: forward, backward at the loss scale of the step, the update when the scaler
// finds the gradients finite.
class CpuSteps : public StepRunner {
 public:
  CpuSteps(TrainingRun& run, StepProfile* profile) : run_(run), profile_(profile) {}

  Totals train_step(const Batch& b, float lr) override {
    Model& m = *run_.model;
    const auto step_t0 = profile_ ? StepClock::now() : StepClock::time_point{};
    begin_step(m);
    Totals t;
    t.add(m.forward(b.images, b.labels, b.size, true));
    m.set_loss_scale(run_.scaler.scale());
    const bool finite = finish_backward(m.backward());
    const auto opt_t0 = profile_ ? StepClock::now() : StepClock::time_point{};
    if (run_.scaler.update(finite)) run_.sgd->step(lr);
    if (profile_) {
      profile_->optimizer_seconds += seconds_since(opt_t0);
      profile_->step_seconds += seconds_since(step_t0);
      ++profile_->steps;
    }
    return t;
  }
  Totals evaluate_test() override { return evaluate(*run_.model, *run_.test_loader); }

 protected:
  virtual void begin_step(Model&) {}
  // The gradients' verdict: finite or not.
  virtual bool finish_backward(bool finite) { return finite; }
  TrainingRun& run_;
  StepProfile* profile_;
};

// One rank of a data-parallel job: each step averages the gradients over the ranks before the
// update (GradientReducer), and the epoch's metrics are the job's.
class DataParallelSteps : public CpuSteps {
 public:
  DataParallelSteps(TrainingRun& run, StepProfile* profile) : CpuSteps(run, profile), job_(*run.job) {}

  Totals evaluate_test() override {
    Totals te = CpuSteps::evaluate_test();
    double sums[4] = {te.loss, double(te.c1), double(te.c5), double(te.n)};
    job_.sum(sums, 4);
    te.loss = sums[0], te.c1 = long(sums[1]), te.c5 = long(sums[2]), te.n = long(sums[3]);
    return te;
  }
  void end_epoch(Totals& tr, int epoch) override {
    job_.sum(&tr.loss, 1);  // the epoch's totals over the ranks' parts
    double counts[3] = {double(tr.c1), double(tr.c5), double(tr.n)};
    job_.sum(counts, 3);
    tr.c1 = long(counts[0]), tr.c5 = long(counts[1]), tr.n = long(counts[2]);
    job_.broadcast_buffers(*run_.model);  // one model evaluated and checkpointed: rank 0's running statistics
    job_.check_same_weights(*run_.model, epoch + 1);
  }
  void add_to_checkpoint(Checkpoint& ck) override { job_.put_checkpoint(ck); }
  void add_to_profile(StepProfile& p) const override {
    const parallel::CommStats& cs = job_.stats();
    p.ranks = job_.size();
    p.allreduce = job_.allreduce();
    p.comm_bytes = cs.bytes;
    p.comm_fp32_bytes = cs.fp32_bytes;
    p.comm_in_flight_seconds = cs.in_flight_seconds;
    p.comm_exposed_seconds = cs.exposed_seconds;
  }

 private:
  void begin_step(Model& m) override { job_.begin_step(m.step()); }
  bool finish_backward(bool finite) override { return job_.finish(finite); }  // the mean gradient, every rank's verdict
  parallel::Job& job_;
};

// --device cuda: the same model on the GPU (CudaModel); the host model keeps the FP32 parameters
// that checkpoints read, refreshed before each checkpoint.
class CudaSteps : public StepRunner {
 public:
  explicit CudaSteps(TrainingRun& run)
      : run_(run),
        cuda_(run.ctx, *run.model, run.cfg.policy.precision,
              SgdOptions{run.cfg.momentum, run.cfg.weight_decay, run.cfg.nesterov}, &run.sgd->momentum_buffers(),
              CudaOptions{run.cfg.cudnn_benchmark}) {
    run.say("device cuda: " + cuda_.describe());
  }
  Totals train_step(const Batch& b, float lr) override {
    Totals t;
    t.add(cuda_.train_step(b.images, b.labels, b.size, lr, run_.scaler));  // runs scaler.update
    return t;
  }
  Totals evaluate_test() override {
    Totals t;
    Loader& loader = *run_.test_loader;
    loader.start_epoch(0);
    Batch b;
    while (loader.next(b)) t.add(cuda_.evaluate(b.images, b.labels, b.size));
    return t;
  }
  void sync_host_model() override { cuda_.download(*run_.model, &run_.sgd->momentum_buffers()); }

 private:
  TrainingRun& run_;
  CudaModel cuda_;
};

}  // namespace

Totals evaluate(Model& m, Loader& loader) {
  Totals t;
  loader.start_epoch(0);
  Batch b;
  while (loader.next(b))
    if (b.size > 0) t.add(m.forward(b.images, b.labels, b.size, false));  // a shard's part may be empty
  return t;
}

std::unique_ptr<StepRunner> make_step_runner(TrainingRun& run, StepProfile* profile) {
  if (run.on_cuda) return std::make_unique<CudaSteps>(run);
  if (run.job) return std::make_unique<DataParallelSteps>(run, profile);
  return std::make_unique<CpuSteps>(run, profile);
}

}  // namespace dfp
