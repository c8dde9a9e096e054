// The report behind `dfp compare`: reading run directories, the summary table, report.html and
// report.md (see report.hpp; the plots are in plots.cpp).
#include "apps/dfp/report/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "dfp/status.hpp"
#include "apps/dfp/report/layers.hpp"
#include "apps/dfp/report/plots.hpp"
#include "src/train/run_files.hpp"

namespace fs = std::filesystem;

namespace dfp {

using report_detail::add_counts;
using report_detail::count_text;
using report_detail::exact;
using report_detail::has_counts;
using report_detail::html_escape;
using report_detail::kCountNames;
using report_detail::md_cell;
using report_detail::rounded;
using report_detail::Totals;

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DFP_CHECK(in.good(), Status::io_error, "cannot open '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  DFP_CHECK(!in.bad(), Status::io_error, "cannot read '" + path + "'");
  return ss.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  DFP_CHECK(out.good(), Status::io_error, "cannot write '" + path + "'");
  out << text;
  out.close();
  DFP_CHECK(!out.fail(), Status::io_error, "error writing '" + path + "'");
}

// ---- records read ------------------------------------------------------------------------------

// Digits after the decimal point of a number as the files write it ("65.71" -> 2); -1 for
// exponent notation.
int decimals(double v) {
  const std::string text = run_files::number_text(v);
  if (text.find_first_of("eEnNiI") != std::string::npos) return -1;
  const size_t dot = text.find('.');
  return dot == std::string::npos ? 0 : int(text.size() - dot - 1);
}

// Copies each of a record's optional fields to the point's field it maps to: its value, or NaN
// when the file does not log it.
template <class Record, class Point, class T, size_t N>
void copy_logged(const Record& r, Point& p, const std::pair<std::optional<T> Record::*, double Point::*> (&fields)[N]) {
  for (const auto& [from, to] : fields) p.*to = (r.*from) ? double(*(r.*from)) : kNotLogged;
}

EpochPoint epoch_point(const run_files::EpochRecord& r) {
  using R = run_files::EpochRecord;
  using P = EpochPoint;
  static constexpr std::pair<std::optional<double> R::*, double P::*> reals[] = {
      {&R::lr, &P::lr}, {&R::train_top1, &P::train_top1}, {&R::test_loss, &P::test_loss},
      {&R::test_top5, &P::test_top5}, {&R::images_per_second, &P::images_per_second},
      {&R::data_wait_seconds, &P::data_wait_seconds}, {&R::loss_scale, &P::loss_scale}};
  static constexpr std::pair<std::optional<int64_t> R::*, double P::*> counts[] = {
      {&R::peak_rss_kib, &P::peak_rss_kib}, {&R::skipped_steps, &P::skipped_steps}};
  EpochPoint e;
  e.epoch = r.epoch;
  e.train_loss = r.train_loss;
  e.test_top1 = r.test_top1;
  e.epoch_seconds = r.epoch_seconds;
  copy_logged(r, e, reals);
  copy_logged(r, e, counts);
  return e;
}

// One layer's entry in one metrics line.
struct RawLayer {
  std::string name, format;
  LayerPoint p;
};

LayerPoint layer_point(const run_files::LayerRecord& r) {
  using R = run_files::LayerRecord;
  using P = LayerPoint;
  static constexpr std::pair<std::optional<int64_t> R::*, double P::*> counts[] = {
      {&R::exp_x, &P::exp_x}, {&R::exp_w, &P::exp_w}, {&R::exp_dy, &P::exp_dy},
      {&R::exp_x_min, &P::exp_x_min}, {&R::exp_w_min, &P::exp_w_min}, {&R::exp_dy_min, &P::exp_dy_min},
      {&R::chain_fwd, &P::chain_fwd}, {&R::chain_bwd, &P::chain_bwd}, {&R::chain_wgrad, &P::chain_wgrad},
      {&R::saturated, &P::saturated}, {&R::overflow_events, &P::overflow_events}, {&R::overflow, &P::overflow},
      {&R::underflow, &P::underflow}, {&R::nonzero, &P::nonzero}, {&R::underflow_x, &P::underflow_x},
      {&R::underflow_w, &P::underflow_w}, {&R::underflow_dy, &P::underflow_dy}, {&R::nonzero_x, &P::nonzero_x},
      {&R::nonzero_w, &P::nonzero_w}, {&R::nonzero_dy, &P::nonzero_dy}};
  static constexpr std::pair<std::optional<double> R::*, double P::*> reals[] = {
      {&R::sqnr_x_db, &P::sqnr_x_db}, {&R::sqnr_w_db, &P::sqnr_w_db}, {&R::sqnr_dy_db, &P::sqnr_dy_db}};
  LayerPoint p;
  copy_logged(r, p, counts);
  copy_logged(r, p, reals);
  return p;
}

// ---- table cells ---------------------------------------------------------------------------------

std::string skipped_text(int64_t s) { return s < 0 ? "" : std::to_string(s); }

// A relative path as a URL: each byte outside the unreserved set (and '/') percent-encoded.
std::string url(const std::string& rel) {
  std::string o;
  for (unsigned char c : rel) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
      o += char(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      o += buf;
    }
  }
  return o;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string o = "\"";
  for (char c : s) {
    if (c == '"') o += '"';
    o += c;
  }
  return o + "\"";
}

