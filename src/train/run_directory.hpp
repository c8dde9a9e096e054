// A run's directory and checkpoints: the lock on --out, the files a run writes there (run.toml,
// config.json, metrics.jsonl, checkpoint.dfp, as src/train/run_files.hpp defines them), and a
// resume from a checkpoint (its settings compared with this run's, the model, optimizer, loss
// scaler and step restored). Checkpoints of finished runs are read by evaluate_checkpoint too.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "dfp/data.hpp"
#include "dfp/model.hpp"
#include "dfp/optim.hpp"
#include "dfp/precision.hpp"
#include "dfp/run_lock.hpp"
#include "dfp/trainer.hpp"
#include "src/io/checkpoint.hpp"

namespace dfp {

struct TrainingRun;

// Model state (src/io/state.hpp) and the optimizer's momentum <-> checkpoint tensors, with every
// mismatch named. `sgd` null: the model alone. save_model borrows the model's tensors and the
// momenta (Checkpoint::borrowed): write ck before the next step changes them.
void save_model(Model& m, const PrecisionPolicy& policy, Sgd* sgd, Checkpoint& ck);
void load_model(Model& m, Sgd* sgd, const Checkpoint& ck, const std::string& path);

// Checkpoint meta fields, read with their checks: Error(corrupt_data) naming the file and field.
std::string meta_get(const Checkpoint& ck, const std::string& key, const std::string& path);
int64_t meta_int(const Checkpoint& ck, const std::string& key, const std::string& path, int64_t lo, int64_t hi);
double meta_real(const Checkpoint& ck, const std::string& key, const std::string& path, double lo, double hi);
PrecisionPolicy get_policy(const Checkpoint& ck, const std::string& path);

// The data a checkpoint was trained on: channels, height, width, classes and (image folders) the
// class names, as the checkpoint records them.
struct DataShape {
  int channels = 0, height = 0, width = 0, classes = 0;
  std::vector<std::string> class_names;  // empty when not recorded (formats with numbered classes)
};
DataShape get_shape(const Checkpoint& ck, const std::string& path);
// Requires `d` (`split` of the run's data) to be the data the checkpoint was trained on: a model
// built for other images cannot read these, and other class names would score every answer
// against the wrong labels. Error(invalid_argument) naming the first difference.
void check_shape(const DataShape& s, const Dataset& d, const std::string& split, const std::string& path);

// Where a run starts: after the epochs its --resume checkpoint holds (0 without one).
struct ResumePoint {
  int start_epoch = 0;
  // A run resumed with a larger --epochs: "E:N" items, from E epochs done on the schedule spanned
  // N epochs ("0:10,10:20"); empty for a run that kept its --epochs.
  std::string epochs_plan;
  bool finished = false;  // the checkpoint holds every epoch: nothing to train
};
// Reads run.cfg.resume (when set): refuses a checkpoint of other settings or data, and restores
// the model, the optimizer, the loss scaler, the step counter and the job's part of it.
ResumePoint resume(TrainingRun& run);

// The run's directory (--out; none on the ranks other than 0). Taken before anything is read
// there, so that another run cannot write a newer checkpoint between this one's resume and its
// first write.
class RunDirectory {
 public:
  explicit RunDirectory(const std::string& dir);
  bool writes() const noexcept { return !dir_.empty(); }
  // Refuses a directory that holds another run (unless --overwrite), then writes run.toml and
  // config.json and opens metrics.jsonl, continued from `from` when resuming.
  void start(const TrainingRun& run, const ResumePoint& from);
  void append_metrics(const std::string& line);
  // The checkpoint after `epochs_done` epochs: meta (settings, data shape, loss scaler, step) and
  // the model and optimizer state. The job adds its part before it is written.
  Checkpoint checkpoint(TrainingRun& run, int epochs_done, int step, const std::string& epochs_plan) const;
  void write(const Checkpoint& ck) const;
  std::string path(const char* file) const { return dir_ + "/" + file; }

 private:
  std::string dir_;
  std::unique_ptr<RunLock> lock_;
  std::ofstream metrics_;
};

}  // namespace dfp
