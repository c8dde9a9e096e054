// The CUDA device's model runner (see executor.hpp). Plain C++: it only calls the Backend.
#include "src/cuda/executor.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "dfp/status.hpp"

namespace dfp::cuda {
namespace {

using Kind = LayerKind;

// The kinds the device runs; any other is named before anything is allocated.
void check_supported(const LayerSpec& s) {
  switch (s.kind) {
    case Kind::input: case Kind::conv: case Kind::batchnorm: case Kind::relu: case Kind::maxpool: case Kind::avgpool:
    case Kind::global_avgpool: case Kind::flatten: case Kind::linear: case Kind::add: case Kind::concat:
    case Kind::dropout: case Kind::lrn: case Kind::shortcut_pad:
      return;
  }
  fail(Status::unsupported, "CUDA device: layer '" + s.name + "' of kind '" + s.kind_name() +
                                "' has no CUDA implementation");
}

}  // namespace

struct Executor::NodeRt {
  LayerSpec spec;
  int C = 0, H = 0, W = 0;  // output shape (batch: Executor::batch_)
  size_t elems = 0;
  void* act = nullptr;
  void* grad = nullptr;     // null when no gradient reaches this node (and for the input)
  bool reach = false;       // the loss depends on this node
  std::vector<char> acc;    // per input: accumulate into that input's gradient (a later consumer)
  int conv = -1;            // backend convolution
  int wparam = -1, bparam = -1;
  float *mean = nullptr, *invstd = nullptr, *k23 = nullptr, *rmean = nullptr, *rvar = nullptr;
  int rmean_buf = -1, rvar_buf = -1;  // indices in Model::buffers()
  uint8_t* argmax = nullptr;
  float* lrn_scale = nullptr;
};

struct Executor::ParamRt {
  std::string name;
  size_t begin = 0, size = 0;
  int kind = 0;      // as ParamSeg::kind
  size_t dev = 0;    // device copy offset (kind 1, 2)
};

Executor::~Executor() = default;

void* Executor::at(void* base, size_t elems) const {
  return static_cast<char*>(base) + elems * be_->elem_bytes();
}

std::string Executor::describe() const { return be_->describe(); }

Executor::Executor(std::unique_ptr<Backend> backend, Model& host, const SgdOptions& sgd,
                   const std::vector<std::vector<float>>* momentum)
    : be_(std::move(backend)), ctx_(&host.context()), sgd_(sgd) {
  DFP_CHECK(host.built(), Status::invalid_argument, "CUDA device: model '" + host.name() + "' is not built");
  Backend& be = *be_;
  batch_ = host.batch();
  loss_node_ = host.loss_node();
  smoothing_ = host.label_smoothing();
  const std::vector<LayerSpec> graph = host.graph();
  const int n = int(graph.size());
  nodes_.resize(n);
  for (int i = 0; i < n; ++i) {
    NodeRt& r = nodes_[i];
    r.spec = graph[i];
    check_supported(r.spec);
    r.C = r.spec.shape.c;
    r.H = r.spec.shape.h;
    r.W = r.spec.shape.w;
    r.elems = size_t(batch_) * r.C * r.H * r.W;
    if (r.spec.kind == Kind::concat)
      DFP_CHECK(r.spec.inputs.size() <= size_t(kMaxConcat), Status::unsupported,
                "CUDA device: concat '" + r.spec.name + "' has more than " + std::to_string(kMaxConcat) + " inputs");
  }
  classes_ = nodes_[loss_node_].C;
  image_bytes_ = size_t(nodes_[0].C) * nodes_[0].H * nodes_[0].W * sizeof(float);  // NHWC, unpadded

  // Which nodes the loss depends on, and for every input edge whether its gradient is the first
  // written to that input (backward runs in reverse node order, as Model::backward).
  nodes_[loss_node_].reach = true;
  for (int i = n - 1; i >= 1; --i)
    if (nodes_[i].reach)
      for (int j : nodes_[i].spec.inputs) nodes_[j].reach = true;
  std::vector<char> written(n, 0);
  for (int i = n - 1; i >= 1; --i) {
    NodeRt& r = nodes_[i];
    r.acc.assign(r.spec.inputs.size(), 0);
    if (!r.reach) continue;
    for (size_t e = 0; e < r.spec.inputs.size(); ++e) {
      const int j = r.spec.inputs[e];
      r.acc[e] = written[j];
      written[j] = 1;
    }
  }

  // Parameters: one flat FP32 segment per host Parameter, in host order; Conv/Linear weights also
  // get a device copy (KRSC for convolutions).
  std::map<std::string, int> by_name;
  {
    auto& ps = host.parameters();
    for (size_t p = 0; p < ps.size(); ++p) {
      ParamRt pr;
      pr.name = ps[p].name;
      pr.begin = total_;
      pr.size = ps[p].size;
      total_ += pr.size;
      by_name[pr.name] = int(p);
      params_.push_back(pr);
    }
  }
  auto claim = [&](const NodeRt& r, const char* suffix, size_t size) {
    const std::string name = r.spec.name + suffix;
    auto it = by_name.find(name);
    DFP_CHECK(it != by_name.end(), Status::internal, "CUDA device: parameter '" + name + "' not found in the model");
    DFP_CHECK(params_[it->second].size == size, Status::internal,
              "CUDA device: parameter '" + name + "' has " + std::to_string(params_[it->second].size) +
                  " values, expected " + std::to_string(size));
    const int idx = it->second;
    by_name.erase(it);
    return idx;
  };
  std::vector<ParamSeg> segs(params_.size());
  for (int i = 1; i < n; ++i) {
    NodeRt& r = nodes_[i];
    const NodeRt& x = nodes_[r.spec.inputs.at(0)];
    if (r.spec.kind == Kind::conv || r.spec.kind == Kind::linear) {
      const ConvParams* conv = r.spec.kind == Kind::conv ? &r.spec.get<ConvParams>() : nullptr;
      const int cg = conv ? x.C / conv->groups : x.C;  // input channels each output reads
      const int rs = conv ? conv->kernel * conv->kernel : 1;
      r.wparam = claim(r, ".weight", size_t(r.C) * cg * rs);
      if (conv ? conv->bias : r.spec.get<LinearParams>().bias) r.bparam = claim(r, ".bias", size_t(r.C));
      ParamRt& w = params_[r.wparam];
      w.kind = r.spec.kind == Kind::conv ? 2 : 1;
      total_dev_ = (total_dev_ + 63) / 64 * 64;  // every copy 128-byte aligned for the libraries' vector loads
      w.dev = total_dev_;
      total_dev_ += w.size;
      ParamSeg& s = segs[r.wparam];
      s.kind = w.kind;
      s.dev = w.dev;
      s.C = cg;
      s.RS = rs;
    } else if (r.spec.kind == Kind::batchnorm) {
      const size_t padded = size_t(channel_blocks(r.C)) * 16;  // the host pads gamma/beta to 16 lanes
      r.wparam = claim(r, ".weight", padded);
      r.bparam = claim(r, ".bias", padded);
    }
  }
  DFP_CHECK(by_name.empty(), Status::unsupported,
            "CUDA device: parameter '" + (by_name.empty() ? std::string() : by_name.begin()->first) +
                "' belongs to no layer the device knows");
  {
    auto& ps = host.parameters();
    for (size_t p = 0; p < params_.size(); ++p) {
      segs[p].begin = params_[p].begin;
      segs[p].size = params_[p].size;
      segs[p].wd = ps[p].decay ? sgd_.weight_decay : 0.f;
    }
  }

  // Device memory, all of it now.
  const size_t eb = be.elem_bytes();
  w_ = static_cast<float*>(be.alloc(total_ * sizeof(float)));
  g_ = static_cast<float*>(be.alloc(total_ * sizeof(float)));
  v_ = static_cast<float*>(be.alloc(total_ * sizeof(float)));
  wdev_ = be.alloc(std::max<size_t>(total_dev_, 1) * eb);
  gdev_ = be.alloc(std::max<size_t>(total_dev_, 1) * eb);
  segs_ = static_cast<ParamSeg*>(be.alloc(segs.size() * sizeof(ParamSeg)));
  be.upload(segs_, segs.data(), segs.size() * sizeof(ParamSeg));

  auto buffers = host.buffers();
  auto buffer_index = [&](const std::string& name, size_t size) {
    for (size_t b = 0; b < buffers.size(); ++b)
      if (buffers[b].first == name) {
        DFP_CHECK(buffers[b].second->size() == size, Status::internal,
                  "CUDA device: buffer '" + name + "' has an unexpected size");
        return int(b);
      }
    fail(Status::internal, "CUDA device: buffer '" + name + "' not found in the model");
  };
  int max_c = 1;
  for (int i = 0; i < n; ++i) {
    NodeRt& r = nodes_[i];
    max_c = std::max(max_c, r.C);
    r.act = be.alloc(r.elems * eb);
    if (i > 0 && r.reach) r.grad = be.alloc(r.elems * eb);
    if (i == 0) continue;
    const NodeRt& x = nodes_[r.spec.inputs[0]];
    switch (r.spec.kind) {
      case Kind::conv: {
        const ConvParams& q = r.spec.get<ConvParams>();
        ConvDims d;
        d.N = batch_; d.C = x.C; d.H = x.H; d.W = x.W;
        d.K = r.C; d.R = d.S = q.kernel; d.stride = q.stride; d.pad = q.pad;
        d.OH = r.H; d.OW = r.W;
        d.groups = q.groups;
        r.conv = be.conv_plan(d);
        break;
      }
      case Kind::batchnorm:
        r.mean = static_cast<float*>(be.alloc(r.C * sizeof(float)));
        r.invstd = static_cast<float*>(be.alloc(r.C * sizeof(float)));
        r.k23 = static_cast<float*>(be.alloc(2 * r.C * sizeof(float)));
        r.rmean = static_cast<float*>(be.alloc(r.C * sizeof(float)));
        r.rvar = static_cast<float*>(be.alloc(r.C * sizeof(float)));
        r.rmean_buf = buffer_index(r.spec.name + ".running_mean", r.C);
        r.rvar_buf = buffer_index(r.spec.name + ".running_var", r.C);
        break;
      case Kind::maxpool:
        DFP_CHECK(r.spec.get<PoolParams>().kernel <= 16, Status::unsupported,
                  "CUDA device: max pool '" + r.spec.name + "' window larger than 16x16");
        r.argmax = static_cast<uint8_t*>(be.alloc(r.elems));
        break;
      case Kind::lrn:
        r.lrn_scale = static_cast<float*>(be.alloc(r.elems * sizeof(float)));
        break;
      default:
        break;
    }
  }
  sums_ = static_cast<double*>(be.alloc(2 * size_t(max_c) * sizeof(double)));
  scratch_ = static_cast<double*>(be.alloc(size_t(kReduceParts) * 2 * max_c * sizeof(double)));
  loss_ = static_cast<double*>(be.alloc(batch_ * sizeof(double)));
  hit1_ = static_cast<int*>(be.alloc(batch_ * sizeof(int)));
  hit5_ = static_cast<int*>(be.alloc(batch_ * sizeof(int)));
  stats_ = static_cast<StepStats*>(be.alloc(sizeof(StepStats)));
  be.reserve_staging(image_bytes_ * batch_, batch_ * sizeof(int32_t));
  be.planned();
  upload(host, momentum);
}

void Executor::upload(Model& host, const std::vector<std::vector<float>>* momentum) {
  auto& ps = host.parameters();
  DFP_CHECK(ps.size() == params_.size(), Status::invalid_argument, "CUDA device: a different model");
  DFP_CHECK(!momentum || momentum->size() == ps.size(), Status::invalid_argument,
            "CUDA device: momentum buffers do not match the model's parameters");
  std::vector<float> zeros;
  for (size_t p = 0; p < ps.size(); ++p) {
    be_->upload(w_ + params_[p].begin, ps[p].value, ps[p].size * sizeof(float));
    const float* v = nullptr;
    if (momentum) {
      DFP_CHECK((*momentum)[p].size() == ps[p].size, Status::invalid_argument,
                "CUDA device: momentum of '" + ps[p].name + "' has the wrong size");
      v = (*momentum)[p].data();
    } else {
      zeros.assign(ps[p].size, 0.f);
      v = zeros.data();
    }
    be_->upload(v_ + params_[p].begin, v, ps[p].size * sizeof(float));
  }
  auto buffers = host.buffers();
  for (NodeRt& r : nodes_)
    if (r.spec.kind == Kind::batchnorm) {
      be_->upload(r.rmean, buffers[r.rmean_buf].second->data(), r.C * sizeof(float));
      be_->upload(r.rvar, buffers[r.rvar_buf].second->data(), r.C * sizeof(float));
    }
  be_->run(CastArgs{segs_, int(params_.size()), w_, wdev_}, total_);
  step_ = host.step();
}

void Executor::download(Model& host, std::vector<std::vector<float>>* momentum) {
  auto& ps = host.parameters();
  DFP_CHECK(ps.size() == params_.size(), Status::invalid_argument, "CUDA device: a different model");
  if (momentum) momentum->resize(ps.size());
  for (size_t p = 0; p < ps.size(); ++p) {
    be_->download(ps[p].value, w_ + params_[p].begin, ps[p].size * sizeof(float));
    if (momentum) {
      (*momentum)[p].resize(ps[p].size);
      be_->download((*momentum)[p].data(), v_ + params_[p].begin, ps[p].size * sizeof(float));
    }
  }
  auto buffers = host.buffers();
  for (NodeRt& r : nodes_)
    if (r.spec.kind == Kind::batchnorm) {
      be_->download(buffers[r.rmean_buf].second->data(), r.rmean, r.C * sizeof(float));
      be_->download(buffers[r.rvar_buf].second->data(), r.rvar, r.C * sizeof(float));
    }
  host.set_step(step_);
  host.weights_updated();
}

std::vector<std::vector<float>> Executor::gradients() {
  std::vector<std::vector<float>> out(params_.size());
  for (size_t p = 0; p < params_.size(); ++p) {
    out[p].resize(params_[p].size);
    be_->download(out[p].data(), g_ + params_[p].begin, params_[p].size * sizeof(float));
  }
  return out;
}

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point& t0) {
  const Clock::time_point t = Clock::now();
  const double ms = std::chrono::duration<double, std::milli>(t - t0).count();
  t0 = t;
  return ms;
}
}  // namespace

