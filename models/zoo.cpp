// The model zoo, built from the public Model API only.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dfp/models.hpp"
#include "dfp/status.hpp"

namespace dfp {
namespace {

using Node = Model::Node;

// Conv2d, BatchNorm named `bn` ("<name>.bn" if empty) with `eps`, and a ReLU.
Node conv_bn_relu(Model& m, Node x, int k, int r, int s, int p, const std::string& name, bool relu = true,
                  int groups = 1, const std::string& bn = "", double eps = 1e-5) {
  x = m.conv(x, k, r, s, p, false, name, groups);
  x = m.batchnorm(x, bn.empty() ? name + ".bn" : bn, eps);
  return relu ? m.relu(x, name + ".relu") : x;
}

void lenet(Model& m, int c, int h, int w, int classes) {
  Node x = m.input(c, h, w);
  x = m.relu(m.conv(x, 6, 5, 1, 2, true, "conv1"), "relu1");
  x = m.maxpool(x, 2, 2, 0, false, "pool1");
  x = m.relu(m.conv(x, 16, 5, 1, 0, true, "conv2"), "relu2");
  x = m.maxpool(x, 2, 2, 0, false, "pool2");
  x = m.flatten(x, "flatten");
  x = m.relu(m.linear(x, 120, true, "fc1"), "relu3");
  x = m.relu(m.linear(x, 84, true, "fc2"), "relu4");
  m.softmax_cross_entropy(m.linear(x, classes, true, "fc"));
}

// He et al. 2016, CIFAR: 3 stages of n basic blocks, 16/32/64 channels, option-A shortcuts.
void resnet_cifar(Model& m, int depth, int c, int h, int w, int classes) {
  const int n = (depth - 2) / 6;
  Node x = m.input(c, h, w);
  x = conv_bn_relu(m, x, 16, 3, 1, 1, "conv1");
  int in_c = 16;
  for (int stage = 0; stage < 3; ++stage) {
    const int planes = 16 << stage;
    for (int b = 0; b < n; ++b) {
      const int stride = (stage > 0 && b == 0) ? 2 : 1;
      const std::string p = "layer" + std::to_string(stage + 1) + "." + std::to_string(b);
      Node y = conv_bn_relu(m, x, planes, 3, stride, 1, p + ".conv1");
      y = conv_bn_relu(m, y, planes, 3, 1, 1, p + ".conv2", false);
      Node sc = (stride != 1 || in_c != planes) ? m.shortcut_pad(x, planes, stride, p + ".shortcut") : x;
      x = m.relu(m.add(y, sc, p + ".add"), p + ".relu");
      in_c = planes;
    }
  }
  x = m.global_avgpool(x, "avgpool");
  m.softmax_cross_entropy(m.linear(x, classes, true, "fc"));
}

// torchvision ResNet-18/34 (basic) and ResNet-50 (bottleneck, stride on the 3x3: "v1.5"); with
// groups > 1, torchvision's ResNeXt-50 (Xie et al. 2017): the bottleneck's 3x3 conv is grouped and
// its width is planes * width_per_group / 64 * groups (32x4d: twice ResNet-50's). Parameters and
// buffers have torchvision's names: conv1, bn1, layerS.B.convI / .bnI, layerS.B.downsample.0 / .1, fc.
void resnet_imagenet(Model& m, int depth, bool cifar_stem, int c, int h, int w, int classes, int groups = 1,
                     int width_per_group = 64) {
  const bool bottleneck = depth >= 50;
  const std::vector<int> blocks = depth == 18 ? std::vector<int>{2, 2, 2, 2} : std::vector<int>{3, 4, 6, 3};
  const int expansion = bottleneck ? 4 : 1;
  Node x = m.input(c, h, w);
  if (cifar_stem) {
    x = conv_bn_relu(m, x, 64, 3, 1, 1, "conv1", true, 1, "bn1");
  } else {
    x = conv_bn_relu(m, x, 64, 7, 2, 3, "conv1", true, 1, "bn1");
    x = m.maxpool(x, 3, 2, 1, false, "maxpool");
  }
  int in_c = 64;
  for (int stage = 0; stage < 4; ++stage) {
    const int planes = 64 << stage;
    for (int b = 0; b < blocks[stage]; ++b) {
      const int stride = (stage > 0 && b == 0) ? 2 : 1;
      const std::string p = "layer" + std::to_string(stage + 1) + "." + std::to_string(b);
      Node y;
      if (bottleneck) {
        const int width = planes * width_per_group / 64 * groups;
        y = conv_bn_relu(m, x, width, 1, 1, 0, p + ".conv1", true, 1, p + ".bn1");
        y = conv_bn_relu(m, y, width, 3, stride, 1, p + ".conv2", true, groups, p + ".bn2");
        y = conv_bn_relu(m, y, planes * 4, 1, 1, 0, p + ".conv3", false, 1, p + ".bn3");
      } else {
        y = conv_bn_relu(m, x, planes, 3, stride, 1, p + ".conv1", true, 1, p + ".bn1");
        y = conv_bn_relu(m, y, planes, 3, 1, 1, p + ".conv2", false, 1, p + ".bn2");
      }
      Node sc = x;
      if (stride != 1 || in_c != planes * expansion)
        sc = conv_bn_relu(m, x, planes * expansion, 1, stride, 0, p + ".downsample.0", false, 1,
                          p + ".downsample.1");
      x = m.relu(m.add(y, sc, p + ".add"), p + ".relu");
      in_c = planes * expansion;
    }
  }
  x = m.global_avgpool(x, "avgpool");
  m.softmax_cross_entropy(m.linear(x, classes, true, "fc"));
}

// Simonyan & Zisserman; torchvision layout. Inputs >= 64 pixels get the ImageNet classifier
// (features at 7x7 -- 224 pixels, or pooled to it, see below -- flatten, 4096-4096-classes, dropout 0.5);
// smaller inputs drop max pools that would shrink the map below 1 pixel and use GAP + one linear
// layer (the usual CIFAR VGG).
void vgg(Model& m, int depth, bool bn, int c, int h, int w, int classes) {
  std::vector<std::vector<int>> cfg;
  switch (depth) {
    case 11: cfg = {{64}, {128}, {256, 256}, {512, 512}, {512, 512}}; break;
    case 13: cfg = {{64, 64}, {128, 128}, {256, 256}, {512, 512}, {512, 512}}; break;
    case 16: cfg = {{64, 64}, {128, 128}, {256, 256, 256}, {512, 512, 512}, {512, 512, 512}}; break;
    default: cfg = {{64, 64}, {128, 128}, {256, 256, 256, 256}, {512, 512, 512, 512}, {512, 512, 512, 512}}; break;
  }
  Node x = m.input(c, h, w);
  int idx = 0, hh = h, ww = w;
  for (size_t stage = 0; stage < cfg.size(); ++stage) {
    for (int k : cfg[stage]) {
      const std::string p = "features." + std::to_string(idx++);
      x = m.conv(x, k, 3, 1, 1, true, p);  // torchvision keeps the conv bias with BN too
      if (bn) x = m.batchnorm(x, p + ".bn");
      x = m.relu(x, p + ".relu");
    }
    if (std::min(hh, ww) >= 2) {
      x = m.maxpool(x, 2, 2, 0, false, "pool" + std::to_string(stage + 1));
      hh /= 2;
      ww /= 2;
    }
  }
  if (std::min(h, w) >= 64) {
    // torchvision pools the features adaptively to 7x7 before the classifier. A map that is k
    // times 7 on both sides (224, 448, ... pixels) is exactly a k x k average pool; any other map
    // is flattened as it is (as AlexNet and the original Caffe VGG do), so the first classifier
    // layer then has 512 * H * W inputs rather than torchvision's 512 * 7 * 7.
    if (hh != 7 && hh == ww && hh % 7 == 0) x = m.avgpool(x, hh / 7, hh / 7, 0, "avgpool");
    x = m.flatten(x, "flatten");
    x = m.dropout(m.relu(m.linear(x, 4096, true, "classifier.0"), "classifier.relu0"), 0.5f, "classifier.drop0");
    x = m.dropout(m.relu(m.linear(x, 4096, true, "classifier.3"), "classifier.relu1"), 0.5f, "classifier.drop1");
    m.softmax_cross_entropy(m.linear(x, classes, true, "fc"));
  } else {
    x = m.global_avgpool(x, "avgpool");
    m.softmax_cross_entropy(m.linear(x, classes, true, "fc"));
  }
}

// Krizhevsky et al. 2012, single tower, with local response normalisation after conv1 and conv2.
void alexnet(Model& m, int c, int h, int w, int classes) {
  DFP_CHECK(h >= 63 && w >= 63, Status::invalid_argument, "model alexnet: input must be at least 63x63");
  Node x = m.input(c, h, w);
  x = m.relu(m.conv(x, 96, 11, 4, 2, true, "conv1"), "relu1");
  x = m.maxpool(m.lrn(x, 5, 1e-4f, 0.75f, 2.f, "lrn1"), 3, 2, 0, false, "pool1");
  x = m.relu(m.conv(x, 256, 5, 1, 2, true, "conv2"), "relu2");
  x = m.maxpool(m.lrn(x, 5, 1e-4f, 0.75f, 2.f, "lrn2"), 3, 2, 0, false, "pool2");
  x = m.relu(m.conv(x, 384, 3, 1, 1, true, "conv3"), "relu3");
  x = m.relu(m.conv(x, 384, 3, 1, 1, true, "conv4"), "relu4");
  x = m.relu(m.conv(x, 256, 3, 1, 1, true, "conv5"), "relu5");
  x = m.maxpool(x, 3, 2, 0, false, "pool5");
  x = m.flatten(x, "flatten");
  x = m.relu(m.linear(m.dropout(x, 0.5f, "drop6"), 4096, true, "fc6"), "relu6");
  x = m.relu(m.linear(m.dropout(x, 0.5f, "drop7"), 4096, true, "fc7"), "relu7");
  m.softmax_cross_entropy(m.linear(x, classes, true, "fc"));
}

// torchvision's AlexNet (Krizhevsky 2014, "one weird trick": 64-192-384-256-256 channels, no LRN),
// with torchvision's layer names; the last Linear is "fc" (torchvision's classifier.6). torchvision
// pools the features adaptively to 6x6: a map that is k times 6 on both sides (224 pixels: 6x6) is
// exactly a k x k average pool; any other map is flattened as it is.
void alexnet_tv(Model& m, int c, int h, int w, int classes) {
  DFP_CHECK(h >= 63 && w >= 63, Status::invalid_argument, "model alexnet_tv: input must be at least 63x63");
  Node x = m.input(c, h, w);
  x = m.relu(m.conv(x, 64, 11, 4, 2, true, "features.0"), "features.1");
  x = m.maxpool(x, 3, 2, 0, false, "features.2");
  x = m.relu(m.conv(x, 192, 5, 1, 2, true, "features.3"), "features.4");
  x = m.maxpool(x, 3, 2, 0, false, "features.5");
  x = m.relu(m.conv(x, 384, 3, 1, 1, true, "features.6"), "features.7");
  x = m.relu(m.conv(x, 256, 3, 1, 1, true, "features.8"), "features.9");
  x = m.relu(m.conv(x, 256, 3, 1, 1, true, "features.10"), "features.11");
  x = m.maxpool(x, 3, 2, 0, false, "features.12");
  const TensorShape t = m.shape(x);
  if (t.h != 6 && t.h == t.w && t.h % 6 == 0) x = m.avgpool(x, t.h / 6, t.h / 6, 0, "avgpool");
  x = m.flatten(x, "flatten");
  x = m.relu(m.linear(m.dropout(x, 0.5f, "classifier.0"), 4096, true, "classifier.1"), "classifier.2");
  x = m.relu(m.linear(m.dropout(x, 0.5f, "classifier.3"), 4096, true, "classifier.4"), "classifier.5");
  m.softmax_cross_entropy(m.linear(x, classes, true, "fc"));
}

// GoogLeNet (Inception v1) as torchvision builds it (BN after every conv, no auxiliary
// classifiers, and torchvision's 3x3 kernel in the "5x5" branch), so its parameter count can be
// checked against torchvision's published 6,624,904.
// torchvision's BasicConv2d: Conv2d without bias, BatchNorm with eps 1e-3, ReLU.
Node basic_conv(Model& m, Node x, int k, int r, int s, int p, const std::string& name) {
  return conv_bn_relu(m, x, k, r, s, p, name, true, 1, "", 1e-3);
}
Node inception(Model& m, Node x, int c1, int c3r, int c3, int c5r, int c5, int pp, const std::string& p) {
  Node b1 = basic_conv(m, x, c1, 1, 1, 0, p + ".branch1");
  Node b2 = basic_conv(m, basic_conv(m, x, c3r, 1, 1, 0, p + ".branch2.0"), c3, 3, 1, 1, p + ".branch2.1");
  Node b3 = basic_conv(m, basic_conv(m, x, c5r, 1, 1, 0, p + ".branch3.0"), c5, 3, 1, 1, p + ".branch3.1");
  Node b4 = basic_conv(m, m.maxpool(x, 3, 1, 1, true, p + ".branch4.pool"), pp, 1, 1, 0, p + ".branch4.1");
  return m.concat({b1, b2, b3, b4}, p + ".concat");
}

// Max pools that would not fit the map (small inputs such as 28x28) are left out.
Node pool_if_fits(Model& m, Node x, int k, int s, const std::string& name) {
  const TensorShape t = m.shape(x);
  return (t.h >= k && t.w >= k) ? m.maxpool(x, k, s, 0, true, name) : x;
}

void googlenet(Model& m, int c, int h, int w, int classes) {
  Node x = m.input(c, h, w);
  x = basic_conv(m, x, 64, 7, 2, 3, "conv1");
  x = pool_if_fits(m, x, 3, 2, "maxpool1");
  x = basic_conv(m, x, 64, 1, 1, 0, "conv2");
  x = basic_conv(m, x, 192, 3, 1, 1, "conv3");
  x = pool_if_fits(m, x, 3, 2, "maxpool2");
  x = inception(m, x, 64, 96, 128, 16, 32, 32, "inception3a");
  x = inception(m, x, 128, 128, 192, 32, 96, 64, "inception3b");
  x = pool_if_fits(m, x, 3, 2, "maxpool3");
  x = inception(m, x, 192, 96, 208, 16, 48, 64, "inception4a");
  x = inception(m, x, 160, 112, 224, 24, 64, 64, "inception4b");
  x = inception(m, x, 128, 128, 256, 24, 64, 64, "inception4c");
  x = inception(m, x, 112, 144, 288, 32, 64, 64, "inception4d");
  x = inception(m, x, 256, 160, 320, 32, 128, 128, "inception4e");
  x = pool_if_fits(m, x, 2, 2, "maxpool4");
  x = inception(m, x, 256, 160, 320, 32, 128, 128, "inception5a");
  x = inception(m, x, 384, 192, 384, 48, 128, 128, "inception5b");
  x = m.dropout(m.global_avgpool(x, "avgpool"), 0.2f, "dropout");
  m.softmax_cross_entropy(m.linear(x, classes, true, "fc"));
}

}  // namespace

std::vector<std::string> model_names() {
  return {"lenet",    "resnet20", "resnet32", "resnet44", "resnet56", "resnet110", "resnet18", "resnet34",
          "resnet50", "resnet18c", "resnet34c", "resnet50c", "resnext50", "resnext50c", "vgg11", "vgg13",
          "vgg16",    "vgg19",    "vgg11bn",  "vgg13bn",  "vgg16bn",  "vgg19bn",   "alexnet",   "alexnet_tv",
          "googlenet"};
}

void build_model(Model& m, const std::string& name, int c, int h, int w, int classes) {
  DFP_CHECK(classes >= 2, Status::invalid_argument, "model " + name + ": classes expected >= 2");
  for (int d : {20, 32, 44, 56, 110})
    if (name == "resnet" + std::to_string(d)) return resnet_cifar(m, d, c, h, w, classes);
  for (int d : {18, 34, 50}) {
    if (name == "resnet" + std::to_string(d)) return resnet_imagenet(m, d, false, c, h, w, classes);
    if (name == "resnet" + std::to_string(d) + "c") return resnet_imagenet(m, d, true, c, h, w, classes);
  }
  if (name == "resnext50") return resnet_imagenet(m, 50, false, c, h, w, classes, 32, 4);
  if (name == "resnext50c") return resnet_imagenet(m, 50, true, c, h, w, classes, 32, 4);
  for (int d : {11, 13, 16, 19}) {
    if (name == "vgg" + std::to_string(d)) return vgg(m, d, false, c, h, w, classes);
    if (name == "vgg" + std::to_string(d) + "bn") return vgg(m, d, true, c, h, w, classes);
  }
  if (name == "lenet") return lenet(m, c, h, w, classes);
  if (name == "alexnet") return alexnet(m, c, h, w, classes);
  if (name == "alexnet_tv") return alexnet_tv(m, c, h, w, classes);
  if (name == "googlenet") return googlenet(m, c, h, w, classes);
  std::string known;
  for (const auto& n : model_names()) known += (known.empty() ? "" : ", ") + n;
  fail(Status::invalid_argument, "unknown model '" + name + "'; known models: " + known);
}

}  // namespace dfp
