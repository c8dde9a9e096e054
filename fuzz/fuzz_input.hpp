// Shared by the fuzz targets: the readers under test take file paths, so each input is written to
// a file in a directory of this process's own (under $TMPDIR or /tmp), removed at exit.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace dfp::fuzz {

class Scratch {
 public:
  Scratch() {
    const char* t = std::getenv("TMPDIR");
    dir_ = std::filesystem::path(t && *t ? t : "/tmp") / ("dfp_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  // Writes bytes to `name` in the directory and returns its path.
  std::string put(const std::string& name, const uint8_t* data, size_t size) const {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), std::streamsize(size));
    return p;
  }
  std::string dir() const { return dir_.string(); }

 private:
  std::filesystem::path dir_;
};

}  // namespace dfp::fuzz
