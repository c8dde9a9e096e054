// dfp export: a checkpoint's weights as a PyTorch state_dict.
#include <filesystem>
#include <memory>
#include <string>

#include "dfp/status.hpp"
#include "dfp/torch_state.hpp"
#include "apps/dfp/commands.hpp"
#include "apps/dfp/flags.hpp"

namespace dfp::cli {

Run add_export(CLI::App& root) {
  struct State {
    std::string checkpoint, to_torch;
    FlagSet flags;
    explicit State(CLI::App& app) : flags(app) {}
  };
  CLI::App* app = root.add_subcommand("export", "write a checkpoint's weights in another framework's format");
  app->footer("dfp export --to-torch OUT.pt CHECKPOINT writes what torch.save(model.state_dict(), 'OUT.pt') would, "
              "with torchvision's names: torchvision.models.NAME(num_classes=K).load_state_dict(torch.load('OUT.pt')) "
              "reads it (googlenet: aux_logits=False).");
  auto s = std::make_shared<State>(*app);
  State* p = s.get();
  app->add_option("CHECKPOINT", p->checkpoint, "checkpoint.dfp of dfp train, or a dfp state file")->type_name("FILE");
  p->flags.add({{"--checkpoint", "FILE", "the checkpoint (or give it as the argument)",
                 [p](const std::string&, const std::string& v) { p->checkpoint = v; }},
                {"--to-torch", "OUT", "write a torch.save state_dict (zip format, torch >= 1.6) to OUT",
                 [p](const std::string&, const std::string& v) { p->to_torch = v; }}});
  return [s] {
    s->flags.apply();
    DFP_CHECK(!s->checkpoint.empty(), dfp::Status::invalid_argument, "expected a CHECKPOINT file");
    DFP_CHECK(!s->to_torch.empty(), dfp::Status::invalid_argument, "expected --to-torch OUT");
    // OUT is replaced by a rename: the checkpoint itself (under any name) would be lost, and a
    // device, directory or other special file would be replaced rather than written.
    std::error_code ec;
    DFP_CHECK(!std::filesystem::equivalent(s->to_torch, s->checkpoint, ec), dfp::Status::invalid_argument,
              "flag --to-torch: '" + s->to_torch + "' is the checkpoint '" + s->checkpoint +
                  "' itself; expected another file for the torch state_dict");
    const auto out = std::filesystem::status(s->to_torch, ec);
    DFP_CHECK(!std::filesystem::exists(out) || std::filesystem::is_regular_file(out), dfp::Status::invalid_argument,
              "flag --to-torch: '" + s->to_torch + "' exists and is not a regular file (a directory, device or the "
              "like); expected a new file or a file to replace");
    dfp::export_torch_state_dict(s->checkpoint, s->to_torch);
    print_line("wrote " + s->to_torch + " (torch state_dict) from " + s->checkpoint);
    return 0;
  };
}

}  // namespace dfp::cli
