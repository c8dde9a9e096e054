// PyTorch's shape of a model parameter (src/graph/torch_shape.hpp).
#include "src/graph/torch_shape.hpp"

#include <algorithm>

namespace dfp::graph {

TorchShape torch_shape(const LayerSpec& spec, const TensorShape& in, const Parameter& q) {
  const bool weight = q.name.size() > 7 && q.name.compare(q.name.size() - 7, 7, ".weight") == 0;
  std::vector<int> shape;
  if (weight && spec.kind == "conv")
    shape = {spec.out_channels, in.c / std::max(1, spec.groups), spec.kernel, spec.kernel};
  else if (weight && spec.kind == "fc")
    shape = {spec.out_channels, in.c * in.h * in.w};
  else if (spec.kind == "bn")
    shape = {in.c};
  else
    return {};
  size_t elements = 1;
  for (int d : shape) elements *= size_t(d);
  if (elements == q.size || (spec.kind == "bn" && elements < q.size)) return {std::move(shape), elements};
  return {};
}

}  // namespace dfp::graph
