// The report's plots: data files and gnuplot scripts under <out>/plots, drawn by gnuplot when it
// is installed (see plots.hpp and report.hpp).
#include "apps/dfp/report/plots.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "apps/dfp/report/layers.hpp"
#include "dfp/status.hpp"

namespace fs = std::filesystem;

namespace dfp::report_detail {

std::string exact(double v) {
  if (std::isnan(v)) return "";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[400];
  auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed);
  if (r.ec != std::errc()) r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string rounded(double v, int decimals) {
  if (std::isnan(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string layer_class(const std::string& layer) {
  std::string last = layer.substr(layer.rfind('.') == std::string::npos ? 0 : layer.rfind('.') + 1);
  while (!last.empty() && std::isdigit(static_cast<unsigned char>(last.back()))) last.pop_back();
  return last.empty() ? layer : last;
}

std::string file_safe(const std::string& label) {
  std::string o;
  for (char c : label) o += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_') ? c : '_';
  if (o.empty() || o[0] == '.') o = "_" + o;
  return o;
}

namespace {

// Tableau 10: distinct, colour-blind-friendly, one per run.
constexpr unsigned kColors[] = {0x4e79a7, 0xf28e2b, 0xe15759, 0x76b7b2, 0x59a14f,
                                0xedc948, 0xb07aa1, 0xff9da7, 0x9c755f, 0xbab0ac};

std::string color(size_t i) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "#%06x", kColors[i % (sizeof kColors / sizeof kColors[0])]);
  return buf;
}

// A gnuplot single-quoted string (the only escape is '' for ').
std::string q(const std::string& s) {
  std::string o = "'";
  for (char c : s) {
    if (c == '\'') o += "''";
    else if (c == '\n' || c == '\r') o += ' ';
    else o += c;
  }
  return o + "'";
}

// A data-file number: exact, or NaN (declared missing in every script).
std::string d(double v) { return std::isnan(v) ? "NaN" : exact(v); }

// A data-file string column.
std::string ds(const std::string& s) {
  std::string o = "\"";
  for (char c : s) o += (c == '"' || c == '\n' || c == '\r') ? '_' : c;
  return o + "\"";
}

bool finite(double v) { return std::isfinite(v); }

class Writer {
 public:
  Writer(const std::string& dir, const std::string& name, std::vector<std::string>& written)
      : path_((fs::path(dir) / name).string()), out_(path_, std::ios::trunc) {
    DFP_CHECK(out_.good(), Status::io_error, "cannot write '" + path_ + "'");
    written.push_back(path_);
  }
  ~Writer() noexcept(false) {
    out_.close();
    if (!std::uncaught_exceptions()) DFP_CHECK(!out_.fail(), Status::io_error, "error writing '" + path_ + "'");
  }
  template <class T>
  Writer& operator<<(const T& v) {
    out_ << v;
    return *this;
  }

 private:
  std::string path_;
  std::ofstream out_;
};

// ---- running gnuplot ---------------------------------------------------------------------------

bool executable(const std::string& p) {
  struct stat st {};
  return !p.empty() && ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
}

// DFP_GNUPLOT when set (empty or not executable: none), else "gnuplot" on PATH. Absolute path.
std::string find_gnuplot() {
  std::string name = "gnuplot";
  if (const char* env = std::getenv("DFP_GNUPLOT")) {
    name = env;
    if (name.empty()) return "";
    if (name.find('/') != std::string::npos) return executable(name) ? fs::absolute(name).string() : "";
  }
  const char* path = std::getenv("PATH");
  const std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  for (;;) {
    const size_t end = dirs.find(':', start);
    std::string dir = dirs.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (dir.empty()) dir = ".";
    const std::string cand = (fs::path(dir) / name).string();
    if (executable(cand)) return fs::absolute(cand).string();
    if (end == std::string::npos) return "";
    start = end + 1;
  }
}

// Runs program with args (argv[0] = program) in cwd, stdin from /dev/null, stdout and stderr
// appended to log_path. No shell, so no quoting. Returns the exit status (128+signal if killed,
// -1 if it could not be started).
int run_program(const std::string& program, const std::vector<std::string>& args, const std::string& cwd,
                const std::string& log_path) {
  std::vector<std::string> store = args;
  std::vector<char*> argv;
  for (auto& a : store) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) ::_exit(126);
    const int in = ::open("/dev/null", O_RDONLY);
    if (in >= 0) ::dup2(in, 0);
    const int out = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (out >= 0) {
      ::dup2(out, 1);
      ::dup2(out, 2);
    }
    ::execv(program.c_str(), argv.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

std::string last_lines(const std::string& path, size_t max_chars) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  if (s.size() > max_chars) s = "..." + s.substr(s.size() - max_chars);
  for (char& c : s)
    if (c == '\n') c = ' ';
  return s;
}

// ---- plot planning -----------------------------------------------------------------------------

struct Ctx {
  std::string plots_dir;
  std::string ext;       // "png" or "svg"
  bool png = false;
  std::vector<std::string>* written;
  std::vector<Plot>* plots;
  std::vector<std::string> gp;  // script file names (in plots_dir), in plot order
  std::vector<size_t> gp_plot;  // index into plots of each script
};

std::string preamble(const Ctx& c, const std::string& image, int w, int h) {
  std::ostringstream o;
  o << "# Written by dfp's report writer. Redraw with: gnuplot " << fs::path(image).stem().string()
    << ".gp (in this directory).\n";
  if (c.png)
    o << "set terminal pngcairo size " << w << "," << h << " noenhanced font 'Sans,10'\n";
  else
    o << "set terminal svg size " << w << "," << h << " noenhanced font 'Sans,10' background '#ffffff'\n";
  o << "set output " << q(image) << "\n"
    << "set datafile missing 'NaN'\n"
    << "set grid lc rgb '#d0d0d0' lw 1\n"
    << "set border lc rgb '#404040'\n";
  return o.str();
}

void add_plot(Ctx& c, const std::string& section, const std::string& stem, const std::string& title,
              const std::string& how, const std::string& script) {
  const std::string gp_name = stem + ".gp";
  Writer(c.plots_dir, gp_name, *c.written) << script;
  c.plots->push_back(Plot{section, "plots/" + stem + "." + c.ext, title, how, false});
  c.gp.push_back(gp_name);
  c.gp_plot.push_back(c.plots->size() - 1);
}

// The width of a plot whose key, outside on the right, holds the runs' titles followed by `suffix`:
// 900 pixels, wider by the titles' characters beyond 24, so that long titles ("int16-slice
// (slice: w, x, dy) worst layer") leave the graph its width.
int keyed_width(const std::vector<RunSummary>& runs, const std::string& suffix) {
  size_t longest = 0;
  for (const auto& r : runs) longest = std::max(longest, run_title(r).size() + suffix.size());
  return 900 + 7 * int(std::max<size_t>(longest, 24) - 24);
}

int max_epoch(const std::vector<RunSummary>& runs) {
  int e = 1;
  for (const auto& r : runs)
    for (const auto& p : r.epochs_series) e = std::max(e, p.epoch);
  return e;
}

std::string epoch_axis(int max_e) {
  std::ostringstream o;
  o << "set xlabel 'epoch'\nset xrange [0.5:" << max_e + 0.5 << "]\n";
  if (max_e <= 25) o << "set xtics 1\n";
  else o << "set xtics autofreq\nset mxtics\n";
  return o.str();
}

// Layer names in network order across runs: a run's layer that is new goes right after the
// layer that precedes it in that run.
std::vector<std::string> merged_layers(const std::vector<RunSummary>& runs) {
  std::vector<std::string> all;
  for (const auto& r : runs) {
    size_t at = 0;
    for (const auto& l : r.layers) {
      auto it = std::find(all.begin(), all.end(), l.name);
      if (it == all.end()) {
        all.insert(all.begin() + long(at), l.name);
        ++at;
      } else {
        at = size_t(it - all.begin()) + 1;
      }
    }
  }
  return all;
}

// Explicit tic labels: every `step`-th name at its index.
std::string name_tics(const std::vector<std::string>& names, const std::vector<double>& at) {
  const size_t step = names.size() > 36 ? (names.size() + 35) / 36 : 1;
  std::ostringstream o;
  o << "(";
  bool first = true;
  for (size_t i = 0; i < names.size(); i += step) {
    o << (first ? "" : ", ") << q(names[i]) << " " << exact(at[i]);
    first = false;
  }
  o << ")";
  return o.str();
}

using LayerField = double LayerPoint::*;
struct TensorClass {
  const char* key;     // file-name part
  const char* what;    // words
  LayerField exp;      // the largest exponent (the tensor's, or its slices' largest)
  LayerField exp_min;  // the smallest of the slices' exponents (logged where it differs)
  LayerField sqnr;
};
constexpr TensorClass kClasses[] = {
    {"x", "activations", &LayerPoint::exp_x, &LayerPoint::exp_x_min, &LayerPoint::sqnr_x_db},
    {"w", "weights", &LayerPoint::exp_w, &LayerPoint::exp_w_min, &LayerPoint::sqnr_w_db},
    {"dy", "gradients", &LayerPoint::exp_dy, &LayerPoint::exp_dy_min, &LayerPoint::sqnr_dy_db},
};

bool any_finite(const LayerSeries& l, LayerField f) {
  for (const auto& p : l.points)
    if (finite(p.*f)) return true;
  return false;
}

// ---- the plots ---------------------------------------------------------------------------------

void epoch_data(Ctx& c, const std::vector<RunSummary>& runs, const std::vector<std::string>& safe) {
  for (size_t r = 0; r < runs.size(); ++r) {
    Writer w(c.plots_dir, "epochs_" + safe[r] + ".dat", *c.written);
    w << "# " << run_title(runs[r])
      << ": one line per epoch\n# epoch lr train_loss train_top1 test_loss test_top1 test_top5 images_per_second "
         "epoch_seconds peak_rss_mib loss_scale skipped_steps\n";
    for (const auto& p : runs[r].epochs_series)
      w << p.epoch << " " << d(p.lr) << " " << d(p.train_loss) << " " << d(p.train_top1) << " " << d(p.test_loss) << " "
        << d(p.test_top1) << " " << d(p.test_top5) << " " << d(p.images_per_second) << " " << d(p.epoch_seconds) << " "
        << d(p.peak_rss_kib / 1024.0) << " " << d(p.loss_scale) << " " << d(p.skipped_steps) << "\n";
  }
}

// One line per run of column `col` of epochs_<label>.dat; runs without a finite value are left out.
std::string epoch_lines(const std::vector<RunSummary>& runs, const std::vector<std::string>& safe, int col,
                        double EpochPoint::*field, const std::vector<bool>* keep = nullptr) {
  std::ostringstream o;
  bool first = true;
  for (size_t r = 0; r < runs.size(); ++r) {
    if (keep && !(*keep)[r]) continue;
    bool has = false;
    for (const auto& p : runs[r].epochs_series) has |= finite(p.*field);
    if (!has) continue;
    o << (first ? "plot " : ", \\\n     ") << q("epochs_" + safe[r] + ".dat") << " using 1:" << col
      << " with linespoints lw 2 pt 7 ps 0.9 lc rgb " << q(color(r)) << " title " << q(run_title(runs[r]));
    first = false;
  }
  return first ? "" : o.str() + "\n";
}

void curve_plots(Ctx& c, const std::vector<RunSummary>& runs, const std::vector<std::string>& safe) {
  const int me = max_epoch(runs);
  const std::string key = "set key outside right top vertical Left reverse samplen 2 spacing 1.2\n";
  if (std::string lines = epoch_lines(runs, safe, 3, &EpochPoint::train_loss); !lines.empty())
    add_plot(c, "curves", "loss", "Training loss per epoch",
             "Mean training loss over each epoch's batches, one line per precision; lower is better, and a "
             "reduced precision that trains like FP32 follows the FP32 line.",
             preamble(c, "loss." + c.ext, keyed_width(runs, ""), 500) + "set title 'Training loss per epoch (all precisions)'\n" +
                 epoch_axis(me) + "set ylabel 'train loss'\n" + key + lines);
  if (std::string lines = epoch_lines(runs, safe, 6, &EpochPoint::test_top1); !lines.empty())
    add_plot(c, "curves", "test_top1", "Test top-1 accuracy per epoch",
             "Test-set top-1 accuracy (%) after each epoch, one line per precision; the gap to FP32 at the last "
             "epoch is the accuracy cost of that precision.",
             preamble(c, "test_top1." + c.ext, keyed_width(runs, ""), 500) + "set title 'Test top-1 accuracy per epoch (all precisions)'\n" +
                 epoch_axis(me) + "set ylabel 'test top-1 (%)'\n" + key + lines);
}

void performance_plot(Ctx& c, const std::vector<RunSummary>& runs) {
  bool any_ips = false, any_rss = false;
  {
    Writer w(c.plots_dir, "summary.dat", *c.written);
    w << "# index label images_per_second peak_rss_mib colour(0xRRGGBB)\n";
    for (size_t r = 0; r < runs.size(); ++r) {
      w << r << " " << ds(run_title(runs[r])) << " " << d(runs[r].images_per_second) << " " << d(runs[r].peak_rss_mib) << " "
        << kColors[r % (sizeof kColors / sizeof kColors[0])] << "\n";
      any_ips |= finite(runs[r].images_per_second);
      any_rss |= finite(runs[r].peak_rss_mib);
    }
  }
  if (!any_ips && !any_rss) return;
  const size_t n = runs.size();
  size_t label_chars = 0;  // tic labels side by side under one panel (half the width)
  for (const auto& r : runs) label_chars += run_title(r).size() + 2;
  std::ostringstream o;
  o << preamble(c, "performance." + c.ext, 900, 500) << "set multiplot layout 1," << (any_ips && any_rss ? 2 : 1)
    << " title 'Throughput and memory per precision'\n"
    << "set style fill solid 0.85 border lc rgb '#303030'\nset boxwidth 0.6\nset yrange [0:*]\n"
    << "set offsets 0, 0, graph 0.12, 0\nset xrange [-0.6:" << double(n) - 0.4 << "]\nunset key\nset grid noxtics ytics\n"
    << (label_chars > 36 ? "set xtics rotate by 30 right\n" : "")
    << "set xtics scale 0\n";
  if (any_ips)
    o << "set title 'training throughput (mean over epochs)'\nset ylabel 'images / s'\n"
      << "plot 'summary.dat' using 1:3:5:xtic(2) with boxes lc rgb variable, \\\n"
      << "     '' using 1:3:(sprintf('%.0f', $3)) with labels offset 0,0.8\n";
  if (any_rss)
    o << "set title 'peak resident memory (RSS)'\nset ylabel 'MiB'\n"
      << "plot 'summary.dat' using 1:4:5:xtic(2) with boxes lc rgb variable, \\\n"
      << "     '' using 1:4:(sprintf('%.0f', $4)) with labels offset 0,0.8\n";
  o << "unset multiplot\n";
  add_plot(c, "performance", "performance", "Throughput and peak memory",
           "Left: training images per second (mean of the epochs), higher is better; right: the process's peak "
           "resident memory, lower is better. Bars share the colours of the curves above.",
           o.str());
}

void loss_scale_plot(Ctx& c, const std::vector<RunSummary>& runs, const std::vector<std::string>& safe) {
  // Only the runs that scale or skip: the others sit at scale 1 with nothing skipped.
  std::vector<bool> keep(runs.size(), false);
  bool any = false;
  for (size_t r = 0; r < runs.size(); ++r) {
    for (const auto& p : runs[r].epochs_series)
      keep[r] = keep[r] || (finite(p.loss_scale) && p.loss_scale != 1) || (finite(p.skipped_steps) && p.skipped_steps > 0);
    any |= keep[r];
  }
  if (!any) return;
  const std::string scale_lines = epoch_lines(runs, safe, 11, &EpochPoint::loss_scale, &keep);
  const std::string skip_lines = epoch_lines(runs, safe, 12, &EpochPoint::skipped_steps, &keep);
  double max_skipped = 0;
  for (size_t r = 0; r < runs.size(); ++r)
    for (const auto& p : runs[r].epochs_series)
      if (keep[r] && finite(p.skipped_steps)) max_skipped = std::max(max_skipped, p.skipped_steps);
  std::ostringstream o;
  o << preamble(c, "loss_scale." + c.ext, 900, 500) << "set multiplot layout 1,2 title 'Loss scaling'\n"
    << epoch_axis(max_epoch(runs)) << "set bmargin 5\nset key at screen 0.5, 0.035 center center horizontal samplen 2\n";
  if (!scale_lines.empty())
    o << "set title 'loss scale at the end of each epoch'\nset logscale y 2\nset format y '2^%L'\nset ylabel 'loss scale'\n"
      << "set offsets 0, 0, graph 0.08, graph 0.08\n" << scale_lines << "unset logscale y\nset format y '%g'\n";
  if (!skip_lines.empty())
    o << "set title 'skipped steps (cumulative)'\nset ylabel 'steps'\nset offsets 0, 0, graph 0.08, 0\n"
      << (max_skipped <= 10 ? "set yrange [0:" + exact(std::max(1.0, max_skipped)) + "]\nset ytics 1\n" : "set yrange [0:*]\n")
      << (scale_lines.empty() ? "" : "unset key\n")
      << skip_lines;
  o << "unset multiplot\n";
  add_plot(c, "loss_scale", "loss_scale", "Loss scale and skipped steps",
           "Left: the loss scale at the end of each epoch (log2 axis); a drop means a step overflowed and the "
           "scale backed off. Right: steps skipped because their gradients were not finite, counted from the start. "
           "Runs that stay at scale 1 without skipping a step are left out.",
           o.str());
}

// A palette through five colour stops: one flat colour per integer when there are few levels, so
// that a colour is a value; a continuous ramp otherwise.
using Stops = unsigned[5];
// Exponents: blue (small) to red (large).
constexpr Stops kExponentStops = {0x2c7bb6, 0xabd9e9, 0xffffbf, 0xfdae61, 0xd7191c};
// Spreads: near white (0 bits, one exponent) to dark purple (many bits).
constexpr Stops kSpreadStops = {0xf7f4f9, 0xd4b9da, 0xc994c7, 0xdf65b0, 0x980043};

std::string level_palette(int levels, const Stops& stops) {
  auto channel = [&](int i, int shift) { return double((stops[i] >> shift) & 0xff); };
  auto at = [&](double t) {
    const double x = std::clamp(t, 0.0, 1.0) * 4;
    const int i = std::min(3, int(x));
    const double f = x - i;
    int rgb[3];
    for (int k = 0; k < 3; ++k)
      rgb[k] = int(std::lround(channel(i, 16 - 8 * k) + f * (channel(i + 1, 16 - 8 * k) - channel(i, 16 - 8 * k))));
    char buf[16];
    std::snprintf(buf, sizeof buf, "#%02x%02x%02x", rgb[0], rgb[1], rgb[2]);
    return std::string(buf);
  };
  std::ostringstream o;
  o << "defined (";
  if (levels > 24) {
    for (int i = 0; i <= 4; ++i) o << (i ? ", " : "") << i << " '" << at(i / 4.0) << "'";
  } else {
    for (int i = 0; i < levels; ++i) {
      const std::string c = at(levels == 1 ? 0.5 : double(i) / (levels - 1));
      o << (i ? ", " : "") << i << " '" << c << "', " << i + 1 << " '" << c << "'";
    }
  }
  return o.str() + ")";
}

// One heat map of a run: a row per layer (network order, input at the top), a column per epoch.
// `value` gives a cell's number (NaN: no cell) and the data file's further columns after it.
struct HeatMap {
  std::string stem, title, cblabel, header;  // header: the data file's column names
  const Stops* stops;
  bool from_zero = false;                    // the colour range starts at 0, and the darkest
                                             // cells (the top of the range) get white numbers
};

// Returns the gnuplot script (for add_plot).
std::string heat_map(Ctx& c, const RunSummary& run, const std::vector<const LayerSeries*>& layers, const HeatMap& m,
              const std::function<std::pair<double, std::string>(const LayerPoint&)>& value) {
  double lo = m.from_zero ? 0 : 1e300, hi = -1e300;
  {
    Writer w(c.plots_dir, m.stem + ".dat", *c.written);
    w << "# " << run_title(run) << ": " << m.title << "\n# epoch layer_row " << m.header << "\n";
    for (size_t e = 0; e < run.epochs_series.size(); ++e)
      for (size_t i = 0; i < layers.size(); ++i) {
        const auto [v, rest] = value(layers[i]->points[e]);
        if (!finite(v)) continue;
        lo = std::min(lo, v);
        hi = std::max(hi, v);
        w << run.epochs_series[e].epoch << " " << i << " " << d(v) << rest << "\n";
      }
  }
  if (lo == hi) {
    hi += 1;
    if (!m.from_zero) lo -= 1;
  }
  const size_t n = layers.size();
  const int ne = int(run.epochs_series.size());
  std::vector<std::string> names;
  std::vector<double> at;
  for (size_t i = 0; i < n; ++i) {
    names.push_back(layers[i]->name);
    at.push_back(double(i));
  }
  std::ostringstream o;
  o << preamble(c, m.stem + "." + c.ext, 900, std::max(500, int(n) * 11 + 130)) << "set title " << q(run_title(run) + ": " + m.title)
    << "\nset xlabel 'epoch'\nset xrange [" << run.epochs_series.front().epoch - 0.5 << ":"
    << run.epochs_series.back().epoch + 0.5 << "]\n"
    << (ne <= 25 ? "set xtics 1\n" : "set xtics autofreq\n")
    << "set yrange [" << double(n) - 0.5 << ":-0.5]\nset ytics " << name_tics(names, at) << "\nset ytics scale 0\n"
    << "set ylabel 'layer (network order, input at the top)'\nset grid noxtics noytics\nunset key\n"
    << "set cbrange [" << lo - 0.5 << ":" << hi + 0.5 << "]\nset cblabel " << q(m.cblabel) << "\n"
    << "set palette " << level_palette(int(hi - lo + 1), *m.stops) << "\n";
  if (hi - lo <= 12) o << "set cbtics 1\n";
  o << "set rmargin at screen 0.86\n"
    << "plot " << q(m.stem + ".dat") << " using 1:2:(0.5):(0.5):3 with boxxyerror fs solid 1.0 noborder lc palette";
  // Numbers in the cells when they are large enough to hold them.
  if (ne <= 16 && n <= 40) {
    o << ", \\\n     '' using 1:2:(sprintf('%d', int($3)))";
    if (m.from_zero) o << ":($3 > " << lo + 0.7 * (hi - lo) << " ? 0xffffff : 0x202020) with labels font ',8' tc rgb variable";
    else o << " with labels font ',8' tc rgb '#202020'";
  }
  o << "\n";
  return o.str();
}

// Per run and class, the shared exponent per layer and epoch (the largest of the slices' where the
// run has more than one exponent per tensor). Where some layer's slices differ, a second map shows
// the spread max - min in bits: a colour needs one number per cell, a "min..max" label does not
// fit the cells of more than a few epochs, and on a scale of its own the spread points at the
// layers whose slices gain most from their own exponents; runs with one exponent per tensor draw
// the first map alone.
void exponent_plots(Ctx& c, const std::vector<RunSummary>& runs, const std::vector<std::string>& safe) {
  for (size_t r = 0; r < runs.size(); ++r) {
    const RunSummary& run = runs[r];
    for (const TensorClass& tc : kClasses) {
      std::vector<const LayerSeries*> layers;
      bool spread = false;
      for (const auto& l : run.layers)
        if (any_finite(l, tc.exp)) {
          layers.push_back(&l);
          for (const auto& p : l.points) spread |= finite(p.*tc.exp) && finite(p.*tc.exp_min) && p.*tc.exp_min != p.*tc.exp;
        }
      if (layers.empty()) continue;
      const std::string stem = "exp_" + safe[r] + "_" + tc.key, field = std::string("exp_") + tc.key;
      const std::string script = heat_map(c, run, layers,
               {stem,
                std::string("DFP16 exponent e of the ") + tc.what + (spread ? ", the largest of the slices'" : "") + " (" +
                    field + ") per layer and epoch",
                "exponent e   (value = i * 2^e)", "exponent", &kExponentStops},
               [&](const LayerPoint& p) { return std::make_pair(p.*tc.exp, std::string()); });
      add_plot(c, "exponents", stem, run_title(run) + ": exponents of the " + std::string(tc.what),
               std::string("One row per INT16 layer (network order, input at the top), one column per epoch; colour "
                           "and number give the shared exponent e of the layer's ") +
                   tc.what + (spread ? " (the largest of its slices' exponents)" : "") +
                   " at the end of the epoch (a DFP16 value is i * 2^e, |i| <= 32767). e grows by 1 when the "
                   "tensor's range doubles; a row that changes colour is a range that moves during training.",
               script);
      if (!spread) continue;
      const std::string spread_script = heat_map(c, run, layers,
               {stem + "_spread",
                std::string("spread of the slices' DFP16 exponents within each layer's ") + tc.what + " (" + field + " - " +
                    field + "_min, bits)",
                "bits between the largest and the smallest slice exponent", "spread_bits largest smallest",
                &kSpreadStops, true},
               [&](const LayerPoint& p) {
                 const double lo = finite(p.*tc.exp_min) ? p.*tc.exp_min : p.*tc.exp;
                 return std::make_pair(p.*tc.exp - lo, " " + d(p.*tc.exp) + " " + d(lo));
               });
      add_plot(c, "exponents", stem + "_spread", run_title(run) + ": spread of the exponents within the " + tc.what,
               std::string("Where a tensor has an exponent per slice (granularity slice), the bits between its largest "
                           "and its smallest slice exponent, per layer (rows) and epoch (columns). 0: every slice shares "
                           "the largest exponent, as one exponent per tensor would; k: the finest slice keeps k more "
                           "bits than one exponent per tensor would give it."),
               spread_script);
    }
  }
}

void sqnr_plots(Ctx& c, const std::vector<RunSummary>& runs, const std::vector<std::string>& safe) {
  const std::vector<std::string> order = merged_layers(runs);
  if (order.empty()) return;
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < order.size(); ++i) index[order[i]] = i;

  // Which (run, class) pairs have any sample.
  std::vector<std::array<bool, 3>> has(runs.size(), {false, false, false});
  bool any = false;
  for (size_t r = 0; r < runs.size(); ++r)
    for (int k = 0; k < 3; ++k)
      for (const auto& l : runs[r].layers) {
        if (any_finite(l, kClasses[k].sqnr)) has[r][k] = true;
        any |= has[r][k];
      }
  if (!any) return;

  // Per layer (global order), each run's last sampled SQNR of each class.
  {
    Writer w(c.plots_dir, "sqnr_layers.dat", *c.written);
    w << "# SQNR (dB) against the FP32 shadow, each layer's last sampled value\n# runs:";
    for (const auto& r : runs) w << " " << run_title(r) << ";";
    w << "\n# layer_index";
    for (const auto& r : runs) w << " " << file_safe(r.label) << ":x " << file_safe(r.label) << ":w " << file_safe(r.label) << ":dy";
    w << "  layer_name\n";
    for (size_t i = 0; i < order.size(); ++i) {
      w << i;
      for (const auto& r : runs) {
        const LayerSeries* l = nullptr;
        for (const auto& s : r.layers)
          if (s.name == order[i]) l = &s;
        for (const TensorClass& tc : kClasses) w << " " << d(l ? last_finite(*l, tc.sqnr) : kNotLogged);
      }
      w << " " << ds(order[i]) << "\n";
    }
  }
  // Per run and epoch: mean and worst (min) over layers.
  for (size_t r = 0; r < runs.size(); ++r) {
    if (!has[r][0] && !has[r][1] && !has[r][2]) continue;
    Writer w(c.plots_dir, "sqnr_epochs_" + safe[r] + ".dat", *c.written);
    w << "# " << run_title(runs[r]) << ": SQNR (dB) over layers per epoch\n# epoch mean_x min_x mean_w min_w mean_dy min_dy\n";
    for (size_t e = 0; e < runs[r].epochs_series.size(); ++e) {
      w << runs[r].epochs_series[e].epoch;
      for (const TensorClass& tc : kClasses) {
        double sum = 0, mn = kNotLogged;
        int cnt = 0;
        for (const auto& l : runs[r].layers) {
          const double v = l.points[e].*tc.sqnr;
          if (!finite(v)) continue;
          sum += v;
          ++cnt;
          mn = std::isnan(mn) ? v : std::min(mn, v);
        }
        w << " " << d(cnt ? sum / cnt : kNotLogged) << " " << d(mn);
      }
      w << "\n";
    }
  }

  std::vector<double> at;
  for (size_t i = 0; i < order.size(); ++i) at.push_back(double(i));
  const std::string key = "set key outside right top vertical Left reverse samplen 2 spacing 1.2\n";
  std::string granularity_note;
  for (const auto& r : runs)
    if (!granularity_text(r).empty())
      granularity_note = " An INT16 run's legend names its DFP16 exponent granularity: tensor (one exponent per tensor) "
                         "or slice (an exponent per slice, for the classes listed).";
  for (int k = 0; k < 3; ++k) {
    const TensorClass& tc = kClasses[k];
    bool any_k = false;
    for (size_t r = 0; r < runs.size(); ++r) any_k |= has[r][k];
    if (!any_k) continue;
    // (1) per layer, last sample.
    std::ostringstream o;
    size_t longest = 0;
    for (const auto& n : order) longest = std::max(longest, n.size());
    o << preamble(c, std::string("sqnr_layers_") + tc.key + "." + c.ext, keyed_width(runs, ""), 500)
      << "set title " << q(std::string("SQNR of each layer's ") + tc.what + " vs the FP32 shadow (last sampled step; layers in network order)") << "\n"
      << "set ylabel 'SQNR (dB), higher is better'\nunset xlabel\n"
      << "set xrange [-0.5:" << double(order.size()) - 0.5 << "]\n"
      << "set xtics " << name_tics(order, at) << " rotate by 60 right font ',8'\n"
      // gnuplot over-estimates the height of rotated tic labels: size the margin to them.
      << "set bmargin " << std::clamp<size_t>(1 + (longest * 42 + 99) / 100, 3, 14) << "\n" << key;
    bool first = true;
    for (size_t r = 0; r < runs.size(); ++r) {
      if (!has[r][k]) continue;
      o << (first ? "plot " : ", \\\n     ") << "'sqnr_layers.dat' using 1:" << 2 + 3 * r + size_t(k)
        << " with linespoints lw 2 pt 7 ps 0.9 lc rgb " << q(color(r)) << " title " << q(run_title(runs[r]));
      first = false;
    }
    o << "\n";
    add_plot(c, "sqnr", std::string("sqnr_layers_") + tc.key, std::string("SQNR per layer: ") + tc.what,
             std::string("Signal-to-quantization-noise ratio 10*log10(sum ref^2 / sum (q - ref)^2) of each layer's ") +
                 tc.what + " in the run's precision against an FP32 shadow computation, from the last epoch that "
                           "sampled the layer; one line per precision. Higher is better; 6 dB is about one bit." +
                 granularity_note,
             o.str());
    // (2) over epochs: mean (solid) and worst layer (dashed).
    std::ostringstream p;
    p << preamble(c, std::string("sqnr_epochs_") + tc.key + "." + c.ext, keyed_width(runs, " worst layer"), 500)
      << "set title " << q(std::string("SQNR of the ") + tc.what + " over training (mean and worst layer)") << "\n"
      << "set ylabel 'SQNR (dB), higher is better'\n" << epoch_axis(max_epoch(runs)) << key;
    first = true;
    for (size_t r = 0; r < runs.size(); ++r) {
      if (!has[r][k]) continue;
      const std::string f = q("sqnr_epochs_" + safe[r] + ".dat");
      p << (first ? "plot " : ", \\\n     ") << f << " using 1:" << 2 + 2 * k << " with linespoints lw 2 pt 7 ps 0.9 lc rgb "
        << q(color(r)) << " title " << q(run_title(runs[r]) + " mean") << ", \\\n     " << f << " using 1:" << 3 + 2 * k
        << " with linespoints lw 1.5 dt 2 pt 6 ps 0.9 lc rgb " << q(color(r)) << " title "
        << q(run_title(runs[r]) + " worst layer");
      first = false;
    }
    p << "\n";
    add_plot(c, "sqnr", std::string("sqnr_epochs_") + tc.key, std::string("SQNR over training: ") + tc.what,
             std::string("Per epoch, the mean over layers (solid) and the lowest layer (dashed) of the SQNR of the ") +
                 tc.what + "; a falling worst-layer line points at a layer whose range the format stops covering." + granularity_note,
             p.str());
  }
}

}  // namespace

PlotSet draw_plots(const std::string& out_dir, const std::vector<RunSummary>& runs,
                   const std::function<void(const std::string&)>& log) {
  PlotSet set;
  const std::string plots_dir = (fs::path(out_dir) / "plots").string();
  std::error_code ec;
  fs::create_directories(plots_dir, ec);
  DFP_CHECK(!ec, Status::io_error, "cannot create '" + plots_dir + "': " + ec.message());

  const std::string gnuplot = find_gnuplot();
  set.gnuplot_found = !gnuplot.empty();
  const std::string gp_log = fs::absolute(fs::path(plots_dir) / "gnuplot.log").string();
  if (set.gnuplot_found) {
    std::ofstream(gp_log, std::ios::trunc).close();
  }
  // PNG when this gnuplot has the cairo terminal, else SVG (always built in).
  const bool png = set.gnuplot_found && run_program(gnuplot, {"gnuplot", "-e", "set terminal pngcairo"}, "", "/dev/null") == 0;

  Ctx c;
  c.plots_dir = plots_dir;
  c.png = png;
  c.ext = png ? "png" : "svg";
  c.written = &set.scripts;
  c.plots = &set.plots;
  std::vector<std::string> safe;
  for (const auto& r : runs) safe.push_back(file_safe(r.label));

  epoch_data(c, runs, safe);
  curve_plots(c, runs, safe);
  performance_plot(c, runs);
  loss_scale_plot(c, runs, safe);
  exponent_plots(c, runs, safe);
  sqnr_plots(c, runs, safe);

  if (!set.gnuplot_found) {
    set.note = "gnuplot not found: plots skipped (CSV/JSON written)";
    if (log) log(set.note);
    return set;
  }
  int failed = 0;
  std::string first_failure;
  for (size_t i = 0; i < c.gp.size(); ++i) {
    Plot& p = set.plots[c.gp_plot[i]];
    const fs::path image = fs::path(out_dir) / p.image;
    fs::remove(image, ec);
    const int rc = run_program(gnuplot, {"gnuplot", "-d", c.gp[i]}, plots_dir, gp_log);
    p.drawn = rc == 0 && fs::exists(image, ec) && fs::file_size(image, ec) > 0;
    if (!p.drawn) {
      ++failed;
      if (first_failure.empty()) first_failure = "plots/" + c.gp[i] + " (exit " + std::to_string(rc) + ")";
    }
  }
  if (failed) {
    set.note = "gnuplot failed on " + std::to_string(failed) + " of " + std::to_string(c.gp.size()) + " plots, first " +
               first_failure + ": " + last_lines(gp_log, 300);
    if (log) log(set.note);
  }
  return set;
}

}  // namespace dfp::report_detail
