// DFP16 options without a context: QuantOptions' checks and the rounding and granularity names,
// parsed and printed (what run files and configs read and write; the quantizers are in dfp16.cpp).
#include "dfp/dfp16.hpp"

#include <string>

#include "dfp/status.hpp"
#include "base/named_enum.hpp"

namespace dfp {

void QuantOptions::validate(const std::string& origin) const {
  DFP_CHECK(headroom >= 0 && headroom <= kDfpMaxHeadroom, Status::invalid_argument,
            origin + ": headroom expected in [0, " + std::to_string(kDfpMaxHeadroom) + "], got " +
                std::to_string(headroom) + " (" + name + ")");
}

const char* rounding_name(Rounding r) noexcept {
  switch (r) {
    case Rounding::nearest_even: return "nearest";
    case Rounding::stochastic: return "stochastic";
    case Rounding::biased: return "biased";
  }
  return "?";
}

const char* granularity_name(Granularity g) noexcept {
  switch (g) {
    case Granularity::tensor: return "tensor";
    case Granularity::slice: return "slice";
    case Granularity::block32: return "block32";
    case Granularity::block64: return "block64";
    case Granularity::block128: return "block128";
  }
  return "?";
}

Granularity parse_granularity(const std::string& text, const std::string& origin) {
  return parse_named(text,
                     {Granularity::tensor, Granularity::slice, Granularity::block32, Granularity::block64,
                      Granularity::block128},
                     granularity_name, origin, "granularity");
}

int granularity_block(Granularity g) noexcept {
  switch (g) {
    case Granularity::block32: return 32;
    case Granularity::block64: return 64;
    case Granularity::block128: return 128;
    default: return 0;
  }
}

Rounding parse_rounding(const std::string& text, const std::string& origin) {
  return parse_named(text, {Rounding::nearest_even, Rounding::stochastic, Rounding::biased}, rounding_name, origin,
                     "rounding");
}

}  // namespace dfp
