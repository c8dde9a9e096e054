// The model graph: construction with shape inference, one-time planning of every buffer, and the
// forward / loss / backward passes of a training step.
//
// Gradients at nodes read by several layers (residual branch points, Inception inputs) are sums:
// backward runs in reverse construction order; the first consumer writes a node's gradient, later
// ones write into that node's own accumulation buffer, which is then added in. Nodes with one
// consumer need no extra buffer or pass.
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

namespace dfp {

struct Model::Impl {
  struct NodeInfo {
    std::unique_ptr<model::Layer> layer;  // null for the input
    std::vector<int> inputs;
    TensorShape shape;
    LayerSpec spec;
    int consumers = 0;
    // Planned views of the arena (see plan_memory): the FP32 output, its gradient, and the
    // second-consumer gradient of fan-out nodes. `elements` is the size of each.
    float* act = nullptr;
    float* grad = nullptr;
    float* acc = nullptr;
    size_t elements = 0;
    bool grad_written = false;
    size_t param_begin = 0, param_end = 0;  // this layer's entries in params
    double grad_scale = 1;   // loss scale carried by this node's gradient
    double adapt_scale = 1;  // the adaptive part of it (product of per-layer factors)
    // max|act| and max|grad| when the layer that wrote them measured it (negative: unknown),
    // handed to the next layer through StepInfo (fusion only).
    float act_max = -1.f, grad_max = -1.f;
    const float* act_planes = nullptr;  // the same per plane (MeasuresMaxima::output_plane_max), or null
    const float* grad_planes = nullptr;
    // Fusion: the node whose input this layer feeds as spans, computed from this layer's own
    // input (see FeedsSpans, layer.hpp), or -1.
    int feeds_spans_to = -1;
    // The layer's optional interfaces that a step asks for (model::Layer::as), found when it is added.
    model::MeasuresMaxima* maxima = nullptr;
    model::ReducedPrecision* reduced = nullptr;
    double fwd_seconds = 0, bwd_seconds = 0;  // profiling (set_profiling)
    uint64_t fwd_steps = 0;
  };
  bool profiling = false;
  double loss_fwd_seconds = 0, loss_bwd_seconds = 0;
  using ProfileClock = std::chrono::steady_clock;
  static double seconds_between(ProfileClock::time_point a, ProfileClock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  }
  const Context& ctx;
  std::string name;
  std::vector<NodeInfo> nodes;
  std::vector<int> counts;  // per kind, for default names
  int loss_node = -1;
  float label_smoothing = 0.f;
  bool built = false;
  int batch = 0;
  PrecisionPolicy policy;  // as build() got it
  std::vector<Parameter> params;
  std::vector<int32_t> labels;
  AlignedBuffer<float> probs;  // softmax of the logits, [batch][classes]
  int last_count = 0;
  uint64_t step = 0;
  std::vector<const float*> xs;  // per-layer input pointers, reused every step (no allocation)
  std::vector<float*> dxs;
  double loss_scale = 1;
  bool adaptive = false;
  model::AdaptiveScaling adaptive_opts;
  int numerics_interval = 0;
  AlignedBuffer<float> arena;            // every node's act/grad/acc, placed by lifetime
  AlignedBuffer<std::byte> workspace;    // shared transient scratch of the layers
  MemoryPlan plan;
  bool poison = false;
  bool fusion = true;
  bool have_training_forward = false;    // what backward() needs was saved by a training forward
  bool have_labels = false;              // ... by a labelled one (the built-in loss can backpropagate)
  bool input_grad = false;               // set_input_grad: the input node's gradient is planned and computed
  bool have_input_grad = false;          // the last backward computed it, and no forward ran since
  std::function<void(size_t, size_t)> gradient_hook;  // set_gradient_hook
  std::function<void(double*, size_t)> statistics_sum;  // set_statistics_sum
  int batch_offset = 0;                                 // set_batch_offset

  bool sample_step() const { return numerics_interval > 0 && step % uint64_t(numerics_interval) == 0; }

  Impl(const Context& c, std::string n) : ctx(c), name(std::move(n)) {}

