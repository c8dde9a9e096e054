// The report's per-layer numerics: granularity from the policy text, count totals and the
// per-layer tables (see layers.hpp).
#include "apps/dfp/report/layers.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>
#include <string_view>
#include <tuple>
#include <vector>

#include "apps/dfp/report/plots.hpp"

namespace dfp {

namespace {

struct ClassGranularity {
  const char* key;  // as in exp_<key>
  const std::string RunSummary::*granularity;
};
// In the order of the flags' and the policy's classes: weights, activations, gradients.
constexpr ClassGranularity kClassGranularity[] = {
    {"w", &RunSummary::granularity_w}, {"x", &RunSummary::granularity_x}, {"dy", &RunSummary::granularity_dy}};

}  // namespace

std::string granularity_text(const RunSummary& run) {
  if (!run.int16) return "";
  // The classes of each granularity, the finer ones first: "slice: w, dy; tensor: x".
  std::vector<std::pair<std::string, std::string>> groups;  // granularity, classes
  for (const auto& c : kClassGranularity) {
    const std::string& g = run.*c.granularity;
    if (g.empty()) return "";  // not recorded: nothing to show rather than a guess
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& e) { return e.first == g; });
    if (it == groups.end()) it = groups.insert(groups.end(), {g, ""});
    it->second += (it->second.empty() ? "" : ", ") + std::string(c.key);
  }
  if (groups.size() == 1 && groups[0].first == "tensor") return "tensor";
  std::stable_partition(groups.begin(), groups.end(), [](const auto& e) { return e.first != "tensor"; });
  std::string out;
  for (const auto& [g, classes] : groups) out += (out.empty() ? "" : "; ") + g + ": " + classes;
  return out;
}

std::string run_title(const RunSummary& run) {
  const std::string g = granularity_text(run);
  return g.empty() ? run.label : run.label + " (" + g + ")";
}

}  // namespace dfp

namespace dfp::report_detail {

std::string policy_granularity(const std::string& policy, const std::string& group) {
  const std::string open = group + "{";
  size_t at = policy.find(open);
  // The group's name starts the text or follows a space ("weights{" is not "x_weights{").
  while (at != std::string::npos && at > 0 && policy[at - 1] != ' ') at = policy.find(open, at + 1);
  if (at == std::string::npos) return "";
  const size_t begin = at + open.size(), end = policy.find('}', begin);
  if (end == std::string::npos) return "";
  // Settings are name=value items separated by commas.
  const std::string_view body = std::string_view(policy).substr(begin, end - begin);
  for (size_t item = 0; item <= body.size();) {
    size_t next = body.find(',', item);
    if (next == std::string_view::npos) next = body.size();
    const std::string_view kv = body.substr(item, next - item);
    constexpr std::string_view key = "granularity=";
    if (kv.substr(0, key.size()) == key) return std::string(kv.substr(key.size()));
    item = next + 1;
  }
  return "";
}

bool policy_runs_int16(const std::string& policy) {
  std::istringstream words(policy);
  for (std::string w; words >> w;)
    if (w == "precision=int16" || (w.rfind("override[", 0) == 0 && w.size() > 7 && w.compare(w.size() - 7, 7, "]=int16") == 0))
      return true;
  return false;
}

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&#39;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string md_cell(const std::string& s) {
  if (s.empty()) return "-";
  std::string o;
  for (char c : s) {
    if (c == '|') o += "\\|";
    else if (c == '\n' || c == '\r') o += ' ';
    else o += c;
  }
  return o;
}

std::string count_text(double v) { return std::isnan(v) ? "-" : exact(v); }

double last_finite(const LayerSeries& l, double LayerPoint::*f) {
  for (size_t i = l.points.size(); i-- > 0;)
    if (std::isfinite(l.points[i].*f)) return l.points[i].*f;
  return kNotLogged;
}

const char* const kCountNames[kCounts] = {"saturated", "overflow events (INT32)", "overflow", "underflow", "nonzero"};

namespace {
constexpr double LayerPoint::*kCountFields[kCounts] = {&LayerPoint::saturated, &LayerPoint::overflow_events,
                                                       &LayerPoint::overflow, &LayerPoint::underflow, &LayerPoint::nonzero};
}  // namespace

void add_counts(Totals& t, const LayerSeries& l) {
  ++t.layers;
  for (int k = 0; k < kCounts; ++k)
    for (const auto& p : l.points) {
      const double x = p.*kCountFields[k];
      if (std::isnan(x)) continue;
      t.v[k] = std::isnan(t.v[k]) ? x : t.v[k] + x;
    }
}

bool has_counts(const RunSummary& r) {
  for (const auto& l : r.layers)
    for (const auto& p : l.points)
      for (auto f : kCountFields)
        if (!std::isnan(p.*f)) return true;
  return false;
}

