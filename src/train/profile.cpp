// The --profile report of a training run: the per-step table and profile.json.
#include "src/train/profile.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "dfp/status.hpp"
#include "src/train/run_files.hpp"

namespace dfp {

double six_digits(double v) {
  if (!std::isfinite(v)) return v;
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return std::strtod(b, nullptr);
}

// Milliseconds per step, the 15 costliest layers, then the time by layer kind, the optimizer and
// what no layer accounts for (the loop's own work between layers).
std::vector<std::string> profile_table(const std::vector<LayerTime>& times, const StepProfile& p) {
  const double per = 1e3 / double(p.steps);
  double layers = 0;
  for (const LayerTime& t : times) layers += t.forward_seconds + t.backward_seconds;
  std::vector<const LayerTime*> order;
  for (const LayerTime& t : times) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [](const LayerTime* a, const LayerTime* b) {
    return a->forward_seconds + a->backward_seconds > b->forward_seconds + b->backward_seconds;
  });
  std::vector<std::string> out;
  char line[400];
  std::snprintf(line, sizeof line, "profile: %llu training steps, %.2f ms per step (forward + loss + backward + optimizer)",
                static_cast<unsigned long long>(p.steps), p.step_seconds * per);
  out.push_back(line);
  out.push_back("  layer                    kind      precision  forward ms  backward ms   share  implementation "
                "(fwd | bwd_data | bwd_weights)");
  const size_t shown = std::min<size_t>(order.size(), 15);
  for (size_t i = 0; i < shown; ++i) {
    const LayerTime& t = *order[i];
    std::snprintf(line, sizeof line, "  %-24s %-9s %-9s %11.3f %12.3f %6.1f%%  %s", t.layer.c_str(), t.kind.c_str(),
                  t.precision.c_str(), t.forward_seconds * per, t.backward_seconds * per,
                  100.0 * (t.forward_seconds + t.backward_seconds) / p.step_seconds, t.implementation.c_str());
    out.push_back(line);
  }
  if (order.size() > shown) out.push_back("  (" + std::to_string(order.size() - shown) + " more layers in profile.json)");
  std::vector<std::pair<std::string, std::pair<double, double>>> kinds;  // in order of first appearance
  for (const LayerTime& t : times) {
    auto it = std::find_if(kinds.begin(), kinds.end(), [&](const auto& k) { return k.first == t.kind; });
    if (it == kinds.end()) it = kinds.insert(kinds.end(), {t.kind, {0.0, 0.0}});
    it->second.first += t.forward_seconds;
    it->second.second += t.backward_seconds;
  }
  std::stable_sort(kinds.begin(), kinds.end(), [](const auto& a, const auto& b) {
    return a.second.first + a.second.second > b.second.first + b.second.second;
  });
  std::string by_kind = "  by kind (forward + backward ms):";
  for (const auto& [kind, fb] : kinds) {
    std::snprintf(line, sizeof line, " %s %.2f + %.2f (%.1f%%);", kind.c_str(), fb.first * per, fb.second * per,
                  100.0 * (fb.first + fb.second) / p.step_seconds);
    by_kind += line;
  }
  out.push_back(by_kind);
  std::snprintf(line, sizeof line,
                "  optimizer, with weight re-quantization %.2f ms (%.1f%%); between layers %.2f ms (%.1f%%); data wait %.2f ms "
                "per step",
                p.optimizer_seconds * per, 100.0 * p.optimizer_seconds / p.step_seconds,
                (p.step_seconds - layers - p.optimizer_seconds) * per,
                100.0 * (p.step_seconds - layers - p.optimizer_seconds) / p.step_seconds, p.data_wait_seconds * per);
  out.push_back(line);
  if (p.ranks > 1) {
    const double in_flight = p.comm_in_flight_seconds * per, exposed = p.comm_exposed_seconds * per;
    std::snprintf(line, sizeof line,
                  "  communication (%d ranks, %s allreduce): %.0f bytes per step per rank (fp32: %.0f, %.2fx); in flight "
                  "%.2f ms per step, exposed %.2f ms (%.1f%% of the step), hidden %.1f%%",
                  p.ranks, p.allreduce.c_str(), double(p.comm_bytes) / double(p.steps),
                  double(p.comm_fp32_bytes) / double(p.steps), double(p.comm_bytes) / double(std::max<uint64_t>(1, p.comm_fp32_bytes)),
                  in_flight, exposed, 100.0 * p.comm_exposed_seconds / p.step_seconds,
                  in_flight > 0 ? 100.0 * std::max(0.0, 1.0 - exposed / in_flight) : 0.0);
    out.push_back(line);
  }
  return out;
}

void write_profile_json(const std::string& path, const std::vector<LayerTime>& times, const StepProfile& p) {
  run_files::ProfileRecord r;
  r.steps = p.steps;
  r.step_seconds = six_digits(p.step_seconds);
  r.optimizer_seconds = six_digits(p.optimizer_seconds);
  r.data_wait_seconds = six_digits(p.data_wait_seconds);
  for (const LayerTime& t : times)
    r.layers.push_back({t.layer, t.kind, t.precision, t.implementation, six_digits(t.forward_seconds),
                        six_digits(t.backward_seconds), t.steps});
  if (p.ranks > 1)
    r.communication = run_files::ProfileCommRecord{p.ranks, p.allreduce, p.comm_bytes, p.comm_fp32_bytes,
                                                   six_digits(p.comm_in_flight_seconds), six_digits(p.comm_exposed_seconds)};
  std::ofstream f(path, std::ios::trunc);
  DFP_CHECK(f.good(), Status::io_error, "cannot write '" + path + "'");
  f << run_files::to_text(r);
  DFP_CHECK(f.good(), Status::io_error, "write to '" + path + "' failed (disk full?)");
}

}  // namespace dfp
