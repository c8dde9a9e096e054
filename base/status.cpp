#include "dfp/status.hpp"

namespace dfp {

const char* status_name(Status s) noexcept {
  switch (s) {
    case Status::invalid_argument: return "invalid argument";
    case Status::io_error: return "I/O error";
    case Status::corrupt_data: return "corrupt data";
    case Status::unsupported: return "unsupported";
    case Status::numerical_error: return "numerical error";
    case Status::internal: return "internal error";
    case Status::out_of_memory: return "out of memory";
  }
  return "error";
}

Error::Error(Status status, const std::string& message) : std::runtime_error(message), status_(status) {}

void fail(Status status, const std::string& message) { throw Error(status, message); }

}  // namespace dfp
