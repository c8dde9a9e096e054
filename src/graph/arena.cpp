#include "src/graph/arena.hpp"

#include <algorithm>

namespace dfp::graph {

size_t place(std::vector<Lifetime>& lts) {
  std::vector<Lifetime*> order;
  for (Lifetime& l : lts) order.push_back(&l);
  std::stable_sort(order.begin(), order.end(), [](const Lifetime* a, const Lifetime* b) { return a->bytes > b->bytes; });
  std::vector<Lifetime*> placed;
  size_t total = 0;
  for (Lifetime* l : order) {
    std::vector<Lifetime*> live;
    for (Lifetime* p : placed)
      if (p->begin <= l->end && l->begin <= p->end) live.push_back(p);
    std::sort(live.begin(), live.end(), [](const Lifetime* a, const Lifetime* b) { return a->offset < b->offset; });
    size_t off = 0;
    for (Lifetime* p : live) {
      if (off + l->bytes <= p->offset) break;
      off = std::max(off, p->offset + p->bytes);
    }
    l->offset = off;
    total = std::max(total, off + l->bytes);
    placed.push_back(l);
  }
  return total;
}

}  // namespace dfp::graph
