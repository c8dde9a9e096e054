// The layer registry (src/graph/layer_registry.hpp): one row per layer kind. A new kind is its
// layer's file in src/layers/ (the class and its builder), its LayerKind and parameter type in
// dfp/layer_kind.hpp, and one row here; Model::layer, the C API's dfp_model_layer, Python's
// Model.layer, dfp.torch.compile (through the torch.nn module named in the row) and Model::state
// (through the row's PyTorch shapes) reach it from the row.
#include "src/graph/layer_registry.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "dfp/status.hpp"
#include "src/layers/layer_args.hpp"

namespace dfp::model {
// The builders, each defined in its layer's file.
BuildLayer build_conv, build_batchnorm, build_relu, build_maxpool, build_avgpool, build_global_avgpool,
    build_flatten, build_linear, build_add, build_concat, build_dropout, build_lrn, build_shortcut_pad;
}  // namespace dfp::model

namespace dfp::graph {
namespace {

template <auto M>
struct MemberOf;
template <class P, class T, T P::*M>
struct MemberOf<M> {
  using Params = P;
  using Value = T;
};

struct Field {
  LayerField info;
  void (*set)(LayerParams&, double);
};

// A parameter of the kind's type, named `name` (and `torch` on the torch.nn module), with the
// type's default unless `required`.
template <auto M>
Field field(const char* name, const char* torch, bool required = false) {
  using P = typename MemberOf<M>::Params;
  using T = typename MemberOf<M>::Value;
  Field f;
  f.info.name = name;
  f.info.torch_name = torch;
  f.info.type = std::is_same_v<T, bool>     ? LayerField::Type::boolean
                : std::is_integral_v<T>     ? LayerField::Type::integer
                                            : LayerField::Type::real;
  f.info.required = required;
  f.info.default_value = double(P{}.*M);
  f.set = [](LayerParams& p, double v) { std::get<P>(p).*M = T(v); };
  return f;
}

LayerRow row(LayerKind kind, const char* name, const char* short_name, const char* torch, int inputs,
             LayerParams blank, model::BuildLayer* build, std::vector<Field> fields = {},
             TorchShape (*torch_shape)(const LayerParams&, const TensorShape&, bool) = nullptr) {
  LayerRow r;
  r.info = {kind, name, short_name, torch, inputs, {}};
  r.blank = blank;
  r.build = build;
  r.torch_shape = torch_shape;
  for (Field& f : fields) {
    r.info.fields.push_back(std::move(f.info));
    r.set.push_back(f.set);
  }
  return r;
}

TorchShape conv_shape(const LayerParams& params, const TensorShape& in, bool weight) {
  const auto& q = std::get<ConvParams>(params);
  if (!weight) return {};
  return {{q.out_channels, in.c / std::max(1, q.groups), q.kernel, q.kernel}};
}
TorchShape linear_shape(const LayerParams& params, const TensorShape& in, bool weight) {
  const auto& q = std::get<LinearParams>(params);
  if (!weight) return {};
  return {{q.out_features, in.c * in.h * in.w}};
}
TorchShape batchnorm_shape(const LayerParams&, const TensorShape& in, bool) { return {{in.c}, true}; }

using L = LayerKind;
using monostate = std::monostate;

// In LayerKind's order (checked when the table is first read).
const std::vector<LayerRow>& rows() {
  static const std::vector<LayerRow> table = [] {
    std::vector<LayerRow> t = {
        row(L::input, "input", "input", "", 0, monostate{}, nullptr),
        row(L::conv, "conv", "conv", "Conv2d", 1, ConvParams{}, model::build_conv,
            {field<&ConvParams::out_channels>("out_channels", "out_channels", true),
             field<&ConvParams::kernel>("kernel", "kernel_size", true), field<&ConvParams::stride>("stride", "stride"),
             field<&ConvParams::pad>("pad", "padding"), field<&ConvParams::bias>("bias", ""),
             field<&ConvParams::groups>("groups", "groups")},
            conv_shape),
        row(L::batchnorm, "batchnorm", "bn", "BatchNorm2d", 1, BatchNormParams{}, model::build_batchnorm,
            {field<&BatchNormParams::eps>("eps", "eps")}, batchnorm_shape),
        row(L::relu, "relu", "relu", "ReLU", 1, monostate{}, model::build_relu),
        row(L::maxpool, "maxpool", "maxpool", "MaxPool2d", 1, PoolParams{}, model::build_maxpool,
            {field<&PoolParams::kernel>("kernel", "kernel_size", true),
             field<&PoolParams::stride>("stride", "stride", true), field<&PoolParams::pad>("pad", "padding"),
             field<&PoolParams::ceil_mode>("ceil_mode", "ceil_mode")}),
        row(L::avgpool, "avgpool", "avgpool", "AvgPool2d", 1, PoolParams{}, model::build_avgpool,
            {field<&PoolParams::kernel>("kernel", "kernel_size", true),
             field<&PoolParams::stride>("stride", "stride", true), field<&PoolParams::pad>("pad", "padding")}),
        row(L::global_avgpool, "global_avgpool", "gap", "", 1, monostate{}, model::build_global_avgpool),
        row(L::flatten, "flatten", "flatten", "", 1, monostate{}, model::build_flatten),
        row(L::linear, "linear", "fc", "Linear", 1, LinearParams{}, model::build_linear,
            {field<&LinearParams::out_features>("out_features", "out_features", true),
             field<&LinearParams::bias>("bias", "")},
            linear_shape),
        row(L::add, "add", "add", "", 2, monostate{}, model::build_add),
        row(L::concat, "concat", "concat", "", -1, monostate{}, model::build_concat),
        row(L::dropout, "dropout", "dropout", "", 1, DropoutParams{}, model::build_dropout,
            {field<&DropoutParams::p>("p", "p", true)}),
        row(L::lrn, "lrn", "lrn", "LocalResponseNorm", 1, LrnParams{}, model::build_lrn,
            {field<&LrnParams::size>("size", "size", true), field<&LrnParams::alpha>("alpha", "alpha"),
             field<&LrnParams::beta>("beta", "beta"), field<&LrnParams::k>("k", "k")}),
        row(L::shortcut_pad, "shortcut_pad", "shortcut", "", 1, ShortcutPadParams{}, model::build_shortcut_pad,
            {field<&ShortcutPadParams::out_channels>("out_channels", "", true),
             field<&ShortcutPadParams::stride>("stride", "", true)}),
    };
    for (size_t i = 0; i < t.size(); ++i)
      DFP_CHECK(size_t(t[i].info.kind) == i, Status::internal, "layer registry: row " + std::to_string(i) + " out of order");
    return t;
  }();
  return table;
}

const char* const kParamTypes[] = {"no parameters", "ConvParams", "BatchNormParams", "PoolParams", "LinearParams",
                                   "DropoutParams", "LrnParams", "ShortcutPadParams"};
static_assert(std::size(kParamTypes) == std::variant_size_v<LayerParams>);

std::string kind_list() {
  std::string s;
  for (const LayerKindInfo& k : layer_kinds()) s += (s.empty() ? "" : ", ") + k.name;
  return s;
}

}  // namespace

const LayerRow& layer_row(LayerKind kind) {
  const auto& t = rows();
  DFP_CHECK(size_t(kind) < t.size(), Status::invalid_argument,
            "layer kind " + std::to_string(int(kind)) + " is not one of dfp's (" + kind_list() + ")");
  return t[size_t(kind)];
}

std::vector<int> torch_shape(const LayerSpec& spec, const TensorShape& in, const Parameter& q) {
  const LayerRow& row = layer_row(spec.kind);
  if (!row.torch_shape) return {};
  const bool weight = q.name.size() > 7 && q.name.compare(q.name.size() - 7, 7, ".weight") == 0;
  TorchShape t = row.torch_shape(spec.params, in, weight);
  size_t elements = 1;
  for (int d : t.dims) elements *= size_t(d);
  if (t.dims.empty() || elements > q.size || (elements < q.size && !t.padded)) return {};
  return std::move(t.dims);
}

}  // namespace dfp::graph

