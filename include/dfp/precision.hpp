// dfp: the precision policy, the one home of the number formats a model computes in.
//
// A PrecisionPolicy says which precision each Conv2d/Linear runs in (a default plus per-layer
// overrides by name), the storage format of each tensor class of the 16-bit float precisions,
// and the DFP16 numerics (headroom, rounding) of each class. Model::build resolves it once into a
// LayerPrecision per layer; layers never read the policy. Its text forms (flags, log line,
// checkpoint fields) are parsed and printed here only.
//
// Adding a format: a Precision value, its row in src/numerics/precision.cpp's table (name, operand
// format), and its weighted-layer operation (make_weighted_op, src/layers/weighted_ops.cpp).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dfp/conv.hpp"
#include "dfp/float16.hpp"
#include "dfp/float8.hpp"

namespace dfp {

class Context;

// int16: DFP16 operands, INT32 chains flushed into FP32 (VPDPWSSD).
// bf16:  BF16 operands (x, w, dy), FP32 accumulation and outputs: oneDNN's BF16 primitives
//        (VDPBF16PS, or oneDNN's bit-identical emulation on AVX-512 CPUs without AVX512_BF16).
// fp16:  IEEE half operands (F16C rounding: overflow to inf, subnormals), FP32 accumulation as
//        on tensor cores; weight gradients stored as FP16. This CPU class has no FP16
//        arithmetic: the numerics are emulated exactly (products of halves are exact in FP32).
// fp8:   OFP8 operands (dfp/float8.hpp), the usual recipe: e4m3 weights and activations, e5m2
//        gradients, each tensor at a power-of-two scale (Float8Options), FP32 accumulation;
//        emulated exactly (products of FP8 values are exact in FP32).
// mxfp8, mxfp6, mxfp4, mxint8: OCP Microscaling v1.0 (dfp/float8.hpp): blocks of 32 elements
//        along each pass's reduction dimension share an E8M0 scale, so each pass quantizes its
//        operands again along its own axis (x along the channels in the forward pass and along
//        the pixels in the weight gradient; w along its input channels forward and its output
//        channels backward; dy along the channels backward and the pixels in the weight
//        gradient). Elements: mxfp8 e4m3 (x, w) and e5m2 (dy), mxfp6 e2m3 and e3m2, mxfp4 e2m1,
//        mxint8 int8; exact products accumulated in FP32.
// posit16, posit16es2: posit16 operands (dfp/posit.hpp; 1 or 2 exponent bits), unscaled, their
//        products accumulated in FP32 (no quire).
enum class Precision { fp32, int16, bf16, fp16, fp8, mxfp8, mxfp6, mxfp4, mxint8, posit16, posit16es2 };
const char* precision_name(Precision p) noexcept;
// Throws invalid_argument naming `origin` and the accepted names.
Precision parse_precision(const std::string& text, const std::string& origin);
// The 16-bit float format a float precision (bf16, fp16) rounds its operands to; fp32 for the
// others.
FloatFormat operand_format(Precision p) noexcept;
// Whether p is one of the OCP Microscaling precisions (block scales along each pass's reduction).
bool is_mx(Precision p) noexcept;

// How an 8-bit float tensor is scaled before rounding (q(x) = fp8(x * 2^s) * 2^-s):
//   none:    s = 0 (loss scaling keeps the gradients in range, as for fp16);
//   current: s from this tensor's max|x| (float8_scale_exponent);
//   delayed: s from the largest max|x| the class's last `amax_history` tensors of this layer had,
//            this one's recorded after it is rounded (NVIDIA Transformer Engine's DelayedScaling
//            with amax_compute_algo "max"); the first tensor, with no history, takes its own.
enum class Float8Scaling : uint8_t { none, current, delayed };
const char* float8_scaling_name(Float8Scaling s) noexcept;
Float8Scaling parse_float8_scaling(const std::string& text, const std::string& origin);

// The 8-bit float settings of a policy: Transformer Engine's DelayedScaling defaults (history
// 1024, margin 0) with OFP8's saturating conversion.
struct Float8Options {
  Float8Scaling scaling = Float8Scaling::delayed;
  int amax_history = 1024;  // 1..kFloat8MaxHistory
  int margin = 0;           // s is lowered by this many binades: headroom for growth, 0..kFloat8MaxMargin
  Overflow overflow = Overflow::saturate;
  // "delayed,1024,0,saturate", the form of the checkpoint field and the log.
  std::string text() const;
  static Float8Options parse(const std::string& text, const std::string& origin);
  void validate(const std::string& origin) const;
  bool operator==(const Float8Options&) const = default;
};
inline constexpr int kFloat8MaxHistory = 1 << 20;
inline constexpr int kFloat8MaxMargin = 64;

// The storage format of each tensor class of a layer.
struct ClassFormats {
  FloatFormat weights = FloatFormat::fp32, activations = FloatFormat::fp32, gradients = FloatFormat::fp32;
  // Every class in format f.
  bool all(FloatFormat f) const noexcept { return weights == f && activations == f && gradients == f; }
  // "weights/activations/gradients", e.g. "fp16/bf16/bf16".
  std::string names() const;
};

// A policy resolved for one layer (PrecisionPolicy::for_layer): everything a Conv2d, Linear or
// BatchNorm needs to choose its arithmetic, once, when the model is built.
struct LayerPrecision {
  Precision precision = Precision::fp32;
  // bf16/fp16: the class formats of the policy; fp32 in every class otherwise.
  ClassFormats formats;
  // Headroom, rounding and stochastic seed per class and the INT16 chain settings: the policy's.
  DfpConvOptions options;
  // How the classes in an 8-bit format are scaled: the policy's.
  Float8Options fp8;

