/* dfp: the C API (C99 and later; also usable from C++).
 *
 * The same engine as the C++ API (include/dfp/model.hpp and its neighbours), behind opaque
 * handles, status codes and message strings: a context (threads, seed), models from the zoo or
 * built layer by layer, a precision policy named as the command line's --precision, training steps
 * (the built-in softmax cross-entropy, or backward from the caller's gradient of the logits),
 * SGD, inference, the parameters and buffers as zero-copy views, and the state on disk. The
 * guide with a complete example: docs/c-api.md.
 *
 * Errors. Every function returns a dfp_status (DFP_OK, 0, on success), except dfp_status_name and
 * dfp_last_error, which cannot fail. On failure, dfp_last_error() gives a message naming the
 * function, the argument or object, and what was expected, e.g. "dfp_model_predict: images:
 * expected 8 x 1 x 28 x 28 = 6272 floats (NCHW), got 6000". The message belongs to the calling
 * thread and stays until that thread's next failing call (a successful call leaves it as it is,
 * as errno). A failed call writes none of its output arguments, and a call refused for its
 * arguments or its order changes nothing (a pass that fails part-way, e.g. on a NaN in an INT16
 * operand, may leave BatchNorm's running statistics updated). No C++ exception crosses this
 * interface: every one is caught and reported, running out of memory as DFP_ERR_OUT_OF_MEMORY.
 *
 * Ownership. Each *_create function hands the caller one handle, which the caller releases with
 * the matching *_destroy (NULL is accepted and ignored). A handle keeps alive what it was made
 * from: a model its context, an optimizer its model, so handles may be destroyed in any order.
 * Every pointer the library returns (names, views, messages) points into memory the library owns;
 * the caller never frees it. Pointers the caller passes are used only during the call (the
 * library keeps no pointer to caller memory).
 *
 * Threads. A context owns its worker threads (the computation inside each call uses them); one
 * context may be shared by models used on different threads at the same time. A model, and the
 * optimizer made from it, must be used by one thread at a time (calls on one model from two
 * threads at once need the caller's lock). The error message is per thread.
 *
 * Layouts. Images are plain row-major FP32 NCHW: [count][channels][height][width] of the model's
 * input (node 0). Labels are int32_t in [0, classes). Logits and their gradient are plain
 * row-major FP32 [count][classes]. Parameters and buffers are viewed in PyTorch's names, shapes
 * and layouts (see dfp_tensor_view). Sizes passed alongside buffers count elements, not bytes.
 *
 * Memory. dfp_model_build plans every buffer once; after it, training steps (forward, backward,
 * dfp_sgd_step), inference and the views allocate nothing.
 */
