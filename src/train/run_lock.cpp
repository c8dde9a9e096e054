// The output directory's lock (include/dfp/run_lock.hpp).
#include "dfp/run_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "dfp/status.hpp"

namespace dfp {

RunLock::RunLock(const std::string& dir, const std::string& flag) {
  const std::string path = dir + "/dfp.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  DFP_CHECK(fd_ >= 0, Status::io_error, flag + ": cannot open the lock file '" + path + "': " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char pid[32] = {};
    const ssize_t got = ::pread(fd_, pid, sizeof pid - 1, 0);
    ::close(fd_);
    fd_ = -1;
    std::string holder = got > 0 ? std::string(pid, size_t(got)) : std::string();
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    DFP_CHECK(err != EWOULDBLOCK, Status::invalid_argument,
              flag + ": directory '" + dir + "' is in use by another dfp run (PID " +
                  (holder.empty() ? std::string("not yet written") : holder) + ", which holds '" + path +
                  "'); expected a directory that no other run writes to");
    fail(Status::io_error, flag + ": cannot lock '" + path + "': " + std::strerror(err));
  }
  const std::string me = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != ssize_t(me.size())) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    fail(Status::io_error, flag + ": cannot write the lock file '" + path + "': " + std::strerror(err));
  }
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace dfp
