// dfp._dfp.LayerOp: the binding of dfp::LayerOp (include/dfp/layer_op.hpp), one Conv2d or Linear
// run on plain float32 arrays, which python/dfp/torch/ wraps into torch.autograd.Function.
//
// Arrays are taken as they are, never converted or copied: each must be a C-contiguous float32
// NumPy array of exactly the size the layer expects (a torch tensor's .numpy() view), and an output
// must be writable, so that the results land in the caller's tensor. The GIL is released while a
// pass runs; the LayerOp's own lock serialises the calls on one LayerOp from several threads, and
// the sized calls check every buffer against the forward's shapes once more in C++.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <span>
#include <string>

#include "dfp/context.hpp"
#include "dfp/layer_op.hpp"
#include "dfp/model.hpp"
#include "dfp/precision.hpp"
#include "dfp/status.hpp"

namespace py = pybind11;
using namespace dfp;

namespace {

std::string shape_text(const std::vector<py::ssize_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}
std::string shape_text(const py::array& a) { return shape_text(std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim())); }

// The data of `a`, checked: float32, C-contiguous, the expected shape (and writable for an output),
// as a span of its floats.
template <class Ptr>
auto data_of(const LayerOp& op, const py::array& a, const std::vector<py::ssize_t>& shape, const char* what) {
  const std::string who = "layer '" + op.spec().name + "': " + what;
  DFP_CHECK(a.dtype().is(py::dtype::of<float>()), Status::invalid_argument,
            who + " must be float32, got " + std::string(py::str(a.dtype())));
  DFP_CHECK(a.flags() & py::array::c_style, Status::invalid_argument, who + " must be C-contiguous");
  bool same = a.ndim() == py::ssize_t(shape.size());
  for (size_t i = 0; same && i < shape.size(); ++i) same = a.shape(py::ssize_t(i)) == shape[i];
  std::string expected = "(";
  for (size_t i = 0; i < shape.size(); ++i) expected += (i ? ", " : "") + std::to_string(shape[i]);
  DFP_CHECK(same, Status::invalid_argument, who + " must have shape " + expected + "), got " + shape_text(a));
  const size_t n = size_t(a.size());
  if constexpr (std::is_same_v<Ptr, float*>) {
    DFP_CHECK(a.writeable(), Status::invalid_argument, who + " must be writable");
    return std::span<float>(static_cast<float*>(py::array(a).mutable_data()), n);
  } else {
    return std::span<const float>(static_cast<const float*>(a.data()), n);
  }
}

// An optional array argument (None: absent) that must be a NumPy array itself: a list or another
// object would be converted into a temporary copy, and an output written there would be lost.
py::object optional_array(const LayerOp& op, const py::object& a, const char* what) {
  if (a.is_none()) return a;
  DFP_CHECK(py::isinstance<py::array>(a), Status::invalid_argument,
            "layer '" + op.spec().name + "': " + what + " must be a NumPy array or None");
  return a;
}

// The plain shape of the layer's input from x's: (n, C, h, w) for a conv, (n, in) for a Linear.
struct InputShape {
  int n = 0, h = 1, w = 1;
};
InputShape input_shape(const LayerOp& op, const py::array& x) {
  const LayerOpSpec& s = op.spec();
  const bool linear = s.kind == LayerOpSpec::Kind::linear;
  const std::string who = "layer '" + s.name + "': x";
  DFP_CHECK(x.ndim() == (linear ? 2 : 4), Status::invalid_argument,
            who + (linear ? " must be (batch, in_features)" : " must be (batch, channels, height, width)") + ", got " +
                shape_text(x));
  DFP_CHECK(x.shape(1) == s.in_channels, Status::invalid_argument,
            who + " has " + std::to_string(x.shape(1)) + (linear ? " features" : " channels") + ", the layer takes " +
                std::to_string(s.in_channels));
  InputShape in;
  in.n = int(x.shape(0));
  if (!linear) {
    in.h = int(x.shape(2));
    in.w = int(x.shape(3));
  }
  return in;
}

std::vector<py::ssize_t> plain_shape(const LayerOp& op, std::array<int, 4> s) {
  if (op.spec().kind == LayerOpSpec::Kind::linear) return {s[0], s[1]};
  return {s[0], s[1], s[2], s[3]};
}

std::vector<py::ssize_t> weight_shape(const LayerOp& op) {
  const LayerOpSpec& s = op.spec();
  if (s.kind == LayerOpSpec::Kind::linear) return {s.out_channels, s.in_channels};
  return {s.out_channels, s.in_channels / s.groups, s.kernel, s.kernel};
}

}  // namespace

