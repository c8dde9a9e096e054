// dfp: the JSON files of a run directory, one record type per file, written by the trainer and
// read by the report (`dfp compare`) through nlohmann-json:
//
//   config.json    ConfigRecord   one object: every setting of the run, in the trainer's order
//   metrics.jsonl  EpochRecord    one object per line, one line per epoch; "layers" holds a
//                                 LayerRecord per layer
//   profile.json   ProfileRecord  one object: the step, optimizer and data-wait times, a
//                                 ProfileLayerRecord per layer and, in a data-parallel run, a
//                                 ProfileCommRecord (written with --profile)
//   run.toml       run_toml()     the run's settings as `dfp train` flags, which
//                                 `dfp train --config DIR/run.toml` reads back to repeat the run
//
// Non-finite numbers. JSON has no NaN or infinity: a number that is not finite (a diverged loss,
// an overflowed loss scale, an unmeasurable SQNR) is written as null, and null in a number field
// reads back as NaN. Files written by other tools may hold the bare tokens that C++ streams and
// Python's json module write (nan, -nan, inf, -inf, NaN, Infinity, -Infinity): the reader takes
// them as null too, so every non-finite number reads back as NaN. A member that a record does not
// hold (std::nullopt) is left out of the file, which is how a writer says "not logged"; a reader
// tells the two apart.
//
// Numbers with an integral value are written without a fraction ("1", not "1.0"); others as the
// shortest text that reads back as the same double. Strings are written as UTF-8: bytes that are
// not UTF-8 (a data path in another encoding) are written as U+FFFD.
//
// Reading never crashes on bad input: every parse_* function throws dfp::Error
// (Status::corrupt_data) whose message starts "<source>:<line>: " (for a syntax error
// "<source>:<line>:<column>: malformed JSON: ", the column of the last character read) and
// names the field and what was expected, e.g.
//   run/metrics.jsonl:3: layer 'conv1': field 'exp_x' is a string ("-3"); expected an integer
// Members a record does not know are ignored (the report shows config.json's as they are).
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dfp {
struct TrainConfig;
}  // namespace dfp

namespace dfp::run_files {

using Json = nlohmann::ordered_json;

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// One element of a metrics line's "layers": one layer's numerics at the end of the epoch. The
// trainer writes the DFP16 fields for int16 layers only and the sample fields once the layer has
// been sampled; every field but "layer" may be absent.
struct LayerRecord {
  std::string layer;   // required and not empty
  std::string format;  // int16, bf16, fp16, or "w/x/dy" formats; "" when absent
  // DFP16 shared exponents, INT32 chain lengths, saturated values, INT32 overflow events.
  std::optional<int64_t> exp_x, exp_w, exp_dy, chain_fwd, chain_bwd, chain_wgrad, saturated, overflow_events;
  // The smallest exponent of a slice (Granularity::slice), written where it differs from exp_*.
  std::optional<int64_t> exp_x_min, exp_w_min, exp_dy_min;
  // The last sampled step: SQNR against FP32 in dB (NaN when unmeasurable), and the counts.
  std::optional<double> sqnr_x_db, sqnr_w_db, sqnr_dy_db;
  std::optional<int64_t> overflow, underflow, nonzero;
  // underflow and nonzero per operand (they sum to the two above); absent in earlier files.
  std::optional<int64_t> underflow_x, underflow_w, underflow_dy, nonzero_x, nonzero_w, nonzero_dy;
};

// One line of metrics.jsonl. Required: "epoch" (an integer >= 1), "train_loss", "test_top1" and
// "epoch_seconds" (numbers, or null when not finite); files of earlier versions lack some of the
// others.
struct EpochRecord {
  int epoch = 0;
  double train_loss = kNaN, test_top1 = kNaN, epoch_seconds = kNaN;
  std::optional<double> lr, train_top1, test_loss, test_top5, images_per_second, data_wait_seconds;
  std::optional<int64_t> peak_rss_kib;
  std::optional<double> loss_scale;          // at the end of the epoch
  std::optional<int64_t> skipped_steps;      // since the start of the run
  std::optional<std::string> precision_policy;
  std::vector<LayerRecord> layers;           // absent or null: none
};

// config.json: the members in file order. A member's value is a string, or a JSON literal (a
// number, true, false or null) kept as its JSON text. The report reads the members it knows
// through string_or() and integer_or() and shows every member as text.
struct ConfigRecord {
  struct Member {
    std::string key;
    std::string text;  // a string's contents, or a literal's JSON text ("0.05", "true")
    bool is_string = false;
    int line = 0;      // where the member's key is in the file read (0: not read from a file)
  };
  std::string source;  // the file read, for messages ("" when built by a writer)
  std::vector<Member> members;

