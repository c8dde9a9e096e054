// The error contract in one assertion: f must throw dfp::Error with `status`, and its message must
// name every one of `parts` (the layer, file, field or value the user has to act on).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dfp/status.hpp"

namespace dfp::test {

template <class F>
void expect_error(F&& f, Status status, const std::vector<std::string>& parts = {}) {
  try {
    f();
    ADD_FAILURE() << "expected dfp::Error(" << status_name(status) << "), nothing was thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "'" << p << "' not in: " << e.what();
  }
}

}  // namespace dfp::test
