// The flags of a training run (dfp train, dfp compare) and of its numerics policy (also dfp
// info), the torchvision model names, and run.toml: a run's resolved flags, which
// `dfp train --config DIR/run.toml` reads back to repeat the run.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <sstream>

#include "dfp/isa.hpp"
#include "dfp/models.hpp"
#include "dfp/status.hpp"
#include "src/train/run_files.hpp"
#include "apps/dfp/flags.hpp"

namespace dfp::cli {

namespace {
// torchvision's name -> dfp's, for the networks dfp has under another name. The other
// torchvision names dfp has (resnet18/34/50, vgg11 ... vgg19, alexnet, googlenet) are dfp's own.
const std::pair<const char*, const char*> kTorchvisionAliases[] = {
    {"vgg11_bn", "vgg11bn"}, {"vgg13_bn", "vgg13bn"}, {"vgg16_bn", "vgg16bn"},
    {"vgg19_bn", "vgg19bn"}, {"resnext50_32x4d", "resnext50"},
};

}  // namespace

std::string model_alias(const std::string& name) {
  for (const auto& [torch, ours] : kTorchvisionAliases)
    if (name == torch) return ours;
  return name;
}

std::string model_help() {
  std::string s;
  for (const std::string& name : model_names()) s.append(s.empty() ? "" : ", ").append(name);
  return s + "; torchvision names too: " + model_alias_help();
}

std::string model_alias_help() {
  std::string s;
  for (const auto& [torch, ours] : kTorchvisionAliases) s.append(s.empty() ? "" : ", ").append(torch).append("=").append(ours);
  return s;
}

std::vector<Flag> policy_flags(RunFlags& s) {
  TrainConfig& c = s.config;
  PrecisionPolicy& p = c.policy;
  auto all_classes = [&p](auto set) {
    for (QuantOptions* q : {&p.dfp.weights, &p.dfp.activations, &p.dfp.gradients}) set(*q);
  };
  auto rounding = [](QuantOptions& q) {
    return [&q](const std::string& f, const std::string& v) { q.rounding = parse_rounding(v, f); };
  };
  auto headroom = [](QuantOptions& q) {
    return [&q](const std::string& f, const std::string& v) { q.headroom = to_int(f, v); };
  };
  auto granularity = [](QuantOptions& q) {
    return [&q](const std::string& f, const std::string& v) { q.granularity = parse_granularity(v, f); };
  };
  auto format = [](std::optional<FloatFormat>& o) {
    return [&o](const std::string& f, const std::string& v) { o = parse_float_format(v, f); };
  };
  const std::string g = "Numerics";
  return {
      {"--precision", "P", "fp32|int16|bf16|fp16|fp8|mxfp8|mxfp6|mxfp4|mxint8|posit16|posit16es2",
       [&p](const std::string& f, const std::string& v) { p.precision = parse_precision(v, "flag " + f); }, g},
      {"--keep-fp32", "LAYERS", "layers kept in FP32, e.g. conv1,fc (repeatable)",
       [&s](const std::string&, const std::string& v) { s.keep_fp32 += (s.keep_fp32.empty() ? "" : ",") + v; }, g, true},
      {"--override", "RULES", "per-layer precision, e.g. 'layer*=bf16,fc=fp32' (repeatable; first match wins)",
       [&p](const std::string& f, const std::string& v) {
         const auto more = PrecisionPolicy::parse_overrides(v, "flag " + f);
         p.overrides.insert(p.overrides.end(), more.begin(), more.end());
       }, g, true},
      {"--headroom", "N", "DFP16 exponent headroom of every tensor class (before the per-class flags)",
       [&, all_classes](const std::string& f, const std::string& v) {
         const int h = to_int(f, v);
         all_classes([h](QuantOptions& q) { q.headroom = h; });
       }, g},
      {"--weights-headroom", "N", "DFP16 exponent headroom of the weights", headroom(p.dfp.weights), g},
      {"--activations-headroom", "N", "DFP16 exponent headroom of the activations", headroom(p.dfp.activations), g},
      {"--gradients-headroom", "N", "DFP16 exponent headroom of the gradients", headroom(p.dfp.gradients), g},
      {"--rounding", "R", "nearest|stochastic|biased for every tensor class (before the per-class flags)",
       [all_classes](const std::string& f, const std::string& v) {
         const Rounding r = parse_rounding(v, f);
         all_classes([r](QuantOptions& q) { q.rounding = r; });
       }, g},
      {"--weights-rounding,--round-weights", "R", "rounding of the weights", rounding(p.dfp.weights), g},
      {"--activations-rounding,--round-activations", "R", "rounding of the activations", rounding(p.dfp.activations), g},
      {"--gradients-rounding,--round-gradients", "R", "rounding of the gradients", rounding(p.dfp.gradients), g},
      {"--granularity", "G", "tensor|slice|block32|block64|block128: DFP16 shared exponents per tensor, per slice "
                             "that a pass keeps apart (image, channel, image pair), or per block of 32/64/128 along "
                             "each pass's reduction (Block DFP, emulated), for every tensor class (before the "
                             "per-class flags)",
       [all_classes](const std::string& f, const std::string& v) {
         const Granularity gr = parse_granularity(v, f);
         all_classes([gr](QuantOptions& q) { q.granularity = gr; });
       }, g},
      {"--weights-granularity", "G", "DFP16 exponents of the weights: tensor, per output/input channel (slice), or blockN",
       granularity(p.dfp.weights), g},
      {"--activations-granularity", "G",
       "DFP16 exponents of the activations: tensor, or per image (forward) and per image pair x 16 channels "
       "(weight gradient) (slice), or blockN",
       granularity(p.dfp.activations), g},
      {"--gradients-granularity", "G",
       "DFP16 exponents of the gradients: tensor, or per image (backward-data) and per image pair x 16 channels "
       "(weight gradient) (slice), or blockN",
       granularity(p.dfp.gradients), g},
      {"--weights-format", "FMT", "fp32|bf16|fp16|e4m3|e5m2|e3m2|e2m3|e2m1|int8|posit16|posit16es2 storage of the weights (float precisions)",
       format(p.weights_format), g},
      {"--activations-format", "FMT", "the same for the activations", format(p.activations_format), g},
      {"--gradients-format", "FMT", "the same for the gradients", format(p.gradients_format), g},
      {"--fp8-scaling", "S", "none|current|delayed: the per-tensor power-of-two scale of e4m3/e5m2 tensors (none: "
                             "loss scaling's job; current: this tensor's max; delayed: the max of the last "
                             "--fp8-amax-history tensors, Transformer Engine's DelayedScaling)",
       [&p](const std::string& f, const std::string& v) { p.fp8.scaling = parse_float8_scaling(v, "flag " + f); }, g},
      {"--fp8-amax-history", "N", "delayed scaling: how many past tensors' maxima set the scale (1.." +
                                      std::to_string(kFloat8MaxHistory) + ")",
       [&p](const std::string& f, const std::string& v) { p.fp8.amax_history = to_int(f, v); }, g},
      {"--fp8-margin", "M", "the scale is lowered by M binades below the largest that fits the max (0.." +
                                std::to_string(kFloat8MaxMargin) + ")",
       [&p](const std::string& f, const std::string& v) { p.fp8.margin = to_int(f, v); }, g},
      {"--fp8-overflow", "MODE", "saturate|nonfinite: what a value beyond the format's range becomes (OFP8's "
                                 "saturating conversion, or e5m2 infinity / e4m3 NaN)",
       [&p](const std::string& f, const std::string& v) { p.fp8.overflow = parse_overflow(v, "flag " + f); }, g},
      {"--int16-chain", "bound|N", "INT16 accumulation chain: from the bound, or N steps (tests)",
       [&p](const std::string& f, const std::string& v) {
         p.dfp.chain_override = v == "bound" ? 0 : to_int(f, v);
         DFP_CHECK(p.dfp.chain_override >= 0, Status::invalid_argument, "flag " + f + ": expected 'bound' or N >= 1");
       }, g},
      {"--verify-overflow", "", "recompute with INT64 shadow accumulators and count INT32 overflows (slow)",
       [&p](const std::string&, const std::string&) { p.dfp.verify = true; }, g},
      {"--loss-scaling", "MODE", "none|static|dynamic|adaptive",
       [&s](const std::string& f, const std::string& v) {
         s.config.loss_scale.mode = parse_loss_scale_mode(v, f);
         s.scale_mode_set = true;
       }, g},
      {"--loss-scale", "S", "the (first) loss scale; alone it means static scaling",
       [&s](const std::string& f, const std::string& v) {
         s.config.loss_scale.init_scale = to_float(f, v);
         if (!s.scale_mode_set) s.config.loss_scale.mode = LossScaleMode::fixed;  // apex: a number means static
       }, g},
      {"--scale-growth-interval", "N", "steps between loss-scale growths (dynamic)",
       [&c](const std::string& f, const std::string& v) { c.loss_scale.growth_interval = to_int(f, v); }, g},
  };
}

std::vector<Flag> run_flags(RunFlags& s) {
  TrainConfig& c = s.config;
  auto integer = [](int& field) { return [&field](const std::string& f, const std::string& v) { field = to_int(f, v); }; };
  auto real = [](float& field) { return [&field](const std::string& f, const std::string& v) { field = to_float(f, v); }; };
  auto text = [](std::string& field) { return [&field](const std::string&, const std::string& v) { field = v; }; };
  auto on = [](bool& field, bool value) { return [&field, value](const std::string&, const std::string&) { field = value; }; };
  const std::string m = "Model and data", o = "Optimizer", r = "Run", d = "Data-parallel (mpirun -np N dfp train)";
  return {
      {"-a,--model,--arch", "NAME", model_help(),
       [&c](const std::string&, const std::string& v) { c.model = model_alias(v); }, m},
      {"--dataset", "NAME", "fashion-mnist|mnist|cifar10|cifar100|imagenet-folder|synthetic", text(c.dataset), m},
      {"--data", "DIR", "dataset directory (imagenet-folder: DIR/train/<class>/*.jpg, DIR/val/...; synthetic: classes=K,train=N,test=M)", text(c.data), m},
      {"--image-size", "N", "imagenet-folder, synthetic: side of the input (0 = 224, synthetic 32)", integer(c.image_size), m},
      {"--limit-train", "N", "use only the first N training images (0 = all)", integer(c.limit_train), m},
      {"--limit-test", "N", "use only the first N test images (0 = all)", integer(c.limit_test), m},
      {"--no-augment", "", "no crop/flip augmentation (normalisation stays)", on(c.augment, false), m},
      {"--init-from", "FILE",
       "start from these weights: a torch.save'd state_dict (torchvision names) or a dfp state file or checkpoint; "
       "a classifier of another shape keeps its initial values",
       text(c.init_from), m},
      {"--init-skip", "LAYERS", "with --init-from: tensors or layers left as initialised, globs, e.g. fc,'layer4*' (repeatable)",
       [&c](const std::string& f, const std::string& v) {
         std::stringstream ss(v);
         std::string item;
         while (std::getline(ss, item, ',')) {
           DFP_CHECK(!item.empty(), Status::invalid_argument, "flag " + f + ": '" + v + "' has an empty item; expected names");
           c.init_skip.push_back(item);
         }
       }, m, true},
      {"-j,--workers", "N", "loader threads decoding and augmenting batches (0 = --threads)", integer(c.workers), m},
      {"--epochs", "N", "epochs to train", integer(c.epochs), o},
      {"-b,--batch-size", "N", "images per step", integer(c.batch_size), o},
      {"--lr,--learning-rate", "F", "base learning rate", real(c.lr), o},
      {"--momentum", "F", "SGD momentum", real(c.momentum), o},
      {"--wd,--weight-decay", "F", "weight decay", real(c.weight_decay), o},
      {"--nesterov", "", "Nesterov momentum", on(c.nesterov, true), o},
      {"--schedule", "S", "cosine|step|multistep|constant", text(c.schedule), o},
      {"--warmup-epochs", "N", "linear warm-up epochs", integer(c.warmup_epochs), o},
      {"--milestones", "E1,E2", "multistep: epochs where the rate is multiplied by --gamma",
       [&c](const std::string& f, const std::string& v) {
         std::stringstream ss(v);
         std::string item;
         while (std::getline(ss, item, ',')) c.milestones.push_back(to_int(f, item));
       }, o, true},
      {"--gamma", "F", "step and multistep factor", real(c.gamma), o},
      {"--step-epochs", "N", "step: epochs between rate steps", integer(c.step_epochs), o},
      {"--label-smoothing", "F", "label smoothing in [0, 1)", real(c.label_smoothing), o},
      {"--threads", "N", "compute threads (0 = all cores)", integer(c.threads), r},  // range: validate_train_config
      {"--isa", "LEVEL", dfp::isa_names("|") + " kernels", [&c](const std::string& f, const std::string& v) {
         c.isa = isa_flag(f, v);
       }, r},
      {"--seed", "N", "seed of initialisation, data order and augmentation",
       [&c](const std::string& f, const std::string& v) {
         const int seed = to_int(f, v);
         DFP_CHECK(seed >= 0, Status::invalid_argument, "flag " + f + ": expected >= 0, got " + std::to_string(seed));
         c.seed = static_cast<uint64_t>(seed);
       }, r},
      {"--overwrite", "", "replace the run --out holds (without it, or --resume, such a directory is refused)",
       on(c.overwrite, true), r},
      {"--resume", "FILE", "continue from this checkpoint (bit-identical to an uninterrupted run)", text(c.resume), r},
      {"--label", "NAME", "name of the run in comparisons (default: the precision)", text(c.label), r},
      {"-p,--print-every,--print-freq", "N", "steps between progress lines", integer(c.print_every), r},
      {"--numerics-every", "N", "sample per-layer rounding statistics every N steps (0 = never)",
       integer(c.numerics_interval), r},
      {"--profile", "", "time each layer and the optimizer; a table at the end and DIR/profile.json", on(c.profile, true), r},
      {"--device", "cpu|cuda", "cuda: --precision fp16 (FP32 master weights) or fp32", text(c.device), r},
      {"--cudnn-benchmark", "", "cuda: time cuDNN's convolution algorithms at start-up and take the fastest",
       on(c.cudnn_benchmark, true), r},
      {"--allreduce", "F", "mpirun -np N: the gradients' format between ranks, fp32|bf16|dfp16 (exact INT16 sum)",
       text(c.allreduce), d},
      {"--error-feedback", "", "mpirun, --allreduce dfp16: each rank adds its last rounding error to the next step",
       on(c.error_feedback, true), d},
      {"--sync-bn", "", "mpirun: BatchNorm statistics over all ranks' batch (else each rank's part), as one process with the whole batch",
       on(c.sync_bn, true), d},
      {"--bucket-kib", "N", "mpirun: FP32 KiB of gradients per allreduce bucket", integer(c.bucket_kib), d},
      {"--dist-timeout", "S", "mpirun: seconds a rank waits for the others before the job ends, naming them",
       [&c](const std::string& f, const std::string& v) { c.dist_timeout = to_float(f, v); }, d},
  };
}

Flag out_flag(std::string& out, const std::string& help) {
  return {"--out", "DIR", help,
          [&out](const std::string& f, const std::string& v) {
            DFP_CHECK(!v.empty(), Status::invalid_argument, "flag " + f + ": expected a directory, got an empty path");
            out = v;
          },
          "Run"};
}

std::string run_toml(const TrainConfig& c) { return run_files::run_toml(c); }

void write_run_toml(const std::string& dir, const std::string& text) { run_files::write_run_toml(dir, text); }

}  // namespace dfp::cli
