// dfp: convolution and fully-connected operators, INT16 (DFP16) and FP32, all three passes.
//
// Activation layout. Every dfp convolution reads and writes FP32 activations in the blocked
// layout "nChw16c": [N][ceil(C/16)][H][W][16], channel c of pixel (h, w) at lane c % 16 of block
// c / 16. Padding lanes (c >= C) are zero on input and written as zero on output. This is the
// layout oneDNN's AVX-512 kernels prefer, and it makes every per-channel op a 16-lane vector op.
// to_blocked()/from_blocked() convert from/to plain NCHW.
//
// INT16 operators (ConvInt16, LinearInt16) follow Das et al.: FPROP y = conv(x, w), BPROP
// dx = conv_backward_data(dy, w) and WTGRAD dw = conv_backward_weights(x, dy) all take DFP16
// operands (one shared exponent per tensor) and produce FP32. INT16 products accumulate in INT32
// (VPDPWSSD) and are flushed into the FP32 result, scaled by 2^(e_a + e_b), after a chain short
// enough that the INT32 sum cannot overflow. The chain length comes from a bound on the actual
// operands (not from luck):
//   FPROP/BPROP: |partial sum| <= max|i_src| * (L1 norm of the weights a lane meets in the chain)
//                computed per 16-channel x tap unit when the weights are packed;
//   WTGRAD:      |partial sum| <= steps * 2 * max|i_x| * max|i_dy|.
// ConvStats reports the chains chosen. A verification mode recomputes every pass with an INT64
// shadow accumulator and counts the INT32 overflow events; with derived chains it is zero.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dfp/dfp16.hpp"

namespace dfp {

class Context;

struct ConvShape {
  int N = 1, C = 1, H = 1, W = 1;  // input: batch, channels, height, width
  int K = 1, R = 1, S = 1;         // output channels, kernel height, kernel width
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;

  int OH() const noexcept { return (H + 2 * pad_h - R) / stride_h + 1; }
  int OW() const noexcept { return (W + 2 * pad_w - S) / stride_w + 1; }
  // 2*N*K*C*R*S*OH*OW: the multiply-adds of one pass, counted as two operations each.
  double ops() const noexcept;
  // Throws dfp::Error(invalid_argument) naming `what` and the offending field.
  void validate(const std::string& what) const;
};

// ---- the blocked activation layout -------------------------------------------------------
constexpr int kChannelBlock = 16;
inline int channel_blocks(int c) noexcept { return (c + kChannelBlock - 1) / kChannelBlock; }
inline size_t blocked_size(int n, int c, int h, int w) noexcept {
  return size_t(n) * channel_blocks(c) * h * w * kChannelBlock;
}
void to_blocked(const float* nchw, float* blocked, int n, int c, int h, int w);
void from_blocked(const float* blocked, float* nchw, int n, int c, int h, int w);
// The same on the context's threads and vector kernels (the same bits): for tensors of megabytes,
// such as the feature maps a model hands to its caller.
void to_blocked(const Context& ctx, const float* nchw, float* blocked, int n, int c, int h, int w);
void from_blocked(const Context& ctx, const float* blocked, float* nchw, int n, int c, int h, int w);

// ---- INT16 ---------------------------------------------------------------------------------

// Numerics of one INT16 operator. Weights, activations (x) and output gradients (dy) each get a
// headroom and a rounding mode.
struct DfpConvOptions {
  QuantOptions weights{kDfpDefaultHeadroom, Rounding::nearest_even, 0, NonFinitePolicy::error, "weights"};
  QuantOptions activations{kDfpDefaultHeadroom, Rounding::nearest_even, 0, NonFinitePolicy::error, "activations"};
  QuantOptions gradients{kDfpDefaultHeadroom, Rounding::nearest_even, 0, NonFinitePolicy::error, "gradients"};
  // 0: chains from the bound (safe). > 0: force this many VPDPWSSD steps per chain (tests and
  // benchmarks only).
  int chain_override = 0;
  // Run every pass through the reference kernel with INT64 shadow accumulators and count INT32
  // overflow events into ConvStats::overflow_events (slow; for verification).
  bool verify = false;
  // false: backward_data() will not be called (a network's first layer), so buffers that only it
  // uses are not allocated. true: they are allocated at construction, never on a pass.
  bool input_gradient = true;
};

struct ConvStats {
  // Last quantization of each operand as the forward pass (x, w) and backward-data (dy) read it;
  // with Granularity::slice the exponent is the largest slice's and exponent_min the smallest's.
  QuantStats x, w, dy;
  // VPDPWSSD steps per INT32 chain for the operands' largest values; a kernel call whose own
  // operands allow more runs longer (its rows' maxima, and in the weight gradient dy's row norms).
  int chain_fwd = 0, chain_bwd = 0, chain_wgrad = 0;
  int64_t overflow_events = 0;   // verification mode only
};

class ConvInt16 {
 public:
  ConvInt16(const Context& ctx, const ConvShape& shape, const DfpConvOptions& options = {},
            std::string name = "conv");
  ~ConvInt16();
  ConvInt16(ConvInt16&&) noexcept;
  ConvInt16& operator=(ConvInt16&&) noexcept;

