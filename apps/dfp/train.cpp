// dfp train and dfp eval.
#include <cstdio>
#include <memory>
#include <string>

#include "dfp/status.hpp"
#include "dfp/trainer.hpp"
#include "apps/dfp/commands.hpp"
#include "apps/dfp/flags.hpp"

namespace dfp::cli {

void print_line(const std::string& s) {
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}

namespace {

void print_eval(const dfp::EvalResult& r) {
  std::printf("test loss %.4f top1 %.2f%% top5 %.2f%% (%d images)\n", r.loss, r.top1, r.top5, r.images);
}

struct TrainState {
  RunFlags run;
  FlagSet flags;
  explicit TrainState(CLI::App& app) : flags(app) {}
};

int train(TrainState& s) {
  s.flags.apply();
  s.run.finish();
  dfp::TrainConfig& c = s.run.config;
  if (s.run.evaluate) {  // PyTorch's `main.py -e --resume FILE`
    DFP_CHECK(!c.resume.empty(), dfp::Status::invalid_argument,
              "flag --evaluate: expected --resume FILE, the checkpoint to evaluate");
    print_eval(dfp::evaluate_checkpoint(c.resume, c.data, c.threads, print_line));
    return 0;
  }
  dfp::train(c, print_line);  // writes DIR/run.toml with the other run files
  return 0;
}

}  // namespace

Run add_train(CLI::App& root) {
  CLI::App* app = root.add_subcommand("train", "train a model into --out DIR");
  app->footer("DIR gets config.json, metrics.jsonl, checkpoint.dfp and run.toml: the flags of the run, resolved; "
              "dfp train --config DIR/run.toml --out NEW repeats the run.");
  auto s = std::make_shared<TrainState>(*app);
  TrainState* p = s.get();
  p->flags.add(run_flags(p->run));
  p->flags.add(policy_flags(p->run));
  p->flags.add({out_flag(p->run.config.out, "directory of the run's files"),
                {"-e,--evaluate", "", "evaluate the checkpoint of --resume on the test set instead of training",
                 [p](const std::string&, const std::string&) { p->run.evaluate = true; }, "Run"}});
  p->flags.add_config_flag();
  p->flags.show_defaults(p->run.config);
  return [s] { return train(*s); };
}

Run add_eval(CLI::App& root) {
  struct State {
    std::string checkpoint, data;
    int threads = 0;
    FlagSet flags;
    explicit State(CLI::App& app) : flags(app) {}
  };
  CLI::App* app = root.add_subcommand("eval", "test loss, top-1 and top-5 of a checkpoint");
  auto s = std::make_shared<State>(*app);
  State* p = s.get();
  p->flags.add({{"--checkpoint", "FILE", "checkpoint written by dfp train (required)",
                 [p](const std::string&, const std::string& v) { p->checkpoint = v; }},
                {"--data", "DIR", "dataset directory (default: the dataset's)",
                 [p](const std::string&, const std::string& v) { p->data = v; }},
                threads_option(p->threads)});
  return [s] {
    s->flags.apply();
    DFP_CHECK(!s->checkpoint.empty(), dfp::Status::invalid_argument, "flag --checkpoint: expected the checkpoint FILE to evaluate (required)");
    print_eval(dfp::evaluate_checkpoint(s->checkpoint, s->data, s->threads, print_line));
    return 0;
  };
}

}  // namespace dfp::cli
