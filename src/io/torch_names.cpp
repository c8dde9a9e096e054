// The name tables between dfp's zoo (models/zoo.cpp) and torchvision, one per model family. dfp's
// models take torchvision's parameter names and shapes where they can; these tables hold the
// exceptions. Every family: BatchNorm's num_batches_tracked is torchvision's alone (dfp does not
// count batches per layer): ignored on loading, written as the model's step count on saving.
#include "src/io/torch_names.hpp"

#include <string_view>

namespace dfp::torch_format {
namespace {

bool starts(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends(std::string_view s, std::string_view p) { return s.size() >= p.size() && s.substr(s.size() - p.size()) == p; }

// ResNet-18/34/50 (also the CIFAR-stem "c" variants), ResNeXt-50: the names match exactly.
bool is_resnet(const std::string& a) {
  for (const char* n : {"resnet18", "resnet34", "resnet50", "resnext50"})
    if (a == n || a == std::string(n) + "c") return true;
  return false;
}

// VGG: dfp names its convolutions features.0, features.1, ... (one index per conv, BatchNorm as
// "<conv>.bn"); torchvision's features are one Sequential that also counts the BatchNorm, ReLU and
// max-pool modules, and its last Linear is classifier.6 (dfp's "fc").
int vgg_depth(const std::string& a) {
  for (int d : {11, 13, 16, 19})
    if (a == "vgg" + std::to_string(d) || a == "vgg" + std::to_string(d) + "bn") return d;
  return 0;
}
bool is_vgg(const std::string& a) { return vgg_depth(a) != 0; }
std::string vgg_name(const std::string& a, const std::string& name) {
  if (starts(name, "fc.")) return "classifier.6." + name.substr(3);
  if (!starts(name, "features.")) return name;
  const size_t dot = name.find('.', 9);
  if (dot == std::string::npos || dot == 9 || dot > 15 || name.find_first_not_of("0123456789", 9) != dot) return name;
  const int conv = std::stoi(name.substr(9, dot - 9));
  const int depth = vgg_depth(a);
  const bool bn = ends(a, "bn");
  // Convolutions per stage (torchvision's cfgs "A", "B", "D", "E").
  const int per_stage[4][5] = {{1, 1, 2, 2, 2}, {2, 2, 2, 2, 2}, {2, 2, 3, 3, 3}, {2, 2, 4, 4, 4}};
  const int* stages = per_stage[depth == 11 ? 0 : depth == 13 ? 1 : depth == 16 ? 2 : 3];
  int index = 0, seen = 0;
  for (int s = 0; s < 5; ++s) {
    for (int c = 0; c < stages[s]; ++c, ++seen) {
      if (seen == conv) {
        std::string rest = name.substr(dot);  // ".weight", ".bias", ".bn.weight", ...
        if (starts(rest, ".bn.")) return "features." + std::to_string(index + 1) + rest.substr(3);
        return "features." + std::to_string(index) + rest;
      }
      index += bn ? 3 : 2;  // Conv2d, [BatchNorm2d], ReLU
    }
    ++index;  // MaxPool2d
  }
  return name;
}

// GoogLeNet: torchvision's BasicConv2d holds the convolution as ".conv" beside its ".bn"; dfp's
// convolution carries the block's name. The auxiliary classifiers (aux1, aux2; trained only with
// aux_logits=True) are not built by dfp.
bool is_googlenet(const std::string& a) { return a == "googlenet"; }
std::string googlenet_name(const std::string&, const std::string& name) {
  if (name == "fc.weight" || name.find(".bn.") != std::string::npos || !ends(name, ".weight")) return name;
  return name.substr(0, name.size() - 7) + ".conv.weight";
}

// torchvision's AlexNet (dfp's alexnet_tv): features.* as torchvision names them; the last Linear
// is classifier.6 (dfp's "fc").
bool is_alexnet_tv(const std::string& a) { return a == "alexnet_tv"; }
std::string alexnet_tv_name(const std::string&, const std::string& name) {
  return starts(name, "fc.") ? "classifier.6." + name.substr(3) : name;
}

bool is_alexnet(const std::string& a) { return a == "alexnet"; }
bool any(const std::string&) { return true; }

const NameTable kTables[] = {
    {"resnet", is_resnet, nullptr, {"*.num_batches_tracked"}, ""},
    {"vgg", is_vgg, vgg_name, {"*.num_batches_tracked"}, ""},
    {"googlenet", is_googlenet, googlenet_name, {"*.num_batches_tracked", "aux1.*", "aux2.*"}, ""},
    {"alexnet_tv", is_alexnet_tv, alexnet_tv_name, {}, ""},
    // dfp's alexnet is the paper's (96-256-384-384-256 channels, LRN); torchvision has no such model.
    {"alexnet", is_alexnet, nullptr, {},
     "dfp's alexnet is Krizhevsky et al.'s with LRN; torchvision's AlexNet is dfp's alexnet_tv"},
    // Any other model (lenet, the CIFAR ResNets, a model built layer by layer): dfp's names as they are.
    {"dfp", any, nullptr, {"*.num_batches_tracked"}, ""},
};

}  // namespace

const NameTable& name_table(const std::string& architecture) {
  for (const NameTable& t : kTables)
    if (t.covers(architecture)) return t;
  return kTables[std::size(kTables) - 1];
}

}  // namespace dfp::torch_format
