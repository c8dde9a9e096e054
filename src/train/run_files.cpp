// The run directory's JSON records (see run_files.hpp): conversions to and from nlohmann-json and
// the parse functions that turn the library's errors into messages naming file, line and field.
#include "src/train/run_files.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <sstream>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "dfp/status.hpp"
#include "dfp/trainer.hpp"
#include "src/io/checkpoint.hpp"

namespace dfp::run_files {
namespace {

// Objects and arrays nest at most this deep in any file: the records nest 3 deep, and a bound
// keeps hostile input from building deep trees.
constexpr int kMaxDepth = 32;

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// ---- reading helpers -------------------------------------------------------------------------

const char* type_of(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::string: return "a string";
    case Json::value_t::array: return "an array";
    case Json::value_t::object: return "an object";
    default: return "a number";
  }
}

// A value for a message: its JSON text, cut to 40 bytes.
std::string shown(const Json& v) {
  std::string s = dump(v);
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

// The members of one object, read with messages that start with `what` (e.g. "layer 'conv1': ").
class Fields {
 public:
  Fields(const Json& j, std::string what) : j_(j), what_(std::move(what)) {
    DFP_CHECK(j.is_object(), Status::corrupt_data, what_ + "expected a JSON object, found " + type_of(j));
  }

  // A number: nullopt when absent, NaN when null (a non-finite number).
  std::optional<double> number(const char* key) const {
    const auto it = j_.find(key);
    if (it == j_.end()) return std::nullopt;
    if (it->is_null()) return kNaN;
    if (!it->is_number()) wrong(key, *it, "a number");
    return it->get<double>();
  }
  double required_number(const char* key) const {
    DFP_CHECK(j_.contains(key), Status::corrupt_data,
              what_ + "required field '" + key + "' is missing; expected a number");
    return *number(key);
  }
  // An integral number (a count, an exponent): nullopt when absent or null.
  std::optional<int64_t> integer(const char* key) const {
    const auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return std::nullopt;
    if (it->is_number_unsigned()) {
      if (it->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) wrong(key, *it, "an integer");
      return int64_t(it->get<uint64_t>());
    }
    if (it->is_number_integer()) return it->get<int64_t>();
    if (it->is_number_float()) {
      const double x = it->get<double>();
      if (x == std::floor(x) && std::fabs(x) < 0x1p53) return int64_t(x);
    }
    wrong(key, *it, "an integer");
  }
  int64_t required_integer(const char* key) const {
    DFP_CHECK(j_.contains(key) && !j_.at(key).is_null(), Status::corrupt_data,
              what_ + "required field '" + key + "' is missing; expected an integer");
    return *integer(key);
  }
  std::optional<std::string> string(const char* key) const {
    const auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return std::nullopt;
    if (!it->is_string()) wrong(key, *it, "a string");
    return it->get<std::string>();
  }
  std::string required_string(const char* key) const {
    std::optional<std::string> s = string(key);
    DFP_CHECK(s, Status::corrupt_data, what_ + "required field '" + key + "' is missing; expected a string");
    return *s;
  }
  // An array: nullptr when absent or null.
  const Json* array(const char* key) const {
    const auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return nullptr;
    if (!it->is_array()) wrong(key, *it, "an array");
    return &*it;
  }

 private:
  [[noreturn]] void wrong(const char* key, const Json& v, const char* expected) const {
    fail(Status::corrupt_data,
         what_ + "field '" + key + "' is " + type_of(v) + " (" + shown(v) + "); expected " + expected);
  }
  const Json& j_;
  std::string what_;
};

// Each element of the array `items` (named `key` in messages) read by `read`, whose errors get
// the element's index in front.
template <class T, class Read>
std::vector<T> elements(const Json* items, const char* key, Read read) {
  std::vector<T> out;
  if (!items) return out;
  for (size_t i = 0; i < items->size(); ++i) {
    try {
      out.push_back(read((*items)[i]));
    } catch (const Error& e) {
      fail(e.status(), "element " + std::to_string(i) + " of '" + key + "': " + e.what());
    }
  }
  return out;
}

// ---- writing helpers -------------------------------------------------------------------------

// A double as the files hold it: null when not finite, an integer when integral.
Json number_json(double v) {
  if (!std::isfinite(v)) return nullptr;
  if (v == std::trunc(v) && std::fabs(v) < 0x1p53) return int64_t(v);
  return v;
}
void put(Json& j, const char* key, const std::optional<double>& v) {
  if (v) j[key] = number_json(*v);
}
void put(Json& j, const char* key, const std::optional<int64_t>& v) {
  if (v) j[key] = *v;
}

// ---- parsing ---------------------------------------------------------------------------------

// The text with every bare non-finite token outside strings (nan, -nan, inf, -inf, NaN, -NaN,
// Infinity, -Infinity: what C++ streams and Python's json module write) replaced by null, which
// the JSON parser reads and the records take as NaN.
std::string nulls_for_bare_non_finite(std::string_view text) {
  static constexpr std::string_view kTokens[] = {"-Infinity", "Infinity", "-nan", "-NaN", "-inf", "nan", "NaN", "inf"};
  auto word_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; };
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) out += text[++i];
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    if ((c == '-' || c == 'n' || c == 'N' || c == 'i' || c == 'I') && (i == 0 || !word_char(text[i - 1]))) {
      bool replaced = false;
      for (std::string_view t : kTokens) {
        if (text.substr(i, t.size()) != t || (i + t.size() < text.size() && word_char(text[i + t.size()]))) continue;
        out += "null";
        i += t.size() - 1;
        replaced = true;
        break;
      }
      if (replaced) continue;
    }
    out += c;
  }
  return out;
}

