// The dfp program's flags: each subcommand's flags are a list of Flag definitions, from which
// CLI11 builds the parser and the --help text. A flag's value is parsed and checked by the
// definition's apply function (its error names the flag and what was expected); values take
// effect in order, config-file values first, then the command line as typed, so that a later
// flag overrides an earlier one and list flags (--override, --keep-fp32) accumulate.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dfp/trainer.hpp"

namespace dfp::cli {

// Whole-value parsing of a number (int or float); leftovers, unparsable text and out-of-range
// values are errors naming the flag.
int to_int(const std::string& flag, const std::string& v);
float to_float(const std::string& flag, const std::string& v);
// --threads N (0 = all cores) and --isa LEVEL, checked here so that the error names the flag.
int threads_flag(const std::string& flag, const std::string& v);
std::string isa_flag(const std::string& flag, const std::string& v);

struct Flag {
  std::string names;  // CLI11 names, e.g. "-b,--batch-size"; the first long name is the canonical one
  std::string value;  // placeholder of the value ("N", "F", "DIR"); empty: a switch without value
  std::string help;
  // Parses and applies one value; `flag` is the canonical name, for error messages.
  std::function<void(const std::string& flag, const std::string& value)> apply;
  std::string group = "Options";
  bool list = false;  // each value adds to the earlier ones (repeatable; a config file may give an array)
};

// The flags of one subcommand, registered on its CLI11 App.
class FlagSet {
 public:
  explicit FlagSet(CLI::App& app) : app_(app) {}
  void add(std::vector<Flag> flags);
  // The given values in the order they take effect: those read from a config file first (flag by
  // flag, as defined), then the command line's as typed. A switch's value is true|false (any
  // case), 1|0, yes|no or on|off, anything else an error naming the flag; its last value wins,
  // and a switch that ends false is left out.
  std::vector<std::pair<const Flag*, std::string>> given() const;
  // --config FILE: a TOML file of top-level `flag-name = value` keys, read by apply() into the
  // flags the command line left unset. Strings are TOML's ('...' literal, "..." with escapes; a
  // '#' in quotes is no comment); a bare value is taken as written. Errors name the file, the line
  // and the key: an unknown key, a flag set twice, an array or an unquoted comma list for a flag
  // of one value (a list flag takes an array: each item repeats the flag), a bad switch value, a
  // file without any key, and one whose last line has no line break (a truncated file).
  void add_config_flag();
  // Appends "(default: V)" to the help of each flag that run.toml of `defaults` sets (a
  // default-constructed TrainConfig's, or the command's own), so that --help shows what a run
  // without the flag uses; switches (off unless given) and empty values show none.
  void show_defaults(const TrainConfig& defaults);
  // Refuses what CLI11 left unparsed (the subcommand allows extras so that this names it), reads
  // the --config file, if given, then applies given() through each flag's apply.
  void apply();

  static std::string canonical(const Flag& f);

 private:
  void refuse_extras() const;
  void read_config(const std::string& path);

  CLI::App& app_;
  std::vector<std::pair<CLI::Option*, Flag>> flags_;
  CLI::Option* config_ = nullptr;
};

// What the flags of a training run set (train and compare; info uses the numerics part).
struct RunFlags {
  TrainConfig config;
  std::string keep_fp32;        // --keep-fp32 lists, appended to the overrides by finish()
  bool scale_mode_set = false;  // --loss-scaling given: --loss-scale then keeps that mode
  bool evaluate = false;        // -e: evaluate --resume's checkpoint instead of training
  // Applies --keep-fp32 and checks the policy (after every flag, so that their order does not matter).
  void finish();
};

// The numerics flags (precision, overrides, per-class formats, rounding, headroom, INT16 chain,
// loss scaling), shared by train, compare and info.
std::vector<Flag> policy_flags(RunFlags& s);
// The flags of a run except --out: model, data, optimizer, schedule, machine, logging, and
// --label and --resume (which compare sets per run).
std::vector<Flag> run_flags(RunFlags& s);
// --threads N and --isa LEVEL of the commands that take a machine's settings alone.
Flag threads_option(int& threads);
Flag isa_option(std::string& isa);
// --out DIR (train's; compare has its own).
Flag out_flag(std::string& out, const std::string& help);

// dfp's model for a torchvision model name (vgg16_bn -> vgg16bn, resnext50_32x4d -> resnext50);
// any other name is returned as given.
std::string model_alias(const std::string& name);
std::string model_alias_help();
// The --model help: the zoo's models (dfp::model_names()) and the torchvision aliases.
std::string model_help();

// The run's resolved settings as `dfp train --config` reads them (the library's
// run_files::run_toml, which dfp::train writes to DIR/run.toml): every flag that decides or
// describes the run, with its value after all flags were applied (--keep-fp32 folded into
// --override, --rounding into the per-class flags). --resume and --overwrite are left out. Every
// string is a TOML string ('...', or "..." with escapes where the value has a ' or a control
// character), so that any value reads back as it was.
std::string run_toml(const TrainConfig& c);
// Writes `text` to DIR/run.toml (the library's run_files::write_run_toml) through a temporary file that reaches the disk before it is renamed
// (nothing when DIR is ""); a failed step (a full disk) is Error(io_error) naming run.toml.
void write_run_toml(const std::string& dir, const std::string& text);

}  // namespace dfp::cli