constexpr size_t kGranularityColumn = 15;

// Human headings for the summary columns (same order as summary_columns()).
const std::vector<std::string>& headings() {
  static const std::vector<std::string> h = {
      "precision", "device", "model", "dataset", "batch", "epochs", "planned", "test top-1 %", "test top-5 %",
      "final train loss", "train time s", "images/s", "peak RSS MiB", "skipped steps", "final loss scale", "granularity"};
  return h;
}

std::vector<std::pair<std::string, Totals>> class_totals(const RunSummary& run) {
  std::vector<std::pair<std::string, Totals>> out;
  for (const auto& l : run.layers) {
    const std::string cls = report_detail::layer_class(l.name) + (l.format.empty() ? "" : " (" + l.format + ")");
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& e) { return e.first == cls; });
    if (it == out.end()) {
      out.emplace_back(cls, Totals{});
      it = out.end() - 1;
    }
    add_counts(it->second, l);
  }
  return out;
}

}  // namespace

// ---- read_run ------------------------------------------------------------------------------------

RunSummary read_run(const std::string& dir) {
  RunSummary run;
  run.dir = dir;
  fs::path p(dir);
  std::string base = p.filename().string();
  if (base.empty() || base == ".") base = p.parent_path().filename().string();
  if (base.empty() || base == "." || base == "..") base = fs::absolute(p).lexically_normal().parent_path().filename().string();

  // config.json
  const std::string cfg_path = (p / "config.json").string();
  const run_files::ConfigRecord cfg = run_files::parse_config(read_text(cfg_path), cfg_path);
  run.label = cfg.string_or("label", base);
  run.device = cfg.string_or("device", "cpu");
  run.model = cfg.string_or("model", "");
  run.dataset = cfg.string_or("dataset", "");
  run.precision_policy = cfg.string_or("precision_policy", "");
  run.loss_scaling = cfg.string_or("loss_scaling", "");
  run.batch_size = cfg.integer_or("batch_size", 0);
  run.epochs_planned = cfg.integer_or("epochs", 0);
  for (const auto& m : cfg.members) run.config.emplace_back(m.key, m.text);

  // profile.json, when the run wrote one: its communication record
  const fs::path prof = p / "profile.json";
  if (fs::exists(prof)) {
    const run_files::ProfileRecord pr = run_files::parse_profile(read_text(prof.string()), prof.string());
    if (pr.communication && pr.steps > 0) {
      const run_files::ProfileCommRecord& c = *pr.communication;
      const double per = 1.0 / double(pr.steps);
      run.communication = RunSummary::Communication{c.ranks, c.allreduce, double(c.bytes) * per,
                                                     double(c.fp32_bytes) * per, c.in_flight_seconds * per * 1e3,
                                                     c.exposed_seconds * per * 1e3};
    }
  }

  // metrics.jsonl
  const std::string m_path = (p / "metrics.jsonl").string();
  const std::string text = read_text(m_path);
  std::vector<EpochPoint> epochs;
  std::vector<std::vector<RawLayer>> layers;  // per epoch
  std::vector<int> seconds_decimals;          // per epoch
  std::string metrics_policy;                 // the last line's precision_policy
  size_t start = 0;
  int line_no = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + start, end - start);
    start = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    const run_files::EpochRecord r = run_files::parse_epoch_line(line, m_path, line_no);
    const EpochPoint e = epoch_point(r);
    if (r.precision_policy) metrics_policy = *r.precision_policy;
    std::vector<RawLayer> ls;
    for (const run_files::LayerRecord& l : r.layers) ls.push_back({l.layer, l.format, layer_point(l)});
    // A resumed run may repeat epochs: the later lines replace them.
    while (!epochs.empty() && epochs.back().epoch >= e.epoch) {
      epochs.pop_back();
      layers.pop_back();
      seconds_decimals.pop_back();
    }
    epochs.push_back(e);
    layers.push_back(std::move(ls));
    seconds_decimals.push_back(decimals(e.epoch_seconds));
  }
  DFP_CHECK(!epochs.empty(), Status::corrupt_data, m_path + ": no epochs (expected one JSON object per line)");

  // Summary figures.
  const EpochPoint& last = epochs.back();
  run.epochs = last.epoch;
  run.test_top1 = last.test_top1;
  run.test_top5 = last.test_top5;
  run.final_train_loss = last.train_loss;
  run.final_loss_scale = last.loss_scale;
  run.skipped_steps = std::isnan(last.skipped_steps) ? -1 : int64_t(last.skipped_steps);
  double seconds = 0, ips = 0, rss = kNotLogged;
  int ips_n = 0, dec = 0;
  for (size_t i = 0; i < epochs.size(); ++i) {
    seconds += epochs[i].epoch_seconds;
    dec = (dec < 0 || seconds_decimals[i] < 0) ? -1 : std::max(dec, seconds_decimals[i]);
    if (!std::isnan(epochs[i].images_per_second)) {
      ips += epochs[i].images_per_second;
      ++ips_n;
    }
    if (!std::isnan(epochs[i].peak_rss_kib)) rss = std::isnan(rss) ? epochs[i].peak_rss_kib : std::max(rss, epochs[i].peak_rss_kib);
  }
  // The sum of decimals with at most `dec` places has at most `dec` places: round away the binary
  // error so the summary shows the exact decimal sum.
  if (dec >= 0 && dec <= 15 && std::isfinite(seconds)) {
    const double scale = std::pow(10.0, dec);
    const double scaled = std::round(seconds * scale);
    if (std::fabs(scaled) < 9007199254740992.0) seconds = scaled / scale;
  }
  run.train_seconds = seconds;
  run.images_per_second = ips_n ? ips / ips_n : kNotLogged;
  run.peak_rss_mib = rss / 1024.0;
  run.epochs_series = epochs;

  // Layers in network order: first appearance, a new name going after its predecessor in its line.
  std::map<std::string, size_t> index;
  for (const auto& ls : layers) {
    size_t at = 0;
    for (const RawLayer& l : ls) {
      auto it = index.find(l.name);
      if (it == index.end()) {
        LayerSeries s;
        s.name = l.name;
        run.layers.insert(run.layers.begin() + long(at), std::move(s));
        for (auto& [n, i] : index)
          if (i >= at) ++i;
        index[l.name] = at;
        ++at;
      } else {
        at = it->second + 1;
      }
    }
  }
  for (auto& s : run.layers) s.points.assign(epochs.size(), LayerPoint{});
  for (size_t e = 0; e < layers.size(); ++e)
    for (const RawLayer& l : layers[e]) {
      LayerSeries& s = run.layers[index[l.name]];
      s.points[e] = l.p;
      if (!l.format.empty()) s.format = l.format;
    }

  // The granularity the run recorded.
  const std::string& policy = run.precision_policy.empty() ? metrics_policy : run.precision_policy;
  run.granularity_w = report_detail::policy_granularity(policy, "weights");
  run.granularity_x = report_detail::policy_granularity(policy, "activations");
  run.granularity_dy = report_detail::policy_granularity(policy, "gradients");
  run.int16 = report_detail::policy_runs_int16(policy);
  for (const auto& l : run.layers)  // (fp8's scale exponents are not DFP16's)
    for (const auto& pt : l.points)
      run.int16 = run.int16 || (l.format == "int16" && (std::isfinite(pt.exp_x) || std::isfinite(pt.exp_w) ||
                                                         std::isfinite(pt.exp_dy)));
  return run;
}