// An input iterator over the text that counts the newlines it passes, so that the parser's
// callback knows the line of each member's key.
struct LineCountingIterator {
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;
  const char* p = nullptr;
  int* line = nullptr;
  reference operator*() const { return *p; }
  LineCountingIterator& operator++() {
    if (*p == '\n') ++*line;
    ++p;
    return *this;
  }
  LineCountingIterator operator++(int) {
    LineCountingIterator old = *this;
    ++*this;
    return old;
  }
  bool operator==(const LineCountingIterator& o) const { return p == o.p; }
  bool operator!=(const LineCountingIterator& o) const { return p != o.p; }
};

// Parses `text` (which starts on line `first_line` of `source`) as one JSON value. `key_lines`,
// when given, receives the line of each member key of the top-level object.
Json parse_json(std::string_view raw, const std::string& source, int first_line,
                std::map<std::string, int>* key_lines = nullptr) {
  const std::string text = nulls_for_bare_non_finite(raw);
  int line = first_line;
  const Json::parser_callback_t on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if ((event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) && depth >= kMaxDepth)
      fail(Status::corrupt_data, source + ":" + std::to_string(line) + ": objects and arrays nest deeper than " +
                                     std::to_string(kMaxDepth) + " levels; expected a dfp run file");
    if (event == Json::parse_event_t::key && depth == 1 && key_lines) (*key_lines)[parsed.get<std::string>()] = line;
    return true;
  };
  try {
    return Json::parse(LineCountingIterator{text.data(), &line}, LineCountingIterator{text.data() + text.size(), &line},
                       on_event);
  } catch (const Json::parse_error& e) {
    // e.byte: 1-based index of the last character read. Line and column from it, in `text`.
    const size_t at = std::min<size_t>(e.byte ? e.byte - 1 : 0, text.size());
    const size_t line_start = text.rfind('\n', at ? at - 1 : 0);
    const int err_line = first_line + int(std::count(text.begin(), text.begin() + long(at), '\n'));
    const size_t column = line_start == std::string::npos || at == 0 ? at + 1 : at - line_start;
    // The library's message past its own "parse error at line L, column C: ".
    std::string what = e.what();
    const size_t col = what.find("column ");
    const size_t colon = col == std::string::npos ? std::string::npos : what.find(": ", col);
    if (colon != std::string::npos) what = what.substr(colon + 2);
    fail(Status::corrupt_data, source + ":" + std::to_string(err_line) + ":" + std::to_string(column) +
                                   ": malformed JSON: " + what);
  } catch (const Json::exception& e) {  // e.g. a number too large for a double
    std::string what = e.what();
    const size_t close = what.find("] ");
    if (close != std::string::npos) what = what.substr(close + 2);
    fail(Status::corrupt_data, source + ":" + std::to_string(line) + ": malformed JSON: " + what);
  }
}

}  // namespace