  const ConvShape& shape() const noexcept;
  const ConvStats& stats() const noexcept;
  // Name of the micro-kernel the forward and backward-data passes run on this context.
  const char* kernel_name() const noexcept;
  // Name of the micro-kernel the weight-gradient pass runs on this context.
  const char* weight_gradient_kernel_name() const noexcept;
  // The exponents per slice with Granularity::slice, from the last quantization: x's per image
  // and w's per output channel (forward), dy's per image (backward-data; without that pass,
  // options.input_gradient false, the weight gradient's, one per plane of the blocked dy [N][K
  // blocks of 16], the two images of a pair alike, as stats().dy then describes). Empty for a
  // class with one exponent
  // (stats().x/.w/.dy.exponent).
  const std::vector<int>& input_exponents() const noexcept;
  const std::vector<int>& weight_exponents() const noexcept;
  const std::vector<int>& grad_output_exponents() const noexcept;

  // Training step whose stochastic-rounding streams the next quantizations use: the stream of
  // element n is a function of (seed, step, n), so steps do not reuse random numbers and a resumed
  // run reproduces an uninterrupted one.
  void set_step(uint64_t step);
  // FP32 weights [K][C][R][S] -> one DFP16 tensor, packed once into the forward layout (pairs
  // along C) and the backward-data layout (pairs along K). Call once per weight version.
  void set_weights(const float* w_kcrs);
  // Same, with max|w| measured by the weights' producer (the optimizer's update pass), which saves
  // the pass that finds it. Negative or non-finite: measured here (non-finite weights are then
  // reported as set_weights() reports them).
  void set_weights_with_max_abs(const float* w_kcrs, float max_abs);
  // x (nChw16c) -> DFP16 in the padded forward layout and in the batch-pair layout that the
  // weight gradient reads (kept until the next call: it is the saved activation).
  void quantize_input(const float* x);
  // dy (nChw16c, K channels, OH x OW) -> DFP16 in the layouts of both backward passes (only the
  // weight gradient's when options.input_gradient is false: it then reads dy in place).
  void quantize_grad_output(const float* dy);
  // Same, with max|x| (max|dy|) measured by the producer of the tensor, which saves the pass that
  // finds it; the exponent follows from it as usual. A negative or non-finite max_abs: measured here.
  // plane_max_abs (optional, for Granularity::slice): max|x| (max|dy|) of every plane, image n
  // and channel block b of 16, at [n * blocks + b]; with it the slices' exponents need no pass
  // over the tensor either. Null, or any negative or non-finite entry: measured here.
  void quantize_input_with_max_abs(const float* x, float max_abs, const float* plane_max_abs = nullptr);
  void quantize_grad_output_with_max_abs(const float* dy, float max_abs, const float* plane_max_abs = nullptr);
  // Producer-fused input: instead of reading an FP32 x, the operator asks the producer for x a
  // span at a time -- pixels [w0, w0 + count) of row h of channel block b of image n, count <= 128,
  // written as count x 16 floats into `out` -- and quantizes each span while it is in L1. So x
  // never exists in memory as FP32 (a BatchNorm with its ReLU writes the next conv's DFP16 input
  // directly). max_abs: max|x| over the whole tensor, known before any span is asked for (the
  // exponent comes from it); plane_max_abs as for quantize_input_with_max_abs. Spans are asked
  // for from the context's threads concurrently, each once (with Granularity::slice activations
  // and no plane_max_abs, twice: the first time for each plane's max|x|). The result has the same
  // bits as quantize_input_with_max_abs on the tensor the spans make up. Not available where
  // accepts_input_spans() is false (a layer with C < 16 whose kernel columns are unfolded gathers
  // x across columns).
  // quantized (optional) computes the same span already quantized at 2^exponent, rounded to
  // nearest (ties to even), into `out` (count x 16 INT16, x's layout), with its largest |q| in
  // max_q. It returns false where an element would reach |q| = 32767 or is not finite; that span
  // is then asked of fn. Its bits must be those of quantizing fn's span. It is asked only where x
  // is rounded to nearest.
  using InputSpanFn = void (*)(void* producer, int n, int b, int h, int w0, int count, float* out);
  using InputQuantSpanFn = bool (*)(void* producer, int n, int b, int h, int w0, int count, int exponent,
                                    int16_t* out, int32_t* max_q);
  static constexpr int kInputSpanPixels = 128;
  bool accepts_input_spans() const noexcept;
  void quantize_input_spans(InputSpanFn fn, void* producer, float max_abs, const float* plane_max_abs = nullptr,
                            InputQuantSpanFn quantized = nullptr);
  // Producer-fused output gradient: dy asked of its producer a span at a time (as
  // quantize_input_spans asks for x; a span fn returns the largest magnitude it wrote, NaN never
  // winning), so dy never exists in memory as FP32 (a BatchNorm's backward computes dx, this
  // conv's dy, span by span). estimate: the producer's estimate of max|dy| (an upper bound
  // usually is), whose exponent the spans are first quantized at; the operator takes max|dy| from
  // the spans as they come and, where its exponent is not the estimate's, asks for every span
  // again and quantizes at that. So the result always has the bits of
  // quantize_grad_output_with_max_abs on the tensor the spans make up, with its max|dy|; the
  // estimate decides only how often the spans are computed twice. Returns whether the estimate's
  // exponent held (once over the spans). Not available where accepts_grad_output_spans() is false
  // (Granularity::slice gradients). quantized (optional) computes the same span already quantized,
  // as InputQuantSpanFn does, and returns its largest magnitude as fn does; it returns a negative
  // value where an element would reach |q| = 32767 or is not finite, and that span is then asked
  // of fn. It is asked only where dy is rounded to nearest.
  using GradSpanFn = float (*)(void* producer, int n, int b, int h, int w0, int count, float* out);
  using GradQuantSpanFn = float (*)(void* producer, int n, int b, int h, int w0, int count, int exponent,
                                    int16_t* out, int32_t* max_q);
  bool accepts_grad_output_spans() const noexcept;
  bool quantize_grad_output_spans(GradSpanFn fn, void* producer, float estimate, GradQuantSpanFn quantized = nullptr);
  // Where x's producer can compute x again, span by span, from the end of the forward pass until
  // backward_weights() (a BatchNorm does, from the DFP16 input its own backward keeps), the batch-
  // pair copy of x that the weight gradient reads need not persist between the passes: from this
  // call on, quantize_input*() writes only the forward copy, and backward_weights() asks `again`
  // for every span once more (from the context's threads, as quantize_input_spans asks) and
  // quantizes the spans into the workspace, at the forward's exponents. workspace_bytes() grows by
  // that copy; call this before reading it. The spans must be the values the forward pass
  // quantized (the same bits), and the rounding of x deterministic; otherwise the weight gradient
  // is that of other values. Returns false, changing nothing, where the copy is not of that form:
  // stochastic rounding of x, unfolded columns, a strided 1x1 layer's subsampled copy, a 1x1
  // layer on 1x1 pixels.
  // again_pairs (optional) computes the same spans already quantized: images n and n + 1 (images
  // 2; images 1: image n alone, and zeros for the pair's second) at 2^exponent, rounded to
  // nearest (ties to even), straight into the batch-pair layout (count x 16 channels x 2 images
  // INT16, each channel's two images side by side), with each image's largest |q| in max_q[0]
  // and max_q[1]. It returns false where an element would reach |q| = 32767 or is not finite;
  // those spans are then asked of `again`. Its bits must be those of quantizing again's spans.
  // It is asked only where x is rounded to nearest.
  using InputPairSpanFn = bool (*)(void* producer, int n, int images, int b, int h, int w0, int count, int exponent,
                                   int16_t* out, int32_t* max_q);
  bool recompute_input_pairs(InputSpanFn again, void* producer, InputPairSpanFn again_pairs = nullptr);
  // Where recompute_input_pairs() is in effect: computes the weight gradient's copy of x now,
  // after quantize_grad_output() (it lives beside dy's copies), so that a caller can time it apart
  // from the weight-gradient pass; backward_weights() computes it itself when this was not called
  // since quantize_grad_output(). Returns whether it computed the copy: false, doing nothing,
  // where recompute_input_pairs() is not in effect.
  bool recompute_input();

