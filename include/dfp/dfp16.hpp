// dfp: the DFP16 number format (INT16 dynamic fixed point, Das et al., ICLR 2018).
//
// A DFP16 tensor is INT16 values i_n plus one shared signed exponent e: x_n ~= i_n * 2^e.
// The exponent comes from the tensor's largest magnitude:
//     e = floor(log2(max|x|)) - 14 + headroom
// so the largest element maps into [2^(14-headroom), 2^(15-headroom)). Headroom bits trade
// precision for a longer INT32 accumulation chain: a dot product of INT16 operands with
// magnitudes <= A and <= B can run n = (2^31-1) / (A*B*...) steps before its INT32 sum could
// overflow (see conv.hpp for the bound dfp actually uses). With the default headroom of 2 the
// operands keep 13 magnitude bits (a 14-bit signed range, as in the paper authors' own LIBXSMM
// test), and a 3x3 convolution over 64 channels flushes its INT32 sums to FP32 every few dozen
// VPDPWSSD steps instead of after every step (headroom 0 allows only 2 products).
//
// Values are always saturated to [-32767, 32767]: -32768 is never produced, nothing wraps, and
// the symmetric range keeps |i_a * i_b| <= 32767^2 so that one VPDPWSSD pair never overflows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dfp {

class Context;

enum class Rounding {
  nearest_even,  // round half to even (VCVTPS2DQ under the default MXCSR)
  stochastic,    // round up with probability equal to the fraction: unbiased; seeded and
                 // counter-based (the random number of element n depends only on seed and n)
  biased,        // LIBXSMM's BIAS_ROUND: the magnitude rounds up when its fraction >= 1/4
};
const char* rounding_name(Rounding r) noexcept;
Rounding parse_rounding(const std::string& text, const std::string& origin);

// How many shared exponents a tensor class gets in the INT16 operators. An exponent may vary
// along any dimension a pass does not reduce over: the flush that scales each INT32 partial sum
// into FP32 then takes a per-lane or per-pixel scale instead of one scalar, at no cost to the
// integer kernels.
//   tensor: one exponent per tensor (Das et al.).
//   slice:  one exponent per slice the pass keeps apart: in the forward pass, activations per
//           image and weights per output channel; in backward-data, gradients per image and
//           weights per input channel; in the weight gradient, activations and gradients per
//           image pair and 16-channel block (its kernel reads one pair of images and one block
//           of each at a time, and flushes with their scale; a fully connected layer, which
//           reduces over all images in one call, per 16-channel block over the batch). A tensor
//           two passes read with different slices is quantized once per slicing. The flat
//           quantizers below (quantize_dfp16...) always use one exponent.
//   block32, block64, block128: Block DFP, one exponent per block of that many elements along
//           each pass's reduction, as OCP Microscaling places its block scales (forward: x and w
//           across the input channels; backward-data: dy and w across the output channels; weight
//           gradient: x and dy along each image's pixels, along the batch for a fully connected
//           layer). A reduction then crosses exponents, which the INT16 kernels' flush cannot
//           follow, so a layer with a block class is emulated: operands rounded to DFP16 block by
//           block (dfp16_round_block) and summed by the FP32 operator. Nearest or biased
//           rounding; a tensor-granularity class beside a block one is rounded with one exponent.
enum class Granularity { tensor, slice, block32, block64, block128 };
const char* granularity_name(Granularity g) noexcept;
Granularity parse_granularity(const std::string& text, const std::string& origin);
// The block size of a block granularity; 0 for tensor and slice.
int granularity_block(Granularity g) noexcept;

inline constexpr int kDfpMaxHeadroom = 8;
inline constexpr int kDfpDefaultHeadroom = 2;
inline constexpr int16_t kDfpMaxInt = 32767;

// What to do with NaN or Inf in a tensor being quantized. DFP16 has no encoding for them.
enum class NonFinitePolicy {
  error,  // throw dfp::Error(numerical_error) naming the tensor and the first offending index
  count,  // report them in QuantStats::nonfinite and store 0 for them; the caller decides (the
          // trainer uses this to skip a step, like a loss scaler)
};

