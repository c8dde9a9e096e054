// Comm on MPI (Open MPI or MPICH): the job's processes, collectives with a watchdog, and the
// watchdog's report of the ranks that stopped answering.
//
// Errors. The job's communicators return errors (MPI_ERRORS_RETURN) instead of Open MPI's default
// of aborting inside the library: a failed call ends the job through Comm::abort, with the call
// and the rank named. Every wait polls its request (MPI_Test) against the job's timeout; at the
// timeout each live rank tells rank 0 on a communicator of its own, and rank 0 names the ranks it
// did not hear from within a grace period, then aborts the job. A rank that dies is reported by
// the launcher as well (mpirun names the rank and the signal) and ends the job there.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "dfp/float16.hpp"
#include "dfp/status.hpp"
#include "src/parallel/comm.hpp"

namespace dfp::parallel {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kWatchTag = 7301;
constexpr size_t kHostBytes = 64;

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// Sums bf16 patterns: each pair in FP32, the sum rounded to nearest even (the reduction order is
// MPI's, so the result may depend on it, as any floating-point allreduce's).
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

}  // namespace

struct Comm::Impl {
  MPI_Comm work = MPI_COMM_NULL;   // the collectives
  MPI_Comm watch = MPI_COMM_NULL;  // the watchdog's messages
  MPI_Op bf16_op = MPI_OP_NULL;
  int rank = 0, size = 1;
  double timeout = 300;
  uint64_t step = 0;
  std::vector<char> hosts;  // size * kHostBytes
  std::vector<MPI_Request> slots;

  std::string host_of(int r) const { return std::string(hosts.data() + size_t(r) * kHostBytes); }

  [[noreturn]] void abort(const std::string& message) const {
    std::fprintf(stderr, "dfp: rank %d of %d (%s): %s\n", rank, size, host_of(rank).c_str(), message.c_str());
    std::fflush(stderr);
    std::fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }

  void check(int rc, const char* call, const char* what) const {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    abort(std::string(call) + " in " + what + " failed at step " + std::to_string(step) + ": " + std::string(text, size_t(len)));
  }

  MPI_Datatype datatype(Type t) const {
    switch (t) {
      case Type::f32: return MPI_FLOAT;
      case Type::f64: return MPI_DOUBLE;
      case Type::i16: return MPI_INT16_T;
      case Type::i64: return MPI_INT64_T;
      case Type::bf16: return MPI_UINT16_T;
    }
    return MPI_DATATYPE_NULL;
  }
  MPI_Op op(Type t, Op o) const {
    if (t == Type::bf16) {
      if (o != Op::sum) abort("internal: bf16 allreduce supports the sum only");
      return bf16_op;
    }
    return o == Op::sum ? MPI_SUM : o == Op::max ? MPI_MAX : MPI_MIN;
  }

  // Polls `req` until it completes; at the timeout, the watchdog.
  void wait(MPI_Request& req, const char* what) {
    const auto t0 = Clock::now();
    for (long polls = 0;; ++polls) {
      int done = 0;
      check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test", what);
      if (done) return;
      if (polls > 2000) std::this_thread::sleep_for(std::chrono::microseconds(50));
      if ((polls & 255) == 0 && std::chrono::duration<double>(Clock::now() - t0).count() > timeout) watchdog(what);
    }
  }

  // The job is stuck in `what`: rank 0 names the ranks that do not answer, then the job ends.
  [[noreturn]] void watchdog(const char* what) {
    const double grace = std::min(10.0, std::max(2.0, timeout / 2));
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", timeout);
    const std::string where = std::string(what) + " at step " + std::to_string(step) + " did not complete within " +
                              buf + " s (the job's timeout, --dist-timeout)";
    if (rank != 0) {
      int64_t mine = int64_t(step);
      MPI_Request r;
      MPI_Isend(&mine, 1, MPI_INT64_T, 0, kWatchTag, watch, &r);
      std::this_thread::sleep_for(std::chrono::duration<double>(grace * 1.5 + 1));
      abort(where + "; rank 0 did not report the ranks that stopped answering: rank 0 itself stopped, hangs or died");
    }
    std::vector<char> heard(size_t(size), 0);
    heard[0] = 1;
    const auto t0 = Clock::now();
    while (std::chrono::duration<double>(Clock::now() - t0).count() < grace) {
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, kWatchTag, watch, &flag, &st);
      if (!flag) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      int64_t their = 0;
      MPI_Recv(&their, 1, MPI_INT64_T, st.MPI_SOURCE, kWatchTag, watch, MPI_STATUS_IGNORE);
      heard[size_t(st.MPI_SOURCE)] = 1;
    }
    std::string missing;
    for (int r = 0; r < size; ++r)
      if (!heard[size_t(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r) + " (" + host_of(r) + ")";
    abort(where + "; " +
          (missing.empty() ? std::string("every rank answered the watchdog: the ranks disagree on the collectives they run")
                           : "no answer from rank " + missing + ": it stopped, hangs or died") +
          "; ending the job (the last checkpoint is the one written before)");
  }
};

bool built_with_mpi() noexcept { return true; }

std::unique_ptr<Comm> Comm::join(double timeout_seconds) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    // The MPI calls all come from the thread that trains (the loader's and the kernels' threads
    // never make any).
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      fail(Status::io_error, "MPI_Init_thread failed: cannot join the job the launcher started");
    std::atexit(finalize_at_exit);
  }
  auto impl = std::make_unique<Impl>();
  Impl& s = *impl;
  s.timeout = timeout_seconds;
  MPI_Comm_dup(MPI_COMM_WORLD, &s.work);
  MPI_Comm_dup(MPI_COMM_WORLD, &s.watch);
  MPI_Comm_set_errhandler(s.work, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(s.watch, MPI_ERRORS_RETURN);
  MPI_Comm_rank(s.work, &s.rank);
  MPI_Comm_size(s.work, &s.size);
  MPI_Op_create(&bf16_sum, 1, &s.bf16_op);
  char host[kHostBytes] = {};
  gethostname(host, kHostBytes - 1);
  s.hosts.assign(size_t(s.size) * kHostBytes, 0);
  std::memcpy(s.hosts.data() + size_t(s.rank) * kHostBytes, host, kHostBytes);
  MPI_Request r;
  s.check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, s.hosts.data(), int(kHostBytes), MPI_CHAR, s.work, &r),
          "MPI_Iallgather", "the exchange of host names at start-up");
  s.wait(r, "the exchange of host names at start-up");
  return std::unique_ptr<Comm>(new Comm(std::move(impl)));
}

