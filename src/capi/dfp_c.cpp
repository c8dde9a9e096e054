// The C API (include/dfp/dfp.h) over the C++ API: handles that own their C++ objects, and one
// guard per function that turns every exception into a status and the calling thread's message.
#include "dfp/dfp.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "dfp/isa.hpp"
#include "dfp/model.hpp"
#include "dfp/models.hpp"
#include "dfp/optim.hpp"
#include "dfp/precision.hpp"
#include "dfp/state.hpp"
#include "dfp/status.hpp"

namespace dfp::capi {

// What a model handle stands for, shared with the optimizers made from it so that the handles can
// be released in any order. The context is shared the same way with its handle.
struct ModelState {
  std::shared_ptr<Context> ctx;
  Model model;
  // Set once dfp_model_build has planned everything below; the running functions check it.
  bool ready = false;
  // The images of one pass in the blocked layout (the C API takes plain NCHW), sized at the build
  // so that a step allocates nothing.
  std::vector<float> blocked;
  // Model::state(), taken once at the build: the views' names point into it.
  std::vector<TensorView> views;

  ModelState(std::shared_ptr<Context> c, std::string name) : ctx(std::move(c)), model(*ctx, std::move(name)) {}
};

}  // namespace dfp::capi

struct dfp_context {
  std::shared_ptr<dfp::Context> ctx;
};

struct dfp_model {
  std::shared_ptr<dfp::capi::ModelState> s;
};

struct dfp_sgd {
  std::shared_ptr<dfp::capi::ModelState> s;  // declared first: outlives the optimizer
  dfp::Sgd sgd;
  dfp_sgd(std::shared_ptr<dfp::capi::ModelState> state, const dfp::SgdOptions& options)
      : s(std::move(state)), sgd(*s->ctx, s->model, options) {}
};

