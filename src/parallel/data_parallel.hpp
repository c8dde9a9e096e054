// The gradient allreduce of data-parallel training (docs/design/distributed.md): gradients are
// grouped into buckets in the order backward produces them, and each bucket's non-blocking
// allreduce starts as soon as backward has finalised its last gradient (Model::set_gradient_hook);
// finish() waits for what is still in flight and leaves every rank's Parameter::grad holding the
// mean over the ranks.
//
// Formats (--allreduce):
//   fp32   the gradients as they are; MPI's sum, whose rounding depends on its reduction order.
//   bf16   rounded to bf16 (nearest even), summed by MPI in FP32 pairs rounded back to bf16:
//          half the bytes, order-dependent as fp32.
//   dfp16  the ranks agree on one exponent per bucket (an allreduce of max|g|), each rank rounds
//          its gradients to INT16 at that exponent stochastically (seeded by seed, step, rank and
//          bucket), with headroom bits h = bit_width(N) so that the sum of N values stays within
//          INT16; the INT16 sum is exact, so the result does not depend on MPI's reduction order or
//          algorithm. Half the bytes of fp32. With error feedback each rank keeps the rounding error
//          of its own gradient and adds it to the next step's.
// The step's "gradients finite" decision is one small allreduce (MIN of every rank's flag), so
// that a loss scaler decides the same on every rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dfp/dfp16.hpp"
#include "src/parallel/comm.hpp"

namespace dfp {
class Context;
class Model;
}  // namespace dfp

namespace dfp::parallel {

enum class GradFormat { fp32, bf16, dfp16 };
GradFormat parse_grad_format(const std::string& text, const std::string& origin);
const char* grad_format_name(GradFormat f) noexcept;

// Communication of the training steps since the last reset.
struct CommStats {
  uint64_t steps = 0;
  uint64_t bytes = 0;            // what this rank contributed to the allreduces (payload)
  uint64_t fp32_bytes = 0;       // what an fp32 allreduce of the same gradients would contribute
  double in_flight_seconds = 0;  // from the start of a step's first bucket to the completion of its last
  double exposed_seconds = 0;    // of that, the time the optimizer waited after backward
};

class GradientReducer {
 public:
  // Installs the model's gradient hook (removed by the destructor). bucket_bytes: FP32 bytes of
  // gradients per bucket (at least one parameter each).
  GradientReducer(const Context& ctx, Comm& comm, Model& model, GradFormat format, size_t bucket_bytes,
                  bool error_feedback, uint64_t seed);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Before the step's backward pass.
  void begin_step(uint64_t step);
  // After it: completes every bucket and returns whether the gradients of every rank were finite
  // (when not, the gradients are not averaged and the step is to be skipped).
  bool finish(bool local_finite);

  size_t buckets() const noexcept { return buckets_.size(); }
  const CommStats& stats() const noexcept { return stats_; }
  void reset_stats() noexcept { stats_ = {}; }
  // Error feedback: this rank's residual, one value per gradient element (empty without it).
  std::vector<float>& residual() noexcept { return residual_; }

 private:
  enum class Stage { waiting, max, max_done, sum, done };
  struct Bucket {
    size_t first = 0, last = 0;   // parameters [first, last)
    size_t offset = 0, size = 0;  // its elements in the flat buffers
    int remaining = 0;            // parameters whose gradients backward has not finalised
    Stage stage = Stage::waiting;
    float max = 0;                // dfp16: max|g| over the ranks
    int exponent = 0;
  };
  void on_layer(size_t first, size_t last);
  void launch(size_t b);
  void start_sum(size_t b);
  void advance(size_t b);
  void progress();
  void copy_in(const Bucket& bk, float* dst, bool add_residual) const;

  const Context& ctx_;
  Comm& comm_;
  Model& model_;
  GradFormat format_;
  bool error_feedback_;
  uint64_t seed_;
  uint64_t step_ = 0;
  int headroom_ = 0;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // per parameter
  std::vector<float> flat_;        // fp32 sums; dfp16: the values quantized
  std::vector<int16_t> packed_;    // bf16 patterns or INT16 values
  std::vector<float> residual_;
  QuantOptions quant_;  // dfp16: stochastic rounding, its seed set per bucket and step
  bool any_nonfinite_ = false;
  double first_start_ = -1, last_done_ = 0;
  CommStats stats_;
};

}  // namespace dfp::parallel
