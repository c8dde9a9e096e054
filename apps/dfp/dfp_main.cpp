// dfp command-line program: `dfp <command> [flags]`, commands info, bench, train, eval, compare, export
// (commands.hpp). CLI11 parses the command line and writes each command's --help from the same
// flag definitions (flags.hpp). Exit status: 0 on success, --help and --version; 1 when a flag
// or the run fails (the message names the flag and what was expected); 2 without a command or
// with an unknown one. Under mpirun, a refusal every rank makes alike is printed by rank 0, which
// exits 1; the other ranks exit 0 without a word.
#include <cstdio>
#include <new>
#include <map>
#include <string>

#include "dfp/context.hpp"
#include "dfp/status.hpp"
#include "dfp/trainer.hpp"
#include "apps/dfp/commands.hpp"

namespace {

std::string version_text() {
  return std::string("dfp ") + DFP_VERSION + "\n" + dfp::cli::library_versions() +
         "\n(dfp info: CPU features and the kernel chosen per op)";
}

// "dfp COMMAND: status: message", the command named once: a message that starts with the
// command's name already (an error of another layer that names it) is printed without it.
void report(const std::string& cmd, const dfp::Error& e) {
  std::string message = e.what();
  const std::string self = "dfp " + cmd + ": ";
  while (message.rfind(self, 0) == 0) message.erase(0, self.size());
  std::fprintf(stderr, "dfp %s: %s: %s\n", cmd.c_str(), dfp::status_name(e.status()), message.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("dfp: CNN training on CPUs with INT16 dynamic fixed point (DFP16), BF16, FP16 and FP32", "dfp");
  app.set_version_flag("--version", version_text, "print the version and the libraries' versions, then exit");
  app.allow_extras();  // an unknown command is named below
  app.fallthrough(false);
  std::map<const CLI::App*, dfp::cli::Run> runs;
  for (auto add : {dfp::cli::add_info, dfp::cli::add_bench, dfp::cli::add_train, dfp::cli::add_eval, dfp::cli::add_compare,
                   dfp::cli::add_export}) {
    const dfp::cli::Run run = add(app);
    CLI::App* sub = app.get_subcommands({}).back();
    sub->allow_extras();  // FlagSet::refuse_extras names an unknown flag
    runs[sub] = run;
  }
  app.footer("dfp COMMAND --help lists the flags of COMMAND.");

  std::vector<std::string> args;  // CLI11 takes them in reverse
  for (int i = argc - 1; i >= 1; --i) args.emplace_back(argv[i]);
  if (!args.empty() && args.back() == "help") args.back() = "--help";
  std::string cmd = args.empty() ? "" : args.back();
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    if (dfp::command_line_errors_left_to_rank0()) return 0;  // every rank has it: rank 0 says it (see below)
    std::fprintf(stderr, "dfp %s: %s: %s (see dfp %s --help)\n", cmd.c_str(),
                 dfp::status_name(dfp::Status::invalid_argument), e.what(), cmd.c_str());
    return 1;
  }
  const std::vector<CLI::App*> chosen = app.get_subcommands();
  if (chosen.empty()) {
    if (!app.remaining().empty()) std::fprintf(stderr, "dfp: unknown command '%s'\n", app.remaining().front().c_str());
    std::fputs(app.help().c_str(), stderr);
    return 2;
  }
  cmd = chosen.front()->get_name();
  try {
    return runs.at(chosen.front())();
  } catch (const dfp::RefusalOfEveryRank& e) {
    // Rank 0 says it and fails the job. This rank ends quietly and with status 0: a launcher ends
    // the whole job when a rank fails, which could stop rank 0 before it has said anything.
    if (e.left_to_rank0()) return 0;
    report(cmd, e);
    return 1;
  } catch (const dfp::Error& e) {
    report(cmd, e);
    return 1;
  } catch (const std::bad_alloc&) {
    // An allocation outside the model's planning (which names its layer): data, loader, files.
    std::fprintf(stderr, "dfp %s: out of memory: an allocation failed outside the model's buffers (the data set, "
                         "the loader's batches or a file being read); fewer --workers, a smaller --batch-size or "
                         "--limit-train needs less\n", cmd.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dfp %s: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}