// ---- records ---------------------------------------------------------------------------------

void to_json(Json& j, const LayerRecord& r) {
  j = Json::object();
  j["layer"] = r.layer;
  j["format"] = r.format;
  put(j, "exp_x", r.exp_x);
  put(j, "exp_w", r.exp_w);
  put(j, "exp_dy", r.exp_dy);
  put(j, "exp_x_min", r.exp_x_min);
  put(j, "exp_w_min", r.exp_w_min);
  put(j, "exp_dy_min", r.exp_dy_min);
  put(j, "chain_fwd", r.chain_fwd);
  put(j, "chain_bwd", r.chain_bwd);
  put(j, "chain_wgrad", r.chain_wgrad);
  put(j, "saturated", r.saturated);
  put(j, "overflow_events", r.overflow_events);
  put(j, "sqnr_x_db", r.sqnr_x_db);
  put(j, "sqnr_w_db", r.sqnr_w_db);
  put(j, "sqnr_dy_db", r.sqnr_dy_db);
  put(j, "overflow", r.overflow);
  put(j, "underflow", r.underflow);
  put(j, "nonzero", r.nonzero);
  put(j, "underflow_x", r.underflow_x);
  put(j, "underflow_w", r.underflow_w);
  put(j, "underflow_dy", r.underflow_dy);
  put(j, "nonzero_x", r.nonzero_x);
  put(j, "nonzero_w", r.nonzero_w);
  put(j, "nonzero_dy", r.nonzero_dy);
}

void from_json(const Json& j, LayerRecord& r) {
  const Fields named(j, "");
  const std::optional<std::string> name = named.string("layer");
  DFP_CHECK(name && !name->empty(), Status::corrupt_data, "no \"layer\" name; expected a string");
  const Fields f(j, "layer '" + *name + "': ");
  r.layer = *name;
  r.format = f.string("format").value_or("");
  r.exp_x = f.integer("exp_x");
  r.exp_w = f.integer("exp_w");
  r.exp_dy = f.integer("exp_dy");
  r.exp_x_min = f.integer("exp_x_min");
  r.exp_w_min = f.integer("exp_w_min");
  r.exp_dy_min = f.integer("exp_dy_min");
  r.chain_fwd = f.integer("chain_fwd");
  r.chain_bwd = f.integer("chain_bwd");
  r.chain_wgrad = f.integer("chain_wgrad");
  r.saturated = f.integer("saturated");
  r.overflow_events = f.integer("overflow_events");
  r.sqnr_x_db = f.number("sqnr_x_db");
  r.sqnr_w_db = f.number("sqnr_w_db");
  r.sqnr_dy_db = f.number("sqnr_dy_db");
  r.overflow = f.integer("overflow");
  r.underflow = f.integer("underflow");
  r.nonzero = f.integer("nonzero");
  r.underflow_x = f.integer("underflow_x");
  r.underflow_w = f.integer("underflow_w");
  r.underflow_dy = f.integer("underflow_dy");
  r.nonzero_x = f.integer("nonzero_x");
  r.nonzero_w = f.integer("nonzero_w");
  r.nonzero_dy = f.integer("nonzero_dy");
}

void to_json(Json& j, const EpochRecord& r) {
  j = Json::object();
  j["epoch"] = r.epoch;
  put(j, "lr", r.lr);
  j["train_loss"] = number_json(r.train_loss);
  put(j, "train_top1", r.train_top1);
  put(j, "test_loss", r.test_loss);
  j["test_top1"] = number_json(r.test_top1);
  put(j, "test_top5", r.test_top5);
  put(j, "images_per_second", r.images_per_second);
  j["epoch_seconds"] = number_json(r.epoch_seconds);
  put(j, "data_wait_seconds", r.data_wait_seconds);
  put(j, "peak_rss_kib", r.peak_rss_kib);
  put(j, "loss_scale", r.loss_scale);
  put(j, "skipped_steps", r.skipped_steps);
  if (r.precision_policy) j["precision_policy"] = *r.precision_policy;
  j["layers"] = r.layers;
}

