// dfp: a model's state on disk -- every named tensor of Model::state() (parameters and buffers,
// with their shapes) and the precision policy -- in the versioned checkpoint format of
// docs/design/checkpoint-format.md. The trainer's checkpoints are state files with the trainer's
// own fields added (settings, momentum), so load_state reads them too.
#pragma once

#include <string>

#include "dfp/model.hpp"
#include "dfp/precision.hpp"

namespace dfp {

// The state version this build writes (meta field "state_version") and the newest it reads.
inline constexpr int kStateVersion = 1;

// Writes the built model's tensors and its policy() to `path`, atomically: `path` holds the old
// file or the new one whatever happens. Error(io_error) names the file and what failed.
void save_state(Model& model, const std::string& path);

// Reads `path` into the built model: every tensor of model.state() must be in the file with the
// model's shape, and weights_updated() then runs. Extra tensors in the file (an optimizer's) are
// ignored. The model keeps the precision it was built with (build it with read_state_policy(path)
// for the file's). Errors name the file and the field or tensor: Error(io_error) for a file that
// cannot be read, Error(corrupt_data) for a damaged file, a missing tensor, a tensor of another
// shape (both shapes named), or a state_version newer than kStateVersion.
void load_state(Model& model, const std::string& path);

// The precision policy recorded in `path` (errors as load_state's).
PrecisionPolicy read_state_policy(const std::string& path);

}  // namespace dfp
