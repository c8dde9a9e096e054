// The training step's time by layer kind, one column per precision, and INT16 over FP32 per row
// (issue 45: every non-convolution kind in INT16 at most 0.6x its FP32 time). From Model's
// profiled layer times (Model::set_profiling) and the optimizer's time the bench measured.
// Rows: the Conv2d/Linear passes apart from INT16's operand quantization (forward, and backward =
// backward-data + weight gradient; INT16's two backward passes also apart, indented: oneDNN's FP32
// layers are timed as one backward), that quantization (x and dy; x that a BatchNorm hands over
// span by span is quantized inside the BatchNorm's forward, and stays in its row), every other
// kind by its short name (forward + backward; indented below it, each apart where it takes a
// millisecond a step), the optimizer (update with the weights' re-quantization and packing),
// and the step.
#pragma once

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "dfp/types.hpp"

namespace dfp::bench {

struct KindColumn {
  std::string precision;
  std::vector<LayerTime> times;  // Model::layer_times()
  double optimizer_ms = 0;       // per step
};

// Of an INT16 layer's quantization, what its own times hold: x in its forward, x computed again
// and dy in its backward. A neighbour's pass holds the rest (x quantized span by span in its
// producer's forward, dy in the BatchNorm's backward after it) and keeps it in that row.
struct OwnQuantization {
  double x_forward, x_backward, dy;
  double total() const { return x_forward + x_backward + dy; }
};
inline OwnQuantization own_quantization(const LayerTime::Int16Parts& q) {
  return {q.quantize_x - q.quantize_x_in_producer - q.quantize_x_in_backward, q.quantize_x_in_backward,
          q.quantize_dy - q.quantize_dy_in_producer};
}

inline void print_kind_table(const std::vector<KindColumn>& cols) {
  std::vector<std::string> order = {"conv fwd", "conv bwd", "  bwd data", "  bwd weights", "fc fwd", "fc bwd",
                                    "quantize x+dy"};
  std::map<std::string, std::string> part_of;  // a kind's forward and backward rows: the kind
  std::vector<std::map<std::string, double>> ms(cols.size());
  for (size_t i = 0; i < cols.size(); ++i) {
    for (const LayerTime& t : cols[i].times) {
      if (t.steps == 0) continue;
      const double per = 1e3 / double(t.steps);
      const LayerTime::Int16Parts& q = t.int16;
      if (t.kind == "conv" || t.kind == "fc") {
        const OwnQuantization own = own_quantization(q);
        ms[i][t.kind + " fwd"] += (t.forward_seconds - own.x_forward) * per;
        ms[i][t.kind + " bwd"] += (t.backward_seconds - own.dy - own.x_backward) * per;
        if (t.kind == "conv") {
          ms[i]["  bwd data"] += q.backward_data * per;
          ms[i]["  bwd weights"] += q.backward_weights * per;
        }
        ms[i]["quantize x+dy"] += own.total() * per;
        continue;
      }
      ms[i][t.kind] += (t.forward_seconds + t.backward_seconds) * per;
      ms[i]["  " + t.kind + " fwd"] += t.forward_seconds * per;
      ms[i]["  " + t.kind + " bwd"] += t.backward_seconds * per;
      bool known = false;
      for (const std::string& k : order) known |= k == t.kind;
      if (!known) {
        order.insert(order.end(), {t.kind, "  " + t.kind + " fwd", "  " + t.kind + " bwd"});
        part_of["  " + t.kind + " fwd"] = part_of["  " + t.kind + " bwd"] = t.kind;
      }
    }
    ms[i]["optimizer"] = cols[i].optimizer_ms;
  }
  order.push_back("optimizer");
  int fp32 = -1, int16 = -1;
  for (size_t i = 0; i < cols.size(); ++i) {
    if (cols[i].precision == "fp32") fp32 = int(i);
    if (cols[i].precision == "int16") int16 = int(i);
  }
  std::printf("\ntime by layer kind, ms per step (forward + backward)%s:\n%-14s",
              fp32 >= 0 && int16 >= 0 ? "; int16/fp32: INT16's time over FP32's" : "", "kind");
  for (const KindColumn& c : cols) std::printf(" %9s", c.precision.c_str());
  if (fp32 >= 0 && int16 >= 0) std::printf(" %11s", "int16/fp32");
  std::printf("\n");
  std::vector<double> total(cols.size(), 0);
  for (const std::string& k : order) {
    bool any = false;
    for (size_t i = 0; i < cols.size(); ++i) any |= ms[i].count(k) && ms[i].at(k) != 0;
    if (const auto p = part_of.find(k); p != part_of.end()) {  // where a column spends 1 ms a step on the kind
      any = false;
      for (size_t i = 0; i < cols.size(); ++i) any |= ms[i].count(p->second) && ms[i].at(p->second) >= 1.0;
    }
    if (!any) continue;
    std::printf("%-14s", k.c_str());
    for (size_t i = 0; i < cols.size(); ++i) {
      const double v = ms[i].count(k) ? ms[i].at(k) : 0;
      if (k[0] != ' ') total[i] += v;  // an indented row is part of the one above
      std::printf(" %9.1f", v);
    }
    if (fp32 >= 0 && int16 >= 0) {
      const double a = ms[size_t(fp32)].count(k) ? ms[size_t(fp32)].at(k) : 0;
      const double b = ms[size_t(int16)].count(k) ? ms[size_t(int16)].at(k) : 0;
      if (a > 0) std::printf(" %11.2f", b / a);
    }
    std::printf("\n");
  }
  std::printf("%-14s", "step (sum)");
  for (double t : total) std::printf(" %9.1f", t);
  if (fp32 >= 0 && int16 >= 0 && total[size_t(fp32)] > 0)
    std::printf(" %11.2f", total[size_t(int16)] / total[size_t(fp32)]);
  std::printf("\n");
}

}  // namespace dfp::bench
