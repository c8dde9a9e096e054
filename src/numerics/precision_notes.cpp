// What a run prints about its precisions on this machine (precision_notes): the kernels each one
// runs here, taken from the context's kernel table. Apart from precision.cpp, whose policy, names
// and parsing need no context.
#include <string>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "dfp/precision.hpp"
#include "simd/kernel_table.hpp"
#include "src/numerics/precision_internal.hpp"

namespace dfp {

namespace {
// Where each pass's DFP16 exponents vary (Granularity), e.g. "w per output channel (forward) and
// per input channel (backward-data), x per image (forward), dy per tensor; in the weight gradient
// x per image pair and 16-channel block, dy per tensor". A fully connected layer's weight gradient
// reduces over every pair in one call, so its sliced operands take one exponent per block there.
std::string int16_exponents_note(const DfpConvOptions& o) {
  const int bw = granularity_block(o.weights.granularity), bx = granularity_block(o.activations.granularity),
            bdy = granularity_block(o.gradients.granularity);
  if (bw || bx || bdy) {
    auto cls = [](const char* what, int b) {
      return std::string(what) + (b ? " per block of " + std::to_string(b) : std::string(" per tensor"));
    };
    return "Block DFP, EMULATED: " + cls("w", bw) + ", " + cls("x", bx) + ", " + cls("dy", bdy) +
           " along each pass's reduction; operands rounded to DFP16 per block, summed by the FP32 operators";
  }
  const bool w = o.weights.granularity == Granularity::slice, x = o.activations.granularity == Granularity::slice,
             dy = o.gradients.granularity == Granularity::slice;
  const char* pairs = " per image pair and 16-channel block";
  std::string s = w ? "w per output channel (forward) and per input channel (backward-data)" : "w per tensor";
  s += x ? ", x per image (forward)" : ", x per tensor";
  s += dy ? ", dy per image (backward-data)" : ", dy per tensor";
  if (x || dy) {
    s += std::string("; in the weight gradient x") + (x ? pairs : " per tensor") + ", dy" + (dy ? pairs : " per tensor");
    s += " (fully connected layers: per 16-channel block over the batch)";
  }
  return s;
}
// What a BF16 convolution runs on: what the kernel table builds for a representative convolution
// (the one dfp info shows), not what the CPU's feature flags suggest, since oneDNN also follows
// ONEDNN_MAX_CPU_ISA and has no fast BF16 code without AVX-512 (the layers then round the
// operands and run the FP32 convolutions).
std::string bf16_convolution_note(const Context& ctx) {
  ConvShape probe;
  probe.N = 32; probe.C = 64; probe.H = 28; probe.W = 28; probe.K = 64; probe.R = 3; probe.S = 3; probe.pad_h = 1; probe.pad_w = 1;
  const auto bf = ctx.kernels().conv_bf16.fn(ctx.threads(), probe, "probe");
  if (!bf)
    return "operands rounded to BF16 on the FP32 oneDNN convolutions (oneDNN has no fast BF16 convolution on this "
           "CPU), exact products, FP32 accumulation";
  const std::string impl = bf->impl_forward();
  if (impl.find("amx") != std::string::npos)
    return "native: oneDNN BF16 convolutions on AMX tiles (TDPBF16PS) where oneDNN takes them, else VDPBF16PS; FP32 "
           "accumulation and outputs (dfp info and --profile name each pass's kernel)";
  if (impl.find("avx512_core_bf16") != std::string::npos)
    return "native: oneDNN BF16 convolutions (VDPBF16PS), FP32 accumulation and outputs";
  return "EMULATED: oneDNN BF16 convolutions (" + impl + ") without AVX512_BF16 instructions (this CPU has none, or "
         "ONEDNN_MAX_CPU_ISA hides them): oneDNN emulates VDPBF16PS bit for bit, several times slower";
}
}  // namespace

std::vector<std::string> precision_notes(const PrecisionPolicy& policy, const Context& ctx) {
  const std::vector<Precision> used = detail::used_precisions(policy);
  std::vector<std::string> out;
  const CpuFeatures& cpu = ctx.cpu();
  const bool jit = ctx.isa() != Isa::ref;
  for (Precision p : used) {
    switch (p) {
      case Precision::fp32:
        out.push_back(std::string("fp32: ") + ctx.kernels().conv_f32.name + ", " + ctx.kernels().linear_f32.name +
                      (jit ? "" : " (scalar reference: DFP_ISA=ref)"));
        break;
      case Precision::int16:
        if (granularity_block(policy.dfp.weights.granularity) || granularity_block(policy.dfp.activations.granularity) ||
            granularity_block(policy.dfp.gradients.granularity))
          out.push_back(std::string("int16: DFP16 blocks rounded by ") + ctx.kernels().dfp16_lanes.name + ", " +
                        ctx.kernels().dfp16_rows.name + "; FP32 convolutions " + ctx.kernels().conv_f32.name);
        else
          out.push_back(std::string("int16: DFP16 operands, INT32 chains flushed into FP32; kernels ") +
                        ctx.kernels().conv_s16_pixel.name + ", " + ctx.kernels().conv_s16_pair.name);
        out.push_back("int16: shared exponents " + int16_exponents_note(policy.dfp));
        break;
      case Precision::bf16: {
        const ClassFormats f = policy.class_formats(p);
        const bool all_bf16 = f.all(FloatFormat::bf16);
        std::string line = "bf16: formats w/x/dy " + f.names() + "; ";
        if (!jit)
          line += "EMULATED: operands rounded to BF16, products accumulated in FP32 by the scalar reference (slow)";
        else if (!all_bf16)
          line += "mixed formats: operands rounded, FP32 oneDNN convolutions (exact products, FP32 accumulation)";
        else
          line += bf16_convolution_note(ctx);
        out.push_back(line);
        break;
      }
      case Precision::fp16: {
        const ClassFormats f = policy.class_formats(p);
        out.push_back("fp16: formats w/x/dy " + f.names() + "; EMULATED: " + (cpu.avx512fp16 ? "" : "this CPU has no FP16 arithmetic; ") +
                      "operands rounded to IEEE half (" + ctx.kernels().round_fp16.name +
                      "), exact products accumulated in FP32 as on tensor cores" +
                      (f.gradients == FloatFormat::fp16 ? "; weight gradients stored as FP16" : ""));
        break;
      }
      case Precision::mxfp8:
      case Precision::mxfp6:
      case Precision::mxfp4:
      case Precision::mxint8: {
        const ClassFormats f = policy.class_formats(p);
        out.push_back(std::string(precision_name(p)) + ": OCP MX, elements w/x/dy " + f.names() +
                      " in blocks of 32 along each pass's reduction with E8M0 scales (forward: x and w along the "
                      "input channels; backward-data: dy and w along the output channels; weight gradient: x and dy "
                      "along the pixels of each image); EMULATED (" + ctx.kernels().mx_lanes.name + ", " +
                      ctx.kernels().mx_rows.name + "), exact products accumulated in FP32");
        break;
      }
      case Precision::posit16:
      case Precision::posit16es2: {
        const ClassFormats f = policy.class_formats(p);
        out.push_back(std::string(precision_name(p)) + ": formats w/x/dy " + f.names() + "; EMULATED: operands rounded to " +
                      "posit16 (" + ctx.kernels().round_posit16.name + "), products accumulated in FP32 (no quire)");
        break;
      }
      case Precision::fp8: {
        const ClassFormats f = policy.class_formats(p);
        out.push_back("fp8: formats w/x/dy " + f.names() + ", scaling " + policy.fp8.text() +
                      " (scaling,amax history,margin,overflow); EMULATED: operands rounded to OFP8 at power-of-two "
                      "scales (" + ctx.kernels().round_fp8.name + "), exact products accumulated in FP32");
        break;
      }
    }
  }
  return out;
}

}  // namespace dfp