#ifndef DFP_DFP_H
#define DFP_DFP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define DFP_NOEXCEPT noexcept
extern "C" {
#else
#define DFP_NOEXCEPT
#endif

/* The version of this interface; it grows when functions are added. */
#define DFP_C_API_VERSION 1

typedef enum dfp_status {
  DFP_OK = 0,
  DFP_ERR_INVALID_ARGUMENT = 1, /* an argument out of range, NULL, of the wrong size, or a call out of order */
  DFP_ERR_IO = 2,               /* a file could not be opened, read or written */
  DFP_ERR_CORRUPT_DATA = 3,     /* a file does not have the expected format, checksum or tensors */
  DFP_ERR_UNSUPPORTED = 4,      /* a valid request this build or CPU cannot serve */
  DFP_ERR_NUMERICAL = 5,        /* NaN or Inf where the numerics do not allow it */
  DFP_ERR_INTERNAL = 6,         /* a broken invariant inside dfp (a bug: please report it) */
  DFP_ERR_OUT_OF_MEMORY = 7     /* an allocation failed */
} dfp_status;

/* The status's name: "ok", "invalid_argument", "io_error", "corrupt_data", "unsupported",
 * "numerical_error", "internal", "out_of_memory"; "unknown" for any other value. A static string. */
const char* dfp_status_name(dfp_status status) DFP_NOEXCEPT;

/* The message of the calling thread's last failing call ("" if none failed). Valid until the
 * thread's next failing call; copy it to keep it. */
const char* dfp_last_error(void) DFP_NOEXCEPT;

/* ---- text out --------------------------------------------------------------------------------
 * Functions that return text write it as snprintf does: at most size - 1 characters and a NUL to
 * `buffer` (nothing when size is 0; buffer may then be NULL), and the text's full length (without
 * the NUL) to *length. A *length >= size means the text was cut: call again with length + 1. */

/* The zoo's architecture names, comma-separated ("lenet,resnet20,..."): see dfp_model_create_zoo. */
dfp_status dfp_zoo_names(char* buffer, size_t size, size_t* length) DFP_NOEXCEPT;

/* The layer kinds dfp_model_layer takes, one per line: the kind's name, its number of inputs and
 * its parameters with their defaults, e.g. "lrn inputs=1 size=(required) alpha=0.0001 beta=0.75 k=1". */
dfp_status dfp_layer_kinds(char* buffer, size_t size, size_t* length) DFP_NOEXCEPT;

/* ---- context ------------------------------------------------------------------------------ */

typedef struct dfp_context dfp_context;

/* A context with `threads` worker threads (0: every core this process may use; at most 1024) and
 * `seed`, the base of every random stream (initialisation, dropout, stochastic rounding). The
 * kernel level is the best the CPU supports, or the one the environment variable DFP_ISA names.
 * Its threads are the calling thread's OpenMP pool, shared with oneDNN (docs/design/threads.md). */
dfp_status dfp_context_create(int threads, uint64_t seed, dfp_context** out) DFP_NOEXCEPT;
/* Releases the caller's handle; the context lives on while models made from it do. */
dfp_status dfp_context_destroy(dfp_context* ctx) DFP_NOEXCEPT;
/* The number of worker threads (the cores counted when created with 0). */
dfp_status dfp_context_threads(const dfp_context* ctx, int* threads) DFP_NOEXCEPT;
/* The kernel level in use: "ref", "avx2", "avx512bw" or "avx512vnni" (a static string). */
dfp_status dfp_context_isa(const dfp_context* ctx, const char** isa) DFP_NOEXCEPT;

/* ---- models ---------------------------------------------------------------------------------
 * A model is a graph of layers. It is made empty (dfp_model_create, then the builder functions
 * below) or whole (dfp_model_create_zoo), then built once (dfp_model_build), which fixes the batch
 * size and the precision, initialises the parameters from the context's seed and plans every
 * buffer. Builder functions fail after the build; running functions fail before it. */

typedef struct dfp_model dfp_model;

/* An empty model named `name` (NULL: "model"), to be built layer by layer. */
dfp_status dfp_model_create(dfp_context* ctx, const char* name, dfp_model** out) DFP_NOEXCEPT;
/* The zoo architecture `arch` (one of dfp_zoo_names: "lenet", "resnet20", "resnet18c",
 * "vgg11bn", ...; include/dfp/models.hpp describes them) for images of channels x height x width
 * and `classes` classes, its loss included; the model is named `arch`. An input too small for the
 * architecture is refused with a message naming the layer it does not fit. */
dfp_status dfp_model_create_zoo(dfp_context* ctx, const char* arch, int channels, int height, int width,
                                int classes, dfp_model** out) DFP_NOEXCEPT;
/* Releases the caller's handle; an optimizer made from the model keeps it alive. */
dfp_status dfp_model_destroy(dfp_model* model) DFP_NOEXCEPT;

/* Builder: each function adds one layer reading the given node(s) and writes the new node's index
 * to *node (the input is node 0). `name` may be NULL or "" for the default "<kind><index>"; names
 * must be unique, and they name the parameters ("<name>.weight"). Shapes are checked as the graph
 * grows. These mirror dfp::Model's methods (include/dfp/model.hpp) with their meaning. */
dfp_status dfp_model_input(dfp_model* model, int channels, int height, int width, int* node) DFP_NOEXCEPT;
/* A convolution: kernel x kernel, `stride`, zero padding `pad`, a bias if `bias` is non-zero;
 * groups > 1 is a grouped convolution as PyTorch's (groups divides both channel counts). */
dfp_status dfp_model_conv(dfp_model* model, int x, int out_channels, int kernel, int stride, int pad, int bias,
                          int groups, const char* name, int* node) DFP_NOEXCEPT;
dfp_status dfp_model_batchnorm(dfp_model* model, int x, const char* name, int* node) DFP_NOEXCEPT;
dfp_status dfp_model_relu(dfp_model* model, int x, const char* name, int* node) DFP_NOEXCEPT;
dfp_status dfp_model_maxpool(dfp_model* model, int x, int kernel, int stride, int pad, int ceil_mode,
                             const char* name, int* node) DFP_NOEXCEPT;
dfp_status dfp_model_avgpool(dfp_model* model, int x, int kernel, int stride, int pad, const char* name,
                             int* node) DFP_NOEXCEPT;
dfp_status dfp_model_global_avgpool(dfp_model* model, int x, const char* name, int* node) DFP_NOEXCEPT;
dfp_status dfp_model_flatten(dfp_model* model, int x, const char* name, int* node) DFP_NOEXCEPT;
/* A fully-connected layer; its inputs are taken in the (c, h, w) order of flatten. */
dfp_status dfp_model_linear(dfp_model* model, int x, int out_features, int bias, const char* name,
                            int* node) DFP_NOEXCEPT;
dfp_status dfp_model_add(dfp_model* model, int a, int b, const char* name, int* node) DFP_NOEXCEPT;
/* Channel concatenation of `count` nodes. */
dfp_status dfp_model_concat(dfp_model* model, const int* xs, size_t count, const char* name, int* node) DFP_NOEXCEPT;
/* Dropout with probability p in [0, 1), active in training passes only. */
dfp_status dfp_model_dropout(dfp_model* model, int x, float p, const char* name, int* node) DFP_NOEXCEPT;
/* Local response normalisation across channels, as PyTorch's LocalResponseNorm. */
dfp_status dfp_model_lrn(dfp_model* model, int x, int size, float alpha, float beta, float k, const char* name,
                         int* node) DFP_NOEXCEPT;
/* ResNet "option A" shortcut: subsampling by `stride`, zero channels up to out_channels. */
dfp_status dfp_model_shortcut_pad(dfp_model* model, int x, int out_channels, int stride, const char* name,
                                  int* node) DFP_NOEXCEPT;
/* A layer of any kind by its name (see dfp_layer_kinds), reading the `count` nodes in `inputs`,
 * with its parameters as comma-separated "name=value" pairs ("size=5,alpha=1e-4,beta=0.75,k=2";
 * booleans as 0/1 or true/false; NULL or "" for none, or for the defaults). The functions above are
 * this call with the parameters spelled out; a kind added to dfp is reached through this one. */
dfp_status dfp_model_layer(dfp_model* model, const char* kind, const int* inputs, size_t count, const char* params,
                           const char* name, int* node) DFP_NOEXCEPT;
/* The loss: softmax cross-entropy over the logits of node x (shape classes x 1 x 1), with label
 * smoothing in [0, 1). Every model needs one; its node's channels are the classes. */
dfp_status dfp_model_softmax_cross_entropy(dfp_model* model, int x, float label_smoothing) DFP_NOEXCEPT;
/* Changes the loss's label smoothing (e.g. of a zoo model); from the next forward pass on. */
dfp_status dfp_model_set_label_smoothing(dfp_model* model, float label_smoothing) DFP_NOEXCEPT;
/* A node's output shape (per image). */
dfp_status dfp_model_node_shape(const dfp_model* model, int node, int* channels, int* height,
                                int* width) DFP_NOEXCEPT;
/* Before the build: also compute the gradient with respect to the input images in backward
 * passes (off by default; see dfp_model_input_grad). */
dfp_status dfp_model_set_input_grad(dfp_model* model, int on) DFP_NOEXCEPT;

/* Builds the model for batches of up to `batch` images. `precision` is the policy's default
 * precision, as the command line's --precision: "fp32", "int16" (DFP16), "bf16", "fp16", "fp8",
 * "mxfp8", "mxfp6", "mxfp4", "mxint8", "posit16" or "posit16es2" (NULL: "fp32"). `overrides` (NULL or "": none) sets the precision of layers by name, as
 * --override: comma-separated "pattern=precision" rules with glob patterns ('*', '?'), first match
 * wins, e.g. "conv1=fp32,fc=fp32". Other policy settings keep their defaults (nearest-even
 * rounding, headroom 2). Once per model. */
dfp_status dfp_model_build(dfp_model* model, int batch, const char* precision, const char* overrides) DFP_NOEXCEPT;
/* The planned batch size (after the build). */
dfp_status dfp_model_batch(const dfp_model* model, int* batch) DFP_NOEXCEPT;
/* The logits per image: the channels of the node the loss reads. */
dfp_status dfp_model_classes(const dfp_model* model, int* classes) DFP_NOEXCEPT;
/* The number of trainable scalars (after the build). */
dfp_status dfp_model_parameter_count(const dfp_model* model, size_t* count) DFP_NOEXCEPT;
/* One line per layer: name, kind, output shape, precision (text out, see above). */
dfp_status dfp_model_summary(const dfp_model* model, char* buffer, size_t size, size_t* length) DFP_NOEXCEPT;

/* ---- training and inference -----------------------------------------------------------------
 * `images` holds `count` images, NCHW; `images_length` is its number of floats and must be
 * count * channels * height * width of the input. */

typedef struct dfp_step_result {
  double loss;  /* the batch's mean softmax cross-entropy */
  int correct1; /* images whose label is the top logit */
  int correct5; /* images whose label is among the five top logits */
  int count;    /* images in the pass */
} dfp_step_result;

/* A forward pass with labels through the built-in loss. train non-zero: a training pass (count must
 * be the batch; BatchNorm uses and updates batch statistics, dropout is active), to be followed by
 * dfp_model_backward. train zero: evaluation (count from 1 to the batch; running statistics).
 * `result` may be NULL. */
dfp_status dfp_model_forward(dfp_model* model, const float* images, size_t images_length, const int32_t* labels,
                             int count, int train, dfp_step_result* result) DFP_NOEXCEPT;
/* Backward from the built-in loss of the last training dfp_model_forward: every parameter's
 * gradient (dfp_tensor_view.grad). *finite (may be NULL) is 1, or 0 when a gradient is not finite:
 * the optimizer step must then be skipped. */
dfp_status dfp_model_backward(dfp_model* model, int* finite) DFP_NOEXCEPT;

/* A forward pass without labels writing the logits, [count][classes], to `logits` (room for
 * `logits_capacity` floats, at least count * classes). train zero: inference, as
 * dfp_model_predict. train non-zero: a training pass (count must be the batch) to be followed by
 * dfp_model_backward_logits with the gradient of the caller's loss. */
dfp_status dfp_model_logits(dfp_model* model, const float* images, size_t images_length, int count, int train,
                            float* logits, size_t logits_capacity) DFP_NOEXCEPT;
/* Inference on 1 .. batch images: BatchNorm with its running statistics, no dropout. In FP32,
 * BF16 and FP16 an image's logits depend on that image alone; in INT16 a tensor's DFP16 exponent
 * is shared by the images of the pass, so an image's logits may differ in the last bits with its
 * companions. The same bits as dfp::Model::predict. */
dfp_status dfp_model_predict(dfp_model* model, const float* images, size_t images_length, int count, float* logits,
                             size_t logits_capacity) DFP_NOEXCEPT;
/* Backward from a caller's loss, after a training dfp_model_logits (or dfp_model_forward):
 * `logits_grad` is d(loss)/d(logits), [batch][classes], `length` floats (batch * classes), with the
 * loss's mean over the batch included. Fills every parameter's gradient; *finite as
 * dfp_model_backward. The built-in loss's gradient, (softmax(z) - onehot(y)) / batch in float,
 * gives dfp_model_backward's bits. */
dfp_status dfp_model_backward_logits(dfp_model* model, const float* logits_grad, size_t length,
                                     int* finite) DFP_NOEXCEPT;
/* After a backward pass of a model built with dfp_model_set_input_grad(model, 1): d(loss)/d(images)
 * of the last training batch, NCHW [batch][channels][height][width], into `out` (room for
 * `capacity` floats, at least that many). */
dfp_status dfp_model_input_grad(const dfp_model* model, float* out, size_t capacity) DFP_NOEXCEPT;

/* ---- parameters and buffers (after the build) -----------------------------------------------
 * Every parameter, then every buffer (BatchNorm running statistics), as a view of the model's own
 * memory: no copy. Names and layouts are PyTorch's: "<layer>.weight", "<layer>.bias",
 * "<layer>.running_mean", "<layer>.running_var"; a convolution's weight is
 * [out_channels][in_channels / groups][kernel][kernel], a linear layer's [out_features][in_features]
 * (inputs in flatten's (c, h, w) order), biases and BatchNorm tensors [channels]; row-major and
 * contiguous. Parameters are the FP32 master values the optimizer updates, whatever the precision.
 * The view's pointers (name, data, grad) stay valid while the model lives.
 *
 * Writing: values written through `data` reach the computation after dfp_model_weights_updated
 * (which re-quantizes the INT16 weights and re-packs the others); buffers need no call. Gradients
 * are written by backward passes and read by dfp_sgd_step. */

#define DFP_MAX_DIMS 4

typedef struct dfp_tensor_view {
  const char* name;
  int ndim;                  /* 1 .. DFP_MAX_DIMS */
  int shape[DFP_MAX_DIMS];   /* the first ndim entries; the rest are 0 */
  size_t size;               /* elements: the product of the shape */
  float* data;               /* the values */
  float* grad;               /* a parameter's gradient (after a backward pass); NULL for a buffer */
  int trainable;             /* 1: a parameter; 0: a buffer */
} dfp_tensor_view;

/* The number of views (parameters and buffers). */
dfp_status dfp_model_tensor_count(const dfp_model* model, size_t* count) DFP_NOEXCEPT;
/* The view at `index` (0 .. count - 1): parameters in graph order, then buffers. */
dfp_status dfp_model_tensor_at(const dfp_model* model, size_t index, dfp_tensor_view* view) DFP_NOEXCEPT;
/* The view named `name`; DFP_ERR_INVALID_ARGUMENT (the message lists the names) if none. */
dfp_status dfp_model_tensor(const dfp_model* model, const char* name, dfp_tensor_view* view) DFP_NOEXCEPT;
/* The one call after writing parameter values: every convolution and linear layer re-quantizes
 * and re-packs its weights from the master values. */
dfp_status dfp_model_weights_updated(dfp_model* model) DFP_NOEXCEPT;

/* ---- state files --------------------------------------------------------------------------
 * The model's tensors (every view above, with names and shapes) and its precision policy, in the
 * versioned, CRC-checked format of the trainer's checkpoints (docs/design/checkpoint-format.md);
 * a checkpoint written by `dfp train` loads too. Optimizer state is not included. */

/* Writes the state to `path` atomically: the file holds the old state or the new one. */
dfp_status dfp_model_save(dfp_model* model, const char* path) DFP_NOEXCEPT;
/* Reads `path` into the built model: every tensor of the model must be there with its shape
 * (extra tensors are ignored); the weights are then re-quantized. The model keeps the precision it
 * was built with. Errors name the file and the tensor (DFP_ERR_IO, DFP_ERR_CORRUPT_DATA). Every
 * tensor is checked before any is written: on failure the model is unchanged. */
dfp_status dfp_model_load(dfp_model* model, const char* path) DFP_NOEXCEPT;

/* ---- optimizer ------------------------------------------------------------------------------ */

typedef struct dfp_sgd dfp_sgd;

/* SGD over every parameter of the built model, with torch.optim.SGD's semantics:
 * g' = g + weight_decay * w; v = momentum * v + g'; w -= lr * (nesterov ? g' + momentum * v : v).
 * Weight decay applies to every parameter. momentum, weight_decay >= 0. */
dfp_status dfp_sgd_create(dfp_model* model, float momentum, float weight_decay, int nesterov,
                          dfp_sgd** out) DFP_NOEXCEPT;
/* Releases the optimizer (and its hold on the model). */
dfp_status dfp_sgd_destroy(dfp_sgd* sgd) DFP_NOEXCEPT;
/* One update with learning rate lr from the gradients of the last backward pass; the model's
 * weights are re-quantized (no dfp_model_weights_updated call is needed). */
dfp_status dfp_sgd_step(dfp_sgd* sgd, float lr) DFP_NOEXCEPT;

#ifdef __cplusplus
}
#endif

#endif /* DFP_DFP_H */
