// dfp: the report behind `dfp compare` — reads finished run directories and writes the
// comparison table, plots and an HTML page. Internal API (namespace dfp, not installed).
//
// A run directory holds config.json (one JSON object) and metrics.jsonl (one JSON object per
// epoch, as dfp's trainer writes them). read_run() turns one into a RunSummary; format_table()
// renders summaries for a terminal; write_report() writes into an output directory:
//
//   summary.csv, summary.md   one row per run (the figures, exactly as the metrics files give them)
//   report.html, report.md    the table, every plot with a line on how to read it, the numerics
//                             tables and each run's configuration
//   plots/*.dat, plots/*.gp   the data and gnuplot scripts behind every plot (re-runnable by hand:
//                             cd plots && gnuplot loss.gp)
//   plots/*.png (or *.svg)    drawn by gnuplot when it is on PATH (PNG with the pngcairo terminal,
//                             else SVG); without gnuplot everything else is still written.
//
// Figures in the summary (and how each comes from metrics.jsonl, whose last line is the final epoch):
//   epochs            the last epoch's "epoch"; epochs_planned is config.json's "epochs"
//   test_top1/top5    the last epoch's test_top1 / test_top5
//   final_train_loss  the last epoch's train_loss
//   train_seconds     the sum of every epoch's epoch_seconds (rounded to the inputs' decimal places,
//                     so it is the exact decimal sum of the numbers in the file)
//   images_per_second the mean of the epochs' images_per_second
//   peak_rss_mib      the largest peak_rss_kib of any epoch, / 1024
//   skipped_steps     the last epoch's skipped_steps (cumulative in the file)
//   final_loss_scale  the last epoch's loss_scale
//   granularity       granularity_text(): an INT16 run's DFP16 exponent granularity as its policy
//                     records it ("tensor", "slice: w, x, dy", ...; empty for other runs)
// Optional figures the file lacks are NaN (skipped_steps: -1) and print as empty CSV fields and
// "-" in tables. A line whose epoch is not greater than the previous line's (a run resumed from an
// earlier checkpoint) replaces that epoch and everything after it.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dfp {

inline constexpr double kNotLogged = std::numeric_limits<double>::quiet_NaN();

// One line of metrics.jsonl. NaN marks a field the line lacks.
struct EpochPoint {
  int epoch = 0;
  double lr = kNotLogged, train_loss = kNotLogged, train_top1 = kNotLogged;
  double test_loss = kNotLogged, test_top1 = kNotLogged, test_top5 = kNotLogged;
  double images_per_second = kNotLogged, epoch_seconds = kNotLogged, data_wait_seconds = kNotLogged;
  double peak_rss_kib = kNotLogged, loss_scale = kNotLogged, skipped_steps = kNotLogged;
};

// One layer's entry in one epoch's "layers" array. NaN marks a field the entry lacks (or null).
struct LayerPoint {
  double exp_x = kNotLogged, exp_w = kNotLogged, exp_dy = kNotLogged;  // DFP16 shared exponents
  // The smallest exponent of a slice (Granularity::slice), logged where it differs from exp_*.
  double exp_x_min = kNotLogged, exp_w_min = kNotLogged, exp_dy_min = kNotLogged;
  double chain_fwd = kNotLogged, chain_bwd = kNotLogged, chain_wgrad = kNotLogged;  // INT32 chain lengths
  double saturated = kNotLogged, overflow_events = kNotLogged;
  double overflow = kNotLogged, underflow = kNotLogged, nonzero = kNotLogged;
  // underflow and nonzero per operand (files before these fields lack them).
  double underflow_x = kNotLogged, underflow_w = kNotLogged, underflow_dy = kNotLogged;
  double nonzero_x = kNotLogged, nonzero_w = kNotLogged, nonzero_dy = kNotLogged;
  // Signal-to-quantization-noise ratio (dB) against the FP32 shadow, on sampled steps.
  double sqnr_x_db = kNotLogged, sqnr_w_db = kNotLogged, sqnr_dy_db = kNotLogged;
};

// One layer across a run: points[i] belongs to RunSummary::epochs[i] (all NaN when the layer is
// missing from that epoch's line).
struct LayerSeries {
  std::string name;
  std::string format;  // "int16", "fp16", "bf16", ... ("" when not logged)
  std::vector<LayerPoint> points;
};

