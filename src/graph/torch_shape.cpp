// PyTorch's shape of a model parameter (src/graph/torch_shape.hpp).
#include "src/graph/torch_shape.hpp"

#include "src/graph/layer_registry.hpp"

namespace dfp::graph {

TorchShape torch_shape(const LayerSpec& spec, const TensorShape& in, const Parameter& q) {
  const LayerRow& row = layer_row(spec.kind);
  if (!row.torch_shape) return {};
  const bool weight = q.name.size() > 7 && q.name.compare(q.name.size() - 7, 7, ".weight") == 0;
  TorchParamShape t = row.torch_shape(spec.params, in, weight);
  if (t.dims.empty()) return {};
  size_t elements = 1;
  for (int d : t.dims) elements *= size_t(d);
  if (elements == q.size || (t.padded && elements < q.size)) return {std::move(t.dims), elements};
  return {};
}

}  // namespace dfp::graph
