// dfp: a small JSON reader for the files dfp itself writes (config.json, metrics.jsonl).
//
// Internal to the report writer. Reads RFC 8259 JSON: objects, arrays, strings with every escape
// (\uXXXX with surrogate pairs becomes UTF-8), numbers, true, false, null. One extension: the bare
// tokens nan, -nan, inf, -inf (and NaN, Infinity, -Infinity) are read as numbers, because C++
// streams and Python's json module write them for non-finite values (dfp itself writes null). Every error is a dfp::Error
// (Status::corrupt_data) whose message starts "<source>:<line>:<column>: " and says what was
// expected and what was found.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dfp::json {

enum class Type { null, boolean, number, string, array, object };
const char* type_name(Type t) noexcept;  // "null", "a boolean", "a number", ...

struct Value {
  Type type = Type::null;
  bool boolean = false;
  double number = 0;
  std::string text;   // a string's contents, or a number's text as written in the file
  std::vector<Value> items;                            // array elements
  std::vector<std::pair<std::string, Value>> members;  // object members, in file order
  int line = 0;       // where the value starts (for messages)

  // Declared here and defaulted in json.cpp, where Value is complete: clang with libstdc++ cannot
  // define them inside the class, whose members hold pairs of the class being defined.
  Value();
  ~Value();
  Value(const Value&);
  Value(Value&&) noexcept;
  Value& operator=(const Value&);
  Value& operator=(Value&&) noexcept;

  bool is_null() const noexcept { return type == Type::null; }
  bool is_number() const noexcept { return type == Type::number; }
  bool is_string() const noexcept { return type == Type::string; }
  bool is_array() const noexcept { return type == Type::array; }
  bool is_object() const noexcept { return type == Type::object; }
  // The member named `key` of an object (the last one when a key repeats); nullptr when absent
  // or when this is not an object.
  const Value* find(std::string_view key) const noexcept;
  // A short rendering for messages and reports: strings as is, numbers as written, containers
  // as compact JSON.
  std::string to_string() const;
};

// Parses exactly one JSON value, optionally surrounded by white space, from `text`. `source`
// names the file in error messages and `first_line` is the line number of text's first line.
Value parse(std::string_view text, const std::string& source, int first_line = 1);
// s as a JSON string literal, quotes included ('"' and '\\' escaped, control characters as \u00XX).
std::string quote(std::string_view s);

}  // namespace dfp::json
