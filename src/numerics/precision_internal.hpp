// Shared by precision.cpp and precision_notes.cpp.
#pragma once

#include <vector>

#include "dfp/precision.hpp"

namespace dfp::detail {

// The precisions a policy's layers can have: its default and the overrides', each once.
std::vector<Precision> used_precisions(const PrecisionPolicy& policy);

}  // namespace dfp::detail
