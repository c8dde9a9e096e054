// Parsing an enum from its name, with the name function as the one list of spellings (so a name
// and its parser cannot drift apart) and one error form for every option.
#pragma once

#include <initializer_list>
#include <string>

#include "dfp/status.hpp"

namespace dfp {

// The value of `all` whose name(value) is `text`; otherwise an invalid_argument error:
// "<origin>: unknown <what> '<text>'; expected a, b or c".
template <class E>
E parse_named(const std::string& text, std::initializer_list<E> all, const char* (*name)(E) noexcept,
              const std::string& origin, const char* what) {
  std::string expected;
  size_t i = 0;
  for (E e : all) {
    if (text == name(e)) return e;
    expected += (i == 0 ? "" : i + 1 == all.size() ? " or " : ", ") + std::string(name(e));
    ++i;
  }
  fail(Status::invalid_argument, origin + ": unknown " + what + " '" + text + "'; expected " + expected);
}

}  // namespace dfp
