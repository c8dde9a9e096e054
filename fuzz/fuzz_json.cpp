// Fuzz target: the run files' JSON reader (src/train/run_files.cpp), which the report uses for
// metrics.jsonl and config.json and which reads profile.json. Each input is read as a metrics
// line, a config.json and a profile.json: every read must return a record or throw dfp::Error,
// and a record read must write back to text that reads again.
#include <string>
#include <string_view>

#include "dfp/status.hpp"
#include "src/train/run_files.hpp"

namespace rf = dfp::run_files;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    rf::parse_epoch_line(rf::to_line(rf::parse_epoch_line(text, "fuzz input", 1)), "written", 1);
  } catch (const dfp::Error&) {
  }
  try {
    rf::parse_config(rf::to_text(rf::parse_config(text, "fuzz input")), "written");
  } catch (const dfp::Error&) {
  }
  try {
    rf::parse_profile(rf::to_text(rf::parse_profile(text, "fuzz input")), "written");
  } catch (const dfp::Error&) {
  }
  return 0;
}