void from_json(const Json& j, EpochRecord& r) {
  const Fields f(j, "");
  const double epoch = f.required_number("epoch");
  DFP_CHECK(epoch >= 1 && epoch == std::floor(epoch) && epoch < 1e9, Status::corrupt_data,
            "field 'epoch' is " + number_text(epoch) + "; expected an integer >= 1");
  r.epoch = int(epoch);
  r.train_loss = f.required_number("train_loss");
  r.test_top1 = f.required_number("test_top1");
  r.epoch_seconds = f.required_number("epoch_seconds");
  r.lr = f.number("lr");
  r.train_top1 = f.number("train_top1");
  r.test_loss = f.number("test_loss");
  r.test_top5 = f.number("test_top5");
  r.images_per_second = f.number("images_per_second");
  r.data_wait_seconds = f.number("data_wait_seconds");
  r.peak_rss_kib = f.integer("peak_rss_kib");
  r.loss_scale = f.number("loss_scale");
  r.skipped_steps = f.integer("skipped_steps");
  r.precision_policy = f.string("precision_policy");
  r.layers = elements<LayerRecord>(f.array("layers"), "layers", [](const Json& e) { return e.get<LayerRecord>(); });
}

void ConfigRecord::add_string(std::string key, std::string value) {
  members.push_back({std::move(key), std::move(value), true, 0});
}

void ConfigRecord::add_literal(std::string key, std::string json_text) {
  members.push_back({std::move(key), std::move(json_text), false, 0});
}

const ConfigRecord::Member* ConfigRecord::find(std::string_view key) const {
  for (size_t i = members.size(); i-- > 0;)
    if (members[i].key == key) return &members[i];
  return nullptr;
}

namespace {
// A literal member's value. Its text is JSON (parse_config writes it, add_literal's caller
// promises it); text that is not is a bug of the writer.
Json literal(const ConfigRecord::Member& m) {
  Json v = Json::parse(m.text, nullptr, false);
  DFP_CHECK(!v.is_discarded(), Status::internal, "config.json: the value of '" + m.key + "' is not JSON text: '" + m.text + "'");
  return v;
}

// "<source>:<line>: field '<key>' is <type> (<value>); expected <expected>".
[[noreturn]] void config_field_error(const ConfigRecord& c, const ConfigRecord::Member& m, const std::string& shown_value,
                                     const char* type, const std::string& expected) {
  fail(Status::corrupt_data, c.source + ":" + std::to_string(m.line) + ": field '" + m.key + "' is " + type + " (" +
                                 shown_value + "); expected " + expected);
}
}  // namespace

std::string ConfigRecord::string_or(std::string_view key, const std::string& dflt) const {
  const Member* m = find(key);
  if (!m) return dflt;
  if (m->is_string) return m->text;
  if (m->text == "null") return dflt;
  config_field_error(*this, *m, m->text, type_of(literal(*m)), "a string");
}

int ConfigRecord::integer_or(std::string_view key, int dflt) const {
  const Member* m = find(key);
  if (!m) return dflt;
  if (m->is_string) config_field_error(*this, *m, dump(Json(m->text)), "a string", "an integer");
  const Json v = literal(*m);
  if (v.is_null()) return dflt;
  const double x = v.is_number() ? v.get<double>() : kNaN;
  if (!(x == std::floor(x) && std::fabs(x) < 2e9)) config_field_error(*this, *m, m->text, type_of(v), "an integer");
  return int(x);
}

void to_json(Json& j, const ConfigRecord& r) {
  // Built aside and moved in at the end: literal() throws on a member that is not JSON text, and
  // a Json under construction (Json(record) calls this) is never destroyed, so what it held
  // would leak.
  Json out = Json::object();
  for (const ConfigRecord::Member& m : r.members) out[m.key] = m.is_string ? Json(m.text) : literal(m);
  j = std::move(out);
}