namespace dfp {

const std::vector<LayerKindInfo>& layer_kinds() {
  static const std::vector<LayerKindInfo> kinds = [] {
    std::vector<LayerKindInfo> v;
    for (const graph::LayerRow& r : graph::rows())
      if (r.info.kind != LayerKind::input) v.push_back(r.info);
    return v;
  }();
  return kinds;
}

const LayerKindInfo& layer_kind(LayerKind kind) { return graph::layer_row(kind).info; }

const LayerKindInfo& layer_kind(const std::string& name) {
  for (const graph::LayerRow& r : graph::rows())
    if (r.info.name == name || r.info.short_name == name) return r.info;
  fail(Status::invalid_argument, "layer kind '" + name + "' is not one of dfp's (" + graph::kind_list() + ")");
}

LayerParams layer_params(LayerKind kind, const std::vector<std::pair<std::string, double>>& values,
                         const std::string& where) {
  const graph::LayerRow& r = graph::layer_row(kind);
  const std::string at = where + ": " + r.info.name;
  LayerParams p = r.blank;
  std::vector<bool> given(r.info.fields.size(), false);
  for (const auto& [name, value] : values) {
    size_t i = 0;
    while (i < r.info.fields.size() && r.info.fields[i].name != name) ++i;
    if (i == r.info.fields.size()) {
      std::string names;
      for (const LayerField& f : r.info.fields) names += (names.empty() ? "" : ", ") + f.name;
      fail(Status::invalid_argument, at + " has no parameter '" + name + "' (" +
                                         (names.empty() ? std::string("it takes none") : "it takes " + names) + ")");
    }
    const LayerField& f = r.info.fields[i];
    DFP_CHECK(!given[i], Status::invalid_argument, at + ": parameter '" + name + "' given twice");
    given[i] = true;
    const std::string got = std::to_string(value);
    switch (f.type) {
      case LayerField::Type::boolean:
        DFP_CHECK(value == 0 || value == 1, Status::invalid_argument,
                  at + ": parameter '" + name + "' expected a boolean (0 or 1), got " + got);
        break;
      case LayerField::Type::integer:
        DFP_CHECK(std::isfinite(value) && value == std::floor(value) && std::fabs(value) <= 2147483647.0,
                  Status::invalid_argument, at + ": parameter '" + name + "' expected an integer, got " + got);
        break;
      case LayerField::Type::real:
        break;  // the builder checks its range (NaN included) and names it
    }
    r.set[i](p, value);
  }
  for (size_t i = 0; i < given.size(); ++i)
    DFP_CHECK(given[i] || !r.info.fields[i].required, Status::invalid_argument,
              at + ": parameter '" + r.info.fields[i].name + "' is required");
  return p;
}

void layer_params_mismatch(const std::string& name, LayerKind kind) {
  fail(Status::invalid_argument, "layer '" + name + "' of kind " + layer_kind(kind).name + " holds " +
                                     graph::kParamTypes[graph::layer_row(kind).blank.index()] +
                                     ", not the parameters asked for");
}

}  // namespace dfp
