// dfp._dfp: PyTorch state_dict files (dfp/torch_state.hpp) as methods of dfp.Model, added to the
// class that module.cpp defines.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "dfp/torch_state.hpp"

namespace py = pybind11;
using namespace dfp;

std::unique_lock<std::mutex> model_lock(const Model& m);  // module.cpp: calls on one model, one at a time

namespace {

// Names as str: the torch reader refuses keys that are not UTF-8, but a dfp file's record names
// are bytes, shown escaped (\xNN) rather than failing the whole report with UnicodeDecodeError.
py::list names(const std::vector<std::string>& v) {
  py::list l;
  for (const std::string& s : v) {
    PyObject* o = PyUnicode_DecodeUTF8(s.data(), py::ssize_t(s.size()), "backslashreplace");
    if (!o) throw py::error_already_set();
    l.append(py::reinterpret_steal<py::str>(o));
  }
  return l;
}

py::dict report_dict(const WeightsReport& r) {
  py::dict d;
  // The path as Python's os.fsdecode gives it (the bytes the caller's path encoded to).
  PyObject* file = PyUnicode_DecodeFSDefaultAndSize(r.file.data(), py::ssize_t(r.file.size()));
  if (!file) throw py::error_already_set();
  d["file"] = py::reinterpret_steal<py::str>(file);
  d["format"] = r.format;
  d["loaded"] = names(r.loaded);
  d["skipped"] = names(r.skipped);
  d["missing"] = names(r.missing);
  d["unexpected"] = names(r.unexpected);
  d["mismatched"] = names(r.mismatched);
  d["ignored"] = names(r.ignored);
  d["adapted"] = names(r.adapted);
  return d;
}

using Loader = WeightsReport (*)(Model&, const std::string&, const WeightsOptions&);

// A Model method that loads weights with `load`.
void add_loader(py::object cls, const char* name, Loader load, const char* doc) {
  py::setattr(
      cls, name,
      py::cpp_function(
          [load](Model& m, const std::filesystem::path& path, bool strict, const std::vector<std::string>& skip,
                 bool skip_mismatched_classifier, const std::string& architecture, bool adapt_input_channels) {
            const auto lock = model_lock(m);
            WeightsOptions o;
            o.adapt_input_channels = adapt_input_channels;
            o.strict = strict;
            o.skip = skip;
            o.skip_mismatched_classifier = skip_mismatched_classifier;
            o.architecture = architecture;
            WeightsReport r;
            {
              py::gil_scoped_release unlocked;
              r = load(m, path.string(), o);
            }
            return report_dict(r);
          },
          py::name(name), py::is_method(cls), py::arg("path"), py::arg("strict") = true,
          py::arg("skip") = std::vector<std::string>{}, py::arg("skip_mismatched_classifier") = false,
          py::arg("architecture") = "", py::arg("adapt_input_channels") = false, doc));
}

}  // namespace

void bind_torch_state(py::module_& mod) {
  py::object cls = mod.attr("Model");
  add_loader(cls, "load_torch_state_dict", &load_torch_state_dict,
             "Reads a file of torch.save(model.state_dict(), path) into the built model (torchvision names, "
             "float32/float16/bfloat16 values widened to float32), then weights_updated(). strict: missing, "
             "unexpected or differently shaped tensors are an error listing them (else reported); skip: globs of "
             "tensor or layer names left as they are; skip_mismatched_classifier: the classifier keeps its values "
             "when its shape differs; adapt_input_channels: the first convolution takes a weight made for another "
             "number of input channels (an RGB weight summed for one channel, as timm's adapt_input_conv); architecture: the zoo name whose name table applies (default: the model's "
             "name). Returns a dict of the names loaded, skipped, missing, unexpected, mismatched, ignored and adapted.");
  add_loader(cls, "load_weights", &load_weights,
             "load_torch_state_dict for a torch.save file, the same for a dfp state file or checkpoint (what "
             "`dfp train --init-from` reads).");
  py::setattr(cls, "save_torch_state_dict",
              py::cpp_function(
                  [](Model& m, const std::filesystem::path& path, const std::string& architecture) {
                    const auto lock = model_lock(m);
                    py::gil_scoped_release unlocked;
                    save_torch_state_dict(m, path.string(), architecture);
                  },
                  py::name("save_torch_state_dict"), py::is_method(cls), py::arg("path"), py::arg("architecture") = "",
                  "Writes the built model's weights as torch.save(state_dict) does, with torchvision's names: "
                  "torch.load reads it and the torchvision model's load_state_dict(strict=True) accepts it."));
}
