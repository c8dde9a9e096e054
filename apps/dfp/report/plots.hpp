// dfp: the gnuplot side of the report writer (internal to apps/dfp/report).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "apps/dfp/report/report.hpp"

namespace dfp::report_detail {

// The shortest text that reads back as exactly v, in fixed notation ("" for NaN).
std::string exact(double v);
// printf-style rounding for people ("-" for NaN).
std::string rounded(double v, int decimals);
// A layer's class for the numerics tables: its name's last dotted component without trailing
// digits ("layer1.0.conv2" -> "conv", "fc" -> "fc").
std::string layer_class(const std::string& layer);
// A label reduced to [A-Za-z0-9._-] for file names.
std::string file_safe(const std::string& label);

struct Plot {
  std::string section;      // "curves", "performance", "loss_scale", "exponents", "sqnr"
  std::string image;        // path relative to the output directory, e.g. "plots/loss.png"
  std::string title;
  std::string how_to_read;  // one line for the report
  bool drawn = false;       // the image exists (gnuplot ran and wrote it)
};

struct PlotSet {
  std::vector<Plot> plots;           // every plot planned, drawn or not
  std::vector<std::string> scripts;  // absolute paths of the .gp and .dat files written
  bool gnuplot_found = false;
  std::string note;                  // why some or all plots are missing ("" when all drawn)
};

// Writes plots/*.dat and plots/*.gp under out_dir and runs gnuplot on each script when it is
// available (see write_report for how it is found).
PlotSet draw_plots(const std::string& out_dir, const std::vector<RunSummary>& runs,
                   const std::function<void(const std::string&)>& log);

}  // namespace dfp::report_detail
