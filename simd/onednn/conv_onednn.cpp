// oneDNN 2.6 FP32 convolution and inner product, all three training passes, on dfp's layouts.
// See conv_onednn.hpp for the contract.
#include "simd/onednn/conv_onednn.hpp"

#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>
#include <oneapi/dnnl/dnnl_debug.h>

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"

namespace dfp::simd::onednn {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

// A primitive (or reorder) and its view of the shared scratchpad (empty when it needs none).
struct Step {
  dnnl::primitive prim;
  memory::desc scratch_md;
  memory scratch;
};

// One tensor argument of one pass: the user's buffer, attached per call, and what the primitive
// reads or writes. When the primitive accepted the user layout both are the same memory object;
// otherwise `inner` is a buffer of the primitive's layout owned here and `convert` reorders
// user -> inner (inputs) or inner -> user (outputs).
struct Port {
  memory user;
  memory inner;
  Step convert;
  bool direct = true;
};

// The state shared by the convolution and the inner product: the plumbing is identical, only the
// primitive descriptors differ.
struct Training {
  int threads = 1;  // the OpenMP thread count each call binds (the engine context's)
  std::string name;
  dnnl::engine eng;
  dnnl::stream strm;

  Port fwd_src, fwd_dst;             // forward: x -> y
  Port bd_diff_dst, bd_diff_src;     // backward data: dy -> dx
  Port bw_src, bw_diff_dst, bw_diff_wei;  // backward weights: x, dy -> dw
  // The weight gradient reads x and dy in the layouts the forward and backward-data passes
  // reordered them into, when those are the same: bw_src shares fwd_src's buffer, bw_diff_dst
  // bd_diff_dst's. x_ready / dy_ready name the caller's buffer whose reordered copy that buffer
  // holds, from the last forward / backward-data call, until the weight gradient has read it:
  // one reorder per tensor per training step, not one per pass. The caller's contract: the
  // buffers passed to backward_weights hold what forward / backward_data read from them (the
  // saved input and the gradient of this step), as in any training step, unless it says
  // otherwise (inputs_rewritten clears both).
  bool bw_src_shared = false, bw_diff_dst_shared = false;
  const void* x_ready = nullptr;
  const void* dy_ready = nullptr;

  memory user_wei;                   // the caller's weights, attached in set_weights
  memory fwd_wei, bd_wei;            // weights in the layouts the primitives chose
  Step wei_to_fwd, wei_to_bd;        // bd_wei_shared: the backward-data pass reads fwd_wei
  bool bd_wei_shared = false;
  bool weights_set = false;

