// The bucketed gradient allreduce (src/parallel/data_parallel.hpp).
#include "src/parallel/data_parallel.hpp"

#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "dfp/context.hpp"
#include "dfp/dfp16.hpp"
#include "dfp/float16.hpp"
#include "dfp/model.hpp"
#include "dfp/status.hpp"
#include "base/named_enum.hpp"
#include "base/random.hpp"

namespace dfp::parallel {

namespace {

constexpr uint64_t kAllreduceSalt = 0x414C4C524544ull;  // "ALLRED": the stochastic rounding of gradients

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

GradFormat parse_grad_format(const std::string& text, const std::string& origin) {
  return parse_named(text, {GradFormat::fp32, GradFormat::bf16, GradFormat::dfp16}, grad_format_name, origin,
                     "gradient format");
}

const char* grad_format_name(GradFormat f) noexcept {
  switch (f) {
    case GradFormat::fp32: return "fp32";
    case GradFormat::bf16: return "bf16";
    case GradFormat::dfp16: return "dfp16";
  }
  return "?";
}

GradientReducer::GradientReducer(const Context& ctx, Comm& comm, Model& model, GradFormat format, size_t bucket_bytes,
                                 bool error_feedback, uint64_t seed)
    : ctx_(ctx), comm_(comm), model_(model), format_(format), error_feedback_(error_feedback && format == GradFormat::dfp16),
      seed_(seed) {
  DFP_CHECK(comm.size() <= 32767, Status::invalid_argument,
            "data-parallel job of " + std::to_string(comm.size()) + " ranks: expected at most 32767 (the INT16 sum's headroom)");
  headroom_ = std::bit_width(unsigned(comm.size()));  // 2^h > N: N values of magnitude <= 2^(15-h) sum below 2^15
  const std::vector<Parameter>& ps = model.parameters();
  bucket_of_.assign(ps.size(), 0);
  // Backward finalises the parameters from the last to the first: buckets fill in that order.
  size_t total = 0;
  for (size_t p = ps.size(); p-- > 0;) {
    if (buckets_.empty() || buckets_.back().size * sizeof(float) >= bucket_bytes) {
      Bucket b;
      b.last = p + 1;
      b.offset = total;
      buckets_.push_back(b);
    }
    Bucket& b = buckets_.back();
    b.first = p;
    b.size += ps[p].size;
    total += ps[p].size;
    bucket_of_[p] = buckets_.size() - 1;
  }
  flat_.assign(total, 0.f);
  if (format != GradFormat::fp32) packed_.assign(total, 0);
  if (error_feedback_) residual_.assign(total, 0.f);
  comm.reserve_slots(int(buckets_.size()));
  quant_.rounding = Rounding::stochastic;
  quant_.nonfinite = NonFinitePolicy::count;
  quant_.name = "gradients";
  model.set_gradient_hook([this](size_t first, size_t last) { on_layer(first, last); });
}

GradientReducer::~GradientReducer() { model_.set_gradient_hook({}); }

void GradientReducer::begin_step(uint64_t step) {
  step_ = step;
  comm_.set_step(step);
  for (Bucket& b : buckets_) {
    b.remaining = int(b.last - b.first);
    b.stage = Stage::waiting;
  }
  any_nonfinite_ = false;
  first_start_ = -1;
}

void GradientReducer::on_layer(size_t first, size_t last) {
  if (format_ == GradFormat::dfp16)  // the max of a bucket launched a layer ago: its sum starts now
    for (size_t b = 0; b < buckets_.size(); ++b) start_sum(b);
  for (size_t p = first; p < last; ++p) {
    const size_t b = bucket_of_[p];
    if (--buckets_[b].remaining == 0) launch(b);
  }
  progress();
}

// The bucket's gradients, in parameter order, into dst (plus the residual under error feedback).
void GradientReducer::copy_in(const Bucket& bk, float* dst, bool add_residual) const {
  const std::vector<Parameter>& ps = model_.parameters();
  size_t at = 0;
  for (size_t p = bk.first; p < bk.last; ++p) {
    std::memcpy(dst + at, ps[p].grad, ps[p].size * sizeof(float));
    at += ps[p].size;
  }
  if (add_residual)
    for (size_t i = 0; i < bk.size; ++i) dst[i] += residual_[bk.offset + i];
}

// Every rank must start the collectives of a communicator in the same order, so each one starts
// at a point of the step that does not depend on timing: a bucket's allreduce (dfp16: its max) when
// backward completes it, and dfp16's sum after the next layer's backward (or in finish()), once
// that bucket's max (4 bytes, started a layer earlier) is waited for.
void GradientReducer::launch(size_t b) {
  Bucket& bk = buckets_[b];
  if (first_start_ < 0) first_start_ = now_seconds();
  float* flat = flat_.data() + bk.offset;
  int16_t* packed = packed_.data() + bk.offset;
  switch (format_) {
    case GradFormat::fp32:
      copy_in(bk, flat, false);
      comm_.start_allreduce(int(b), flat, bk.size, Type::f32, Op::sum);
      bk.stage = Stage::sum;
      break;
    case GradFormat::bf16: {
      copy_in(bk, flat, false);
      auto* h = reinterpret_cast<uint16_t*>(packed);
      for (size_t i = 0; i < bk.size; ++i) h[i] = f32_to_bf16(flat[i]);
      comm_.start_allreduce(int(b), packed, bk.size, Type::bf16, Op::sum);
      bk.stage = Stage::sum;
      break;
    }
    case GradFormat::dfp16: {
      copy_in(bk, flat, error_feedback_);
      float m = 0.f;
      bool finite = true;
      for (size_t i = 0; i < bk.size; ++i) {
        const float a = std::fabs(flat[i]);
        finite &= std::isfinite(a);
        m = a > m ? a : m;
      }
      // A non-finite gradient on any rank makes the agreed maximum infinite on every rank.
      bk.max = finite ? m : std::numeric_limits<float>::infinity();
      comm_.start_allreduce(int(b), &bk.max, 1, Type::f32, Op::max);
      bk.stage = Stage::max;
      break;
    }
  }
}

// dfp16: once the bucket's max is agreed, its INT16 values and their sum.
void GradientReducer::start_sum(size_t b) {
  Bucket& bk = buckets_[b];
  if (bk.stage != Stage::max) return;
  comm_.wait(int(b), "the gradient allreduce (a bucket's max)");
  bk.stage = Stage::max_done;
  {
    if (!std::isfinite(bk.max)) {  // the step is skipped everywhere: nothing to sum
      any_nonfinite_ = true;
      bk.stage = Stage::done;
      last_done_ = now_seconds();
      return;
    }
    // The largest magnitude maps into [2^(14-h), 2^(15-h)): stochastic rounding stays <= 2^(15-h).
    bk.exponent = bk.max > 0 ? std::ilogb(bk.max) - 14 + headroom_ : 0;
    quant_.seed = stream_key(seed_, kAllreduceSalt, step_, uint64_t(comm_.rank()) << 32 | b);
    float* flat = flat_.data() + bk.offset;
    int16_t* packed = packed_.data() + bk.offset;
    quantize_dfp16_with_exponent(ctx_, flat, packed, bk.size, bk.exponent, quant_);
    if (error_feedback_) {
      const float unit = std::ldexp(1.f, bk.exponent);
      for (size_t i = 0; i < bk.size; ++i) residual_[bk.offset + i] = flat[i] - float(packed[i]) * unit;
    }
    comm_.start_allreduce(int(b), packed, bk.size, Type::i16, Op::sum);
    bk.stage = Stage::sum;
  }
}

// The bucket's sum is in: the mean into the parameters' gradients.
void GradientReducer::advance(size_t b) {
  Bucket& bk = buckets_[b];
  const std::vector<Parameter>& ps = model_.parameters();
  const float inv_n = 1.f / float(comm_.size());
  size_t at = bk.offset;
  if (format_ == GradFormat::fp32) {
    for (size_t p = bk.first; p < bk.last; ++p)
      for (size_t i = 0; i < ps[p].size; ++i) ps[p].grad[i] = flat_[at++] * inv_n;
  } else if (format_ == GradFormat::bf16) {
    const auto* h = reinterpret_cast<const uint16_t*>(packed_.data());
    for (size_t p = bk.first; p < bk.last; ++p)
      for (size_t i = 0; i < ps[p].size; ++i) ps[p].grad[i] = bf16_to_f32(h[at++]) * inv_n;
  } else {
    const double unit = std::ldexp(1.0, bk.exponent) / comm_.size();
    for (size_t p = bk.first; p < bk.last; ++p)
      for (size_t i = 0; i < ps[p].size; ++i) ps[p].grad[i] = float(packed_[at++] * unit);
  }
  bk.stage = Stage::done;
  last_done_ = now_seconds();
}

void GradientReducer::progress() {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bk = buckets_[b];
    if (bk.stage == Stage::sum && comm_.test(int(b))) advance(b);
    else if (bk.stage == Stage::max) comm_.test(int(b));  // progress only: its sum starts in order
  }
}

bool GradientReducer::finish(bool local_finite) {
  const double t0 = now_seconds();
  for (size_t b = 0; b < buckets_.size(); ++b)  // parameters backward did not reach (no path to the loss)
    if (buckets_[b].stage == Stage::waiting) launch(b);
  if (format_ == GradFormat::dfp16)
    for (size_t b = 0; b < buckets_.size(); ++b) start_sum(b);  // the last one (or any left behind)
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (buckets_[b].stage == Stage::sum) {
      comm_.wait(int(b), "the gradient allreduce");
      advance(b);
    }
  const double t1 = now_seconds();
  int64_t finite = local_finite && !any_nonfinite_ ? 1 : 0;
  comm_.allreduce(&finite, 1, Type::i64, Op::min, "the agreement on finite gradients");
  ++stats_.steps;
  stats_.exposed_seconds += t1 - t0;
  stats_.in_flight_seconds += last_done_ - first_start_;
  for (const Bucket& bk : buckets_) {
    stats_.fp32_bytes += bk.size * sizeof(float);
    stats_.bytes += format_ == GradFormat::fp32 ? bk.size * sizeof(float) : bk.size * sizeof(int16_t);
    if (format_ == GradFormat::dfp16) stats_.bytes += sizeof(float);  // the agreed maximum
  }
  return finite == 1;
}

}  // namespace dfp::parallel
