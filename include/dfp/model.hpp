// dfp: the model graph, its precision policy, and the training-step interface.
//
// A Model is a graph of layers built through the methods below (each returns the new node);
// shapes are inferred as the graph is built. build() plans every buffer once: parameters,
// gradients, activations, scratch, and the per-layer INT16 or FP32 operators. A training step
// (forward, backward, optimizer update) allocates nothing.
//
// Activations are FP32 in the blocked layout of conv.hpp ([N][ceil(C/16)][H][W][16]).
// Precision is a runtime policy over this one set of layers: Conv2d and Linear run on DFP16
// operands (all three passes, FP32 outputs), on BF16 or FP16 operands with FP32 accumulation,
// or in FP32; BatchNorm, ReLU, pooling, the loss, the master weights and the optimizer compute in
// FP32 in every policy. What backward needs is kept in 16 bits under int16, as in Das et al.:
// Conv2d/Linear keep their DFP16 input, and a BatchNorm whose name resolves to int16 keeps its
// input as DFP16 (override it to fp32 by name, e.g. "bn*=fp32", to keep it in FP32); with nearest
// or biased rounding it normalizes those DFP16 values, and a conv that reads its output computes
// its own copy of it again for its weight gradient (docs/design/memory.md).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dfp/conv.hpp"
#include "dfp/float16.hpp"
#include "dfp/layer_kind.hpp"
#include "dfp/loss_scale.hpp"
#include "dfp/precision.hpp"
#include "dfp/types.hpp"

namespace dfp {

class Context;

// A read-only description of one graph node, so that another back end (the CUDA device) can run
// the same model: its kind, the typed parameters it was built with and its output shape.
struct LayerSpec {
  LayerKind kind = LayerKind::input;
  std::string name;
  std::vector<int> inputs;       // node indices
  TensorShape shape;             // output (n = the planned batch once built, else 0)
  LayerParams params;            // the kind's parameters (std::monostate for kinds without)
  bool fused = false;            // relu: applied by its producer (Model::set_fusion), once built
  // conv (int16), add: an input that is a BatchNorm's output (through its fused ReLU, if any)
  // that only this layer reads is taken span by span as the BatchNorm computes it -- the conv
  // quantizes each span, the add adds it -- and the FP32 tensor is not written (Model::set_fusion;
  // training steps without numerics sampling), once built
  bool input_spans = false;
  // conv (int16): its output gradient comes span by span from the BatchNorm that alone reads its
  // output and runs right after it, computed as the conv quantizes it; that FP32 gradient is not
  // written (Model::set_fusion; training steps without numerics sampling or adaptive loss
  // scaling), once built
  bool grad_spans = false;
  uint64_t seed = 0;             // dropout: its random stream (set by build())

  // The parameters as the kind's type (ConvParams for a conv, ...).
  template <class P>
  const P& get() const {
    if (const P* p = std::get_if<P>(&params)) return *p;
    layer_params_mismatch(name, kind);
  }
  // The kind's short name ("conv", "bn", ...; layer_kind(kind).short_name).
  const std::string& kind_name() const { return layer_kind(kind).short_name; }
};

struct StepResult {
  double loss = 0;     // mean over the batch
  int correct1 = 0;    // top-1 hits
  int correct5 = 0;    // top-5 hits
  int count = 0;
};

// A named tensor of the model's state, viewed in place (zero-copy): a parameter (FP32 master
// values, with its gradient) or a buffer (BatchNorm running statistics). Names and layouts are
// PyTorch's: "<layer>.weight" / "<layer>.bias" / "<layer>.running_mean" / "<layer>.running_var";
// a Conv2d weight is [out][in / groups][kernel][kernel], a Linear weight [out][in] (inputs in the
// (c, h, w) order of flatten()), biases and BatchNorm tensors [channels]; row-major, contiguous.
// The pointers stay valid for the model's lifetime. Values written through `data` reach the
// computation after Model::weights_updated().
struct TensorView {
  std::string name;
  std::vector<int> shape;
  float* data = nullptr;
  size_t size = 0;           // product of shape
  bool trainable = false;    // a parameter; false: a buffer
  float* grad = nullptr;     // a parameter's gradient (after backward), else null
};

// What Model::build planned for activations and gradients (parameters, optimizer state and the
// layers' own saved copies -- DFP16 activations, ReLU bit masks, pooling indices -- come on top).
struct MemoryPlan {
  size_t arena_bytes = 0;      // FP32 activations and gradients, placed by lifetime in one arena
  size_t unshared_bytes = 0;   // what they would take with one buffer each (the arena's saving)
  size_t workspace_bytes = 0;  // transient scratch shared by all layers
};

class Model {
 public:
  using Node = int;

