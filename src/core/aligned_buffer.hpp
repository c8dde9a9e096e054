// Zero-initialised, 64-byte aligned storage owned by planned operators. Allocated when an
// operator is built (a standalone ConvInt16 without a shared workspace: on its first use), never
// inside a Model's training step. Buffers of 2 MiB or more are 2 MiB-aligned and advised for
// transparent huge pages (the system default here is madvise): the kernels stream through planes
// many MiB apart, and huge pages cut their TLB misses (the training figures are in
// docs/design/memory.md).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>

#include <sys/mman.h>

namespace dfp {

template <class T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t n) : n_(n) {
    if (n == 0) return;
    // The size is not rounded up to whole huge pages: only the 2 MiB windows that lie entirely in
    // the buffer become huge pages, so the resident set grows by nothing the buffer does not use.
    const size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    const bool huge = bytes >= kHuge;
    p_ = static_cast<T*>(huge ? std::aligned_alloc(kHuge, (bytes + kHuge - 1) / kHuge * kHuge) : std::aligned_alloc(64, bytes));
    if (!p_) throw std::bad_alloc();
    if (huge) madvise(p_, bytes, MADV_HUGEPAGE);
    std::memset(static_cast<void*>(p_), 0, bytes);
  }
  ~AlignedBuffer() { std::free(p_); }
  AlignedBuffer(AlignedBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) { std::free(p_); p_ = o.p_; n_ = o.n_; o.p_ = nullptr; o.n_ = 0; }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  T* data() noexcept { return p_; }
  const T* data() const noexcept { return p_; }
  size_t size() const noexcept { return n_; }
  T& operator[](size_t i) noexcept { return p_[i]; }
  const T& operator[](size_t i) const noexcept { return p_[i]; }

 private:
  static constexpr size_t kHuge = size_t(2) << 20;
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace dfp
