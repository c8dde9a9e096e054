// dfp._dfp: the Python binding of dfp's public API (pybind11). The pure-Python package
// python/dfp/__init__.py re-exports it and adds the defaults, dataclasses and helpers.
//
// Lifetimes: a Model keeps its Context alive, an Sgd its Context and Model (py::keep_alive), and
// a NumPy view of a parameter or state tensor keeps its Model alive (the view's base object), so
// that no C++ reference outlives what it refers to, whatever order Python drops its names in.
// Threads: the GIL is released around every call that computes (quantization, forward, logits,
// backward, the optimizer step, state files, training, evaluation) and taken again in Python
// callbacks. A Model is not thread-safe in C++, so every method that reaches one (and an Sgd's
// step, which updates its model) holds that model's lock (model_lock): calls on one model from
// several Python threads run one at a time, calls on different models in parallel.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "dfp/dfp16.hpp"
#include "dfp/model.hpp"
#include "dfp/models.hpp"
#include "dfp/optim.hpp"
#include "dfp/precision.hpp"
#include "dfp/state.hpp"
#include "dfp/status.hpp"
#include "dfp/trainer.hpp"

namespace py = pybind11;
using namespace dfp;

void bind_torch_state(py::module_& mod);  // torch_state.cpp: Model.load_torch_state_dict and the like
void bind_layer_op(py::module_& mod);  // layer_op.cpp
void bind_optim(py::module_& mod);     // optim.cpp
py::dict numerics_record(const LayerNumerics& n);  // layer_op.cpp: as a line of metrics.jsonl has it

// The lock of one Python-owned model (made on first use, dropped with the model): taken without
// the GIL, so that a thread waiting for it never blocks the thread that holds it.
std::mutex& model_mutex(const Model& m);
std::unique_lock<std::mutex> model_lock(const Model& m);

namespace {

std::mutex g_model_mutexes_mutex;
std::unordered_map<const Model*, std::unique_ptr<std::mutex>> g_model_mutexes;

// What Python's Model objects hold: deleting one drops its lock too.
struct ModelDeleter {
  void operator()(Model* m) const noexcept {
    {
      std::lock_guard<std::mutex> lock(g_model_mutexes_mutex);
      g_model_mutexes.erase(m);
    }
    delete m;
  }
};
using ModelHolder = std::unique_ptr<Model, ModelDeleter>;

}  // namespace

std::mutex& model_mutex(const Model& m) {
  std::lock_guard<std::mutex> lock(g_model_mutexes_mutex);
  std::unique_ptr<std::mutex>& mu = g_model_mutexes[&m];
  if (!mu) mu = std::make_unique<std::mutex>();
  return *mu;
}

std::unique_lock<std::mutex> model_lock(const Model& m) {
  py::gil_scoped_release unlocked;
  return std::unique_lock<std::mutex>(model_mutex(m));
}

namespace {

// A Model method bound with the model's lock held (and the GIL, for its arguments and result).
template <class R, class... A>
auto locked(R (Model::*f)(A...)) {
  return [f](Model& m, A... a) -> R {
    const auto lock = model_lock(m);
    return (m.*f)(std::forward<A>(a)...);
  };
}
template <class R, class... A>
auto locked(R (Model::*f)(A...) const) {
  return [f](const Model& m, A... a) -> R {
    const auto lock = model_lock(m);
    return (m.*f)(std::forward<A>(a)...);
  };
}

// dfp.Error (a RuntimeError) and dfp.InvalidArgumentError (also a ValueError), made at import and
// kept for the interpreter's life.
PyObject* g_error = nullptr;
PyObject* g_invalid_argument = nullptr;

// A status as its C++ enumerator's name, the form Python code compares against.
const char* status_id(Status s) noexcept {
  switch (s) {
    case Status::invalid_argument: return "invalid_argument";
    case Status::io_error: return "io_error";
    case Status::corrupt_data: return "corrupt_data";
    case Status::unsupported: return "unsupported";
    case Status::numerical_error: return "numerical_error";
    case Status::internal: return "internal";
    case Status::out_of_memory: return "out_of_memory";
  }
  return "internal";
}

void translate_error(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const Error& e) {
    PyObject* cls = e.status() == Status::invalid_argument ? g_invalid_argument : g_error;
    py::object exc = py::reinterpret_borrow<py::object>(cls)(e.what());
    exc.attr("status") = status_id(e.status());
    PyErr_SetObject(cls, exc.ptr());
  } catch (const py::cast_error& e) {
    // A value pybind cannot convert inside a binding (an int beyond the C++ type's range): the
    // caller's argument, so a TypeError as for the arguments pybind checks itself.
    PyErr_SetString(PyExc_TypeError, (std::string("dfp: an argument of the wrong type or beyond its range: ") + e.what()).c_str());
  }
}

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;
using Int16Array = py::array_t<int16_t, py::array::c_style>;

std::vector<py::ssize_t> shape_of(const py::array& a) { return {a.shape(), a.shape() + a.ndim()}; }

py::tuple quantize(const Context& ctx, const FloatArray& x, const py::object& exponent, const std::string& rounding,
                   int headroom, uint64_t seed) {
  QuantOptions o;
  o.headroom = headroom;
  o.rounding = parse_rounding(rounding, "dfp.quantize(rounding=...)");
  o.seed = seed;
  o.name = "array";
  o.validate("dfp.quantize");
  const bool measure = exponent.is_none();
  int e = 0;
  if (!measure) {
    // An int that fits: pybind's cast would raise a bare RuntimeError for one beyond int's range.
    int overflow = 0;
    const long long v = py::isinstance<py::int_>(exponent) ? PyLong_AsLongLongAndOverflow(exponent.ptr(), &overflow) : 0;
    DFP_CHECK(py::isinstance<py::int_>(exponent) && !overflow && v >= std::numeric_limits<int>::min() &&
                  v <= std::numeric_limits<int>::max(),
              Status::invalid_argument,
              "dfp.quantize: exponent: expected None or an int in int32's range, got " + std::string(py::repr(exponent)));
    e = int(v);
  }
  Int16Array q(shape_of(x));
  const float* src = x.data();
  int16_t* dst = q.mutable_data();
  const size_t n = size_t(x.size());
  QuantStats s;
  {
    py::gil_scoped_release unlocked;
    s = measure ? quantize_dfp16(ctx, src, dst, n, o) : quantize_dfp16_with_exponent(ctx, src, dst, n, e, o);
  }
  return py::make_tuple(q, s.exponent);
}