  explicit Model(const Context& ctx, std::string name = "model");
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // ---- graph construction (names are optional; defaults are "<kind><index>") ----
  Node input(int channels, int height, int width);
  // A layer of any kind (dfp/layer_kind.hpp): `params` holds the kind's parameter type
  // (std::monostate: the kind's defaults). The builders below are this call spelled out.
  Node layer(LayerKind kind, std::vector<Node> inputs, LayerParams params = {}, std::string name = "");
  // The same with the kind by name and its parameters by name (layer_params), as C and Python call it.
  Node layer(const std::string& kind, std::vector<Node> inputs,
             const std::vector<std::pair<std::string, double>>& params, std::string name = "");
  // groups > 1: a grouped convolution, as PyTorch's Conv2d(groups=...): `groups` must divide the
  // input and output channels; output group g reads input group g only, and the weight has
  // PyTorch's shape [out_channels][in_channels / groups][kernel][kernel].
  Node conv(Node x, int out_channels, int kernel, int stride = 1, int pad = 0, bool bias = false,
            std::string name = "", int groups = 1);
  // eps: added to the variance, as PyTorch's BatchNorm2d(eps=...) (torchvision's GoogLeNet: 1e-3).
  Node batchnorm(Node x, std::string name = "", double eps = 1e-5);
  Node relu(Node x, std::string name = "");
  Node maxpool(Node x, int kernel, int stride, int pad = 0, bool ceil_mode = false, std::string name = "");
  Node avgpool(Node x, int kernel, int stride, int pad = 0, std::string name = "");
  Node global_avgpool(Node x, std::string name = "");
  Node flatten(Node x, std::string name = "");
  Node linear(Node x, int out_features, bool bias = true, std::string name = "");
  Node add(Node a, Node b, std::string name = "");
  Node concat(const std::vector<Node>& xs, std::string name = "");
  Node dropout(Node x, float p, std::string name = "");
  Node lrn(Node x, int size, float alpha, float beta, float k, std::string name = "");
  // ResNet "option A" shortcut: spatial subsampling by `stride` and zero channels to out_channels.
  Node shortcut_pad(Node x, int out_channels, int stride, std::string name = "");
  // Softmax cross-entropy over the logits of `x` (shape N x classes x 1 x 1).
  void softmax_cross_entropy(Node x, float label_smoothing = 0.f);
  // Changes the loss's label smoothing (in [0, 1)) after the graph is made, e.g. by a model from
  // dfp/models.hpp; takes effect from the next forward pass.
  void set_label_smoothing(float label_smoothing);

  TensorShape shape(Node n) const;
  const std::string& name() const noexcept;
  // The context the model runs on (threads, kernels, logger).
  const Context& context() const noexcept;

  // Plans all buffers and operators for batches of up to `batch` images; initialises parameters
  // from the context's seed. Call once, after the graph is complete.
  void build(int batch, const PrecisionPolicy& policy);
  bool built() const noexcept;
  int batch() const noexcept;
  // The precision policy build() resolved (the default policy before build()).
  const PrecisionPolicy& policy() const noexcept;

  // One forward pass on `count` <= batch images (blocked layout, shape of input()) with integer
  // labels. In training mode BatchNorm uses batch statistics (and updates its running ones)
  // and dropout is active; `count` must equal batch() then.
  StepResult forward(const float* images, const int32_t* labels, int count, bool train);
  // Gradients of the last training forward into every Parameter::grad, unscaled (see
  // set_loss_scale). Returns false when any parameter gradient is not finite (the optimizer step
  // must then be skipped; with loss scaling this is the overflow signal). Needs the labelled
  // forward() above (its built-in softmax cross-entropy).
  bool backward();

