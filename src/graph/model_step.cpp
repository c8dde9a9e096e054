// The training step of a model: the layers' forward pass, the built-in softmax cross-entropy,
// and the backward pass with loss scaling.
//
// Gradients at nodes read by several layers (residual branch points, Inception inputs) are sums:
// backward runs in reverse construction order; the first consumer writes a node's gradient, later
// ones write into that node's own accumulation buffer, which is then added in. Nodes with one
// consumer need no extra buffer or pass.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"
#include "src/core/atomic_max.hpp"
#include "src/graph/model_impl.hpp"

namespace dfp {

// The layers' forward pass on `count` images; the loss node's act then holds the logits.
void Model::Impl::run_layers(const float* images, int count, bool train) {
  DFP_CHECK(built, Status::invalid_argument, "model '" + name + "': forward() before build()");
  DFP_CHECK(count >= 1 && count <= batch, Status::invalid_argument,
            "model '" + name + "': batch of " + std::to_string(count) + " images, planned for 1.." + std::to_string(batch));
  DFP_CHECK(!train || count == batch, Status::invalid_argument,
            "model '" + name + "': training batches must be full (" + std::to_string(batch) +
                " images; BatchNorm statistics would include padding), got " + std::to_string(count));
  have_training_forward = false;
  have_input_grad = false;
  const TensorShape& is = nodes[0].shape;
  const size_t per_image = is.blocked_elements() / size_t(batch);
  const size_t given = per_image * count;  // the rest of the planned batch: zeros
  // A NaN or Inf pixel is refused here, in every precision: a ReLU or a max pool would map it
  // to a finite value, so the logits would look plausible where torch's are NaN. The same pass
  // measures max|x|, which the first layer then takes (an INT16 one derives its exponent from
  // it instead of reading the batch once more: 103 MB at 224x224, batch 32).
  std::atomic<size_t> first_bad{given};
  std::atomic<float> input_max{0.f};
  const auto max_abs = ctx.kernels().max_abs.fn;
  model::for_chunks(ctx, per_image * batch, [&](size_t b, size_t e) {
    if (b < given) {
      const size_t end = std::min(e, given);
      std::memcpy(nodes[0].act + b, images + b, (end - b) * sizeof(float));
      uint64_t nonfinite = 0;
      atomic_max(input_max, max_abs(images + b, end - b, &nonfinite));
      if (nonfinite) {
        size_t i = b;
        while (std::fabs(images[i]) <= std::numeric_limits<float>::max()) ++i;
        for (size_t seen = first_bad.load(); i < seen && !first_bad.compare_exchange_weak(seen, i);) {
        }
      }
    }
    if (e > given) std::memset(nodes[0].act + std::max(b, given), 0, (e - std::max(b, given)) * sizeof(float));
  });
  if (const size_t i = first_bad.load(); i < given)
    fail(Status::numerical_error,
         "model '" + name + "': input image " + std::to_string(i / per_image) + " of " + std::to_string(count) +
             " holds a non-finite value (" + std::to_string(images[i]) + " at element " +
             std::to_string(i % per_image) + " of the image); expected finite values");
  nodes[0].act_max = input_max.load();
  model::StepInfo st{count, train, step, train && sample_step()};
  if (train && statistics_sum) st.statistics_sum = &statistics_sum;
  st.first_image = batch_offset;
  const bool timed = profiling && train;  // evaluation passes are not profiled
  st.timed = timed;
  for (size_t i = 1; i < nodes.size(); ++i) {
    NodeInfo& n = nodes[i];
    xs.clear();
    for (int j : n.inputs) xs.push_back(nodes[j].act);
    if (std::find(xs.begin(), xs.end(), n.act) == xs.end()) poison_fresh(n.act, n.elements);  // not in place
    // The workspace holds what a producer already quantized for this layer (input spans), and
    // a fused ReLU node uses none.
    const auto* takes = poison ? n.layer->as<model::TakesInputSpans>() : nullptr;  // a debug run only
    if (poison && !(takes && takes->input_taken()) && !n.spec.fused) poison_workspace();
    model::StepInfo sti = st;
    if (fusion && n.inputs.size() == 1) {
      sti.input_max_abs = nodes[n.inputs[0]].act_max;
      sti.input_plane_max = nodes[n.inputs[0]].act_planes;
    }
    const auto t0 = timed ? ProfileClock::now() : ProfileClock::time_point{};
    n.layer->forward(ctx, xs, n.act, sti);
    n.act_max = fusion && n.maxima ? n.maxima->output_max_abs() : -1.f;
    n.act_planes = fusion && n.maxima ? n.maxima->output_plane_max() : nullptr;
    if (timed) {
      n.fwd_seconds += seconds_between(t0, ProfileClock::now());
      ++n.fwd_steps;
    }
  }
  last_count = count;
  have_training_forward = train;
  have_labels = false;
}

StepResult Model::Impl::forward(const float* images, const int32_t* lab, int count, bool train) {
  run_layers(images, count, train);
  const bool timed = profiling && train;
  const auto loss_t0 = timed ? ProfileClock::now() : ProfileClock::time_point{};
  // Softmax cross-entropy in double, per image.
  const TensorShape& ls = nodes[loss_node].shape;
  const int K = ls.c, KP = channel_blocks(K) * 16;
  const float* logits = nodes[loss_node].act;
  StepResult r;
  r.count = count;
  double loss = 0;
  for (int n = 0; n < count; ++n) {
    const int y = lab[n];
    DFP_CHECK(y >= 0 && y < K, Status::invalid_argument,
              "model '" + name + "': label " + std::to_string(y) + " of image " + std::to_string(n) +
                  " outside [0, " + std::to_string(K) + ")");
    labels[n] = y;
    const float* z = logits + size_t(n) * KP;
    DFP_CHECK(std::isfinite(z[0]), Status::numerical_error,
              "model '" + name + "': non-finite logits for image " + std::to_string(n) + " (training diverged)");
    const float zmax = *std::max_element(z, z + K);
    double sum = 0;
    for (int k = 0; k < K; ++k) sum += std::exp(double(z[k]) - zmax);
    const double lse = zmax + std::log(sum);
    double l = 0;
    for (int k = 0; k < K; ++k) {
      const double logp = z[k] - lse;
      probs[size_t(n) * K + k] = static_cast<float>(std::exp(logp));
      const double target = (k == y ? 1.0 - label_smoothing : 0.0) + label_smoothing / K;
      l -= target * logp;
    }
    loss += l;
    int rank = 0;  // how many logits beat the label's
    for (int k = 0; k < K; ++k) rank += (z[k] > z[y]) || (z[k] == z[y] && k < y);
    r.correct1 += rank < 1;
    r.correct5 += rank < 5;
  }
  r.loss = loss / count;
  if (timed) loss_fwd_seconds += seconds_between(loss_t0, ProfileClock::now());
  have_labels = train;
  return r;
}

// The logits of the last forward pass as plain [count][classes].
void Model::Impl::copy_logits(float* out) const {
  const int K = nodes[loss_node].shape.c, KP = channel_blocks(K) * 16;
  ctx.parallel_for(last_count, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      std::memcpy(out + size_t(n) * K, nodes[loss_node].act + size_t(n) * KP, size_t(K) * sizeof(float));
  });
}