struct QuantOptions {
  int headroom = kDfpDefaultHeadroom;  // 0..kDfpMaxHeadroom
  Rounding rounding = Rounding::nearest_even;
  uint64_t seed = 0;                   // stochastic rounding stream
  NonFinitePolicy nonfinite = NonFinitePolicy::error;
  std::string name = "tensor";         // used in error messages
  Granularity granularity = Granularity::tensor;  // read by the INT16 operators (see Granularity)
  // Throws dfp::Error(invalid_argument) naming `origin` and this tensor where a setting is out of
  // range (the headroom). Every quantizer and every policy that carries options checks them here.
  void validate(const std::string& origin) const;
};

struct QuantStats {
  int exponent = 0;        // shared exponent e (granularity slice: the largest of the slices')
  int exponent_min = 0;    // the smallest exponent of a slice that holds a nonzero value (= exponent
                           // with one exponent, or when every value is zero)
  int32_t max_abs_int = 0; // an upper bound on max|i_n| (exact for nearest/biased rounding)
  uint64_t saturated = 0;  // elements clamped to +-32767 (possible only with headroom 0)
  uint64_t nonfinite = 0;  // NaN/Inf elements found (policy `count` only; `error` throws)
  float max_abs = 0.f;     // max|x| over the finite elements
};

// The shared exponent for a tensor whose largest finite magnitude is max_abs. An all-zero
// tensor gets exponent 0 (all values 0). Denormal maxima are handled exactly (ilogb).
int dfp16_exponent(float max_abs, int headroom) noexcept;

// max|x| over finite elements; counts non-finite ones into *nonfinite (may be null).
float max_abs(const Context& ctx, const float* x, size_t n, uint64_t* nonfinite);

// Quantizes n floats with one shared exponent computed from them. Element n's stochastic
// random number depends on (seed, n) only, so results are independent of thread count and of
// the ISA (the scalar reference and the AVX-512 kernels produce identical bits).
QuantStats quantize_dfp16(const Context& ctx, const float* src, int16_t* dst, size_t n,
                          const QuantOptions& options);
// Same, with max|src| measured by the tensor's producer (for example the optimizer's update);
// a negative or non-finite max_abs: measured here, as quantize_dfp16 does. Non-finite elements
// are counted (and refused under NonFinitePolicy::error) either way.
QuantStats quantize_dfp16_with_max_abs(const Context& ctx, const float* src, int16_t* dst, size_t n, float max_abs,
                                       const QuantOptions& options);
// Same, with a known exponent (for example from a max fused into the tensor's producer).
// `index_base` is the logical index of src[0] for the stochastic stream.
QuantStats quantize_dfp16_with_exponent(const Context& ctx, const float* src, int16_t* dst, size_t n,
                                        int exponent, const QuantOptions& options,
                                        uint64_t index_base = 0);
void dequantize_dfp16(const Context& ctx, const int16_t* src, int exponent, float* dst, size_t n);

// ---- Block DFP: one block of a tensor as a DFP16 tensor of its own --------------------------------
// n elements src[0], src[stride], ... rounded as quantize_dfp16 would round them alone (exponent
// e = dfp16_exponent(max|x|, headroom); i = x * 2^-e rounded to nearest even, or biased, and
// saturated to +-32767) and stored back as the floats i * 2^e (dst == src allowed; a zero i is
// +0, as the integer has no sign). Returns e; kDfpBlockZero for a block of zeros;
// kDfpBlockNonFinite for a block holding
// a NaN or an infinity, which is stored as NaN (the format has no encoding for either: the
// training step sees the NaN, as it does MX's NaN scale). Stochastic rounding has no block form.
inline constexpr int kDfpBlockNonFinite = 1 << 20;
inline constexpr int kDfpBlockZero = -(1 << 20);
int dfp16_round_block(const float* src, float* dst, size_t n, size_t stride, int headroom, Rounding r) noexcept;

}  // namespace dfp