  // Transient buffers -- x's padded copy for the forward pass; dy's two copies, the weight-
  // gradient partials and (with one weight exponent) backward-data's packing of the weights for
  // the backward passes -- are owned by the operator unless the caller gives
  // it a shared region of workspace_bytes() (64-byte aligned; nullptr: own them again), as the
  // Model does for all its layers. Then x's and dy's copies share bytes and hold only between the
  // quantize_* call and the passes that follow it: forward() right after quantize_input(), and
  // backward_data()/backward_weights() right after quantize_grad_output(), with no other user of
  // the region in between (this operator's own passes out of that order are reported; another
  // user of the region in between is the caller's to prevent).
  size_t workspace_bytes() const noexcept;
  void use_workspace(void* region);

  // The three passes on the quantized operands. Outputs are FP32.
  void forward(float* y);                  // y: nChw16c [N][K/16][OH][OW][16]
  // The forward pass straight into DFP16, for a consumer that keeps the output only in DFP16
  // (the Model does not: a BatchNorm's statistics need its FP32 values): each value of y, plus
  // bias[k] where a bias is given (y + b, as a separate pass adds it), is quantized at
  // 2^exponent as QuantizeFn does (element i of y draws stochastic rounding's number i of
  // `seed`), while the kernel's output is still in L1, so FP32 y is never written. out.y gets the
  // bits of forward(), the bias, then quantize() at that exponent. The counters cover all of y:
  // the saturated and non-finite elements and max|q|, which says whether `exponent` is max|y|'s
  // (exponent_holds). The operands stay as they are: forward() may follow (a caller whose
  // exponent was not max|y|'s runs forward() and quantizes y itself).
  struct QuantizedOutput {
    int16_t* y = nullptr;  // nChw16c, as forward()'s y
    int exponent = 0;
    Rounding rounding = Rounding::nearest_even;
    uint64_t seed = 0;
    const float* bias = nullptr;  // [K rounded up to 16], padding 0; null: none
    // Set by the pass:
    uint64_t saturated = 0, nonfinite = 0;
    int32_t max_abs_q = 0;
    // Whether `exponent` is dfp16_exponent(max|y|, headroom), every value finite. max|q| is
    // max|y| * 2^-exponent rounded, and the rounding is monotonic, so max|q| strictly inside
    // (2^(14 - headroom), 2^(15 - headroom)) means max|y| is in that exponent's binade; at either
    // end the rounding may have crossed it, and this says false.
    bool exponent_holds(int headroom) const noexcept {
      const int64_t lo = int64_t{1} << (14 - headroom), hi = std::min<int64_t>(int64_t{1} << (15 - headroom), 32767);
      return nonfinite == 0 && max_abs_q > lo && max_abs_q < hi;
    }
  };
  void forward_quantized(QuantizedOutput& out);
  // dx: nChw16c [N][C/16][H][W][16]. A layer with C < 16 runs with its kernel columns unfolded
  // into the channels and folds dx back from an unfolded copy (allocated at construction unless
  // options.input_gradient is false, in which case this call is an error). accumulate: add the
  // gradient to what dx holds instead of overwriting it (the first flush of every INT32 chain
  // adds), so a second consumer's part of an input gradient is summed without a pass of its own;
  // the sum then runs in flush order, dx + c1 + c2 ..., rather than dx + (c1 + c2 ...).
  void backward_data(float* dx, bool accumulate = false);
  void backward_weights(float* dw_kcrs);   // dw: [K][C][R][S]

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Fully connected: y[n][k] = sum_c x[n][c] * w[k][c], row-major, all three passes in INT16.
class LinearInt16 {
 public:
  LinearInt16(const Context& ctx, int batch, int in_features, int out_features,
              const DfpConvOptions& options = {}, std::string name = "linear");
  ~LinearInt16();
  LinearInt16(LinearInt16&&) noexcept;
  LinearInt16& operator=(LinearInt16&&) noexcept;