void to_json(Json& j, const ProfileLayerRecord& r) {
  j = Json{{"layer", r.layer},
           {"kind", r.kind},
           {"precision", r.precision},
           {"implementation", r.implementation},
           {"forward_seconds", number_json(r.forward_seconds)},
           {"backward_seconds", number_json(r.backward_seconds)},
           {"steps", r.steps}};
}

void from_json(const Json& j, ProfileLayerRecord& r) {
  const Fields f(j, "");
  r.layer = f.required_string("layer");
  r.kind = f.required_string("kind");
  r.precision = f.required_string("precision");
  r.implementation = f.required_string("implementation");
  r.forward_seconds = f.required_number("forward_seconds");
  r.backward_seconds = f.required_number("backward_seconds");
  const int64_t steps = f.required_integer("steps");
  DFP_CHECK(steps >= 0, Status::corrupt_data, "field 'steps' is " + std::to_string(steps) + "; expected a count >= 0");
  r.steps = uint64_t(steps);
}

void to_json(Json& j, const ProfileRecord& r) {
  j = Json::object();
  j["steps"] = r.steps;
  j["step_seconds"] = number_json(r.step_seconds);
  j["optimizer_seconds"] = number_json(r.optimizer_seconds);
  j["data_wait_seconds"] = number_json(r.data_wait_seconds);
  j["layers"] = r.layers;
  if (r.communication) {
    const ProfileCommRecord& c = *r.communication;
    j["communication"] = Json{{"ranks", c.ranks},
                              {"allreduce", c.allreduce},
                              {"bytes", c.bytes},
                              {"fp32_bytes", c.fp32_bytes},
                              {"in_flight_seconds", number_json(c.in_flight_seconds)},
                              {"exposed_seconds", number_json(c.exposed_seconds)}};
  }
}

void from_json(const Json& j, ProfileRecord& r) {
  const Fields f(j, "");
  const int64_t steps = f.required_integer("steps");
  DFP_CHECK(steps >= 0, Status::corrupt_data, "field 'steps' is " + std::to_string(steps) + "; expected a count >= 0");
  r.steps = uint64_t(steps);
  r.step_seconds = f.required_number("step_seconds");
  r.optimizer_seconds = f.required_number("optimizer_seconds");
  r.data_wait_seconds = f.required_number("data_wait_seconds");
  const Json* layers = f.array("layers");
  DFP_CHECK(layers, Status::corrupt_data, "required field 'layers' is missing; expected an array");
  r.layers = elements<ProfileLayerRecord>(layers, "layers", [](const Json& e) { return e.get<ProfileLayerRecord>(); });
  const auto comm = j.find("communication");
  if (comm == j.end() || comm->is_null()) return;
  const Fields c(*comm, "communication: ");
  ProfileCommRecord& rc = r.communication.emplace();
  const int64_t ranks = c.required_integer("ranks");
  DFP_CHECK(ranks >= 1 && ranks <= std::numeric_limits<int>::max(), Status::corrupt_data,
            "communication: field 'ranks' is " + std::to_string(ranks) + "; expected a count >= 1");
  rc.ranks = int(ranks);
  rc.allreduce = c.required_string("allreduce");
  for (const auto& [key, field] : {std::pair{"bytes", &rc.bytes}, std::pair{"fp32_bytes", &rc.fp32_bytes}}) {
    const int64_t v = c.required_integer(key);
    DFP_CHECK(v >= 0, Status::corrupt_data,
              std::string("communication: field '") + key + "' is " + std::to_string(v) + "; expected a count >= 0");
    *field = uint64_t(v);
  }
  rc.in_flight_seconds = c.required_number("in_flight_seconds");
  rc.exposed_seconds = c.required_number("exposed_seconds");
}

// ---- texts -----------------------------------------------------------------------------------

std::string to_line(const EpochRecord& r) { return dump(Json(r)); }
std::string to_text(const ConfigRecord& r) { return dump(Json(r)) + "\n"; }
std::string to_text(const ProfileRecord& r) { return dump(Json(r)) + "\n"; }

