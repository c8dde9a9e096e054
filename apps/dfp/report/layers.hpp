// dfp: the report's per-layer numerics (internal to apps/dfp/report): the DFP16 granularity a
// run's policy text records, the count totals, and each run's per-layer table.
#pragma once

#include <string>

#include "apps/dfp/report/report.hpp"

namespace dfp::report_detail {

// The "granularity=" value in the policy text's group `group` ("weights", "activations",
// "gradients"), as in "weights{headroom=2,rounding=nearest,granularity=slice}"; "" when the
// group or the value is absent.
std::string policy_granularity(const std::string& policy, const std::string& group);
// Whether the policy text runs a layer in INT16: "precision=int16" or an override "]=int16".
bool policy_runs_int16(const std::string& policy);

std::string html_escape(const std::string& s);
// A markdown table cell: "|" escaped, line breaks as spaces, "-" for "".
std::string md_cell(const std::string& s);
// An exact count, "-" for NaN.
std::string count_text(double v);
// The last finite value of a layer's series (NaN if none).
double last_finite(const LayerSeries& l, double LayerPoint::*f);

// Count totals over layers and the epochs' logged values (NaN: never logged).
inline constexpr int kCounts = 5;
struct Totals {
  int layers = 0;
  double v[kCounts] = {kNotLogged, kNotLogged, kNotLogged, kNotLogged, kNotLogged};
};
extern const char* const kCountNames[kCounts];  // saturated, overflow events, overflow, underflow, nonzero
void add_counts(Totals& t, const LayerSeries& l);
bool has_counts(const RunSummary& r);

// One run's per-layer table (last logged exponents, as min..max where the run has more than one
// exponent per tensor, and chain lengths; last sampled SQNR; counts summed over epochs): an HTML
// <details> block, and a markdown section.
std::string layer_table_html(const RunSummary& r);
std::string layer_table_markdown(const RunSummary& r);

}  // namespace dfp::report_detail