  // `options` named after `layer` (error messages name "layer.weights" ...), each class with a
  // stochastic stream of its own.
  DfpConvOptions options_for(const std::string& layer) const;
  // Operands rounded to a smaller format (bf16, fp16, fp8, MX, posit16), FP32 accumulation.
  bool is_float() const noexcept { return operand_format(precision) != FloatFormat::fp32; }
  // BF16 in all three classes: the form BF16-operand kernels (the table's conv_bf16) run.
  bool all_bf16() const noexcept {
    return is_float() && formats.all(FloatFormat::bf16);
  }
};

// Which precision each Conv2d/Linear runs in, and the DFP16 numerics of the INT16 ones.
struct PrecisionPolicy {
  Precision precision = Precision::fp32;
  // Per-layer overrides: glob patterns ('*' and '?') on layer names, first match wins.
  // Example: {{"conv1", fp32}, {"fc", fp32}} keeps the first conv and the classifier in FP32.
  std::vector<std::pair<std::string, Precision>> overrides;
  DfpConvOptions dfp;  // headroom and rounding per tensor class (weights, activations, gradients)

  // Float precisions (bf16, fp16): the storage format of each tensor class; unset = the
  // layer's precision. Rounding per class is dfp.{weights,activations,gradients}.rounding
  // (nearest_even or stochastic; biased is DFP16-only).
  std::optional<FloatFormat> weights_format, activations_format, gradients_format;
  // The scaling of the classes a layer stores in an 8-bit format (e4m3, e5m2).
  Float8Options fp8;

  using ClassFormats = dfp::ClassFormats;

  // The precision of the layer named `layer_name`: the first override whose pattern matches it,
  // else `precision`.
  Precision resolve(const std::string& layer_name) const;
  // Everything the layer named `layer_name` computes with.
  LayerPrecision for_layer(const std::string& layer_name) const;
  // The formats a layer of precision p (bf16, fp16 or fp8) stores its weights, activations and
  // gradients in: the precision's own format (fp8: e4m3, with e5m2 gradients) where no class
  // format is set.
  ClassFormats class_formats(Precision p) const;
  // Whether some layer or class may store a tensor in an 8-bit format (fp8's settings apply).
  bool uses_float8() const;
  // Whether `pattern` (an override's) matches `layer_name`.
  static bool matches(const std::string& pattern, const std::string& layer_name);
  // Throws naming `origin` when a setting does not fit its precision (biased rounding on a float
  // format, a class format under an fp32/int16-only policy).
  void validate(const std::string& origin) const;
  // One line per setting, for logs and metrics.
  std::string describe() const;
  // Parses "conv1=fp32,fc=fp32" style override lists; throws naming `origin` on bad syntax.
  static std::vector<std::pair<std::string, Precision>> parse_overrides(const std::string& text,
                                                                         const std::string& origin);
  // The policy as named text fields (a checkpoint's meta: precision, overrides, formats,
  // headroom, rounding; fp8 where uses_float8()), and back. from_fields throws naming `origin` and the field:
  // corrupt_data for a missing or malformed field, invalid_argument for an unknown name (of a
  // precision, format or rounding); "precision" is required, the others default to the
  // policy's defaults.
  std::map<std::string, std::string> fields() const;
  static PrecisionPolicy from_fields(const std::map<std::string, std::string>& fields, const std::string& origin);
};

// How each precision a policy uses runs on this context's CPU, one line each: the kernels, and
// whether the format is native or emulated (BF16 without AVX512_BF16, FP16 on any CPU without
// AVX512_FP16 arithmetic). Printed once at the start of training and by `dfp info --precision`.
std::vector<std::string> precision_notes(const PrecisionPolicy& policy, const Context& ctx);

}  // namespace dfp