std::string number_text(double v) { return dump(number_json(v)); }

EpochRecord parse_epoch_line(std::string_view line, const std::string& source, int line_no) {
  const Json j = parse_json(line, source, line_no);
  const std::string where = source + ":" + std::to_string(line_no) + ": ";
  DFP_CHECK(j.is_object(), Status::corrupt_data,
            where + "expected one JSON object per line, found " + type_of(j));
  try {
    return j.get<EpochRecord>();
  } catch (const Error& e) {
    fail(e.status(), where + e.what());
  }
}

ConfigRecord parse_config(std::string_view text, const std::string& source) {
  std::map<std::string, int> key_lines;
  const Json j = parse_json(text, source, 1, &key_lines);
  DFP_CHECK(j.is_object(), Status::corrupt_data, source + ":1: expected a JSON object, found " + type_of(j));
  ConfigRecord c;
  c.source = source;
  for (const auto& [key, value] : j.items())
    c.members.push_back({key, value.is_string() ? value.get<std::string>() : dump(value), value.is_string(),
                         key_lines.count(key) ? key_lines[key] : 1});
  return c;
}

ProfileRecord parse_profile(std::string_view text, const std::string& source) {
  std::map<std::string, int> key_lines;
  const Json j = parse_json(text, source, 1, &key_lines);
  try {
    return j.get<ProfileRecord>();
  } catch (const Error& e) {
    // The line of the top-level member the message is about: "layers" for an element's field,
    // else the field it names.
    const std::string what = e.what();
    std::string key = "layers";
    if (what.rfind("element ", 0) != 0) {
      const size_t open = what.find("field '");
      if (open != std::string::npos) key = what.substr(open + 7, what.find('\'', open + 7) - open - 7);
    }
    const auto at = key_lines.find(key);
    fail(e.status(), source + ":" + std::to_string(at == key_lines.end() ? 1 : at->second) + ": " + what);
  }
}


// ---- run.toml ----------------------------------------------------------------------------------