  Step fwd, bd, bw;
  std::string impl_fwd, impl_bd, impl_bw;
  memory scratch_buf;                // one scratchpad for every step: they never overlap in time
};

dnnl::primitive_attr user_scratchpad_attr() {
  // scratchpad_mode::user: the primitives take their workspace from us, allocated once, instead
  // of oneDNN's per-execution or global scratchpad.
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

bool is_reference_impl(const std::string& impl) { return impl.rfind("ref", 0) == 0; }

// Creates a primitive descriptor with the activations in the user layout when a non-reference
// implementation accepts that; otherwise lets oneDNN choose (format_tag::any) and the caller
// reorders. make(true) asks for the user layout, make(false) for `any`. Where oneDNN answers `any`
// with an AMX implementation (a CPU with AMX tiles, which oneDNN 2.6 runs only on layouts of its
// own choice), that one is taken: on such a CPU the tile kernels run BF16 several times faster
// than the AVX-512 kernels that accept the user layout, which is worth two reorders per pass.
template <class Pd, class Make>
Pd choose_pd(Make make) {
  Pd user_layout;
  try {
    user_layout = make(true);
  } catch (const dnnl::error&) {
    // No implementation for the user layout: fall through to `any`.
  }
  const bool user_ok = user_layout && !is_reference_impl(user_layout.impl_info_str());
  Pd any;
  try {
    any = make(false);
  } catch (const dnnl::error&) {
    if (!user_layout) throw;
    return user_layout;
  }
  const std::string any_impl = any.impl_info_str();
  if (user_ok && any_impl.find("amx") == std::string::npos) return user_layout;
  if (!is_reference_impl(any_impl) || !user_layout) return any;
  return user_layout;  // both are reference implementations: avoid the reorders
}

Step make_reorder(const Training& t, const memory::desc& from, const memory::desc& to) {
  dnnl::reorder::primitive_desc pd(t.eng, from, t.eng, to, user_scratchpad_attr());
  return Step{dnnl::reorder(pd), pd.scratchpad_desc(), {}};
}

// An activation tensor of exactly 16 channels in nChw16c ([N][1][H][W][16]) is byte for byte
// nhwc; oneDNN compares layouts by descriptor, so without this check it would reorder a copy.
bool same_bytes(const memory::desc& user_md, const memory::desc& inner_md) {
  if (user_md == inner_md) return true;
  const memory::dims d = user_md.dims();
  if (d.size() != 4 || d[1] != 16) return false;
  const dt type = user_md.data_type();
  return user_md == memory::desc(d, type, tag::nChw16c) && inner_md == memory::desc(d, type, tag::nhwc);
}

// `share`: a port of another pass whose inner buffer this one uses when both reorder the same user
// layout into the same inner layout (null: none).
Port make_port(const Training& t, const memory::desc& user_md, const memory::desc& inner_md, bool input,
               const Port* share = nullptr) {
  Port p;
  if (same_bytes(user_md, inner_md)) {
    p.user = memory(inner_md, t.eng, DNNL_MEMORY_NONE);
    p.inner = p.user;
    p.direct = true;
    return p;
  }
  p.user = memory(user_md, t.eng, DNNL_MEMORY_NONE);
  const bool shared = share && !share->direct && share->inner.get_desc() == inner_md;
  p.inner = shared ? share->inner : memory(inner_md, t.eng);
  p.convert = input ? make_reorder(t, user_md, inner_md) : make_reorder(t, inner_md, user_md);
  p.direct = false;
  return p;
}

template <class Pd>
Step make_step(const Pd& pd) {
  return Step{dnnl::primitive(pd.get()), pd.scratchpad_desc(), {}};
}

// Fills everything in `t` from the three primitive descriptors. `user_src`/`user_dst` are the
// user layouts of the pass inputs/outputs (x, dx / y, dy), `user_wei` of the weights.
// The pass inputs (x, dy) and outputs (y, dx) may differ in data type (BF16 operands, FP32 results).
template <class FwdPd, class BdPd, class BwPd>
void build(Training& t, const FwdPd& fpd, const BdPd& bdpd, const BwPd& bwpd, const memory::desc& user_src_in,
           const memory::desc& user_src_out, const memory::desc& user_dst_in, const memory::desc& user_dst_out,
           const memory::desc& user_wei) {
  t.impl_fwd = fpd.impl_info_str();
  t.impl_bd = bdpd.impl_info_str();
  t.impl_bw = bwpd.impl_info_str();

  t.fwd = make_step(fpd);
  t.bd = make_step(bdpd);
  t.bw = make_step(bwpd);

  t.fwd_src = make_port(t, user_src_in, fpd.src_desc(), true);
  t.fwd_dst = make_port(t, user_dst_out, fpd.dst_desc(), false);
  t.bd_diff_dst = make_port(t, user_dst_in, bdpd.diff_dst_desc(), true);
  t.bd_diff_src = make_port(t, user_src_out, bdpd.diff_src_desc(), false);
  t.bw_src = make_port(t, user_src_in, bwpd.src_desc(), true, &t.fwd_src);
  t.bw_diff_dst = make_port(t, user_dst_in, bwpd.diff_dst_desc(), true, &t.bd_diff_dst);
  t.bw_src_shared = !t.bw_src.direct && t.bw_src.inner.get() == t.fwd_src.inner.get();
  t.bw_diff_dst_shared = !t.bw_diff_dst.direct && t.bw_diff_dst.inner.get() == t.bd_diff_dst.inner.get();
  t.bw_diff_wei = make_port(t, user_wei, bwpd.diff_weights_desc(), false);

  t.user_wei = memory(user_wei, t.eng, DNNL_MEMORY_NONE);
  t.fwd_wei = memory(fpd.weights_desc(), t.eng);
  t.wei_to_fwd = make_reorder(t, user_wei, fpd.weights_desc());
  t.bd_wei_shared = bdpd.weights_desc() == fpd.weights_desc();
  if (t.bd_wei_shared) {
    t.bd_wei = t.fwd_wei;
  } else {
    t.bd_wei = memory(bdpd.weights_desc(), t.eng);
    t.wei_to_bd = make_reorder(t, user_wei, bdpd.weights_desc());
  }

  // One scratchpad buffer sized for the largest step; each step gets a view of it.
  std::vector<Step*> steps = {&t.fwd, &t.bd, &t.bw, &t.wei_to_fwd, &t.wei_to_bd};
  for (Port* p : {&t.fwd_src, &t.fwd_dst, &t.bd_diff_dst, &t.bd_diff_src, &t.bw_src, &t.bw_diff_dst,
                  &t.bw_diff_wei})
    if (!p->direct) steps.push_back(&p->convert);
  size_t bytes = 0;
  for (const Step* s : steps)
    if (s->prim) bytes = std::max(bytes, s->scratch_md.get_size());
  if (bytes == 0) return;
  t.scratch_buf = memory(memory::desc({memory::dim(bytes)}, dt::u8, tag::a), t.eng);
  for (Step* s : steps)
    if (s->prim && s->scratch_md.get_size() > 0)
      s->scratch = memory(s->scratch_md, t.eng, t.scratch_buf.get_data_handle());
}

template <class FwdPd, class BdPd, class BwPd>
void build(Training& t, const FwdPd& fpd, const BdPd& bdpd, const BwPd& bwpd, const memory::desc& user_src,
           const memory::desc& user_dst, const memory::desc& user_wei) {
  build(t, fpd, bdpd, bwpd, user_src, user_src, user_dst, user_dst, user_wei);
}

// Runs one step through the C API with a fixed argument array: the C++ execute() builds an
// std::unordered_map per call, which we do not want in a hot loop.
void execute(const Training& t, const Step& s, const char* what, std::initializer_list<dnnl_exec_arg_t> args) {
  dnnl_exec_arg_t a[8];
  int n = 0;
  for (const dnnl_exec_arg_t& x : args) a[n++] = x;
  if (s.scratch) a[n++] = {DNNL_ARG_SCRATCHPAD, s.scratch.get()};
  const dnnl_status_t st = dnnl_primitive_execute(s.prim.get(), t.strm.get(), n, a);
  DFP_CHECK(st == dnnl_success, Status::internal,
            t.name + ": oneDNN " + what + " failed with status " + dnnl_status2str(st));
}

void reorder(const Training& t, const Step& s, const memory& from, const memory& to, const char* what) {
  execute(t, s, what, {{DNNL_ARG_FROM, from.get()}, {DNNL_ARG_TO, to.get()}});
}

void attach(const memory& m, const void* p) {
  // oneDNN only reads inputs; its API just has no const handle.
  m.set_data_handle(const_cast<void*>(p));
}

void prepare_input(const Training& t, Port& p, const void* data, const char* what) {
  attach(p.user, data);
  if (!p.direct) reorder(t, p.convert, p.user, p.inner, what);
}

void finish_output(const Training& t, Port& p, const char* what) {
  if (!p.direct) reorder(t, p.convert, p.inner, p.user, what);
}

void wait(const Training& t) {
  const dnnl_status_t st = dnnl_stream_wait(t.strm.get());
  DFP_CHECK(st == dnnl_success, Status::internal,
            t.name + ": oneDNN stream wait failed with status " + dnnl_status2str(st));
}

void set_weights(Training& t, const float* w) {
  omp_set_num_threads(t.threads);
  attach(t.user_wei, w);
  reorder(t, t.wei_to_fwd, t.user_wei, t.fwd_wei, "weight reorder (forward)");
  if (!t.bd_wei_shared) reorder(t, t.wei_to_bd, t.user_wei, t.bd_wei, "weight reorder (backward data)");
  wait(t);
  t.weights_set = true;
}

void forward(Training& t, const void* x, float* y) {
  DFP_CHECK(t.weights_set, Status::invalid_argument, t.name + ": forward called before set_weights");
  omp_set_num_threads(t.threads);
  prepare_input(t, t.fwd_src, x, "input reorder (forward)");
  t.x_ready = x;
  t.dy_ready = nullptr;  // a dy copy from before this forward belongs to another step
  attach(t.fwd_dst.user, y);
  execute(t, t.fwd, "forward",
          {{DNNL_ARG_SRC, t.fwd_src.inner.get()}, {DNNL_ARG_WEIGHTS, t.fwd_wei.get()},
           {DNNL_ARG_DST, t.fwd_dst.inner.get()}});
  finish_output(t, t.fwd_dst, "output reorder (forward)");
  wait(t);
}

void backward_data(Training& t, const void* dy, float* dx) {
  DFP_CHECK(t.weights_set, Status::invalid_argument, t.name + ": backward_data called before set_weights");
  omp_set_num_threads(t.threads);
  prepare_input(t, t.bd_diff_dst, dy, "gradient reorder (backward data)");
  t.dy_ready = dy;
  attach(t.bd_diff_src.user, dx);
  execute(t, t.bd, "backward data",
          {{DNNL_ARG_DIFF_DST, t.bd_diff_dst.inner.get()}, {DNNL_ARG_WEIGHTS, t.bd_wei.get()},
           {DNNL_ARG_DIFF_SRC, t.bd_diff_src.inner.get()}});
  finish_output(t, t.bd_diff_src, "output reorder (backward data)");
  wait(t);
}

void backward_weights(Training& t, const void* x, const void* dy, float* dw) {
  omp_set_num_threads(t.threads);
  if (!(t.bw_src_shared && t.x_ready == x)) prepare_input(t, t.bw_src, x, "input reorder (backward weights)");
  if (!(t.bw_diff_dst_shared && t.dy_ready == dy))
    prepare_input(t, t.bw_diff_dst, dy, "gradient reorder (backward weights)");
  t.x_ready = t.dy_ready = nullptr;
  attach(t.bw_diff_wei.user, dw);
  execute(t, t.bw, "backward weights",
          {{DNNL_ARG_SRC, t.bw_src.inner.get()}, {DNNL_ARG_DIFF_DST, t.bw_diff_dst.inner.get()},
           {DNNL_ARG_DIFF_WEIGHTS, t.bw_diff_wei.inner.get()}});
  finish_output(t, t.bw_diff_wei, "weight-gradient reorder (backward weights)");
  wait(t);
}

std::string conv_shape_text(const ConvShape& s) {
  return "N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) + " H=" + std::to_string(s.H) +
         " W=" + std::to_string(s.W) + " K=" + std::to_string(s.K) + " R=" + std::to_string(s.R) +
         " S=" + std::to_string(s.S) + " stride=" + std::to_string(s.stride_h) + "x" + std::to_string(s.stride_w) +
         " pad=" + std::to_string(s.pad_h) + "x" + std::to_string(s.pad_w);
}

}  // namespace

// ---- convolution -----------------------------------------------------------------------------

struct ConvPrimitives::Impl {
  Training t;
};

ConvPrimitives::ConvPrimitives(int threads, const ConvShape& s, const std::string& name, bool bf16_operands)
    : impl_(std::make_unique<Impl>()) {
  Training& t = impl_->t;
  t.threads = threads;
  t.name = name;
  // The JIT kernels fix their thread partition at creation: bind the thread count first.
  omp_set_num_threads(threads);
  try {
    t.eng = dnnl::engine(dnnl::engine::kind::cpu, 0);
    t.strm = dnnl::stream(t.eng);
    const memory::dims src_d = {s.N, s.C, s.H, s.W};
    const memory::dims wei_d = {s.K, s.C, s.R, s.S};
    const memory::dims dst_d = {s.N, s.K, s.OH(), s.OW()};
    const memory::dims strides = {s.stride_h, s.stride_w};
    // Right padding equal to the left: (H + 2p - R) / stride + 1 == OH holds by definition of OH().
    const memory::dims pad = {s.pad_h, s.pad_w};
    // BF16 mode: x, w and dy are BF16 (products exact, accumulation FP32 in VDPBF16PS or oneDNN's
    // emulation of it), y, dx and dw are FP32.
    const dt op = bf16_operands ? dt::bf16 : dt::f32;
    const memory::desc user_src(src_d, op, tag::nChw16c);
    const memory::desc user_dst(dst_d, op, tag::nChw16c);
    const memory::desc user_src_out(src_d, dt::f32, tag::nChw16c);
    const memory::desc user_dst_out(dst_d, dt::f32, tag::nChw16c);
    const memory::desc user_wei(wei_d, dt::f32, tag::oihw);
    const memory::desc wei_any(wei_d, op, tag::any);
    auto act = [](const memory::desc& user, const memory::dims& d, bool user_layout) {
      return user_layout ? user : memory::desc(d, user.data_type(), tag::any);
    };
    const dnnl::primitive_attr attr = user_scratchpad_attr();
    const auto algo = dnnl::algorithm::convolution_direct;

    using Fwd = dnnl::convolution_forward;
    using Bd = dnnl::convolution_backward_data;
    using Bw = dnnl::convolution_backward_weights;
    const auto fpd = choose_pd<Fwd::primitive_desc>([&](bool u) {
      return Fwd::primitive_desc(Fwd::desc(dnnl::prop_kind::forward_training, algo, act(user_src, src_d, u),
                                           wei_any, act(user_dst_out, dst_d, u), strides, pad, pad),
                                 attr, t.eng);
    });
    const auto bdpd = choose_pd<Bd::primitive_desc>([&](bool u) {
      return Bd::primitive_desc(
          Bd::desc(algo, act(user_src_out, src_d, u), wei_any, act(user_dst, dst_d, u), strides, pad, pad), attr, t.eng,
          fpd);
    });
    const auto bwpd = choose_pd<Bw::primitive_desc>([&](bool u) {
      return Bw::primitive_desc(
          Bw::desc(algo, act(user_src, src_d, u), memory::desc(wei_d, dt::f32, tag::any), act(user_dst, dst_d, u),
                   strides, pad, pad),
          attr, t.eng, fpd);
    });
    build(t, fpd, bdpd, bwpd, user_src, user_src_out, user_dst, user_dst_out, user_wei);
  } catch (const dnnl::error& e) {
    if (e.status == dnnl_out_of_memory)
      fail(Status::out_of_memory, name + ": out of memory creating the oneDNN " + (bf16_operands ? "BF16" : "FP32") +
                                      " convolution for " + conv_shape_text(s) + " (its buffers do not fit)");
    fail(Status::unsupported, name + ": oneDNN cannot create the " + (bf16_operands ? "BF16" : "FP32") +
                                  " convolution primitives for " +
                                  conv_shape_text(s) + ": " + e.what());
  }
}

ConvPrimitives::~ConvPrimitives() = default;
ConvPrimitives::ConvPrimitives(ConvPrimitives&&) noexcept = default;
ConvPrimitives& ConvPrimitives::operator=(ConvPrimitives&&) noexcept = default;

const std::string& ConvPrimitives::impl_forward() const noexcept { return impl_->t.impl_fwd; }
const std::string& ConvPrimitives::impl_backward_data() const noexcept { return impl_->t.impl_bd; }
const std::string& ConvPrimitives::impl_backward_weights() const noexcept { return impl_->t.impl_bw; }

void ConvPrimitives::set_weights(const float* w) { onednn::set_weights(impl_->t, w); }
void ConvPrimitives::forward(const void* x, float* y) { onednn::forward(impl_->t, x, y); }
void ConvPrimitives::backward_data(const void* dy, float* dx) { onednn::backward_data(impl_->t, dy, dx); }
void ConvPrimitives::backward_weights(const void* x, const void* dy, float* dw) {
  onednn::backward_weights(impl_->t, x, dy, dw);
}
void ConvPrimitives::inputs_rewritten() noexcept { impl_->t.x_ready = impl_->t.dy_ready = nullptr; }

// ---- inner product ---------------------------------------------------------------------------

struct InnerProductPrimitives::Impl {
  Training t;
};

InnerProductPrimitives::InnerProductPrimitives(int threads, int batch, int in_features, int out_features,
                                               const std::string& name)
    : impl_(std::make_unique<Impl>()) {
  Training& t = impl_->t;
  t.threads = threads;
  t.name = name;
  omp_set_num_threads(threads);
  try {
    t.eng = dnnl::engine(dnnl::engine::kind::cpu, 0);
    t.strm = dnnl::stream(t.eng);
    const memory::dims src_d = {batch, in_features};
    const memory::dims wei_d = {out_features, in_features};
    const memory::dims dst_d = {batch, out_features};
    const memory::desc user_src(src_d, dt::f32, tag::nc);
    const memory::desc user_dst(dst_d, dt::f32, tag::nc);
    const memory::desc user_wei(wei_d, dt::f32, tag::oi);
    const memory::desc wei_any(wei_d, dt::f32, tag::any);
    auto act = [](const memory::desc& user, const memory::dims& d, bool user_layout) {
      return user_layout ? user : memory::desc(d, dt::f32, tag::any);
    };
    const dnnl::primitive_attr attr = user_scratchpad_attr();

    using Fwd = dnnl::inner_product_forward;
    using Bd = dnnl::inner_product_backward_data;
    using Bw = dnnl::inner_product_backward_weights;
    const auto fpd = choose_pd<Fwd::primitive_desc>([&](bool u) {
      return Fwd::primitive_desc(
          Fwd::desc(dnnl::prop_kind::forward_training, act(user_src, src_d, u), wei_any, act(user_dst, dst_d, u)),
          attr, t.eng);
    });
    const auto bdpd = choose_pd<Bd::primitive_desc>([&](bool u) {
      return Bd::primitive_desc(Bd::desc(act(user_src, src_d, u), wei_any, act(user_dst, dst_d, u)), attr, t.eng,
                                fpd);
    });
    const auto bwpd = choose_pd<Bw::primitive_desc>([&](bool u) {
      return Bw::primitive_desc(Bw::desc(act(user_src, src_d, u), wei_any, act(user_dst, dst_d, u)), attr, t.eng,
                                fpd);
    });
    build(t, fpd, bdpd, bwpd, user_src, user_dst, user_wei);
  } catch (const dnnl::error& e) {
    if (e.status == dnnl_out_of_memory)
      fail(Status::out_of_memory, name + ": out of memory creating the oneDNN FP32 inner product for batch=" +
                                      std::to_string(batch) + " in_features=" + std::to_string(in_features) +
                                      " out_features=" + std::to_string(out_features));
    fail(Status::unsupported, name + ": oneDNN cannot create the FP32 inner-product primitives for batch=" +
                                  std::to_string(batch) + " in_features=" + std::to_string(in_features) +
                                  " out_features=" + std::to_string(out_features) + ": " + e.what());
  }
}

InnerProductPrimitives::~InnerProductPrimitives() = default;
InnerProductPrimitives::InnerProductPrimitives(InnerProductPrimitives&&) noexcept = default;
InnerProductPrimitives& InnerProductPrimitives::operator=(InnerProductPrimitives&&) noexcept = default;

const std::string& InnerProductPrimitives::impl_forward() const noexcept { return impl_->t.impl_fwd; }
const std::string& InnerProductPrimitives::impl_backward_data() const noexcept { return impl_->t.impl_bd; }
const std::string& InnerProductPrimitives::impl_backward_weights() const noexcept { return impl_->t.impl_bw; }

void InnerProductPrimitives::set_weights(const float* w) { onednn::set_weights(impl_->t, w); }
void InnerProductPrimitives::forward(const float* x, float* y) { onednn::forward(impl_->t, x, y); }
void InnerProductPrimitives::backward_data(const float* dy, float* dx) { onednn::backward_data(impl_->t, dy, dx); }
void InnerProductPrimitives::backward_weights(const float* x, const float* dy, float* dw) {
  onednn::backward_weights(impl_->t, x, dy, dw);
}
void InnerProductPrimitives::inputs_rewritten() noexcept { impl_->t.x_ready = impl_->t.dy_ready = nullptr; }

std::optional<ConvPrimitives> native_bf16_conv(int threads, const ConvShape& shape, const std::string& name) {
  try {
    ConvPrimitives p(threads, shape, name, true);
    // oneDNN's reference BF16 convolution (a CPU without AVX-512, where oneDNN 2.6 has no BF16
    // JIT code) is far slower than the FP32 JIT kernels on BF16-rounded operands.
    for (const std::string* impl : {&p.impl_forward(), &p.impl_backward_data(), &p.impl_backward_weights()})
      if (is_reference_impl(*impl)) return std::nullopt;
    return p;
  } catch (const Error&) {
    return std::nullopt;
  }
}

// ---- the kernel table's FP32 backends from avx512bw up -----------------------------------------
namespace {

// Either backend interface over its primitives: the passes have the same parameter types.
template <class Backend, class Primitives>
class Onednn final : public Backend {
 public:
  template <class... Args>
  explicit Onednn(Args&&... args) : p_(std::forward<Args>(args)...), impl_("onednn:" + p_.impl_forward()) {}
  const char* impl() const noexcept override { return impl_.c_str(); }
  void set_weights(const float* w) override { p_.set_weights(w); }
  void forward(const float* x, float* y) override { p_.forward(x, y); }
  void backward_data(const float* dy, float* dx) override { p_.backward_data(dy, dx); }
  void backward_weights(const float* x, const float* dy, float* dw) override { p_.backward_weights(x, dy, dw); }
  void inputs_rewritten() override { p_.inputs_rewritten(); }

