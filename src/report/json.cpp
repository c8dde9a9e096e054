// The JSON reader (see json.hpp).
#include "src/report/json.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "dfp/status.hpp"

namespace dfp::json {

const char* type_name(Type t) noexcept {
  switch (t) {
    case Type::null: return "null";
    case Type::boolean: return "a boolean";
    case Type::number: return "a number";
    case Type::string: return "a string";
    case Type::array: return "an array";
    case Type::object: return "an object";
  }
  return "?";
}

Value::Value() = default;
Value::~Value() = default;
Value::Value(const Value&) = default;
Value::Value(Value&&) noexcept = default;
Value& Value::operator=(const Value&) = default;
Value& Value::operator=(Value&&) noexcept = default;

const Value* Value::find(std::string_view key) const noexcept {
  const Value* found = nullptr;
  for (const auto& [k, v] : members)
    if (k == key) found = &v;
  return found;
}

namespace {

void append_quoted(std::string& o, std::string_view s) {
  o += '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += char(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else {
      o += char(c);
    }
  }
  o += '"';
}

void append_json(std::string& o, const Value& v) {
  switch (v.type) {
    case Type::null: o += "null"; break;
    case Type::boolean: o += v.boolean ? "true" : "false"; break;
    case Type::number: o += v.text; break;
    case Type::string: append_quoted(o, v.text); break;
    case Type::array:
      o += '[';
      for (size_t i = 0; i < v.items.size(); ++i) {
        if (i) o += ',';
        append_json(o, v.items[i]);
      }
      o += ']';
      break;
    case Type::object:
      o += '{';
      for (size_t i = 0; i < v.members.size(); ++i) {
        if (i) o += ',';
        append_quoted(o, v.members[i].first);
        o += ':';
        append_json(o, v.members[i].second);
      }
      o += '}';
      break;
  }
}

constexpr int kMaxDepth = 200;

class Parser {
 public:
  Parser(std::string_view text, const std::string& source, int first_line)
      : s_(text), source_(source), first_line_(first_line) {}

  Value document() {
    skip_ws();
    Value v = value(0);
    skip_ws();
    if (pos_ < s_.size()) error("expected the end of the JSON value");
    return v;
  }

 private:
  std::string_view s_;
  const std::string& source_;
  int first_line_;
  size_t pos_ = 0;

  // Line numbers are counted incrementally: parsing only moves forward.
  mutable size_t counted_pos_ = 0;
  mutable int counted_lines_ = 0;
  int line_at(size_t p) const {
    p = std::min(p, s_.size());
    if (p < counted_pos_) counted_pos_ = 0, counted_lines_ = 0;
    for (; counted_pos_ < p; ++counted_pos_) counted_lines_ += s_[counted_pos_] == '\n';
    return first_line_ + counted_lines_;
  }