Comm::Comm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Comm::~Comm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Request& r : impl_->slots)
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  MPI_Op_free(&impl_->bf16_op);
  MPI_Comm_free(&impl_->work);
  MPI_Comm_free(&impl_->watch);
}

int Comm::rank() const noexcept { return impl_->rank; }
int Comm::size() const noexcept { return impl_->size; }
std::string Comm::host() const { return impl_->host_of(impl_->rank); }
void Comm::set_step(uint64_t step) noexcept { impl_->step = step; }

void Comm::broadcast(void* data, size_t bytes, int root, const char* what) {
  MPI_Request r;
  impl_->check(MPI_Ibcast(data, int(bytes), MPI_BYTE, root, impl_->work, &r), "MPI_Ibcast", what);
  impl_->wait(r, what);
}

void Comm::allreduce(void* data, size_t count, Type type, Op op, const char* what) {
  MPI_Request r;
  impl_->check(MPI_Iallreduce(MPI_IN_PLACE, data, int(count), impl_->datatype(type), impl_->op(type, op), impl_->work, &r),
               "MPI_Iallreduce", what);
  impl_->wait(r, what);
}

void Comm::allgather(const void* mine, void* all, size_t bytes, const char* what) {
  MPI_Request r;
  impl_->check(MPI_Iallgather(mine, int(bytes), MPI_BYTE, all, int(bytes), MPI_BYTE, impl_->work, &r), "MPI_Iallgather",
               what);
  impl_->wait(r, what);
}

void Comm::gather(const void* mine, void* all, size_t bytes, int root, const char* what) {
  MPI_Request r;
  impl_->check(MPI_Igather(mine, int(bytes), MPI_BYTE, all, int(bytes), MPI_BYTE, root, impl_->work, &r), "MPI_Igather",
               what);
  impl_->wait(r, what);
}

void Comm::scatter(const void* all, void* mine, size_t bytes, int root, const char* what) {
  MPI_Request r;
  impl_->check(MPI_Iscatter(all, int(bytes), MPI_BYTE, mine, int(bytes), MPI_BYTE, root, impl_->work, &r),
               "MPI_Iscatter", what);
  impl_->wait(r, what);
}

void Comm::reserve_slots(int slots) { impl_->slots.assign(size_t(slots), MPI_REQUEST_NULL); }

void Comm::start_allreduce(int slot, void* data, size_t count, Type type, Op op) {
  impl_->check(MPI_Iallreduce(MPI_IN_PLACE, data, int(count), impl_->datatype(type), impl_->op(type, op), impl_->work,
                              &impl_->slots.at(size_t(slot))),
               "MPI_Iallreduce", "a gradient bucket's allreduce");
}

bool Comm::test(int slot) {
  int done = 0;
  MPI_Request& r = impl_->slots[size_t(slot)];
  if (r == MPI_REQUEST_NULL) return true;
  impl_->check(MPI_Test(&r, &done, MPI_STATUS_IGNORE), "MPI_Test", "a gradient bucket's allreduce");
  return done != 0;
}

void Comm::wait(int slot, const char* what) {
  MPI_Request& r = impl_->slots[size_t(slot)];
  if (r != MPI_REQUEST_NULL) impl_->wait(r, what);
}

void Comm::abort(const std::string& message) { impl_->abort(message); }

}  // namespace dfp::parallel
