// The layer registry: one row per LayerKind (dfp/layer_kind.hpp) with everything the library
// knows about the kind beyond its own file -- its names (C++, C, Python, summaries, torch.nn), its
// inputs, its typed parameters by name, its builder, and PyTorch's shapes of its parameters.
#pragma once

#include <vector>

#include "dfp/layer_kind.hpp"
#include "dfp/model.hpp"
#include "dfp/types.hpp"
#include "src/layers/layer.hpp"

namespace dfp::graph {

// PyTorch's shape of one parameter of a layer (Model::state). `padded`: the layer stores it padded to
// whole 16-channel blocks, so the stored tensor may be longer than the shape.
struct TorchShape {
  std::vector<int> dims;  // empty: the kind gives this parameter no shape of its own
  bool padded = false;
};

struct LayerRow {
  LayerKindInfo info;
  LayerParams blank;              // the kind's parameter type at its defaults
  model::BuildLayer* build = nullptr;  // null for the input
  // PyTorch's shape of the layer's weight (`weight`) or other parameter with input `in`; null: the
  // kind has no parameters.
  TorchShape (*torch_shape)(const LayerParams& params, const TensorShape& in, bool weight) = nullptr;
  // Writes field i of info.fields into a LayerParams holding the kind's type.
  std::vector<void (*)(LayerParams&, double)> set;
};

const LayerRow& layer_row(LayerKind kind);

// The shape PyTorch gives parameter `q` of the node `spec`, whose first input has shape `in`, as
// the kind's row says (a Conv2d weight [K][C/groups][R][S], a Linear weight [K][C*H*W], a
// BatchNorm's weight and bias [C], without dfp's padding lanes); empty where the row gives none or
// it does not fit q. dfp keeps each parameter flat, with its values already in PyTorch's order.
std::vector<int> torch_shape(const LayerSpec& spec, const TensorShape& in, const Parameter& q);

}  // namespace dfp::graph