void Executor::set_profile(bool on) {
  profile_ = on;
  if (on && layer_times_.size() != nodes_.size()) {
    layer_times_.resize(nodes_.size());
    for (size_t i = 0; i < nodes_.size(); ++i) {
      layer_times_[i].name = nodes_[i].spec.name;
      layer_times_[i].kind = nodes_[i].spec.kind_name();
    }
  }
  if (on) reset_profile();
}

void Executor::reset_profile() {
  for (LayerTime& t : layer_times_) t.forward_ms = t.backward_ms = 0;
  step_times_ = StepTime{};
}

void Executor::forward(const Staged& in, bool train) {
  Backend& be = *be_;
  const int N = batch_;
  Clock::time_point t0;
  if (profile_) {
    be.synchronize();
    t0 = Clock::now();
  }
  be.run(ToNhwcArgs{in.images, nodes_[0].act}, nodes_[0].elems);
  for (size_t i = 1; i < nodes_.size(); ++i) {
    if (profile_) {
      be.synchronize();
      layer_times_[i - 1].forward_ms += ms_since(t0);
    }
    NodeRt& r = nodes_[i];
    const NodeRt& x = nodes_[r.spec.inputs[0]];
    const float* bias = r.bparam >= 0 ? w_ + params_[r.bparam].begin : nullptr;
    switch (r.spec.kind) {
      case Kind::input:
        break;
      case Kind::conv:
        be.conv_fwd(r.conv, x.act, at(wdev_, params_[r.wparam].dev), r.act);
        if (bias) be.run(BiasAddArgs{r.act, bias, r.C}, r.elems);
        break;
      case Kind::linear:
        // Y[N][K] = X[N][F] * W[K][F]^T
        be.gemm(false, true, N, r.C, x.C, x.act, x.C, at(wdev_, params_[r.wparam].dev), x.C, r.act, r.C, false);
        if (bias) be.run(BiasAddArgs{r.act, bias, r.C}, r.elems);
        break;
      case Kind::batchnorm: {
        const size_t rows = size_t(N) * r.H * r.W;
        const float* gamma = w_ + params_[r.wparam].begin;
        const float* beta = w_ + params_[r.bparam].begin;
        if (train) {
          const double m = double(rows);
          be.reduce(ReduceArgs{Reduce::sum, x.act, nullptr, nullptr, nullptr, rows, r.C, sums_, scratch_});
          be.run(BnMeanArgs{sums_, r.mean, m}, r.C);
          be.reduce(ReduceArgs{Reduce::sqdev, x.act, nullptr, r.mean, nullptr, rows, r.C, sums_, scratch_});
          be.run(BnFinalizeTrainArgs{sums_, r.mean, r.invstd, r.rmean, r.rvar, m, r.spec.get<BatchNormParams>().eps}, r.C);
        } else {
          be.run(BnFinalizeEvalArgs{r.mean, r.invstd, r.rmean, r.rvar, r.spec.get<BatchNormParams>().eps}, r.C);
        }
        be.run(BnApplyArgs{x.act, r.act, gamma, beta, r.mean, r.invstd, r.C}, r.elems);
        break;
      }
      case Kind::relu:
        be.run(ReluArgs{x.act, r.act}, r.elems);
        break;
      case Kind::maxpool:
      case Kind::avgpool: {
        const PoolParams& q = r.spec.get<PoolParams>();
        be.run(PoolArgs{x.act, r.act, r.argmax, N, r.C, x.H, x.W, r.H, r.W, q.kernel, q.stride, q.pad,
                        r.spec.kind == Kind::maxpool},
               r.elems);
        break;
      }
      case Kind::global_avgpool:
        be.run(GapFwdArgs{x.act, r.act, r.C, x.H * x.W}, r.elems);
        break;
      case Kind::flatten:
        be.run(FlattenFwdArgs{x.act, r.act, x.C, x.H, x.W}, r.elems);
        break;
      case Kind::add:
        be.run(Add2Args{x.act, nodes_[r.spec.inputs[1]].act, r.act}, r.elems);
        break;
      case Kind::concat: {
        ConcatFwdArgs a{};
        a.count = int(r.spec.inputs.size());
        for (int e = 0; e < a.count; ++e) {
          a.x[e] = nodes_[r.spec.inputs[e]].act;
          a.c[e] = nodes_[r.spec.inputs[e]].C;
        }
        a.y = r.act;
        a.Cout = r.C;
        be.run(a, r.elems);
        break;
      }
      case Kind::dropout:
        be.run(DropoutArgs{x.act, r.act, N, r.C, r.H, r.W, dropout_key(r.spec.seed, step_), r.spec.get<DropoutParams>().p,
                           train},
               r.elems);
        break;
      case Kind::lrn: {
        const LrnParams& q = r.spec.get<LrnParams>();
        be.run(LrnArgs{x.act, r.act, r.lrn_scale, nullptr, nullptr, r.C, q.size, q.alpha, q.beta, q.k, false}, r.elems);
        break;
      }
      case Kind::shortcut_pad: {
        const int stride = r.spec.get<ShortcutPadParams>().stride;
        be.run(ShortcutArgs{x.act, r.act, x.C, x.H, x.W, r.C, r.H, r.W, stride, false}, r.elems);
        break;
      }
    }
  }
  if (profile_) {
    be.synchronize();
    layer_times_.back().forward_ms += ms_since(t0);
  }
}

