// FlagSet: Flag definitions on CLI11, the order values take effect in, and config files.
#include "apps/dfp/flags.hpp"

#include <cctype>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <type_traits>

#include "dfp/context.hpp"
#include "dfp/isa.hpp"
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
// config file says. Only the spellings people write for a truth value are taken: any other
// value (a typo, a number) is an error, never "on".
bool switch_on(const std::string& where, const std::string& v) {
  std::string l;
  for (char ch : v) l += char(std::tolower(static_cast<unsigned char>(ch)));
  if (l == "true" || l == "1" || l == "yes" || l == "on") return true;
  if (l == "false" || l == "0" || l == "no" || l == "off") return false;
  dfp::fail(dfp::Status::invalid_argument,
            where + ": expected a switch value, true|false (any case), 1|0, yes|no or on|off, got '" + v + "'");
}

// One `key = value` line of a config file.
struct ConfigLine {
  int line = 0;
  std::string key;
  std::vector<std::string> values;  // one, or an array's items
  bool array = false;
  bool bare = false;  // an unquoted value, taken as written
};

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

// The TOML subset a config file is: comments, and top-level `key = value` lines whose value is a
// string ('literal' or "basic", with TOML's escapes), a bare word (number, true, a name) or a
// one-line array of those. `at` prefixes errors with the file and the line.
class ConfigLineParser {
 public:
  ConfigLineParser(const std::string& s, std::string at) : s_(s), at_(std::move(at)) {}

