// Weights to and from PyTorch state_dict files, and `--init-from` (see include/dfp/torch_state.hpp).
#include "dfp/torch_state.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <unordered_map>

#include "dfp/precision.hpp"
#include "dfp/status.hpp"
#include "src/io/checkpoint.hpp"
#include "src/io/torch_file.hpp"
#include "src/io/torch_names.hpp"

namespace dfp {
namespace {

using torch_format::NameTable;

std::string shape_text(const std::vector<int64_t>& shape) {
  if (shape.empty()) return "a scalar";
  std::string o;
  for (size_t i = 0; i < shape.size(); ++i) o.append(i ? "x" : "").append(std::to_string(shape[i]));
  return o;
}

std::string layer_of(const std::string& tensor) {
  const size_t dot = tensor.rfind('.');
  return dot == std::string::npos ? tensor : tensor.substr(0, dot);
}

bool skipped_by(const std::vector<std::string>& patterns, const std::string& name) {
  return std::any_of(patterns.begin(), patterns.end(), [&](const std::string& p) {
    return PrecisionPolicy::matches(p, name) || PrecisionPolicy::matches(p, layer_of(name));
  });
}

// Up to `max` names, then how many more.
std::string listed(const std::vector<std::string>& names, size_t max = 20) {
  std::string o;
  for (size_t i = 0; i < names.size() && i < max; ++i) o.append(i ? ", " : "").append(names[i]);
  if (names.size() > max) o += ", ... (" + std::to_string(names.size()) + " in all)";
  return o;
}

// A shape as a state file's meta records it ("64x3x7x7"); `what` names the file and field.
std::vector<int64_t> parse_shape(const std::string& text, const std::string& what) {
  std::vector<int64_t> shape;
  for (size_t start = 0; start <= text.size();) {
    const size_t x = std::min(text.find('x', start), text.size());
    const std::string dim = text.substr(start, x - start);
    DFP_CHECK(!dim.empty() && dim.size() <= 9 && dim.find_first_not_of("0123456789") == std::string::npos,
              Status::corrupt_data, what + " is '" + text + "'; expected sizes joined by 'x'");
    shape.push_back(std::stoll(dim));
    start = x + 1;
  }
  return shape;
}

// A tensor of the file being loaded.
struct Source {
  std::string name;                 // as the file names it
  std::string dfp_name;             // the model tensor it maps to (its name when the model has none)
  std::vector<int64_t> shape;
  bool shape_known = true;          // false: a dfp file from before shapes were recorded (sizes compared)
  uint64_t numel = 0;
  std::function<void(float*)> read;  // its numel values as FP32
};

// The file as messages name it, by its format.
std::string file_label(const WeightsReport& r) {
  return (r.format == "torch" ? "torch file '" : "dfp checkpoint '") + r.file + "'";
}

// Matches the file's tensors to the model's state, checks everything, then copies.
WeightsReport load_sources(Model& m, std::vector<Source>& sources, const WeightsOptions& o, WeightsReport r,
                           const NameTable* table) {
  DFP_CHECK(m.built(), Status::invalid_argument,
            "loading weights from '" + r.file + "': model '" + m.name() + "' is not built; call build() first");
  const std::vector<TensorView> views = m.state();
  const std::string classifier = m.graph()[size_t(m.loss_node())].name;
  std::unordered_map<std::string, Source*> by_name;
  for (Source& s : sources) by_name.emplace(s.dfp_name, &s);
  std::vector<std::pair<const TensorView*, Source*>> plan;
  std::unordered_map<const TensorView*, int64_t> adapt;  // view -> the file's input channels
  std::unordered_map<const Source*, bool> used;
  // The layer that reads the model's input, when it is a convolution: the one whose weight
  // adapt_input_channels may adapt.
  std::string first_conv;
  for (const LayerSpec& l : m.graph())
    if (l.kind == LayerKind::conv && l.inputs == std::vector<int>{0}) first_conv = l.name;
  for (const TensorView& v : views) {
    if (skipped_by(o.skip, v.name)) {
      r.skipped.push_back(v.name + " (skip pattern)");
      continue;
    }
    const auto it = by_name.find(v.name);
    if (it == by_name.end()) {
      r.missing.push_back(v.name);
      continue;
    }
    Source& s = *it->second;
    used[&s] = true;
    const std::vector<int64_t> want(v.shape.begin(), v.shape.end());
    const bool same = (!s.shape_known || s.shape == want) && s.numel == v.size;
    const std::string both = (s.name != v.name ? " ('" + s.name + "' in the file)" : std::string()) + ": file " +
                             (s.shape_known ? shape_text(s.shape) : std::to_string(s.numel) + " values") + ", model " +
                             shape_text(want);
    // [K][C][R][S] against [K][C'][R][S]: only the input channels differ.
    const bool channels_only = s.shape_known && s.shape.size() == 4 && want.size() == 4 && s.shape[0] == want[0] &&
                               s.shape[2] == want[2] && s.shape[3] == want[3] && s.shape[1] >= 1 &&
                               uint64_t(s.shape[0] * s.shape[1] * s.shape[2] * s.shape[3]) == s.numel;
    if (same) {
      plan.emplace_back(&v, &s);
    } else if (o.adapt_input_channels && channels_only && !first_conv.empty() && v.name == first_conv + ".weight") {
      plan.emplace_back(&v, &s);
      adapt[&v] = s.shape[1];
      r.adapted.push_back(v.name + both +
                          (want[1] == 1 ? " (summed over the file's " + std::to_string(s.shape[1]) + " input channels)"
                                        : " (the file's input channels repeated and scaled by " +
                                              std::to_string(s.shape[1]) + "/" + std::to_string(want[1]) + ")"));
    } else if (o.skip_mismatched_classifier && layer_of(v.name) == classifier)
      r.skipped.push_back(v.name + both + " (the classifier: keeps its initial values)");
    else
      r.mismatched.push_back(v.name + both);
  }
  for (const Source& s : sources) {
    if (used.count(&s)) continue;
    if (table && std::any_of(table->torch_only.begin(), table->torch_only.end(),
                             [&](const std::string& p) { return PrecisionPolicy::matches(p, s.name); }))
      r.ignored.push_back(s.name);
    else if (!skipped_by(o.skip, s.dfp_name))
      r.unexpected.push_back(s.name);
  }
  if (o.strict && (!r.missing.empty() || !r.unexpected.empty() || !r.mismatched.empty())) {
    std::string msg = file_label(r) + " does not fit model '" + m.name() + "'";
    if (table && table->to_torch) msg += std::string(" (torchvision names by the ") + table->family + " table)";
    msg += ":";
    if (!r.missing.empty()) msg += " missing from the file: " + listed(r.missing) + ";";
    if (!r.unexpected.empty()) msg += " in the file but not in the model: " + listed(r.unexpected) + ";";
    if (!r.mismatched.empty()) msg += " shapes differ: " + listed(r.mismatched) + ";";
    if (!first_conv.empty() && std::any_of(r.mismatched.begin(), r.mismatched.end(), [&](const std::string& t) {
          return t.rfind(first_conv + ".weight", 0) == 0;
        }))
      msg += " the first convolution '" + first_conv + "' reads another number of input channels than the file's (" +
             "dfp train --init-from adapts it as fine-tuning tools do; --init-skip " + first_conv +
             " keeps it as initialised; API: WeightsOptions::adapt_input_channels, or skip);";
    if (table && *table->hint) msg += std::string(" ") + table->hint + ";";
    msg += " (strict=false loads the tensors that fit; skip patterns leave tensors out)";
    fail(Status::invalid_argument, msg);
  }
  // Read everything before writing anything: a file that fails to read leaves the model as it was.
  std::vector<std::vector<float>> values(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    values[i].resize(plan[i].first->size);
    if (const auto a = adapt.find(plan[i].first); a != adapt.end()) {
      // timm's adapt_input_conv: out[k][c] = sum over the file's channels (one model channel),
      // else file[k][c mod C'] * C' / C.
      const Source& s = *plan[i].second;
      std::vector<float> file(s.numel);
      s.read(file.data());
      const int64_t K = s.shape[0], Cf = a->second, C = plan[i].first->shape[1], RS = s.shape[2] * s.shape[3];
      for (int64_t k = 0; k < K; ++k)
        for (int64_t c = 0; c < C; ++c)
          for (int64_t j = 0; j < RS; ++j) {
            float v = 0;
            if (C == 1)
              for (int64_t f = 0; f < Cf; ++f) v += file[size_t((k * Cf + f) * RS + j)];
            else
              v = file[size_t((k * Cf + c % Cf) * RS + j)] * (float(Cf) / float(C));
            values[i][size_t((k * C + c) * RS + j)] = v;
          }
    } else {
      plan[i].second->read(values[i].data());
    }
    // A NaN or Inf would only show later, as a diverged loss.
    const auto bad = std::find_if(values[i].begin(), values[i].end(), [](float v) { return !std::isfinite(v); });
    if (bad != values[i].end()) {
      const Source& s = *plan[i].second;
      fail(Status::numerical_error,
           file_label(r) + ": tensor '" + s.name + "'" + (s.name != s.dfp_name ? " (model tensor '" + s.dfp_name + "')" : "") +
               " holds " + (std::isnan(*bad) ? "NaN" : *bad > 0 ? "+Inf" : "-Inf") + " at index " +
               std::to_string(bad - values[i].begin()) + " (its first non-finite value, of " +
               std::to_string(values[i].size()) + "); expected finite weights");
    }
  }
  for (size_t i = 0; i < plan.size(); ++i) {
    if (!values[i].empty()) std::memcpy(plan[i].first->data, values[i].data(), values[i].size() * sizeof(float));
    r.loaded.push_back(plan[i].first->name);
  }
  m.weights_updated();
  return r;
}

// The format of a weights file by its first bytes: "torch" (a zip archive, or the legacy bare
// pickle, which the torch reader names) or "dfp" (a state file or checkpoint). A file that cannot
// be opened, is not a regular file (opened without blocking: a FIFO waits for a writer) or is
// neither is refused, naming the file and both formats.
std::string weights_format(const std::string& path) {
  const std::string file = "weights file '" + path + "'";
  const std::string expected = "expected a torch.save state_dict file or a dfp state file or checkpoint";
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  DFP_CHECK(fd >= 0, Status::io_error, file + ": cannot open: " + std::strerror(errno) + "; " + expected);
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  unsigned char head[8] = {};
  ssize_t got = -1;
  if (stat_ok && S_ISREG(st.st_mode))
    while ((got = ::pread(fd, head, sizeof head, 0)) < 0 && errno == EINTR) {
    }
  const int read_errno = errno;
  ::close(fd);
  DFP_CHECK(stat_ok && S_ISREG(st.st_mode), Status::io_error,
            file + (stat_ok && S_ISDIR(st.st_mode) ? ": is a directory; " : ": not a regular file; ") + expected);
  DFP_CHECK(got >= 0, Status::io_error, file + ": read failed: " + std::strerror(read_errno));
  if (got >= 2 && (std::memcmp(head, "PK", 2) == 0 || head[0] == 0x80)) return "torch";
  DFP_CHECK(got == 8 && std::memcmp(head, kCheckpointMagic, 8) == 0, Status::corrupt_data,
            file + ": neither a torch.save file (a zip archive) nor a dfp state file or checkpoint (magic DFPCKPT1); " +
                expected);
  return "dfp";
}

// A state tensor's dfp name, shape and values, in the order torch's modules list them: each
// layer's tensors together (its weight and bias, then its BatchNorm statistics).
struct Named {
  std::string name;
  std::vector<int64_t> shape;
  const float* values;
};

void write_torch(const std::string& architecture, const std::vector<Named>& tensors, int64_t steps,
                 const std::string& path) {
  std::vector<std::string> layers;
  std::map<std::string, std::vector<const Named*>> of_layer;
  for (const Named& t : tensors) {
    auto& list = of_layer[layer_of(t.name)];
    if (list.empty()) layers.push_back(layer_of(t.name));
    list.push_back(&t);
  }
  std::vector<torch_format::OutTensor> out;
  for (const std::string& layer : layers) {
    for (const Named* t : of_layer[layer]) out.push_back({torch_name(architecture, t->name), t->shape, t->values, 0});
    if (std::any_of(of_layer[layer].begin(), of_layer[layer].end(),
                    [](const Named* t) { return t->name.ends_with(".running_var"); })) {
      const std::string var = torch_name(architecture, layer + ".running_var");
      out.push_back({var.substr(0, var.size() - 12) + ".num_batches_tracked", {}, nullptr, steps});
    }
  }
  write_file_atomically(path, torch_format::torch_file_bytes(out), "torch state_dict");
}

}  // namespace

std::string torch_name(const std::string& architecture, const std::string& name) {
  const NameTable& t = torch_format::name_table(architecture);
  return t.to_torch ? t.to_torch(architecture, name) : name;
}

std::vector<std::string> WeightsReport::lines() const {
  std::vector<std::string> o;
  o.push_back("loaded " + std::to_string(loaded.size()) + " tensors from '" + file + "' (" +
              (format == "torch" ? "a torch state_dict" : "a dfp state") + ")");
  auto add = [&](const std::vector<std::string>& v, const std::string& what) {
    if (!v.empty()) o.push_back(what + " (" + std::to_string(v.size()) + "): " + listed(v, 6));
  };
  add(skipped, "not loaded, kept as initialised");
  add(missing, "missing from the file, kept as initialised");
  add(mismatched, "shapes differ, kept as initialised");
  add(unexpected, "in the file, not in the model, ignored");
  add(ignored, "torchvision tensors dfp has no counterpart of, ignored");
  add(adapted, "adapted to the model's input channels");
  return o;
}

WeightsReport load_torch_state_dict(Model& model, const std::string& path, const WeightsOptions& options) {
  const std::string arch = options.architecture.empty() ? model.name() : options.architecture;
  const NameTable& table = torch_format::name_table(arch);
  const auto file = std::make_shared<torch_format::TorchFile>(torch_format::TorchFile::open(path));
  std::unordered_map<std::string, std::string> to_dfp;
  if (model.built())
    for (const TensorView& v : model.state()) to_dfp[torch_name(arch, v.name)] = v.name;
  std::vector<Source> sources;
  for (const torch_format::TensorRecord& t : file->tensors()) {
    const auto it = to_dfp.find(t.name);
    sources.push_back({t.name, it == to_dfp.end() ? t.name : it->second, t.shape, true, t.numel,
                       [file, &t](float* out) { file->read(t, out); }});
  }
  WeightsReport r;
  r.file = path;
  r.format = "torch";
  return load_sources(model, sources, options, std::move(r), &table);
}

WeightsReport load_weights(Model& model, const std::string& path, const WeightsOptions& options) {
  if (weights_format(path) == "torch") return load_torch_state_dict(model, path, options);
  const Checkpoint ck = read_checkpoint(path);
  std::vector<Source> sources;
  for (const auto& [name, values] : ck.tensors) {
    if (name.find('@') != std::string::npos) continue;  // the trainer's optimizer state
    Source s{name, name, {}, false, values.size(), [&values](float* out) {
               std::copy(values.begin(), values.end(), out);
             }};
    if (const auto sh = ck.meta.find("shape:" + name); sh != ck.meta.end()) {
      s.shape_known = true;
      s.shape = parse_shape(sh->second, "checkpoint '" + path + "': meta field '" + sh->first + "'");
    }
    sources.push_back(std::move(s));
  }
  WeightsReport r;
  r.file = path;
  r.format = "dfp";
  return load_sources(model, sources, options, std::move(r), nullptr);
}

void save_torch_state_dict(Model& model, const std::string& path, const std::string& architecture) {
  DFP_CHECK(model.built(), Status::invalid_argument,
            "save_torch_state_dict('" + path + "'): model '" + model.name() + "' is not built; call build() first");
  std::vector<Named> tensors;
  for (const TensorView& v : model.state())
    tensors.push_back({v.name, std::vector<int64_t>(v.shape.begin(), v.shape.end()), v.data});
  write_torch(architecture.empty() ? model.name() : architecture, tensors, int64_t(model.step()), path);
}

void export_torch_state_dict(const std::string& dfp_file, const std::string& path) {
  const Checkpoint ck = read_checkpoint(dfp_file);
  const auto model = ck.meta.find("model");
  DFP_CHECK(model != ck.meta.end(), Status::corrupt_data,
            "checkpoint '" + dfp_file + "': meta field 'model' missing; expected the architecture's name");
  DFP_CHECK(ck.meta.count("state_version"), Status::unsupported,
            "checkpoint '" + dfp_file + "': written before dfp recorded tensor shapes (no 'state_version'); "
            "load it with dfp and save it again");
  std::vector<Named> tensors;
  for (const auto& [key, text] : ck.meta) {
    if (!key.starts_with("shape:")) continue;
    const std::string name = key.substr(6);
    const auto t = ck.tensors.find(name);
    DFP_CHECK(t != ck.tensors.end(), Status::corrupt_data,
              "checkpoint '" + dfp_file + "': meta field '" + key + "' names a tensor the file lacks");
    Named n{name, parse_shape(text, "checkpoint '" + dfp_file + "': meta field '" + key + "'"), t->second.data()};
    uint64_t count = 1;
    for (const int64_t d : n.shape)
      if (__builtin_mul_overflow(count, uint64_t(d), &count)) count = UINT64_MAX;
    DFP_CHECK(count == t->second.size(), Status::corrupt_data,
              "checkpoint '" + dfp_file + "': tensor '" + name + "' has " + std::to_string(t->second.size()) +
                  " values, its shape " + text + " says " + std::to_string(count));
    tensors.push_back(std::move(n));
  }
  int64_t steps = 0;
  if (const auto s = ck.meta.find("step"); s != ck.meta.end() && !s->second.empty() && s->second.size() <= 18 &&
                                           s->second.find_first_not_of("0123456789") == std::string::npos)
    steps = std::stoll(s->second);
  write_torch(model->second, tensors, steps, path);
}

}  // namespace dfp
