// A model's convolutions one by one: their shapes (from Model::graph()) and a table row per layer
// of the INT16 parts' profiled time in training (Model::layer_times: quantization of x and dy, the
// three passes, with each pass's GOP/s) beside the FP32 model's same layer. resnet50_bench and
// train_bench --layers print it: a layer whose pass runs far below the others' rate shows there.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "dfp/conv.hpp"
#include "dfp/model.hpp"
#include "dfp/types.hpp"

namespace dfp::bench {

// A convolution of the network, with its input shape.
struct ConvRow {
  std::string name;
  ConvShape shape;
};

inline std::vector<ConvRow> convolutions(const Model& m, int batch) {
  std::vector<ConvRow> out;
  const std::vector<LayerSpec> g = m.graph();
  for (const LayerSpec& s : g) {
    if (s.kind != LayerKind::conv) continue;
    const ConvParams& q = s.get<ConvParams>();
    const TensorShape& in = g[size_t(s.inputs[0])].shape;
    ConvShape c;
    c.N = batch;
    c.C = in.c;
    c.H = in.h;
    c.W = in.w;
    c.K = q.out_channels;
    c.R = c.S = q.kernel;
    c.stride_h = c.stride_w = q.stride;
    c.pad_h = c.pad_w = q.pad;
    out.push_back({s.name, c});
  }
  return out;
}

inline std::string shape_key(const ConvShape& s) {
  char b[96];
  std::snprintf(b, sizeof b, "%dx%dx%d>%d %dx%d/%d", s.C, s.H, s.W, s.K, s.R, s.S, s.stride_h);
  return b;
}

// alone: a last column of the same shapes' passes run by themselves, whose text each row passes.
inline void print_conv_layer_header(bool alone = false) {
  std::printf("\nINT16 convolutions, ms per step (GOP/s of the pass): quantize x | forward | quantize dy | "
              "backward-data | weight gradient; fp32: the layer's forward + backward%s\n"
              "%-22s %-22s %7s %16s %7s %16s %16s %8s %24s\n",
              alone ? "; alone: the same passes by themselves" : "", "layer", "shape", "qx", "fwd", "qdy",
              "bwd_data", "bwd_weights", "fp32", alone ? "alone fwd/bwd_d/bwd_w" : "");
}

// first: the network's first layer, which has no backward-data pass (its time there is the
// bookkeeping's, not a rate).
inline void print_conv_layer_row(const ConvRow& row, const LayerTime& int16, const LayerTime& fp32, bool first,
                                 const char* alone = "") {
  const LayerTime::Int16Parts& p = int16.int16;
  const double per = 1.0 / double(int16.steps), ops = row.shape.ops();
  auto gops = [&](double s) { return s > 0 ? ops / s / 1e9 : 0.0; };
  const double fp32_ms = (fp32.forward_seconds + fp32.backward_seconds) / double(fp32.steps) * 1e3;
  std::printf("%-22s %-22s %7.2f %7.2f (%5.0f) %7.2f %7.2f (%5.0f) %7.2f (%5.0f) %8.2f %24s\n", row.name.c_str(),
              shape_key(row.shape).c_str(), p.quantize_x * per * 1e3, p.forward * per * 1e3, gops(p.forward * per),
              p.quantize_dy * per * 1e3, p.backward_data * per * 1e3, first ? 0.0 : gops(p.backward_data * per),
              p.backward_weights * per * 1e3, gops(p.backward_weights * per), fp32_ms, alone);
}

}  // namespace dfp::bench