py::array_t<float> dequantize(const Context& ctx, const Int16Array& q, int exponent) {
  py::array_t<float> x(shape_of(q));
  const int16_t* src = q.data();
  float* dst = x.mutable_data();
  const size_t n = size_t(q.size());
  {
    py::gil_scoped_release unlocked;
    dequantize_dfp16(ctx, src, exponent, dst, n);
  }
  return x;
}

// Sets the attributes named by `kwargs` on `target` (a bound object), refusing unknown names with
// the names accepted: the one place keyword construction of the configuration classes happens.
void set_attributes(py::handle target, const py::kwargs& kwargs, const char* what) {
  for (auto item : kwargs) {
    const std::string key = py::str(item.first);
    if (!py::hasattr(target, key.c_str()) || key.rfind('_', 0) == 0)
      throw py::type_error(std::string(what) + ": unknown keyword argument '" + key + "'");
    target.attr(key.c_str()) = item.second;
  }
}

// The policy's keyword form: its attributes, and `headroom` / `rounding` / `granularity` for all
// three classes.
void apply_policy_kwargs(PrecisionPolicy& p, const py::kwargs& kwargs) {
  py::kwargs rest;
  for (auto item : kwargs) {
    const std::string key = py::str(item.first);
    if (key == "headroom") {
      const int h = item.second.cast<int>();
      p.dfp.weights.headroom = p.dfp.activations.headroom = p.dfp.gradients.headroom = h;
    } else if (key == "rounding") {
      const Rounding r = parse_rounding(item.second.cast<std::string>(), "PrecisionPolicy(rounding=...)");
      p.dfp.weights.rounding = p.dfp.activations.rounding = p.dfp.gradients.rounding = r;
    } else if (key == "granularity") {
      const Granularity g = parse_granularity(item.second.cast<std::string>(), "PrecisionPolicy(granularity=...)");
      p.dfp.weights.granularity = p.dfp.activations.granularity = p.dfp.gradients.granularity = g;
    } else {
      rest[item.first] = item.second;
    }
  }
  set_attributes(py::cast(&p, py::return_value_policy::reference), rest, "dfp.PrecisionPolicy");
  p.validate("dfp.PrecisionPolicy");
}

bool is_policy_key(const std::string& key) {
  static const char* const keys[] = {"precision", "overrides", "headroom", "rounding",
                                     "weights_format", "activations_format", "gradients_format",
                                     "weights_headroom", "activations_headroom", "gradients_headroom",
                                     "weights_rounding", "activations_rounding", "gradients_rounding",
                                     "granularity", "weights_granularity", "activations_granularity",
                                     "gradients_granularity",
                                     "fp8_scaling", "fp8_amax_history", "fp8_margin", "fp8_overflow"};
  for (const char* k : keys)
    if (key == k) return true;
  return false;
}

PrecisionPolicy policy_from(const py::object& policy, const py::kwargs& kwargs) {
  PrecisionPolicy p;
  if (py::isinstance<py::str>(policy)) p.precision = parse_precision(policy.cast<std::string>(), "Model.build(policy=...)");
  else if (!policy.is_none()) p = policy.cast<PrecisionPolicy>();
  apply_policy_kwargs(p, kwargs);
  return p;
}

std::vector<std::pair<std::string, Precision>> overrides_from(const py::object& v) {
  if (py::isinstance<py::str>(v)) return PrecisionPolicy::parse_overrides(v.cast<std::string>(), "PrecisionPolicy.overrides");
  std::vector<std::pair<std::string, Precision>> out;
  const py::object items = py::isinstance<py::dict>(v) ? v.attr("items")() : v;
  for (py::handle pair : items) {
    auto t = pair.cast<std::pair<std::string, std::string>>();
    out.emplace_back(t.first, parse_precision(t.second, "PrecisionPolicy.overrides['" + t.first + "']"));
  }
  return out;
}

std::optional<std::string> format_name(const std::optional<FloatFormat>& f) {
  return f ? std::optional<std::string>(float_format_name(*f)) : std::nullopt;
}
std::optional<FloatFormat> parse_format(const std::optional<std::string>& s, const char* field) {
  return s ? std::optional<FloatFormat>(parse_float_format(*s, std::string("PrecisionPolicy.") + field)) : std::nullopt;
}

// A record as a dict, its fields named as in C++ (and in the run files).
py::dict record(std::initializer_list<std::pair<const char*, py::object>> fields) {
  py::dict d;
  for (const auto& [name, value] : fields) d[name] = value;
  return d;
}

py::dict epoch_dict(const EpochMetrics& e) {
  return record({{"epoch", py::int_(e.epoch)}, {"train_loss", py::float_(e.train_loss)}, {"train_top1", py::float_(e.train_top1)},
                 {"test_loss", py::float_(e.test_loss)}, {"test_top1", py::float_(e.test_top1)},
                 {"test_top5", py::float_(e.test_top5)}, {"images_per_second", py::float_(e.images_per_second)},
                 {"data_wait_seconds", py::float_(e.data_wait_seconds)}, {"epoch_seconds", py::float_(e.epoch_seconds)},
                 {"lr", py::float_(e.lr)}, {"peak_rss_kib", py::int_(e.peak_rss_kib)}, {"loss_scale", py::float_(e.loss_scale)},
                 {"skipped_steps", py::int_(e.skipped_steps)}});
}

// A text callback for the C++ side that takes the GIL to call `fn` (None: no callback). The
// handle is borrowed: the caller's frame holds the object for the whole call.
std::function<void(const std::string&)> text_callback(py::handle fn) {
  if (fn.is_none()) return {};
  return [fn](const std::string& s) {
    py::gil_scoped_acquire locked;
    fn(s);
  };
}

// A NumPy view of the floats at `data` in the given shape (row-major): no copy, with `owner` (the
// model) as its base, so that the view keeps the model alive.
py::array_t<float> view_of(const py::object& owner, float* data, const std::vector<py::ssize_t>& shape) {
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t stride = sizeof(float);
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return py::array_t<float>(shape, strides, data, owner);
}

void check_built(const Model& m, const char* what) {
  DFP_CHECK(m.built(), Status::invalid_argument,
            std::string(what) + ": the model '" + m.name() + "' is not built yet (call build())");
}

// A parameter as NumPy views of its value and gradient: no copy, the model as the views' base.
struct ParameterView {
  std::string name;
  py::array value, grad;
  bool decay = true;
};

