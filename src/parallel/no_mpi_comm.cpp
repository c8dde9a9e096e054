// Comm in a build without MPI: a job of more than one process is refused.
#include "dfp/status.hpp"
#include "src/parallel/comm.hpp"

namespace dfp::parallel {

struct Comm::Impl {};

bool built_with_mpi() noexcept { return false; }

std::unique_ptr<Comm> Comm::join(double) {
  fail(Status::unsupported,
       "this dfp was built without MPI, but the launcher started " + std::to_string(launcher_world_size()) +
           " processes (OMPI_COMM_WORLD_SIZE/PMI_SIZE/PMIX_SIZE): data-parallel training needs a build with MPI "
           "(Debian: apt-get install libopenmpi-dev openmpi-bin, then configure again); run without mpirun to train "
           "in one process");
}

Comm::Comm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Comm::~Comm() = default;
int Comm::rank() const noexcept { return 0; }
int Comm::size() const noexcept { return 1; }
std::string Comm::host() const { return {}; }
void Comm::set_step(uint64_t) noexcept {}
void Comm::broadcast(void*, size_t, int, const char*) {}
void Comm::allreduce(void*, size_t, Type, Op, const char*) {}
void Comm::allgather(const void*, void*, size_t, const char*) {}
void Comm::gather(const void*, void*, size_t, int, const char*) {}
void Comm::scatter(const void*, void*, size_t, int, const char*) {}
void Comm::reserve_slots(int) {}
void Comm::start_allreduce(int, void*, size_t, Type, Op) {}
bool Comm::test(int) { return true; }
void Comm::wait(int, const char*) {}
void Comm::abort(const std::string& message) { fail(Status::internal, message); }

}  // namespace dfp::parallel
