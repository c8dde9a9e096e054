// dfp: a run's ownership of its output directory.
#pragma once

#include <string>

namespace dfp {

// An exclusive flock(2) on DIR/dfp.lock, held while the object lives (the kernel releases it when
// the process dies, however it dies), with the holder's process id written in the file. A second
// lock on the same directory, from this process or another, is Error(invalid_argument) naming the
// directory, `flag` (what set it, e.g. "flag --out") and the holder's PID. The file stays after
// the lock is released: removing it would let two later runs lock two different files.
class RunLock {
 public:
  RunLock(const std::string& dir, const std::string& flag);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace dfp
