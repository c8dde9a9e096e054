// The processes of a data-parallel job and the collectives the trainer needs, behind an interface
// without MPI types: src/parallel/mpi_comm.cpp implements it on MPI (builds that found an MPI library),
// src/parallel/no_mpi_comm.cpp refuses a multi-process job (builds without one).
//
// Every wait has a watchdog: a collective that does not complete within the job's timeout ends the
// job on every rank (MPI_Abort) with a message naming the ranks that did not answer (a rank that
// stopped, hangs or died). A rank that dies outright is also reported by the launcher (Open MPI's
// mpirun names the rank and its signal).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace dfp::parallel {

// How many processes the launcher started, from its environment (Open MPI's OMPI_COMM_WORLD_SIZE,
// MPICH/Hydra's PMI_SIZE, PMIx's PMIX_SIZE); 1 when none of them is set or it is not a number > 1.
int launcher_world_size() noexcept;
// This process's rank as the launcher numbers it (OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK); 0 when
// none is set.
int launcher_rank() noexcept;
// Whether a launcher started this process (any of the variables above is set, even for one rank).
bool under_launcher() noexcept;
// Whether every rank of the launcher's job was started with one command line (Open MPI: a single
// application context, OMPI_APP_CTX_NUM_PROCS equal to the world size); false when the launcher
// does not say (another MPI) or the job gave its ranks several command lines (`mpirun A : B`).
bool launcher_one_command_line() noexcept;
// Whether this build has the MPI implementation (otherwise Comm::join refuses).
bool built_with_mpi() noexcept;

enum class Type { f32, f64, i16, i64, bf16 };  // bf16: 16-bit patterns, summed in FP32 and rounded to nearest
enum class Op { sum, max, min };

class Comm {
 public:
  // Joins the job the launcher started (MPI_Init on first use in the process; finalised at exit).
  // timeout_seconds bounds every wait. Error(unsupported) in a build without MPI.
  static std::unique_ptr<Comm> join(double timeout_seconds);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const noexcept;
  int size() const noexcept;
  std::string host() const;
  // What the watchdog's message names as the place the job was at.
  void set_step(uint64_t step) noexcept;

  // Blocking collectives (`what` names the operation in a watchdog message).
  void broadcast(void* data, size_t bytes, int root, const char* what);
  void allreduce(void* data, size_t count, Type type, Op op, const char* what);
  void allgather(const void* mine, void* all, size_t bytes, const char* what);
  void gather(const void* mine, void* all, size_t bytes, int root, const char* what);
  void scatter(const void* all, void* mine, size_t bytes, int root, const char* what);

  // Non-blocking in-place allreduce in request slot `slot` (0 .. slots-1, set once by
  // reserve_slots; nothing is allocated per call). test() makes progress and says whether it is
  // done; wait() blocks (with the watchdog).
  void reserve_slots(int slots);
  void start_allreduce(int slot, void* data, size_t count, Type type, Op op);
  bool test(int slot);
  void wait(int slot, const char* what);

  // Prints `message` (prefixed with the rank) to stderr and ends the job on every rank.
  [[noreturn]] void abort(const std::string& message);

  struct Impl;

 private:
  explicit Comm(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Bytes of one element of `type`.
size_t type_bytes(Type type) noexcept;

}  // namespace dfp::parallel
