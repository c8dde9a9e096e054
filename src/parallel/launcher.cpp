// What the launcher's environment says about the job, in every build (with or without MPI).
#include <cstdlib>
#include <initializer_list>

#include "src/parallel/comm.hpp"

namespace dfp::parallel {

namespace {

// The first of the launcher's variables `vars` that is set, as an integer in [lo, 2^20); else `none`.
int launcher_number(std::initializer_list<const char*> vars, long lo, int none) noexcept {
  for (const char* var : vars) {
    const char* v = std::getenv(var);
    if (!v || !*v) continue;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end && *end == 0 && n >= lo && n < (1L << 20)) return int(n);
  }
  return none;
}

}  // namespace

int launcher_world_size() noexcept { return launcher_number({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}, 2, 1); }
int launcher_rank() noexcept { return launcher_number({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}, 0, 0); }

bool under_launcher() noexcept {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
    if (const char* v = std::getenv(var); v && *v) return true;
  return false;
}

bool launcher_one_command_line() noexcept {
  // One number when one context started every rank ("2"); one per context otherwise ("1 1").
  const char* procs = std::getenv("OMPI_APP_CTX_NUM_PROCS");
  if (!procs || !*procs) return false;
  char* end = nullptr;
  const long n = std::strtol(procs, &end, 10);
  return end && *end == 0 && n == launcher_world_size();
}

size_t type_bytes(Type type) noexcept {
  switch (type) {
    case Type::f32: return 4;
    case Type::f64: return 8;
    case Type::i16: return 2;
    case Type::i64: return 8;
    case Type::bf16: return 2;
  }
  return 0;
}

}  // namespace dfp::parallel
