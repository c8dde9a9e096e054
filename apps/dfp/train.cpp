// dfp train and dfp eval.
#include <unistd.h>

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

// The run's progress: on a terminal one line redrawn in place (\r); elsewhere whole lines every
// --print-every steps. A launcher's ranks write into a pseudo-terminal of the launcher's even
// when its own output goes to a file, so a rank never redraws.
class Progress {
 public:
  explicit Progress(int print_every) : print_every_(print_every), redraw_(isatty(STDOUT_FILENO) && !dfp::under_launcher()) {}

  dfp::TrainCallbacks callbacks() {
    dfp::TrainCallbacks c;
    c.log = [this](const std::string& s) { line(s); };
    c.on_step = [this](const dfp::StepProgress& p) { step(p); };
    return c;
  }

 private:
  void line(const std::string& s) {
    if (open_) std::printf("\n");  // the redrawn line stays as it was last drawn
    open_ = false;
    print_line(s);
  }
  void step(const dfp::StepProgress& p) {
    if (!redraw_) {
      if (p.step % print_every_ == 0 || p.step == p.steps) print_line(dfp::progress_text(p));
      return;
    }
    std::printf("\r%s", dfp::progress_text(p).c_str());
    std::fflush(stdout);
    open_ = true;
  }
  const int print_every_;
  const bool redraw_;
  bool open_ = false;  // a redrawn line without its newline
};

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
  Progress progress(c.print_every);
  dfp::train(c, progress.callbacks());  // writes DIR/run.toml with the other run files
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