// ---- tables --------------------------------------------------------------------------------------

std::vector<std::string> summary_columns() {
  return {"label",           "device",           "model",          "dataset",           "batch_size",
          "epochs",          "epochs_planned",   "test_top1",      "test_top5",         "final_train_loss",
          "train_seconds",   "images_per_second", "peak_rss_mib",  "skipped_steps",     "final_loss_scale",
          "granularity"};
}

std::vector<std::string> summary_row(const RunSummary& r) {
  return {r.label,
          r.device,
          r.model,
          r.dataset,
          r.batch_size ? std::to_string(r.batch_size) : "",
          std::to_string(r.epochs),
          r.epochs_planned ? std::to_string(r.epochs_planned) : "",
          exact(r.test_top1),
          exact(r.test_top5),
          exact(r.final_train_loss),
          exact(r.train_seconds),
          exact(r.images_per_second),
          exact(r.peak_rss_mib),
          skipped_text(r.skipped_steps),
          exact(r.final_loss_scale),
          granularity_text(r)};
}

namespace {

// Rounded cells for people (terminal and HTML), same order as headings().
std::vector<std::string> human_row(const RunSummary& r) {
  std::string epochs = std::to_string(r.epochs);
  return {r.label,
          r.device,
          r.model.empty() ? "-" : r.model,
          r.dataset.empty() ? "-" : r.dataset,
          r.batch_size ? std::to_string(r.batch_size) : "-",
          epochs,
          r.epochs_planned ? std::to_string(r.epochs_planned) : "-",
          rounded(r.test_top1, 2),
          rounded(r.test_top5, 2),
          rounded(r.final_train_loss, 4),
          rounded(r.train_seconds, 1),
          rounded(r.images_per_second, 1),
          rounded(r.peak_rss_mib, 1),
          r.skipped_steps < 0 ? "-" : std::to_string(r.skipped_steps),
          std::isnan(r.final_loss_scale) ? "-" : exact(r.final_loss_scale),
          granularity_text(r).empty() ? "-" : granularity_text(r)};
}

std::string align(const std::vector<std::vector<std::string>>& rows, const std::vector<bool>& left) {
  std::vector<size_t> w(rows.front().size(), 0);
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
  std::string o;
  for (size_t k = 0; k < rows.size(); ++k) {
    std::string line;
    for (size_t i = 0; i < rows[k].size(); ++i) {
      const std::string pad(w[i] - rows[k][i].size(), ' ');
      if (i) line += "  ";
      line += left[i] ? rows[k][i] + pad : pad + rows[k][i];
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    o += line + "\n";
    if (k == 0) {
      size_t total = 0;
      for (size_t i = 0; i < w.size(); ++i) total += w[i] + (i ? 2 : 0);
      o += std::string(total, '-') + "\n";
    }
  }
  return o;
}

}  // namespace

std::string format_table(const std::vector<RunSummary>& runs) {
  if (runs.empty()) return "(no runs)\n";
  // Model and dataset go in a heading line when every run shares them.
  bool same = true;
  for (const auto& r : runs) same &= r.model == runs[0].model && r.dataset == runs[0].dataset;
  // Short headings so that the table fits a terminal.
  static const std::vector<std::string> h = {"precision", "device", "model",   "dataset",  "batch",
                                             "epochs",    "planned", "top-1 %", "top-5 %",  "train loss",
                                             "time s",    "img/s",   "peak MiB", "skipped", "loss scale"};
  std::vector<size_t> cols;
  for (size_t i = 0; i < h.size(); ++i) {
    if (same && (i == 2 || i == 3)) continue;
    if (i == 6) continue;  // planned epochs: shown as "done/planned" in the epochs column
    cols.push_back(i);
  }
  std::vector<std::vector<std::string>> rows;
  std::vector<bool> left;
  rows.emplace_back();
  for (size_t i : cols) {
    rows.back().push_back(h[i]);
    left.push_back(i <= 3);
  }
  for (const auto& r : runs) {
    std::vector<std::string> full = human_row(r);
    full[0] = run_title(r);  // the granularity follows the label rather than taking a column
    if (r.epochs_planned && r.epochs_planned != r.epochs) full[5].append(1, '/').append(std::to_string(r.epochs_planned));
    rows.emplace_back();
    for (size_t i : cols) rows.back().push_back(full[i]);
  }
  std::string o;
  if (same && (!runs[0].model.empty() || !runs[0].dataset.empty()))
    o += "model " + (runs[0].model.empty() ? "-" : runs[0].model) + ", dataset " +
         (runs[0].dataset.empty() ? "-" : runs[0].dataset) + "\n";
  return o + align(rows, left);
}

std::string format_communication(const std::vector<RunSummary>& runs) {
  std::vector<std::vector<std::string>> rows = {
      {"precision", "ranks", "allreduce", "MB/step", "vs fp32", "in flight ms", "exposed ms", "hidden %"}};
  for (const auto& r : runs) {
    if (!r.communication) continue;
    const RunSummary::Communication& c = *r.communication;
    char b[6][32];
    std::snprintf(b[0], sizeof b[0], "%.3f", c.bytes / 1e6);
    std::snprintf(b[1], sizeof b[1], "%.3f", c.fp32_bytes > 0 ? c.bytes / c.fp32_bytes : 0.0);
    std::snprintf(b[2], sizeof b[2], "%.2f", c.in_flight_ms);
    std::snprintf(b[3], sizeof b[3], "%.2f", c.exposed_ms);
    std::snprintf(b[4], sizeof b[4], "%.1f", c.in_flight_ms > 0 ? 100.0 * std::max(0.0, 1.0 - c.exposed_ms / c.in_flight_ms) : 0.0);
    rows.push_back({r.label, std::to_string(c.ranks), c.allreduce, b[0], b[1], b[2], b[3], b[4]});
  }
  if (rows.size() == 1) return "";
  return "gradient allreduce per training step (profile.json):\n" +
         align(rows, {true, false, true, false, false, false, false, false});
}

// ---- write_report --------------------------------------------------------------------------------

namespace {

const char* kCss = R"(body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1000px;padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em}h2{margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}h3{margin-bottom:.3em}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}th,td{border:1px solid #ccc;padding:.25em .6em}
th{background:#f3f3f3;text-align:left}td.n{text-align:right;font-variant-numeric:tabular-nums}
figure{margin:1.2em 0}figure img{max-width:100%;border:1px solid #e4e4e4}figcaption{color:#555;font-size:.92em;max-width:900px}
.note{background:#fff6d6;border:1px solid #e8d48a;padding:.6em .9em}.small{color:#666;font-size:.9em}code{font-size:.95em}
details{margin:.8em 0}summary{cursor:pointer;font-weight:600})";

bool numeric_column(size_t i) { return i >= 4 && i != kGranularityColumn; }

std::string html_summary_table(const std::vector<RunSummary>& runs) {
  std::ostringstream o;
  o << "<table>\n<tr>";
  for (const auto& h : headings()) o << "<th>" << html_escape(h) << "</th>";
  o << "</tr>\n";
  for (const auto& r : runs) {
    const auto human = human_row(r);
    const auto ex = summary_row(r);
    o << "<tr>";
    for (size_t i = 0; i < human.size(); ++i) {
      o << "<td" << (numeric_column(i) ? " class=\"n\"" : "");
      if (numeric_column(i) && ex[i] != human[i] && !ex[i].empty()) o << " title=\"" << html_escape(ex[i]) << "\"";
      o << ">" << html_escape(human[i]) << "</td>";
    }
    o << "</tr>\n";
  }
  o << "</table>\n";
  return o.str();
}

std::string markdown_table(const std::vector<RunSummary>& runs) {
  std::ostringstream o;
  o << "|";
  for (const auto& h : headings()) o << " " << h << " |";
  o << "\n|";
  for (size_t i = 0; i < headings().size(); ++i) o << (numeric_column(i) ? "---:|" : "---|");
  o << "\n";
  for (const auto& r : runs) {
    o << "|";
    for (const auto& c : summary_row(r)) o << " " << md_cell(c) << " |";
    o << "\n";
  }
  return o.str();
}

std::string csv_table(const std::vector<RunSummary>& runs) {
  std::ostringstream o;
  const auto cols = summary_columns();
  for (size_t i = 0; i < cols.size(); ++i) o << (i ? "," : "") << cols[i];
  o << "\n";
  for (const auto& r : runs) {
    const auto row = summary_row(r);
    for (size_t i = 0; i < row.size(); ++i) o << (i ? "," : "") << csv_field(row[i]);
    o << "\n";
  }
  return o.str();
}

std::string rel(const std::string& path, const std::string& out_dir) {
  std::error_code ec;
  fs::path r = fs::relative(path, out_dir, ec);
  if (ec || r.empty()) return fs::absolute(path).generic_string();
  return r.generic_string();
}

const char* kSections[][2] = {
    {"curves", "Training curves"},
    {"performance", "Throughput and memory"},
    {"loss_scale", "Loss scaling"},
    {"exponents", "DFP16 exponents over training"},
    {"sqnr", "Quantization noise (SQNR against an FP32 shadow)"},
};

}  // namespace

ReportFiles write_report(const std::string& out_dir, const std::vector<RunSummary>& runs,
                         const std::function<void(const std::string&)>& log) {
  DFP_CHECK(!runs.empty(), Status::invalid_argument, "write_report: no runs to report");
  {
    std::set<std::string> seen;
    for (const auto& r : runs)
      DFP_CHECK(seen.insert(report_detail::file_safe(r.label)).second, Status::invalid_argument,
                "write_report: two runs share the label '" + r.label + "' (labels name the report's files)");
  }
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  DFP_CHECK(!ec, Status::io_error, "cannot create '" + out_dir + "': " + ec.message());

  ReportFiles files;
  files.csv = (fs::path(out_dir) / "summary.csv").string();
  files.markdown_table = (fs::path(out_dir) / "summary.md").string();
  files.html = (fs::path(out_dir) / "report.html").string();
  files.markdown = (fs::path(out_dir) / "report.md").string();
  write_text(files.csv, csv_table(runs));
  const std::string md_table = markdown_table(runs);
  write_text(files.markdown_table, md_table);

  // Each run's metrics.jsonl (and config.json) inside out_dir: where it is, or a copy.
  std::vector<std::string> configs;
  for (const auto& r : runs) {
    const fs::path src = fs::path(r.dir) / "metrics.jsonl";
    const fs::path src_cfg = fs::path(r.dir) / "config.json";
    std::string inside = rel(src.string(), out_dir);
    if (r.dir.empty() || !fs::exists(src, ec)) {
      files.metrics.push_back("");
      configs.push_back("");
      continue;
    }
    if (inside.rfind("../", 0) == 0 || inside == ".." || fs::path(inside).is_absolute()) {
      const fs::path dst = fs::path(out_dir) / "metrics" / report_detail::file_safe(r.label);
      fs::create_directories(dst, ec);
      DFP_CHECK(!ec, Status::io_error, "cannot create '" + dst.string() + "': " + ec.message());
      fs::copy_file(src, dst / "metrics.jsonl", fs::copy_options::overwrite_existing, ec);
      DFP_CHECK(!ec, Status::io_error, "cannot copy '" + src.string() + "' to '" + dst.string() + "': " + ec.message());
      if (fs::exists(src_cfg)) fs::copy_file(src_cfg, dst / "config.json", fs::copy_options::overwrite_existing, ec);
      files.metrics.push_back((dst / "metrics.jsonl").string());
      configs.push_back((dst / "config.json").string());
    } else {
      files.metrics.push_back(src.string());
      configs.push_back(src_cfg.string());
    }
  }

  const report_detail::PlotSet plots = report_detail::draw_plots(out_dir, runs, log);
  files.scripts = plots.scripts;
  for (const auto& p : plots.plots)
    if (p.drawn) files.plots.push_back((fs::path(out_dir) / p.image).string());
  files.plots_skipped = !plots.gnuplot_found;
  files.plots_note = plots.note;

  // ---- report.html and report.md ----
  std::ostringstream h, m;
  std::string title = "dfp compare";
  if (!runs[0].model.empty()) title += ": " + runs[0].model;
  if (!runs[0].dataset.empty()) title += " on " + runs[0].dataset;
  h << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" << html_escape(title)
    << "</title>\n<style>\n" << kCss << "\n</style>\n</head>\n<body>\n<h1>" << html_escape(title) << "</h1>\n";
  m << "# " << title << "\n\n";
  std::string labels;
  for (const auto& r : runs) labels += (labels.empty() ? "" : ", ") + run_title(r);
  h << "<p>" << runs.size() << " runs (" << html_escape(labels)
    << ") trained with the same seed, data and hyper-parameters; one precision each.</p>\n";
  m << runs.size() << " runs (" << labels << ") trained with the same seed, data and hyper-parameters; one precision each.\n\n";
  if (!plots.note.empty()) {
    h << "<p class=\"note\">" << html_escape(plots.note)
      << ". The data behind every plot and its gnuplot script are in <code>plots/</code>.</p>\n";
    m << "> **Note:** " << plots.note << ". The data behind every plot and its gnuplot script are in `plots/`.\n\n";
  }

  h << "<h2>Summary</h2>\n" << html_summary_table(runs)
    << "<p class=\"small\">Final epoch's test top-1/top-5 and train loss; train time = sum of the epochs' times; "
       "images/s = mean over epochs; peak RSS = largest over epochs; skipped steps counted from the start of the run; "
       "loss scale at the end of the last epoch (1 = unscaled). Hover a number for its exact value; exact figures: "
       "<a href=\"summary.csv\">summary.csv</a>, <a href=\"summary.md\">summary.md</a>.</p>\n";
  m << "## Summary\n\n" << md_table
    << "\nFinal epoch's test top-1/top-5 and train loss; train time = sum of the epochs' times; images/s = mean over "
       "epochs; peak RSS = largest over epochs; skipped steps counted from the start of the run; loss scale at the "
       "end of the last epoch. Same table as CSV: [summary.csv](summary.csv).\n";

  for (const auto& [key, heading] : kSections) {
    std::vector<const report_detail::Plot*> in;
    for (const auto& p : plots.plots)
      if (p.section == key) in.push_back(&p);
    if (in.empty()) continue;
    h << "<h2>" << heading << "</h2>\n";
    m << "\n## " << heading << "\n";
    for (const auto* p : in) {
      const std::string stem = fs::path(p->image).stem().string();
      if (p->drawn) {
        h << "<figure><img src=\"" << url(p->image) << "\" alt=\"" << html_escape(p->title) << "\">\n<figcaption><b>"
          << html_escape(p->title) << ".</b> " << html_escape(p->how_to_read) << "</figcaption></figure>\n";
        m << "\n### " << p->title << "\n\n![" << p->title << "](" << url(p->image) << ")\n\n" << p->how_to_read << "\n";
      } else {
        h << "<h3>" << html_escape(p->title) << "</h3>\n<p class=\"small\">Not drawn; data and script: <code>plots/"
          << html_escape(stem) << ".gp</code>. " << html_escape(p->how_to_read) << "</p>\n";
        m << "\n### " << p->title << "\n\nNot drawn; data and script: `plots/" << stem << ".gp`. " << p->how_to_read << "\n";
      }
    }
  }

  // Overflow / saturation / underflow totals.
  bool any_counts = false;
  for (const auto& r : runs) any_counts |= has_counts(r);
  if (any_counts) {
    h << "<h2>Overflow, saturation and underflow</h2>\n<p class=\"small\">Per run and layer class: the sum over the "
         "class's layers and over every epoch's logged values. <i>saturated</i>: values clipped to the INT16 range "
         "when quantizing; <i>overflow events</i>: INT32 accumulator overflows seen in verification mode; "
         "<i>overflow</i>/<i>underflow</i>: values beyond the format's largest magnitude / flushed to zero, out of "
         "<i>nonzero</i> values.</p>\n<table>\n<tr><th>precision</th><th>layer class</th><th>layers</th>";
    m << "\n## Overflow, saturation and underflow\n\nPer run and layer class: sums over the class's layers and every "
         "epoch's logged values.\n\n| precision | layer class | layers |";
    for (const char* n : kCountNames) {
      h << "<th>" << n << "</th>";
      m << " " << n << " |";
    }
    h << "</tr>\n";
    m << "\n|---|---|---:|---:|---:|---:|---:|---:|\n";
    for (const auto& r : runs) {
      if (!has_counts(r)) continue;
      for (const auto& [cls, t] : class_totals(r)) {
        h << "<tr><td>" << html_escape(run_title(r)) << "</td><td>" << html_escape(cls) << "</td><td class=\"n\">" << t.layers
          << "</td>";
        m << "| " << md_cell(run_title(r)) << " | " << md_cell(cls) << " | " << t.layers << " |";
        for (double v : t.v) {
          h << "<td class=\"n\">" << count_text(v) << "</td>";
          m << " " << count_text(v) << " |";
        }
        h << "</tr>\n";
        m << "\n";
      }
    }
    h << "</table>\n";
  }

  // Per-layer details.
  bool any_layers = false;
  for (const auto& r : runs) any_layers |= !r.layers.empty();
  if (any_layers) {
    h << "<h2>Per-layer numerics</h2>\n";
    m << "\n## Per-layer numerics\n";
    for (const auto& r : runs)
      if (!r.layers.empty()) {
        h << report_detail::layer_table_html(r);
        m << report_detail::layer_table_markdown(r);
      }
  }

  // Configurations.
  h << "<h2>Runs</h2>\n";
  m << "\n## Runs\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunSummary& r = runs[i];
    h << "<h3>" << html_escape(r.label) << "</h3>\n<p class=\"small\">";
    m << "\n### " << r.label << "\n\n";
    if (!files.metrics[i].empty()) {
      const std::string mr = rel(files.metrics[i], out_dir), cr = rel(configs[i], out_dir);
      h << "<a href=\"" << url(mr) << "\">" << html_escape(mr) << "</a> · <a href=\"" << url(cr) << "\">"
        << html_escape(cr) << "</a>";
      m << "[" << mr << "](" << url(mr) << ") · [" << cr << "](" << url(cr) << ")\n\n";
    }
    h << "</p>\n<table>\n";
    m << "| setting | value |\n|---|---|\n";
    for (const auto& [k, v] : r.config) {
      h << "<tr><th>" << html_escape(k) << "</th><td>" << html_escape(v) << "</td></tr>\n";
      m << "| " << md_cell(k) << " | " << md_cell(v) << " |\n";
    }
    h << "</table>\n";
  }
  h << "<p class=\"small\">Written by dfp. Plots drawn with gnuplot from the data files and scripts in "
       "<code>plots/</code>.</p>\n</body>\n</html>\n";
  write_text(files.html, h.str());
  write_text(files.markdown, m.str());
  if (log) log("report: " + files.html);
  return files;
}

}  // namespace dfp
