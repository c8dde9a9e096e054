// dfp: the kinds of layer a model is made of, and each kind's typed parameters.
//
// Model::layer(kind, inputs, params) builds any kind; Model's named builders (conv, batchnorm,
// ...) are the same call with the parameters spelled out. layer_kinds() describes every kind as the
// registry holds it: the name the C API (dfp_model_layer) and Python (Model.layer) take, the short
// name summaries and reports print, the torch.nn module it stands for, and its parameters by name,
// so a program reaches a new kind without a function of its own.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace dfp {

enum class LayerKind : uint8_t {
  input,
  conv,            // Conv2d (grouped when groups > 1)
  batchnorm,       // BatchNorm2d
  relu,
  maxpool,
  avgpool,
  global_avgpool,  // AdaptiveAvgPool2d(1)
  flatten,
  linear,
  add,             // two inputs
  concat,          // one or more inputs, along channels
  dropout,
  lrn,             // LocalResponseNorm, across channels
  shortcut_pad,    // ResNet's "option A" shortcut: subsample by stride, zero channels up to out_channels
};

// Each kind's parameters, with PyTorch's meanings. A kind without parameters takes std::monostate.
struct ConvParams {
  int out_channels = 0;
  int kernel = 0;
  int stride = 1;
  int pad = 0;
  bool bias = false;
  int groups = 1;  // divides the input and output channels; output group g reads input group g
};
struct BatchNormParams {
  double eps = 1e-5;  // added to the variance
};
struct PoolParams {     // maxpool, avgpool
  int kernel = 0;
  int stride = 0;
  int pad = 0;          // at most half the window
  bool ceil_mode = false;  // maxpool only
};
struct LinearParams {
  int out_features = 0;
  bool bias = true;
};
struct DropoutParams {
  float p = 0.f;  // in [0, 1)
};
struct LrnParams {
  int size = 0;
  float alpha = 1e-4f, beta = 0.75f, k = 1.f;
};
struct ShortcutPadParams {
  int out_channels = 0;
  int stride = 1;
};
using LayerParams = std::variant<std::monostate, ConvParams, BatchNormParams, PoolParams, LinearParams,
                                 DropoutParams, LrnParams, ShortcutPadParams>;

// One parameter of a kind, as the registry describes it.
struct LayerField {
  enum class Type : uint8_t { integer, real, boolean };
  std::string name;        // as Model::layer by name, dfp_model_layer and Model.layer take it
  std::string torch_name;  // the torch.nn module's attribute holding it ("" where torch has none)
  Type type = Type::integer;
  bool required = false;   // else default_value applies
  double default_value = 0;
};

// One kind, as the registry describes it.
struct LayerKindInfo {
  LayerKind kind = LayerKind::input;
  std::string name;          // "batchnorm": the builder's name in C++, C ("dfp_model_<name>") and Python
  std::string short_name;    // "bn": LayerSpec summaries, LayerTime::kind, metrics and the report
  std::string torch_module;  // "BatchNorm2d": the torch.nn module it stands for ("" for none)
  int inputs = 1;            // how many inputs it takes; -1: one or more
  std::vector<LayerField> fields;
};

// Every kind but the input, in the order of LayerKind.
const std::vector<LayerKindInfo>& layer_kinds();
// The kind's row; `name` may be its name or short name. Unknown names fail with
// Status::invalid_argument listing the kinds.
const LayerKindInfo& layer_kind(LayerKind kind);
const LayerKindInfo& layer_kind(const std::string& name);
// Typed parameters for `kind` from named values (a boolean as 0 or 1), checked against its fields:
// an unknown name, a missing required one or a fraction for an integer fails with
// Status::invalid_argument naming `where`, the field and what was expected.
LayerParams layer_params(LayerKind kind, const std::vector<std::pair<std::string, double>>& values,
                         const std::string& where);
// Fails with Status::invalid_argument: layer `name` of `kind` holds another kind's parameters.
[[noreturn]] void layer_params_mismatch(const std::string& name, LayerKind kind);

}  // namespace dfp