  Node add(std::unique_ptr<model::Layer> layer, std::vector<int> inputs, std::string lname, LayerKind kind,
           LayerParams params) {
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

  std::vector<TensorShape> in_shapes(const NodeInfo& n) const {
    std::vector<TensorShape> v;
    for (int i : n.inputs) v.push_back(nodes[i].shape);
    return v;
  }

  void build(int b, const PrecisionPolicy& policy) {
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

  // ---- memory plan ----------------------------------------------------------------------------
  // One step on a time line: node i's forward at time i, the loss at N (= node count), node i's
  // backward at 2N - i. Each buffer lives over a closed interval of it:
  //   act i:  from its forward to the last forward that reads it, or to the backward of a layer
  //           that reads it there (backward_reads_input/output), or to the loss for the logits;
  //   grad i: from the backward of its last consumer (the first to write it) to its own backward;
  //   acc i:  from the backward of its second-to-last consumer to that of its first.
  // Buffers whose intervals intersect get disjoint bytes of one arena (graph::place); the rest
  // share.
  // A training step then allocates nothing, and in INT16, where the layers keep their own 16-bit
  // copies, almost no FP32 activation outlives the forward pass.
  using Lifetime = graph::Lifetime;

  // Whether `consumer` adds its part of input k's gradient to the gradient itself (the planner
  // then leaves the part's buffer out, and backward hands the layer the gradient): a layer that
  // accumulates, reading that input once, in a slot StepInfo::accumulate_dx can flag.
  static bool adds_own_part(const NodeInfo& consumer, size_t k) {
    return k < 32 && consumer.layer->accumulates_input_grad(k) &&
           std::count(consumer.inputs.begin(), consumer.inputs.end(), consumer.inputs[k]) == 1;
  }

  void plan_memory() {
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
  void poison_fresh(float* p, size_t elements) const {
    if (poison) std::fill(p, p + elements, std::numeric_limits<float>::quiet_NaN());
  }
  void poison_workspace() {
    if (poison) std::fill(workspace.data(), workspace.data() + workspace.size(), std::byte{0xFF});
  }

  // max_abs: per parameter, or null (all measured by the layers); each layer gets its own.
  void weights_updated(const float* max_abs) {
    for (NodeInfo& n : nodes)
      if (n.layer)
        n.layer->weights_updated(step, max_abs ? std::span<const float>(max_abs + n.param_begin, n.param_end - n.param_begin)
                                               : std::span<const float>());
  }

  // The layers' forward pass on `count` images; the loss node's act then holds the logits.
  void run_layers(const float* images, int count, bool train) {
    DFP_CHECK(built, Status::invalid_argument, "model '" + name + "': forward() before build()");
    DFP_CHECK(count >= 1 && count <= batch, Status::invalid_argument,
              "model '" + name + "': batch of " + std::to_string(count) + " images, planned for 1.." + std::to_string(batch));
    DFP_CHECK(!train || count == batch, Status::invalid_argument,
              "model '" + name + "': training batches must be full (" + std::to_string(batch) +
                  " images; BatchNorm statistics would include padding), got " + std::to_string(count));
    have_training_forward = false;
    have_input_grad = false;
    const TensorShape& is = nodes[0].shape;
    const size_t per_image = is.blocked_elements() / size_t(batch);
    const size_t given = per_image * count;  // the rest of the planned batch: zeros
    // A NaN or Inf pixel is refused here, in every precision: a ReLU or a max pool would map it
    // to a finite value, so the logits would look plausible where torch's are NaN.
    std::atomic<size_t> first_bad{given};
    model::for_chunks(ctx, per_image * batch, [&](size_t b, size_t e) {
      if (b < given) {
        const size_t end = std::min(e, given);
        std::memcpy(nodes[0].act + b, images + b, (end - b) * sizeof(float));
        bool bad = false;
        for (size_t i = b; i < end; ++i) bad |= !(std::fabs(images[i]) <= std::numeric_limits<float>::max());
        if (bad) {
          size_t i = b;
          while (std::fabs(images[i]) <= std::numeric_limits<float>::max()) ++i;
          for (size_t seen = first_bad.load(); i < seen && !first_bad.compare_exchange_weak(seen, i);) {
          }
        }
      }
      if (e > given) std::memset(nodes[0].act + std::max(b, given), 0, (e - std::max(b, given)) * sizeof(float));
    });
    if (const size_t i = first_bad.load(); i < given)
      fail(Status::numerical_error,
           "model '" + name + "': input image " + std::to_string(i / per_image) + " of " + std::to_string(count) +
               " holds a non-finite value (" + std::to_string(images[i]) + " at element " +
               std::to_string(i % per_image) + " of the image); expected finite values");
    model::StepInfo st{count, train, step, train && sample_step()};
    if (train && statistics_sum) st.statistics_sum = &statistics_sum;
    st.first_image = batch_offset;
    const bool timed = profiling && train;  // evaluation passes are not profiled
    st.timed = timed;
    for (size_t i = 1; i < nodes.size(); ++i) {
      NodeInfo& n = nodes[i];
      xs.clear();
      for (int j : n.inputs) xs.push_back(nodes[j].act);
      if (std::find(xs.begin(), xs.end(), n.act) == xs.end()) poison_fresh(n.act, n.elements);  // not in place
      // The workspace holds what a producer already quantized for this layer (input spans), and
      // a fused ReLU node uses none.
      const auto* takes = poison ? n.layer->as<model::TakesInputSpans>() : nullptr;  // a debug run only
      if (poison && !(takes && takes->input_taken()) && !n.spec.fused) poison_workspace();
      model::StepInfo sti = st;
      if (fusion && n.inputs.size() == 1) {
        sti.input_max_abs = nodes[n.inputs[0]].act_max;
        sti.input_plane_max = nodes[n.inputs[0]].act_planes;
      }
      const auto t0 = timed ? ProfileClock::now() : ProfileClock::time_point{};
      n.layer->forward(ctx, xs, n.act, sti);
      n.act_max = fusion && n.maxima ? n.maxima->output_max_abs() : -1.f;
      n.act_planes = fusion && n.maxima ? n.maxima->output_plane_max() : nullptr;
      if (timed) {
        n.fwd_seconds += seconds_between(t0, ProfileClock::now());
        ++n.fwd_steps;
      }
    }
    last_count = count;
    have_training_forward = train;
    have_labels = false;
  }

  StepResult forward(const float* images, const int32_t* lab, int count, bool train) {
    run_layers(images, count, train);
    const bool timed = profiling && train;
    const auto loss_t0 = timed ? ProfileClock::now() : ProfileClock::time_point{};
    // Softmax cross-entropy in double, per image.
    const TensorShape& ls = nodes[loss_node].shape;
    const int K = ls.c, KP = channel_blocks(K) * 16;
    const float* logits = nodes[loss_node].act;
    StepResult r;
    r.count = count;
    double loss = 0;
    for (int n = 0; n < count; ++n) {
      const int y = lab[n];
      DFP_CHECK(y >= 0 && y < K, Status::invalid_argument,
                "model '" + name + "': label " + std::to_string(y) + " of image " + std::to_string(n) +
                    " outside [0, " + std::to_string(K) + ")");
      labels[n] = y;
      const float* z = logits + size_t(n) * KP;
      DFP_CHECK(std::isfinite(z[0]), Status::numerical_error,
                "model '" + name + "': non-finite logits for image " + std::to_string(n) + " (training diverged)");
      const float zmax = *std::max_element(z, z + K);
      double sum = 0;
      for (int k = 0; k < K; ++k) sum += std::exp(double(z[k]) - zmax);
      const double lse = zmax + std::log(sum);
      double l = 0;
      for (int k = 0; k < K; ++k) {
        const double logp = z[k] - lse;
        probs[size_t(n) * K + k] = static_cast<float>(std::exp(logp));
        const double target = (k == y ? 1.0 - label_smoothing : 0.0) + label_smoothing / K;
        l -= target * logp;
      }
      loss += l;
      int rank = 0;  // how many logits beat the label's
      for (int k = 0; k < K; ++k) rank += (z[k] > z[y]) || (z[k] == z[y] && k < y);
      r.correct1 += rank < 1;
      r.correct5 += rank < 5;
    }
    r.loss = loss / count;
    if (timed) loss_fwd_seconds += seconds_between(loss_t0, ProfileClock::now());
    have_labels = train;
    return r;
  }

  // The logits of the last forward pass as plain [count][classes].
  void copy_logits(float* out) const {
    const int K = nodes[loss_node].shape.c, KP = channel_blocks(K) * 16;
    ctx.parallel_for(last_count, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n)
        std::memcpy(out + size_t(n) * K, nodes[loss_node].act + size_t(n) * KP, size_t(K) * sizeof(float));
    });
  }

  // Parallel y = y * a + x * b over n floats (b == 0: x unused). With a = b = 1, the usual sum of
  // two consumers' gradients, it is the add kernel: multiplying by 1 is exact, so the bits agree.
  void scale_add(float* y, float a, const float* x, float b, size_t n) const {
    const auto add = ctx.kernels().add.fn;
    model::for_chunks(ctx, n, [&](size_t lo, size_t e) {
      if (x && a == 1.f && b == 1.f) {
        add(y + lo, x + lo, y + lo, e - lo);
      } else if (x) {
        for (size_t q = lo; q < e; ++q) y[q] = y[q] * a + x[q] * b;
      } else {
        for (size_t q = lo; q < e; ++q) y[q] *= a;
      }
    });
  }

  // Divides a layer's parameter gradients by the scale its output gradient carried; returns
  // whether all of them are finite (x * 0 is NaN exactly for NaN and inf, and NaN poisons the sum).
  bool unscale_params(const NodeInfo& n) {
    bool finite = true;
    const float inv = static_cast<float>(1.0 / n.grad_scale);
    for (size_t p = n.param_begin; p < n.param_end; ++p) {
      float* g = params[p].grad;
      float poison = 0.f;
      if (inv != 1.f) {
        for (size_t q = 0; q < params[p].size; ++q) { g[q] *= inv; poison += g[q] * 0.f; }
      } else {
        for (size_t q = 0; q < params[p].size; ++q) poison += g[q] * 0.f;
      }
      finite &= poison == 0.f;
    }
    return finite;
  }

  // logits_grad: the caller's d(loss)/d(logits), [batch][classes]; null: the built-in loss's.
  bool backward(const float* logits_grad) {
    DFP_CHECK(built && have_training_forward && last_count == batch, Status::invalid_argument,
              "model '" + name + "': backward() needs a training forward() first (and no other forward in between)");
    DFP_CHECK(logits_grad || have_labels, Status::invalid_argument,
              "model '" + name + "': backward() without a logits gradient needs a labelled training forward(); after "
              "logits(), pass the gradient of the loss with respect to the logits");
    have_training_forward = have_labels = false;  // planned memory reused: one backward per training forward
    for (NodeInfo& n : nodes) n.grad_written = false;
    const auto loss_t0 = profiling ? ProfileClock::now() : ProfileClock::time_point{};
    // Built-in: d(scale * mean loss)/d(logits) = scale * (p - target) / batch; else scale * the caller's.
    NodeInfo& ln = nodes[loss_node];
    const int K = ln.shape.c, KP = channel_blocks(K) * 16;
    // Per image on the context's threads: a block's feature map read as logits (dfp.torch's
    // segments) has C*H*W of them.
    ctx.parallel_for(batch, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        float* g = ln.grad + size_t(n) * KP;
        std::fill(g + K, g + KP, 0.f);
        for (int k = 0; k < K; ++k) {
          const size_t nk = size_t(n) * K + k;
          if (logits_grad) {
            g[k] = static_cast<float>(loss_scale * logits_grad[nk]);
          } else {
            const double target = (k == labels[n] ? 1.0 - label_smoothing : 0.0) + label_smoothing / K;
            g[k] = static_cast<float>(loss_scale * (probs[nk] - target) / batch);
          }
        }
      }
    });
    ln.grad_written = true;
    ln.grad_max = -1.f;
    ln.grad_planes = nullptr;
    ln.grad_scale = loss_scale;
    ln.adapt_scale = 1;
    if (profiling) loss_bwd_seconds += seconds_between(loss_t0, ProfileClock::now());
    bool finite = true;
    model::StepInfo st{batch, true, step, sample_step()};
    if (statistics_sum) st.statistics_sum = &statistics_sum;
    st.timed = profiling;
    st.first_image = batch_offset;
    for (size_t i = nodes.size() - 1; i >= 1; --i) {
      NodeInfo& n = nodes[i];
      if (!n.grad_written) continue;  // does not reach the loss
      // The layer's time includes its share of the bookkeeping: its adaptive scaling, unscaling
      // its parameter gradients, and summing its input gradient with another consumer's.
      const auto t0 = profiling ? ProfileClock::now() : ProfileClock::time_point{};
      if (adaptive) {
        // Zhao et al.: this layer's own factor, applied to the gradient it receives (so to its
        // own rounding of dy, its weight gradient and everything it passes on).
        const double alpha = n.reduced ? n.reduced->adaptive_factor(ctx, n.grad, n.adapt_scale, adaptive_opts) : 1;
        if (alpha != 1) {
          n.grad_max = -1.f;
          n.grad_planes = nullptr;
          scale_add(n.grad, static_cast<float>(alpha), nullptr, 0.f, n.elements);
          n.grad_scale *= alpha;
          n.adapt_scale *= alpha;
        }
      }
      xs.clear();
      dxs.clear();
      model::StepInfo stb = st;
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        NodeInfo& in = nodes[n.inputs[k]];
        // Only what the layer declared is still planned to hold the forward values.
        xs.push_back(n.layer->backward_reads_input(k) ? in.act : nullptr);
        // A second slot of the same node in this layer (add(x, x)) is a second part too.
        const bool again = std::find(n.inputs.begin(), n.inputs.begin() + k, n.inputs[k]) != n.inputs.begin() + k;
        if (n.inputs[k] == 0 && !input_grad) {
          dxs.push_back(nullptr);  // no gradient for the data
        } else if (in.grad_written && in.grad_scale == n.grad_scale && adds_own_part(n, k)) {
          // Second consumer at the same scale: the layer adds its part to the gradient itself.
          dxs.push_back(in.grad);
          stb.accumulate_dx |= uint32_t{1} << k;
        } else {
          const bool second = in.grad_written || again;
          DFP_CHECK(!second || in.acc, Status::internal,
                    "model '" + name + "': no buffer planned for a second part of the gradient of '" + in.spec.name + "'");
          dxs.push_back(second ? in.acc : in.grad);
          if (dxs.back() != n.grad) poison_fresh(dxs.back(), in.elements);  // not in place
        }
      }
      poison_workspace();
      if (fusion) {
        stb.grad_max_abs = n.grad_max;
        stb.grad_plane_max = n.grad_planes;
      }
      n.layer->backward(ctx, xs, n.layer->backward_reads_output() ? n.act : nullptr, n.grad, dxs, stb);
      finite &= unscale_params(n);
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        const int j = n.inputs[k];
        if (j == 0 && !input_grad) continue;
        NodeInfo& in = nodes[j];
        // The max a layer measured holds for its input's gradient only if no other consumer adds to it.
        const bool measured = !in.grad_written && fusion && n.inputs.size() == 1 && n.maxima;
        in.grad_max = measured ? n.maxima->input_grad_max_abs() : -1.f;
        in.grad_planes = measured ? n.maxima->input_grad_plane_max() : nullptr;
        if (k < 32 && (stb.accumulate_dx >> k & 1)) {
          // Summed by the layer, at the common scale.
        } else if (in.grad_written) {
          // Second consumer: sum at the smaller of the two scales, so neither part can overflow.
          const double target = std::min(in.grad_scale, n.grad_scale);
          scale_add(in.grad, static_cast<float>(target / in.grad_scale), in.acc,
                    static_cast<float>(target / n.grad_scale), in.elements);
          in.adapt_scale = in.grad_scale == target ? in.adapt_scale : n.adapt_scale;
          in.grad_scale = target;
        } else {
          in.grad_scale = n.grad_scale;
          in.adapt_scale = n.adapt_scale;
        }
        in.grad_written = true;
      }
      if (profiling) n.bwd_seconds += seconds_between(t0, ProfileClock::now());
      if (gradient_hook) gradient_hook(n.param_begin, n.param_end);
    }
    ++step;
    have_input_grad = input_grad && nodes[0].grad_written;
    return finite;
  }
};

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
