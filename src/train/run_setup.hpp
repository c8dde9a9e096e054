// A training run's parts, set up from its TrainConfig: the context, the data and its loaders, the
// model, the optimizer, the loss scaler and the learning-rate schedule, and, in a data-parallel
// job, this rank's place in it. The settings that decide the result are listed once here
// (`Setting`): the checkpoint stores them, config.json lists them, a resume compares them.
#pragma once

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/data.hpp"
#include "dfp/loss_scale.hpp"
#include "dfp/model.hpp"
#include "dfp/optim.hpp"
#include "dfp/trainer.hpp"
#include "src/parallel/job.hpp"
#include "src/train/run_files.hpp"

namespace dfp {

inline std::string fmt_g(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}
// Round-trips exactly (the checkpointed loss scale).
inline std::string fmt_exact(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}
// A float as the shortest text that reads back as the same float ("0.1", not 0.1f's 17 digits).
inline std::string fmt_float(float v) {
  char b[32];
  return {b, std::to_chars(b, b + sizeof b, v).ptr};
}

// A setting of a run, as text (floats exactly): a checkpoint stores it and config.json lists it.
struct Setting {
  enum Kind { text, literal, real };  // a JSON string; a JSON number or literal; a float
  const char* key;   // checkpoint field and config.json key
  const char* flag;  // the dfp train flag that sets it
  std::string value;
  Kind kind;
  // In every checkpoint dfp wrote, so one without it is corrupt; the newer settings, when absent,
  // are noted as unchecked.
  bool required = false;
  const char* json_key = nullptr;  // config.json's key where it differs from the checkpoint's

  // Whether a checkpoint's text of this setting is this run's. Floats compare as values: a
  // checkpoint may spell one with every digit (the builds before fmt_float wrote %.17g).
  bool matches(const std::string& stored) const {
    return kind == real ? std::strtof(stored.c_str(), nullptr) == std::strtof(value.c_str(), nullptr) : stored == value;
  }
  // Adds the setting to config.json's members: a string, or its text as a JSON literal.
  void add_to(run_files::ConfigRecord& config) const {
    if (kind == text) config.add_string(json_key ? json_key : key, value);
    else config.add_literal(json_key ? json_key : key, value);
  }
};

// The settings that decide a run's result. --resume refuses a checkpoint written with other
// values: the continued run would not be the uninterrupted one. Not among them: where the data
// lives, where the run computes (machine_settings), and what is only logged or measured
// (--limit-test, --print-every, --numerics-every, --profile, --out).
std::vector<Setting> result_settings(const TrainConfig& c, const std::string& policy_text);
// Where the run computes: recorded like the settings above, but a resume that differs is only
// noted (the FP32 library operators may round differently; dfp's own kernels give the same bits).
std::vector<Setting> machine_settings(const Context& ctx);

// The augmentation and normalisation a dataset trains (or tests) with.
AugmentOptions augment_for(const Dataset& d, bool train, bool augment);

// The run's parts, made in the order that fixes its bits: context, data, model (built for each
// rank's part of the batch), optimizer, --init-from weights, loaders, schedule; then the job's
// start-up (the same run on every rank, rank 0's initial weights everywhere).
struct TrainingRun {
  TrainingRun(const TrainConfig& config, parallel::Job* job, const std::function<void(const std::string&)>& log);
  TrainingRun(const TrainingRun&) = delete;
  TrainingRun& operator=(const TrainingRun&) = delete;

  void say(const std::string& text) const {
    if (log) log(text);
  }
  // Rank 0 (or a lone process): logs and writes the run's files.
  bool lead() const noexcept { return !job || job->rank() == 0; }
  int ranks() const noexcept { return job ? job->size() : 1; }

  const TrainConfig config;  // as given
  TrainConfig cfg;           // as this rank runs it: `out` empty on the ranks other than 0
  parallel::Job* const job;  // null: a lone process
  const std::function<void(const std::string&)> log;  // null on the ranks other than 0
  const bool on_cuda;        // --device cuda: the same model, data and loop on the GPU
  std::string policy_text;   // the precision as the metrics and checkpoints record it
  Context ctx;
  Dataset train_set, test_set;
  std::unique_ptr<Model> model;
  std::unique_ptr<Sgd> sgd;
  LossScaler scaler;
  std::unique_ptr<Loader> train_loader, test_loader;
  LrSchedule sched;
  std::vector<Setting> settings, machine;
  // The job's gradient reducer hooks into the model: detached before the model goes.
  std::optional<parallel::Job::Attachment> attached;
};

}  // namespace dfp