void Executor::backward() {
  Backend& be = *be_;
  const int N = batch_;
  Clock::time_point t0;
  if (profile_) {
    be.synchronize();
    t0 = Clock::now();
  }
  for (size_t i = nodes_.size() - 1; i >= 1; --i) {
    NodeRt& r = nodes_[i];
    if (!r.reach) continue;
    struct Timed {  // adds the layer's time when its case is done
      Executor& ex;
      Clock::time_point& t0;
      size_t i;
      ~Timed() {
        if (!ex.profile_) return;
        ex.be_->synchronize();
        ex.layer_times_[i].backward_ms += ms_since(t0);
      }
    } timed{*this, t0, i};
    const NodeRt& x = nodes_[r.spec.inputs[0]];
    const void* dy = r.grad;
    void* dx = x.grad;  // null for the input node
    const bool acc = r.acc[0];
    switch (r.spec.kind) {
      case Kind::input:
        break;
      case Kind::conv: {
        const void* w = at(wdev_, params_[r.wparam].dev);
        if (dx) be.conv_bwd_data(r.conv, w, dy, dx, acc);
        be.conv_bwd_filter(r.conv, x.act, dy, at(gdev_, params_[r.wparam].dev));
        if (r.bparam >= 0) {
          be.reduce(ReduceArgs{Reduce::sum, dy, nullptr, nullptr, nullptr, size_t(N) * r.H * r.W, r.C, sums_, scratch_});
          be.run(SumOutArgs{sums_, g_ + params_[r.bparam].begin}, r.C);
        }
        break;
      }
      case Kind::linear: {
        const void* w = at(wdev_, params_[r.wparam].dev);
        // dX[N][F] = dY[N][K] * W[K][F];  dW[K][F] = dY^T * X
        if (dx) be.gemm(false, false, N, x.C, r.C, dy, r.C, w, x.C, dx, x.C, acc);
        be.gemm(true, false, r.C, x.C, N, dy, r.C, x.act, x.C, at(gdev_, params_[r.wparam].dev), x.C, false);
        if (r.bparam >= 0) {
          be.reduce(ReduceArgs{Reduce::sum, dy, nullptr, nullptr, nullptr, size_t(N), r.C, sums_, scratch_});
          be.run(SumOutArgs{sums_, g_ + params_[r.bparam].begin}, r.C);
        }
        break;
      }
      case Kind::batchnorm: {
        const size_t rows = size_t(N) * r.H * r.W;
        be.reduce(ReduceArgs{Reduce::bn_bwd, x.act, dy, r.mean, r.invstd, rows, r.C, sums_, scratch_});
        be.run(BnBwdFinalizeArgs{sums_, g_ + params_[r.wparam].begin, g_ + params_[r.bparam].begin, r.k23, r.C,
                                 double(rows)},
               r.C);
        if (dx)
          be.run(BnBwdDataArgs{x.act, dy, dx, w_ + params_[r.wparam].begin, r.mean, r.invstd, r.k23, r.C, acc},
                 x.elems);
        break;
      }
      case Kind::relu:
        if (dx) be.run(ReluBwdArgs{r.act, dy, dx, acc}, x.elems);
        break;
      case Kind::maxpool:
      case Kind::avgpool: {
        const PoolParams& q = r.spec.get<PoolParams>();
        if (dx)
          be.run(PoolBwdArgs{dy, dx, r.argmax, N, r.C, x.H, x.W, r.H, r.W, q.kernel, q.stride, q.pad,
                             r.spec.kind == Kind::maxpool, acc},
                 x.elems);
        break;
      }
      case Kind::global_avgpool:
        if (dx) be.run(GapBwdArgs{dy, dx, x.C, x.H * x.W, acc}, x.elems);
        break;
      case Kind::flatten:
        if (dx) be.run(FlattenBwdArgs{dy, dx, x.C, x.H, x.W, acc}, x.elems);
        break;
      case Kind::add:
        for (size_t e = 0; e < r.spec.inputs.size(); ++e) {
          const NodeRt& in = nodes_[r.spec.inputs[e]];
          if (in.grad) be.run(CopyArgs{dy, in.grad, bool(r.acc[e])}, in.elems);
        }
        break;
      case Kind::concat: {
        int off = 0;
        for (size_t e = 0; e < r.spec.inputs.size(); ++e) {
          const NodeRt& in = nodes_[r.spec.inputs[e]];
          if (in.grad)
            be.run(ConcatBwdArgs{dy, in.grad, in.C, r.C, off, bool(r.acc[e])}, in.elems);
          off += in.C;
        }
        break;
      }
      case Kind::dropout:
        if (dx)
          be.run(DropoutBwdArgs{DropoutArgs{dy, dx, N, r.C, r.H, r.W, dropout_key(r.spec.seed, step_),
                                            r.spec.get<DropoutParams>().p, true},
                                acc},
                 x.elems);
        break;
      case Kind::lrn: {
        const LrnParams& q = r.spec.get<LrnParams>();
        if (dx) be.run(LrnBwdArgs{LrnArgs{x.act, r.act, r.lrn_scale, dy, dx, r.C, q.size, q.alpha, q.beta, q.k, acc}}, x.elems);
        break;
      }
      case Kind::shortcut_pad:
        if (dx) {
          const int stride = r.spec.get<ShortcutPadParams>().stride;
          be.run(ShortcutBwdArgs{ShortcutArgs{dy, dx, x.C, x.H, x.W, r.C, r.H, r.W, stride, acc}}, x.elems);
        }
        break;
    }
  }
}

