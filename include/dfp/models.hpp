// dfp: the model zoo, built from the public Model API.
//
// Names: lenet; resnet20, resnet32, resnet44, resnet56, resnet110 (He et al. 2016 CIFAR ResNets,
// option-A shortcuts); resnet18, resnet34, resnet50 (ImageNet stem: 7x7/2 conv + 3x3/2 max pool;
// with the suffix "c", e.g. resnet18c, a CIFAR stem: 3x3/1 conv, no pool); resnext50 and
// resnext50c (torchvision's ResNeXt-50 32x4d: grouped 3x3 convs, 32 groups); vgg11, vgg13, vgg16,
// vgg19 and vgg11bn ... vgg19bn (ImageNet classifier 4096-4096 when the input is >= 64 pixels,
// else a CIFAR-style 512 -> classes classifier); alexnet (Krizhevsky et al. 2012, with LRN);
// alexnet_tv (torchvision's AlexNet); googlenet (torchvision's Inception v1, without the auxiliary
// classifiers). Names and shapes of parameters are torchvision's, but for the exceptions that
// dfp/torch_state.hpp's name tables map. Every model takes any input size and channel count its architecture
// allows (28x28x1 Fashion-MNIST as well as 32x32x3 and 224x224x3).
#pragma once

#include <string>
#include <vector>

#include "dfp/model.hpp"

namespace dfp {

std::vector<std::string> model_names();
// Adds the named architecture (input, layers, loss) to an empty model. Throws naming the model
// and the input when the input is too small for the architecture.
void build_model(Model& m, const std::string& name, int channels, int height, int width, int classes);

}  // namespace dfp
