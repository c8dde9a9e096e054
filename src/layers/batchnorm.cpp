// BatchNorm2d over the blocked layout, with its fused ReLU and the DFP16 output it can hand to
// the next INT16 layer.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <limits>

#include <optional>

#include "dfp/float16.hpp"
#include "dfp/loss_scale.hpp"
#include "dfp/status.hpp"
#include "simd/kernel_table.hpp"
#include "src/core/aligned_buffer.hpp"
#include "src/layers/layer.hpp"
#include "src/layers/layer_args.hpp"
#include "src/layers/layer_helpers.hpp"

namespace dfp::model {
namespace {

// ---- BatchNorm2d ----------------------------------------------------------------------------

// Per-channel reductions run over (channel block, batch slice) tasks with a fixed number of
// slices, summed in slice order: both cores work even on a 16-channel layer, and results do not
// depend on the thread count. Within a task, runs of kRun pixels are reduced in FP32 lanes and
// combined in FP64: the forward statistics as each run's mean and squared deviations about it
// (bn_moments, Chan et al.), the backward sums as plain run totals (the error of a 256-term FP32
// sum at most).
class BatchNorm final : public Layer,
                        public AbsorbsRelu,
                        public MeasuresMaxima,
                        public FeedsSpans,
                        public FeedsGradSpans {
 public:
  explicit BatchNorm(double eps) : eps_(eps) {}
  TensorShape infer(const std::vector<TensorShape>& in) const override { return in[0]; }
  void build(const Context&, const std::vector<TensorShape>& in, const TensorShape&, const LayerPrecision& precision,
             std::mt19937_64&) override {
    s_ = in[0];
    const int cp = cb_of(s_) * 16;  // padded channels: padding lanes have gamma 0, so output 0
    gamma_.assign(cp, 0.f);
    std::fill(gamma_.begin(), gamma_.begin() + s_.c, 1.f);
    beta_.assign(cp, 0.f);
    ggamma_.assign(cp, 0.f);
    gbeta_.assign(cp, 0.f);
    running_mean_.assign(s_.c, 0.f);
    running_var_.assign(s_.c, 1.f);
    mean_.assign(cp, 0.f);
    invstd_.assign(cp, 0.f);
    slices_ = std::min(kSlices, s_.n);
    k1_.assign(cp, 0.f);
    k2_.assign(cp, 0.f);
    k3_.assign(cp, 0.f);
    part_a_.assign(size_t(cb_of(s_)) * slices_ * 16, 0.0);
    part_b_.assign(part_a_.size(), 0.0);
    part_n_.assign(size_t(cb_of(s_)) * slices_, 0.0);
    part_min_.assign(part_a_.size(), 0.f);
    part_max_.assign(part_a_.size(), 0.f);
    fa_.assign(cp, 0.f);
    job_.assign(size_t(cp) * 3, 0.0);
    lo_.assign(cp, 0.f);
    hi_.assign(cp, 0.f);
    const size_t planes = size_t(s_.n) * cb_of(s_);
    plane_lo_.assign(planes * 16, 0.f);
    plane_hi_.assign(planes * 16, 0.f);
    out_planes_.assign(planes, 0.f);
    in_grad_planes_.assign(planes, 0.f);
    fb_.assign(cp, 0.f);
    if (relu_) mask_ = AlignedBuffer<uint16_t>(s_.blocked_elements() / 16);
    // INT16 policy: the input saved for backward is kept as DFP16 (Das et al. keep every saved
    // activation in 16 bits); the statistics and the arithmetic stay FP32. Where that rounding is
    // deterministic, the output is computed from the saved DFP16 values too (from_saved_), so it
    // can be computed again from them after the forward pass (recompute_input_spans).
    if (precision.precision == Precision::int16) {
      xq_ = AlignedBuffer<int16_t>(s_.blocked_elements());
      xq_opts_ = precision.options.activations;
      xq_opts_.seed ^= std::hash<std::string>{}(name + ".saved_input");
      from_saved_ = xq_opts_.rounding != Rounding::stochastic;
    }
  }
  bool backward_reads_input(size_t) const override { return xq_.size() == 0; }
  // Fused ReLU: y = max(0, bn(x)) with the ReLU's bit mask (bit set: bn(x) > 0, the same test as
  // the ReLU kernels), and backward masks dy as it reads it. Bit-identical to BN then ReLU.
  bool absorb_relu() override {
    relu_ = true;
    return true;
  }
  // With the ReLU fused, the forward measures max|y| (the ReLU kernel returns it); the backward
  // always measures max|dx| (the apply kernel returns it).
  float output_max_abs() const override { return out_max_; }
  float input_grad_max_abs() const override { return in_grad_max_; }
  // The same per plane (for Granularity::slice exponents): max|y| from each plane's extremes of
  // x, as max|y| from each channel's; max|dx| from the apply kernel's result per plane.
  const float* output_plane_max() const override { return out_max_ >= 0.f ? out_planes_.data() : nullptr; }
  const float* input_grad_plane_max() const override { return in_grad_max_ >= 0.f ? in_grad_planes_.data() : nullptr; }
  bool forward_in_place(size_t) const override { return true; }
  bool backward_in_place(size_t) const override { return true; }  // dx after all the sums
  // The output's largest magnitude follows from each channel's extremes before the fact (y = x *
  // a + b is monotonic in x, and its rounding too), so the consumer (an INT16 conv, which needs
  // it first, a residual Add or a pool) can take the output as spans (see FeedsSpans, layer.hpp).
  // An INT16 conv that takes them computes its weight gradient's copy of them again from the saved
  // DFP16 input (recompute_input_spans) instead of keeping it between the passes.
  bool feed_spans_to(Layer* consumer, size_t slot) override {
    consumer_ = consumer->as<TakesInputSpans>();
    consumer_slot_ = slot;
    if (consumer_ && from_saved_)
      consumer_->recompute_input_spans(slot, &BatchNorm::recompute_span, this, &BatchNorm::recompute_pair_span);
    return consumer_ != nullptr;
  }
  // Backward: where this layer's input is an INT16 conv's output that only it reads, the conv's
  // dy (this layer's dx) is computed span by span as the conv quantizes it (grad_span), with the
  // saved DFP16 input (so under the INT16 policy only).
  bool feed_grad_spans_to(Layer* producer) override {
    grad_consumer_ = xq_.size() ? producer->as<TakesGradSpans>() : nullptr;
    if (grad_consumer_ && !grad_consumer_->accepts_grad_spans()) grad_consumer_ = nullptr;
    return grad_consumer_ != nullptr;
  }
  void forward(const Context& ctx, const std::vector<const float*>& x, float* y, const StepInfo& st) override {
    const int CB = cb_of(s_);
    const size_t hw = size_t(s_.h) * s_.w;
    const bool save_q = st.train && xq_.size() > 0;
    const uint64_t qseed = step_seed(xq_opts_.seed, st.step);
    xq_ready_ = false;
    if (st.train) {
      double m = double(s_.n) * hw;
      // One pass: each channel's mean, sum of squared deviations and extremes, and max|x|; under
      // the INT16 policy also the saved copy at the last step's exponent (see xq_ready_).
      const bool predict = save_q && from_saved_ && xq_exp_set_;
      const uint64_t nonfinite = moments(ctx, x[0], predict ? xq_exp_ : kNoExponent, qseed);
      if (st.statistics_sum) m = job_moments(*st.statistics_sum, m);
      float mx = 0.f;  // max|x|
      for (int c = 0; c < CB * 16; ++c) {  // combined over the slices, in slice order
        double mean = 0, m2 = 0, count = 0;
        lo_[c] = std::numeric_limits<float>::infinity();
        hi_[c] = -lo_[c];
        for (int sl = 0; sl < slices_; ++sl) {
          const size_t t = size_t(c / 16) * slices_ + sl, i = t * 16 + c % 16;
          combine_moments(mean, m2, count, part_a_[i], part_b_[i], part_n_[t]);
          count += part_n_[t];
          lo_[c] = part_min_[i] < lo_[c] ? part_min_[i] : lo_[c];
          hi_[c] = part_max_[i] > hi_[c] ? part_max_[i] : hi_[c];
        }
        if (st.statistics_sum) {  // the job's: from the summed moments (job_moments)
          mean = job_[size_t(c) * 2];
          m2 = job_[size_t(c) * 2 + 1];
        }
        mx = hi_[c] > mx ? hi_[c] : mx;
        mx = -lo_[c] > mx ? -lo_[c] : mx;
        const double var = m2 / m;
        mean_[c] = static_cast<float>(mean);
        invstd_[c] = static_cast<float>(1.0 / std::sqrt(var + eps_));
        if (c < s_.c) {  // PyTorch: running var uses the unbiased estimate
          running_mean_[c] = (1 - kMomentum) * running_mean_[c] + kMomentum * mean_[c];
          running_var_[c] = static_cast<float>((1 - kMomentum) * running_var_[c] +
                                               kMomentum * var * m / std::max(1.0, m - 1));
        }
      }
      if (save_q) {
        const int last = xq_exp_;
        xq_exp_ = dfp16_exponent(std::isfinite(mx) ? mx : 0.f, xq_opts_.headroom);
        xq_ready_ = predict && xq_exp_ == last && nonfinite == 0;
        xq_exp_set_ = true;
      }
    } else {
      for (int c = 0; c < cb_of(s_) * 16; ++c) {
        mean_[c] = c < s_.c ? running_mean_[c] : 0.f;
        invstd_[c] = c < s_.c ? 1.f / std::sqrt(running_var_[c] + eps_) : 0.f;
      }
    }
    for (int c = 0; c < CB * 16; ++c) {
      fa_[c] = gamma_[c] * invstd_[c];
      fb_[c] = beta_[c] - mean_[c] * fa_[c];
    }
    span_ = {x[0], save_q, qseed, &ctx};
    if (consumer_ && st.train && !st.sample) {
      // Fused into the consumer: max|y| of each plane from its extremes, through the same kernels
      // as the values themselves, and the tensor's as the largest (the channel's extremes are the
      // planes', and y is monotonic in x); then the spans on request.
      const auto scale_shift = ctx.kernels().bn_scale_shift.fn;
      // max|y| over the 16 lanes whose extremes of x are lo and hi.
      auto extreme = [&](int blk, const float* lo, const float* hi) {
        alignas(64) float ext[2][16], z[2][16];
        std::copy_n(lo, 16, ext[0]);
        std::copy_n(hi, 16, ext[1]);
        if (from_saved_) saved_values(ctx, &ext[0][0], 32);  // the rounding is monotonic
        scale_shift(&ext[0][0], &z[0][0], fa_.data() + blk * 16, fb_.data() + blk * 16, 2);
        float m = 0.f;
        for (int l = 0; l < 16; ++l)
          for (int k = 0; k < 2; ++k) {
            const float v = relu_ ? z[k][l] : std::fabs(z[k][l]);  // the ReLU's max: from 0
            m = v > m ? v : m;                                      // NaN never wins
          }
        return m;
      };
      float mx = 0.f;
      for (int n = 0; n < s_.n; ++n)
        for (int blk = 0; blk < CB; ++blk) {
          const size_t i = size_t(n) * CB + blk;
          out_planes_[i] = extreme(blk, plane_lo_.data() + i * 16, plane_hi_.data() + i * 16);
          mx = out_planes_[i] > mx ? out_planes_[i] : mx;
        }
      out_max_ = relu_ ? mx : -1.f;
      consumer_->take_input_spans(consumer_slot_, &BatchNorm::produce_span, this, mx, out_planes_.data(),
                                  &BatchNorm::produce_quantized_span, st);
      return;
    }
    std::atomic<float> out_max{0.f};
    for_blocks(ctx, s_.n, CB, [&](int n, int blk) {
      const size_t off = (size_t(n) * CB + blk) * plane(s_);
      const float m = normalize(off, blk, hw, y + off);  // y may overwrite x (in place)
      out_planes_[size_t(n) * CB + blk] = m;
      atomic_max(out_max, m);
    });
    out_max_ = relu_ ? out_max.load() : -1.f;
  }
  void backward(const Context& ctx, const std::vector<const float*>& x, const float* y, const float* dy,
                const std::vector<float*>& dx, const StepInfo& st) override {
    if (xq_.size()) backward_from(ctx, xq_.data(), std::ldexp(1.f, xq_exp_), dy, dx[0], st);
    else backward_from(ctx, x[0], 1.f, dy, dx[0], st);
  }
  void parameters(std::vector<Parameter>& out) override {
    // The padded lanes are part of the storage; their gradient is always 0, so they stay 0.
    out.push_back({name + ".weight", gamma_.data(), ggamma_.data(), gamma_.size(), true});
    out.push_back({name + ".bias", beta_.data(), gbeta_.data(), beta_.size(), true});
  }
  size_t count_parameters(const std::vector<TensorShape>& in) const override { return 2 * size_t(in[0].c); }
  void buffers(std::vector<std::pair<std::string, std::vector<float>*>>& out) override {
    out.push_back({name + ".running_mean", &running_mean_});
    out.push_back({name + ".running_var", &running_var_});
  }

 private:
  static constexpr int kSlices = 8;
  static constexpr size_t kRun = 256;
  static constexpr size_t kPiece = 128;  // pixels of normalize()'s pieces (8 KiB of FP32)

  // The forward's work on `pixels` pixels of channel block blk from element off of x (as of the
  // current forward, span_): the saved DFP16 copy, y = x * a + b into out (x: with from_saved_, the
  // saved copy's values, a piece at a time while it is in L1; the piece's own x where x is not
  // finite, whose non-finite values DFP16 cannot hold), and the fused ReLU with its mask. Returns
  // the ReLU's max (0 without it).
  float normalize(size_t off, int blk, size_t pixels, float* out) {
    const Context& ctx = *span_.ctx;
    const float* p = span_.x + off;
    const auto& k = ctx.kernels();
    const float *a = fa_.data() + blk * 16, *b = fb_.data() + blk * 16;
    if (xq_ready_) {  // the moments' pass saved x (a training step, from_saved_): only xq is read
      for (size_t i = 0; i < pixels; i += kPiece)
        from_saved(k, off + i * 16, blk, std::min(kPiece, pixels - i), out + i * 16);
    } else if (span_.save_q && from_saved_) {  // each piece read before out, which may overwrite x, is written
      for (size_t i = 0; i < pixels; i += kPiece) {
        const size_t np = std::min(kPiece, pixels - i), o = off + i * 16;
        simd::QuantCounters cnt;
        k.quantize.fn(p + i * 16, xq_.data() + o, np * 16, xq_exp_, xq_opts_.rounding, span_.qseed, o, &cnt);
        if (cnt.nonfinite == 0)
          from_saved(k, o, blk, np, out + i * 16);
        else
          k.bn_scale_shift.fn(p + i * 16, out + i * 16, a, b, np);
      }
    } else {
      if (span_.save_q) {  // before out, which may overwrite x (in place)
        simd::QuantCounters cnt;
        k.quantize.fn(p, xq_.data() + off, pixels * 16, xq_exp_, xq_opts_.rounding, span_.qseed, off, &cnt);
      }
      k.bn_scale_shift.fn(p, out, a, b, pixels);
    }
    return relu_ ? k.relu_fwd.fn(out, out, mask_.data() + off / 16, pixels * 16) : 0.f;  // in cache
  }
  // y = x * a + b for `pixels` pixels of block blk from element off of the saved DFP16 copy: what
  // normalize() writes and recompute_span() writes again, one sequence of kernels for both.
  void from_saved(const simd::KernelTable& k, size_t off, int blk, size_t pixels, float* out) const {
    k.dequantize.fn(xq_.data() + off, out, pixels * 16, xq_exp_);
    k.bn_scale_shift.fn(out, out, fa_.data() + blk * 16, fb_.data() + blk * 16, pixels);
  }
  static size_t span_offset(const BatchNorm& bn, int n, int b, int h, int w0) {
    return (size_t(n) * cb_of(bn.s_) + b) * plane(bn.s_) + (size_t(h) * bn.s_.w + w0) * 16;
  }
  static void produce_span(void* self, int n, int b, int h, int w0, int count, float* out) {
    BatchNorm& bn = *static_cast<BatchNorm*>(self);
    bn.normalize(span_offset(bn, n, b, h, w0), b, size_t(count), out);
  }
  // The span quantized at 2^exponent in one kernel, where the moments' pass saved x (xq_ready_):
  // the bits of produce_span and the quantization after it, with the ReLU's mask; false where
  // x was not saved or an element would count (produce_span then runs).
  static bool produce_quantized_span(void* self, int n, int b, int h, int w0, int count, int exponent, int16_t* out,
                                     int32_t* max_q) {
    BatchNorm& bn = *static_cast<BatchNorm*>(self);
    if (!bn.xq_ready_) return false;
    const size_t off = span_offset(bn, n, b, h, w0);
    uint16_t* mask = bn.relu_ ? bn.mask_.data() + off / 16 : nullptr;
    return bn.span_.ctx->kernels().bn_requantize.fn(bn.xq_.data() + off, bn.xq_exp_, bn.fa_.data() + b * 16,
                                                    bn.fb_.data() + b * 16, mask, exponent, out, size_t(count), max_q);
  }
  // The same span again after the forward pass, until backward (from_saved_): from the saved
  // DFP16 values through the same kernels, so the same bits; nothing is saved again.
  static void recompute_span(void* self, int n, int b, int h, int w0, int count, float* out) {
    const BatchNorm& bn = *static_cast<const BatchNorm*>(self);
    const auto& k = bn.span_.ctx->kernels();
    const size_t len = size_t(count) * 16;
    bn.from_saved(k, span_offset(bn, n, b, h, w0), b, size_t(count), out);
    if (!bn.relu_) return;
    alignas(64) uint16_t mask[(kPiece * 16 + 15) / 16];  // the forward's mask stays
    for (size_t i = 0; i < len; i += kPiece * 16) k.relu_fwd.fn(out + i, out + i, mask, std::min(kPiece * 16, len - i));
  }
  // The spans of images n and n + 1 (images 2) again, quantized at 2^exponent into a batch-pair
  // layout in one pass: the bits of recompute_span and the quantization after it (the kernel
  // declines a piece that the quantization would count, and recompute_span then runs).
  static bool recompute_pair_span(void* self, int n, int images, int b, int h, int w0, int count, int exponent,
                                  int16_t* out, int32_t* max_q) {
    const BatchNorm& bn = *static_cast<const BatchNorm*>(self);
    const int16_t* a = bn.xq_.data() + span_offset(bn, n, b, h, w0);
    const int16_t* second = images == 2 ? bn.xq_.data() + span_offset(bn, n + 1, b, h, w0) : nullptr;
    return bn.span_.ctx->kernels().bn_requantize_pair.fn(a, second, bn.xq_exp_, bn.fa_.data() + b * 16,
                                                          bn.fb_.data() + b * 16, bn.relu_, exponent, out,
                                                          size_t(count), max_q);
  }
  // v (n floats) as the saved copy holds them: rounded to DFP16 at its exponent and back, unless
  // one is not finite (normalize takes such x itself).
  void saved_values(const Context& ctx, float* v, size_t n) const {
    alignas(64) int16_t q[32];
    for (size_t i = 0; i < n; i += 32) {
      const size_t m = std::min<size_t>(32, n - i);
      simd::QuantCounters cnt;
      ctx.kernels().quantize.fn(v + i, q, m, xq_exp_, xq_opts_.rounding, 0, 0, &cnt);
      if (cnt.nonfinite == 0) ctx.kernels().dequantize.fn(q, v + i, m, xq_exp_);
    }
  }

  // Per (channel block, batch slice) task: runs of at most kRun pixels of each plane through
  // bn_moments (one pass over memory), combined in FP64 in run order: part_a_ the mean and part_b_
  // the sum of squared deviations per lane over part_n_ values, part_min_ and part_max_ the extremes.
  // With an exponent (not kNoExponent), each run is also quantized at it into xq_ while in L1, as
  // normalize() would (the same kernel, elements and seed); returns the non-finite values it met.
  uint64_t moments(const Context& ctx, const float* x, int exponent, uint64_t qseed) {
    std::atomic<uint64_t> nonfinite{0};
    const auto quantize = ctx.kernels().quantize.fn;
    reset_extremes();
    const int S = slices_, CB = cb_of(s_);
    const size_t hw = size_t(s_.h) * s_.w;
    const auto run_moments = ctx.kernels().bn_moments.fn;
    ctx.parallel_for(int64_t(CB) * S, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int blk = int(t / S), sl = int(t % S);
        double* A = part_a_.data() + size_t(t) * 16;
        double* B = part_b_.data() + size_t(t) * 16;
        std::fill(A, A + 16, 0.0);
        std::fill(B, B + 16, 0.0);
        double count = 0;
        float* lo = part_min_.data() + size_t(t) * 16;
        float* hi = part_max_.data() + size_t(t) * 16;
        simd::QuantCounters cnt;
        for (int n = sl * s_.n / S; n < (sl + 1) * s_.n / S; ++n) {
          const size_t off = (size_t(n) * CB + blk) * plane(s_);
          // The plane's own extremes (each plane's max|y| for Granularity::slice), then the slice's.
          float* plo = plane_lo_.data() + (size_t(n) * CB + blk) * 16;
          float* phi = plane_hi_.data() + (size_t(n) * CB + blk) * 16;
          std::fill(plo, plo + 16, std::numeric_limits<float>::infinity());
          std::fill(phi, phi + 16, -std::numeric_limits<float>::infinity());
          for (size_t i0 = 0; i0 < hw; i0 += kRun) {
            const size_t np = std::min(hw, i0 + kRun) - i0;
            alignas(64) float c[16], d[16], q[16];
            run_moments(x + off + i0 * 16, np, c, d, q, plo, phi);
            if (exponent != kNoExponent) {
              const size_t e = off + i0 * 16;
              quantize(x + e, xq_.data() + e, np * 16, exponent, xq_opts_.rounding, qseed, e, &cnt);
            }
            const double r = double(np);
            for (int l = 0; l < 16; ++l) {
              const double dev = d[l];  // the run's mean and squared deviations about it
              combine_moments(A[l], B[l], count, double(c[l]) + dev / r, std::max(0.0, double(q[l]) - dev * dev / r), r);
            }
            count += r;
          }
          for (int l = 0; l < 16; ++l) {  // the kernel's comparisons: NaN never wins
            lo[l] = plo[l] < lo[l] ? plo[l] : lo[l];
            hi[l] = phi[l] > hi[l] ? phi[l] : hi[l];
          }
        }
        part_n_[size_t(t)] = count;
        atomic_add_nonzero(nonfinite, cnt.nonfinite);
      }
    });
    return nonfinite.load();
  }
  // Synchronised statistics: each channel's count, sum and sum of squares over the job (this
  // process's from its moments), turned into the job's mean and sum of squared deviations at
  // job_[2c], job_[2c + 1]; returns the job's count of values per channel.
  double job_moments(const std::function<void(double*, size_t)>& sum, double m) {
    const int cp = cb_of(s_) * 16;
    for (int c = 0; c < cp; ++c) {
      double mean = 0, m2 = 0, count = 0;
      for (int sl = 0; sl < slices_; ++sl) {
        const size_t t = size_t(c / 16) * slices_ + sl, i = t * 16 + c % 16;
        combine_moments(mean, m2, count, part_a_[i], part_b_[i], part_n_[t]);
        count += part_n_[t];
      }
      job_[size_t(c) * 3] = m;
      job_[size_t(c) * 3 + 1] = mean * m;
      job_[size_t(c) * 3 + 2] = m2 + mean * mean * m;
    }
    sum(job_.data(), job_.size());
    job_count_ = job_[0];
    for (int c = 0; c < cp; ++c) {
      const double n = job_[size_t(c) * 3], mean = job_[size_t(c) * 3 + 1] / n;
      const double m2 = std::max(0.0, job_[size_t(c) * 3 + 2] - mean * mean * n);
      job_[size_t(c) * 2] = mean;  // packed in place: entry 2c is read after 3c, 3c+1, 3c+2 are
      job_[size_t(c) * 2 + 1] = m2;
    }
    return job_count_;
  }