namespace dfp::capi {
namespace {

// The calling thread's last failure message: a fixed buffer, so that reporting an error (out of
// memory included) cannot fail itself.
thread_local char t_message[4096] = "";

void set_message(const char* function, const char* what) noexcept {
  const int n = std::snprintf(t_message, sizeof t_message, "%s: %s", function, what);
  if (n >= int(sizeof t_message)) std::memcpy(t_message + sizeof t_message - 4, "...", 4);
}

dfp_status status_of(Status s) noexcept {
  switch (s) {
    case Status::invalid_argument: return DFP_ERR_INVALID_ARGUMENT;
    case Status::io_error: return DFP_ERR_IO;
    case Status::corrupt_data: return DFP_ERR_CORRUPT_DATA;
    case Status::unsupported: return DFP_ERR_UNSUPPORTED;
    case Status::numerical_error: return DFP_ERR_NUMERICAL;
    case Status::internal: return DFP_ERR_INTERNAL;
    case Status::out_of_memory: return DFP_ERR_OUT_OF_MEMORY;
  }
  return DFP_ERR_INTERNAL;
}

// Runs `body`, the whole of the C function `function`: nothing it throws gets further.
template <class Body>
dfp_status guarded(const char* function, Body&& body) noexcept {
  try {
    body();
    return DFP_OK;
  } catch (const Error& e) {
    set_message(function, e.what());
    return status_of(e.status());
  } catch (const std::bad_alloc&) {
    set_message(function, "out of memory");
    return DFP_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_message(function, e.what());
    return DFP_ERR_INTERNAL;
  } catch (...) {
    set_message(function, "an unknown exception");
    return DFP_ERR_INTERNAL;
  }
}

// The object `p` points to; `what` names the argument in the error.
template <class T>
T& need(T* p, const char* what) {
  DFP_CHECK(p, Status::invalid_argument, std::string(what) + ": NULL");
  return *p;
}

// The C string `p` (not NULL); `what` names the argument in the error.
std::string need_text(const char* p, const char* what) {
  DFP_CHECK(p, Status::invalid_argument, std::string(what) + ": NULL");
  return p;
}

ModelState& state_of(const dfp_model* m) { return *need(m, "model").s; }

ModelState& built(const dfp_model* m) {
  ModelState& s = state_of(m);
  DFP_CHECK(s.ready, Status::invalid_argument,
            "model '" + s.model.name() + "' is not built (call dfp_model_build first)");
  return s;
}

std::string text_or(const char* text, const char* fallback) { return text ? text : fallback; }

// Checks that `images` holds `count` NCHW images of the model's input and puts them in the
// model's blocked buffer, for Model's passes.
const float* blocked_images(ModelState& s, const float* images, size_t length, int count) {
  DFP_CHECK(images, Status::invalid_argument, "images: NULL");
  const int batch = s.model.batch();
  DFP_CHECK(count >= 1 && count <= batch, Status::invalid_argument,
            "count: expected 1 .. " + std::to_string(batch) + " (the model's batch), got " + std::to_string(count));
  const TensorShape in = s.model.shape(0);
  const size_t image = size_t(in.c) * in.h * in.w;
  DFP_CHECK(length == size_t(count) * image, Status::invalid_argument,
            "images: expected " + std::to_string(count) + " x " + std::to_string(in.c) + " x " + std::to_string(in.h) +
                " x " + std::to_string(in.w) + " = " + std::to_string(size_t(count) * image) +
                " floats (NCHW), got " + std::to_string(length));
  const size_t blocked_image = blocked_size(1, in.c, in.h, in.w);
  float* out = s.blocked.data();
  s.ctx->parallel_for(count, [&](int64_t lo, int64_t hi) {
    to_blocked(images + size_t(lo) * image, out + size_t(lo) * blocked_image, int(hi - lo), in.c, in.h, in.w);
  });
  return out;
}

void check_room(const void* out, size_t capacity, size_t needed, const char* what) {
  DFP_CHECK(out, Status::invalid_argument, std::string(what) + ": NULL");
  DFP_CHECK(capacity >= needed, Status::invalid_argument,
            std::string(what) + ": room for " + std::to_string(capacity) + " floats, " + std::to_string(needed) +
                " needed");
}

// Text out, as snprintf (see "text out" in dfp.h).
void write_text(const std::string& text, char* buffer, size_t size, size_t* length) {
  need(length, "length");
  DFP_CHECK(buffer || size == 0, Status::invalid_argument,
            "buffer: NULL with size " + std::to_string(size) + " (size 0 asks for the length only)");
  if (size > 0) {
    const size_t n = std::min(size - 1, text.size());
    std::memcpy(buffer, text.data(), n);
    buffer[n] = '\0';
  }
  *length = text.size();
}

void write_view(const TensorView& v, dfp_tensor_view* out) {
  DFP_CHECK(!v.shape.empty() && v.shape.size() <= DFP_MAX_DIMS, Status::internal,
            "tensor '" + v.name + "' has " + std::to_string(v.shape.size()) + " dimensions, the C API at most " +
                std::to_string(DFP_MAX_DIMS));
  dfp_tensor_view r{};
  r.name = v.name.c_str();
  r.ndim = int(v.shape.size());
  std::copy(v.shape.begin(), v.shape.end(), r.shape);
  r.size = v.size;
  r.data = v.data;
  r.grad = v.grad;
  r.trainable = v.trainable ? 1 : 0;
  *out = r;
}

// Adds a layer through `add` (a Model method call returning the node) and writes the node.
template <class Add>
dfp_status add_layer(const char* function, dfp_model* m, int* node, Add&& add) {
  return guarded(function, [&] {
    ModelState& s = state_of(m);
    need(node, "node");
    *node = add(s.model);
  });
}

// "size=5,alpha=1e-4": the named values of dfp_model_layer's `params`.
std::vector<std::pair<std::string, double>> parse_params(const char* text) {
  std::vector<std::pair<std::string, double>> out;
  const std::string s = text ? text : "";
  size_t at = 0;
  while (at < s.size()) {
    size_t end = s.find(',', at);
    if (end == std::string::npos) end = s.size();
    std::string item = s.substr(at, end - at);
    const size_t b = item.find_first_not_of(' '), e = item.find_last_not_of(' ');
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    const size_t eq = item.find('=');
    DFP_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < item.size(), Status::invalid_argument,
              "params: '" + item + "' expected name=value (pairs separated by commas), in '" + s + "'");
    std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    key.erase(key.find_last_not_of(' ') + 1);
    value.erase(0, value.find_first_not_of(' '));
    double v = 0;
    if (value == "true" || value == "false") {
      v = value == "true";
    } else {
      char* stop = nullptr;
      errno = 0;
      v = std::strtod(value.c_str(), &stop);
      DFP_CHECK(stop && *stop == '\0' && errno != ERANGE, Status::invalid_argument,
                "params: '" + key + "' expected a number, got '" + value + "'");
    }
    out.emplace_back(key, v);
    at = end + 1;
  }
  return out;
}

}  // namespace
}  // namespace dfp::capi