  // ---- inference and training from outside (any loss) ----
  // Classes: the logits' count per image (the channels of the node the loss reads).
  int classes() const;
  // One forward pass on `count` images (1..batch(); blocked layout as forward(), see
  // dfp::to_blocked in conv.hpp for plain NCHW) without labels, writing the logits to `out` as
  // plain row-major FP32 [count][classes()]. Any precision; nothing allocated. With train false
  // this is inference: BatchNorm uses its running statistics, dropout is off, and each image's
  // logits depend on that image alone in FP32/BF16/FP16 (the planned batch is run with the
  // missing images as zeros); in INT16 a tensor's DFP16 exponent is shared by the batch, so the
  // same image's logits may differ by the rounding of another exponent. With train true it is a
  // training forward (count must be batch(), BatchNorm uses and updates batch statistics) to be
  // followed by backward(logits_grad).
  void logits(const float* images, int count, bool train, float* out);
  // logits(images, count, false, out).
  void predict(const float* images, int count, float* out);
  // Backward from a caller's loss: `logits_grad` is d(loss)/d(logits) as plain row-major FP32
  // [batch()][classes()] (a mean over the batch included, as the caller's loss defines it). After
  // a training forward, labelled (forward) or not (logits). Fills every Parameter::grad as
  // backward() does (the loss scale of set_loss_scale multiplies the given gradient first and is
  // divided out of the parameter gradients) and returns the same finiteness flag. Supplying the
  // built-in loss's gradient, float((p - target) / batch) with p the softmax in float, gives
  // backward()'s bits. Nothing allocated.
  bool backward(const float* logits_grad);
  // Before build(): also compute the gradient with respect to the input images (off by default:
  // the first layers then skip their input-gradient pass).
  void set_input_grad(bool on);
  // After a backward pass with set_input_grad(true): d(loss)/d(images) of the last training
  // batch, unscaled, as plain NCHW FP32 [batch()][C][H][W] (C, H, W of input()). Throws if the
  // model was built without set_input_grad(true) or no backward ran since the last forward.
  void input_grad(float* out) const;
  // Loss scaling: the loss gradient is multiplied by `scale` (the LossScaler's, set every step)
  // before the backward pass, and every parameter gradient divided by the scale its layer saw.
  void set_loss_scale(double scale);
  // Once, before training: with mode adaptive each Conv/Linear backward multiplies the gradient
  // it passes on by its own power-of-two factor (Zhao et al. 2019; include/dfp/loss_scale.hpp),
  // bounded by adaptive_max_factor per layer and adaptive_max_scale accumulated. Switching to or
  // from adaptive after build() plans the gradient buffers again (it allocates; a forward pass
  // not yet backpropagated is dropped).
  void set_loss_scaling(const LossScaleOptions& options);
  // Sample rounding statistics every `interval` training steps (0: never).
  void set_numerics_interval(int interval);
  // Testing aid: fill every planned buffer with NaN before its first write of each step, and the
  // shared workspace before every layer call, as fresh memory could hold anything; a layer that
  // reads memory it did not write (or that the plan gave to another buffer) then yields NaN.
  void set_debug_poison(bool on);
  // Before build(): let layers absorb the ReLU that alone reads their output (BatchNorm + ReLU
  // become one pass forward and one backward), and hand on the largest magnitudes that layers
  // measure on the way (ReLU outputs, BatchNorm input gradients), so that the next INT16 layer
  // finds its DFP16 exponent without a pass of its own. The results are bit-identical either way.
  // On by default; off for comparisons and tests.
  void set_fusion(bool on);
  // Called in backward() after each layer's backward pass with the range [first, last) of
  // parameters() whose gradients that layer has just finalised (unscaled; empty for a layer
  // without parameters), in the order backward produces them: a data-parallel trainer starts the
  // allreduce of finished gradients there while backward goes on. Calling it allocates nothing;
  // an empty function removes it.
  void set_gradient_hook(std::function<void(size_t first, size_t last)> hook);
  // Synchronised BatchNorm (a data-parallel job's --sync-bn): in training passes every BatchNorm
  // takes its batch statistics, and its backward sums, over the whole job's batch: `sum` adds
  // `values` over the processes in place (each process calls it at the same points, in graph
  // order). The parameter gradients stay this process's own, for the job to average as any
  // other. An empty function: this process's batch only (the default).
  void set_statistics_sum(std::function<void(double* values, size_t count)> sum);
  // Where this process's batch starts in a data-parallel job's global batch (rank r of N with
  // B/N images each: r * B/N; 0, the default, otherwise). Per-image random draws in training
  // (dropout masks) are keyed by the image's place in the global batch, so N processes draw what
  // one process with the whole batch draws. Negative values are Error(invalid_argument).
  void set_batch_offset(int first_image);
  // Time every layer's training forward and backward pass (evaluation passes are not timed): two
  // clock reads per layer and pass, nothing allocated once built. layer_times() lists every layer
  // and then the loss, in graph order; a ReLU absorbed by fusion (set_fusion) shows only its
  // bookkeeping, its work being in its producer's time.
  void set_profiling(bool on);
  std::vector<LayerTime> layer_times() const;
  void reset_layer_times();
  MemoryPlan memory_plan() const;  // after build()
  // Re-quantizes and re-packs the weights of every Conv2d/Linear after their values changed
  // (INT16: DFP16 + VNNI layouts; FP32: oneDNN's layout), each layer measuring its own: for
  // callers that changed the weights themselves (loading a checkpoint, a copy back from the GPU).
  // The optimizer calls the overload below, once per step.
  void weights_updated();
  // Same, with max|value| of each parameter (in parameters() order) as the caller measured it,
  // e.g. in the optimizer's update pass: an INT16 layer then takes its weights' DFP16 exponent
  // from it instead of a pass of its own (a grouped conv measures each group's). A negative or
  // non-finite entry: measured there. Throws if the size is not parameters().size().
  void weights_updated(std::span<const float> max_abs);