py::list parameter_views(const py::object& self) {
  Model& m = self.cast<Model&>();
  const auto lock = model_lock(m);
  check_built(m, "Model.parameters()");
  py::list out;
  for (const Parameter& p : m.parameters()) {
    const std::vector<py::ssize_t> shape{py::ssize_t(p.size)};
    out.append(ParameterView{p.name, view_of(self, p.value, shape), view_of(self, p.grad, shape), p.decay});
  }
  return out;
}

// A named tensor of the model's state (dfp::TensorView) as NumPy views in its PyTorch shape: the
// values, and a parameter's gradient (None for a buffer).
struct StateTensor {
  std::string name;
  py::array value;
  py::object grad;
  bool trainable = false;
};

std::vector<py::ssize_t> shape_of(const TensorView& v) { return {v.shape.begin(), v.shape.end()}; }

StateTensor state_tensor(const py::object& self, const TensorView& v) {
  const auto shape = shape_of(v);
  return {v.name, view_of(self, v.data, shape), v.grad ? py::object(view_of(self, v.grad, shape)) : py::none(), v.trainable};
}

std::string shape_text(const std::vector<py::ssize_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

// Copies the arrays of `tensors` (name -> array-like) into the model's state by name, every shape
// checked before anything is written, then re-quantizes the weights. strict: the names must be
// exactly the model's (as torch's load_state_dict(strict=True)).
void load_state_dict(Model& m, const py::dict& tensors, bool strict) {
  const auto lock = model_lock(m);
  check_built(m, "Model.load_state_dict");
  const std::vector<TensorView> state = m.state();
  std::vector<std::pair<const TensorView*, FloatArray>> copies;
  std::string missing;
  for (const TensorView& v : state) {
    const py::str key(v.name);
    if (!tensors.contains(key)) {
      missing.append(missing.empty() ? "" : ", ").append(v.name);
      continue;
    }
    FloatArray a = FloatArray::ensure(tensors[key]);
    DFP_CHECK(a, Status::invalid_argument, "Model.load_state_dict: '" + v.name + "': not convertible to a float32 array");
    const std::vector<py::ssize_t> want = shape_of(v), got = shape_of(a);
    DFP_CHECK(got == want, Status::invalid_argument,
              "Model.load_state_dict: '" + v.name + "': shape " + shape_text(got) + " in the dict, " + shape_text(want) +
                  " in the model '" + m.name() + "'");
    copies.emplace_back(&v, std::move(a));
  }
  if (strict) {
    DFP_CHECK(missing.empty(), Status::invalid_argument,
              "Model.load_state_dict: the dict lacks the model's tensors " + missing + " (strict=False loads the others)");
    std::string unexpected;
    for (auto item : tensors) {
      const std::string key = py::str(item.first);
      if (std::none_of(state.begin(), state.end(), [&](const TensorView& v) { return v.name == key; }))
        unexpected.append(unexpected.empty() ? "" : ", ").append(key);
    }
    DFP_CHECK(unexpected.empty(), Status::invalid_argument,
              "Model.load_state_dict: the model '" + m.name() + "' has no tensors named " + unexpected +
                  " (strict=False ignores them)");
  }
  py::gil_scoped_release unlocked;
  for (const auto& [v, a] : copies) std::memcpy(v->data, a.data(), v->size * sizeof(float));
  m.weights_updated();
}

// Checks that `images` is an NCHW batch for the model's input and returns its count.
int image_count(const Model& m, const FloatArray& images, const char* what) {
  check_built(m, what);
  const TensorShape in = m.shape(0);
  DFP_CHECK(images.ndim() == 4 && images.shape(1) == in.c && images.shape(2) == in.h && images.shape(3) == in.w,
            Status::invalid_argument,
            std::string(what) + ": images: expected an array of shape (count, " + std::to_string(in.c) + ", " +
                std::to_string(in.h) + ", " + std::to_string(in.w) + ") (NCHW), got " + std::string(py::str(images.attr("shape"))));
  return int(images.shape(0));
}

// The NCHW images in dfp's blocked layout (to run without the GIL), on the model's threads (a
// dfp.torch segment's input is a feature map of megabytes). Every element is written: no zeroing.
std::unique_ptr<float[]> blocked_images(const Model& m, const float* nchw, int count) {
  const TensorShape in = m.shape(0);
  std::unique_ptr<float[]> blocked(new float[blocked_size(count, in.c, in.h, in.w)]);
  to_blocked(m.context(), nchw, blocked.get(), count, in.c, in.h, in.w);
  return blocked;
}

// The labels as int32 class indices, each checked to be in [0, classes): an integer array (or a
// sequence NumPy makes one of) only, so that no label is rounded or wrapped on the way to int32.
std::vector<int32_t> class_labels(const Model& m, const py::object& labels, int count, const char* what) {
  const py::array a = py::array::ensure(labels);
  DFP_CHECK(a, Status::invalid_argument, std::string(what) + ": labels: not convertible to an array");
  const char kind = a.dtype().kind();
  DFP_CHECK(kind == 'i' || kind == 'u', Status::invalid_argument,
            std::string(what) + ": labels: expected integer class indices, got dtype " + std::string(py::str(a.dtype())) +
                " (convert with .astype(int) where the values are whole numbers)");
  DFP_CHECK(a.ndim() == 1 && a.shape(0) == count, Status::invalid_argument,
            std::string(what) + ": labels: expected " + std::to_string(count) + " labels (one per image), got shape " +
                std::string(py::str(a.attr("shape"))));
  const int classes = m.classes();
  std::vector<int32_t> out(static_cast<size_t>(count));
  auto take = [&](auto values) {
    for (int i = 0; i < count; ++i) {
      const auto v = values.at(i);
      bool ok = uint64_t(v) < uint64_t(classes);
      if constexpr (std::is_signed_v<decltype(v)>) ok = ok && v >= 0;
      DFP_CHECK(ok, Status::invalid_argument,
                std::string(what) + ": labels: label " + std::to_string(v) + " of image " + std::to_string(i) +
                    " outside [0, " + std::to_string(classes) + ")");
      out[size_t(i)] = int32_t(v);
    }
  };
  if (kind == 'u') take(py::array_t<uint64_t, py::array::forcecast>::ensure(a));
  else take(py::array_t<int64_t, py::array::forcecast>::ensure(a));
  return out;
}

StepResult forward(Model& m, const FloatArray& images, const py::object& labels, bool train) {
  const auto lock = model_lock(m);
  const int count = image_count(m, images, "Model.forward");
  const std::vector<int32_t> y = class_labels(m, labels, count, "Model.forward");
  const float* x = images.data();
  py::gil_scoped_release unlocked;
  return m.forward(blocked_images(m, x, count).get(), y.data(), count, train);
}

py::array_t<float> logits(Model& m, const FloatArray& images, bool train, const char* what) {
  const auto lock = model_lock(m);
  const int count = image_count(m, images, what);
  py::array_t<float> out({py::ssize_t(count), py::ssize_t(m.classes())});
  const float* x = images.data();
  float* z = out.mutable_data();
  {
    py::gil_scoped_release unlocked;
    m.logits(blocked_images(m, x, count).get(), count, train, z);
  }
  return out;
}

bool backward(Model& m, const py::object& logits_grad) {
  const auto lock = model_lock(m);
  if (logits_grad.is_none()) {
    py::gil_scoped_release unlocked;
    return m.backward();
  }
  check_built(m, "Model.backward");
  const FloatArray g = FloatArray::ensure(logits_grad);
  DFP_CHECK(g, Status::invalid_argument, "Model.backward: logits_grad: not convertible to a float32 array");
  const std::vector<py::ssize_t> want{m.batch(), m.classes()};
  DFP_CHECK(shape_of(g) == want, Status::invalid_argument,
            "Model.backward: logits_grad: expected shape " + shape_text(want) + " (batch, classes), got " +
                shape_text(shape_of(g)));
  const float* d = g.data();
  py::gil_scoped_release unlocked;
  return m.backward(d);
}

py::array_t<float> input_grad(const Model& m) {
  const auto lock = model_lock(m);
  check_built(m, "Model.input_grad");
  const TensorShape in = m.shape(0);
  py::array_t<float> out({py::ssize_t(m.batch()), py::ssize_t(in.c), py::ssize_t(in.h), py::ssize_t(in.w)});
  float* g = out.mutable_data();
  py::gil_scoped_release unlocked;
  m.input_grad(g);
  return out;
}

}  // namespace

