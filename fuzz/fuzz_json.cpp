// Fuzz target: the JSON reader of the report (config.json, metrics.jsonl). It must return a value
// or throw dfp::Error; a parsed value's compact rendering must parse again.
#include <string_view>

#include "dfp/status.hpp"
#include "src/report/json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const dfp::json::Value v = dfp::json::parse(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz input");
    if (v.is_object() || v.is_array()) dfp::json::parse(v.to_string(), "rendered");
  } catch (const dfp::Error&) {
  }
  return 0;
}
