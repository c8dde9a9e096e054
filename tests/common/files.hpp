// Whole-file reads for tests that check what a run wrote, and a full disk for writers.
#pragma once

#include <csignal>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dfp/status.hpp"

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

// Runs write() in a child process whose files cannot grow past `limit` bytes, as on a full disk (a
// write past it fails with EFBIG; SIGXFSZ is ignored). True when write() threw Error(io_error)
// whose message holds `needle`; false when it threw anything else or returned.
template <class F>
bool fails_on_a_full_disk(rlim_t limit, const char* needle, F&& write) {
  const pid_t child = fork();
  if (child < 0) return false;
  if (child == 0) {
    signal(SIGXFSZ, SIG_IGN);
    const rlimit lim{limit, limit};
    setrlimit(RLIMIT_FSIZE, &lim);
    try {
      write();
    } catch (const Error& e) {
      _exit(e.status() == Status::io_error && std::strstr(e.what(), needle) ? 0 : 2);
    }
    _exit(1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace dfp::test
