// PyTorch's shape of a model parameter (Model::state, TensorView): dfp keeps each parameter flat,
// with its values already in PyTorch's order.
#pragma once

#include <cstddef>
#include <vector>

#include "dfp/model.hpp"

namespace dfp::graph {

struct TorchShape {
  std::vector<int> dims;  // empty: none but the flat one
  size_t elements = 0;
};

// The shape PyTorch gives parameter `q` of the node `spec`, whose first input has shape `in`: a
// Conv2d weight [K][C/groups][R][S], a Linear weight [K][C*H*W], a BatchNorm's weight and bias [C]
// (dfp pads those to 16 lanes with zeros, which PyTorch does not have).
TorchShape torch_shape(const LayerSpec& spec, const TensorShape& in, const Parameter& q);

}  // namespace dfp::graph