struct RunSummary {
  std::string dir;                 // the run directory as given to read_run
  std::string label;               // config "label", else the directory's name
  std::string device = "cpu";      // config "device", else "cpu"
  std::string model, dataset, precision_policy, loss_scaling;
  int batch_size = 0;              // config "batch_size" (0 when absent)
  int epochs_planned = 0;          // config "epochs" (0 when absent)
  int epochs = 0;                  // last epoch in metrics.jsonl
  double test_top1 = kNotLogged, test_top5 = kNotLogged, final_train_loss = kNotLogged;
  double train_seconds = 0;        // sum of epoch_seconds
  double images_per_second = 0;    // mean over epochs
  double peak_rss_mib = 0;         // max peak_rss_kib / 1024
  int64_t skipped_steps = -1;      // last epoch's (cumulative) count; -1 when not logged
  double final_loss_scale = kNotLogged;  // last epoch's loss_scale; NaN when not logged
  std::vector<std::pair<std::string, std::string>> config;  // every config.json member, as text
  std::vector<EpochPoint> epochs_series;                    // in epoch order
  std::vector<LayerSeries> layers;                          // in network order
  // DFP16 exponent granularity ("tensor" or "slice") of the weights, activations and gradients as
  // the run recorded it: the "granularity=" of its precision policy's weights{...},
  // activations{...} and gradients{...} (config.json's precision_policy, else the last metrics
  // line's); "" where the policy does not say (runs of earlier versions). int16: the policy runs
  // a layer in INT16 (its precision or an override), or a layer logs a DFP16 exponent.
  std::string granularity_w, granularity_x, granularity_dy;
  bool int16 = false;
  // A data-parallel run's gradient allreduce per training step, from <dir>/profile.json (written
  // with --profile; absent for one process or without --profile).
  struct Communication {
    int ranks = 1;
    std::string allreduce;                 // fp32 | bf16 | dfp16
    double bytes = 0, fp32_bytes = 0;      // per step and rank: sent, and an fp32 allreduce's
    double in_flight_ms = 0, exposed_ms = 0;  // per step: first bucket started to last done; waited for
  };
  std::optional<Communication> communication;
};

// An INT16 run's recorded granularity in words: "tensor" (every class), "slice: w, x, dy", or
// "slice: w; tensor: x, dy" when the classes differ; "" for a run without INT16 layers or without
// a recorded granularity.
std::string granularity_text(const RunSummary& run);
// How the report names a run in legends and tables: its label, followed by its granularity in
// parentheses where granularity_text() has one ("int16 (tensor)", "int16-slice (slice: w, x, dy)").
std::string run_title(const RunSummary& run);

// Reads <dir>/config.json and <dir>/metrics.jsonl. Throws dfp::Error naming the file and line
// (and what was expected) on unreadable files, malformed JSON, missing required fields
// (epoch, train_loss, test_top1, epoch_seconds in every metrics line) or no epochs at all.
RunSummary read_run(const std::string& dir);

// The runs' communication per step as an aligned table (runs without it left out); empty when no
// run has it.
std::string format_communication(const std::vector<RunSummary>& runs);

// An aligned text table, one row per run, for a terminal (numbers rounded for width; the CSV
// carries them exactly).
std::string format_table(const std::vector<RunSummary>& runs);

// The column names of summary.csv, in order, and one run's row of exact figures (the strings
// summary.csv and summary.md hold).
std::vector<std::string> summary_columns();
std::vector<std::string> summary_row(const RunSummary& run);

struct ReportFiles {
  std::string csv;                   // <out>/summary.csv
  std::string markdown_table;        // <out>/summary.md
  std::string html;                  // <out>/report.html
  std::string markdown;              // <out>/report.md
  std::vector<std::string> metrics;  // each run's metrics.jsonl inside <out> (copied there when
                                     // the run directory is elsewhere)
  std::vector<std::string> plots;    // images drawn (empty when gnuplot is missing or failed)
  std::vector<std::string> scripts;  // plots/*.gp and plots/*.dat
  bool plots_skipped = false;        // gnuplot was not found (or could not draw)
  std::string plots_note;            // why plots are missing ("" when drawn)
};

// Writes the report for `runs` into `out_dir` (created if needed); `log` (may be empty) receives
// one line per notable event, e.g. "gnuplot not found: plots skipped (CSV/JSON written)".
// gnuplot is looked up on PATH; the environment variable DFP_GNUPLOT, when set, names the program
// to use instead ("" or a missing file: behave as if gnuplot were not installed).
// Throws dfp::Error when a file cannot be written or two runs share a label.
ReportFiles write_report(const std::string& out_dir, const std::vector<RunSummary>& runs,
                         const std::function<void(const std::string&)>& log);

}  // namespace dfp