// Parallel y = y * a + x * b over n floats (b == 0: x unused). With a = b = 1, the usual sum of
// two consumers' gradients, it is the add kernel: multiplying by 1 is exact, so the bits agree.
void Model::Impl::scale_add(float* y, float a, const float* x, float b, size_t n) const {
  const auto add = ctx.kernels().add.fn;
  model::for_chunks(ctx, n, [&](size_t lo, size_t e) {
    if (x && a == 1.f && b == 1.f) {
      add(y + lo, x + lo, y + lo, e - lo);
    } else if (x) {
      for (size_t q = lo; q < e; ++q) y[q] = y[q] * a + x[q] * b;
    } else {
      for (size_t q = lo; q < e; ++q) y[q] *= a;
    }
  });
}

// Divides a layer's parameter gradients by the scale its output gradient carried; returns
// whether all of them are finite. On the context's threads, and counted by the max_abs kernel:
// a scalar sum of x * 0 over every gradient (NaN exactly for NaN and inf) is one dependent add
// per value on one thread, about 2 ms per step for a 512-channel 3x3 layer.
bool Model::Impl::unscale_params(const NodeInfo& n) {
  const float inv = static_cast<float>(1.0 / n.grad_scale);
  const auto max_abs = ctx.kernels().max_abs.fn;
  std::atomic<uint64_t> nonfinite{0};
  auto piece = [&](float* g, size_t lo, size_t e) {
    if (inv != 1.f)
      for (size_t q = lo; q < e; ++q) g[q] *= inv;
    uint64_t bad = 0;
    max_abs(g + lo, e - lo, &bad);
    if (bad) nonfinite += bad;
  };
  for (size_t p = n.param_begin; p < n.param_end; ++p) {  // one chunk runs on the calling thread
    float* g = params[p].grad;
    model::for_chunks(ctx, params[p].size, [&](size_t lo, size_t e) { piece(g, lo, e); });
  }
  return nonfinite.load() == 0;
}

