// Fixtures made at test time by PyTorch: Debian's /usr/bin/python3 with torch and torchvision
// runs a script in the test's directory. Tests that need it skip, saying why, where it is missing.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace dfp::test {

// "" when /usr/bin/python3 imports torch and torchvision; else why not.
inline const std::string& torch_python_missing() {
  static const std::string why = [] {
    if (!std::filesystem::exists("/usr/bin/python3")) return std::string("/usr/bin/python3 not found");
    const int rc = std::system("/usr/bin/python3 -c 'import torch, torchvision' >/dev/null 2>&1");
    return rc == 0 ? std::string()
                   : std::string("/usr/bin/python3 cannot import torch and torchvision (Debian: python3-torch, "
                                 "python3-torchvision)");
  }();
  return why;
}

// Runs `script` (Python source) as DIR/name.py with DIR as its argument and working directory,
// torch limited to 2 threads; true when it exits 0, else a test failure with its output.
inline bool run_torch_python(const std::string& dir, const std::string& name, const std::string& script) {
  const std::string path = dir + "/" + name + ".py";
  std::ofstream(path) << "import torch\ntorch.set_num_threads(2)\n" << script;
  const std::string cmd = "cd '" + dir + "' && OMP_NUM_THREADS=2 /usr/bin/python3 '" + path + "' '" + dir + "' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) {
    ADD_FAILURE() << "cannot run " << cmd;
    return false;
  }
  std::string out;
  std::array<char, 4096> buf;
  while (const size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int rc = ::pclose(p);
  if (rc != 0) ADD_FAILURE() << name << ".py failed (status " << rc << "):\n" << out;
  return rc == 0;
}

}  // namespace dfp::test
