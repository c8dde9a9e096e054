// A model's state as checkpoint records (the public save_state/load_state, and the trainer's
// checkpoints, which add their own fields around it). The format: docs/design/checkpoint-format.md.
#pragma once

#include <string>

#include "dfp/model.hpp"
#include "dfp/precision.hpp"
#include "src/io/checkpoint.hpp"

namespace dfp {

// Adds the model's tensors (by name, borrowed: ck reads them in the model until it is written),
// their shapes (meta "shape:<name>"), `policy`'s fields and "state_version" to ck.
void put_state(Checkpoint& ck, Model& m, const PrecisionPolicy& policy);

// Copies ck's tensors into the built model (then weights_updated()). Refuses, naming `path` and
// the field or tensor: a newer state_version, a missing tensor, a shape or size that differs from
// the model's. A file without state_version (written before it existed) has no shapes: sizes are
// checked.
void get_state(Model& m, const Checkpoint& ck, const std::string& path);

}  // namespace dfp
