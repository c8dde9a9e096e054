// The subcommands of the dfp program. Each add_* registers its subcommand, with its flags, on the
// root CLI11 App and returns what runs it once the command line is parsed.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace dfp::cli {

using Run = std::function<int()>;

Run add_info(CLI::App& root);     // info.cpp
Run add_bench(CLI::App& root);    // info.cpp
Run add_train(CLI::App& root);    // train.cpp
Run add_eval(CLI::App& root);     // train.cpp
Run add_compare(CLI::App& root);  // compare.cpp
Run add_export(CLI::App& root);   // export.cpp

// "oneDNN 2.6.3 (OpenMP runtime), oneTBB ..., xsimd ..., zlib ...": what dfp info and --version print.
std::string library_versions();
// Prints one line of progress and flushes (the training log callback).
void print_line(const std::string& s);

}  // namespace dfp::cli
