// The one tolerance table of the dfp test suite. Every comparison that is not bit-exact takes its
// bound from here, with the reasoning next to it.
#pragma once

#include <cmath>

namespace dfp::test {

// Integer kernels (ISA vs scalar model, any thread count): bit-exact. Tolerance 0.
inline constexpr double kExact = 0.0;

// Quantization step of a DFP16 tensor with exponent e: nearest rounding errs by at most half of
// it, stochastic and biased rounding by less than one.
inline double dfp16_step(int exponent) { return std::ldexp(1.0, exponent); }

// INT16 convolution vs an FP64 convolution of the *unquantized* FP32 operands, per output
// element: |y - ref| <= sum_j (|x_j| dw + |w_j| dx + dx dw) + |ref| * kFp32Flush
// where dx, dw are the operands' maximum rounding errors (half a step for nearest rounding).
// The FP32 part: each INT32 chain is exact; converting it and adding it into the FP32 output
// with one fused multiply-add costs at most one FP32 rounding (2^-24 relative) per flush, and
// there are at most a few dozen flushes per output in these tests.
inline constexpr double kFp32Flush = 64 * 0x1p-24;

// FP32 kernels (oneDNN vs the scalar FP32 reference): different summation orders over K terms.
// Relative L2 error bound for the test shapes (K <= ~600 terms of O(1) values).
inline constexpr double kF32RelL2 = 1e-5;

// DFP16 round trip (nearest): |dequant(quant(x)) - x| <= step/2; relative to max|x| that is
// 2^-(15 - headroom).
inline double dfp16_roundtrip_rel(int headroom) { return std::ldexp(1.0, -(15 - headroom)); }

// Stochastic rounding unbiasedness: |mean(q) - x| over n samples of a value with fraction f is
// within z * sqrt(f(1-f)/n); z = 5 makes a false failure a ~1e-6 event for the fixed seed.
inline constexpr double kStochasticZ = 5.0;

// Data-parallel training (tests/dist): N ranks averaging the gradients of B/N images each against
// one process with B images, FP32. The two compute the same sums in another order (each rank's
// mean, then the mean of the means), a relative rounding of a few 2^-24 per gradient element and
// step; over the tests' 16 SGD steps of LeNet the weights and momenta drift apart by well under
// 1e-5 relative L2.
inline constexpr double kDataParallelRelL2 = 1e-5;
// Same with the dfp16 allreduce, the weights: each rank's gradient is rounded stochastically to
// INT16 at a shared exponent with bit_width(N) headroom bits (13 magnitude bits for N = 2, 3), an
// unbiased error below 2^-13 of the bucket's largest gradient per element and step, times the
// learning rate. Measured 1.0e-3 after LeNet's 16 steps at N = 3 (the momenta, which are sums of
// gradients, differ by 2.4e-2); bound 10x.
inline constexpr double kDataParallelDfp16RelL2 = 1e-2;
// Same with BatchNorm statistics synchronised over the ranks (--sync-bn), ResNet-20, FP32: the
// per-channel moments are summed in FP64 from each rank's part, in another order than one
// process's; the rest as kDataParallelRelL2, through 20 normalisations. Measured 1.6e-6 to 3.2e-6
// for one step from the states after 0 to 4 steps (N = 2 and 3), 6.2e-6 for GoogLeNet's first
// step (N = 2); bound 5x kDataParallelRelL2's.
inline constexpr double kDataParallelSyncBnRelL2 = 5e-5;
}  // namespace dfp::test

namespace dfp::test {
// INT16 vs FP32 parameter gradients of one batch, per parameter tensor, in a network without
// kinks (conv, BN, pooling, linear): DFP16 with 13 magnitude bits perturbs each operand by up to
// 2^-13 of its tensor's maximum, measured ~3e-4 relative; bound 10x that.
inline constexpr double kInt16GradRelL2Smooth = 3e-3;
// Whole-network gradient of ResNet-20 (one batch, random data): ReLU switches near zero, amplified
// by BatchNorm's backward, perturb single BN-parameter tensors by up to ~15%, so the check is on
// the direction of the whole gradient vector (cosine similarity).
inline constexpr double kInt16GradCosineNetwork = 0.99;

// CUDA device (src/cuda/) against the CPU FP32 layers, on the small models of
// tests/common/cuda_cases.hpp: relative error of the loss, relative L2 per tensor of parameter
// gradients, SGD updates, momentum and BatchNorm running statistics.
// - Host emulation (the device's kernels and runner on the CPU in FP32, reference convolutions
//   and GEMMs in FP64): only summation order and FP64 accumulation differ from oneDNN FP32.
inline constexpr double kCudaEmulationRel = 1e-4;
// - GPU fp32 (cuDNN FMA math, cuBLAS COMPUTE_32F, TF32 off): FP32 with other summation orders
//   (split-K, Winograd/FFT algorithms): 1e-4. The GPU tests pass within it on an H100 and an
//   H200 (cuDNN 9.19).
inline constexpr double kCudaFp32Rel = 1e-4;
// - GPU fp16 (FP16 activations, gradients and weight copies, FP32 accumulation): every stored
//   tensor is rounded to 11 significant bits (unit roundoff 2^-11 = 4.9e-4), a handful of times
//   per layer; the loss stays within 1e-2, parameter gradients (through BatchNorm's backward and
//   ReLU switches near zero) within 5e-2. Derived from the unit roundoff; the GPU tests pass
//   within it on an H100 and an H200 (cuDNN 9.19).
inline constexpr double kCudaFp16LossRel = 1e-2;
inline constexpr double kCudaFp16GradRel = 5e-2;
}  // namespace dfp::test

namespace dfp::test {
// BF16/FP16 operands with FP32 accumulation vs FP32, per parameter tensor, network without kinks:
// each operand is perturbed by up to half an ulp, 2^-9 (BF16) or 2^-12 (FP16) relative; measured
// gradient errors are a few times that, bound ~10x.
inline constexpr double kBf16GradRelL2Smooth = 2e-2;
inline constexpr double kFp16GradRelL2Smooth = 3e-3;
}  // namespace dfp::test


namespace dfp::test {
// BF16 on AMX tiles vs VDPBF16PS, one training step's gradients (all parameters) of a network
// without kinks: the same exact products summed in FP32 in another order (a few 2^-24 relative
// per output), except where a difference crosses a BF16 rounding boundary of the next layer's
// input (a 2^-8 change in that element). Measured 2.7e-6 on a Xeon with AMX; bound ~40x.
inline constexpr double kAmxGradRelL2 = 1e-4;
}  // namespace dfp::test
