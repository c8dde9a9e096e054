// dfp: the training loop behind `dfp train` and `dfp eval`.
//
// One readable loop: data -> forward -> loss -> backward -> optimizer step (which re-quantizes and
// re-packs the weights). Per epoch it evaluates on the test set and appends one JSON object to
// <out>/metrics.jsonl (non-finite numbers as null), then writes a checkpoint (<out>/checkpoint.dfp,
// written to a temporary file of its own and renamed, CRC-32 checked on load); it writes
// <out>/config.json once. A run owns <out> while it lives (an exclusive lock on <out>/dfp.lock: a
// second run into it is refused with the holder's PID). A resumed run first cuts metrics.jsonl
// back to the checkpoint's epochs, so that each epoch appears in it once.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dfp/cuda.hpp"
#include "dfp/loss_scale.hpp"
#include "dfp/model.hpp"
#include "dfp/status.hpp"

namespace dfp {

struct TrainConfig {
  std::string model = "resnet20";
  std::string dataset = "fashion-mnist";
  std::string data;                 // dataset directory ("" = the dataset's default)
  int image_size = 0;               // imagenet-folder: side of the square input (0 = 224)
  PrecisionPolicy policy;
  LossScaleOptions loss_scale;      // mode none by default; fp16 runs (CPU or cuda) usually want dynamic
  int numerics_interval = 50;       // sample per-layer rounding statistics every N steps (0: never)
  std::string label;                // name of this run in comparisons ("" = the precision)
  int epochs = 10;
  int batch_size = 128;
  float lr = 0.1f;
  float momentum = 0.9f;
  float weight_decay = 5e-4f;
  bool nesterov = false;
  std::string schedule = "cosine";  // constant, step, multistep, cosine
  int warmup_epochs = 0;
  std::vector<int> milestones;      // multistep, in epochs
  int step_epochs = 30;             // step
  float gamma = 0.1f;
  float label_smoothing = 0.f;
  bool augment = true;              // pad+crop and flip for CIFAR, RandomResizedCrop and flip for
                                    // imagenet-folder; normalisation always
  int threads = 0;
  int workers = 0;                  // loader threads decoding and augmenting batches (0 = threads)
  std::string isa;
  uint64_t seed = 1;
  std::string out;                  // "" = no files
  // A directory that already holds a run (holds_run) is refused unless resume is set or this is
  // true (its files are then replaced). The files of a run that finished no epoch (no checkpoint)
  // are no run: a new run takes the directory over, saying so in its log.
  bool overwrite = false;
  std::string resume;               // checkpoint to continue from
  // Weights to start from (not read when resuming): a torch.save'd state_dict (torchvision names,
  // dfp/torch_state.hpp) or a dfp state file or checkpoint. Every model tensor must be there with
  // its shape, but for those init_skip names (globs on tensor or layer names, left as initialised)
  // and a classifier of another shape (fine-tuning to other classes: kept as initialised, said in
  // the log).
  std::string init_from;
  std::vector<std::string> init_skip;
  int limit_train = 0;              // use only the first N training images (0 = all)
  int limit_test = 0;
  int print_every = 50;             // steps between plain progress lines (non-terminal output)
  int stop_after = 0;               // stop after this many epochs (0 = run all; simulates an interruption)
  // Time each layer's training passes and the optimizer (Model::set_profiling); at the end, log a
  // table per training step and write profile.json to `out`. CPU only.
  bool profile = false;
  // Device: "cpu", or "cuda" (dfp/cuda.hpp; builds with CUDA and a GPU). On cuda the model runs
  // in policy.precision, fp16 (FP16 tensors, FP32 master weights, loss scaling) or fp32 (the GPU
  // baseline, TF32 off); the rest of the policy describes the FP32 host copy used for checkpoints.
  std::string device = "cpu";
  // cuda only: CudaOptions::cudnn_benchmark (measure cuDNN's algorithms at start-up).
  bool cudnn_benchmark = false;
  // Data-parallel training (`mpirun -np N dfp train ...`, builds with MPI; docs/design/distributed.md):
  // each of the N ranks trains on its part of every batch (batch_size / N images; batch_size is
  // the global batch), and the gradients are averaged across the ranks before each step. A lone
  // process ignores these.
  std::string allreduce = "fp32";  // the gradients' format on the wire: fp32, bf16 or dfp16
  bool error_feedback = false;     // dfp16: each rank keeps its rounding error for the next step
  bool sync_bn = false;            // BatchNorm statistics over the job's batch (else each rank's own)
  int bucket_kib = 512;            // FP32 KiB of gradients per allreduce bucket
  double dist_timeout = 300;       // seconds a rank waits for the others before the job is ended
};

// The command-line flags that make up TrainConfig::policy, as errors about the policy name them.
inline constexpr const char* kPolicyFlags = "flags --precision/--override/--headroom/--*-headroom/--*-rounding/--*-format";

// Checks every setting a `dfp train` flag sets, before anything is loaded or written: a value out
// of range throws dfp::Error(invalid_argument) naming the flag, the value and what was expected
// (train() calls it first; `dfp compare` calls it once before starting its runs).
void validate_train_config(const TrainConfig& config);

// The run's precision as a report label: the CPU policy's precision, or "cuda-fp16" / "cuda-fp32".
std::string precision_label(const TrainConfig& config);

struct EpochMetrics {
  int epoch = 0;
  double train_loss = 0, train_top1 = 0;
  double test_loss = 0, test_top1 = 0, test_top5 = 0;
  double images_per_second = 0, data_wait_seconds = 0, epoch_seconds = 0;
  double lr = 0;
  long peak_rss_kib = 0;
  double loss_scale = 1;       // at the end of the epoch
  uint64_t skipped_steps = 0;  // since the start of the run (non-finite gradients)
};

// Whether dir holds an earlier run: a checkpoint.dfp, or the metrics of more than one epoch
// (a run whose checkpoint is gone). The config.json and metrics.jsonl of a run stopped in its
// first epoch are no run: there is nothing to resume, and a new run replaces them.
bool holds_run(const std::string& dir);

// One line of metrics.jsonl, without its newline: the epoch's metrics, the policy and the layers'
// numerics, as JSON. A number that is not finite (a diverged loss, an unmeasurable SQNR) is null.
std::string metrics_line(const EpochMetrics& metrics, const std::string& policy_text,
                         const std::vector<LayerNumerics>& layers);

// Whether this process writes a run's files: a lone process, or rank 0 of a data-parallel job
// (as the launcher's environment numbers the ranks); the other ranks write nothing.
bool writes_run_files() noexcept;
// The number of processes the launcher started (1: a lone process).
int job_ranks() noexcept;
// Whether a launcher (mpirun) started this process, also as the only rank of its job. Its output
// goes through the launcher, which a terminal's in-place redraw does not survive.
bool under_launcher() noexcept;

// An error that every rank of a data-parallel job raises alike: a refusal of the flags or of the
// job's settings. Rank 0 reports it for the job and the other ranks leave it unsaid
// (left_to_rank0()), so that a job of N ranks prints it once. `gathered`: the ranks compared what
// decides it, so it is the same on every rank; otherwise it follows from the command line, and is
// the same on every rank only when one command line started them all.
class RefusalOfEveryRank : public Error {
 public:
  RefusalOfEveryRank(const Error& error, bool gathered);
  // Whether another rank reports it, as the ranks decided together (the first rank that failed
  // with this message reports it; a rank whose message differs reports its own).
  struct Quiet {
    bool another_rank_reports = false;
  };
  RefusalOfEveryRank(const Error& error, Quiet quiet);
  // Whether this process ends without a word: rank 0 (or the rank the ranks chose) reports it.
  bool left_to_rank0() const noexcept { return left_to_rank0_; }