PYBIND11_MODULE(_dfp, mod) {
  mod.doc() = "dfp: INT16 dynamic fixed point CNN training on CPUs (the compiled part of the dfp package)";
  mod.attr("__version__") = DFP_VERSION;  // the project's version (CMake project(VERSION)), as `dfp --version`

  g_error = PyErr_NewException("dfp.Error", PyExc_RuntimeError, nullptr);
  py::tuple bases = py::make_tuple(py::handle(g_error), py::handle(PyExc_ValueError));
  g_invalid_argument = PyErr_NewException("dfp.InvalidArgumentError", bases.ptr(), nullptr);
  mod.attr("Error") = py::handle(g_error);
  mod.attr("InvalidArgumentError") = py::handle(g_invalid_argument);
  py::register_exception_translator(translate_error);

  mod.attr("DEFAULT_HEADROOM") = kDfpDefaultHeadroom;
  mod.attr("MAX_HEADROOM") = kDfpMaxHeadroom;

  py::class_<Context>(mod, "Context", "Worker threads, kernel level and base seed; every computation takes one.")
      .def(py::init([](int threads, const std::string& isa, uint64_t seed) {
             ContextOptions o;
             o.threads = threads;
             o.isa = isa;
             o.seed = seed;
             return std::make_unique<Context>(o);
           }),
           py::arg("threads") = 0, py::arg("isa") = "", py::arg("seed") = 1)
      .def_property_readonly("threads", &Context::threads)
      .def_property_readonly("isa", [](const Context& c) { return std::string(isa_name(c.isa())); })
      .def_property_readonly("seed", &Context::seed)
      .def("__repr__", [](const Context& c) {
        return "dfp.Context(threads=" + std::to_string(c.threads()) + ", isa='" + isa_name(c.isa()) +
               "', seed=" + std::to_string(c.seed()) + ")";
      });

  mod.def("_quantize", &quantize, py::arg("ctx"), py::arg("array"), py::arg("exponent"), py::arg("rounding"),
          py::arg("headroom"), py::arg("seed"));
  mod.def("_dequantize", &dequantize, py::arg("ctx"), py::arg("q"), py::arg("exponent"));
  mod.def("exponent_for", &dfp16_exponent, py::arg("max_abs"), py::arg("headroom") = kDfpDefaultHeadroom,
          "The shared DFP16 exponent of a tensor whose largest magnitude is max_abs.");

  py::class_<PrecisionPolicy>(mod, "PrecisionPolicy",
                              "Which precision each Conv2d/Linear runs in, the 16-bit float formats and the DFP16 numerics.")
      .def(py::init([](const py::kwargs& kwargs) {
        PrecisionPolicy p;
        apply_policy_kwargs(p, kwargs);
        return p;
      }))
      .def_property(
          "precision", [](const PrecisionPolicy& p) { return std::string(precision_name(p.precision)); },
          [](PrecisionPolicy& p, const std::string& s) { p.precision = parse_precision(s, "PrecisionPolicy.precision"); })
      .def_property(
          "overrides",
          [](const PrecisionPolicy& p) {
            py::list out;
            for (const auto& [pattern, prec] : p.overrides) out.append(py::make_tuple(pattern, precision_name(prec)));
            return out;
          },
          [](PrecisionPolicy& p, const py::object& v) { p.overrides = overrides_from(v); })
#define DFP_FORMAT_PROPERTY(field)                                                                   \
  .def_property(                                                                                     \
      #field, [](const PrecisionPolicy& p) { return format_name(p.field); },                         \
      [](PrecisionPolicy& p, const std::optional<std::string>& s) { p.field = parse_format(s, #field); })
      DFP_FORMAT_PROPERTY(weights_format) DFP_FORMAT_PROPERTY(activations_format) DFP_FORMAT_PROPERTY(gradients_format)
#undef DFP_FORMAT_PROPERTY
#define DFP_CLASS_PROPERTIES(cls)                                                                     \
  .def_property(                                                                                      \
      #cls "_headroom", [](const PrecisionPolicy& p) { return p.dfp.cls.headroom; },                  \
      [](PrecisionPolicy& p, int h) { p.dfp.cls.headroom = h; })                                      \
      .def_property(                                                                                  \
          #cls "_rounding", [](const PrecisionPolicy& p) { return std::string(rounding_name(p.dfp.cls.rounding)); }, \
          [](PrecisionPolicy& p, const std::string& s) {                                              \
            p.dfp.cls.rounding = parse_rounding(s, "PrecisionPolicy." #cls "_rounding");              \
          })                                                                                          \
      .def_property(                                                                                  \
          #cls "_granularity",                                                                        \
          [](const PrecisionPolicy& p) { return std::string(granularity_name(p.dfp.cls.granularity)); }, \
          [](PrecisionPolicy& p, const std::string& s) {                                              \
            p.dfp.cls.granularity = parse_granularity(s, "PrecisionPolicy." #cls "_granularity");     \
          })
      DFP_CLASS_PROPERTIES(weights) DFP_CLASS_PROPERTIES(activations) DFP_CLASS_PROPERTIES(gradients)
#undef DFP_CLASS_PROPERTIES
      .def_property(
          "fp8_scaling", [](const PrecisionPolicy& p) { return std::string(float8_scaling_name(p.fp8.scaling)); },
          [](PrecisionPolicy& p, const std::string& s) { p.fp8.scaling = parse_float8_scaling(s, "PrecisionPolicy.fp8_scaling"); },
          "'none', 'current' or 'delayed': the per-tensor power-of-two scale of e4m3/e5m2 tensors")
      .def_property(
          "fp8_amax_history", [](const PrecisionPolicy& p) { return p.fp8.amax_history; },
          [](PrecisionPolicy& p, int n) { p.fp8.amax_history = n; }, "delayed scaling: tensors whose maxima set the scale")
      .def_property(
          "fp8_margin", [](const PrecisionPolicy& p) { return p.fp8.margin; }, [](PrecisionPolicy& p, int m) { p.fp8.margin = m; },
          "binades the scale leaves free above the maximum")
      .def_property(
          "fp8_overflow", [](const PrecisionPolicy& p) { return std::string(overflow_name(p.fp8.overflow)); },
          [](PrecisionPolicy& p, const std::string& s) { p.fp8.overflow = parse_overflow(s, "PrecisionPolicy.fp8_overflow"); },
          "'saturate' or 'nonfinite' (e5m2 infinity, e4m3 NaN)")
      .def("validate", [](const PrecisionPolicy& p) { p.validate("dfp.PrecisionPolicy"); })
      .def("describe", &PrecisionPolicy::describe)
      .def("resolve", [](const PrecisionPolicy& p, const std::string& layer) { return std::string(precision_name(p.resolve(layer))); },
           py::arg("layer_name"), "The precision the layer named layer_name runs in.")
      .def("__repr__", [](const PrecisionPolicy& p) { return "dfp.PrecisionPolicy(" + p.describe() + ")"; });

  py::class_<LossScaleOptions>(mod, "LossScaleOptions", "Loss scaling: mode none, static, dynamic or adaptive.")
      .def(py::init([](const py::kwargs& kwargs) {
        LossScaleOptions o;
        set_attributes(py::cast(&o, py::return_value_policy::reference), kwargs, "dfp.LossScaleOptions");
        return o;
      }))
      .def_property(
          "mode", [](const LossScaleOptions& o) { return std::string(loss_scale_mode_name(o.mode)); },
          [](LossScaleOptions& o, const std::string& s) { o.mode = parse_loss_scale_mode(s, "LossScaleOptions.mode"); })
      .def_readwrite("init_scale", &LossScaleOptions::init_scale)
      .def_readwrite("growth_factor", &LossScaleOptions::growth_factor)
      .def_readwrite("backoff_factor", &LossScaleOptions::backoff_factor)
      .def_readwrite("growth_interval", &LossScaleOptions::growth_interval)
      .def_readwrite("adaptive_max_factor", &LossScaleOptions::adaptive_max_factor)
      .def_readwrite("adaptive_max_scale", &LossScaleOptions::adaptive_max_scale)
      .def("validate", [](const LossScaleOptions& o) { o.validate("dfp.LossScaleOptions"); })
      .def("__repr__", [](const LossScaleOptions& o) { return "dfp.LossScaleOptions(" + o.describe() + ")"; });

  py::class_<StepResult>(mod, "StepResult", "One forward pass: mean loss, top-1 and top-5 hits, images.")
      .def_readonly("loss", &StepResult::loss)
      .def_readonly("correct1", &StepResult::correct1)
      .def_readonly("correct5", &StepResult::correct5)
      .def_readonly("count", &StepResult::count)
      .def("__repr__", [](const StepResult& r) {
        return "dfp.StepResult(loss=" + std::string(py::str(py::float_(r.loss))) + ", correct1=" + std::to_string(r.correct1) +
               ", correct5=" + std::to_string(r.correct5) + ", count=" + std::to_string(r.count) + ")";
      });

  py::class_<ParameterView>(mod, "Parameter",
                            "A trainable tensor: NumPy views (no copy) of its FP32 values and gradient, which keep the model alive.")
      .def_readonly("name", &ParameterView::name)
      .def_readonly("value", &ParameterView::value)
      .def_readonly("grad", &ParameterView::grad)
      .def_readonly("decay", &ParameterView::decay)
      .def("__repr__", [](const ParameterView& p) {
        return "dfp.Parameter('" + p.name + "', size=" + std::to_string(p.value.size()) + ")";
      });

  py::class_<StateTensor>(mod, "Tensor",
                          "A named tensor of the model's state: NumPy views (no copy) of its values and, for a "
                          "parameter, its gradient, in PyTorch's shape; they keep the model alive.")
      .def_readonly("name", &StateTensor::name)
      .def_readonly("value", &StateTensor::value)
      .def_readonly("grad", &StateTensor::grad)
      .def_readonly("trainable", &StateTensor::trainable)
      .def_property_readonly("shape", [](const StateTensor& t) { return t.value.attr("shape"); })
      .def("__repr__", [](const StateTensor& t) {
        return "dfp.Tensor('" + t.name + "', shape=" + shape_text(shape_of(t.value)) +
               (t.trainable ? ", trainable)" : ", buffer)");
      });

  py::class_<Model, ModelHolder>(mod, "Model", "A graph of layers, built layer by layer or from the zoo, then build() once.")
      .def(py::init([](const Context& ctx, const std::string& name) { return ModelHolder(new Model(ctx, name)); }),
           py::arg("ctx"), py::arg("name") = "model", py::keep_alive<1, 2>())
      .def_static(
          "from_zoo",
          [](const std::string& name, int channels, int height, int width, int classes, const Context& ctx) {
            ModelHolder m(new Model(ctx, name));
            build_model(*m, name, channels, height, width, classes);
            return m;
          },
          py::arg("name"), py::arg("channels"), py::arg("height"), py::arg("width"), py::arg("classes"), py::arg("ctx"),
          py::keep_alive<0, 6>(), "The zoo's architecture `name` (dfp.models.names()) with its input and loss.")
      .def("input", locked(&Model::input), py::arg("channels"), py::arg("height"), py::arg("width"))
      .def("conv", locked(&Model::conv), py::arg("x"), py::arg("out_channels"), py::arg("kernel"), py::arg("stride") = 1,
           py::arg("pad") = 0, py::arg("bias") = false, py::arg("name") = "", py::arg("groups") = 1)
      .def("batchnorm", locked(&Model::batchnorm), py::arg("x"), py::arg("name") = "", py::arg("eps") = 1e-5)
      .def("relu", locked(&Model::relu), py::arg("x"), py::arg("name") = "")
      .def("maxpool", locked(&Model::maxpool), py::arg("x"), py::arg("kernel"), py::arg("stride"), py::arg("pad") = 0,
           py::arg("ceil_mode") = false, py::arg("name") = "")
      .def("avgpool", locked(&Model::avgpool), py::arg("x"), py::arg("kernel"), py::arg("stride"), py::arg("pad") = 0,
           py::arg("name") = "")
      .def("global_avgpool", locked(&Model::global_avgpool), py::arg("x"), py::arg("name") = "")
      .def("flatten", locked(&Model::flatten), py::arg("x"), py::arg("name") = "")
      .def("linear", locked(&Model::linear), py::arg("x"), py::arg("out_features"), py::arg("bias") = true, py::arg("name") = "")
      .def("add", locked(&Model::add), py::arg("a"), py::arg("b"), py::arg("name") = "")
      .def(
          "concat",
          [](Model& m, const std::vector<Model::Node>& xs, const std::string& name) {
            const auto lock = model_lock(m);
            DFP_CHECK(!xs.empty(), Status::invalid_argument,
                      "Model.concat: xs: expected a list of at least one node, got an empty list");
            return m.concat(xs, name);
          },
          py::arg("xs"), py::arg("name") = "")
      .def("dropout", locked(&Model::dropout), py::arg("x"), py::arg("p"), py::arg("name") = "")
      .def("lrn", locked(&Model::lrn), py::arg("x"), py::arg("size"), py::arg("alpha"), py::arg("beta"), py::arg("k"),
           py::arg("name") = "")
      .def("shortcut_pad", locked(&Model::shortcut_pad), py::arg("x"), py::arg("out_channels"), py::arg("stride"),
           py::arg("name") = "")
      .def(
          "layer",
          [](Model& m, const std::string& kind, const py::object& inputs, const std::string& name,
             const py::kwargs& params) {
            std::vector<Model::Node> xs;
            if (py::isinstance<py::int_>(inputs) && !py::isinstance<py::bool_>(inputs))
              xs = {inputs.cast<Model::Node>()};
            else if (py::isinstance<py::sequence>(inputs) && !py::isinstance<py::str>(inputs))
              for (const py::handle v : inputs.cast<py::sequence>()) {
                if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v))
                  throw py::type_error("Model.layer: inputs: expected nodes (ints), got a " +
                                       std::string(py::str(v.get_type().attr("__name__"))));
                xs.push_back(v.cast<Model::Node>());
              }
            else
              throw py::type_error("Model.layer: inputs: expected a node or a list of nodes, got a " +
                                   std::string(py::str(inputs.get_type().attr("__name__"))));
            std::vector<std::pair<std::string, double>> values;
            for (const auto& [k, v] : params) {
              const std::string key = py::str(k);
              if (py::isinstance<py::bool_>(v))
                values.emplace_back(key, v.cast<bool>() ? 1.0 : 0.0);
              else if (py::isinstance<py::int_>(v) || py::isinstance<py::float_>(v))
                values.emplace_back(key, v.cast<double>());
              else
                throw py::type_error("Model.layer: parameter '" + key + "': expected a number or a bool, got a " +
                                     std::string(py::str(v.get_type().attr("__name__"))));
            }
            const auto lock = model_lock(m);
            return m.layer(kind, std::move(xs), values, name);
          },
          py::arg("kind"), py::arg("inputs"), py::arg("name") = "",
          "A layer of any kind by name (dfp.layer_kinds()), reading `inputs` (a node or a list), with the "
          "kind's parameters as keywords: m.layer('lrn', x, size=5, alpha=1e-4, beta=0.75, k=2).")
      .def("softmax_cross_entropy", locked(&Model::softmax_cross_entropy), py::arg("x"), py::arg("label_smoothing") = 0.f)
      .def_property("label_smoothing", locked(&Model::label_smoothing), locked(&Model::set_label_smoothing))
      .def("shape", [](const Model& m, int node) {
        const TensorShape s = locked(&Model::shape)(m, node);
        return py::make_tuple(s.n, s.c, s.h, s.w);
      }, py::arg("node"), "(n, c, h, w) of a node's output; n is the batch once built, else 0.")
      .def_property_readonly("name", locked(&Model::name))
      .def(
          "build",
          [](Model& m, int batch, const py::object& policy, bool input_grad, const py::kwargs& kwargs) {
            const PrecisionPolicy p = policy_from(policy, kwargs);
            const auto lock = model_lock(m);
            if (input_grad) m.set_input_grad(true);
            py::gil_scoped_release unlocked;
            m.build(batch, p);
          },
          py::arg("batch"), py::arg("policy") = py::none(), py::kw_only(), py::arg("input_grad") = false,
          "Plans every buffer for batches of up to `batch` images. policy: a PrecisionPolicy, a precision name, or "
          "None; keyword arguments (precision=, overrides=, headroom=, rounding=, *_format=, ...) set policy fields. "
          "input_grad=True: as set_input_grad(True).")
      .def_property_readonly("built", locked(&Model::built))
      .def_property_readonly("batch", locked(&Model::batch))
      .def("forward", &forward, py::arg("images"), py::arg("labels"), py::arg("train") = true,
           "One forward pass and the loss: images float32 (count, C, H, W) NCHW, labels int (count,).")
      .def_property_readonly("classes", locked(&Model::classes), "The logits' count per image.")
      .def_property_readonly("policy", [](const Model& m) { return locked(&Model::policy)(m); },
                             "The precision policy build() resolved (a copy).")
      .def(
          "logits", [](Model& m, const FloatArray& images, bool train) { return logits(m, images, train, "Model.logits"); },
          py::arg("images"), py::arg("train") = false,
          "Logits of images float32 (count, C, H, W) NCHW, count 1..batch, as a float32 (count, classes) array. "
          "train=True: a training forward (count = batch) for backward(logits_grad).")
      .def(
          "predict", [](Model& m, const FloatArray& images) { return logits(m, images, false, "Model.predict"); },
          py::arg("images"), "logits(images, train=False): inference, BatchNorm on its running statistics.")
      .def("backward", &backward, py::arg("logits_grad") = py::none(),
           "Gradients of the last training forward into every parameter's grad; False when one is not finite. "
           "logits_grad: d(loss)/d(logits) float32 (batch, classes) for a caller's loss; None: the built-in "
           "softmax cross-entropy of the labelled forward().")
      .def("set_input_grad", locked(&Model::set_input_grad), py::arg("on"),
           "Before build(): also compute the gradient with respect to the input images (input_grad()).")
      .def("input_grad", &input_grad,
           "d(loss)/d(images) of the last training batch as float32 (batch, C, H, W) NCHW (a copy); needs "
           "set_input_grad(True) before build() and a backward since the last forward.")
      .def("weights_updated", [](Model& m, const std::optional<std::vector<float>>& max_abs) {
        const auto lock = model_lock(m);
        check_built(m, "Model.weights_updated");
        if (max_abs) {
          DFP_CHECK(max_abs->size() == m.parameters().size(), Status::invalid_argument,
                    "Model.weights_updated: max_abs has " + std::to_string(max_abs->size()) + " entries; expected " +
                        std::to_string(m.parameters().size()) + " (one per parameter, in parameters() order)");
          py::gil_scoped_release unlocked;
          m.weights_updated(*max_abs);
        } else {
          py::gil_scoped_release unlocked;
          m.weights_updated();
        }
      }, py::arg("max_abs") = py::none(),
      "Re-quantizes and re-packs the weights after their values were changed (through the NumPy views). "
      "max_abs: max|value| of each parameter (parameters() order) as the caller measured it (dfp.sgd_update "
      "returns them), saving a pass; a negative entry is measured here.")
      .def("parameters", &parameter_views, "The trainable tensors as dfp.Parameter (NumPy views, no copies).")
      .def(
          "state",
          [](const py::object& self) {
            Model& m = self.cast<Model&>();
            const auto lock = model_lock(m);
            check_built(m, "Model.state()");
            py::dict out;
            for (const TensorView& v : m.state()) out[py::str(v.name)] = state_tensor(self, v);
            return out;
          },
          "name -> dfp.Tensor for every parameter, then every buffer (NumPy views in PyTorch's shapes, no copies).")
      .def(
          "state_dict",
          [](const py::object& self) {
            Model& m = self.cast<Model&>();
            const auto lock = model_lock(m);
            check_built(m, "Model.state_dict()");
            py::dict out;
            for (const TensorView& v : m.state()) out[py::str(v.name)] = view_of(self, v.data, shape_of(v));
            return out;
          },
          "name -> float32 NumPy view (PyTorch's names and shapes; views, not copies: .copy() for a snapshot).")
      .def(
          "tensor",
          [](const py::object& self, const std::string& name) {
            Model& m = self.cast<Model&>();
            const auto lock = model_lock(m);
            check_built(m, "Model.tensor");
            return state_tensor(self, m.tensor(name));
          },
          py::arg("name"), "The dfp.Tensor named `name` (views, no copies).")
      .def("load_state_dict", &load_state_dict, py::arg("state_dict"), py::arg("strict") = true,
           "Copies the arrays of a name -> array dict into the model's tensors (shapes checked first), then "
           "weights_updated(). strict: the names must be exactly the model's.")
      .def_property_readonly("parameter_count", locked(&Model::parameter_count))
      .def_property("step", locked(&Model::step), locked(&Model::set_step))
      .def("set_fusion", locked(&Model::set_fusion), py::arg("on"))
      .def("set_numerics_interval", locked(&Model::set_numerics_interval), py::arg("interval"))
      .def("numerics", [](const Model& m) {
        const auto lock = model_lock(m);
        py::list out;
        for (const LayerNumerics& n : m.numerics()) out.append(numerics_record(n));
        return out;
      }, "Per-layer numerics of the reduced-precision layers, one dict each as a layer of metrics.jsonl has it "
         "(the DFP16 fields for int16 layers; SQNR and counts once a step was sampled).")
      .def("summary", locked(&Model::summary))
      .def("__repr__", [](const Model& m) { return "dfp.Model('" + locked(&Model::name)(m) + "')"; });
  bind_torch_state(mod);

  bind_layer_op(mod);

  mod.attr("STATE_VERSION") = kStateVersion;
  mod.def("_save_state", [](Model& m, const std::string& path) {
    const auto lock = model_lock(m);
    py::gil_scoped_release unlocked;
    save_state(m, path);
  }, py::arg("model"), py::arg("path"));
  mod.def("_load_state", [](Model& m, const std::string& path) {
    const auto lock = model_lock(m);
    py::gil_scoped_release unlocked;
    load_state(m, path);
  }, py::arg("model"), py::arg("path"));
  mod.def("_read_state_policy", [](const std::string& path) {
    py::gil_scoped_release unlocked;
    return read_state_policy(path);
  }, py::arg("path"));

  bind_optim(mod);  // optim.cpp: dfp.Sgd, dfp.sgd_update

  mod.def("model_names", &model_names);
  mod.def(
      "layer_kinds",
      [] {
        py::list out;
        for (const LayerKindInfo& k : layer_kinds()) {
          py::list fields;
          for (const LayerField& f : k.fields) {
            py::dict d;
            d["name"] = f.name;
            d["torch_name"] = f.torch_name;
            d["type"] = f.type == LayerField::Type::boolean ? "bool" : f.type == LayerField::Type::integer ? "int" : "float";
            d["required"] = f.required;
            if (f.type == LayerField::Type::boolean)
              d["default"] = f.default_value != 0;
            else if (f.type == LayerField::Type::integer)
              d["default"] = int(f.default_value);
            else
              d["default"] = f.default_value;
            fields.append(d);
          }
          py::dict d;
          d["name"] = k.name;
          d["short_name"] = k.short_name;
          d["torch_module"] = k.torch_module;
          d["inputs"] = k.inputs;
          d["fields"] = fields;
          out.append(d);
        }
        return out;
      },
      "The layer kinds Model.layer takes: name, short_name (as summaries print it), torch_module (the "
      "torch.nn module it stands for, or ''), inputs (-1: one or more) and fields (each parameter's name, "
      "torch_name, type, required and default).");

  py::class_<TrainConfig>(mod, "TrainConfig", "The configuration of dfp.train, as `dfp train`'s flags set it.")
      .def(py::init([](const py::kwargs& kwargs) {
        TrainConfig c;
        py::kwargs own, policy;
        for (auto item : kwargs) (is_policy_key(py::str(item.first)) ? policy : own)[item.first] = item.second;
        set_attributes(py::cast(&c, py::return_value_policy::reference), own, "dfp.TrainConfig");
        apply_policy_kwargs(c.policy, policy);
        return c;
      }), "Keyword arguments set fields; policy fields (precision=, overrides=, headroom=, ...) set config.policy.")
      .def_readwrite("model", &TrainConfig::model)
      .def_readwrite("dataset", &TrainConfig::dataset)
      .def_readwrite("data", &TrainConfig::data)
      .def_readwrite("init_from", &TrainConfig::init_from)
      .def_readwrite("init_skip", &TrainConfig::init_skip)
      .def_readwrite("image_size", &TrainConfig::image_size)
      .def_readwrite("policy", &TrainConfig::policy)
      .def_readwrite("loss_scale", &TrainConfig::loss_scale)
      .def_readwrite("numerics_interval", &TrainConfig::numerics_interval)
      .def_readwrite("label", &TrainConfig::label)
      .def_readwrite("epochs", &TrainConfig::epochs)
      .def_readwrite("batch_size", &TrainConfig::batch_size)
      .def_readwrite("lr", &TrainConfig::lr)
      .def_readwrite("momentum", &TrainConfig::momentum)
      .def_readwrite("weight_decay", &TrainConfig::weight_decay)
      .def_readwrite("nesterov", &TrainConfig::nesterov)
      .def_readwrite("schedule", &TrainConfig::schedule)
      .def_readwrite("warmup_epochs", &TrainConfig::warmup_epochs)
      .def_readwrite("milestones", &TrainConfig::milestones)
      .def_readwrite("step_epochs", &TrainConfig::step_epochs)
      .def_readwrite("gamma", &TrainConfig::gamma)
      .def_readwrite("label_smoothing", &TrainConfig::label_smoothing)
      .def_readwrite("augment", &TrainConfig::augment)
      .def_readwrite("threads", &TrainConfig::threads)
      .def_readwrite("workers", &TrainConfig::workers)
      .def_readwrite("isa", &TrainConfig::isa)
      .def_readwrite("seed", &TrainConfig::seed)
      .def_readwrite("out", &TrainConfig::out)
      .def_readwrite("overwrite", &TrainConfig::overwrite)
      .def_readwrite("resume", &TrainConfig::resume)
      .def_readwrite("limit_train", &TrainConfig::limit_train)
      .def_readwrite("limit_test", &TrainConfig::limit_test)
      .def_readwrite("print_every", &TrainConfig::print_every)
      .def_readwrite("stop_after", &TrainConfig::stop_after)
      .def_readwrite("profile", &TrainConfig::profile)
      .def_readwrite("device", &TrainConfig::device)
      .def("validate", [](const TrainConfig& c) { validate_train_config(c); },
           "Checks every setting as `dfp train` does; raises dfp.InvalidArgumentError naming the flag.")
      .def("__repr__", [](const TrainConfig& c) {
        return "dfp.TrainConfig(model='" + c.model + "', dataset='" + c.dataset + "', epochs=" + std::to_string(c.epochs) +
               ", batch_size=" + std::to_string(c.batch_size) + ", policy=" + c.policy.describe() + ")";
      });

  mod.def("_train", [](const TrainConfig& config, const py::object& on_epoch, const py::object& log) {
    const TrainConfig c = config;  // a copy: Python may not change it while the GIL is released
    std::function<void(const EpochMetrics&)> epoch_fn;
    if (!on_epoch.is_none()) {
      py::handle fn = on_epoch;
      epoch_fn = [fn](const EpochMetrics& e) {
        py::gil_scoped_acquire locked;
        fn(epoch_dict(e));
      };
    }
    const auto log_fn = text_callback(log);
    // Between steps the trainer asks whether to stop: a signal's Python handler runs there (as it
    // would between bytecodes), and the exception it raises (KeyboardInterrupt on Ctrl-C) ends the
    // run at that step, its finished epochs' files kept, then reaches the caller.
    py::object interrupt = py::none();
    const StopCheck stop = [&interrupt] {
      py::gil_scoped_acquire locked;
      if (PyErr_CheckSignals() == 0) return false;
      PyObject *type, *value, *trace;
      PyErr_Fetch(&type, &value, &trace);
      PyErr_NormalizeException(&type, &value, &trace);
      if (trace) PyException_SetTraceback(value, trace);
      interrupt = py::reinterpret_steal<py::object>(value);
      Py_XDECREF(type);
      Py_XDECREF(trace);
      return true;
    };
    std::vector<EpochMetrics> all;
    {
      py::gil_scoped_release unlocked;
      all = train(c, log_fn, epoch_fn, stop);
    }
    py::list out;
    for (const EpochMetrics& e : all) out.append(epoch_dict(e));
    return py::make_tuple(out, interrupt);
  }, py::arg("config"), py::arg("on_epoch"), py::arg("log"),
     "(epochs' metrics, None) after a whole run; (those of the epochs done, the exception) when a signal "
     "handler raised one (KeyboardInterrupt) between steps.");

  mod.def("_evaluate", [](const std::string& checkpoint, const std::string& data, int threads, const py::object& log) {
    const auto log_fn = text_callback(log);
    EvalResult r;
    {
      py::gil_scoped_release unlocked;
      r = evaluate_checkpoint(checkpoint, data, threads, log_fn);
    }
    return record({{"loss", py::float_(r.loss)}, {"top1", py::float_(r.top1)}, {"top5", py::float_(r.top5)},
                   {"images", py::int_(r.images)}});
  }, py::arg("checkpoint"), py::arg("data"), py::arg("threads"), py::arg("log"));
}