// Loss on the counted images, their sum, and (training) the gradient of the logits; then one copy
// of the statistics back to the host.
StepStats Executor::finish(const Staged& in, int count, bool train, float scale) {
  NodeRt& l = nodes_[loss_node_];
  Clock::time_point t0 = Clock::now();
  be_->run(SoftmaxCeArgs{l.act, in.labels, train ? l.grad : nullptr, loss_, hit1_, hit5_, classes_, batch_,
                         smoothing_, scale},
           count);
  be_->run(LossSumArgs{loss_, hit1_, hit5_, count, stats_}, 1);
  if (profile_) {
    be_->synchronize();
    step_times_.loss_ms += ms_since(t0);
  }
  if (train) {
    backward();
    if (profile_) t0 = Clock::now();
    be_->run(UnscaleArgs{segs_, int(params_.size()), gdev_, g_, float(1.0 / scale), &stats_->found_inf}, total_);
    if (profile_) {
      be_->synchronize();
      step_times_.loss_ms += ms_since(t0);
    }
  }
  StepStats s;
  be_->read_back(&s, stats_, sizeof s);
  return s;
}

// The Loader's blocked batch -> the pinned slot as NHWC with the model's own channels (the
// blocked layout pads them to 16: a 3-channel 224x224 image is 3.2 MB blocked, 0.6 MB here),
// in parallel on the host model's threads; then the copy is queued.
Staged Executor::stage(const float* images, const int32_t* labels, int count) {
  const Backend::HostSlot slot = be_->staging_slot();
  const int C = nodes_[0].C, H = nodes_[0].H, W = nodes_[0].W;
  const int64_t rows = int64_t(count) * H;
  ctx_->parallel_for(rows, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int n = int(r / H), h = int(r % H);
      float* dst = slot.images + size_t(r) * W * C;
      for (int cb = 0; cb < C; cb += 16) {
        const float* src = images + blocked_index(C, H, W, n, cb, h, 0);
        const int lanes = std::min(16, C - cb);
        for (int w = 0; w < W; ++w)
          for (int l = 0; l < lanes; ++l) dst[size_t(w) * C + cb + l] = src[size_t(w) * 16 + l];
      }
    }
  });
  std::memcpy(slot.labels, labels, sizeof(int32_t) * size_t(count));
  return be_->commit(image_bytes_ * size_t(count), sizeof(int32_t) * size_t(count));
}

