// Builds the kernel table for one ISA level. The only place that maps levels to implementations.
#include "simd/kernel_table.hpp"

namespace dfp::simd {

KernelTable make_kernel_table(Isa isa, const CpuFeatures& cpu) {
  KernelTable t;
  t.isa = isa;
  // The scalar reference fills every entry; higher levels replace what they implement.
  t.max_abs = {&ref::max_abs, "max_abs_f32__ref"};
  t.dfp16_stats = {&ref::dfp16_stats, "dfp16_stats_f32__ref"};
  t.quantize = {&ref::quantize, "quantize_f32_dfp16__ref"};
  t.quantize2 = {&ref::quantize2, "quantize2_f32_dfp16__ref"};
  t.dequantize = {&ref::dequantize, "dequantize_dfp16_f32__ref"};
  t.interleave = {&ref::interleave, "interleave_s16__ref"};
  t.conv_s16_pixel = {&ref::conv_s16_pixel, "conv_s16s16f32_pixel__ref"};
  t.conv_s16_pair = {&ref::conv_s16_pair, "conv_s16s16f32_pair__ref"};
  t.pair_row_l1 = {&ref::pair_row_l1, "pair_row_l1_s16__ref"};
  t.relu_fwd = {&ref::relu_fwd, "relu_fwd_f32__ref"};
  t.relu_bwd = {&ref::relu_bwd, "relu_bwd_f32__ref"};
  t.add = {&ref::add, "add_f32__ref"};
  t.add_relu = {&ref::add_relu, "add_relu_f32__ref"};
  t.shift_lanes = {&ref::shift_lanes, "shift_lanes_f32__ref"};
  t.to_blocked = {&ref::to_blocked, "to_blocked_f32__ref"};
  t.from_blocked = {&ref::from_blocked, "from_blocked_f32__ref"};
  t.sgd_update = {&ref::sgd_update, "sgd_update_f32__ref"};
  t.bn_scale_shift = {&ref::bn_scale_shift, "bn_scale_shift_f32__ref"};
  t.bn_moments = {&ref::bn_moments, "bn_moments_f32__ref"};
  t.bn_bwd_sums_s16 = {&ref::bn_bwd_sums_s16, "bn_bwd_sums_s16__ref"};
  t.bn_bwd_sums_f32 = {&ref::bn_bwd_sums_f32, "bn_bwd_sums_f32__ref"};
  t.bn_bwd_apply_s16 = {&ref::bn_bwd_apply_s16, "bn_bwd_apply_s16__ref"};
  t.bn_bwd_apply_f32 = {&ref::bn_bwd_apply_f32, "bn_bwd_apply_f32__ref"};
  t.to_bf16 = {&ref::to_bf16, "cvt_f32_bf16__ref"};
  t.to_fp16 = {&ref::to_fp16, "cvt_f32_fp16__ref"};
  t.bf16_to_f32 = {&ref::bf16_to_f32, "cvt_bf16_f32__ref"};
  t.fp16_to_f32 = {&ref::fp16_to_f32, "cvt_fp16_f32__ref"};
  t.round_bf16 = {&ref::round_bf16, "round_f32_bf16__ref"};
  t.round_fp16 = {&ref::round_fp16, "round_f32_fp16__ref"};
  t.conv_f32 = {&ref::make_conv_f32, "conv_f32__ref"};
  t.linear_f32 = {&ref::make_linear_f32, "inner_product_f32__ref"};
  t.conv_bf16 = {&ref::make_conv_bf16, "conv_bf16__none_rounded_operands_on_conv_f32"};
  if (isa >= Isa::avx2) {
    // From avx2 up, oneDNN's primitives: oneDNN picks its own JIT level from the CPU (or
    // ONEDNN_MAX_CPU_ISA), and its primitives report which (kernel_name()).
    t.conv_f32 = {&onednn::make_conv_f32, "conv_f32__onednn"};
    t.linear_f32 = {&onednn::make_linear_f32, "inner_product_f32__onednn"};
    t.conv_bf16 = {&onednn::make_conv_bf16, "conv_bf16bf16f32__onednn"};
  }
  if (isa == Isa::avx2) {
    t.max_abs = {&avx2::max_abs, "max_abs_f32__avx2"};
    t.dfp16_stats = {&avx2::dfp16_stats, "dfp16_stats_f32__avx2"};
    // The stochastic stream needs AES rounds: a CPU without AES-NI keeps the reference.
    if (cpu.aes) {
      t.quantize = {&avx2::quantize_aesni, "quantize_f32_dfp16__avx2_aesni"};
      t.quantize2 = {&avx2::quantize2_aesni, "quantize2_f32_dfp16__avx2_aesni"};
    }
    t.dequantize = {&avx2::dequantize, "dequantize_dfp16_f32__avx2"};
    t.interleave = {&avx2::interleave, "interleave_s16__avx2"};
    t.pair_row_l1 = {&avx2::pair_row_l1, "pair_row_l1_s16__avx2"};
    t.relu_fwd = {&avx2::relu_fwd, "relu_fwd_f32__avx2"};
    t.relu_bwd = {&avx2::relu_bwd, "relu_bwd_f32__avx2"};
    t.add = {&avx2::add, "add_f32__avx2"};
    t.add_relu = {&avx2::add_relu, "add_relu_f32__avx2"};
    t.shift_lanes = {&avx2::shift_lanes, "shift_lanes_f32__avx2"};
    t.sgd_update = {&avx2::sgd_update, "sgd_update_f32__avx2_xsimd"};
    t.bn_scale_shift = {&avx2::bn_scale_shift, "bn_scale_shift_f32__avx2"};
    t.bn_moments = {&avx2::bn_moments, "bn_moments_f32__avx2"};
    t.bn_bwd_sums_s16 = {&avx2::bn_bwd_sums_s16, "bn_bwd_sums_s16__avx2"};
    t.bn_bwd_sums_f32 = {&avx2::bn_bwd_sums_f32, "bn_bwd_sums_f32__avx2"};
    t.bn_bwd_apply_s16 = {&avx2::bn_bwd_apply_s16, "bn_bwd_apply_s16__avx2"};
    t.bn_bwd_apply_f32 = {&avx2::bn_bwd_apply_f32, "bn_bwd_apply_f32__avx2"};
    t.to_bf16 = {&avx2::to_bf16, "cvt_f32_bf16__avx2"};
    t.to_fp16 = {&avx2::to_fp16, "cvt_f32_fp16__avx2_f16c_vcvtps2ph"};
    t.bf16_to_f32 = {&avx2::bf16_to_f32, "cvt_bf16_f32__avx2"};
    t.fp16_to_f32 = {&avx2::fp16_to_f32, "cvt_fp16_f32__avx2_f16c_vcvtph2ps"};
    t.round_bf16 = {&avx2::round_bf16, "round_f32_bf16__avx2"};
    t.round_fp16 = {&avx2::round_fp16, "round_f32_fp16__avx2_f16c_vcvtps2ph"};
    // Same bits from both: VPDPWSSD where the CPU has its VEX form, else VPMADDWD + VPADDD.
    if (cpu.avx_vnni) {
      t.conv_s16_pixel = {&avxvnni::conv_s16_pixel, "conv_s16s16f32_pixel_12acc__avxvnni_vpdpwssd"};
      t.conv_s16_pair = {&avxvnni::conv_s16_pair, "conv_s16s16f32_pair_12acc__avxvnni_vpdpwssd"};
    } else {
      t.conv_s16_pixel = {&avx2::conv_s16_pixel, "conv_s16s16f32_pixel_12acc__avx2_vpmaddwd"};
      t.conv_s16_pair = {&avx2::conv_s16_pair, "conv_s16s16f32_pair_12acc__avx2_vpmaddwd"};
    }
  }
  if (isa >= Isa::avx512bw) {
    t.max_abs = {&avx512::max_abs, "max_abs_f32__avx512"};
    t.dfp16_stats = {&avx512::dfp16_stats, "dfp16_stats_f32__avx512"};
    // The stochastic stream needs AES rounds: VAES where present, else AES-NI; a CPU with
    // neither (only a masked VM) keeps the reference.
    if (cpu.vaes) {
      t.quantize = {&avx512::quantize_vaes, "quantize_f32_dfp16__avx512_vaes"};
      t.quantize2 = {&avx512::quantize2_vaes, "quantize2_f32_dfp16__avx512_vaes"};
    } else if (cpu.aes) {
      t.quantize = {&avx512::quantize_aesni, "quantize_f32_dfp16__avx512_aesni"};
      t.quantize2 = {&avx512::quantize2_aesni, "quantize2_f32_dfp16__avx512_aesni"};
    }
    t.dequantize = {&avx512::dequantize, "dequantize_dfp16_f32__avx512"};
    t.interleave = {&avx512::interleave, "interleave_s16__avx512"};
    t.pair_row_l1 = {&avx512::pair_row_l1, "pair_row_l1_s16__avx512bw"};
    t.relu_fwd = {&avx512::relu_fwd, "relu_fwd_f32__avx512"};
    t.relu_bwd = {&avx512::relu_bwd, "relu_bwd_f32__avx512"};
    t.add = {&avx512::add, "add_f32__avx512"};
    t.add_relu = {&avx512::add_relu, "add_relu_f32__avx512"};
    t.shift_lanes = {&avx512::shift_lanes, "shift_lanes_f32__avx512"};
    t.to_blocked = {&avx512::to_blocked, "to_blocked_f32__avx512"};
    t.from_blocked = {&avx512::from_blocked, "from_blocked_f32__avx512"};
    t.sgd_update = {&avx512::sgd_update, "sgd_update_f32__avx512_xsimd"};
    t.bn_scale_shift = {&avx512::bn_scale_shift, "bn_scale_shift_f32__avx512"};
    t.bn_moments = {&avx512::bn_moments, "bn_moments_f32__avx512"};
    t.bn_bwd_sums_s16 = {&avx512::bn_bwd_sums_s16, "bn_bwd_sums_s16__avx512"};
    t.bn_bwd_sums_f32 = {&avx512::bn_bwd_sums_f32, "bn_bwd_sums_f32__avx512"};
    t.bn_bwd_apply_s16 = {&avx512::bn_bwd_apply_s16, "bn_bwd_apply_s16__avx512"};
    t.bn_bwd_apply_f32 = {&avx512::bn_bwd_apply_f32, "bn_bwd_apply_f32__avx512"};
    t.to_bf16 = {&avx512::to_bf16, "cvt_f32_bf16__avx512"};
    t.to_fp16 = {&avx512::to_fp16, "cvt_f32_fp16__avx512_vcvtps2ph"};
    t.bf16_to_f32 = {&avx512::bf16_to_f32, "cvt_bf16_f32__avx512"};
    t.fp16_to_f32 = {&avx512::fp16_to_f32, "cvt_fp16_f32__avx512_vcvtph2ps"};
    t.round_bf16 = {&avx512::round_bf16, "round_f32_bf16__avx512"};
    t.round_fp16 = {&avx512::round_fp16, "round_f32_fp16__avx512_vcvtps2ph"};
    t.conv_s16_pixel = {&avx512::conv_s16_pixel_bw, "conv_s16s16f32_pixel_28acc__avx512bw_vpmaddwd"};
    t.conv_s16_pair = {&avx512::conv_s16_pair_bw, "conv_s16s16f32_pair_16acc__avx512bw_vpmaddwd"};
  }
  if (isa >= Isa::avx512vnni) {
    t.conv_s16_pixel = {&avx512vnni::conv_s16_pixel, "conv_s16s16f32_pixel_28acc__avx512vnni_vpdpwssd"};
    t.conv_s16_pair = {&avx512vnni::conv_s16_pair, "conv_s16s16f32_pair_16acc__avx512vnni_vpdpwssd"};
  }
  return t;
}

}  // namespace dfp::simd
