// The training loop: a run's parts set up (run_setup), its directory taken and its checkpoint
// resumed (run_directory), then epochs of steps through a StepRunner (CPU, CUDA or one rank of a
// data-parallel job), each epoch evaluated, logged and checkpointed.
#include "dfp/trainer.hpp"

#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "dfp/context.hpp"
#include "dfp/models.hpp"
#include "dfp/status.hpp"
#include "src/parallel/job.hpp"
#include "src/train/profile.hpp"
#include "src/train/run_directory.hpp"
#include "src/train/run_setup.hpp"
#include "src/train/step_runner.hpp"

namespace dfp {
namespace {

long peak_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
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

int job_ranks() noexcept { return parallel::launcher_world_size(); }
bool writes_run_files() noexcept { return parallel::launcher_world_size() <= 1 || parallel::launcher_rank() == 0; }
bool under_launcher() noexcept { return parallel::under_launcher(); }

std::string progress_text(const StepProgress& p) {
  char line[256];
  const int bar = p.steps > 0 ? 24 * p.step / p.steps : 0;
  std::snprintf(line, sizeof line, "epoch %d/%d [%-24s] %d/%d loss %.4f top1 %.2f%%%s %.0f img/s eta %.0fs%s",
                p.epoch, p.epochs, std::string(bar, '=').c_str(), p.step, p.steps, p.loss, p.top1,
                p.part_of_job ? " (rank 0's part)" : "", p.images_per_second, p.eta_seconds,
                p.loss_scale == 0 ? "" : (" scale " + fmt_g(p.loss_scale)).c_str());
  return line;
}

namespace {

void say_start(const TrainingRun& run) {
  const TrainConfig& cfg = run.cfg;
  if (run.config.out.empty())
    run.say("note: no --out DIR: this run saves nothing (no checkpoint, metrics.jsonl or run.toml); give --out DIR to "
            "keep its results");
  run.say("model " + cfg.model + ": " + std::to_string(run.model->parameter_count()) + " parameters; " +
          run.policy_text + "; " + cfg.loss_scale.describe());
  if (!run.on_cuda)
    for (const std::string& note : precision_notes(cfg.policy, run.ctx)) run.say(note);
  run.say("data " + run.train_set.name + ": " + std::to_string(run.train_set.count) + " train / " +
          std::to_string(run.test_set.count) + " test images; " + std::to_string(run.ctx.threads()) +
          " threads; kernels " + isa_name(run.ctx.isa()));
}

// One epoch's training steps, as far as they went.
struct EpochPass {
  Totals totals;
  int steps = 0;
  float lr = 0;  // of the last step
  StepClock::time_point start;
  bool stopped = false;  // should_stop ended it
};

// The steps of epoch `epoch`; `step` counts the run's steps.
EpochPass train_epoch(TrainingRun& run, StepRunner& steps, int epoch, int& step, const TrainCallbacks& hooks) {
  const TrainConfig& cfg = run.cfg;
  const LrSchedule& sched = run.sched;
  LossScaler& scaler = run.scaler;
  EpochPass e;
  run.train_loader->start_epoch(epoch);
  e.start = StepClock::now();
  e.lr = sched.at(step);
  Batch b;
  while (run.train_loader->next(b)) {
    e.lr = sched.at(step);
    const double used_scale = scaler.scale();
    const uint64_t skipped_before = scaler.skipped_steps();
    e.totals.add(steps.train_step(b, e.lr));
    if (scaler.skipped_steps() != skipped_before) {
      char line[200];
      std::snprintf(line, sizeof line, "step %d: non-finite gradients at loss scale %g: step skipped (%llu so far); scale now %g",
                    step + 1, used_scale, static_cast<unsigned long long>(scaler.skipped_steps()), scaler.scale());
      run.say(line);
    }
    ++step;
    const int i = ++e.steps;
    if (run.lead() && (hooks.on_step || run.log)) {
      // Every rank trains an equal part of each batch (the batch divides by the ranks): the job's
      // images per second are this rank's times the ranks, as the epoch line counts them.
      const double el = seconds_since(e.start);
      StepProgress p;
      p.epoch = epoch + 1, p.epochs = cfg.epochs, p.step = i, p.steps = sched.steps_per_epoch;
      p.loss = e.totals.loss / e.totals.n, p.top1 = 100.0 * e.totals.c1 / e.totals.n;
      p.images_per_second = double(e.totals.n) * run.ranks() / el;
      p.eta_seconds = (sched.steps_per_epoch - i) * el / i;
      p.loss_scale = cfg.loss_scale.mode == LossScaleMode::none ? 0 : scaler.scale();
      p.part_of_job = run.job != nullptr;
      if (hooks.on_step) hooks.on_step(p);
      else if (i % cfg.print_every == 0 || i == sched.steps_per_epoch) run.say(progress_text(p));
    }
    if (hooks.should_stop && hooks.should_stop()) {
      e.stopped = true;
      break;
    }
  }
  return e;
}

// The epoch's metrics: its training totals (the job's) and the test split's.
EpochMetrics epoch_metrics(TrainingRun& run, StepRunner& steps, int epoch, EpochPass& e) {
  steps.end_epoch(e.totals, epoch);
  const Totals& tr = e.totals;
  EpochMetrics em;
  em.epoch = epoch + 1;
  em.epoch_seconds = seconds_since(e.start);
  em.data_wait_seconds = run.train_loader->data_wait_seconds();
  em.images_per_second = double(tr.n) / em.epoch_seconds;
  em.train_loss = tr.loss / tr.n;
  em.train_top1 = 100.0 * tr.c1 / tr.n;
  em.lr = e.lr;
  const Totals te = steps.evaluate_test();
  em.test_loss = te.loss / te.n;
  em.test_top1 = 100.0 * te.c1 / te.n;
  em.test_top5 = 100.0 * te.c5 / te.n;
  em.peak_rss_kib = peak_rss_kib();
  em.loss_scale = run.scaler.scale();
  em.skipped_steps = run.scaler.skipped_steps();
  return em;
}

std::string epoch_line(const EpochMetrics& em, const TrainConfig& cfg) {
  char line[320];
  std::snprintf(line, sizeof line,
                "epoch %d/%d done: train loss %.4f top1 %.2f%% | test loss %.4f top1 %.2f%% top5 %.2f%% | %.0f img/s, "
                "data wait %.2fs, peak RSS %.0f MiB%s",
                em.epoch, cfg.epochs, em.train_loss, em.train_top1, em.test_loss, em.test_top1, em.test_top5,
                em.images_per_second, em.data_wait_seconds, em.peak_rss_kib / 1024.0,
                cfg.loss_scale.mode == LossScaleMode::none && em.skipped_steps == 0
                    ? ""
                    : (", loss scale " + fmt_g(em.loss_scale) + ", skipped " + std::to_string(em.skipped_steps)).c_str());
  return line;
}

// The run, alone (job null) or as one rank of a data-parallel job: rank 0 alone logs and writes
// the run's files.
std::vector<EpochMetrics> run_training(const TrainConfig& config, parallel::Job* job, const TrainCallbacks& hooks) {
  TrainingRun run(config, job, hooks.log);
  const TrainConfig& cfg = run.cfg;
  RunDirectory dir(cfg.out);
  const ResumePoint from = resume(run);
  if (from.finished) return {};
  StepProfile prof;
  const std::unique_ptr<StepRunner> steps = make_step_runner(run, cfg.profile ? &prof : nullptr);
  dir.start(run, from);
  say_start(run);

  std::vector<EpochMetrics> all;
  int step = from.start_epoch * run.sched.steps_per_epoch;
  for (int epoch = from.start_epoch; epoch < cfg.epochs; ++epoch) {
    EpochPass pass = train_epoch(run, *steps, epoch, step, hooks);
    if (pass.stopped) {
      run.say("stopped in epoch " + std::to_string(epoch + 1) + " after step " + std::to_string(pass.steps) + "; " +
              (epoch > 0 ? "the checkpoint holds epochs 1-" + std::to_string(epoch) : std::string("no epoch was done")));
      break;
    }
    const EpochMetrics em = epoch_metrics(run, *steps, epoch, pass);
    prof.data_wait_seconds += em.data_wait_seconds;
    all.push_back(em);
    run.say(epoch_line(em, cfg));
    if (dir.writes()) {
      dir.append_metrics(metrics_line(em, run.policy_text, run.model->numerics()));
      steps->sync_host_model();
      Checkpoint ck = dir.checkpoint(run, epoch + 1, step, from.epochs_plan);
      steps->add_to_checkpoint(ck);
      dir.write(ck);
    } else if (job && !config.out.empty()) {
      Checkpoint ck;  // rank 0 writes it; the other ranks hand it their own state
      steps->add_to_checkpoint(ck);
    }
    if (hooks.on_epoch) hooks.on_epoch(em);
    if (cfg.stop_after > 0 && epoch + 1 >= cfg.stop_after) break;
  }
  if (cfg.profile && prof.steps > 0) {
    steps->add_to_profile(prof);
    const std::vector<LayerTime> times = run.model->layer_times();
    for (const std::string& line : profile_table(times, prof)) run.say(line);
    if (dir.writes()) write_profile_json(dir.path("profile.json"), times, prof);
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

std::vector<EpochMetrics> train(const TrainConfig& cfg, const TrainCallbacks& hooks) {
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
  if (!job) return run_training(cfg, nullptr, hooks);
  if (job->rank() == 0 && hooks.log)
    hooks.log("data-parallel job: " + std::to_string(job->size()) + " ranks, global batch " + std::to_string(cfg.batch_size) +
        " (" + std::to_string(cfg.batch_size / job->size()) + " per rank), " + job->allreduce() + " allreduce" +
        (cfg.error_feedback ? " with error feedback" : ""));
  try {
    return run_training(cfg, job.get(), {hooks.log, hooks.on_epoch, hooks.on_step, {}});
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
  const Totals t = evaluate(m, loader);
  EvalResult r;
  r.images = int(t.n);
  r.loss = t.loss / t.n;
  r.top1 = 100.0 * t.c1 / t.n;
  r.top5 = 100.0 * t.c5 / t.n;
  if (log) log("evaluated " + path + " on " + std::to_string(r.images) + " test images");
  return r;
}

}  // namespace dfp
