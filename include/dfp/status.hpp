// dfp: the single error policy.
//
// Every failure that a caller can cause or observe (bad argument, unreadable file, corrupt data,
// non-finite tensor, unsupported shape or ISA) is reported by throwing dfp::Error. The message
// names the object (file, tensor, layer, flag), the field, and what was expected. Hot kernels
// never throw: they are called only after planning has validated everything they rely on.
#pragma once

#include <stdexcept>
#include <string>

namespace dfp {

enum class Status {
  invalid_argument,  // a caller passed something out of range or inconsistent
  io_error,          // a file could not be opened, read or written
  corrupt_data,      // a file or buffer does not have the expected format or checksum
  unsupported,       // valid request this build or CPU cannot serve
  numerical_error,   // NaN/Inf or an overflow that the numerics policy does not allow
  internal,          // a broken invariant inside dfp (a bug)
  out_of_memory,     // an allocation failed; the message says what was being allocated
};

const char* status_name(Status s) noexcept;

class Error : public std::runtime_error {
 public:
  Error(Status status, const std::string& message);
  Status status() const noexcept { return status_; }

 private:
  Status status_;
};

// Throws dfp::Error(status, message). Kept out of line so call sites stay small.
[[noreturn]] void fail(Status status, const std::string& message);

}  // namespace dfp

// DFP_CHECK(cond, status, message-expression): throw when cond is false. The message is only
// built on failure.
#define DFP_CHECK(cond, status, msg)               \
  do {                                             \
    if (!(cond)) ::dfp::fail((status), (msg));     \
  } while (0)
