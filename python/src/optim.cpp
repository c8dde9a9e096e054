// dfp.Sgd (a model's own optimizer) and dfp.sgd_update (the update on any float32 arrays, what
// dfp.torch.optim.SGD runs): part of the _dfp module (module.cpp calls bind_optim).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/model.hpp"
#include "dfp/optim.hpp"
#include "dfp/status.hpp"

namespace py = pybind11;
using namespace dfp;

std::unique_lock<std::mutex> model_lock(const Model& m);  // module.cpp

namespace {

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

// An Sgd that remembers its model: a step updates the model's weights, so it takes the model's lock.
struct BoundSgd {
  BoundSgd(const Context& ctx, Model& m, const SgdOptions& o) : model(m), sgd(ctx, m, o) {}
  Model& model;
  Sgd sgd;
};

// A factor of the update (lr, momentum, weight decay), as the C API checks it: one that is not
// finite, is negative or overflows float would make every weight NaN.
void check_factor(double v, const std::string& what) {
  DFP_CHECK(std::isfinite(v) && v >= 0 && v <= std::numeric_limits<float>::max(), Status::invalid_argument,
            what + ": expected a finite number >= 0, got " + std::string(py::str(py::float_(v))));
}

}  // namespace

void bind_optim(py::module_& mod) {
  py::class_<BoundSgd>(mod, "Sgd", "torch.optim.SGD on the model's FP32 master weights.")
      .def(py::init([](const Context& ctx, Model& model, float momentum, float weight_decay, bool nesterov) {
             check_factor(momentum, "dfp.Sgd: momentum");
             check_factor(weight_decay, "dfp.Sgd: weight_decay");
             const auto lock = model_lock(model);
             return std::make_unique<BoundSgd>(ctx, model, SgdOptions{momentum, weight_decay, nesterov});
           }),
           py::arg("ctx"), py::arg("model"), py::arg("momentum") = 0.9f, py::arg("weight_decay") = 5e-4f,
           py::arg("nesterov") = false, py::keep_alive<1, 2>(), py::keep_alive<1, 3>())
      .def("step", [](BoundSgd& s, double lr) {
        check_factor(lr, "Sgd.step: lr");
        const auto lock = model_lock(s.model);
        py::gil_scoped_release unlocked;
        s.sgd.step(float(lr));
      }, py::arg("lr"), "Updates every parameter, then re-quantizes and re-packs the weights.");

  mod.def(
      "sgd_update",
      [](const Context& ctx, const std::vector<py::array>& values, const std::vector<py::array>& grads,
         const std::vector<py::array>& velocities, double lr, double momentum, double weight_decay, bool nesterov) {
        check_factor(lr, "dfp.sgd_update: lr");
        check_factor(momentum, "dfp.sgd_update: momentum");
        check_factor(weight_decay, "dfp.sgd_update: weight_decay");
        DFP_CHECK(values.size() == grads.size() && values.size() == velocities.size(), Status::invalid_argument,
                  "dfp.sgd_update: " + std::to_string(values.size()) + " values, " + std::to_string(grads.size()) +
                      " gradients and " + std::to_string(velocities.size()) + " velocities; expected as many of each");
        // The values and velocities are updated where they are: float32, C-contiguous and
        // writable, or refused (a converted copy would take the update and drop it).
        auto in_place = [](py::array a, const char* what, size_t i) {
          DFP_CHECK(a.dtype().is(py::dtype::of<float>()) && (a.flags() & py::array::c_style) && a.writeable(),
                    Status::invalid_argument,
                    std::string("dfp.sgd_update: ") + what + "[" + std::to_string(i) +
                        "]: expected a writable C-contiguous float32 array (it is updated in place), got dtype " +
                        std::string(py::str(a.dtype())));
          return static_cast<float*>(a.mutable_data());
        };
        std::vector<FloatArray> grad_arrays;
        std::vector<SgdTensor> tensors;
        for (size_t i = 0; i < values.size(); ++i) {
          float* w = in_place(values[i], "values", i);
          float* v = in_place(velocities[i], "velocities", i);
          grad_arrays.push_back(FloatArray::ensure(grads[i]));
          DFP_CHECK(grad_arrays.back() && size_t(grad_arrays.back().size()) == size_t(values[i].size()) &&
                        velocities[i].size() == values[i].size(),
                    Status::invalid_argument,
                    "dfp.sgd_update: tensor " + std::to_string(i) + ": " + std::to_string(values[i].size()) +
                        " values, " + std::to_string(grad_arrays.back() ? grad_arrays.back().size() : -1) +
                        " gradients (float32), " + std::to_string(velocities[i].size()) +
                        " velocities; expected as many of each");
          tensors.push_back({w, grad_arrays.back().data(), v, size_t(values[i].size()), float(weight_decay)});
        }
        std::vector<float> max_abs(tensors.size());
        {
          py::gil_scoped_release unlocked;
          sgd_update(ctx, tensors, float(lr), float(momentum), nesterov, max_abs);
        }
        return max_abs;
      },
      py::arg("ctx"), py::arg("values"), py::arg("grads"), py::arg("velocities"), py::arg("lr"),
      py::arg("momentum") = 0.0, py::arg("weight_decay") = 0.0, py::arg("nesterov") = false,
      "One torch.optim.SGD step (dampening 0) over NumPy arrays, in place and in one pass on ctx's threads: "
      "g' = g + weight_decay*w; v = momentum*v + g'; w -= lr*(nesterov ? g' + momentum*v : v). Velocities of "
      "zeros are torch's first step. Returns max|w| of each tensor after the update (for "
      "Model.weights_updated(max_abs)).");
}
