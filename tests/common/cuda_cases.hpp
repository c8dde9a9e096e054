// Small models covering every layer kind, and the comparison of the CUDA device's runner
// (src/cuda/executor.hpp, on the GPU or on its host emulation) with the CPU FP32 layers: the same
// model built twice from one seed, one batch, two training steps and an evaluation.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "dfp/loss_scale.hpp"
#include "dfp/model.hpp"
#include "dfp/optim.hpp"
#include "src/cuda/executor.hpp"
#include "tests/common/reference.hpp"

namespace dfp::test {

struct CudaCase {
  std::string name;
  int batch = 4;
  float label_smoothing = 0.f;
  bool nesterov = false;
  std::function<void(Model&)> build;  // input ... layers, without the loss
};

inline std::vector<CudaCase> cuda_cases() {
  using N = Model::Node;
  std::vector<CudaCase> v;
  // Convolutions: 3x3 (bias), stride 2, 1x1 (bias), 7x7 stride 2 on C=3; each after another conv
  // so that its backward-data pass runs too.
  v.push_back({"conv3x3", 4, 0.f, false, [](Model& m) {
                 N x = m.input(3, 10, 10);
                 x = m.conv(x, 8, 3, 1, 1, true, "c1");
                 x = m.conv(x, 12, 3, 1, 1, false, "c2");
                 m.softmax_cross_entropy(m.linear(m.flatten(x, "flat"), 5, true, "fc"));
               }});
  // Grouped: 2 -> 3 channels per group (lanes cut across blocks), then 16 -> 16 with stride 2.
  v.push_back({"conv_grouped", 3, 0.f, false, [](Model& m) {
                 N x = m.input(3, 8, 8);
                 x = m.conv(x, 6, 3, 1, 1, false, "c0");
                 x = m.conv(x, 9, 3, 1, 1, true, "g1", 3);
                 x = m.conv(x, 32, 1, 1, 0, false, "c2");
                 x = m.conv(x, 32, 3, 2, 1, false, "g3", 2);
                 m.softmax_cross_entropy(m.linear(m.flatten(x, "flat"), 5, true, "fc"));
               }});
  v.push_back({"conv_stride2", 4, 0.f, true, [](Model& m) {
                 N x = m.input(4, 11, 11);
                 x = m.conv(x, 8, 1, 1, 0, false, "c1");
                 x = m.conv(x, 16, 3, 2, 1, false, "c2");
                 m.softmax_cross_entropy(m.linear(m.flatten(x, "flat"), 5, true, "fc"));
               }});
  v.push_back({"conv1x1", 3, 0.f, false, [](Model& m) {
                 N x = m.input(16, 6, 6);
                 x = m.conv(x, 16, 3, 1, 1, false, "c1");
                 x = m.conv(x, 32, 1, 1, 0, true, "c2");
                 m.softmax_cross_entropy(m.linear(m.global_avgpool(x, "gap"), 6, true, "fc"));
               }});
  v.push_back({"conv7x7_c3", 2, 0.f, false, [](Model& m) {
                 N x = m.input(3, 16, 16);
                 x = m.conv(x, 8, 7, 2, 3, false, "c1");  // C = 3 input, like a ResNet stem
                 x = m.conv(x, 8, 7, 2, 3, true, "c2");
                 m.softmax_cross_entropy(m.linear(m.flatten(x, "flat"), 4, true, "fc"));
               }});
  // BatchNorm (20 channels: gamma/beta padded to 32 on the host) in training and evaluation.
  v.push_back({"batchnorm", 4, 0.f, false, [](Model& m) {
                 N x = m.input(3, 8, 8);
                 x = m.relu(m.batchnorm(m.conv(x, 20, 3, 1, 1, false, "c1"), "bn1"), "r1");
                 x = m.batchnorm(m.conv(x, 8, 3, 1, 1, false, "c2"), "bn2");
                 m.softmax_cross_entropy(m.linear(m.global_avgpool(x, "gap"), 6, true, "fc"));
               }});
  // Pooling: max with padding and ceil mode, max in ceil mode with a clipped last window, average.
  v.push_back({"pools", 3, 0.f, false, [](Model& m) {
                 N x = m.input(3, 9, 9);
                 x = m.conv(x, 8, 3, 1, 1, true, "c1");
                 x = m.maxpool(x, 3, 2, 1, true, "mp1");  // 9 -> 5
                 x = m.conv(x, 8, 1, 1, 0, false, "c2");
                 x = m.avgpool(x, 2, 2, 0, "ap");        // 5 -> 2
                 m.softmax_cross_entropy(m.linear(m.flatten(x, "flat"), 5, true, "fc"));
               }});
  v.push_back({"maxpool_ceil", 3, 0.f, false, [](Model& m) {
                 N x = m.input(2, 8, 8);
                 x = m.relu(m.conv(x, 6, 3, 1, 1, true, "c1"), "r1");
                 x = m.maxpool(x, 3, 2, 0, true, "mp");  // 8 -> 4, last window clipped
                 x = m.maxpool(x, 2, 2, 0, false, "mp2");
                 m.softmax_cross_entropy(m.linear(m.flatten(x, "flat"), 5, true, "fc"));
               }});
  // Local response normalisation, odd and even window sizes, strong enough to matter.
  v.push_back({"lrn", 3, 0.f, false, [](Model& m) {
                 N x = m.input(3, 6, 6);
                 x = m.conv(x, 12, 3, 1, 1, true, "c1");
                 x = m.lrn(x, 5, 0.5f, 0.75f, 1.f, "lrn5");
                 x = m.lrn(x, 4, 0.3f, 0.6f, 1.5f, "lrn4");
                 x = m.conv(x, 8, 1, 1, 0, false, "c2");
                 m.softmax_cross_entropy(m.linear(m.flatten(x, "flat"), 5, true, "fc"));
               }});
  // Linear layers (with and without bias) and label smoothing.
  v.push_back({"linear", 5, 0.1f, true, [](Model& m) {
                 N x = m.input(20, 1, 1);
                 x = m.relu(m.linear(x, 30, true, "fc1"), "r1");
                 x = m.linear(x, 17, false, "fc2");
                 m.softmax_cross_entropy(m.linear(x, 7, true, "fc"));
               }});
  // Residual blocks: identity and option-A shortcut (odd size), a node with three consumers.
  v.push_back({"residual", 4, 0.f, false, [](Model& m) {
                 N x = m.input(3, 7, 7);
                 x = m.relu(m.batchnorm(m.conv(x, 16, 3, 1, 1, false, "stem"), "stem.bn"), "stem.relu");
                 N y = m.batchnorm(m.conv(x, 16, 3, 1, 1, false, "b1.c"), "b1.bn");
                 N a = m.relu(m.add(y, x, "b1.add"), "b1.relu");
                 N z = m.batchnorm(m.conv(a, 32, 3, 2, 1, false, "b2.c"), "b2.bn");  // 7 -> 4
                 N s = m.shortcut_pad(x, 32, 2, "b2.sc");                            // 7 -> 4
                 N b = m.relu(m.add(z, s, "b2.add"), "b2.relu");
                 N c = m.add(b, m.shortcut_pad(a, 32, 2, "b3.sc"), "b3.add");
                 m.softmax_cross_entropy(m.linear(m.global_avgpool(c, "gap"), 10, true, "fc"));
               }});
  // Inception-style concat (four branches, one through a max pool) and dropout.
  v.push_back({"concat_dropout", 4, 0.f, false, [](Model& m) {
                 N x = m.input(3, 6, 6);
                 x = m.relu(m.conv(x, 8, 3, 1, 1, false, "c0"), "r0");
                 N b1 = m.conv(x, 4, 1, 1, 0, false, "b1");
                 N b2 = m.conv(x, 6, 3, 1, 1, false, "b2");
                 N b3 = m.conv(m.maxpool(x, 3, 1, 1, true, "b3.pool"), 5, 1, 1, 0, false, "b3");
                 N c = m.relu(m.concat({b1, b2, b3, x}, "cat"), "rc");
                 N f = m.dropout(m.flatten(c, "flat"), 0.3f, "drop");
                 m.softmax_cross_entropy(m.linear(m.dropout(m.relu(m.linear(f, 24, true, "fc1"), "r1"), 0.5f, "drop2"),
                                                  5, true, "fc"));
               }});
  return v;
}
// The case of that name (tests that need one particular graph name it, not its position).
inline CudaCase cuda_case(const std::string& name) {
  for (CudaCase& c : cuda_cases())
    if (c.name == name) return c;
  throw std::invalid_argument("no CUDA test case named '" + name + "'");
}

// Normal(0, 1) images in the blocked layout, labels uniform in [0, classes).
inline void case_data(const Model& m, uint32_t seed, std::vector<float>& images, std::vector<int32_t>& labels,
                      float magnitude = 1.f) {
  const TensorShape s = m.shape(0);
  std::vector<float> nchw(size_t(m.batch()) * s.c * s.h * s.w);
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, magnitude);
  for (auto& v : nchw) v = nd(g);
  images.assign(blocked_size(m.batch(), s.c, s.h, s.w), 0.f);
  to_blocked(nchw.data(), images.data(), m.batch(), s.c, s.h, s.w);
  const int classes = m.graph()[m.loss_node()].shape.c;
  labels.resize(m.batch());
  for (auto& l : labels) l = int32_t(std::uniform_int_distribution<int>(0, classes - 1)(g));
}

