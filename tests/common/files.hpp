// Whole-file reads for tests that check what a run wrote.
#pragma once

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace dfp::test {

// The file's bytes ("" when it cannot be read).
inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// The file's lines, without their line breaks.
inline std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream f(path);
  for (std::string l; std::getline(f, l);) out.push_back(l);
  return out;
}

}  // namespace dfp::test