// logits_grad: the caller's d(loss)/d(logits), [batch][classes]; null: the built-in loss's.
bool Model::Impl::backward(const float* logits_grad) {
  DFP_CHECK(built && have_training_forward && last_count == batch, Status::invalid_argument,
            "model '" + name + "': backward() needs a training forward() first (and no other forward in between)");
  DFP_CHECK(logits_grad || have_labels, Status::invalid_argument,
            "model '" + name + "': backward() without a logits gradient needs a labelled training forward(); after "
            "logits(), pass the gradient of the loss with respect to the logits");
  have_training_forward = have_labels = false;  // planned memory reused: one backward per training forward
  for (NodeInfo& n : nodes) n.grad_written = false;
  const auto loss_t0 = profiling ? ProfileClock::now() : ProfileClock::time_point{};
  // Built-in: d(scale * mean loss)/d(logits) = scale * (p - target) / batch; else scale * the caller's.
  NodeInfo& ln = nodes[loss_node];
  const int K = ln.shape.c, KP = channel_blocks(K) * 16;
  // Per image on the context's threads: a block's feature map read as logits (dfp.torch's
  // segments) has C*H*W of them.
  ctx.parallel_for(batch, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      float* g = ln.grad + size_t(n) * KP;
      std::fill(g + K, g + KP, 0.f);
      for (int k = 0; k < K; ++k) {
        const size_t nk = size_t(n) * K + k;
        if (logits_grad) {
          g[k] = static_cast<float>(loss_scale * logits_grad[nk]);
        } else {
          const double target = (k == labels[n] ? 1.0 - label_smoothing : 0.0) + label_smoothing / K;
          g[k] = static_cast<float>(loss_scale * (probs[nk] - target) / batch);
        }
      }
    }
  });
  ln.grad_written = true;
  ln.grad_max = -1.f;
  ln.grad_planes = nullptr;
  ln.grad_scale = loss_scale;
  ln.adapt_scale = 1;
  if (profiling) loss_bwd_seconds += seconds_between(loss_t0, ProfileClock::now());
  bool finite = true;
  model::StepInfo st{batch, true, step, sample_step()};
  if (statistics_sum) st.statistics_sum = &statistics_sum;
  st.timed = profiling;
  st.first_image = batch_offset;
  for (size_t i = nodes.size() - 1; i >= 1; --i) {
    NodeInfo& n = nodes[i];
    if (!n.grad_written) continue;  // does not reach the loss
    // The layer's time includes its share of the bookkeeping: its adaptive scaling, unscaling
    // its parameter gradients, and summing its input gradient with another consumer's.
    const auto t0 = profiling ? ProfileClock::now() : ProfileClock::time_point{};
    if (adaptive) {
      // Zhao et al.: this layer's own factor, applied to the gradient it receives (so to its
      // own rounding of dy, its weight gradient and everything it passes on).
      const double alpha = n.reduced ? n.reduced->adaptive_factor(ctx, n.grad, n.adapt_scale, adaptive_opts) : 1;
      if (alpha != 1) {
        n.grad_max = -1.f;
        n.grad_planes = nullptr;
        scale_add(n.grad, static_cast<float>(alpha), nullptr, 0.f, n.elements);
        n.grad_scale *= alpha;
        n.adapt_scale *= alpha;
      }
    }
    xs.clear();
    dxs.clear();
    model::StepInfo stb = st;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      NodeInfo& in = nodes[n.inputs[k]];
      // Only what the layer declared is still planned to hold the forward values.
      xs.push_back(n.layer->backward_reads_input(k) ? in.act : nullptr);
      // A second slot of the same node in this layer (add(x, x)) is a second part too.
      const bool again = std::find(n.inputs.begin(), n.inputs.begin() + k, n.inputs[k]) != n.inputs.begin() + k;
      if (n.inputs[k] == 0 && !input_grad) {
        dxs.push_back(nullptr);  // no gradient for the data
      } else if (in.grad_written && in.grad_scale == n.grad_scale && adds_own_part(n, k)) {
        // Second consumer at the same scale: the layer adds its part to the gradient itself.
        dxs.push_back(in.grad);
        stb.accumulate_dx |= uint32_t{1} << k;
      } else {
        const bool second = in.grad_written || again;
        DFP_CHECK(!second || in.acc, Status::internal,
                  "model '" + name + "': no buffer planned for a second part of the gradient of '" + in.spec.name + "'");
        dxs.push_back(second ? in.acc : in.grad);
        if (dxs.back() != n.grad) poison_fresh(dxs.back(), in.elements);  // not in place
      }
    }
    // The workspace holds the dy that the BatchNorm after this layer already quantized for it.
    const auto* takes = poison ? n.layer->as<model::TakesGradSpans>() : nullptr;  // a debug run only
    if (!(takes && takes->grad_taken())) poison_workspace();
    if (fusion) {
      stb.grad_max_abs = n.grad_max;
      stb.grad_plane_max = n.grad_planes;
      stb.grad_spans = !adaptive;  // adaptive scaling reads each layer's dy
    }
    n.layer->backward(ctx, xs, n.layer->backward_reads_output() ? n.act : nullptr, n.grad, dxs, stb);
    finite &= unscale_params(n);
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const int j = n.inputs[k];
      if (j == 0 && !input_grad) continue;
      NodeInfo& in = nodes[j];
      // The max a layer measured holds for its input's gradient only if no other consumer adds to it.
      const bool measured = !in.grad_written && fusion && n.inputs.size() == 1 && n.maxima;
      in.grad_max = measured ? n.maxima->input_grad_max_abs() : -1.f;
      in.grad_planes = measured ? n.maxima->input_grad_plane_max() : nullptr;
      if (k < 32 && (stb.accumulate_dx >> k & 1)) {
        // Summed by the layer, at the common scale.
      } else if (in.grad_written) {
        // Second consumer: sum at the smaller of the two scales, so neither part can overflow.
        const double target = std::min(in.grad_scale, n.grad_scale);
        scale_add(in.grad, static_cast<float>(target / in.grad_scale), in.acc,
                  static_cast<float>(target / n.grad_scale), in.elements);
        in.adapt_scale = in.grad_scale == target ? in.adapt_scale : n.adapt_scale;
        in.grad_scale = target;
      } else {
        in.grad_scale = n.grad_scale;
        in.adapt_scale = n.adapt_scale;
      }
      in.grad_written = true;
    }
    if (profiling) n.bwd_seconds += seconds_between(t0, ProfileClock::now());
    if (gradient_hook) gradient_hook(n.param_begin, n.param_end);
  }
  ++step;
  have_input_grad = input_grad && nodes[0].grad_written;
  return finite;
}

}  // namespace dfp
