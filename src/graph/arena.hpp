// The memory plan's placement: buffers with lifetimes on a step's time line get offsets in one
// arena so that buffers alive at the same time never share bytes (Model::Impl::plan_memory makes
// the lifetimes; docs/design/memory.md).
#pragma once

#include <cstddef>
#include <vector>

namespace dfp::graph {

struct Lifetime {
  size_t bytes;
  int begin, end;  // closed interval of the time line
  float** view;    // where the buffer's address goes once the arena exists
  size_t offset = 0;
};

// Gives each lifetime an offset so that lifetimes that meet never share bytes; returns the arena
// size. Greedy: largest first, at the lowest offset free over its whole lifetime (the classic
// heuristic for this offline problem).
size_t place(std::vector<Lifetime>& lifetimes);

}  // namespace dfp::graph