  const ConvStats& stats() const noexcept;
  void set_step(uint64_t step);                // see ConvInt16::set_step
  void set_weights(const float* w_kc);         // [out][in]
  void quantize_input(const float* x_nc);      // [batch][in]
  void quantize_grad_output(const float* dy_nk);
  void forward(float* y_nk);
  void backward_data(float* dx_nc);
  void backward_weights(float* dw_kc);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- FP32 baseline -------------------------------------------------------------------------
// oneDNN FP32 primitives (jit:avx512_core on this class of CPU), or the scalar reference when the
// context's level is `ref`. Same layouts as the INT16 operators.
class ConvF32 {
 public:
  ConvF32(const Context& ctx, const ConvShape& shape, std::string name = "conv");
  ~ConvF32();
  ConvF32(ConvF32&&) noexcept;
  ConvF32& operator=(ConvF32&&) noexcept;

  const char* kernel_name() const noexcept;
  void set_weights(const float* w_kcrs);
  void forward(const float* x, float* y);
  void backward_data(const float* dy, float* dx);
  // x and dy as forward() and backward_data() of this step read them: where oneDNN wants other
  // layouts, the copies those calls made of the same buffers are used again (one reorder per
  // tensor and step), so the buffers must not change in between, unless inputs_rewritten() says
  // they did.
  void backward_weights(const float* x, const float* dy, float* dw_kcrs);
  // The buffers forward() and backward_data() read have been written since (a weight gradient on
  // operands of its own, as MX's): the next backward_weights() reads x and dy as they are now.
  void inputs_rewritten();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class LinearF32 {
 public:
  LinearF32(const Context& ctx, int batch, int in_features, int out_features, std::string name = "linear");
  ~LinearF32();
  LinearF32(LinearF32&&) noexcept;
  LinearF32& operator=(LinearF32&&) noexcept;

  const char* kernel_name() const noexcept;
  void set_weights(const float* w_kc);
  void forward(const float* x_nc, float* y_nk);
  void backward_data(const float* dy_nk, float* dx_nc);
  // As ConvF32's: x and dy as this step's forward() and backward_data() read them, unless
  // inputs_rewritten() says the buffers have been written since.
  void backward_weights(const float* x_nc, const float* dy_nk, float* dw_kc);
  void inputs_rewritten();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dfp