// Ten classes of 1x28x28 images: class k is noise plus a bright 7x7 square at position k.
inline void separable_batch(int batch, std::mt19937& g, std::vector<float>& images, std::vector<int32_t>& labels) {
  std::normal_distribution<float> nd(0.f, 0.3f);
  std::vector<float> nchw(size_t(batch) * 28 * 28);
  labels.resize(batch);
  for (int n = 0; n < batch; ++n) {
    const int k = std::uniform_int_distribution<int>(0, 9)(g);
    labels[n] = k;
    float* im = nchw.data() + size_t(n) * 784;
    for (int i = 0; i < 784; ++i) im[i] = nd(g);
    const int r0 = (k / 5) * 14 + 3, c0 = (k % 5) * 5 + 1;
    for (int r = r0; r < r0 + 7; ++r)
      for (int c = c0; c < c0 + 4; ++c) im[r * 28 + c] += 2.f;
  }
  images.assign(blocked_size(batch, 1, 28, 28), 0.f);
  to_blocked(nchw.data(), images.data(), batch, 1, 28, 28);
}

// The worst relative errors of the device against the CPU over one case.
struct CaseErrors {
  double loss = 0;        // training losses (both steps) and evaluation loss, relative
  double grad = 0;        // parameter gradients of step 1, relative L2 per tensor
  std::string grad_at;    // the tensor with the worst gradient error
  double update = 0;      // parameter changes after two SGD steps, relative L2 per tensor
  double stats = 0;       // BatchNorm running statistics after two steps, relative L2
  double momentum = 0;    // momentum buffers after two steps, relative L2
  int hits_differ = 0;    // |top-1 hits difference| over the three batches
};

