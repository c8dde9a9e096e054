// The --profile report of a training run (src/train/trainer.cpp): training-step totals beside
// Model::layer_times(), the table the run prints and profile.json.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "dfp/model.hpp"

namespace dfp {

// The clock the trainer times epochs, steps and the optimizer with.
using StepClock = std::chrono::steady_clock;
inline double seconds_since(StepClock::time_point t) {
  return std::chrono::duration<double>(StepClock::now() - t).count();
}

// A measured figure as the run files hold it: rounded to the 6 significant digits a stream writes
// (the files do not claim more precision than a timing or a mean over a test set has). Non-finite
// values stay as they are (the files write them as null, see run_files.hpp).
double six_digits(double v);

// The whole step (forward, loss, backward, optimizer) as the loop saw it, the optimizer's part,
// the loader's data wait, and in a data-parallel run the gradient allreduce (src/parallel/).
struct StepProfile {
  uint64_t steps = 0;
  double step_seconds = 0, optimizer_seconds = 0, data_wait_seconds = 0;
  int ranks = 1;
  std::string allreduce;
  uint64_t comm_bytes = 0, comm_fp32_bytes = 0;
  double comm_in_flight_seconds = 0, comm_exposed_seconds = 0;
};

// Milliseconds per step, the 15 costliest layers, then the time by layer kind, the optimizer and
// what no layer accounts for (the loop's own work between layers); with several ranks, the bytes
// each sends per step and how much of the communication backward hid.
std::vector<std::string> profile_table(const std::vector<LayerTime>& times, const StepProfile& p);
void write_profile_json(const std::string& path, const std::vector<LayerTime>& times, const StepProfile& p);

}  // namespace dfp
