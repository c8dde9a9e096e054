// The model graph: construction with shape inference, one-time planning of every buffer, and the
// public API over them. The training step's passes are in model_step.cpp.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>

#include "dfp/context.hpp"
#include "dfp/model.hpp"
#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"
#include "src/graph/arena.hpp"
#include "src/graph/layer_registry.hpp"
#include "src/layers/layer_args.hpp"
#include "src/core/aligned_buffer.hpp"
#include "src/layers/layer.hpp"
#include "base/named_enum.hpp"
#include "src/graph/model_impl.hpp"

namespace dfp {

Model::Node Model::Impl::add(std::unique_ptr<model::Layer> layer, std::vector<int> inputs, std::string lname,
                             LayerKind kind, LayerParams params) {
  const std::string& text = layer_kind(kind).short_name;
  DFP_CHECK(!built, Status::invalid_argument, "model '" + name + "': layers cannot be added after build()");
  DFP_CHECK(!nodes.empty(), Status::invalid_argument, "model '" + name + "': call input() first");
  for (int i : inputs)
    DFP_CHECK(i >= 0 && i < int(nodes.size()), Status::invalid_argument,
              "model '" + name + "': " + text + " layer refers to unknown node " + std::to_string(i));
  if (lname.empty()) lname = text + std::to_string(nodes.size());
  for (const NodeInfo& n : nodes)
    DFP_CHECK(!n.layer || n.layer->name != lname, Status::invalid_argument,
              "model '" + name + "': duplicate layer name '" + lname + "'");
  layer->name = lname;
  layer->kind = text;
  std::vector<TensorShape> in;
  for (int i : inputs) {
    in.push_back(nodes[i].shape);
    ++nodes[i].consumers;
  }
  NodeInfo n;
  n.shape = layer->infer(in);
  n.spec.kind = kind;
  n.spec.name = lname;
  n.spec.inputs = inputs;
  n.spec.params = std::move(params);
  n.layer = std::move(layer);
  n.maxima = n.layer->as<model::MeasuresMaxima>();
  n.reduced = n.layer->as<model::ReducedPrecision>();
  n.inputs = std::move(inputs);
  nodes.push_back(std::move(n));
  return int(nodes.size()) - 1;
}

std::vector<TensorShape> Model::Impl::in_shapes(const NodeInfo& n) const {
  std::vector<TensorShape> v;
  for (int i : n.inputs) v.push_back(nodes[i].shape);
  return v;
}

void Model::Impl::build(int b, const PrecisionPolicy& policy) {
  DFP_CHECK(!built, Status::invalid_argument, "model '" + name + "': build() called twice");
  DFP_CHECK(b >= 1, Status::invalid_argument, "model '" + name + "': batch expected >= 1, got " + std::to_string(b));
  DFP_CHECK(loss_node >= 0, Status::invalid_argument, "model '" + name + "': no loss; call softmax_cross_entropy()");
  policy.validate("model '" + name + "'");
  // An override that names no layer is a typo or a pattern for another model: refused, with
  // the names it could have matched, rather than silently leaving the layer in the default.
  for (const auto& [pattern, p] : policy.overrides) {
    bool hit = false;
    std::string names;
    for (const NodeInfo& n : nodes)
      if (n.layer) {
        hit = hit || PrecisionPolicy::matches(pattern, n.layer->name);
        if (names.size() < 240) names.append(names.empty() ? "" : ", ").append(n.layer->name);
      }
    DFP_CHECK(hit, Status::invalid_argument,
              "model '" + name + "': precision override '" + pattern + "=" + precision_name(p) +
                  "' matches no layer; layer names are " + names + (names.size() >= 240 ? ", ..." : ""));
  }
  batch = b;
  this->policy = policy;
  size_t max_inputs = 1;
  for (const NodeInfo& n : nodes) max_inputs = std::max(max_inputs, n.inputs.size());
  xs.reserve(max_inputs);
  dxs.reserve(max_inputs);
  std::mt19937_64 rng(ctx.seed() * 0x9e3779b97f4a7c15ULL + 12345);
  for (NodeInfo& n : nodes) n.shape.n = b;
  if (fusion)  // a ReLU that alone reads a layer's output can be applied by that layer
    for (NodeInfo& n : nodes)
      if (n.layer && n.spec.kind == LayerKind::relu) {
        NodeInfo& producer = nodes[n.inputs[0]];
        auto* absorbs = producer.layer ? producer.layer->as<model::AbsorbsRelu>() : nullptr;
        if (producer.consumers == 1 && absorbs && absorbs->absorb_relu()) {
          n.layer->as<model::PassesThrough>()->pass_through();
          n.spec.fused = true;
        }
      }
  for (size_t i = 0; i < nodes.size(); ++i) {
    NodeInfo& n = nodes[i];
    n.elements = n.shape.blocked_elements();
    if (n.layer) {
      n.layer->needs_input_grad.clear();
      for (int j : n.inputs) n.layer->needs_input_grad.push_back(j != 0 || input_grad);
      // Out of memory says which layer at which batch, whichever allocator ran out.
      const auto out_of_memory = [&](const std::string& detail) {
        fail(Status::out_of_memory, "model '" + name + "': out of memory building " + n.spec.kind_name() + " layer '" +
                                        n.layer->name + "' (output " + std::to_string(b) + "x" +
                                        std::to_string(n.shape.c) + "x" + std::to_string(n.shape.h) + "x" +
                                        std::to_string(n.shape.w) + ", batch " + std::to_string(b) + "): " + detail +
                                        "; a smaller batch needs less");
      };
      try {
        n.layer->build(ctx, in_shapes(n), n.shape, policy.for_layer(n.layer->name), rng);
      } catch (const std::bad_alloc&) {
        out_of_memory("its weights, operators and buffers do not fit");
      } catch (const Error& e) {
        if (e.status() != Status::out_of_memory) throw;
        out_of_memory(e.what());
      }
      n.param_begin = params.size();
      n.layer->parameters(params);
      n.param_end = params.size();
    }
  }
  if (fusion)  // a layer reading only what a BatchNorm (and its fused ReLU) writes takes it as spans
    for (size_t c = 0; c < nodes.size(); ++c) {
      NodeInfo& n = nodes[c];
      for (size_t k = 0; n.layer && k < n.inputs.size(); ++k) {
        int src = n.inputs[k];
        const auto* takes = n.layer->as<model::TakesInputSpans>();
        if (!takes || !takes->accepts_input_spans(k) || std::count(n.inputs.begin(), n.inputs.end(), src) != 1) continue;
        if (nodes[src].spec.fused) {  // the ReLU node: its producer computes the values
          if (nodes[src].consumers != 1) continue;
          src = nodes[src].inputs[0];
        }
        NodeInfo& producer = nodes[src];
        if (!producer.layer || producer.consumers != 1) continue;
        auto* feeds = producer.layer->as<model::FeedsSpans>();
        if (feeds && feeds->feed_spans_to(n.layer.get(), k)) {
          n.spec.input_spans = true;
          producer.feeds_spans_to = int(c);
        }
      }
    }
  if (fusion)  // a BatchNorm right after the conv whose output only it reads hands the conv its dy as spans
    for (size_t c = 2; c < nodes.size(); ++c) {
      NodeInfo& n = nodes[c];
      if (!n.layer || n.inputs.size() != 1 || n.inputs[0] != int(c) - 1) continue;
      NodeInfo& producer = nodes[c - 1];
      auto* feeds = n.layer->as<model::FeedsGradSpans>();
      if (producer.layer && producer.consumers == 1 && feeds && feeds->feed_grad_spans_to(producer.layer.get()))
        producer.spec.grad_spans = true;
    }
  for (size_t c = 1; c < nodes.size(); ++c)  // add(x, x): both parts of x's gradient need x's one spare buffer
    for (size_t k = 1; k < nodes[c].inputs.size(); ++k) {
      const int i = nodes[c].inputs[k];
      if (i == 0 || std::find(nodes[c].inputs.begin(), nodes[c].inputs.begin() + k, i) == nodes[c].inputs.begin() + k)
        continue;
      DFP_CHECK(std::count(nodes[c].inputs.begin(), nodes[c].inputs.end(), i) == 2, Status::unsupported,
                "model '" + name + "': layer '" + nodes[c].spec.name + "' reads '" + nodes[i].spec.name +
                    "' more than twice");
      for (size_t r = c + 1; r < nodes.size(); ++r)
        DFP_CHECK(std::find(nodes[r].inputs.begin(), nodes[r].inputs.end(), i) == nodes[r].inputs.end(),
                  Status::unsupported,
                  "model '" + name + "': layer '" + nodes[c].spec.name + "' reads '" + nodes[i].spec.name +
                      "' twice, and the later layer '" + nodes[r].spec.name +
                      "' reads it too; a layer that reads a tensor twice must be its last reader");
    }
  const TensorShape& ls = nodes[loss_node].shape;
  labels.assign(b, 0);
  probs = AlignedBuffer<float>(size_t(b) * ls.c);
  plan_memory();
  built = true;
  weights_updated(nullptr);
}

// Whether `consumer` adds its part of input k's gradient to the gradient itself (the planner
// then leaves the part's buffer out, and backward hands the layer the gradient): a layer that
// accumulates, reading that input once, in a slot StepInfo::accumulate_dx can flag.
bool Model::Impl::adds_own_part(const NodeInfo& consumer, size_t k) {
  return k < 32 && consumer.layer->accumulates_input_grad(k) &&
         std::count(consumer.inputs.begin(), consumer.inputs.end(), consumer.inputs[k]) == 1;
}

void Model::Impl::plan_memory() {
  const int N = int(nodes.size());
  std::vector<std::vector<std::pair<int, size_t>>> readers(nodes.size());  // (consumer, input slot)
  for (int j = 1; j < N; ++j)
    for (size_t k = 0; k < nodes[j].inputs.size(); ++k) readers[nodes[j].inputs[k]].push_back({j, k});
  std::vector<Lifetime> lt;
  std::vector<int> act_of(N, -1), grad_of(N, -1);  // index in lt
  std::vector<int> last_consumer(N, -1);          // the first to write the node's gradient
  auto bytes_of = [](size_t elements) { return (elements * sizeof(float) + 63) / 64 * 64; };
  size_t naive = 0;
  for (int i = 0; i < N; ++i) {
    NodeInfo& n = nodes[i];
    int end = i;
    for (auto [j, k] : readers[i]) {
      end = std::max(end, j);
      if (nodes[j].layer->backward_reads_input(k)) end = std::max(end, 2 * N - j);
      end = std::max(end, nodes[j].feeds_spans_to);  // the spans are computed from it then
    }
    if (i == loss_node) end = std::max(end, N);
    if (n.layer && n.layer->backward_reads_output()) end = std::max(end, 2 * N - i);
    act_of[i] = int(lt.size());
    lt.push_back({bytes_of(n.elements), i, end, &n.act});
    naive += bytes_of(n.elements);
    if (i == 0 && !input_grad) continue;
    std::vector<int> cons;
    for (auto [j, k] : readers[i]) cons.push_back(j);
    std::sort(cons.rbegin(), cons.rend());  // backward order: the last consumer runs first
    if (!cons.empty()) last_consumer[i] = cons[0];
    if (cons.empty() && i != loss_node) continue;  // nothing ever writes its gradient
    // The input's gradient (set_input_grad) lives to the end of the step (its "backward" at 2N),
    // so it still holds the values when the caller reads it after backward().
    const int first_write = i == loss_node ? N : 2 * N - cons[0];
    grad_of[i] = int(lt.size());
    lt.push_back({bytes_of(n.elements), first_write, 2 * N - i, &n.grad});
    naive += bytes_of(n.elements);
    // Consumers after the first write their part into acc, to be summed, unless each of them
    // adds it to the gradient itself: always at one scale, so without adaptive loss scaling.
    // (A consumer reading the node twice, add(x, x), writes a second part of its own.)
    bool summed_in_place = !adaptive;
    for (auto [j, k] : readers[i])
      summed_in_place = summed_in_place && std::count(cons.begin(), cons.end(), j) == 1 &&
                        (j == cons[0] || adds_own_part(nodes[j], k));
    n.acc = nullptr;
    if (n.consumers > 1 && !summed_in_place) {
      lt.push_back({bytes_of(n.elements), 2 * N - cons[1], 2 * N - cons.back(), &n.acc});
      naive += bytes_of(n.elements);
    }
  }
  // In place: an element-wise layer may write its output over an input that nothing else reads
  // (BN -> ReLU in INT16, where BN keeps its own DFP16 copy), and its input gradient over its
  // output gradient when it is the first to write that input's gradient. Such pairs become one
  // buffer living over the union of their lifetimes; it also saves the copy in Add's backward.
  std::vector<int> group(lt.size());
  for (size_t g = 0; g < group.size(); ++g) group[g] = int(g);
  std::function<int(int)> root = [&](int a) { return group[a] == a ? a : group[a] = root(group[a]); };
  auto unite = [&](int a, int b) { group[root(a)] = root(b); };
  // A residual Add passes dy unchanged to every input, so all of them can read the Add's own
  // gradient buffer and its backward copies nothing (what the copy costs: docs/design/memory.md).
  // That holds while nothing writes the shared buffer before the last sharer
  // has read it. Backward visits the inputs from the highest node index down, so:
  //   - every input but the lowest: no other consumer (whose part would be summed into the
  //     buffer), and its layer must not write its input gradient over the buffer (keep_grad);
  //   - the lowest: its other consumers sum their parts into the buffer after they run, which
  //     must be after the other inputs have read it (so they precede those inputs in the graph,
  //     or are the next-lowest input's own layer, which reads the buffer before it is summed).
  // An Add that is itself such an input (not the lowest) keeps its copy: its inputs would read
  // the buffer too, so Adds are visited from the last one back.
  // Adaptive loss scaling rescales a node's gradient in place before its backward, so it gets
  // the copying plan (set_loss_scaling plans again when the mode changes).
  std::vector<char> keep_grad(N, 0), shares(N, 0);
  for (int n = N - 1; n >= 1 && !adaptive; --n) {
    if (!nodes[n].layer->backward_passes_gradient() || grad_of[n] < 0 || keep_grad[n]) continue;
    std::vector<int> ins = nodes[n].inputs;
    std::sort(ins.rbegin(), ins.rend());
    bool ok = ins.size() >= 2 && std::adjacent_find(ins.begin(), ins.end()) == ins.end();  // add(x, x): two parts
    for (size_t k = 0; ok && k < ins.size(); ++k) {
      const int i = ins[k];
      ok = i != 0 && grad_of[i] >= 0 && last_consumer[i] == n && nodes[i].elements == nodes[n].elements;
      if (k + 1 < ins.size()) {
        ok = ok && nodes[i].consumers == 1;
      } else {
        for (auto [c, slot] : readers[i]) ok = ok && (c == n || c <= ins[k - 1]);
      }
    }
    if (!ok) continue;
    shares[n] = 1;
    for (size_t k = 0; k < ins.size(); ++k) {
      unite(grad_of[ins[k]], grad_of[n]);
      if (k + 1 < ins.size()) keep_grad[ins[k]] = 1;
    }
  }
  for (int n = 1; n < N; ++n) {
    const model::Layer& layer = *nodes[n].layer;
    bool fwd = false, bwd = keep_grad[n] || shares[n];
    for (size_t k = 0; k < nodes[n].inputs.size(); ++k) {
      const int i = nodes[n].inputs[k];
      if (i == 0 || nodes[i].elements != nodes[n].elements) continue;
      if (!fwd && layer.forward_in_place(k) && readers[i].size() == 1 && !layer.backward_reads_input(k) &&
          !nodes[i].layer->backward_reads_output() && i != loss_node) {
        unite(act_of[i], act_of[n]);
        fwd = true;
      }
      const auto reads = std::count(nodes[n].inputs.begin(), nodes[n].inputs.end(), i);  // add(x, x): 2
      if (!bwd && layer.backward_in_place(k) && grad_of[i] >= 0 && grad_of[n] >= 0 && last_consumer[i] == n &&
          reads == 1) {
        unite(grad_of[i], grad_of[n]);
        bwd = true;
      }
    }
  }
  std::vector<Lifetime> merged;  // one per group
  std::vector<int> merged_of(lt.size(), -1);
  for (size_t g = 0; g < lt.size(); ++g) {
    const int r = root(int(g));
    if (merged_of[r] < 0) {
      merged_of[r] = int(merged.size());
      merged.push_back({0, lt[g].begin, lt[g].end, nullptr});
    }
    Lifetime& m = merged[merged_of[r]];
    m.bytes = std::max(m.bytes, lt[g].bytes);
    m.begin = std::min(m.begin, lt[g].begin);
    m.end = std::max(m.end, lt[g].end);
  }
  const size_t total = graph::place(merged);
  size_t ws = 0;
  for (NodeInfo& n : nodes)
    if (n.layer) ws = std::max(ws, n.layer->workspace_bytes());
  try {
    arena = AlignedBuffer<float>(total / sizeof(float));
    workspace = AlignedBuffer<std::byte>((ws + 63) / 64 * 64);
  } catch (const std::bad_alloc&) {
    fail(Status::out_of_memory, "model '" + name + "': out of memory allocating the activations and gradients (" +
                                    std::to_string(total >> 20) + " MiB planned for batch " + std::to_string(batch) +
                                    ") and the layers' workspace (" + std::to_string(ws >> 20) +
                                    " MiB); a smaller batch needs less");
  }
  for (size_t g = 0; g < lt.size(); ++g)
    *lt[g].view = arena.data() + merged[merged_of[root(int(g))]].offset / sizeof(float);
  for (NodeInfo& n : nodes)
    if (n.layer && n.layer->workspace_bytes()) n.layer->use_workspace(workspace.data());
  plan.arena_bytes = total;
  plan.unshared_bytes = naive;
  plan.workspace_bytes = workspace.size();
}

// Testing aid (set_debug_poison): a buffer about to be written for the first time in its
// lifetime, and the workspace before every layer call, are filled with NaN, as fresh memory
// could hold anything. A layer reading what it did not write, or what the plan let another
// buffer reuse, then produces NaN.
void Model::Impl::poison_fresh(float* p, size_t elements) const {
  if (poison) std::fill(p, p + elements, std::numeric_limits<float>::quiet_NaN());
}

void Model::Impl::poison_workspace() {
  if (poison) std::fill(workspace.data(), workspace.data() + workspace.size(), std::byte{0xFF});
}

// max_abs: per parameter, or null (all measured by the layers); each layer gets its own.
void Model::Impl::weights_updated(const float* max_abs) {
  for (NodeInfo& n : nodes)
    if (n.layer)
      n.layer->weights_updated(step, max_abs ? std::span<const float>(max_abs + n.param_begin, n.param_end - n.param_begin)
                                             : std::span<const float>());
}

Model::Model(const Context& ctx, std::string name) : impl_(std::make_unique<Impl>(ctx, std::move(name))) {}
const Context& Model::context() const noexcept { return impl_->ctx; }
Model::~Model() = default;

Model::Node Model::input(int c, int h, int w) {
  DFP_CHECK(impl_->nodes.empty(), Status::invalid_argument, "model '" + impl_->name + "': input() called twice");
  DFP_CHECK(c >= 1 && h >= 1 && w >= 1, Status::invalid_argument,
            "model '" + impl_->name + "': input shape must be positive, got " + std::to_string(c) + "x" +
                std::to_string(h) + "x" + std::to_string(w));
  Impl::NodeInfo n;
  n.shape = {0, c, h, w};
  n.spec.kind = LayerKind::input;
  n.spec.name = "input";
  impl_->nodes.push_back(std::move(n));
  return 0;
}
Model::Node Model::layer(LayerKind kind, std::vector<Node> inputs, LayerParams params, std::string n) {
  DFP_CHECK(kind != LayerKind::input, Status::invalid_argument,
            "model '" + impl_->name + "': the input is made by input(), not as a layer");
  const graph::LayerRow& row = graph::layer_row(kind);
  if (std::holds_alternative<std::monostate>(params)) params = row.blank;
  const model::LayerArgs args(impl_->name, row.info.short_name.c_str(), n);
  args.need(params.index() == row.blank.index(), "parameters", "the kind's own type", "another kind's");
  if (row.info.inputs < 0)
    args.need(!inputs.empty(), "inputs", "at least one node", "none");
  else
    args.need(int(inputs.size()) == row.info.inputs, "inputs", std::to_string(row.info.inputs) + " node(s)",
              std::to_string(inputs.size()));
  std::unique_ptr<model::Layer> layer = row.build(params, args);
  return impl_->add(std::move(layer), std::move(inputs), std::move(n), kind, std::move(params));
}
Model::Node Model::layer(const std::string& kind, std::vector<Node> inputs,
                         const std::vector<std::pair<std::string, double>>& params, std::string n) {
  const LayerKindInfo& k = layer_kind(kind);
  const std::string where = "model '" + impl_->name + "'" + (n.empty() ? "" : ": layer '" + n + "'");
  return layer(k.kind, std::move(inputs), layer_params(k.kind, params, where), std::move(n));
}
Model::Node Model::conv(Node x, int k, int r, int s, int p, bool b, std::string n, int groups) {
  return layer(LayerKind::conv, {x}, ConvParams{k, r, s, p, b, groups}, std::move(n));
}
Model::Node Model::batchnorm(Node x, std::string n, double eps) {
  return layer(LayerKind::batchnorm, {x}, BatchNormParams{eps}, std::move(n));
}
Model::Node Model::relu(Node x, std::string n) { return layer(LayerKind::relu, {x}, {}, std::move(n)); }
Model::Node Model::maxpool(Node x, int k, int s, int p, bool c, std::string n) {
  return layer(LayerKind::maxpool, {x}, PoolParams{k, s, p, c}, std::move(n));
}
Model::Node Model::avgpool(Node x, int k, int s, int p, std::string n) {
  return layer(LayerKind::avgpool, {x}, PoolParams{k, s, p, false}, std::move(n));
}
Model::Node Model::global_avgpool(Node x, std::string n) { return layer(LayerKind::global_avgpool, {x}, {}, std::move(n)); }
Model::Node Model::flatten(Node x, std::string n) { return layer(LayerKind::flatten, {x}, {}, std::move(n)); }
Model::Node Model::linear(Node x, int k, bool b, std::string n) {
  return layer(LayerKind::linear, {x}, LinearParams{k, b}, std::move(n));
}
Model::Node Model::add(Node a, Node b, std::string n) { return layer(LayerKind::add, {a, b}, {}, std::move(n)); }
Model::Node Model::concat(const std::vector<Node>& xs, std::string n) { return layer(LayerKind::concat, xs, {}, std::move(n)); }
Model::Node Model::dropout(Node x, float p, std::string n) {
  return layer(LayerKind::dropout, {x}, DropoutParams{p}, std::move(n));
}
Model::Node Model::lrn(Node x, int size, float a, float b, float k, std::string n) {
  return layer(LayerKind::lrn, {x}, LrnParams{size, a, b, k}, std::move(n));
}
Model::Node Model::shortcut_pad(Node x, int c, int s, std::string n) {
  return layer(LayerKind::shortcut_pad, {x}, ShortcutPadParams{c, s}, std::move(n));
}
void Model::softmax_cross_entropy(Node x, float smoothing) {
  DFP_CHECK(x > 0 && x < int(impl_->nodes.size()), Status::invalid_argument,
            "model '" + impl_->name + "': softmax_cross_entropy: node " + std::to_string(x) +
                " is not a layer of this model (expected a node returned by a layer call)");
  // Declaring the loss again on its node only sets the smoothing; another node would silently
  // replace the loss the model was trained with.
  DFP_CHECK(impl_->loss_node < 0 || impl_->loss_node == x, Status::invalid_argument,
            "model '" + impl_->name + "': softmax_cross_entropy on node " + std::to_string(x) +
                ", but the loss already reads node " + std::to_string(impl_->loss_node) + "; a model has one loss");
  const TensorShape& s = impl_->nodes[x].shape;
  DFP_CHECK(s.h == 1 && s.w == 1, Status::invalid_argument,
            "model '" + impl_->name + "': the loss needs N x classes x 1 x 1 logits");
  impl_->loss_node = x;
  set_label_smoothing(smoothing);
}
void Model::set_label_smoothing(float smoothing) {
  DFP_CHECK(smoothing >= 0.f && smoothing < 1.f, Status::invalid_argument,
            "model '" + impl_->name + "': label smoothing expected in [0, 1), got " + std::to_string(smoothing));
  impl_->label_smoothing = smoothing;
}

TensorShape Model::shape(Node n) const { return impl_->nodes.at(n).shape; }
const std::string& Model::name() const noexcept { return impl_->name; }
void Model::build(int batch, const PrecisionPolicy& p) { impl_->build(batch, p); }
bool Model::built() const noexcept { return impl_->built; }
int Model::batch() const noexcept { return impl_->batch; }
const PrecisionPolicy& Model::policy() const noexcept { return impl_->policy; }
StepResult Model::forward(const float* x, const int32_t* y, int count, bool train) {
  return impl_->forward(x, y, count, train);
}
bool Model::backward() { return impl_->backward(nullptr); }

int Model::classes() const {
  DFP_CHECK(impl_->loss_node >= 0, Status::invalid_argument,
            "model '" + impl_->name + "': classes() before softmax_cross_entropy() named the logits");
  return impl_->nodes[impl_->loss_node].shape.c;
}
void Model::logits(const float* images, int count, bool train, float* out) {
  impl_->run_layers(images, count, train);
  impl_->copy_logits(out);
}
void Model::predict(const float* images, int count, float* out) { logits(images, count, false, out); }
bool Model::backward(const float* logits_grad) {
  DFP_CHECK(logits_grad, Status::invalid_argument, "model '" + impl_->name + "': backward(logits_grad): null gradient");
  return impl_->backward(logits_grad);
}
void Model::set_input_grad(bool on) {
  DFP_CHECK(!impl_->built, Status::invalid_argument, "model '" + impl_->name + "': set_input_grad() after build()");
  impl_->input_grad = on;
}
void Model::input_grad(float* out) const {
  const Impl& m = *impl_;
  DFP_CHECK(m.input_grad, Status::invalid_argument,
            "model '" + m.name + "': input_grad() needs set_input_grad(true) before build()");
  DFP_CHECK(m.have_input_grad, Status::invalid_argument,
            "model '" + m.name + "': input_grad() needs a backward pass first (and no forward since)");
  const TensorShape& s = m.nodes[0].shape;
  from_blocked(m.ctx, m.nodes[0].grad, out, s.n, s.c, s.h, s.w);
  const double scale = m.nodes[0].grad_scale;  // the loss scale the gradient carries
  if (scale != 1)
    for (size_t i = 0, e = size_t(s.n) * s.c * s.h * s.w; i < e; ++i) out[i] = static_cast<float>(out[i] / scale);
}
void Model::set_loss_scale(double scale) {
  DFP_CHECK(std::isfinite(scale) && scale > 0, Status::invalid_argument,
            "model '" + impl_->name + "': loss scale expected positive and finite, got " + std::to_string(scale));
  impl_->loss_scale = scale;
}
void Model::set_loss_scaling(const LossScaleOptions& o) {
  const bool adaptive = o.mode == LossScaleMode::adaptive;
  if (impl_->built && adaptive != impl_->adaptive) {
    // The gradient plan depends on it (see plan_memory); planning again between steps
    // allocates, as build() does, and leaves nothing of a pending forward to backpropagate.
    impl_->adaptive = adaptive;
    impl_->plan_memory();
    impl_->have_training_forward = impl_->have_labels = impl_->have_input_grad = false;
  }
  impl_->adaptive = adaptive;
  impl_->adaptive_opts.max_factor = o.adaptive_max_factor;
  impl_->adaptive_opts.max_scale = o.adaptive_max_scale;
}
void Model::set_numerics_interval(int interval) { impl_->numerics_interval = std::max(0, interval); }
void Model::set_debug_poison(bool on) { impl_->poison = on; }
void Model::set_gradient_hook(std::function<void(size_t first, size_t last)> hook) {
  impl_->gradient_hook = std::move(hook);
}
void Model::set_statistics_sum(std::function<void(double* values, size_t count)> sum) {
  impl_->statistics_sum = std::move(sum);
}
void Model::set_batch_offset(int first_image) {
  DFP_CHECK(first_image >= 0, Status::invalid_argument,
            "model '" + impl_->name + "': set_batch_offset(" + std::to_string(first_image) + "): expected >= 0");
  impl_->batch_offset = first_image;
}
void Model::set_fusion(bool on) {
  DFP_CHECK(!impl_->built, Status::invalid_argument, "model '" + impl_->name + "': set_fusion() after build()");
  impl_->fusion = on;
}
MemoryPlan Model::memory_plan() const {
  DFP_CHECK(impl_->built, Status::invalid_argument, "model '" + impl_->name + "': memory_plan() before build()");
  return impl_->plan;
}
void Model::weights_updated() { impl_->weights_updated(nullptr); }
void Model::weights_updated(std::span<const float> max_abs) {
  DFP_CHECK(max_abs.size() == impl_->params.size(), Status::invalid_argument,
            "model '" + impl_->name + "': weights_updated() got " + std::to_string(max_abs.size()) +
                " maxima, expected one per parameter (" + std::to_string(impl_->params.size()) + ")");
  impl_->weights_updated(max_abs.data());
}
uint64_t Model::step() const noexcept { return impl_->step; }
void Model::set_step(uint64_t step) { impl_->step = step; }
std::vector<Parameter>& Model::parameters() { return impl_->params; }

size_t Model::parameter_count() const {
  size_t total = 0;
  for (const auto& n : impl_->nodes)
    if (n.layer) total += n.layer->count_parameters(impl_->in_shapes(n));
  return total;
}

std::vector<std::pair<std::string, std::vector<float>*>> Model::buffers() {
  std::vector<std::pair<std::string, std::vector<float>*>> out;
  for (auto& n : impl_->nodes)
    if (n.layer) n.layer->buffers(out);
  return out;
}

std::vector<TensorView> Model::state() {
  DFP_CHECK(impl_->built, Status::invalid_argument, "model '" + impl_->name + "': state() before build()");
  std::vector<TensorView> out;
  for (const auto& n : impl_->nodes)
    for (size_t p = n.param_begin; p < n.param_end; ++p) {
      const Parameter& q = impl_->params[p];
      TensorView v{q.name, {int(q.size)}, q.value, q.size, true, q.grad};
      const TensorShape in = n.inputs.empty() ? TensorShape{} : impl_->nodes[n.inputs[0]].shape;
      if (std::vector<int> dims = graph::torch_shape(n.spec, in, q); !dims.empty()) {
        v.size = 1;
        for (int d : dims) v.size *= size_t(d);
        v.shape = std::move(dims);  // the values are laid out so already (see TensorView)
      }
      out.push_back(std::move(v));
    }
  for (auto& [name, b] : buffers()) out.push_back({name, {int(b->size())}, b->data(), b->size(), false, nullptr});
  return out;
}

TensorView Model::tensor(const std::string& name) {
  std::vector<TensorView> all = state();
  for (TensorView& v : all)
    if (v.name == name) return std::move(v);
  std::string names;
  for (const TensorView& v : all)
    if (names.size() < 240) names.append(names.empty() ? "" : ", ").append(v.name);
  fail(Status::invalid_argument, "model '" + impl_->name + "': no tensor named '" + name + "'; tensors are " + names +
                                     (names.size() >= 240 ? ", ..." : ""));
}

std::vector<LayerNumerics> Model::numerics() const {
  std::vector<LayerNumerics> out;
  for (const auto& n : impl_->nodes)
    if (LayerNumerics ln; n.reduced && n.reduced->numerics(ln)) out.push_back(ln);
  return out;
}

std::map<std::string, std::vector<float>> Model::scaling_histories() const {
  std::map<std::string, std::vector<float>> out;
  for (const auto& n : impl_->nodes)
    if (n.reduced) n.reduced->scaling_histories(n.layer->name + ".", out);
  return out;
}

void Model::set_scaling_histories(const std::map<std::string, std::vector<float>>& histories, const std::string& origin) {
  for (const auto& [key, values] : histories) {
    const std::string what = origin + ": FP8 amax history '" + key + "'";
    bool taken = false;  // by the layer whose name and a dot start it (a shorter name's layer refuses it)
    for (auto& n : impl_->nodes)
      taken = taken || (n.reduced && key.rfind(n.layer->name + ".", 0) == 0 &&
                        n.reduced->set_scaling_history(key.substr(n.layer->name.size() + 1), values, what));
    DFP_CHECK(taken, Status::corrupt_data, what + " belongs to no layer with delayed FP8 scaling of that class");
  }
}

void Model::set_profiling(bool on) { impl_->profiling = on; }

void Model::reset_layer_times() {
  for (auto& n : impl_->nodes) {
    n.fwd_seconds = n.bwd_seconds = 0, n.fwd_steps = 0;
    if (auto* parts = n.layer ? n.layer->as<model::ProfiledParts>() : nullptr) parts->reset_parts();
  }
  impl_->loss_fwd_seconds = impl_->loss_bwd_seconds = 0;
}

std::vector<LayerTime> Model::layer_times() const {
  std::vector<LayerTime> out;
  uint64_t steps = 0;
  for (const auto& n : impl_->nodes) {
    if (!n.layer || n.fwd_steps == 0) continue;  // the input; nothing timed yet
    const auto* parts = n.layer->as<model::ProfiledParts>();
    out.push_back({n.layer->name, n.layer->kind, n.layer->precision(), parts ? parts->implementation() : "",
                   n.fwd_seconds, n.bwd_seconds, n.fwd_steps});
    if (const LayerTime::Int16Parts* int16 = parts ? parts->int16_parts() : nullptr) out.back().int16 = *int16;
    steps = std::max(steps, n.fwd_steps);
  }
  if (steps > 0) out.push_back({"loss", "loss", "fp32", "", impl_->loss_fwd_seconds, impl_->loss_bwd_seconds, steps});
  return out;
}

std::vector<LayerSpec> Model::graph() const {
  std::vector<LayerSpec> out;
  for (const auto& n : impl_->nodes) {
    out.push_back(n.spec);
    out.back().shape = n.shape;
    if (const auto* random = n.layer ? n.layer->as<model::RandomStream>() : nullptr) out.back().seed = random->random_seed();
  }
  return out;
}
int Model::loss_node() const noexcept { return impl_->loss_node; }
float Model::label_smoothing() const noexcept { return impl_->label_smoothing; }

std::string Model::summary() const {
  std::ostringstream o;
  for (size_t i = 0; i < impl_->nodes.size(); ++i) {
    const auto& n = impl_->nodes[i];
    const TensorShape& s = n.shape;
    char line[200];
    std::snprintf(line, sizeof line, "%-24s %-9s %5d x %3d x %3d  %s\n", n.layer ? n.layer->name.c_str() : "input",
                  n.layer ? n.layer->kind.c_str() : "input", s.c, s.h, s.w, n.layer ? n.layer->precision() : "");
    o << line;
  }
  return o.str();
}

}  // namespace dfp