using namespace dfp;
using namespace dfp::capi;

extern "C" {

const char* dfp_status_name(dfp_status status) DFP_NOEXCEPT {
  switch (status) {
    case DFP_OK: return "ok";
    case DFP_ERR_INVALID_ARGUMENT: return "invalid_argument";
    case DFP_ERR_IO: return "io_error";
    case DFP_ERR_CORRUPT_DATA: return "corrupt_data";
    case DFP_ERR_UNSUPPORTED: return "unsupported";
    case DFP_ERR_NUMERICAL: return "numerical_error";
    case DFP_ERR_INTERNAL: return "internal";
    case DFP_ERR_OUT_OF_MEMORY: return "out_of_memory";
  }
  return "unknown";
}

const char* dfp_last_error(void) DFP_NOEXCEPT { return t_message; }

dfp_status dfp_layer_kinds(char* buffer, size_t size, size_t* length) DFP_NOEXCEPT {
  return guarded("dfp_layer_kinds", [&] {
    std::string all;
    for (const LayerKindInfo& k : layer_kinds()) {
      all += k.name + " inputs=" + (k.inputs < 0 ? std::string("1+") : std::to_string(k.inputs));
      for (const LayerField& f : k.fields) {
        std::ostringstream v;
        v << f.default_value;
        all += " " + f.name + "=" + (f.required ? std::string("(required)") : v.str());
      }
      all += "\n";
    }
    write_text(all, buffer, size, length);
  });
}

dfp_status dfp_zoo_names(char* buffer, size_t size, size_t* length) DFP_NOEXCEPT {
  return guarded("dfp_zoo_names", [&] {
    std::string all;
    for (const std::string& n : model_names()) all.append(all.empty() ? "" : ",").append(n);
    write_text(all, buffer, size, length);
  });
}

// ---- context ----

dfp_status dfp_context_create(int threads, uint64_t seed, dfp_context** out) DFP_NOEXCEPT {
  return guarded("dfp_context_create", [&] {
    need(out, "out");
    ContextOptions::validate_threads(threads, "threads");
    ContextOptions o;
    o.threads = threads;
    o.seed = seed;
    *out = new dfp_context{std::make_shared<Context>(o)};
  });
}

dfp_status dfp_context_destroy(dfp_context* ctx) DFP_NOEXCEPT {
  delete ctx;
  return DFP_OK;
}

dfp_status dfp_context_threads(const dfp_context* ctx, int* threads) DFP_NOEXCEPT {
  return guarded("dfp_context_threads", [&] {
    const Context& c = *need(ctx, "ctx").ctx;
    need(threads, "threads") = c.threads();
  });
}

dfp_status dfp_context_isa(const dfp_context* ctx, const char** isa) DFP_NOEXCEPT {
  return guarded("dfp_context_isa", [&] {
    const Context& c = *need(ctx, "ctx").ctx;
    need(isa, "isa") = isa_name(c.isa());
  });
}

// ---- models ----

dfp_status dfp_model_create(dfp_context* ctx, const char* name, dfp_model** out) DFP_NOEXCEPT {
  return guarded("dfp_model_create", [&] {
    const dfp_context& c = need(ctx, "ctx");
    need(out, "out");
    *out = new dfp_model{std::make_shared<ModelState>(c.ctx, text_or(name, "model"))};
  });
}

dfp_status dfp_model_create_zoo(dfp_context* ctx, const char* arch, int channels, int height, int width,
                                int classes, dfp_model** out) DFP_NOEXCEPT {
  return guarded("dfp_model_create_zoo", [&] {
    const dfp_context& c = need(ctx, "ctx");
    const std::string name = need_text(arch, "arch");
    need(out, "out");
    auto s = std::make_shared<ModelState>(c.ctx, name);
    build_model(s->model, name, channels, height, width, classes);
    *out = new dfp_model{std::move(s)};
  });
}

dfp_status dfp_model_destroy(dfp_model* model) DFP_NOEXCEPT {
  delete model;
  return DFP_OK;
}

dfp_status dfp_model_input(dfp_model* model, int channels, int height, int width, int* node) DFP_NOEXCEPT {
  return add_layer("dfp_model_input", model, node, [&](Model& m) { return m.input(channels, height, width); });
}

dfp_status dfp_model_conv(dfp_model* model, int x, int out_channels, int kernel, int stride, int pad, int bias,
                          int groups, const char* name, int* node) DFP_NOEXCEPT {
  return add_layer("dfp_model_conv", model, node, [&](Model& m) {
    return m.conv(x, out_channels, kernel, stride, pad, bias != 0, text_or(name, ""), groups);
  });
}

dfp_status dfp_model_batchnorm(dfp_model* model, int x, const char* name, int* node) DFP_NOEXCEPT {
  return add_layer("dfp_model_batchnorm", model, node, [&](Model& m) { return m.batchnorm(x, text_or(name, "")); });
}

dfp_status dfp_model_relu(dfp_model* model, int x, const char* name, int* node) DFP_NOEXCEPT {
  return add_layer("dfp_model_relu", model, node, [&](Model& m) { return m.relu(x, text_or(name, "")); });
}

dfp_status dfp_model_maxpool(dfp_model* model, int x, int kernel, int stride, int pad, int ceil_mode,
                             const char* name, int* node) DFP_NOEXCEPT {
  return add_layer("dfp_model_maxpool", model, node,
                   [&](Model& m) { return m.maxpool(x, kernel, stride, pad, ceil_mode != 0, text_or(name, "")); });
}

dfp_status dfp_model_avgpool(dfp_model* model, int x, int kernel, int stride, int pad, const char* name,
                             int* node) DFP_NOEXCEPT {
  return add_layer("dfp_model_avgpool", model, node,
                   [&](Model& m) { return m.avgpool(x, kernel, stride, pad, text_or(name, "")); });
}

dfp_status dfp_model_global_avgpool(dfp_model* model, int x, const char* name, int* node) DFP_NOEXCEPT {
  return add_layer("dfp_model_global_avgpool", model, node,
                   [&](Model& m) { return m.global_avgpool(x, text_or(name, "")); });
}

dfp_status dfp_model_flatten(dfp_model* model, int x, const char* name, int* node) DFP_NOEXCEPT {
  return add_layer("dfp_model_flatten", model, node, [&](Model& m) { return m.flatten(x, text_or(name, "")); });
}

dfp_status dfp_model_linear(dfp_model* model, int x, int out_features, int bias, const char* name,
                            int* node) DFP_NOEXCEPT {
  return add_layer("dfp_model_linear", model, node,
                   [&](Model& m) { return m.linear(x, out_features, bias != 0, text_or(name, "")); });
}

dfp_status dfp_model_add(dfp_model* model, int a, int b, const char* name, int* node) DFP_NOEXCEPT {
  return add_layer("dfp_model_add", model, node, [&](Model& m) { return m.add(a, b, text_or(name, "")); });
}

dfp_status dfp_model_concat(dfp_model* model, const int* xs, size_t count, const char* name, int* node) DFP_NOEXCEPT {
  return add_layer("dfp_model_concat", model, node, [&](Model& m) {
    DFP_CHECK(count >= 1, Status::invalid_argument, "count: expected at least 1 node, got 0");
    need(xs, "xs");
    return m.concat(std::vector<Model::Node>(xs, xs + count), text_or(name, ""));
  });
}

dfp_status dfp_model_dropout(dfp_model* model, int x, float p, const char* name, int* node) DFP_NOEXCEPT {
  return add_layer("dfp_model_dropout", model, node, [&](Model& m) { return m.dropout(x, p, text_or(name, "")); });
}

dfp_status dfp_model_lrn(dfp_model* model, int x, int size, float alpha, float beta, float k, const char* name,
                         int* node) DFP_NOEXCEPT {
  return add_layer("dfp_model_lrn", model, node,
                   [&](Model& m) { return m.lrn(x, size, alpha, beta, k, text_or(name, "")); });
}

dfp_status dfp_model_shortcut_pad(dfp_model* model, int x, int out_channels, int stride, const char* name,
                                  int* node) DFP_NOEXCEPT {
  return add_layer("dfp_model_shortcut_pad", model, node,
                   [&](Model& m) { return m.shortcut_pad(x, out_channels, stride, text_or(name, "")); });
}

dfp_status dfp_model_layer(dfp_model* model, const char* kind, const int* inputs, size_t count, const char* params,
                           const char* name, int* node) DFP_NOEXCEPT {
  return add_layer("dfp_model_layer", model, node, [&](Model& m) {
    need(kind, "kind");
    DFP_CHECK(count == 0 || inputs, Status::invalid_argument,
              "inputs: NULL with count " + std::to_string(count) + "; expected an array of count nodes");
    return m.layer(std::string(kind), std::vector<Model::Node>(inputs, inputs + count), parse_params(params),
                   text_or(name, ""));
  });
}

dfp_status dfp_model_softmax_cross_entropy(dfp_model* model, int x, float label_smoothing) DFP_NOEXCEPT {
  return guarded("dfp_model_softmax_cross_entropy",
                 [&] { state_of(model).model.softmax_cross_entropy(x, label_smoothing); });
}

dfp_status dfp_model_set_label_smoothing(dfp_model* model, float label_smoothing) DFP_NOEXCEPT {
  return guarded("dfp_model_set_label_smoothing", [&] { state_of(model).model.set_label_smoothing(label_smoothing); });
}

dfp_status dfp_model_node_shape(const dfp_model* model, int node, int* channels, int* height,
                                int* width) DFP_NOEXCEPT {
  return guarded("dfp_model_node_shape", [&] {
    const Model& m = state_of(model).model;
    const size_t nodes = m.graph().size();
    DFP_CHECK(node >= 0 && size_t(node) < nodes, Status::invalid_argument,
              "node: expected 0 .. " + std::to_string(int(nodes) - 1) + " (the nodes of model '" + m.name() +
                  "'), got " + std::to_string(node));
    need(channels, "channels");
    need(height, "height");
    need(width, "width");
    const TensorShape s = m.shape(node);
    *channels = s.c;
    *height = s.h;
    *width = s.w;
  });
}

dfp_status dfp_model_set_input_grad(dfp_model* model, int on) DFP_NOEXCEPT {
  return guarded("dfp_model_set_input_grad", [&] { state_of(model).model.set_input_grad(on != 0); });
}

dfp_status dfp_model_build(dfp_model* model, int batch, const char* precision, const char* overrides) DFP_NOEXCEPT {
  return guarded("dfp_model_build", [&] {
    ModelState& s = state_of(model);
    PrecisionPolicy policy;
    if (precision) policy.precision = parse_precision(precision, "precision");
    if (overrides) policy.overrides = PrecisionPolicy::parse_overrides(overrides, "overrides");
    policy.validate("policy");
    s.model.build(batch, policy);
    const TensorShape in = s.model.shape(0);
    s.blocked.assign(blocked_size(batch, in.c, in.h, in.w), 0.f);
    s.views = s.model.state();
    s.ready = true;
  });
}

dfp_status dfp_model_batch(const dfp_model* model, int* batch) DFP_NOEXCEPT {
  return guarded("dfp_model_batch", [&] {
    const ModelState& s = built(model);
    need(batch, "batch") = s.model.batch();
  });
}

dfp_status dfp_model_classes(const dfp_model* model, int* classes) DFP_NOEXCEPT {
  return guarded("dfp_model_classes", [&] {
    const ModelState& s = state_of(model);
    need(classes, "classes");
    *classes = s.model.classes();
  });
}

dfp_status dfp_model_parameter_count(const dfp_model* model, size_t* count) DFP_NOEXCEPT {
  return guarded("dfp_model_parameter_count", [&] {
    const ModelState& s = built(model);
    need(count, "count") = s.model.parameter_count();
  });
}

dfp_status dfp_model_summary(const dfp_model* model, char* buffer, size_t size, size_t* length) DFP_NOEXCEPT {
  return guarded("dfp_model_summary", [&] { write_text(state_of(model).model.summary(), buffer, size, length); });
}

// ---- training and inference ----

dfp_status dfp_model_forward(dfp_model* model, const float* images, size_t images_length, const int32_t* labels,
                             int count, int train, dfp_step_result* result) DFP_NOEXCEPT {
  return guarded("dfp_model_forward", [&] {
    ModelState& s = built(model);
    need(labels, "labels");
    const float* x = blocked_images(s, images, images_length, count);
    // Checked before the pass (Model checks them after it, once a training pass has updated
    // BatchNorm's statistics), so that a refused call changes nothing.
    const int classes = s.model.classes();
    for (int i = 0; i < count; ++i)
      DFP_CHECK(labels[i] >= 0 && labels[i] < classes, Status::invalid_argument,
                "labels: label " + std::to_string(labels[i]) + " of image " + std::to_string(i) + " outside [0, " +
                    std::to_string(classes) + ")");
    const StepResult r = s.model.forward(x, labels, count, train != 0);
    if (result) *result = dfp_step_result{r.loss, r.correct1, r.correct5, r.count};
  });
}

dfp_status dfp_model_backward(dfp_model* model, int* finite) DFP_NOEXCEPT {
  return guarded("dfp_model_backward", [&] {
    const bool ok = built(model).model.backward();
    if (finite) *finite = ok ? 1 : 0;
  });
}

dfp_status dfp_model_logits(dfp_model* model, const float* images, size_t images_length, int count, int train,
                            float* logits, size_t logits_capacity) DFP_NOEXCEPT {
  return guarded("dfp_model_logits", [&] {
    ModelState& s = built(model);
    const float* x = blocked_images(s, images, images_length, count);
    check_room(logits, logits_capacity, size_t(count) * s.model.classes(), "logits");
    s.model.logits(x, count, train != 0, logits);
  });
}

dfp_status dfp_model_predict(dfp_model* model, const float* images, size_t images_length, int count, float* logits,
                             size_t logits_capacity) DFP_NOEXCEPT {
  return guarded("dfp_model_predict", [&] {
    ModelState& s = built(model);
    const float* x = blocked_images(s, images, images_length, count);
    check_room(logits, logits_capacity, size_t(count) * s.model.classes(), "logits");
    s.model.predict(x, count, logits);
  });
}

dfp_status dfp_model_backward_logits(dfp_model* model, const float* logits_grad, size_t length,
                                     int* finite) DFP_NOEXCEPT {
  return guarded("dfp_model_backward_logits", [&] {
    ModelState& s = built(model);
    need(logits_grad, "logits_grad");
    const size_t want = size_t(s.model.batch()) * s.model.classes();
    DFP_CHECK(length == want, Status::invalid_argument,
              "logits_grad: expected " + std::to_string(s.model.batch()) + " x " + std::to_string(s.model.classes()) +
                  " = " + std::to_string(want) + " floats (batch x classes), got " + std::to_string(length));
    const bool ok = s.model.backward(logits_grad);
    if (finite) *finite = ok ? 1 : 0;
  });
}

dfp_status dfp_model_input_grad(const dfp_model* model, float* out, size_t capacity) DFP_NOEXCEPT {
  return guarded("dfp_model_input_grad", [&] {
    const ModelState& s = built(model);
    const TensorShape in = s.model.shape(0);
    check_room(out, capacity, size_t(s.model.batch()) * in.c * in.h * in.w, "out");
    s.model.input_grad(out);
  });
}

// ---- parameters and buffers ----

dfp_status dfp_model_tensor_count(const dfp_model* model, size_t* count) DFP_NOEXCEPT {
  return guarded("dfp_model_tensor_count", [&] {
    const ModelState& s = built(model);
    need(count, "count") = s.views.size();
  });
}

dfp_status dfp_model_tensor_at(const dfp_model* model, size_t index, dfp_tensor_view* view) DFP_NOEXCEPT {
  return guarded("dfp_model_tensor_at", [&] {
    const ModelState& s = built(model);
    DFP_CHECK(index < s.views.size(), Status::invalid_argument,
              "index: expected 0 .. " + std::to_string(s.views.size() - 1) + " (the tensors of model '" +
                  s.model.name() + "'), got " + std::to_string(index));
    write_view(s.views[index], &need(view, "view"));
  });
}

dfp_status dfp_model_tensor(const dfp_model* model, const char* name, dfp_tensor_view* view) DFP_NOEXCEPT {
  return guarded("dfp_model_tensor", [&] {
    ModelState& s = built(model);
    const std::string wanted = need_text(name, "name");
    need(view, "view");
    const auto it = std::find_if(s.views.begin(), s.views.end(), [&](const TensorView& v) { return v.name == wanted; });
    if (it == s.views.end()) {
      s.model.tensor(wanted);  // throws, listing the model's tensors
      fail(Status::internal, "tensor '" + wanted + "' is in the model but not in its views");
    }
    write_view(*it, view);
  });
}

dfp_status dfp_model_weights_updated(dfp_model* model) DFP_NOEXCEPT {
  return guarded("dfp_model_weights_updated", [&] { built(model).model.weights_updated(); });
}

// ---- state files ----

dfp_status dfp_model_save(dfp_model* model, const char* path) DFP_NOEXCEPT {
  return guarded("dfp_model_save", [&] {
    ModelState& s = built(model);
    save_state(s.model, need_text(path, "path"));
  });
}

dfp_status dfp_model_load(dfp_model* model, const char* path) DFP_NOEXCEPT {
  return guarded("dfp_model_load", [&] {
    ModelState& s = built(model);
    load_state(s.model, need_text(path, "path"));
  });
}

// ---- optimizer ----

dfp_status dfp_sgd_create(dfp_model* model, float momentum, float weight_decay, int nesterov,
                          dfp_sgd** out) DFP_NOEXCEPT {
  return guarded("dfp_sgd_create", [&] {
    built(model);
    need(out, "out");
    *out = new dfp_sgd(model->s, SgdOptions{momentum, weight_decay, nesterov != 0});
  });
}

dfp_status dfp_sgd_destroy(dfp_sgd* sgd) DFP_NOEXCEPT {
  delete sgd;
  return DFP_OK;
}

dfp_status dfp_sgd_step(dfp_sgd* sgd, float lr) DFP_NOEXCEPT {
  return guarded("dfp_sgd_step", [&] {
    dfp_sgd& o = need(sgd, "sgd");
    DFP_CHECK(std::isfinite(lr) && lr >= 0.f, Status::invalid_argument,
              "lr: expected a finite learning rate >= 0, got " + std::to_string(lr));
    o.sgd.step(lr);
  });
}

}  // extern "C"
