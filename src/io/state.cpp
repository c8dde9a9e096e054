// A model's state in checkpoint files (see state.hpp and include/dfp/state.hpp).
#include "src/io/state.hpp"

#include <algorithm>
#include <charconv>

#include "dfp/state.hpp"
#include "dfp/status.hpp"

namespace dfp {
namespace {

std::string shape_text(const std::vector<int>& shape) {
  std::string o;
  for (size_t i = 0; i < shape.size(); ++i) o.append(i ? "x" : "").append(std::to_string(shape[i]));
  return o;
}

}  // namespace

void put_state(Checkpoint& ck, Model& m, const PrecisionPolicy& policy) {
  ck.meta["state_version"] = std::to_string(kStateVersion);
  for (auto& [key, value] : policy.fields()) ck.meta[key] = value;
  for (const TensorView& v : m.state()) {
    ck.borrowed[v.name] = std::span<const float>(v.data, v.size);
    ck.meta["shape:" + v.name] = shape_text(v.shape);
  }
}

void get_state(Model& m, const Checkpoint& ck, const std::string& path) {
  int version = 0;  // no field: a file from before the state version (no shapes recorded)
  if (const auto it = ck.meta.find("state_version"); it != ck.meta.end()) {
    const std::string& v = it->second;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), version);
    DFP_CHECK(ec == std::errc() && end == v.data() + v.size() && version >= 1, Status::corrupt_data,
              "checkpoint '" + path + "': meta field 'state_version' is '" + v + "'; expected an integer >= 1");
    DFP_CHECK(version <= kStateVersion, Status::corrupt_data,
              "checkpoint '" + path + "': meta field 'state_version' is " + v + ", newer than this dfp reads (" +
                  std::to_string(kStateVersion) + "); use a newer dfp");
  }
  const std::vector<TensorView> views = m.state();
  // Everything is checked before anything is copied: a refused file leaves the model as it was.
  for (const TensorView& v : views) {
    const auto it = ck.tensors.find(v.name);
    DFP_CHECK(it != ck.tensors.end(), Status::corrupt_data,
              "checkpoint '" + path + "': tensor '" + v.name + "' missing (checkpoint of another model?)");
    if (version >= 1) {
      const auto sh = ck.meta.find("shape:" + v.name);
      DFP_CHECK(sh != ck.meta.end(), Status::corrupt_data,
                "checkpoint '" + path + "': meta field 'shape:" + v.name + "' missing; expected the shape of tensor '" +
                    v.name + "'");
      DFP_CHECK(sh->second == shape_text(v.shape), Status::corrupt_data,
                "checkpoint '" + path + "': tensor '" + v.name + "' has shape " + sh->second +
                    " in the file, the model expects " + shape_text(v.shape) + " (checkpoint of another model?)");
    }
    DFP_CHECK(it->second.size() == v.size, Status::corrupt_data,
              "checkpoint '" + path + "': tensor '" + v.name + "' has " + std::to_string(it->second.size()) +
                  " values, the model expects " + std::to_string(v.size) + " (shape " + shape_text(v.shape) + ")");
  }
  for (const TensorView& v : views) std::copy(ck.tensors.at(v.name).begin(), ck.tensors.at(v.name).end(), v.data);
  m.weights_updated();
}

void save_state(Model& model, const std::string& path) {
  DFP_CHECK(model.built(), Status::invalid_argument,
            "save_state('" + path + "'): model '" + model.name() + "' is not built; call build() first");
  Checkpoint ck;
  ck.meta["model"] = model.name();
  put_state(ck, model, model.policy());
  write_checkpoint(path, ck);
}

void load_state(Model& model, const std::string& path) {
  DFP_CHECK(model.built(), Status::invalid_argument,
            "load_state('" + path + "'): model '" + model.name() + "' is not built; call build() first");
  get_state(model, read_checkpoint(path), path);
}

PrecisionPolicy read_state_policy(const std::string& path) {
  return PrecisionPolicy::from_fields(read_checkpoint(path).meta, "checkpoint '" + path + "'");
}

}  // namespace dfp