// As a line of metrics.jsonl has it: the DFP16 fields for an int16 layer, the scale exponents of an
// fp8 one, the sample's once sampled.
py::dict numerics_record(const LayerNumerics& n) {
  py::dict d;
  d["layer"] = n.layer;
  d["format"] = n.format;
  if (n.format == "int16" || n.scaled) {  // DFP16's shared exponents; fp8's scales as exponents
    d["exp_x"] = n.exp_x;
    d["exp_w"] = n.exp_w;
    d["exp_dy"] = n.exp_dy;
    // Exponents per slice or block, where they differ: the smallest.
    if (n.exp_x_min) d["exp_x_min"] = *n.exp_x_min;
    if (n.exp_w_min) d["exp_w_min"] = *n.exp_w_min;
    if (n.exp_dy_min) d["exp_dy_min"] = *n.exp_dy_min;
  }
  if (n.format == "int16") {
    d["chain_fwd"] = n.chain_fwd;
    d["chain_bwd"] = n.chain_bwd;
    d["chain_wgrad"] = n.chain_wgrad;
    d["saturated"] = n.saturated;
    d["overflow_events"] = n.overflow_events;
  }
  if (n.sampled) {
    d["sqnr_x_db"] = n.sqnr_x_db;
    d["sqnr_w_db"] = n.sqnr_w_db;
    d["sqnr_dy_db"] = n.sqnr_dy_db;
    d["overflow"] = n.overflow;
    d["underflow"] = n.underflow;
    d["nonzero"] = n.nonzero;
    d["underflow_x"] = n.underflow_x;
    d["underflow_w"] = n.underflow_w;
    d["underflow_dy"] = n.underflow_dy;
    d["nonzero_x"] = n.nonzero_x;
    d["nonzero_w"] = n.nonzero_w;
    d["nonzero_dy"] = n.nonzero_dy;
  }
  return d;
}

