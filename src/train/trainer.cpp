// The training loop, metrics, and checkpoints.
#include "dfp/trainer.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <utility>

#include "dfp/context.hpp"
#include "dfp/cuda.hpp"
#include "dfp/data.hpp"
#include "dfp/models.hpp"
#include "dfp/optim.hpp"
#include "dfp/status.hpp"
#include "dfp/torch_state.hpp"
#include "src/io/checkpoint.hpp"
#include "src/train/profile.hpp"
#include "src/parallel/job.hpp"
#include "dfp/run_lock.hpp"
#include "src/io/state.hpp"
#include "src/train/run_files.hpp"

namespace dfp {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

long peak_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

std::string fmt_g(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}
// Round-trips exactly (checkpointed loss scale).
std::string fmt_exact(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

// A float as the shortest text that reads back as the same float ("0.1", not 0.1f's 17 digits).
std::string fmt_float(float v) {
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
std::vector<Setting> result_settings(const TrainConfig& c, const std::string& policy_text) {
  using S = Setting;
  std::string milestones;
  for (int e : c.milestones) milestones.append(milestones.empty() ? "" : ",").append(std::to_string(e));
  return {{"model", "--model", c.model, S::text, true},
          {"dataset", "--dataset", c.dataset, S::text, true},
          {"policy", "--precision (and its policy flags)", policy_text, S::text, true, "precision_policy"},
          {"loss_scaling", "--loss-scaling", c.loss_scale.describe(), S::text, true, "loss_scaling_config"},
          {"batch_size", "--batch-size", std::to_string(c.batch_size), S::literal, true},
          {"seed", "--seed", std::to_string(c.seed), S::literal, true},
          {"epochs", "--epochs", std::to_string(c.epochs), S::literal},
          {"lr", "--lr", fmt_float(c.lr), S::real},
          {"momentum", "--momentum", fmt_float(c.momentum), S::real},
          {"weight_decay", "--wd", fmt_float(c.weight_decay), S::real},
          {"nesterov", "--nesterov", c.nesterov ? "true" : "false", S::literal},
          {"schedule", "--schedule", c.schedule, S::text},
          {"warmup_epochs", "--warmup-epochs", std::to_string(c.warmup_epochs), S::literal},
          {"milestones", "--milestones", milestones, S::text},
          {"step_epochs", "--step-epochs", std::to_string(c.step_epochs), S::literal},
          {"gamma", "--gamma", fmt_float(c.gamma), S::real},
          {"label_smoothing", "--label-smoothing", fmt_float(c.label_smoothing), S::real},
          {"augment", "--no-augment", c.augment ? "true" : "false", S::literal},
          {"limit_train", "--limit-train", std::to_string(c.limit_train), S::literal},
          {"image_size", "--image-size", std::to_string(c.image_size), S::literal}};
}
// Where the run computes: recorded like the settings above, but a resume that differs is only
// noted (the FP32 library operators may round differently; dfp's own kernels give the same bits).
std::vector<Setting> machine_settings(const Context& ctx) {
  return {{"threads", "--threads", std::to_string(ctx.threads()), Setting::literal},
          {"isa", "--isa", isa_name(ctx.isa()), Setting::text}};
}

}  // namespace

void validate_train_config(const TrainConfig& c) {
  auto check = [](bool ok, const char* flag, const std::string& expected, const std::string& got) {
    DFP_CHECK(ok, Status::invalid_argument, std::string("flag ") + flag + ": expected " + expected + ", got " + got);
  };
  auto num = [](double v) { return fmt_g(v); };
  check(c.epochs >= 1, "--epochs", ">= 1", std::to_string(c.epochs));
  check(c.batch_size >= 1, "--batch-size", ">= 1", std::to_string(c.batch_size));
  check(std::isfinite(c.lr) && c.lr > 0, "--lr", "a positive finite number", num(c.lr));
  check(std::isfinite(c.momentum) && c.momentum >= 0, "--momentum", "a finite number >= 0", num(c.momentum));
  check(std::isfinite(c.weight_decay) && c.weight_decay >= 0, "--wd", "a finite number >= 0", num(c.weight_decay));
  check(std::isfinite(c.gamma) && c.gamma > 0, "--gamma", "a finite number > 0", num(c.gamma));
  check(c.step_epochs >= 1, "--step-epochs", ">= 1", std::to_string(c.step_epochs));
  for (size_t i = 0; i < c.milestones.size(); ++i)
    check(c.milestones[i] >= 1 && (i == 0 || c.milestones[i] > c.milestones[i - 1]), "--milestones",
          "epochs >= 1 in increasing order", std::to_string(c.milestones[i]).append(" at item ").append(std::to_string(i + 1)));
  check(c.label_smoothing >= 0 && c.label_smoothing < 1, "--label-smoothing", "a number in [0, 1)", num(c.label_smoothing));
  check(c.data.find('\n') == std::string::npos, "--data", "a path without line breaks (the checkpoint records it)",
        "a path with one");
  check(c.limit_train >= 0, "--limit-train", ">= 0 (0 = all)", std::to_string(c.limit_train));
  check(c.limit_test >= 0, "--limit-test", ">= 0 (0 = all)", std::to_string(c.limit_test));
  check(c.print_every >= 1, "--print-every", ">= 1", std::to_string(c.print_every));
  check(c.numerics_interval >= 0, "--numerics-every", ">= 0 (0 = never)", std::to_string(c.numerics_interval));
  ContextOptions::validate_threads(c.threads, "flag --threads");
  check(c.workers >= 0 && c.workers <= ContextOptions::kMaxThreads, "--workers",
        "loader threads in [0, " + std::to_string(ContextOptions::kMaxThreads) + "] (0 = --threads)",
        std::to_string(c.workers));
  check(c.image_size >= 0 && c.image_size <= 8192, "--image-size", "a side in [0, 8192] (0 = 224)",
        std::to_string(c.image_size));
  check(c.warmup_epochs >= 0 && c.warmup_epochs <= c.epochs, "--warmup-epochs",
        "in [0, --epochs] ([0, " + std::to_string(c.epochs) + "])", std::to_string(c.warmup_epochs));
  DFP_CHECK(c.stop_after >= 0, Status::invalid_argument,
            "TrainConfig.stop_after: expected >= 0, got " + std::to_string(c.stop_after));
  parse_schedule(c.schedule, "flag --schedule");
  parallel::parse_grad_format(c.allreduce, "flag --allreduce");
  check(c.bucket_kib >= 1 && c.bucket_kib <= (1 << 20), "--bucket-kib", "KiB in [1, 1048576]", std::to_string(c.bucket_kib));
  check(std::isfinite(c.dist_timeout) && c.dist_timeout > 0, "--dist-timeout", "seconds > 0", num(c.dist_timeout));
  DFP_CHECK(c.device == "cpu" || c.device == "cuda", Status::invalid_argument,
            "flag --device: expected cpu or cuda, got '" + c.device + "'");
  DFP_CHECK(!c.profile || c.device == "cpu", Status::unsupported,
            "flag --profile: times the CPU model's layers; not available with --device cuda");
  // growth_factor and backoff_factor have no flag: the origin names the field as well.
  c.loss_scale.validate("TrainConfig.loss_scale (flags --loss-scale, --scale-growth-interval)");
  c.policy.validate(kPolicyFlags);
}

namespace {

// Model state (src/io/state.hpp) and the optimizer's momentum <-> checkpoint tensors, with every
// mismatch named.
void save_model(Model& m, const PrecisionPolicy& policy, Sgd* sgd, Checkpoint& ck) {
  put_state(ck, m, policy);
  auto& ps = m.parameters();
  for (size_t i = 0; sgd && i < ps.size(); ++i) ck.tensors[ps[i].name + "@momentum"] = sgd->momentum_buffers()[i];
}

void load_model(Model& m, Sgd* sgd, const Checkpoint& ck, const std::string& path) {
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

// The data a checkpoint was trained on: channels, height, width, classes and (image folders) the
// class names, as the checkpoint records them.
struct DataShape {
  int channels = 0, height = 0, width = 0, classes = 0;
  std::vector<std::string> class_names;  // empty when not recorded (formats with numbered classes)
};

void put_shape(Checkpoint& ck, const Dataset& d) {
  ck.meta["channels"] = std::to_string(d.channels);
  ck.meta["height"] = std::to_string(d.height);
  ck.meta["width"] = std::to_string(d.width);
  ck.meta["classes"] = std::to_string(d.classes);
  if (!d.class_names.empty()) ck.meta["class_names"] = join_names(d.class_names);
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

// Requires `d` (`split` of the run's data) to be the data the checkpoint was trained on: a model
// built for other images cannot read these, and other class names would score every answer
// against the wrong labels. Error(invalid_argument) naming the first difference.
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

AugmentOptions augment_for(const Dataset& d, bool train, bool augment) {
  if (d.file_backed()) return image_folder_augment(train && augment);  // ImageNet recipe
  AugmentOptions a;
  if (d.name == "synthetic") return a;  // noise: nothing to normalise or augment
  if (d.channels == 3) {  // per-channel statistics of the CIFAR-10 / CIFAR-100 training sets
    const bool c100 = d.name == "cifar100";
    a.mean = c100 ? std::vector<float>{0.5071f, 0.4865f, 0.4409f} : std::vector<float>{0.4914f, 0.4822f, 0.4465f};
    a.stddev = c100 ? std::vector<float>{0.2673f, 0.2564f, 0.2762f} : std::vector<float>{0.2470f, 0.2435f, 0.2616f};
    if (train && augment) { a.pad = 4; a.hflip = true; }
  } else {
    const bool fashion = d.name.find("fashion") != std::string::npos;
    a.mean.assign(d.channels, fashion ? 0.2860f : 0.1307f);
    a.stddev.assign(d.channels, fashion ? 0.3530f : 0.3081f);
  }
  return a;
}

void truncate(Dataset& d, int limit) {
  if (limit <= 0 || limit >= d.count) return;
  if (d.file_backed()) {  // files are sorted by class: keep every (count/limit)-th, so all classes stay
    for (int i = 0; i < limit; ++i) {
      const size_t from = size_t(int64_t(i) * d.count / limit);
      d.files[size_t(i)] = d.files[from];
      d.file_labels[size_t(i)] = d.file_labels[from];
    }
    d.count = limit;
    d.files.resize(size_t(limit));
    d.file_labels.resize(size_t(limit));
    return;
  }
  d.count = limit;
  d.pixels.resize(size_t(limit) * d.image_bytes());
  d.labels.resize(limit);
}

struct Totals {
  double loss = 0;
  long c1 = 0, c5 = 0, n = 0;
  void add(const StepResult& r) { loss += r.loss * r.count; c1 += r.correct1; c5 += r.correct5; n += r.count; }
};

Totals run_eval(Model& m, Loader& loader) {
  Totals t;
  loader.start_epoch(0);
  Batch b;
  while (loader.next(b))
    if (b.size > 0) t.add(m.forward(b.images, b.labels, b.size, false));  // a shard's part may be empty
  return t;
}

Totals run_eval(CudaModel& m, Loader& loader) {
  Totals t;
  loader.start_epoch(0);
  Batch b;
  while (loader.next(b)) t.add(m.evaluate(b.images, b.labels, b.size));
  return t;
}

}  // namespace

namespace {

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

}  // namespace

int job_ranks() noexcept { return parallel::launcher_world_size(); }
bool writes_run_files() noexcept { return parallel::launcher_world_size() <= 1 || parallel::launcher_rank() == 0; }

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
    if (n.format == "int16") {
      l.exp_x = n.exp_x;
      l.exp_w = n.exp_w;
      l.exp_dy = n.exp_dy;
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

namespace {

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

// The run, alone (job null) or as one rank of a data-parallel job: rank 0 alone logs and writes
// the run's files (the others run with `out` empty).
std::vector<EpochMetrics> run_training(const TrainConfig& config, parallel::Job* job,
                                       const std::function<void(const std::string&)>& log_in,
                                       const EpochCallback& on_epoch, const StopCheck& should_stop) {
  const bool lead = !job || job->rank() == 0;
  const std::function<void(const std::string&)> log = lead ? log_in : nullptr;
  TrainConfig cfg = config;
  if (!lead) cfg.out.clear();
  auto say = [&](const std::string& s) { if (log) log(s); };
  // --device cuda: the same model, data and loop on the GPU (CudaModel); the host model keeps
  // the FP32 parameters that checkpoints read, refreshed by CudaModel::download().
  const bool on_cuda = cfg.device == "cuda";
  if (std::string why; on_cuda && !cuda_available(&why)) fail(Status::unsupported, "flag --device cuda: " + why);
  DFP_CHECK(!on_cuda || cfg.policy.precision == Precision::fp16 || cfg.policy.precision == Precision::fp32,
            Status::invalid_argument,
            std::string("flag --precision with --device cuda: expected fp16 or fp32, got ") +
                precision_name(cfg.policy.precision));
  const bool cuda_fp16 = on_cuda && cfg.policy.precision == Precision::fp16;
  const std::string policy_text = on_cuda ? "device=cuda precision=" + std::string(precision_name(cfg.policy.precision)) +
                                                (cuda_fp16 ? " " + cfg.loss_scale.describe() : "")
                                          : cfg.policy.describe();
  DFP_CHECK(!cuda_fp16 || cfg.loss_scale.mode != LossScaleMode::adaptive, Status::unsupported,
            "flag --loss-scaling adaptive: layer-wise scaling runs on the CPU only; use dynamic or static with --device cuda");
  ContextOptions co;
  co.threads = cfg.threads;
  co.isa = cfg.isa;
  co.seed = cfg.seed;
  Context ctx(co);

  Dataset train_set, test_set;
  std::unique_ptr<Model> built;
  std::optional<Error> failed;
  try {
    train_set = load_dataset(cfg.dataset, cfg.data, true, cfg.image_size);
    test_set = load_dataset(cfg.dataset, cfg.data, false, cfg.image_size);
    check_same_geometry(train_set, test_set);
    truncate(train_set, cfg.limit_train);
    truncate(test_set, cfg.limit_test);
    DFP_CHECK(train_set.count >= cfg.batch_size, Status::invalid_argument,
              "training set of " + std::to_string(train_set.count) + " images is smaller than one batch (" +
                  std::to_string(cfg.batch_size) + ")");
    built = std::make_unique<Model>(ctx, cfg.model);
    build_model(*built, cfg.model, train_set.channels, train_set.height, train_set.width, train_set.classes);
  } catch (const Error& e) {
    if (!job) throw;
    failed = e;
  }
  // Every rank reads the data and builds the model alike: a wrong --data or --model fails them
  // all, and the job says it once.
  if (job) job->agree_on_start(failed ? &*failed : nullptr);
  Model& m = *built;
  m.set_label_smoothing(cfg.label_smoothing);
  m.set_loss_scaling(cfg.loss_scale);  // before build(): the memory plan depends on it
  const int ranks = job ? job->size() : 1;
  m.build(cfg.batch_size / ranks, cfg.policy);  // each rank's part of the batch
  m.set_numerics_interval(cfg.numerics_interval);
  m.set_profiling(cfg.profile);
  Sgd sgd(ctx, m, SgdOptions{cfg.momentum, cfg.weight_decay, cfg.nesterov});
  LossScaler scaler(cfg.loss_scale);
  if (!cfg.init_from.empty() && !cfg.resume.empty())
    say("note: --init-from " + cfg.init_from + " is not read: the run resumes from its checkpoint's weights");
  else if (!cfg.init_from.empty()) {
    WeightsReport init;
    try {
      init = load_weights(m, cfg.init_from, {.skip = cfg.init_skip, .skip_mismatched_classifier = true, .adapt_input_channels = true});
    } catch (const Error& e) {
      fail(e.status(), std::string("flag --init-from: ") + e.what());  // which flag named the file
    }
    for (const std::string& line : init.lines()) say("init: " + line);
  }
  Loader train_loader(ctx, train_set, cfg.batch_size, true, true, augment_for(train_set, true, cfg.augment), cfg.seed,
                      cfg.workers);
  Loader test_loader(ctx, test_set, cfg.batch_size, false, false, augment_for(test_set, false, false), cfg.seed,
                     cfg.workers);
  if (job) {
    train_loader.set_shard(job->rank(), ranks);
    test_loader.set_shard(job->rank(), ranks);
  }

  LrSchedule sched;
  sched.kind = parse_schedule(cfg.schedule, "flag --schedule");
  sched.base = cfg.lr;
  sched.steps_per_epoch = train_loader.batches_per_epoch();
  DFP_CHECK(int64_t{cfg.epochs} * sched.steps_per_epoch <= std::numeric_limits<int>::max(), Status::invalid_argument,
            "flag --epochs: " + std::to_string(cfg.epochs) + " epochs of " + std::to_string(sched.steps_per_epoch) +
                " steps exceed the step counter; expected at most " +
                std::to_string(std::numeric_limits<int>::max() / sched.steps_per_epoch) + " epochs");
  sched.total_steps = cfg.epochs * sched.steps_per_epoch;
  sched.warmup_steps = cfg.warmup_epochs * sched.steps_per_epoch;
  sched.gamma = cfg.gamma;
  sched.milestones = cfg.milestones;
  sched.step_epochs = cfg.step_epochs;

  const std::vector<Setting> settings = result_settings(cfg, policy_text);
  const std::vector<Setting> machine = machine_settings(ctx);
  // The reducer goes before the model it hooks into, also when a refusal below ends the run.
  const parallel::Job::Attachment attached(job);
  if (job) {
    std::string text = "allreduce=" + cfg.allreduce + "\nerror_feedback=" + (cfg.error_feedback ? "1" : "0") +
                       "\nsync_bn=" + (cfg.sync_bn ? "1" : "0") +
                       "\nbucket_kib=" + std::to_string(cfg.bucket_kib) + "\nresume=" + cfg.resume + "\nout=" + config.out;
    for (const Setting& st : settings) text += std::string("\n") + st.key + "=" + st.value;
    job->check_same_run(text, train_set, test_set);
    job->attach(ctx, m, cfg);
    job->broadcast_state(m);  // rank 0's initial weights everywhere
  }
  // The run takes its directory before it reads anything there: another run cannot write a newer
  // checkpoint between this one's resume and its first write.
  std::unique_ptr<RunLock> lock;
  if (!cfg.out.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(cfg.out, ec);
    DFP_CHECK(!ec, Status::io_error, "flag --out: cannot create directory '" + cfg.out + "': " + ec.message());
    lock = std::make_unique<RunLock>(cfg.out, "flag --out");
  }
  int start_epoch = 0;
  // A run resumed with a larger --epochs: "E:N" items, from E epochs done on the schedule spanned N
  // epochs ("0:10,10:20"); empty for a run that kept its --epochs.
  std::string epochs_plan;
  if (!cfg.resume.empty()) {
    const Checkpoint ck = read_checkpoint(cfg.resume);
    // Every setting that decides the result must match; all mismatches are named at once. A
    // checkpoint from before a setting was stored cannot be checked for it: said, not refused.
    std::string differ, unchecked;
    for (const Setting& st : settings) {
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
    if (!unchecked.empty()) say("note: checkpoint " + cfg.resume + " does not record " + unchecked + "; not checked");
    for (const Setting& st : machine)
      if (ck.meta.count(st.key) && !st.matches(ck.meta.at(st.key)))
        say(std::string("note: the checkpoint was written with ") + st.key + " " + ck.meta.at(st.key) +
            ", this run uses " + st.value + ": the FP32 library operators may then round differently from an "
            "uninterrupted run");
    const int planned = ck.meta.count("epochs")
                            ? int(meta_int(ck, "epochs", cfg.resume, 1, std::numeric_limits<int>::max()))
                            : cfg.epochs;
    check_shape(get_shape(ck, cfg.resume), train_set, "training", cfg.resume);
    start_epoch = int(meta_int(ck, "epochs_done", cfg.resume, 1, planned));
    DFP_CHECK(cfg.epochs >= planned, Status::invalid_argument,
              "flag --epochs " + std::to_string(cfg.epochs) + ": checkpoint '" + cfg.resume + "' is of a run of " +
                  std::to_string(planned) + " epochs (" + std::to_string(start_epoch) +
                  " done); expected --epochs " + std::to_string(planned) + " to continue it, or more to extend it "
                  "(a resume never shortens a run)");
    if (const auto it = ck.meta.find("epochs_plan"); it != ck.meta.end()) epochs_plan = it->second;
    if (planned != cfg.epochs) {
      epochs_plan += (epochs_plan.empty() ? "0:" + std::to_string(planned) : std::string()) + "," +
                     std::to_string(start_epoch) + ":" + std::to_string(cfg.epochs);
      say("extending the run of " + std::to_string(planned) + " epochs to " + std::to_string(cfg.epochs) +
          " (--epochs " + std::to_string(cfg.epochs) + "): " + extension_note(sched, start_epoch, planned, cfg.epochs));
    }
    const int64_t steps_done = int64_t{start_epoch} * sched.steps_per_epoch;
    meta_int(ck, "step", cfg.resume, steps_done, steps_done);  // the loop's step counter after those epochs
    m.set_step(uint64_t(steps_done));
    load_model(m, &sgd, ck, cfg.resume);
    if (job) job->get_checkpoint(ck, cfg.resume);
    else parallel::Job::check_lone_resume(ck, cfg.resume);
    if (ck.meta.count("loss_scale"))
      scaler.restore(meta_real(ck, "loss_scale", cfg.resume, 0x1p-149, 3.4e38),
                     int(meta_int(ck, "loss_scale_tracker", cfg.resume, 0, 0x7FFFFFFF)),
                     uint64_t(meta_int(ck, "skipped_steps", cfg.resume, 0, steps_done)));
    if (start_epoch == cfg.epochs) {
      say("checkpoint " + cfg.resume + " is of a finished run: all " + std::to_string(cfg.epochs) +
          " epochs are done; nothing to train (a larger --epochs extends the run)");
      return {};
    }
    say("resumed from " + cfg.resume + " after epoch " + std::to_string(start_epoch));
  }
  std::unique_ptr<CudaModel> cuda;
  if (on_cuda) {
    cuda = std::make_unique<CudaModel>(ctx, m, cfg.policy.precision,
                                       SgdOptions{cfg.momentum, cfg.weight_decay, cfg.nesterov}, &sgd.momentum_buffers(),
                                       CudaOptions{cfg.cudnn_benchmark});
    say("device cuda: " + cuda->describe());
  }

  std::ofstream metrics;
  if (!cfg.out.empty()) {
    // Resuming continues the run in --out only when the checkpoint is that run's own.
    std::error_code ec;
    const bool resumes_here = !cfg.resume.empty() && std::filesystem::equivalent(cfg.resume, cfg.out + "/checkpoint.dfp", ec);
    if (!cfg.overwrite && !resumes_here && holds_run(cfg.out)) {
      const bool checkpoint = std::filesystem::exists(cfg.out + "/checkpoint.dfp", ec);
      fail(Status::invalid_argument,
           "flag --out: directory '" + cfg.out + "' holds an earlier run (" + run_files_in(cfg.out) +
               "); expected an empty or new directory, " +
               (checkpoint ? "--resume " + cfg.out + "/checkpoint.dfp to continue it, "
                           : std::string("(it has no checkpoint to resume) ")) +
               "or --overwrite to replace it");
    }
    // A run stopped before it finished an epoch (Ctrl-C, a data error) leaves config.json and
    // metrics.jsonl but nothing to resume: the retry takes the directory over.
    if (const std::string left = run_files_in(cfg.out); !cfg.overwrite && !resumes_here && !left.empty())
      say("flag --out: directory '" + cfg.out + "' holds " + left + " of a run that finished no epoch (no checkpoint); "
          "this run takes it over and replaces them");
    // The directory is this run's now: what killed writers left behind goes.
    remove_checkpoint_temporaries(cfg.out + "/checkpoint.dfp");
    // The run's settings as flags, so that `dfp train --config DIR/run.toml` repeats it, whichever
    // surface (the program or the Python binding) started it.
    run_files::write_run_toml(cfg.out, run_files::run_toml(config));
    run_files::ConfigRecord config;
    for (const std::vector<Setting>* list : {&settings, &machine})
      for (const Setting& st : *list) st.add_to(config);
    config.add_string("data", cfg.data);
    config.add_string("init_from", cfg.init_from);
    config.add_literal("limit_test", std::to_string(cfg.limit_test));
    config.add_string("label", cfg.label.empty() ? precision_label(cfg) : cfg.label);
    config.add_string("device", cfg.device);
    config.add_string("loss_scaling", loss_scale_mode_name(cfg.loss_scale.mode));
    config.add_literal("numerics_every", std::to_string(cfg.numerics_interval));
    config.add_literal("train_images", std::to_string(train_set.count));
    config.add_literal("test_images", std::to_string(test_set.count));
    config.add_literal("parameters", std::to_string(m.parameter_count()));
    if (!epochs_plan.empty()) config.add_string("epochs_plan", epochs_plan);
    std::ofstream c(cfg.out + "/config.json");
    c << run_files::to_text(config);
    c.flush();
    DFP_CHECK(c.good(), Status::io_error, "cannot write '" + cfg.out + "/config.json' (disk full?)");
    // A resumed run continues metrics.jsonl from the checkpoint's epoch: lines of later epochs
    // (written before a checkpoint that was never committed) are dropped, so each epoch appears
    // once.
    if (start_epoch > 0) keep_metrics_through(cfg.out + "/metrics.jsonl", start_epoch);
    metrics.open(cfg.out + "/metrics.jsonl", start_epoch > 0 ? std::ios::app : std::ios::trunc);
    DFP_CHECK(metrics.good(), Status::io_error, "cannot write '" + cfg.out + "/metrics.jsonl'");
  }
  if (config.out.empty())
    say("note: no --out DIR: this run saves nothing (no checkpoint, metrics.jsonl or run.toml); give --out DIR to keep "
        "its results");
  say("model " + cfg.model + ": " + std::to_string(m.parameter_count()) + " parameters; " + policy_text +
      "; " + cfg.loss_scale.describe());
  if (!on_cuda)
    for (const std::string& note : precision_notes(cfg.policy, ctx)) say(note);
  say("data " + train_set.name + ": " + std::to_string(train_set.count) + " train / " + std::to_string(test_set.count) +
      " test images; " + std::to_string(ctx.threads()) + " threads; kernels " + isa_name(ctx.isa()));

  // One progress line redrawn in place (\r) on a terminal; elsewhere whole lines every
  // --print-every steps. A launcher's ranks write into a pseudo-terminal of the launcher's even
  // when its own output goes to a file, so a rank never redraws.
  const bool tty = isatty(STDOUT_FILENO) && !parallel::under_launcher();
  StepProfile prof;
  std::vector<EpochMetrics> all;
  int step = start_epoch * sched.steps_per_epoch;
  for (int epoch = start_epoch; epoch < cfg.epochs; ++epoch) {
    train_loader.start_epoch(epoch);
    const auto t0 = Clock::now();
    Totals tr;
    Batch b;
    int i = 0;
    float lr = sched.at(step);
    bool stopped = false;
    while (train_loader.next(b)) {
      lr = sched.at(step);
      const double used_scale = scaler.scale();
      const uint64_t skipped_before = scaler.skipped_steps();
      if (cuda) {
        tr.add(cuda->train_step(b.images, b.labels, b.size, lr, scaler));  // runs scaler.update
      } else {
        const auto step_t0 = cfg.profile ? Clock::now() : Clock::time_point{};
        if (job) job->begin_step(m.step());
        tr.add(m.forward(b.images, b.labels, b.size, true));
        m.set_loss_scale(used_scale);
        bool finite = m.backward();
        if (job) finite = job->finish(finite);  // the mean gradient, and every rank's verdict
        const auto opt_t0 = cfg.profile ? Clock::now() : Clock::time_point{};
        if (scaler.update(finite)) sgd.step(lr);
        if (cfg.profile) {
          prof.optimizer_seconds += seconds_since(opt_t0);
          prof.step_seconds += seconds_since(step_t0);
          ++prof.steps;
        }
      }
      if (scaler.skipped_steps() != skipped_before) {
        char line[200];
        std::snprintf(line, sizeof line, "step %d: non-finite gradients at loss scale %g: step skipped (%llu so far); scale now %g",
                      step + 1, used_scale, static_cast<unsigned long long>(scaler.skipped_steps()), scaler.scale());
        if (tty) std::printf("\n");
        say(line);
      }
      ++step;
      ++i;
      if (log && (tty || i % cfg.print_every == 0 || i == sched.steps_per_epoch)) {
        // Every rank trains an equal part of each batch (the batch divides by the ranks): the
        // job's images per second are this rank's times the ranks, as the epoch line counts them.
        const double el = seconds_since(t0), ips = double(tr.n) * ranks / el;
        const double eta = (sched.steps_per_epoch - i) * el / i;
        char line[256];
        const int bar = 24 * i / sched.steps_per_epoch;
        std::snprintf(line, sizeof line, "epoch %d/%d [%-24s] %d/%d loss %.4f top1 %.2f%%%s %.0f img/s eta %.0fs%s",
                      epoch + 1, cfg.epochs, std::string(bar, '=').c_str(), i, sched.steps_per_epoch, tr.loss / tr.n,
                      100.0 * tr.c1 / tr.n, job ? " (rank 0's part)" : "", ips, eta,
                      cfg.loss_scale.mode == LossScaleMode::none ? "" : (" scale " + fmt_g(scaler.scale())).c_str());
        if (tty) { std::printf("\r%s", line); std::fflush(stdout); }
        else say(line);
      }
      if (should_stop && should_stop()) {
        stopped = true;
        break;
      }
    }
    if (tty && log) std::printf("\n");
    if (stopped) {
      say("stopped in epoch " + std::to_string(epoch + 1) + " after step " + std::to_string(i) + "; " +
          (epoch > 0 ? "the checkpoint holds epochs 1-" + std::to_string(epoch) : std::string("no epoch was done")));
      break;
    }
    if (job) {
      job->sum(&tr.loss, 1);  // the epoch's totals over the ranks' parts
      double counts[3] = {double(tr.c1), double(tr.c5), double(tr.n)};
      job->sum(counts, 3);
      tr.c1 = long(counts[0]), tr.c5 = long(counts[1]), tr.n = long(counts[2]);
      job->broadcast_buffers(m);  // one model evaluated and checkpointed: rank 0's running statistics
      job->check_same_weights(m, epoch + 1);
    }
    EpochMetrics em;
    em.epoch = epoch + 1;
    em.epoch_seconds = seconds_since(t0);
    em.data_wait_seconds = train_loader.data_wait_seconds();
    prof.data_wait_seconds += em.data_wait_seconds;
    em.images_per_second = double(tr.n) / em.epoch_seconds;
    em.train_loss = tr.loss / tr.n;
    em.train_top1 = 100.0 * tr.c1 / tr.n;
    em.lr = lr;
    Totals te = cuda ? run_eval(*cuda, test_loader) : run_eval(m, test_loader);
    if (job) {
      double sums[4] = {te.loss, double(te.c1), double(te.c5), double(te.n)};
      job->sum(sums, 4);
      te.loss = sums[0], te.c1 = long(sums[1]), te.c5 = long(sums[2]), te.n = long(sums[3]);
    }
    em.test_loss = te.loss / te.n;
    em.test_top1 = 100.0 * te.c1 / te.n;
    em.test_top5 = 100.0 * te.c5 / te.n;
    em.peak_rss_kib = peak_rss_kib();
    em.loss_scale = scaler.scale();
    em.skipped_steps = scaler.skipped_steps();
    all.push_back(em);
    char line[320];
    std::snprintf(line, sizeof line,
                  "epoch %d/%d done: train loss %.4f top1 %.2f%% | test loss %.4f top1 %.2f%% top5 %.2f%% | %.0f img/s, "
                  "data wait %.2fs, peak RSS %.0f MiB%s",
                  em.epoch, cfg.epochs, em.train_loss, em.train_top1, em.test_loss, em.test_top1, em.test_top5,
                  em.images_per_second, em.data_wait_seconds, em.peak_rss_kib / 1024.0,
                  cfg.loss_scale.mode == LossScaleMode::none && em.skipped_steps == 0
                      ? ""
                      : (", loss scale " + fmt_g(em.loss_scale) + ", skipped " + std::to_string(em.skipped_steps)).c_str());
    say(line);
    if (metrics.is_open()) {
      metrics << metrics_line(em, policy_text, m.numerics()) << "\n";
      metrics.flush();
      DFP_CHECK(metrics.good(), Status::io_error, "'" + cfg.out + "/metrics.jsonl': write failed (disk full?)");
      if (cuda) cuda->download(m, &sgd.momentum_buffers());
      Checkpoint ck;
      ck.meta = {{"data", cfg.data},
                 {"loss_scale", fmt_exact(scaler.scale())}, {"loss_scale_tracker", std::to_string(scaler.growth_tracker())},
                 {"skipped_steps", std::to_string(scaler.skipped_steps())},
                 {"epochs_done", std::to_string(epoch + 1)}, {"step", std::to_string(step)}};
      put_shape(ck, train_set);
      for (const std::vector<Setting>* list : {&settings, &machine})
        for (const Setting& st : *list) ck.meta[st.key] = st.value;
      if (!epochs_plan.empty()) ck.meta["epochs_plan"] = epochs_plan;
      save_model(m, cfg.policy, &sgd, ck);
      if (job) job->put_checkpoint(ck);
      write_checkpoint(cfg.out + "/checkpoint.dfp", ck);
    } else if (job && !config.out.empty()) {
      Checkpoint ck;  // rank 0 writes it; the other ranks hand it their own state
      job->put_checkpoint(ck);
    }
    if (on_epoch) on_epoch(em);
    if (cfg.stop_after > 0 && epoch + 1 >= cfg.stop_after) break;
  }
  if (cfg.profile && prof.steps > 0) {
    if (job) {
      const parallel::CommStats& cs = job->stats();
      prof.ranks = job->size();
      prof.allreduce = job->allreduce();
      prof.comm_bytes = cs.bytes;
      prof.comm_fp32_bytes = cs.fp32_bytes;
      prof.comm_in_flight_seconds = cs.in_flight_seconds;
      prof.comm_exposed_seconds = cs.exposed_seconds;
    }
    const std::vector<LayerTime> times = m.layer_times();
    for (const std::string& line : profile_table(times, prof)) say(line);
    if (!cfg.out.empty()) write_profile_json(cfg.out + "/profile.json", times, prof);
  }
  return all;
}

}  // namespace

RefusalOfEveryRank::RefusalOfEveryRank(const Error& error, bool gathered)
    : RefusalOfEveryRank(error, Quiet{parallel::launcher_rank() != 0 && (gathered || parallel::launcher_one_command_line())}) {}

RefusalOfEveryRank::RefusalOfEveryRank(const Error& error, Quiet quiet)
    : Error(error.status(), error.what()), left_to_rank0_(quiet.another_rank_reports) {}

bool command_line_errors_left_to_rank0() noexcept {
  return parallel::launcher_world_size() > 1 && parallel::launcher_rank() != 0 && parallel::launcher_one_command_line();
}

std::vector<EpochMetrics> train(const TrainConfig& cfg, const std::function<void(const std::string&)>& log,
                                const EpochCallback& on_epoch, const StopCheck& should_stop) {
  std::unique_ptr<parallel::Job> job;
  try {
    validate_train_config(cfg);
    // Started by mpirun with more than one process: one rank of a data-parallel job.
    job = parallel::Job::join(cfg);
  } catch (const Error& e) {
    // The settings' refusals, before and while the ranks join: each rank decides them from the
    // same flags (a setting out of range, a batch that does not divide by the ranks).
    if (job_ranks() > 1 && (e.status() == Status::invalid_argument || e.status() == Status::unsupported))
      throw RefusalOfEveryRank(e, false);
    throw;
  }
  if (!job) return run_training(cfg, nullptr, log, on_epoch, should_stop);
  if (job->rank() == 0 && log)
    log("data-parallel job: " + std::to_string(job->size()) + " ranks, global batch " + std::to_string(cfg.batch_size) +
        " (" + std::to_string(cfg.batch_size / job->size()) + " per rank), " + job->allreduce() + " allreduce" +
        (cfg.error_feedback ? " with error feedback" : ""));
  try {
    return run_training(cfg, job.get(), log, on_epoch, {});
  } catch (const RefusalOfEveryRank&) {
    throw;  // the ranks agreed on it (Job::agree_on_start)
  } catch (const Error& e) {
    if (job->agreed()) throw RefusalOfEveryRank(e, true);  // every rank refuses alike and ends normally
    job->abort(e.what());  // one rank failed: the job ends on every rank
  } catch (const std::exception& e) {
    if (job->agreed()) throw;
    job->abort(e.what());
  }
}

std::string precision_label(const TrainConfig& c) {
  return (c.device == "cuda" ? "cuda-" : "") + std::string(precision_name(c.policy.precision));
}

EvalResult evaluate_checkpoint(const std::string& path, const std::string& data_dir, int threads,
                               const std::function<void(const std::string&)>& log) {
  const Checkpoint ck = read_checkpoint(path);
  ContextOptions co;
  co.threads = threads;
  Context ctx(co);
  const std::string dataset = meta_get(ck, "dataset", path);
  const int image_size = ck.meta.count("image_size") ? int(meta_int(ck, "image_size", path, 0, 8192)) : 0;
  const DataShape shape = get_shape(ck, path);
  Dataset test_set = load_dataset(dataset, data_dir.empty() ? meta_get(ck, "data", path) : data_dir, false, image_size);
  check_shape(shape, test_set, "test", path);
  Model m(ctx, meta_get(ck, "model", path));
  build_model(m, meta_get(ck, "model", path), shape.channels, shape.height, shape.width, shape.classes);
  if (ck.meta.count("label_smoothing"))  // the run's test loss
    m.set_label_smoothing(float(meta_real(ck, "label_smoothing", path, 0, 0.999999)));
  m.build(int(meta_int(ck, "batch_size", path, 1, 1 << 20)), get_policy(ck, path));
  load_model(m, nullptr, ck, path);
  Loader loader(ctx, test_set, m.batch(), false, false, augment_for(test_set, false, false), 1);
  const Totals t = run_eval(m, loader);
  EvalResult r;
  r.images = int(t.n);
  r.loss = t.loss / t.n;
  r.top1 = 100.0 * t.c1 / t.n;
  r.top5 = 100.0 * t.c5 / t.n;
  if (log) log("evaluated " + path + " on " + std::to_string(r.images) + " test images");
  return r;
}

}  // namespace dfp
