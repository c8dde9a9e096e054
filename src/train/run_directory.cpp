// A run's directory and checkpoints (src/train/run_directory.hpp).
#include "src/train/run_directory.hpp"

#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <utility>

#include "dfp/status.hpp"
#include "src/io/state.hpp"
#include "src/train/profile.hpp"
#include "src/train/run_files.hpp"
#include "src/train/run_setup.hpp"

namespace dfp {
namespace {

void put_shape(Checkpoint& ck, const Dataset& d) {
  ck.meta["channels"] = std::to_string(d.channels);
  ck.meta["height"] = std::to_string(d.height);
  ck.meta["width"] = std::to_string(d.width);
  ck.meta["classes"] = std::to_string(d.classes);
  if (!d.class_names.empty()) ck.meta["class_names"] = join_names(d.class_names);
}

// The files of a run in `dir`, the ones holds_run() looks for.
constexpr const char* kRunFiles[] = {"config.json", "metrics.jsonl", "checkpoint.dfp"};

// Those of kRunFiles present in dir, as "'a', 'b'".
std::string run_files_in(const std::string& dir) {
  std::string found;
  for (const char* f : kRunFiles) {
    std::error_code ec;
    if (std::filesystem::exists(std::filesystem::symlink_status(std::filesystem::path(dir) / f, ec)))
      found += (found.empty() ? "'" : ", '") + std::string(f) + "'";
  }
  return found;
}

// Rewrites metrics.jsonl (when present) to its lines of epochs 1..epochs, in order, each once:
// reading stops at the first line that is not a whole metrics record (a line cut by a kill) or
// whose epoch is not the next one. Written to a temporary file and renamed.
void keep_metrics_through(const std::string& path, int epochs) {
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) return;
  std::string kept, line;
  int next = 1;
  for (int line_no = 1; next <= epochs && std::getline(in, line); ++line_no) {
    if (in.eof()) break;  // no newline: the write of this line was cut
    try {
      if (run_files::parse_epoch_line(line, path, line_no).epoch != next) break;
    } catch (const Error&) {
      break;
    }
    kept += line + "\n";
    ++next;
  }
  in.close();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << kept;
    out.flush();
    DFP_CHECK(out.good(), Status::io_error, "'" + tmp + "': write failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp, ec);
  DFP_CHECK(!ec, Status::io_error, "'" + path + "': cannot replace it with its first " + std::to_string(epochs) +
                                       " epochs: " + ec.message());
}

// What a resume that extends a run of `planned` epochs to `epochs` (after `done`) means for the
// learning rate: only the cosine schedule depends on the number of epochs.
std::string extension_note(const LrSchedule& sched, int done, int planned, int epochs) {
  const std::string from = std::to_string(done + 1), to = std::to_string(epochs);
  const std::string lr = fmt_g(sched.at(done * sched.steps_per_epoch));
  switch (sched.kind) {
    case ScheduleKind::cosine:
      return "the cosine schedule now spans " + to + " epochs, so epochs " + from + "-" + to + " start at lr " + lr +
             " and the rates differ from those of a run planned for " + to + " epochs from the start (its first " +
             std::to_string(done) + " epochs followed a " + std::to_string(planned) + "-epoch schedule); the "
             "checkpoint and config.json record the plan (epochs_plan)";
    case ScheduleKind::constant:
      return "the constant schedule does not depend on --epochs: epochs " + from + "-" + to + " run at lr " + lr;
    case ScheduleKind::step:
    case ScheduleKind::multistep:
      return std::string("the ") + (sched.kind == ScheduleKind::step ? "step" : "multistep") +
             " schedule does not depend on --epochs: epochs " + from + "-" + to + " run at the rates a run planned for " +
             to + " epochs has (lr " + lr + " at epoch " + from + ")";
  }
  return "";
}

}  // namespace

// Delayed FP8 scaling's history of a layer's class: "<layer>.<class>@fp8_amax_history".
const std::string kAmaxHistory = "@fp8_amax_history";

void save_model(Model& m, const PrecisionPolicy& policy, Sgd* sgd, Checkpoint& ck) {
  put_state(ck, m, policy);
  auto& ps = m.parameters();
  for (size_t i = 0; sgd && i < ps.size(); ++i) ck.borrowed[ps[i].name + "@momentum"] = sgd->momentum_buffers()[i];
  for (auto& [key, h] : m.scaling_histories()) ck.tensors[key + kAmaxHistory] = std::move(h);
}

void load_model(Model& m, Sgd* sgd, const Checkpoint& ck, const std::string& path) {
  // The histories first: loading the weights rounds them at the scale their history gives.
  std::map<std::string, std::vector<float>> histories;
  for (const auto& [name, values] : ck.tensors)
    if (name.size() > kAmaxHistory.size() && name.ends_with(kAmaxHistory))
      histories[name.substr(0, name.size() - kAmaxHistory.size())] = values;
  m.set_scaling_histories(histories, "checkpoint '" + path + "'");
  get_state(m, ck, path);
  auto& ps = m.parameters();
  for (size_t i = 0; sgd && i < ps.size(); ++i) {
    const std::string name = ps[i].name + "@momentum";
    auto it = ck.tensors.find(name);
    DFP_CHECK(it != ck.tensors.end(), Status::corrupt_data,
              "checkpoint '" + path + "': tensor '" + name + "' missing (checkpoint of another model?)");
    DFP_CHECK(it->second.size() == ps[i].size, Status::corrupt_data,
              "checkpoint '" + path + "': tensor '" + name + "' has " + std::to_string(it->second.size()) +
                  " values, the model expects " + std::to_string(ps[i].size));
    sgd->momentum_buffers()[i] = it->second;
  }
}

PrecisionPolicy get_policy(const Checkpoint& ck, const std::string& path) {
  return PrecisionPolicy::from_fields(ck.meta, "checkpoint '" + path + "'");
}

std::string meta_get(const Checkpoint& ck, const std::string& key, const std::string& path) {
  auto it = ck.meta.find(key);
  DFP_CHECK(it != ck.meta.end(), Status::corrupt_data, "checkpoint '" + path + "': meta field '" + key + "' missing");
  return it->second;
}

// A meta field that must be a whole integer in [lo, hi].
int64_t meta_int(const Checkpoint& ck, const std::string& key, const std::string& path, int64_t lo, int64_t hi) {
  const std::string v = meta_get(ck, key, path);
  int64_t x = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  DFP_CHECK(ec == std::errc() && end == v.data() + v.size() && x >= lo && x <= hi, Status::corrupt_data,
            "checkpoint '" + path + "': meta field '" + key + "' is '" + v + "'; expected an integer in " +
                std::to_string(lo) + ".." + std::to_string(hi));
  return x;
}

// A meta field that must be a finite number in [lo, hi].
double meta_real(const Checkpoint& ck, const std::string& key, const std::string& path, double lo, double hi) {
  const std::string v = meta_get(ck, key, path);
  char* end = nullptr;
  const double x = v.empty() ? std::nan("") : std::strtod(v.c_str(), &end);
  DFP_CHECK(end && *end == 0 && std::isfinite(x) && x >= lo && x <= hi, Status::corrupt_data,
            "checkpoint '" + path + "': meta field '" + key + "' is '" + v + "'; expected a number in [" + fmt_g(lo) +
                ", " + fmt_g(hi) + "]");
  return x;
}

DataShape get_shape(const Checkpoint& ck, const std::string& path) {
  DataShape s;
  s.channels = int(meta_int(ck, "channels", path, 1, 65536));
  s.height = int(meta_int(ck, "height", path, 1, 65536));
  s.width = int(meta_int(ck, "width", path, 1, 65536));
  s.classes = int(meta_int(ck, "classes", path, 1, 0x7FFFFFFF));
  if (ck.meta.count("class_names")) {
    s.class_names = split_names(ck.meta.at("class_names"), "checkpoint '" + path + "': meta field 'class_names'");
    DFP_CHECK(s.class_names.size() == size_t(s.classes), Status::corrupt_data,
              "checkpoint '" + path + "': meta field 'class_names' lists " + std::to_string(s.class_names.size()) +
                  " names; expected " + std::to_string(s.classes) + " (field 'classes')");
  }
  return s;
}

void check_shape(const DataShape& s, const Dataset& d, const std::string& split, const std::string& path) {
  auto shape = [](int c, int h, int w, int k) {
    return std::to_string(c) + " channel" + (c == 1 ? "" : "s") + " of " + std::to_string(h) + "x" + std::to_string(w) +
           " pixels, " + std::to_string(k) + " classes";
  };
  DFP_CHECK(s.channels == d.channels && s.height == d.height && s.width == d.width && s.classes == d.classes,
            Status::invalid_argument,
            "checkpoint '" + path + "' was trained on " + shape(s.channels, s.height, s.width, s.classes) + ", but the " +
                split + " images '" + d.source + "' have " + shape(d.channels, d.height, d.width, d.classes) +
                "; expected the data the checkpoint was trained on (flag --data)");
  if (s.class_names.empty() || d.class_names.empty()) return;
  for (size_t i = 0; i < s.class_names.size(); ++i)
    DFP_CHECK(s.class_names[i] == d.class_names[i], Status::invalid_argument,
              "checkpoint '" + path + "': class " + std::to_string(i) + " (0-based) is '" + s.class_names[i] +
                  "' in the checkpoint but '" + d.class_names[i] + "' in '" + d.source +
                  "'; expected the class folders the checkpoint was trained on (flag --data)");
}

bool holds_run(const std::string& dir) {
  std::error_code ec;
  const std::filesystem::path d(dir);
  if (std::filesystem::exists(std::filesystem::symlink_status(d / "checkpoint.dfp", ec))) return true;
  // Without a checkpoint no epoch finished: a run writes its epoch's metrics line just before the
  // epoch's checkpoint, so at most the first epoch's line is there. More lines are the record of
  // a run whose checkpoint is gone, which only --overwrite replaces.
  std::ifstream metrics(d / "metrics.jsonl", std::ios::binary);
  std::string line;
  int lines = 0;
  while (lines < 2 && std::getline(metrics, line)) lines += !line.empty();
  return lines > 1;
}

std::string metrics_line(const EpochMetrics& em, const std::string& policy_text, const std::vector<LayerNumerics>& layers) {
  run_files::EpochRecord r;
  r.epoch = em.epoch;
  r.lr = six_digits(em.lr);
  r.train_loss = six_digits(em.train_loss);
  r.train_top1 = six_digits(em.train_top1);
  r.test_loss = six_digits(em.test_loss);
  r.test_top1 = six_digits(em.test_top1);
  r.test_top5 = six_digits(em.test_top5);
  r.images_per_second = six_digits(em.images_per_second);
  r.epoch_seconds = six_digits(em.epoch_seconds);
  r.data_wait_seconds = six_digits(em.data_wait_seconds);
  r.peak_rss_kib = em.peak_rss_kib;
  r.loss_scale = six_digits(em.loss_scale);
  r.skipped_steps = int64_t(em.skipped_steps);
  r.precision_policy = policy_text;
  for (const LayerNumerics& n : layers) {
    run_files::LayerRecord l;
    l.layer = n.layer;
    l.format = n.format;
    if (n.format == "int16" || n.scaled) {
      l.exp_x = n.exp_x;
      l.exp_w = n.exp_w;
      l.exp_dy = n.exp_dy;
    }
    if (n.format == "int16") {
      if (n.exp_x_min) l.exp_x_min = *n.exp_x_min;
      if (n.exp_w_min) l.exp_w_min = *n.exp_w_min;
      if (n.exp_dy_min) l.exp_dy_min = *n.exp_dy_min;
      l.chain_fwd = n.chain_fwd;
      l.chain_bwd = n.chain_bwd;
      l.chain_wgrad = n.chain_wgrad;
      l.saturated = int64_t(n.saturated);
      l.overflow_events = n.overflow_events;
    }
    if (n.sampled) {  // SQNR exactly: an unmeasurable one (no noise, or no signal) is not finite
      l.sqnr_x_db = n.sqnr_x_db;
      l.sqnr_w_db = n.sqnr_w_db;
      l.sqnr_dy_db = n.sqnr_dy_db;
      using N = LayerNumerics;
      using R = run_files::LayerRecord;
      static constexpr std::pair<uint64_t N::*, std::optional<int64_t> R::*> counts[] = {
          {&N::overflow, &R::overflow},         {&N::underflow, &R::underflow},
          {&N::nonzero, &R::nonzero},           {&N::underflow_x, &R::underflow_x},
          {&N::underflow_w, &R::underflow_w},   {&N::underflow_dy, &R::underflow_dy},
          {&N::nonzero_x, &R::nonzero_x},       {&N::nonzero_w, &R::nonzero_w},
          {&N::nonzero_dy, &R::nonzero_dy}};
      for (const auto& [from, to] : counts) l.*to = int64_t(n.*from);
    }
    r.layers.push_back(std::move(l));
  }
  return run_files::to_line(r);
}


ResumePoint resume(TrainingRun& run) {
  ResumePoint at;
  const TrainConfig& cfg = run.cfg;
  if (cfg.resume.empty()) return at;
  const Checkpoint ck = read_checkpoint(cfg.resume);
  // Every setting that decides the result must match; all mismatches are named at once. A
  // checkpoint from before a setting was stored cannot be checked for it: said, not refused.
  std::string differ, unchecked;
  for (const Setting& st : run.settings) {
    const auto it = ck.meta.find(st.key);
    if (it == ck.meta.end()) {
      if (st.required) meta_get(ck, st.key, cfg.resume);  // throws: the checkpoint is corrupt
      unchecked += std::string(unchecked.empty() ? "" : ", ") + st.flag;
    } else if (std::strcmp(st.key, "epochs") == 0) {
      continue;  // a resume may extend the run: checked below
    } else if (!st.matches(it->second))
      differ += std::string(differ.empty() ? "" : "; ") + st.flag + " (field '" + st.key + "'): checkpoint '" +
                it->second + "', this run '" + st.value + "'";
  }
  DFP_CHECK(differ.empty(), Status::invalid_argument,
            "checkpoint '" + cfg.resume + "' was written by a run with other settings: " + differ +
                "; resume with the settings it was written with");
  if (!unchecked.empty()) run.say("note: checkpoint " + cfg.resume + " does not record " + unchecked + "; not checked");
  for (const Setting& st : run.machine)
    if (ck.meta.count(st.key) && !st.matches(ck.meta.at(st.key)))
      run.say(std::string("note: the checkpoint was written with ") + st.key + " " + ck.meta.at(st.key) +
              ", this run uses " + st.value + ": the FP32 library operators may then round differently from an "
              "uninterrupted run");
  const int planned = ck.meta.count("epochs")
                          ? int(meta_int(ck, "epochs", cfg.resume, 1, std::numeric_limits<int>::max()))
                          : cfg.epochs;
  check_shape(get_shape(ck, cfg.resume), run.train_set, "training", cfg.resume);
  at.start_epoch = int(meta_int(ck, "epochs_done", cfg.resume, 1, planned));
  DFP_CHECK(cfg.epochs >= planned, Status::invalid_argument,
            "flag --epochs " + std::to_string(cfg.epochs) + ": checkpoint '" + cfg.resume + "' is of a run of " +
                std::to_string(planned) + " epochs (" + std::to_string(at.start_epoch) +
                " done); expected --epochs " + std::to_string(planned) + " to continue it, or more to extend it "
                "(a resume never shortens a run)");
  if (const auto it = ck.meta.find("epochs_plan"); it != ck.meta.end()) at.epochs_plan = it->second;
  if (planned != cfg.epochs) {
    at.epochs_plan += (at.epochs_plan.empty() ? "0:" + std::to_string(planned) : std::string()) + "," +
                      std::to_string(at.start_epoch) + ":" + std::to_string(cfg.epochs);
    run.say("extending the run of " + std::to_string(planned) + " epochs to " + std::to_string(cfg.epochs) +
            " (--epochs " + std::to_string(cfg.epochs) + "): " +
            extension_note(run.sched, at.start_epoch, planned, cfg.epochs));
  }
  const int64_t steps_done = int64_t{at.start_epoch} * run.sched.steps_per_epoch;
  meta_int(ck, "step", cfg.resume, steps_done, steps_done);  // the loop's step counter after those epochs
  run.model->set_step(uint64_t(steps_done));
  load_model(*run.model, run.sgd.get(), ck, cfg.resume);
  if (run.job) run.job->get_checkpoint(ck, cfg.resume);
  else parallel::Job::check_lone_resume(ck, cfg.resume);
  if (ck.meta.count("loss_scale"))
    run.scaler.restore(meta_real(ck, "loss_scale", cfg.resume, 0x1p-149, 3.4e38),
                       int(meta_int(ck, "loss_scale_tracker", cfg.resume, 0, 0x7FFFFFFF)),
                       uint64_t(meta_int(ck, "skipped_steps", cfg.resume, 0, steps_done)));
  if (at.start_epoch == cfg.epochs) {
    run.say("checkpoint " + cfg.resume + " is of a finished run: all " + std::to_string(cfg.epochs) +
            " epochs are done; nothing to train (a larger --epochs extends the run)");
    at.finished = true;
    return at;
  }
  run.say("resumed from " + cfg.resume + " after epoch " + std::to_string(at.start_epoch));
  return at;
}

RunDirectory::RunDirectory(const std::string& dir) : dir_(dir) {
  if (dir_.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  DFP_CHECK(!ec, Status::io_error, "flag --out: cannot create directory '" + dir_ + "': " + ec.message());
  lock_ = std::make_unique<RunLock>(dir_, "flag --out");
}

void RunDirectory::start(const TrainingRun& run, const ResumePoint& from) {
  if (dir_.empty()) return;
  const TrainConfig& cfg = run.cfg;
  // Resuming continues the run in --out only when the checkpoint is that run's own.
  std::error_code ec;
  const bool resumes_here = !cfg.resume.empty() && std::filesystem::equivalent(cfg.resume, path("checkpoint.dfp"), ec);
  if (!cfg.overwrite && !resumes_here && holds_run(dir_)) {
    const bool checkpoint = std::filesystem::exists(path("checkpoint.dfp"), ec);
    fail(Status::invalid_argument,
         "flag --out: directory '" + dir_ + "' holds an earlier run (" + run_files_in(dir_) +
             "); expected an empty or new directory, " +
             (checkpoint ? "--resume " + path("checkpoint.dfp") + " to continue it, "
                         : std::string("(it has no checkpoint to resume) ")) +
             "or --overwrite to replace it");
  }
  // A run stopped before it finished an epoch (Ctrl-C, a data error) leaves config.json and
  // metrics.jsonl but nothing to resume: the retry takes the directory over.
  if (const std::string left = run_files_in(dir_); !cfg.overwrite && !resumes_here && !left.empty())
    run.say("flag --out: directory '" + dir_ + "' holds " + left + " of a run that finished no epoch (no checkpoint); "
            "this run takes it over and replaces them");
  // The directory is this run's now: what killed writers left behind goes, run.toml's too (each
  // writer's temporary file has a name of its own, so a relaunch's write leaves the other).
  remove_write_temporaries(path("checkpoint.dfp"));
  remove_write_temporaries(path("run.toml"));
  // The run's settings as flags, so that `dfp train --config DIR/run.toml` repeats it, whichever
  // surface (the program or the Python binding) started it.
  run_files::write_run_toml(dir_, run_files::run_toml(run.config));
  run_files::ConfigRecord config;
  for (const std::vector<Setting>* list : {&run.settings, &run.machine})
    for (const Setting& st : *list) st.add_to(config);
  config.add_string("data", cfg.data);
  config.add_string("init_from", cfg.init_from);
  config.add_literal("limit_test", std::to_string(cfg.limit_test));
  config.add_string("label", cfg.label.empty() ? precision_label(cfg) : cfg.label);
  config.add_string("device", cfg.device);
  config.add_string("loss_scaling", loss_scale_mode_name(cfg.loss_scale.mode));
  config.add_literal("numerics_every", std::to_string(cfg.numerics_interval));
  config.add_literal("train_images", std::to_string(run.train_set.count));
  config.add_literal("test_images", std::to_string(run.test_set.count));
  config.add_literal("parameters", std::to_string(run.model->parameter_count()));
  if (!from.epochs_plan.empty()) config.add_string("epochs_plan", from.epochs_plan);
  std::ofstream c(path("config.json"));
  c << run_files::to_text(config);
  c.flush();
  DFP_CHECK(c.good(), Status::io_error, "cannot write '" + path("config.json") + "' (disk full?)");
  // A resumed run continues metrics.jsonl from the checkpoint's epoch: lines of later epochs
  // (written before a checkpoint that was never committed) are dropped, so each epoch appears
  // once.
  if (from.start_epoch > 0) keep_metrics_through(path("metrics.jsonl"), from.start_epoch);
  metrics_.open(path("metrics.jsonl"), from.start_epoch > 0 ? std::ios::app : std::ios::trunc);
  DFP_CHECK(metrics_.good(), Status::io_error, "cannot write '" + path("metrics.jsonl") + "'");
}

void RunDirectory::append_metrics(const std::string& line) {
  metrics_ << line << "\n";
  metrics_.flush();
  DFP_CHECK(metrics_.good(), Status::io_error, "'" + path("metrics.jsonl") + "': write failed (disk full?)");
}

Checkpoint RunDirectory::checkpoint(TrainingRun& run, int epochs_done, int step, const std::string& epochs_plan) const {
  Checkpoint ck;
  ck.meta = {{"data", run.cfg.data},
             {"loss_scale", fmt_exact(run.scaler.scale())}, {"loss_scale_tracker", std::to_string(run.scaler.growth_tracker())},
             {"skipped_steps", std::to_string(run.scaler.skipped_steps())},
             {"epochs_done", std::to_string(epochs_done)}, {"step", std::to_string(step)}};
  put_shape(ck, run.train_set);
  for (const std::vector<Setting>* list : {&run.settings, &run.machine})
    for (const Setting& st : *list) ck.meta[st.key] = st.value;
  if (!epochs_plan.empty()) ck.meta["epochs_plan"] = epochs_plan;
  save_model(*run.model, run.cfg.policy, run.sgd.get(), ck);
  return ck;
}

void RunDirectory::write(const Checkpoint& ck) const { write_checkpoint(path("checkpoint.dfp"), ck); }

}  // namespace dfp
