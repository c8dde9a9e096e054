// A training run's parts (src/train/run_setup.hpp).
#include "src/train/run_setup.hpp"

#include <limits>

#include "dfp/cuda.hpp"
#include "dfp/models.hpp"
#include "dfp/status.hpp"
#include "dfp/torch_state.hpp"

namespace dfp {
namespace {

// The run's precision as the metrics and checkpoints record it; refuses what --device cuda cannot
// run (before anything is loaded).
std::string policy_text_of(const TrainConfig& cfg) {
  if (cfg.device != "cuda") return cfg.policy.describe();
  if (std::string why; !cuda_available(&why)) fail(Status::unsupported, "flag --device cuda: " + why);
  DFP_CHECK(cfg.policy.precision == Precision::fp16 || cfg.policy.precision == Precision::fp32,
            Status::invalid_argument,
            std::string("flag --precision with --device cuda: expected fp16 or fp32, got ") +
                precision_name(cfg.policy.precision));
  const bool fp16 = cfg.policy.precision == Precision::fp16;
  DFP_CHECK(!fp16 || cfg.loss_scale.mode != LossScaleMode::adaptive, Status::unsupported,
            "flag --loss-scaling adaptive: layer-wise scaling runs on the CPU only; use dynamic or static with --device cuda");
  std::string text = "device=cuda precision=";
  text += precision_name(cfg.policy.precision);
  if (fp16) text.append(" ").append(cfg.loss_scale.describe());
  return text;
}

ContextOptions context_options(const TrainConfig& cfg) {
  ContextOptions co;
  co.threads = cfg.threads;
  co.isa = cfg.isa;
  co.seed = cfg.seed;
  return co;
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

}  // namespace

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

std::vector<Setting> machine_settings(const Context& ctx) {
  return {{"threads", "--threads", std::to_string(ctx.threads()), Setting::literal},
          {"isa", "--isa", isa_name(ctx.isa()), Setting::text}};
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

TrainingRun::TrainingRun(const TrainConfig& given, parallel::Job* job_in,
                         const std::function<void(const std::string&)>& log_in)
    : config(given),
      cfg(given),
      job(job_in),
      log(!job_in || job_in->rank() == 0 ? log_in : nullptr),
      on_cuda(given.device == "cuda"),
      policy_text(policy_text_of(given)),
      ctx(context_options(given)),
      scaler(given.loss_scale) {
  if (!lead()) cfg.out.clear();
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
    model = std::make_unique<Model>(ctx, cfg.model);
    build_model(*model, cfg.model, train_set.channels, train_set.height, train_set.width, train_set.classes);
  } catch (const Error& e) {
    if (!job) throw;
    failed = e;
  }
  // Every rank reads the data and builds the model alike: a wrong --data or --model fails them
  // all, and the job says it once.
  if (job) job->agree_on_start(failed ? &*failed : nullptr);
  Model& m = *model;
  m.set_label_smoothing(cfg.label_smoothing);
  m.set_loss_scaling(cfg.loss_scale);  // before build(): the memory plan depends on it
  m.build(cfg.batch_size / ranks(), cfg.policy);  // each rank's part of the batch
  m.set_numerics_interval(cfg.numerics_interval);
  m.set_profiling(cfg.profile);
  sgd = std::make_unique<Sgd>(ctx, m, SgdOptions{cfg.momentum, cfg.weight_decay, cfg.nesterov});
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
  train_loader = std::make_unique<Loader>(ctx, train_set, cfg.batch_size, true, true,
                                          augment_for(train_set, true, cfg.augment), cfg.seed, cfg.workers);
  test_loader = std::make_unique<Loader>(ctx, test_set, cfg.batch_size, false, false,
                                         augment_for(test_set, false, false), cfg.seed, cfg.workers);
  if (job) {
    train_loader->set_shard(job->rank(), ranks());
    test_loader->set_shard(job->rank(), ranks());
  }

  sched.kind = parse_schedule(cfg.schedule, "flag --schedule");
  sched.base = cfg.lr;
  sched.steps_per_epoch = train_loader->batches_per_epoch();
  DFP_CHECK(int64_t{cfg.epochs} * sched.steps_per_epoch <= std::numeric_limits<int>::max(), Status::invalid_argument,
            "flag --epochs: " + std::to_string(cfg.epochs) + " epochs of " + std::to_string(sched.steps_per_epoch) +
                " steps exceed the step counter; expected at most " +
                std::to_string(std::numeric_limits<int>::max() / sched.steps_per_epoch) + " epochs");
  sched.total_steps = cfg.epochs * sched.steps_per_epoch;
  sched.warmup_steps = cfg.warmup_epochs * sched.steps_per_epoch;
  sched.gamma = cfg.gamma;
  sched.milestones = cfg.milestones;
  sched.step_epochs = cfg.step_epochs;

  settings = result_settings(cfg, policy_text);
  machine = machine_settings(ctx);
  // The reducer goes before the model it hooks into, also when a refusal below ends the run.
  attached.emplace(job);
  if (job) {
    std::string text = "allreduce=" + cfg.allreduce + "\nerror_feedback=" + (cfg.error_feedback ? "1" : "0") +
                       "\nsync_bn=" + (cfg.sync_bn ? "1" : "0") +
                       "\nbucket_kib=" + std::to_string(cfg.bucket_kib) + "\nresume=" + cfg.resume + "\nout=" + config.out;
    for (const Setting& st : settings) text += std::string("\n") + st.key + "=" + st.value;
    job->check_same_run(text, train_set, test_set);
    job->attach(ctx, m, cfg);
    job->broadcast_state(m);  // rank 0's initial weights everywhere
  }
}

}  // namespace dfp
