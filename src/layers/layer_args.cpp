#include "src/layers/layer_args.hpp"

#include "dfp/status.hpp"

namespace dfp::model {

LayerArgs::LayerArgs(const std::string& model, const char* kind, const std::string& layer)
    : where_("model '" + model + "': " + (layer.empty() ? std::string(kind) : std::string(kind) + " '" + layer + "'")) {}

void LayerArgs::need(bool ok, const char* field, const std::string& expected, const std::string& got) const {
  if (!ok) fail(Status::invalid_argument, where_ + ": " + field + " expected " + expected + ", got " + got);
}

void LayerArgs::need_int(bool ok, const char* field, const char* expected, long long got) const {
  need(ok, field, expected, std::to_string(got));
}

void LayerArgs::window(int kernel, int stride, int pad, bool pool) const {
  need_int(kernel >= 1, "kernel", ">= 1", kernel);
  need_int(stride >= 1, "stride", ">= 1", stride);
  need_int(pad >= 0, "padding", ">= 0", pad);
  if (pool)
    need(pad <= kernel / 2, "padding", "at most half the window (" + std::to_string(kernel / 2) + ")",
         std::to_string(pad));
}

}  // namespace dfp::model