  void reset_extremes() {
    std::fill(part_min_.begin(), part_min_.end(), std::numeric_limits<float>::infinity());
    std::fill(part_max_.begin(), part_max_.end(), -std::numeric_limits<float>::infinity());
  }
  // Adds a part of `count_b` values with mean mean_b and sum of squared deviations m2_b to one of
  // `count` values (Chan, Golub and LeVeque's pairwise update).
  static void combine_moments(double& mean, double& m2, double count, double mean_b, double m2_b, double count_b) {
    const double total = count + count_b, delta = mean_b - mean;
    mean += delta * (count_b / total);
    m2 += m2_b + delta * delta * (count * count_b / total);
  }

  // Backward's sums: calls term(blk, first element, pixels, a[16], b[16], lo[16], hi[16]) over
  // runs of at most kRun pixels of every plane, accumulating into FP32 lanes that each run starts
  // at zero, then adds each run's lanes into the FP64 partials part_a_, part_b_ per (channel
  // block, batch slice, lane); the gradient's extremes run on over a task's runs in part_min_,
  // part_max_ (the forward's are spent by then: lo_, hi_ hold what it needs of them).
  template <class Term>
  void reduce(const Context& ctx, Term term) {
    std::fill(part_a_.begin(), part_a_.end(), 0.0);
    std::fill(part_b_.begin(), part_b_.end(), 0.0);
    reset_extremes();
    const int S = slices_, CB = cb_of(s_);
    const size_t hw = size_t(s_.h) * s_.w;
    ctx.parallel_for(int64_t(CB) * S, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int blk = int(t / S), sl = int(t % S);
        double* A = part_a_.data() + size_t(t) * 16;
        double* B = part_b_.data() + size_t(t) * 16;
        for (int n = sl * s_.n / S; n < (sl + 1) * s_.n / S; ++n) {
          const size_t off = (size_t(n) * CB + blk) * plane(s_);
          for (size_t i0 = 0; i0 < hw; i0 += kRun) {
            alignas(64) float fa[16] = {}, fb[16] = {};
            term(blk, off + i0 * 16, std::min(hw, i0 + kRun) - i0, fa, fb, part_min_.data() + size_t(t) * 16,
                 part_max_.data() + size_t(t) * 16);
            for (int l = 0; l < 16; ++l) { A[l] += fa[l]; B[l] += fb[l]; }
          }
        }
      }
    });
  }
  // Channel c's total over the slices, in slice order.
  double total(const std::vector<double>& part, int c) const {
    double t = 0;
    for (int sl = 0; sl < slices_; ++sl) t += part[(size_t(c / 16) * slices_ + sl) * 16 + c % 16];
    return t;
  }

  // The backward kernels' coefficients for channel block blk.
  simd::BnCoefficients coefficients(int blk, float x_scale) const {
    return simd::BnCoefficients{mean_.data() + blk * 16, invstd_.data() + blk * 16, k1_.data() + blk * 16,
                                k2_.data() + blk * 16, k3_.data() + blk * 16, x_scale};
  }
  // x[i] * x_scale is the saved input (FP32, or DFP16 with x_scale = 2^e). Where the conv before
  // this layer takes dx as spans (feed_grad_spans_to), dx is not written here.
  template <class T>
  void backward_from(const Context& ctx, const T* x, float x_scale, const float* dy, float* dx, const StepInfo& st) {
    const std::function<void(double*, size_t)>* sums = st.statistics_sum;
    const int CB = cb_of(s_);
    const size_t hw = size_t(s_.h) * s_.w;
    const double m = sums ? job_count_ : double(s_.n) * hw;
    // Fused ReLU: the kernels read dy through its mask (0 where the ReLU blocked it).
    const uint16_t* mask = relu_ ? mask_.data() : nullptr;
    auto coefficients = [&](int blk) { return this->coefficients(blk, x_scale); };
    auto term = [&](int blk, size_t e, size_t np, float* sdy, float* sdyx, float* glo, float* ghi) {
      const uint16_t* m = mask ? mask + e / 16 : nullptr;
      if constexpr (std::is_same_v<T, int16_t>)
        ctx.kernels().bn_bwd_sums_s16.fn(x + e, dy + e, m, coefficients(blk), np, sdy, sdyx, glo, ghi);
      else
        ctx.kernels().bn_bwd_sums_f32.fn(x + e, dy + e, m, coefficients(blk), np, sdy, sdyx, glo, ghi);
    };
    reduce(ctx, term);
    if (sums) {  // the job's sums (dx); the parameter gradients stay this process's own
      for (int c = 0; c < CB * 16; ++c) {
        job_[size_t(c) * 2] = total(part_a_, c);
        job_[size_t(c) * 2 + 1] = total(part_b_, c);
      }
      (*sums)(job_.data(), job_.size());
    }
    for (int c = 0; c < CB * 16; ++c) {
      const double sdy_own = total(part_a_, c), sdyx_own = total(part_b_, c);
      ggamma_[c] = c < s_.c ? static_cast<float>(sdyx_own) : 0.f;
      gbeta_[c] = c < s_.c ? static_cast<float>(sdy_own) : 0.f;
      const double sdy = sums ? job_[size_t(c) * 2] : sdy_own, sdyx = sums ? job_[size_t(c) * 2 + 1] : sdyx_own;
      // dx = gamma*inv/m * (m*dy - sum(dy) - xhat*sum(dy*xhat))
      k1_[c] = gamma_[c] * invstd_[c];
      k2_[c] = static_cast<float>(sdy / m);
      k3_[c] = static_cast<float>(sdyx / m);
    }
    in_grad_max_ = -1.f;
    if (!dx) return;
    if constexpr (std::is_same_v<T, int16_t>) {
      if (grad_consumer_ && st.grad_spans && !st.sample) {
        const float estimate = grad_max_estimate();
        if (estimate >= 0.f) {
          grad_ = {dy, &ctx};
          grad_consumer_->take_grad_spans(&BatchNorm::grad_span, this, estimate, &BatchNorm::grad_quantized_span, st);
          return;
        }
      }
    }
    std::atomic<float> dx_max{0.f};
    for_blocks(ctx, s_.n, CB, [&](int n, int blk) {
      const size_t off = (size_t(n) * CB + blk) * plane(s_);
      // dx may be dy (in place): each element is read before it is written.
      const uint16_t* mp = mask ? mask + off / 16 : nullptr;
      float m;
      if constexpr (std::is_same_v<T, int16_t>)
        m = ctx.kernels().bn_bwd_apply_s16.fn(x + off, dy + off, mp, dx + off, coefficients(blk), hw, 0.f);
      else
        m = ctx.kernels().bn_bwd_apply_f32.fn(x + off, dy + off, mp, dx + off, coefficients(blk), hw, 0.f);
      in_grad_planes_[size_t(n) * CB + blk] = m;
      atomic_max(dx_max, m);
    });
    in_grad_max_ = dx_max.load();
  }

  // The conv's dy for one span: dx of `count` pixels from the saved DFP16 input and dy, through
  // the apply kernel that writes the whole tensor otherwise (the same bits); returns max|dx|.
  static float grad_span(void* self, int n, int b, int h, int w0, int count, float* out) {
    const BatchNorm& bn = *static_cast<const BatchNorm*>(self);
    const size_t off = span_offset(bn, n, b, h, w0);
    return bn.grad_.ctx->kernels().bn_bwd_apply_s16.fn(bn.xq_.data() + off, bn.grad_.dy + off,
                                                        bn.relu_ ? bn.mask_.data() + off / 16 : nullptr, out,
                                                        bn.coefficients(b, std::ldexp(1.f, bn.xq_exp_)), size_t(count),
                                                        0.f);
  }
  // The same span quantized at 2^exponent as it is computed (the bits of grad_span and the
  // quantization after it); -1 where an element would count (grad_span then runs).
  static float grad_quantized_span(void* self, int n, int b, int h, int w0, int count, int exponent, int16_t* out,
                                   int32_t* max_q) {
    const BatchNorm& bn = *static_cast<const BatchNorm*>(self);
    const size_t off = span_offset(bn, n, b, h, w0);
    return bn.grad_.ctx->kernels().bn_bwd_requantize.fn(
        bn.xq_.data() + off, bn.grad_.dy + off, bn.relu_ ? bn.mask_.data() + off / 16 : nullptr,
        bn.coefficients(b, std::ldexp(1.f, bn.xq_exp_)), size_t(count), exponent, out, max_q);
  }
  // An estimate of max|dx| before any dx is computed, from each channel's extremes of the masked
  // dy (the sums' pass) and of x (the forward's): dx = k1 (g - k2 - xhat k3) is affine in (g,
  // xhat), so over the box of the two ranges its magnitude is largest at a corner. That bounds
  // the exact dx (less the FP32 roundings), which is what the conv needs to quantize dy at the
  // exponent of max|dx| on the first pass over the spans; it checks and redoes a miss.
  // Negative where not finite (a non-finite gradient takes the plain path).
  float grad_max_estimate() const {
    double m = 0;
    for (int c = 0; c < s_.c; ++c) {
      float glo = std::numeric_limits<float>::infinity(), ghi = -glo;
      for (int sl = 0; sl < slices_; ++sl) {
        const size_t i = (size_t(c / 16) * slices_ + sl) * 16 + c % 16;
        glo = std::min(glo, part_min_[i]);
        ghi = std::max(ghi, part_max_[i]);
      }
      const double xl = (double(lo_[c]) - mean_[c]) * invstd_[c], xh = (double(hi_[c]) - mean_[c]) * invstd_[c];
      const double a = xl * k3_[c], b = xh * k3_[c];
      const double t0 = double(glo) - k2_[c] - std::max(a, b), t1 = double(ghi) - k2_[c] - std::min(a, b);
      m = std::max(m, std::fabs(double(k1_[c])) * std::max(std::fabs(t0), std::fabs(t1)));
    }
    return std::isfinite(m) && m < 1e30 ? static_cast<float>(m) : -1.f;
  }

  static constexpr double kMomentum = 0.1;
  double eps_;  // added to the variance, as PyTorch's eps
  TensorShape s_;
  std::vector<float> gamma_, beta_, ggamma_, gbeta_, running_mean_, running_var_, mean_, invstd_;
  std::vector<double> job_;  // synchronised statistics: the job's sums (set_statistics_sum)
  double job_count_ = 0;     // values per channel over the job's batch, from the last training forward
  std::vector<float> k1_, k2_, k3_;  // backward's per-channel coefficients
  int slices_ = 1;
  std::vector<double> part_a_, part_b_;  // per (channel block, slice, lane)
  std::vector<double> part_n_;           // forward: values per (channel block, slice)
  std::vector<float> part_min_, part_max_;  // extremes per (block, slice, lane): of x (forward), of the masked dy (backward)
  std::vector<float> fa_, fb_;           // forward: y = x * fa_ + fb_ per channel
  std::vector<float> lo_, hi_;           // forward (training): each channel's min and max of x
  std::vector<float> plane_lo_, plane_hi_;  // the same per plane, [N][CB][16]
  std::vector<float> out_planes_, in_grad_planes_;  // output_plane_max(), input_grad_plane_max()
  struct Span {                          // what normalize() reads, set by each forward()
    const float* x = nullptr;
    bool save_q = false;
    uint64_t qseed = 0;
    const Context* ctx = nullptr;
  } span_;
  struct GradSpan {                      // what grad_span() reads, set by each backward() that feeds
    const float* dy = nullptr;
    const Context* ctx = nullptr;
  } grad_;
  TakesGradSpans* grad_consumer_ = nullptr;  // takes dx as spans (feed_grad_spans_to)
  TakesInputSpans* consumer_ = nullptr;  // takes the output as spans (feed_spans_to)
  size_t consumer_slot_ = 0;             // as its input consumer_slot_
  AlignedBuffer<int16_t> xq_;  // the saved input as DFP16 (INT16 policy), exponent xq_exp_
  int xq_exp_ = 0;
  // The exponent of a tensor's max|x| seldom changes from one step to the next: the moments' pass,
  // which reads x anyway, quantizes it at the last step's exponent, and where that is this step's
  // (and every value finite) normalize() reads only xq_, 2 bytes a value where x is 4: the bits of
  // quantizing after the moments, since the same kernel rounds each value alone. Otherwise
  // normalize() quantizes x again at this step's exponent, as without the prediction.
  static constexpr int kNoExponent = std::numeric_limits<int>::min();  // moments(): quantize nothing
  bool xq_exp_set_ = false;  // a training forward has set xq_exp_ (the next one's prediction)
  bool xq_ready_ = false;    // xq_ holds this step's saved input (the prediction held)
  QuantOptions xq_opts_;
  bool from_saved_ = false;    // the output is computed from xq_'s values (deterministic rounding)
  bool relu_ = false;              // the following ReLU is applied here
  AlignedBuffer<uint16_t> mask_;   // its bit mask (relu_ only)
  float out_max_ = -1.f, in_grad_max_ = -1.f;
};

}  // namespace

std::unique_ptr<Layer> build_batchnorm(const LayerParams& params, const LayerArgs& a) {
  const double eps = std::get<BatchNormParams>(params).eps;
  a.need(std::isfinite(eps) && eps > 0, "eps", "a positive finite number", std::to_string(eps));
  return std::make_unique<BatchNorm>(eps);
}

}  // namespace dfp::model
