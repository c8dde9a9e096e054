// A maximum (or minimum) shared by the tasks of one parallel loop. Each task folds its own result in once, so
// a compare-exchange loop is enough; NaN never wins (the comparison is false for it).
#pragma once

#include <atomic>
#include <cstdint>

namespace dfp {

template <class T>
inline void atomic_max(std::atomic<T>& a, T v) {
  T cur = a.load(std::memory_order_relaxed);
  while (v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {}
}

template <class T>
inline void atomic_min(std::atomic<T>& a, T v) {
  T cur = a.load(std::memory_order_relaxed);
  while (v < cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {}
}

// The same on an element of a plain array that the loop's tasks share (one per plane, say).
template <class T>
inline void atomic_max(T& a, T v) {
  std::atomic_ref<T> r(a);
  T cur = r.load(std::memory_order_relaxed);
  while (v > cur && !r.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {}
}

// A count shared the same way. Most tasks have nothing to add (saturated or non-finite elements):
// they skip the locked add, whose cache line the other threads' tasks would otherwise bounce
// between cores at the end of every task (quantization loops showed it in profiles).
inline void atomic_add_nonzero(std::atomic<uint64_t>& a, uint64_t v) {
  if (v != 0) a.fetch_add(v, std::memory_order_relaxed);
}

}  // namespace dfp