 private:
  Primitives p_;
  std::string impl_;
};

class OnednnBf16 final : public ConvBf16Backend {
 public:
  explicit OnednnBf16(ConvPrimitives p)
      : p_(std::move(p)),
        fwd_("onednn:" + p_.impl_forward()),
        bd_("onednn:" + p_.impl_backward_data()),
        bw_("onednn:" + p_.impl_backward_weights()) {}
  const char* impl_forward() const noexcept override { return fwd_.c_str(); }
  const char* impl_backward_data() const noexcept override { return bd_.c_str(); }
  const char* impl_backward_weights() const noexcept override { return bw_.c_str(); }
  void set_weights(const float* w) override { p_.set_weights(w); }
  void forward(const uint16_t* x, float* y) override { p_.forward(x, y); }
  void backward_data(const uint16_t* dy, float* dx) override { p_.backward_data(dy, dx); }
  void backward_weights(const uint16_t* x, const uint16_t* dy, float* dw) override { p_.backward_weights(x, dy, dw); }

 private:
  ConvPrimitives p_;
  std::string fwd_, bd_, bw_;
};

}  // namespace

std::unique_ptr<ConvBf16Backend> make_conv_bf16(int threads, const ConvShape& shape, const std::string& name) {
  auto p = native_bf16_conv(threads, shape, name);
  if (!p) return nullptr;
  return std::make_unique<OnednnBf16>(std::move(*p));
}

std::unique_ptr<ConvF32Backend> make_conv_f32(int threads, const ConvShape& shape, const std::string& name) {
  return std::make_unique<Onednn<ConvF32Backend, ConvPrimitives>>(threads, shape, name);
}

std::unique_ptr<LinearF32Backend> make_linear_f32(int threads, int batch, int in_features, int out_features,
                                                  const std::string& name) {
  return std::make_unique<Onednn<LinearF32Backend, InnerProductPrimitives>>(threads, batch, in_features, out_features, name);
}

}  // namespace dfp::simd::onednn