  // Training steps taken (backward() calls); seeds dropout and stochastic rounding. A resumed
  // run restores it so that it reproduces an uninterrupted one.
  uint64_t step() const noexcept;
  void set_step(uint64_t step);

  std::vector<Parameter>& parameters();
  size_t parameter_count() const;  // trainable scalars
  // Every parameter (in parameters() order) and then every buffer (in buffers() order) as a
  // zero-copy view with its PyTorch name and shape (see TensorView); after build(). After writing
  // values through the views, call weights_updated() (the re-quantization of INT16 weights and
  // the re-packing of the others happen there, not on the next forward). Buffers need no call.
  std::vector<TensorView> state();
  // (Both build the list with its names: take the views once, not in a training loop.)
  // The view named `name`; throws Error(invalid_argument) naming it if the model has none.
  TensorView tensor(const std::string& name);
  // Non-trainable state that checkpoints must keep (BatchNorm running statistics).
  std::vector<std::pair<std::string, std::vector<float>*>> buffers();
  std::vector<LayerNumerics> numerics() const;
  // Delayed FP8 scaling's amax histories, training state a checkpoint keeps, by "<layer>.<class>"
  // (a grouped conv's "<layer>.g<i>.<class>"; class weights, activations or gradients), oldest
  // first. set_scaling_histories refuses (corrupt_data, naming `origin` and the key) a value that
  // is not finite and >= 0 and a key no layer keeps a history under; a layer keeps the last
  // fp8 amax_history values.
  std::map<std::string, std::vector<float>> scaling_histories() const;
  void set_scaling_histories(const std::map<std::string, std::vector<float>>& histories, const std::string& origin);
  // One line per layer: name, kind, output shape, precision.
  std::string summary() const;
  // Every node in construction order (node 0 is the input), the node the loss reads, and its
  // label smoothing.
  std::vector<LayerSpec> graph() const;
  int loss_node() const noexcept;
  float label_smoothing() const noexcept;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dfp