namespace {

// `v` as a TOML string that reads back as `v`: literal ('...') where TOML allows it, else basic
// ("...") with the escapes of ", \ and control characters; other bytes (UTF-8) as they are.
std::string toml_string(const std::string& v) {
  auto control = [](char ch) { return (static_cast<unsigned char>(ch) < 0x20 && ch != '\t') || ch == 0x7f; };
  if (v.find('\'') == std::string::npos && std::none_of(v.begin(), v.end(), control)) return "'" + v + "'";
  std::string out = "\"";
  for (const char ch : v) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\f': out += "\\f"; break;
      case '\r': out += "\\r"; break;
      default:
        if (control(ch)) {
          char u[8];
          std::snprintf(u, sizeof u, "\\u%04X", unsigned(static_cast<unsigned char>(ch)));
          out += u;
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

std::string fmt_float(float v) {  // the shortest text that reads back as the same float
  char b[32];
  return {b, std::to_chars(b, b + sizeof b, v).ptr};
}

}  // namespace

std::string run_toml(const TrainConfig& c) {
  std::ostringstream o;
  auto str = [&o](const char* key, const std::string& v) { o << key << " = " << toml_string(v) << "\n"; };
  auto num = [&o](const char* key, const std::string& v) { o << key << " = " << v << "\n"; };
  auto flag = [&o](const char* key, bool v) { if (v) o << key << " = true\n"; };
  const PrecisionPolicy& p = c.policy;
  o << "# dfp train --config FILE repeats this run (flags on the command line override these).\n";
  str("model", c.model);
  str("dataset", c.dataset);
  if (!c.data.empty()) str("data", c.data);
  num("image-size", std::to_string(c.image_size));
  num("limit-train", std::to_string(c.limit_train));
  num("limit-test", std::to_string(c.limit_test));
  flag("no-augment", !c.augment);
  if (!c.init_from.empty()) str("init-from", c.init_from);
  std::string skip;
  for (const std::string& s : c.init_skip) skip.append(skip.empty() ? "" : ",").append(s);
  if (!skip.empty()) str("init-skip", skip);
  num("workers", std::to_string(c.workers));
  num("epochs", std::to_string(c.epochs));
  num("batch-size", std::to_string(c.batch_size));
  num("lr", fmt_float(c.lr));
  num("momentum", fmt_float(c.momentum));
  num("wd", fmt_float(c.weight_decay));
  flag("nesterov", c.nesterov);
  str("schedule", c.schedule);
  num("warmup-epochs", std::to_string(c.warmup_epochs));
  std::string milestones;
  for (int e : c.milestones) milestones.append(milestones.empty() ? "" : ",").append(std::to_string(e));
  if (!milestones.empty()) str("milestones", milestones);
  num("gamma", fmt_float(c.gamma));
  num("step-epochs", std::to_string(c.step_epochs));
  num("label-smoothing", fmt_float(c.label_smoothing));
  num("threads", std::to_string(c.threads));
  if (!c.isa.empty()) str("isa", c.isa);
  num("seed", std::to_string(c.seed));
  str("out", c.out);
  if (!c.label.empty()) str("label", c.label);
  num("print-every", std::to_string(c.print_every));
  num("numerics-every", std::to_string(c.numerics_interval));
  flag("profile", c.profile);
  str("device", c.device);
  str("allreduce", c.allreduce);
  flag("error-feedback", c.error_feedback);
  flag("sync-bn", c.sync_bn);
  num("bucket-kib", std::to_string(c.bucket_kib));
  num("dist-timeout", fmt_float(float(c.dist_timeout)));
  str("precision", precision_name(p.precision));
  std::string overrides;
  for (const auto& [pattern, precision] : p.overrides)
    overrides.append(overrides.empty() ? "" : ",").append(pattern).append("=").append(precision_name(precision));
  if (!overrides.empty()) str("override", overrides);
  if (p.dfp.weights.headroom == p.dfp.activations.headroom && p.dfp.weights.headroom == p.dfp.gradients.headroom) {
    num("headroom", std::to_string(p.dfp.weights.headroom));
  } else {
    num("weights-headroom", std::to_string(p.dfp.weights.headroom));
    num("activations-headroom", std::to_string(p.dfp.activations.headroom));
    num("gradients-headroom", std::to_string(p.dfp.gradients.headroom));
  }
  str("weights-rounding", rounding_name(p.dfp.weights.rounding));
  str("activations-rounding", rounding_name(p.dfp.activations.rounding));
  str("gradients-rounding", rounding_name(p.dfp.gradients.rounding));
  str("weights-granularity", granularity_name(p.dfp.weights.granularity));
  str("activations-granularity", granularity_name(p.dfp.activations.granularity));
  str("gradients-granularity", granularity_name(p.dfp.gradients.granularity));
  if (p.weights_format) str("weights-format", float_format_name(*p.weights_format));
  if (p.activations_format) str("activations-format", float_format_name(*p.activations_format));
  if (p.gradients_format) str("gradients-format", float_format_name(*p.gradients_format));
  if (p.uses_float8()) {
    str("fp8-scaling", float8_scaling_name(p.fp8.scaling));
    num("fp8-amax-history", std::to_string(p.fp8.amax_history));
    num("fp8-margin", std::to_string(p.fp8.margin));
    str("fp8-overflow", overflow_name(p.fp8.overflow));
  }
  str("int16-chain", p.dfp.chain_override == 0 ? "bound" : std::to_string(p.dfp.chain_override));
  flag("verify-overflow", p.dfp.verify);
  str("loss-scaling", loss_scale_mode_name(c.loss_scale.mode));
  if (c.loss_scale.init_scale) num("loss-scale", fmt_float(float(*c.loss_scale.init_scale)));
  num("scale-growth-interval", std::to_string(c.loss_scale.growth_interval));
  return o.str();
}

void write_run_toml(const std::string& dir, const std::string& text) {
  if (dir.empty()) return;
  write_file_atomically(dir + "/run.toml", text, "run.toml");
}

}  // namespace dfp::run_files