  // What stands at the current position, for messages.
  std::string found() const {
    if (pos_ >= s_.size()) return s_.find('\n') == std::string_view::npos ? "the end of the line" : "the end of the file";
    const unsigned char c = static_cast<unsigned char>(s_[pos_]);
    if (c == '\n' || c == '\r') return "the end of the line";
    if (c < 0x20 || c >= 0x7f) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "byte 0x%02x", c);
      return buf;
    }
    return "'" + std::string(1, char(c)) + "'";
  }

  [[noreturn]] void error(const std::string& expected) const { error_at(pos_, expected + ", found " + found()); }

  [[noreturn]] void error_at(size_t p, const std::string& what) const {
    size_t line_start = 0;
    for (size_t i = 0; i < p && i < s_.size(); ++i)
      if (s_[i] == '\n') line_start = i + 1;
    fail(Status::corrupt_data, source_ + ":" + std::to_string(line_at(p)) + ":" + std::to_string(p - line_start + 1) +
                                   ": " + what);
  }

  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }

  bool consume_word(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) return false;
    const size_t end = pos_ + w.size();
    if (end < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[end])) || s_[end] == '_')) return false;
    pos_ = end;
    return true;
  }

  Value value(int depth) {
    if (depth > kMaxDepth) error("nesting deeper than " + std::to_string(kMaxDepth) + " levels");
    Value v;
    v.line = line_at(pos_);
    if (pos_ >= s_.size()) error("expected a JSON value");
    const char c = s_[pos_];
    if (c == '{') {
      v.type = Type::object;
      ++pos_;
      skip_ws();
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
        return v;
      }
      for (;;) {
        skip_ws();
        if (pos_ >= s_.size() || s_[pos_] != '"') error("expected a member name in double quotes");
        std::string key = string_body();
        skip_ws();
        if (pos_ >= s_.size() || s_[pos_] != ':') error("expected ':' after member name \"" + key + "\"");
        ++pos_;
        skip_ws();
        Value m = value(depth + 1);
        v.members.emplace_back(std::move(key), std::move(m));
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          continue;
        }
        if (pos_ < s_.size() && s_[pos_] == '}') {
          ++pos_;
          return v;
        }
        error("expected ',' or '}' after the value of member \"" + v.members.back().first + "\"");
      }
    }
    if (c == '[') {
      v.type = Type::array;
      ++pos_;
      skip_ws();
      if (pos_ < s_.size() && s_[pos_] == ']') {
        ++pos_;
        return v;
      }
      for (;;) {
        skip_ws();
        v.items.push_back(value(depth + 1));
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          continue;
        }
        if (pos_ < s_.size() && s_[pos_] == ']') {
          ++pos_;
          return v;
        }
        error("expected ',' or ']' after array element " + std::to_string(v.items.size() - 1));
      }
    }
    if (c == '"') {
      v.type = Type::string;
      v.text = string_body();
      return v;
    }
    if (consume_word("true")) {
      v.type = Type::boolean;
      v.boolean = true;
      return v;
    }
    if (consume_word("false")) {
      v.type = Type::boolean;
      return v;
    }
    if (consume_word("null")) return v;
    if (c == '-' || c == '+' || (c >= '0' && c <= '9') || c == 'n' || c == 'N' || c == 'i' || c == 'I') return number();
    error("expected a JSON value (object, array, string, number, true, false or null)");
  }

  Value number() {
    Value v;
    v.line = line_at(pos_);
    v.type = Type::number;
    const size_t start = pos_;
    // Non-finite values as C++ streams and Python write them.
    bool neg = false;
    size_t p = pos_;
    if (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) {
      neg = s_[p] == '-';
      ++p;
    }
    for (const char* word : {"nan", "NaN", "inf", "Infinity"}) {
      const std::string_view w(word);
      if (s_.substr(p, w.size()) == w) {
        const size_t end = p + w.size();
        if (end < s_.size() && std::isalnum(static_cast<unsigned char>(s_[end]))) break;
        pos_ = end;
        v.number = w[0] == 'n' || w[0] == 'N' ? std::numeric_limits<double>::quiet_NaN()
                                                : (neg ? -1 : 1) * std::numeric_limits<double>::infinity();
        v.text = std::string(s_.substr(start, end - start));
        return v;
      }
    }
    // RFC 8259: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    auto digits = [&] {
      const size_t d = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      return pos_ - d;
    };
    if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9') error("expected a digit in a number");
    if (s_[pos_] == '0') {
      ++pos_;
      if (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') error("expected no leading zero in a number");
    } else {
      digits();
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (digits() == 0) error("expected a digit after the decimal point");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (digits() == 0) error("expected a digit in the exponent");
    }
    const std::string_view t = s_.substr(start, pos_ - start);
    v.text = std::string(t);
    const auto r = std::from_chars(t.data(), t.data() + t.size(), v.number);
    if (r.ec == std::errc::result_out_of_range) {
      // Too large: +-inf; too small: 0 (from_chars leaves the value untouched in both cases).
      bool big = false;
      const size_t e = t.find_first_of("eE");
      if (e != std::string_view::npos) big = t[e + 1] != '-';
      else big = true;
      v.number = big ? (t[0] == '-' ? -1 : 1) * std::numeric_limits<double>::infinity() : (t[0] == '-' ? -0.0 : 0.0);
    } else if (r.ec != std::errc() || r.ptr != t.data() + t.size()) {
      error_at(start, "expected a number, found '" + v.text + "'");
    }
    return v;
  }

  unsigned hex4() {
    if (pos_ + 4 > s_.size()) error("expected 4 hexadecimal digits after \\u");
    unsigned u = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[pos_];
      u <<= 4;
      if (h >= '0' && h <= '9') u |= unsigned(h - '0');
      else if (h >= 'a' && h <= 'f') u |= unsigned(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') u |= unsigned(h - 'A' + 10);
      else error("expected a hexadecimal digit in a \\u escape");
      ++pos_;
    }
    return u;
  }

  static void put_utf8(std::string& o, unsigned cp) {
    if (cp < 0x80) {
      o += char(cp);
    } else if (cp < 0x800) {
      o += char(0xC0 | (cp >> 6));
      o += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      o += char(0xE0 | (cp >> 12));
      o += char(0x80 | ((cp >> 6) & 0x3F));
      o += char(0x80 | (cp & 0x3F));
    } else {
      o += char(0xF0 | (cp >> 18));
      o += char(0x80 | ((cp >> 12) & 0x3F));
      o += char(0x80 | ((cp >> 6) & 0x3F));
      o += char(0x80 | (cp & 0x3F));
    }
  }

  // At an opening '"': reads the string and returns its contents.
  std::string string_body() {
    const size_t open = pos_;
    ++pos_;
    std::string o;
    for (;;) {
      if (pos_ >= s_.size()) error_at(open, "expected a closing '\"' for the string that starts here");
      const unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return o;
      }
      if (c < 0x20) {
        if (c == '\n' || c == '\r') error_at(open, "expected a closing '\"' before the end of the line");
        error("expected a control character in a string to be escaped");
      }
      if (c != '\\') {
        o += char(c);
        ++pos_;
        continue;
      }
      ++pos_;
      if (pos_ >= s_.size()) error("expected an escape character after '\\'");
      const char e = s_[pos_++];
      switch (e) {
        case '"': o += '"'; break;
        case '\\': o += '\\'; break;
        case '/': o += '/'; break;
        case 'b': o += '\b'; break;
        case 'f': o += '\f'; break;
        case 'n': o += '\n'; break;
        case 'r': o += '\r'; break;
        case 't': o += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (s_.substr(pos_, 2) != "\\u") error("expected a low surrogate \\uDC00-\\uDFFF after a high surrogate");
            pos_ += 2;
            const unsigned lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) error_at(pos_ - 6, "expected a low surrogate \\uDC00-\\uDFFF");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            error_at(pos_ - 6, "expected a high surrogate before a low surrogate \\u escape");
          }
          put_utf8(o, cp);
          break;
        }
        default:
          --pos_;
          error("expected an escape character (one of \" \\ / b f n r t u) after '\\'");
      }
    }
  }
};

}  // namespace

std::string Value::to_string() const {
  if (type == Type::string || type == Type::number) return text;
  std::string o;
  append_json(o, *this);
  return o;
}

Value parse(std::string_view text, const std::string& source, int first_line) {
  return Parser(text, source, first_line).document();
}

std::string quote(std::string_view s) {
  std::string o;
  append_quoted(o, s);
  return o;
}

}  // namespace dfp::json