namespace {

using LayerField = double LayerPoint::*;

// A class's exponent at the last epoch that logs it: "e", or "min..max" where that epoch's slices
// have more than one exponent (exp_*_min logged and below exp_*); "-" when never logged.
std::string exponent_cell(const LayerSeries& l, LayerField max, LayerField min) {
  for (size_t i = l.points.size(); i-- > 0;) {
    const LayerPoint& p = l.points[i];
    if (!std::isfinite(p.*max)) continue;
    if (std::isfinite(p.*min) && p.*min != p.*max) return exact(p.*min) + ".." + exact(p.*max);
    return exact(p.*max);
  }
  return "-";
}

// 100 underflow / nonzero of the last epoch that logs both with nonzero > 0, to two decimals; "-"
// when none does.
std::string underflow_percent(const LayerSeries& l, LayerField underflow, LayerField nonzero) {
  for (size_t i = l.points.size(); i-- > 0;) {
    const LayerPoint& p = l.points[i];
    if (std::isfinite(p.*underflow) && std::isfinite(p.*nonzero) && p.*nonzero > 0)
      return rounded(100 * p.*underflow / p.*nonzero, 2);
  }
  return "-";
}

struct LayerTable {
  std::vector<std::string> headings;           // after "#", "layer", "format"
  std::vector<std::vector<std::string>> cells;  // per layer, one per heading
  bool ranges = false;                          // some exponent cell is a min..max range
};

// The columns the run logs (the others left out).
LayerTable layer_table(const RunSummary& r) {
  LayerTable t;
  t.cells.resize(r.layers.size());
  auto add = [&](const std::string& heading, const std::function<std::string(const LayerSeries&)>& cell) {
    std::vector<std::string> column;
    bool any = false;
    for (const auto& l : r.layers) {
      column.push_back(cell(l));
      any |= column.back() != "-";
    }
    if (!any) return;
    t.headings.push_back(heading);
    for (size_t i = 0; i < column.size(); ++i) t.cells[i].push_back(column[i]);
  };
  const std::tuple<const char*, LayerField, LayerField> exponents[] = {
      {"x", &LayerPoint::exp_x, &LayerPoint::exp_x_min},
      {"w", &LayerPoint::exp_w, &LayerPoint::exp_w_min},
      {"dy", &LayerPoint::exp_dy, &LayerPoint::exp_dy_min}};
  for (const auto& [key, max, min] : exponents) {
    bool range = false;
    for (const auto& l : r.layers) range |= exponent_cell(l, max, min).find("..") != std::string::npos;
    t.ranges |= range;
    add(std::string("exp ") + key + (range ? " (min..max)" : ""),
        [max = max, min = min](const LayerSeries& l) { return exponent_cell(l, max, min); });
  }
  const std::pair<const char*, LayerField> chains[] = {
      {"chain fwd", &LayerPoint::chain_fwd}, {"chain bwd", &LayerPoint::chain_bwd}, {"chain wgrad", &LayerPoint::chain_wgrad}};
  for (const auto& [heading, f] : chains) add(heading, [f = f](const LayerSeries& l) { return count_text(last_finite(l, f)); });
  const std::pair<const char*, LayerField> sqnr[] = {
      {"SQNR x dB", &LayerPoint::sqnr_x_db}, {"SQNR w dB", &LayerPoint::sqnr_w_db}, {"SQNR dy dB", &LayerPoint::sqnr_dy_db}};
  for (const auto& [heading, f] : sqnr) add(heading, [f = f](const LayerSeries& l) { return rounded(last_finite(l, f), 1); });
  for (int k = 0; k < kCounts; ++k)
    add(kCountNames[k], [k](const LayerSeries& l) {
      Totals totals;
      add_counts(totals, l);
      return count_text(totals.v[k]);
    });
  // Each operand's share of its nonzero values lost to underflow at the last sample: the per-layer
  // figure a format comparison (and a gradient's "at most 1 %") reads.
  const std::tuple<const char*, LayerField, LayerField> lost[] = {
      {"underflow x %", &LayerPoint::underflow_x, &LayerPoint::nonzero_x},
      {"underflow w %", &LayerPoint::underflow_w, &LayerPoint::nonzero_w},
      {"underflow dy %", &LayerPoint::underflow_dy, &LayerPoint::nonzero_dy}};
  for (const auto& [heading, u, n] : lost)
    add(heading, [u = u, n = n](const LayerSeries& l) { return underflow_percent(l, u, n); });
  return t;
}

std::string what_it_holds(const RunSummary& r, const LayerTable& t) {
  std::string s = std::to_string(r.layers.size()) +
                  " layers (last logged exponents and chain lengths, last sampled SQNR and underflow %, counts summed over "
                  "epochs)";
  const std::string g = granularity_text(r);
  if (!g.empty()) s += "; DFP16 granularity " + g;
  if (t.ranges) s += "; min..max: the smallest and largest of the slices' exponents";
  return s;
}

}  // namespace

std::string layer_table_html(const RunSummary& r) {
  const LayerTable t = layer_table(r);
  std::ostringstream h;
  h << "<details><summary>" << html_escape(run_title(r)) << ": " << html_escape(what_it_holds(r, t))
    << "</summary>\n<table>\n<tr><th>#</th><th>layer</th><th>format</th>";
  for (const auto& c : t.headings) h << "<th>" << html_escape(c) << "</th>";
  h << "</tr>\n";
  for (size_t i = 0; i < r.layers.size(); ++i) {
    h << "<tr><td class=\"n\">" << i << "</td><td>" << html_escape(r.layers[i].name) << "</td><td>"
      << html_escape(r.layers[i].format.empty() ? "-" : r.layers[i].format) << "</td>";
    for (const auto& c : t.cells[i]) h << "<td class=\"n\">" << html_escape(c) << "</td>";
    h << "</tr>\n";
  }
  h << "</table>\n</details>\n";
  return h.str();
}

std::string layer_table_markdown(const RunSummary& r) {
  const LayerTable t = layer_table(r);
  std::ostringstream m;
  m << "\n### " << run_title(r) << "\n\n" << what_it_holds(r, t) << ".\n\n| # | layer | format |";
  for (const auto& c : t.headings) m << " " << md_cell(c) << " |";
  m << "\n|---:|---|---|";
  for (size_t i = 0; i < t.headings.size(); ++i) m << "---:|";
  m << "\n";
  for (size_t i = 0; i < r.layers.size(); ++i) {
    m << "| " << i << " | " << md_cell(r.layers[i].name) << " | " << md_cell(r.layers[i].format) << " |";
    for (const auto& c : t.cells[i]) m << " " << md_cell(c) << " |";
    m << "\n";
  }
  return m.str();
}

}  // namespace dfp::report_detail
