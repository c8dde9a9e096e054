// Model::Impl, the model's state: its graph of nodes, the planned arena and workspace, and the
// step's bookkeeping. Shared by model.cpp (construction, planning, the public API) and
// model_step.cpp (the forward, loss and backward passes of a step).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/model.hpp"
#include "src/core/aligned_buffer.hpp"
#include "src/graph/arena.hpp"
#include "src/layers/layer.hpp"

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

  // ---- construction and planning (model.cpp) -------------------------------------------------
  Node add(std::unique_ptr<model::Layer> layer, std::vector<int> inputs, std::string lname, LayerKind kind,
           LayerParams params);

  std::vector<TensorShape> in_shapes(const NodeInfo& n) const;

  void build(int b, const PrecisionPolicy& policy);

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

  static bool adds_own_part(const NodeInfo& consumer, size_t k);

  void plan_memory();

  void poison_fresh(float* p, size_t elements) const;
  void poison_workspace();

  void weights_updated(const float* max_abs);

  // ---- the training step: forward, loss, backward (model_step.cpp) --------------------------
  void run_layers(const float* images, int count, bool train);

  StepResult forward(const float* images, const int32_t* lab, int count, bool train);

  void copy_logits(float* out) const;

  void scale_add(float* y, float a, const float* x, float b, size_t n) const;

  bool unscale_params(const NodeInfo& n);

  bool backward(const float* logits_grad);
};

}  // namespace dfp