// Builds `c` twice (CPU reference and the device's host copy), runs two training steps and one
// evaluation on both, and measures the differences. make_device creates the device runner from
// its host model; loss_scale != 1 runs the device with that static loss scale.
inline CaseErrors compare_case(const CudaCase& c, const Context& ctx,
                               const std::function<std::shared_ptr<cuda::Executor>(Model&, const SgdOptions&)>& make_device,
                               double loss_scale) {
  Model cpu(ctx, c.name), host(ctx, c.name);
  for (Model* m : {&cpu, &host}) {
    c.build(*m);
    // build() adds the loss without smoothing; re-declare it with this case's smoothing.
    m->softmax_cross_entropy(m->loss_node(), c.label_smoothing);
    m->build(c.batch, PrecisionPolicy{});
  }
  SgdOptions so;
  so.nesterov = c.nesterov;
  Sgd sgd(ctx, cpu, so);
  std::vector<std::vector<float>> w0;
  for (const Parameter& p : cpu.parameters()) w0.emplace_back(p.value, p.value + p.size);
  std::shared_ptr<cuda::Executor> dev = make_device(host, so);
  LossScaleOptions lo;
  if (loss_scale != 1.0) {
    lo.mode = LossScaleMode::fixed;
    lo.init_scale = loss_scale;
  }
  LossScaler scaler(lo);
  CaseErrors e;
  auto rel = [](double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-12); };
  const float lr = 0.05f;
  for (int step = 0; step < 2; ++step) {
    std::vector<float> x;
    std::vector<int32_t> y;
    case_data(cpu, 100 + step, x, y);
    const StepResult a = cpu.forward(x.data(), y.data(), c.batch, true);
    cpu.backward();
    const StepResult b = dev->train_step(x.data(), y.data(), c.batch, lr, scaler);
    e.loss = std::max(e.loss, rel(b.loss, a.loss));
    e.hits_differ += std::abs(a.correct1 - b.correct1);
    if (step == 0) {
      const auto g = dev->gradients();
      auto& ps = cpu.parameters();
      for (size_t p = 0; p < ps.size(); ++p) {
        const double r = rel_l2(g[p].data(), ps[p].grad, ps[p].size);
        if (r > e.grad) {
          e.grad = r;
          e.grad_at = ps[p].name;
        }
      }
    }
    sgd.step(lr);
  }
  std::vector<std::vector<float>> mom;
  dev->download(host, &mom);
  auto& pc = cpu.parameters();
  auto& ph = host.parameters();
  for (size_t p = 0; p < pc.size(); ++p) {
    std::vector<float> dc(pc[p].size), dh(pc[p].size);
    for (size_t i = 0; i < pc[p].size; ++i) {
      dc[i] = pc[p].value[i] - w0[p][i];
      dh[i] = ph[p].value[i] - w0[p][i];
    }
    e.update = std::max(e.update, rel_l2(dh.data(), dc.data(), dc.size()));
    e.momentum = std::max(e.momentum, rel_l2(mom[p].data(), sgd.momentum_buffers()[p].data(), pc[p].size));
  }
  auto bc = cpu.buffers();
  auto bh = host.buffers();
  for (size_t b = 0; b < bc.size(); ++b)
    e.stats = std::max(e.stats, rel_l2(bh[b].second->data(), bc[b].second->data(), bc[b].second->size()));
  // Evaluation on a partial batch, with the updated weights and statistics.
  std::vector<float> x;
  std::vector<int32_t> y;
  case_data(cpu, 200, x, y);
  const int count = std::max(1, c.batch - 1);
  const StepResult a = cpu.forward(x.data(), y.data(), count, false);
  const StepResult b = dev->evaluate(x.data(), y.data(), count);
  e.loss = std::max(e.loss, rel(b.loss, a.loss));
  e.hits_differ += std::abs(a.correct1 - b.correct1);
  return e;
}