namespace {
void check_labels(const int32_t* labels, int count, int classes) {
  for (int n = 0; n < count; ++n)
    DFP_CHECK(labels[n] >= 0 && labels[n] < classes, Status::invalid_argument,
              "CUDA device: label " + std::to_string(labels[n]) + " of image " + std::to_string(n) + " outside [0, " +
                  std::to_string(classes) + ")");
}
}  // namespace

namespace {
StepResult to_result(const StepStats& s, int count) {
  StepResult r;
  r.count = count;
  r.loss = s.loss / count;
  r.correct1 = s.correct1;
  r.correct5 = s.correct5;
  return r;
}
}  // namespace

StepResult Executor::train_step(const float* images, const int32_t* labels, int count, float lr, LossScaler& scaler) {
  DFP_CHECK(count == batch_, Status::invalid_argument,
            "CUDA device: training batches must be full (" + std::to_string(batch_) + " images), got " +
                std::to_string(count));
  DFP_CHECK(scaler.options().mode != LossScaleMode::adaptive, Status::unsupported,
            "CUDA device: adaptive (layer-wise) loss scaling is implemented on the CPU only; use dynamic or static");
  check_labels(labels, count, classes_);
  const double scale = scaler.scale();
  DFP_CHECK(std::isfinite(scale) && scale > 0 && scale <= 3.0e38, Status::numerical_error,
            "CUDA device: loss scale " + std::to_string(scale) + " outside the FP32 range");
  Clock::time_point t0 = Clock::now();
  const Staged in = stage(images, labels, count);
  if (profile_) {
    be_->synchronize();
    step_times_.stage_ms += ms_since(t0);
  }
  forward(in, true);
  const StepStats s = finish(in, count, true, float(scale));
  if (profile_) t0 = Clock::now();
  if (s.nonfinite_logits && !be_->half())
    fail(Status::numerical_error, "CUDA device: non-finite logits in an FP32 training step (training diverged)");
  const bool finite = s.nonfinite_logits == 0 && s.found_inf == 0;
  if (scaler.update(finite))
    be_->run(SgdCastArgs{segs_, int(params_.size()), w_, g_, v_, wdev_, lr, sgd_.momentum, sgd_.nesterov}, total_);
  if (profile_) {
    be_->synchronize();
    step_times_.update_ms += ms_since(t0);
    ++step_times_.steps;
  }
  ++step_;
  return to_result(s, count);
}

StepResult Executor::evaluate(const float* images, const int32_t* labels, int count) {
  DFP_CHECK(count >= 1 && count <= batch_, Status::invalid_argument,
            "CUDA device: batch of " + std::to_string(count) + " images, planned for 1.." + std::to_string(batch_));
  check_labels(labels, count, classes_);
  const Staged in = stage(images, labels, count);
  forward(in, false);
  const StepStats s = finish(in, count, false, 1.f);
  DFP_CHECK(s.nonfinite_logits == 0, Status::numerical_error,
            "CUDA device: non-finite logits for " + std::to_string(s.nonfinite_logits) + " of " + std::to_string(count) +
                " images in evaluation");
  return to_result(s, count);
}

}  // namespace dfp::cuda
