// FlagSet: Flag definitions on CLI11, the order values take effect in, and config files.
#include "apps/dfp/flags.hpp"

#include <filesystem>
#include <map>
#include <type_traits>

#include "dfp/context.hpp"
#include "dfp/status.hpp"

namespace dfp::cli {

namespace {
// Parses a whole flag value as T (int or float); anything left over or unparsable is an error
// naming the flag.
template <class T>
T parse_number(const std::string& flag, const std::string& v) {
  constexpr bool integer = std::is_same_v<T, int>;
  try {
    size_t used = 0;
    const T x = integer ? T(std::stoi(v, &used)) : T(std::stof(v, &used));
    if (used == v.size()) return x;
  } catch (const std::out_of_range&) {
    dfp::fail(dfp::Status::invalid_argument,
              "flag " + flag + ": '" + v + "' is out of range; expected " +
                  (integer ? "an integer in -2147483648..2147483647" : "a number of magnitude 1.2e-38 .. 3.4e38, or 0"));
  } catch (const std::invalid_argument&) {
  }
  dfp::fail(dfp::Status::invalid_argument,
            "flag " + flag + ": expected " + (integer ? "an integer" : "a number") + ", got '" + v + "'");
}

// A switch's value as CLI11 hands it over: "true" when typed bare, or what --flag=VALUE or a
// config file says.
bool switch_off(const std::string& v) { return v == "false" || v == "0" || v == "-1" || v == "off" || v == "no"; }
}  // namespace

int to_int(const std::string& flag, const std::string& v) { return parse_number<int>(flag, v); }
float to_float(const std::string& flag, const std::string& v) { return parse_number<float>(flag, v); }
int threads_flag(const std::string& flag, const std::string& v) {
  const int n = to_int(flag, v);
  dfp::ContextOptions::validate_threads(n, "flag " + flag);
  return n;
}
std::string isa_flag(const std::string& flag, const std::string& v) {
  dfp::parse_isa(v, "flag " + flag);
  return v;
}

std::string FlagSet::canonical(const Flag& f) {
  std::stringstream ss(f.names);
  std::string n;
  while (std::getline(ss, n, ','))
    if (n.rfind("--", 0) == 0) return n;
  return f.names;
}

void FlagSet::add(std::vector<Flag> flags) {
  for (Flag& f : flags) {
    CLI::Option* o = f.value.empty() ? app_.add_flag(f.names) : app_.add_option(f.names)->type_name(f.value);
    // Every flag may repeat: the last value wins, or a list flag accumulates (apply decides).
    o->description(f.help)->group(f.group)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    flags_.emplace_back(o, std::move(f));
  }
}

std::vector<std::pair<const Flag*, std::string>> FlagSet::given() const {
  std::map<const CLI::Option*, const Flag*> flag_of;
  std::map<const CLI::Option*, size_t> typed;  // occurrences on the command line
  for (const auto& [o, f] : flags_) flag_of[o] = &f;
  for (const CLI::Option* o : app_.parse_order()) ++typed[o];
  std::vector<std::pair<const Flag*, std::string>> out;
  auto push = [&](const Flag* f, const std::string& v) {
    if (!(f->value.empty() && switch_off(v))) out.emplace_back(f, v);
  };
  for (const auto& [o, f] : flags_)  // from a config file: set, but never typed
    if (typed[o] == 0)
      for (const std::string& v : o->results()) push(&f, v);
  std::map<const CLI::Option*, size_t> next;
  for (const CLI::Option* o : app_.parse_order()) {
    const auto it = flag_of.find(o);
    if (it == flag_of.end()) continue;
    const size_t i = next[o]++;
    if (i < o->results().size()) push(it->second, o->results()[i]);
  }
  return out;
}

void FlagSet::add_config_flag() {
  config_ = app_.add_option("--config", "read flags from a TOML file of `flag = value` lines (e.g. a run's "
                                        "run.toml); flags on the command line override them")
                ->type_name("FILE")
                ->group("Run");
}

void FlagSet::apply() {
  refuse_extras();
  if (config_ != nullptr && config_->count() > 0) read_config(config_->results().back());
  for (const auto& [f, v] : given()) f->apply(canonical(*f), v);
}

void FlagSet::read_config(const std::string& path) {
  std::error_code ec;
  DFP_CHECK(std::filesystem::is_regular_file(path, ec), dfp::Status::invalid_argument,
            "flag --config: '" + path + "' is not a readable file; expected a TOML file of flag = value lines");
  std::vector<CLI::ConfigItem> items;
  try {
    items = CLI::ConfigTOML().from_file(path);
  } catch (const CLI::Error& e) {
    dfp::fail(dfp::Status::invalid_argument, "flag --config: '" + path + "': " + e.what());
  }
  for (const CLI::ConfigItem& item : items) {
    DFP_CHECK(item.parents.empty() && item.name != "++" && item.name != "--", dfp::Status::invalid_argument,
              "flag --config: '" + path + "' has a section ('" + item.fullname() +
                  "'); expected top-level flag = value lines");
    CLI::Option* op = nullptr;
    for (auto& [o, f] : flags_)
      if (o->check_lname(item.name) || (item.name.size() == 1 && o->check_sname(item.name))) op = o;
    DFP_CHECK(op != nullptr, dfp::Status::invalid_argument,
              "flag --config: '" + path + "' sets '" + item.name +
                  "', which is not a flag of dfp " + app_.get_name() + " (see dfp " + app_.get_name() + " --help)");
    if (op->count() == 0) op->add_result(item.inputs);  // the command line wins
  }
}

void FlagSet::refuse_extras() const {
  const std::vector<std::string> rest = app_.remaining();
  if (rest.empty()) return;
  const std::string& a = rest.front();
  const std::string& command = app_.get_name();
  dfp::fail(dfp::Status::invalid_argument,
            "dfp " + command + ": " + (a.size() > 1 && a[0] == '-' ? "unknown flag '" : "unexpected argument '") + a +
                "' (see dfp " + command + " --help)");
}

Flag threads_option(int& threads) {
  return {"--threads", "N", "threads (0 = all cores)",
          [&threads](const std::string& f, const std::string& v) { threads = threads_flag(f, v); }};
}
Flag isa_option(std::string& isa) {
  return {"--isa", "LEVEL", "ref|avx2|avx512bw|avx512vnni kernels",
          [&isa](const std::string& f, const std::string& v) { isa = isa_flag(f, v); }};
}

void RunFlags::finish() {
  std::stringstream ss(keep_fp32);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) config.policy.overrides.emplace_back(item, dfp::Precision::fp32);
  keep_fp32.clear();
  config.policy.validate(dfp::kPolicyFlags);
}

}  // namespace dfp::cli