// One line per case for the test log: what the tolerances in tolerance.hpp are measured against.
inline void print_errors(const std::string& what, const CaseErrors& e) {
  std::printf("[ measured ] %-28s loss %.2e  grad %.2e (%s)  update %.2e  momentum %.2e  stats %.2e  top1 diff %d\n",
              what.c_str(), e.loss, e.grad, e.grad_at.c_str(), e.update, e.momentum, e.stats, e.hits_differ);
}

// 40 training steps of LeNet (batch 32) on separable data through step(images, labels, count),
// a device's train_step; returns the first loss and the mean of the last five. `g` is left at
// the state after the last batch, so a caller can draw a further batch for evaluation.
struct LossCurve {
  double first = 0, last = 0;
  bool finite = true;
};
template <class Step>
LossCurve train_separable(std::mt19937& g, Step&& step) {
  LossCurve c;
  std::vector<float> x;
  std::vector<int32_t> y;
  for (int s = 0; s < 40; ++s) {
    separable_batch(32, g, x, y);
    const StepResult r = step(x.data(), y.data(), 32);
    c.finite &= std::isfinite(r.loss);
    if (s == 0) c.first = r.loss;
    if (s >= 35) c.last += r.loss / 5;
  }
  return c;
}

}  // namespace dfp::test
