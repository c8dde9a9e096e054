// The convolution layers dfp is measured on: ResNet-20 (CIFAR-10, batch 128), ResNet-18c (CIFAR,
// batch 64), ResNet-50 and VGG-16 (ImageNet 224x224). One table for the benchmarks and any test
// that wants realistic shapes.
//
// Names follow <net>_b<N>_c<C>_k<K>_in<H>_<R>x<S>_s<stride>; bench/ratio_table.py parses C, R and
// S back out of them, so keep the pattern (fully connected layers: <net>_fc_b<N>_c<C>_k<K>).
#pragma once

#include <array>

#include "dfp/conv.hpp"

namespace dfp::bench {

struct ConvLayer {
  const char* name;
  ConvShape shape;
};

// Square input, square kernel, equal stride and padding on both axes.
constexpr ConvShape square_conv(int n, int c, int k, int hw, int r, int stride, int pad) {
  ConvShape s;
  s.N = n;
  s.C = c;
  s.H = hw;
  s.W = hw;
  s.K = k;
  s.R = r;
  s.S = r;
  s.stride_h = stride;
  s.stride_w = stride;
  s.pad_h = pad;
  s.pad_w = pad;
  return s;
}

inline constexpr std::array<ConvLayer, 52> kConvLayers = {{
    // ResNet-20, CIFAR-10, batch 128. The first layer (C = 3) has no input-gradient pass in
    // training, but its other two passes are benchmarked: three channels fill few reduction lanes.
    // (The backward-data row runs an operator built with an input gradient; the weight-gradient
    // row one built without, as a model builds a first layer.)
    {"resnet20_b128_c3_k16_in32_3x3_s1", square_conv(128, 3, 16, 32, 3, 1, 1)},
    {"resnet20_b128_c16_k16_in32_3x3_s1", square_conv(128, 16, 16, 32, 3, 1, 1)},
    {"resnet20_b128_c16_k32_in32_3x3_s2", square_conv(128, 16, 32, 32, 3, 2, 1)},
    {"resnet20_b128_c32_k32_in16_3x3_s1", square_conv(128, 32, 32, 16, 3, 1, 1)},
    {"resnet20_b128_c32_k64_in16_3x3_s2", square_conv(128, 32, 64, 16, 3, 2, 1)},
    {"resnet20_b128_c64_k64_in8_3x3_s1", square_conv(128, 64, 64, 8, 3, 1, 1)},
    // ResNet-50 (torchvision v1.5: the stride on the 3x3), ImageNet, batch 32: every distinct
    // convolution, stage by stage (the downsampling 1x1 shortcuts where a stage begins).
    {"resnet50_b32_c3_k64_in224_7x7_s2", square_conv(32, 3, 64, 224, 7, 2, 3)},
    {"resnet50_b32_c64_k64_in56_1x1_s1", square_conv(32, 64, 64, 56, 1, 1, 0)},
    {"resnet50_b32_c64_k64_in56_3x3_s1", square_conv(32, 64, 64, 56, 3, 1, 1)},
    {"resnet50_b32_c64_k256_in56_1x1_s1", square_conv(32, 64, 256, 56, 1, 1, 0)},
    {"resnet50_b32_c256_k64_in56_1x1_s1", square_conv(32, 256, 64, 56, 1, 1, 0)},
    {"resnet50_b32_c256_k128_in56_1x1_s1", square_conv(32, 256, 128, 56, 1, 1, 0)},
    {"resnet50_b32_c128_k128_in56_3x3_s2", square_conv(32, 128, 128, 56, 3, 2, 1)},
    {"resnet50_b32_c256_k512_in56_1x1_s2", square_conv(32, 256, 512, 56, 1, 2, 0)},
    {"resnet50_b32_c128_k512_in28_1x1_s1", square_conv(32, 128, 512, 28, 1, 1, 0)},
    {"resnet50_b32_c512_k128_in28_1x1_s1", square_conv(32, 512, 128, 28, 1, 1, 0)},
    {"resnet50_b32_c128_k128_in28_3x3_s1", square_conv(32, 128, 128, 28, 3, 1, 1)},
    {"resnet50_b32_c512_k256_in28_1x1_s1", square_conv(32, 512, 256, 28, 1, 1, 0)},
    {"resnet50_b32_c256_k256_in28_3x3_s2", square_conv(32, 256, 256, 28, 3, 2, 1)},
    {"resnet50_b32_c512_k1024_in28_1x1_s2", square_conv(32, 512, 1024, 28, 1, 2, 0)},
    {"resnet50_b32_c256_k1024_in14_1x1_s1", square_conv(32, 256, 1024, 14, 1, 1, 0)},
    {"resnet50_b32_c1024_k256_in14_1x1_s1", square_conv(32, 1024, 256, 14, 1, 1, 0)},
    {"resnet50_b32_c256_k256_in14_3x3_s1", square_conv(32, 256, 256, 14, 3, 1, 1)},
    {"resnet50_b32_c1024_k512_in14_1x1_s1", square_conv(32, 1024, 512, 14, 1, 1, 0)},
    {"resnet50_b32_c512_k512_in14_3x3_s2", square_conv(32, 512, 512, 14, 3, 2, 1)},
    {"resnet50_b32_c1024_k2048_in14_1x1_s2", square_conv(32, 1024, 2048, 14, 1, 2, 0)},
    {"resnet50_b32_c512_k2048_in7_1x1_s1", square_conv(32, 512, 2048, 7, 1, 1, 0)},
    {"resnet50_b32_c2048_k512_in7_1x1_s1", square_conv(32, 2048, 512, 7, 1, 1, 0)},
    {"resnet50_b32_c512_k512_in7_3x3_s1", square_conv(32, 512, 512, 7, 3, 1, 1)},
    // ResNet-18c (torchvision's ResNet-18 with a 3x3 stride-1 stem and no max pool: the CIFAR
    // form train_bench and bench/torch_compile_bench.py train), batch 64: every distinct
    // convolution, stage by stage (the downsampling 1x1 shortcuts where a stage begins).
    {"resnet18c_b64_c3_k64_in32_3x3_s1", square_conv(64, 3, 64, 32, 3, 1, 1)},
    {"resnet18c_b64_c64_k64_in32_3x3_s1", square_conv(64, 64, 64, 32, 3, 1, 1)},
    {"resnet18c_b64_c64_k128_in32_3x3_s2", square_conv(64, 64, 128, 32, 3, 2, 1)},
    {"resnet18c_b64_c64_k128_in32_1x1_s2", square_conv(64, 64, 128, 32, 1, 2, 0)},
    {"resnet18c_b64_c128_k128_in16_3x3_s1", square_conv(64, 128, 128, 16, 3, 1, 1)},
    {"resnet18c_b64_c128_k256_in16_3x3_s2", square_conv(64, 128, 256, 16, 3, 2, 1)},
    {"resnet18c_b64_c128_k256_in16_1x1_s2", square_conv(64, 128, 256, 16, 1, 2, 0)},
    {"resnet18c_b64_c256_k256_in8_3x3_s1", square_conv(64, 256, 256, 8, 3, 1, 1)},
    {"resnet18c_b64_c256_k512_in8_3x3_s2", square_conv(64, 256, 512, 8, 3, 2, 1)},
    {"resnet18c_b64_c256_k512_in8_1x1_s2", square_conv(64, 256, 512, 8, 1, 2, 0)},
    {"resnet18c_b64_c512_k512_in4_3x3_s1", square_conv(64, 512, 512, 4, 3, 1, 1)},
    // VGG-16, ImageNet, batch 32: every distinct convolution (a 224x224 pass takes about a
    // quarter of a second here, so these rows run few iterations).
    {"vgg16_b32_c3_k64_in224_3x3_s1", square_conv(32, 3, 64, 224, 3, 1, 1)},
    {"vgg16_b32_c64_k64_in224_3x3_s1", square_conv(32, 64, 64, 224, 3, 1, 1)},
    {"vgg16_b32_c64_k128_in112_3x3_s1", square_conv(32, 64, 128, 112, 3, 1, 1)},
    {"vgg16_b32_c128_k128_in112_3x3_s1", square_conv(32, 128, 128, 112, 3, 1, 1)},
    {"vgg16_b32_c128_k256_in56_3x3_s1", square_conv(32, 128, 256, 56, 3, 1, 1)},
    {"vgg16_b32_c256_k256_in56_3x3_s1", square_conv(32, 256, 256, 56, 3, 1, 1)},
    {"vgg16_b32_c256_k512_in28_3x3_s1", square_conv(32, 256, 512, 28, 3, 1, 1)},
    {"vgg16_b32_c512_k512_in28_3x3_s1", square_conv(32, 512, 512, 28, 3, 1, 1)},
    {"vgg16_b32_c512_k512_in14_3x3_s1", square_conv(32, 512, 512, 14, 3, 1, 1)},
    // Fully connected layers, batch 32: 1x1 over 1x1 images (dfp's GEMM mode). Named without the
    // _in<H>_<R>x<S>_s<stride> part: they are not convolutions, and no conv target applies.
    {"resnet50_fc_b32_c2048_k1000", square_conv(32, 2048, 1000, 1, 1, 1, 0)},
    {"googlenet_fc_b32_c1024_k1000", square_conv(32, 1024, 1000, 1, 1, 1, 0)},
    {"vgg16_fc_b32_c4096_k4096", square_conv(32, 4096, 4096, 1, 1, 1, 0)},
}};

}  // namespace dfp::bench