  void add_string(std::string key, std::string value);
  // `json_text` must be a JSON number, true, false or null.
  void add_literal(std::string key, std::string json_text);
  // The member named key (the last when a key repeats); nullptr when absent.
  const Member* find(std::string_view key) const;
  // The string member `key`, `dflt` when absent or null; throws naming the field when it is
  // another type.
  std::string string_or(std::string_view key, const std::string& dflt) const;
  // The integral number member `key` (a 32-bit int), `dflt` when absent or null; throws naming the
  // field when it is another type or not an integer in range.
  int integer_or(std::string_view key, int dflt) const;
};

// One layer in profile.json: its training passes' wall time summed over `steps` steps.
struct ProfileLayerRecord {
  std::string layer, kind, precision, implementation;
  double forward_seconds = 0, backward_seconds = 0;
  uint64_t steps = 0;
};

// profile.json's "communication" in a data-parallel run (src/parallel/): rank 0's gradient allreduce
// summed over `steps` training steps. bytes: what the rank contributed to the allreduces (the
// payload; fp32_bytes what an fp32 allreduce of the same gradients would be); in_flight_seconds:
// from each step's first bucket started to its last completed; exposed_seconds: of that, what the
// step waited for after backward. Every field is required.
struct ProfileCommRecord {
  int ranks = 1;
  std::string allreduce;  // fp32 | bf16 | dfp16
  uint64_t bytes = 0, fp32_bytes = 0;
  double in_flight_seconds = 0, exposed_seconds = 0;
};

// profile.json. Every field is required but "communication" (absent in a one-process run).
struct ProfileRecord {
  uint64_t steps = 0;
  double step_seconds = 0, optimizer_seconds = 0, data_wait_seconds = 0;
  std::vector<ProfileLayerRecord> layers;
  std::optional<ProfileCommRecord> communication;
};

// nlohmann-json conversions (found by argument-dependent lookup: Json(record), json.get<T>()).
// from_json throws dfp::Error naming the field (without file and line: the parse_* functions add
// them).
void to_json(Json& j, const LayerRecord& r);
void from_json(const Json& j, LayerRecord& r);
void to_json(Json& j, const EpochRecord& r);
void from_json(const Json& j, EpochRecord& r);
void to_json(Json& j, const ConfigRecord& r);
void to_json(Json& j, const ProfileLayerRecord& r);
void from_json(const Json& j, ProfileLayerRecord& r);
void to_json(Json& j, const ProfileRecord& r);
void from_json(const Json& j, ProfileRecord& r);

// The file texts: one line without its newline (metrics.jsonl), a whole file with its newline.
std::string to_line(const EpochRecord& r);
std::string to_text(const ConfigRecord& r);
std::string to_text(const ProfileRecord& r);

// Reading. `source` names the file in messages; `line_no` is the line number of the text's first line.
EpochRecord parse_epoch_line(std::string_view line, const std::string& source, int line_no);
ConfigRecord parse_config(std::string_view text, const std::string& source);
ProfileRecord parse_profile(std::string_view text, const std::string& source);

// run.toml: the run's resolved settings as `dfp train --config` reads them, one `flag = value`
// line per flag that decides or describes the run (--keep-fp32 is part of the overrides, --rounding
// of the per-class flags). --resume and --overwrite are left out, and so are the TrainConfig fields
// that no flag sets (stop_after). Every string is a TOML string ('...', or "..." with escapes where
// the value has a ' or a control character), so that any value reads back as it was.
std::string run_toml(const TrainConfig& config);
// Writes `text` to DIR/run.toml through a temporary file that reaches the disk before it is renamed
// (nothing when DIR is ""); a failed step (a full disk) is Error(io_error) naming run.toml.
void write_run_toml(const std::string& dir, const std::string& text);

// A number as the files write it: the shortest text that reads back as the same double ("65.71").
std::string number_text(double v);

}  // namespace dfp::run_files