 private:
  bool left_to_rank0_ = false;
};
// Whether this process leaves an error of its command line (a flag's value) to rank 0 to report: a
// rank other than 0 of a job whose ranks were all started with one command line.
bool command_line_errors_left_to_rank0() noexcept;

// Receives each epoch's metrics once the epoch is done (its metrics line and checkpoint written).
using EpochCallback = std::function<void(const EpochMetrics&)>;

// Asked after every training step of a lone process (data-parallel ranks do not ask it): true
// ends the run there. The epoch in progress is dropped, so the run directory keeps the metrics
// and checkpoint of the epochs done and resumes from that checkpoint (the Python binding stops on
// Ctrl-C this way).
using StopCheck = std::function<bool()>;

// Where a run stands after a training step, for a progress display.
struct StepProgress {
  int epoch = 0, epochs = 0;           // the epoch in progress (from 1), of the run's
  int step = 0, steps = 0;             // steps done in this epoch, of the epoch's
  double loss = 0, top1 = 0;           // the epoch's mean so far (top1 in %)
  double images_per_second = 0;        // the job's, over the epoch so far
  double eta_seconds = 0;              // the epoch's remaining time at that rate
  double loss_scale = 0;               // 0: the run has no loss scaling
  bool part_of_job = false;            // data-parallel: loss and top1 are rank 0's part of the batch
};
// The progress line dfp prints: "epoch 2/10 [======      ] 117/468 loss 0.4012 top1 85.31% 790 img/s eta 44s".
std::string progress_text(const StepProgress& progress);
using ProgressCallback = std::function<void(const StepProgress&)>;

// What a run reports as it goes; every member may be left empty.
struct TrainCallbacks {
  std::function<void(const std::string&)> log;  // progress text, one line per call
  EpochCallback on_epoch;
  // Called after every training step (rank 0 of a job only). Empty: `log` receives
  // progress_text every TrainConfig::print_every steps and at each epoch's last step.
  ProgressCallback on_step;
  StopCheck should_stop;
};

// Trains as configured; returns the metrics of every epoch run.
std::vector<EpochMetrics> train(const TrainConfig& config, const TrainCallbacks& callbacks);
// The same with `log` (nullptr: silent), `on_epoch` and `should_stop`.
inline std::vector<EpochMetrics> train(const TrainConfig& config, const std::function<void(const std::string&)>& log,
                                       const EpochCallback& on_epoch = {}, const StopCheck& should_stop = {}) {
  return train(config, TrainCallbacks{log, on_epoch, {}, should_stop});
}

struct EvalResult {
  double loss = 0, top1 = 0, top5 = 0;
  int images = 0;
};
// Evaluates a checkpoint written by train() on its dataset's test split.
EvalResult evaluate_checkpoint(const std::string& checkpoint, const std::string& data_dir, int threads,
                               const std::function<void(const std::string&)>& log);

}  // namespace dfp