void bind_layer_op(py::module_& mod) {
  py::class_<LayerOp>(mod, "LayerOp",
                      "One Conv2d or Linear run in dfp on plain float32 arrays (NCHW, or (batch, features)), "
                      "planned per input shape; see include/dfp/layer_op.hpp.")
      .def(py::init([](const Context& ctx, const std::string& kind, int in_channels, int out_channels, int kernel,
                       int stride, int pad, int groups, bool bias, const std::string& name, const PrecisionPolicy& policy) {
             LayerOpSpec s;
             DFP_CHECK(kind == "conv2d" || kind == "linear", Status::invalid_argument,
                       "LayerOp: kind must be 'conv2d' or 'linear', got '" + kind + "'");
             s.kind = kind == "linear" ? LayerOpSpec::Kind::linear : LayerOpSpec::Kind::conv2d;
             s.in_channels = in_channels;
             s.out_channels = out_channels;
             s.kernel = kernel;
             s.stride = stride;
             s.pad = pad;
             s.groups = groups;
             s.bias = bias;
             s.name = name;
             return std::make_unique<LayerOp>(ctx, s, policy);
           }),
           py::arg("ctx"), py::arg("kind"), py::arg("in_channels"), py::arg("out_channels"), py::arg("kernel") = 1,
           py::arg("stride") = 1, py::arg("pad") = 0, py::arg("groups") = 1, py::arg("bias") = false,
           py::arg("name") = "layer", py::arg("policy") = PrecisionPolicy{}, py::keep_alive<1, 2>())
      .def_property_readonly("name", [](const LayerOp& op) { return op.spec().name; })
      .def_property_readonly("precision", [](const LayerOp& op) { return std::string(precision_name(op.precision())); })
      .def_property_readonly("weight_count", &LayerOp::weight_count)
      .def(
          "output_shape",
          [](const LayerOp& op, const std::vector<int>& in) {
            const bool linear = op.spec().kind == LayerOpSpec::Kind::linear;
            DFP_CHECK(in.size() == (linear ? 2u : 4u), Status::invalid_argument,
                      "layer '" + op.spec().name + "': output_shape takes the input's shape, (batch, " +
                          (linear ? "in_features)" : "channels, height, width)"));
            DFP_CHECK(in[1] == op.spec().in_channels, Status::invalid_argument,
                      "layer '" + op.spec().name + "': output_shape: the input has " + std::to_string(in[1]) +
                          (linear ? " features" : " channels") + ", the layer takes " +
                          std::to_string(op.spec().in_channels));
            const auto s = linear ? op.output_shape(in[0], 1, 1) : op.output_shape(in[0], in[2], in[3]);
            return py::tuple(py::cast(plain_shape(op, s)));
          },
          py::arg("input_shape"), "The output's shape for an input of this shape.")
      .def(
          "forward",
          [](LayerOp& op, const py::array& x, const py::array& weight, const py::object& bias, uint64_t version,
             const py::array& y, bool train, bool input_grad) {
            const InputShape in = input_shape(op, x);
            const auto xp = data_of<const float*>(op, x, std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()), "x");
            const auto wp = data_of<const float*>(op, weight, weight_shape(op), "weight");
            std::span<const float> bp;
            if (!optional_array(op, bias, "bias").is_none())
              bp = data_of<const float*>(op, py::reinterpret_borrow<py::array>(bias), {op.spec().out_channels}, "bias");
            const auto yp = data_of<float*>(op, y, plain_shape(op, op.output_shape(in.n, in.h, in.w)), "y");
            py::gil_scoped_release unlocked;
            return op.forward(xp, in.n, in.h, in.w, wp, bp, version, yp, train, input_grad);
          },
          py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("version"), py::arg("y"), py::arg("train"),
          py::arg("input_grad"),
          "y = layer(x) into y; weights (and bias) re-loaded when `version` changes; returns the ticket of a training "
          "forward (0 otherwise).")
      .def("holds", &LayerOp::holds, py::arg("ticket"), "Whether the state of that training forward is still held.")
      .def(
          "backward",
          [](LayerOp& op, uint64_t ticket, const py::array& dy, const py::object& dx, const py::array& gw,
             const py::object& gb, const std::vector<int>& x_shape) {
            // x_shape must be the forward's input shape: the arrays are checked against it.
            const std::vector<py::ssize_t> held = plain_shape(op, op.input_shape(ticket));
            const std::vector<py::ssize_t> given(x_shape.begin(), x_shape.end());
            DFP_CHECK(given == held, Status::invalid_argument,
                      "layer '" + op.spec().name + "': backward's x_shape " + shape_text(given) +
                          " is not the shape of that forward's input, " + shape_text(held));
            const auto out = op.output_shape(int(held[0]), held.size() == 4 ? int(held[2]) : 1,
                                             held.size() == 4 ? int(held[3]) : 1);
            const auto dyp = data_of<const float*>(op, dy, plain_shape(op, out), "dy");
            std::span<float> dxp;
            if (!optional_array(op, dx, "dx").is_none())
              dxp = data_of<float*>(op, py::reinterpret_borrow<py::array>(dx), held, "dx");
            const auto gwp = data_of<float*>(op, gw, weight_shape(op), "weight gradient");
            std::span<float> gbp;
            if (!optional_array(op, gb, "bias gradient").is_none())
              gbp = data_of<float*>(op, py::reinterpret_borrow<py::array>(gb), {op.spec().out_channels}, "bias gradient");
            py::gil_scoped_release unlocked;
            op.backward(ticket, dyp, dxp, gwp, gbp);
          },
          py::arg("ticket"), py::arg("dy"), py::arg("dx"), py::arg("grad_weight"), py::arg("grad_bias"), py::arg("x_shape"),
          "Gradients of the training forward `ticket`: dx (None: not wanted), the weight and bias gradients "
          "(overwritten).")
      .def("sample_next_step", &LayerOp::sample_next_step,
           "Measure the rounding statistics (SQNR, overflow/underflow counts) in the next training step.")
      .def(
          "numerics",
          [](const LayerOp& op) -> py::object {
            LayerNumerics n;
            if (!op.numerics(n)) return py::none();
            return numerics_record(n);
          },
          "The last training step's numerics as a metrics.jsonl layer record (a dict), or None (fp32, or not trained).")
      .def_property_readonly("implementation", &LayerOp::implementation)
      .def_property_readonly("steps", &LayerOp::steps)
      .def_property_readonly("plans", &LayerOp::plans)
      .def(
          "times",
          [](const LayerOp& op) {
            const LayerOpTimes t = op.times();
            py::dict d;
            d["layout_seconds"] = t.layout_seconds;
            d["weights_seconds"] = t.weights_seconds;
            d["forward_seconds"] = t.forward_seconds;
            d["backward_seconds"] = t.backward_seconds;
            d["forwards"] = t.forwards;
            d["backwards"] = t.backwards;
            d["weight_loads"] = t.weight_loads;
            return d;
          },
          "Seconds spent in layout conversions, weight loads, forward and backward passes, and the counts.")
      .def("reset_times", &LayerOp::reset_times)
      .def("__repr__", [](const LayerOp& op) {
        return "dfp.LayerOp('" + op.spec().name + "', " + precision_name(op.precision()) + ")";
      });
}