  // The line's key and value; false for a blank or comment line.
  bool parse(ConfigLine& out) {
    skip_space();
    if (end() || s_[i_] == '#') return false;
    if (s_[i_] == '[') fail("has a section ('" + s_ + "'); expected top-level flag = value lines");
    const size_t k = i_;
    while (!end() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '-' || s_[i_] == '_')) ++i_;
    out.key = s_.substr(k, i_ - k);
    if (!end() && s_[i_] == '.')
      fail("has a dotted key ('" + s_.substr(k, s_.find('=') - k) + "'), a section; expected top-level flag = value lines");
    if (out.key.empty()) fail("expected flag = value, got '" + s_ + "'");
    skip_space();
    if (end() || s_[i_] != '=') fail("expected '=' after '" + out.key + "', got '" + s_ + "'");
    ++i_;
    skip_space();
    if (end() || s_[i_] == '#') fail("'" + out.key + "' has no value");
    if (s_[i_] == '[') {
      out.array = true;
      ++i_;
      for (;;) {
        skip_space();
        if (end() || s_[i_] == '#') fail("the array of '" + out.key + "' does not close on its line; expected ']'");
        if (s_[i_] == ']') break;
        if (s_[i_] == '[') fail("'" + out.key + "' has an array in an array; expected strings or words");
        bool bare = false;
        out.values.push_back(value(",]#", bare));
        skip_space();
        if (end() || s_[i_] == '#') fail("the array of '" + out.key + "' does not close on its line; expected ']'");
        if (s_[i_] == ',') ++i_;
        else if (s_[i_] != ']') fail("the array of '" + out.key + "': expected ',' or ']' after an item");
      }
      ++i_;
    } else {
      out.values.push_back(value("#", out.bare));
    }
    skip_space();
    if (!end() && s_[i_] != '#') fail("unexpected text after the value of '" + out.key + "': '" + s_.substr(i_) + "'");
    return true;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { dfp::fail(dfp::Status::invalid_argument, at_ + what); }
  bool end() const { return i_ >= s_.size(); }
  void skip_space() {
    while (!end() && (s_[i_] == ' ' || s_[i_] == '\t')) ++i_;
  }
  // A string, or a bare word ending before one of `stops` (trailing blanks dropped).
  std::string value(const char* stops, bool& bare) {
    const char q = s_[i_];
    std::string v;
    if (q == '\'' || q == '"') {
      for (++i_;; ++i_) {
        if (end()) fail(std::string("a string without its closing ") + q + " quote");
        const char ch = s_[i_];
        if (ch == q) break;
        if ((static_cast<unsigned char>(ch) < 0x20 && ch != '\t') || ch == 0x7f)
          fail("a control character in a string; write it as an escape in \"...\"");
        if (ch != '\\' || q == '\'') {
          v += ch;
          continue;
        }
        if (++i_ >= s_.size()) fail("a string ends in a lone backslash");
        switch (s_[i_]) {
          case 'b': v += '\b'; break;
          case 't': v += '\t'; break;
          case 'n': v += '\n'; break;
          case 'f': v += '\f'; break;
          case 'r': v += '\r'; break;
          case '"': v += '"'; break;
          case '\\': v += '\\'; break;
          case 'u':
          case 'U': {
            const size_t n = s_[i_] == 'u' ? 4 : 8;
            const std::string hex = s_.substr(i_ + 1, n);
            uint32_t cp = 0;
            const auto r = std::from_chars(hex.data(), hex.data() + hex.size(), cp, 16);
            if (hex.size() != n || r.ptr != hex.data() + hex.size() || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
              fail("a string has a bad escape '\\" + s_.substr(i_, n + 1) + "'; expected \\u and 4 hex digits or \\U and 8 "
                   "of a Unicode scalar value");
            append_utf8(v, cp);
            i_ += n;
            break;
          }
          default:
            fail(std::string("a string has an unknown escape '\\") + s_[i_] +
                 "'; expected \\b \\t \\n \\f \\r \\\" \\\\ \\uXXXX or \\UXXXXXXXX");
        }
      }
      ++i_;
      return v;
    }
    bare = true;
    while (!end() && std::strchr(stops, s_[i_]) == nullptr) v += s_[i_++];
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.pop_back();
    if (v.find_first_of(" \t") != std::string::npos)
      fail("'" + v + "' is an unquoted value with a blank; quote it");
    if (v.empty()) fail("an empty item; expected a value");
    return v;
  }

  const std::string& s_;
  const std::string at_;
  size_t i_ = 0;
};
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
    if (!f->value.empty()) {
      out.emplace_back(f, v);
      return;
    }
    const bool on = switch_on("flag " + canonical(*f), v);  // the last value of a switch wins
    std::erase_if(out, [f](const auto& given) { return given.first == f; });
    if (on) out.emplace_back(f, "true");
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

void FlagSet::show_defaults(const TrainConfig& defaults) {
  std::istringstream toml(run_toml(defaults));
  for (std::string line; std::getline(toml, line);) {
    const size_t eq = line.find(" = ");
    if (line.empty() || line[0] == '#' || eq == std::string::npos) continue;
    const std::string key = "--" + line.substr(0, eq);
    std::string v = line.substr(eq + 3);
    if (v.size() >= 2 && (v[0] == '\'' || v[0] == '"') && v.back() == v[0]) v = v.substr(1, v.size() - 2);
    if (v.empty()) continue;
    for (auto& [o, f] : flags_)
      if (canonical(f) == key) o->description(f.help + " (default: " + v + ")");
  }
}

void FlagSet::apply() {
  try {
    refuse_extras();
    if (config_ != nullptr && config_->count() > 0) read_config(config_->results().back());
    for (const auto& [f, v] : given()) f->apply(canonical(*f), v);
  } catch (const dfp::Error& e) {
    // Every rank of `mpirun -np N dfp train` reads the same flags: rank 0 reports their error.
    if (dfp::job_ranks() > 1) throw dfp::RefusalOfEveryRank(e, false);
    throw;
  }
}

void FlagSet::read_config(const std::string& path) {
  std::error_code ec;
  DFP_CHECK(std::filesystem::is_regular_file(path, ec), dfp::Status::invalid_argument,
            "flag --config: '" + path + "' is not a readable file; expected a TOML file of flag = value lines");
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  DFP_CHECK(in.good() || in.eof(), dfp::Status::io_error, "flag --config: cannot read '" + path + "'");
  std::vector<ConfigLine> items;
  int n = 0;
  for (size_t b = 0; b < text.size(); ++n) {
    // The last line may lack its line break, as editors write files; run.toml is written whole
    // (write_file_atomically), so a cut-off file is no longer a run's own.
    size_t e = text.find('\n', b);
    if (e == std::string::npos) e = text.size();
    const std::string at = "flag --config: " + path + ":" + std::to_string(n + 1) + ": ";
    std::string line = text.substr(b, e - b);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    b = e + 1;
    ConfigLine item;
    item.line = n + 1;
    if (ConfigLineParser(line, at).parse(item)) items.push_back(std::move(item));
  }
  // An empty run.toml (a write that never reached the disk) would otherwise train the defaults.
  DFP_CHECK(!items.empty(), dfp::Status::invalid_argument,
            "flag --config: '" + path + "' sets no flags (it is empty or only comments; a truncated file?); "
            "expected flag = value lines");
  std::map<const CLI::Option*, const ConfigLine*> seen;
  for (const ConfigLine& item : items) {
    const std::string at = "flag --config: " + path + ":" + std::to_string(item.line) + ": ";
    CLI::Option* op = nullptr;
    const Flag* flag = nullptr;
    for (auto& [o, f] : flags_)
      if (o->check_lname(item.key) || (item.key.size() == 1 && o->check_sname(item.key))) {
        op = o;
        flag = &f;
      }
    DFP_CHECK(op != nullptr, dfp::Status::invalid_argument,
              at + "sets '" + item.key + "', which is not a flag of dfp " + app_.get_name() + " (see dfp " +
                  app_.get_name() + " --help)");
    const std::string name = canonical(*flag);
    const auto [first, fresh] = seen.emplace(op, &item);
    DFP_CHECK(fresh, dfp::Status::invalid_argument,
              at + "'" + item.key + "' sets " + name + " again (line " + std::to_string(first->second->line) + ": '" +
                  first->second->key + "'); expected each flag once" +
                  (flag->list ? std::string(", its values in one array, e.g. ") + item.key + " = ['a', 'b']" : ""));
    if (!flag->list) {
      DFP_CHECK(!item.array, dfp::Status::invalid_argument,
                at + "'" + item.key + "' is an array; " + name + " takes one value");
      DFP_CHECK(!item.bare || item.values[0].find(',') == std::string::npos, dfp::Status::invalid_argument,
                at + "'" + item.key + " = " + item.values[0] + "' is an unquoted list; " + name +
                    " takes one value (quote it if the comma belongs to the value)");
    }
    std::vector<std::string> values = item.values;
    if (flag->value.empty())
      for (std::string& v : values) v = switch_on(at + "'" + item.key + "' (switch " + name + ")", v) ? "true" : "false";
    if (op->count() == 0)  // the command line wins
      for (std::string& v : values) op->add_result(v);
  }
}

void FlagSet::refuse_extras() const {
  const std::vector<std::string> rest = app_.remaining();
  if (rest.empty()) return;
  const std::string& a = rest.front();
  const std::string& command = app_.get_name();
  // The program names the command before every message ("dfp train: invalid argument: ...").
  dfp::fail(dfp::Status::invalid_argument,
            (a.size() > 1 && a[0] == '-' ? "unknown flag '" : "unexpected argument '") + a + "' (see dfp " + command +
                " --help)");
}

Flag threads_option(int& threads) {
  return {"--threads", "N", "threads (0 = all cores)",
          [&threads](const std::string& f, const std::string& v) { threads = threads_flag(f, v); }};
}
Flag isa_option(std::string& isa) {
  return {"--isa", "LEVEL", dfp::isa_names("|") + " kernels",
          [&isa](const std::string& f, const std::string& v) { isa = isa_flag(f, v); }};
}

void RunFlags::finish() {
  std::stringstream ss(keep_fp32);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) config.policy.overrides.emplace_back(item, dfp::Precision::fp32);
  keep_fp32.clear();
  try {
    config.policy.validate(dfp::kPolicyFlags);
  } catch (const dfp::Error& e) {
    if (dfp::job_ranks() > 1) throw dfp::RefusalOfEveryRank(e, false);  // as FlagSet::apply
    throw;
  }
}

}  // namespace dfp::cli
