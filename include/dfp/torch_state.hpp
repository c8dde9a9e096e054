// dfp: weights to and from PyTorch, without Python or libtorch.
//
// load_torch_state_dict reads a file written by torch.save(model.state_dict(), path) (torch >=
// 1.6's zip format; float32, float16 and bfloat16 tensors, widened to FP32; int64 BatchNorm
// counters) into a built zoo model; save_torch_state_dict writes the model's weights as such a
// file, which torch.load reads and torchvision's load_state_dict(strict=True) accepts. The reader
// interprets only the pickle opcodes and the handful of globals a state_dict uses (never running
// or calling anything a file names), checks every size and offset against the file, and refuses
// anything else with an error naming the file and what it found (docs/design/torch-format.md).
//
// Names: dfp's models use torchvision's parameter names and shapes, except where one table per
// model family (torch_names.cpp) maps them: VGG's feature indices and classifier, GoogLeNet's
// BasicConv2d ".conv", the final Linear of VGG and alexnet_tv ("fc" here, "classifier.6" there).
// Tensors torchvision has and dfp does not -- BatchNorm's num_batches_tracked, GoogLeNet's
// auxiliary classifiers aux1/aux2 -- are ignored on loading; num_batches_tracked is written on
// saving (the model's step count).
#pragma once

#include <string>
#include <vector>

#include "dfp/model.hpp"

namespace dfp {

struct WeightsOptions {
  // true: a model tensor the file lacks, a file tensor the model has no place for, or a shape that
  // differs is an error listing every one; false: they are reported in WeightsReport and the
  // model's tensors concerned keep their values.
  bool strict = true;
  // Glob patterns ('*' and '?') on dfp names, of a tensor ("fc.weight") or of its layer ("fc",
  // "layer4*"): such model tensors keep their values and are not required, such file tensors are
  // not read.
  std::vector<std::string> skip;
  // The classifier (the Linear layer the loss reads) keeps its values when its shape differs from
  // the file's: fine-tuning to another number of classes. Reported in WeightsReport::skipped.
  bool skip_mismatched_classifier = false;
  // The first convolution (the one reading the model's input) takes a file weight made for another
  // number of input channels as fine-tuning tools do (timm's adapt_input_conv): an RGB weight is
  // summed over its channels for a one-channel model (Fashion-MNIST from ImageNet weights);
  // otherwise the file's channels repeat up to the model's and are scaled by file / model
  // channels. Reported in WeightsReport::adapted.
  bool adapt_input_channels = false;
  // The zoo architecture whose name table applies; "" = model.name() (the zoo name when the
  // model comes from build_model, the trainer or dfp.Model.from_zoo).
  std::string architecture;
};

// What loading did, by dfp name (a file tensor the model has no place for by the file's name).
struct WeightsReport {
  std::string file;
  std::string format;                   // "torch" (a torch.save file) or "dfp" (a state file or checkpoint)
  std::vector<std::string> loaded;
  std::vector<std::string> skipped;     // WeightsOptions::skip or the mismatched classifier, with why
  std::vector<std::string> missing;     // strict=false: model tensors the file lacks
  std::vector<std::string> unexpected;  // strict=false: file tensors the model has no place for
  std::vector<std::string> mismatched;  // strict=false: "name: file AxB, model CxD"
  std::vector<std::string> ignored;     // torchvision tensors dfp has no counterpart of
  std::vector<std::string> adapted;     // adapt_input_channels: "name: file AxB, model CxD (how)"
  // A few lines for a log: what was loaded, and each non-empty list (long lists shortened).
  std::vector<std::string> lines() const;
};

// Reads a torch.save'd state_dict into the built model (then weights_updated()). Everything is
// checked before anything is copied: a refused file leaves the model as it was. Errors name the
// file: Error(io_error) when it cannot be read, Error(corrupt_data) for a damaged file,
// Error(unsupported) for a file that is not a state_dict of supported tensors, and
// Error(invalid_argument) listing the missing, unexpected and mismatched tensors (strict).
WeightsReport load_torch_state_dict(Model& model, const std::string& path, const WeightsOptions& options = {});

// Writes the built model's parameters and buffers, with torchvision's names, as torch.save does
// (atomically: `path` holds the old file or the new one). `architecture` as WeightsOptions's.
void save_torch_state_dict(Model& model, const std::string& path, const std::string& architecture = "");

// load_torch_state_dict for a torch.save file, the same rules for a dfp state file or training
// checkpoint (save_state, checkpoint.dfp: dfp names, no name table): what `dfp train --init-from`
// reads. The format is told by the file's first bytes.
WeightsReport load_weights(Model& model, const std::string& path, const WeightsOptions& options = {});

// Writes the model state held in a dfp state file or training checkpoint (`dfp_file`, whose meta
// field "model" names the architecture) as a torch.save state_dict at `path`, without building
// the model: what `dfp export --to-torch` does.
void export_torch_state_dict(const std::string& dfp_file, const std::string& path);

// The torchvision name of the dfp tensor `name` in `architecture`'s name table (the name itself
// where the table maps nothing).
std::string torch_name(const std::string& architecture, const std::string& name);

}  // namespace dfp
