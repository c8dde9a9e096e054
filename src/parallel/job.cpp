// The data-parallel job of a training run (src/parallel/job.hpp).
#include "src/parallel/job.hpp"

#include <cstring>
#include <fstream>

#include "dfp/data.hpp"
#include "dfp/model.hpp"
#include "dfp/status.hpp"
#include "base/random.hpp"
#include "src/io/checkpoint.hpp"

namespace dfp::parallel {

namespace {

// A 64-bit digest of bytes (SplitMix64's mix over 8-byte words): equal inputs give equal digests;
// it detects accidents (another flag, file or build), not forgery.
uint64_t digest(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = mix64(h ^ w);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p + i, n - i);
  return mix64(h ^ tail ^ (uint64_t(n) << 56));
}
uint64_t digest(uint64_t h, const std::string& s) { return digest(h, s.data(), s.size()); }

uint64_t data_digest(const Dataset& d) {
  uint64_t h = digest(0, d.name + "/" + std::to_string(d.count) + "/" + std::to_string(d.channels) + "x" +
                             std::to_string(d.height) + "x" + std::to_string(d.width) + "/" + std::to_string(d.classes));
  if (!d.file_backed()) return digest(digest(h, d.pixels.data(), d.pixels.size()), d.labels.data(), d.labels.size());
  // Image folders: the class and file names (the folder may sit elsewhere on each server).
  for (size_t i = 0; i < d.files.size(); ++i) {
    const std::string& f = d.files[i];
    const size_t slash = f.find_last_of('/');
    const size_t dir = slash == std::string::npos || slash == 0 ? std::string::npos : f.find_last_of('/', slash - 1);
    h = digest(h, (dir == std::string::npos ? f : f.substr(dir + 1)) + "#" + std::to_string(d.file_labels[i]));
  }
  return h;
}

uint64_t program_digest() {
  std::ifstream f("/proc/self/exe", std::ios::binary);
  if (!f) return 0;
  std::vector<char> buf(1 << 20);
  uint64_t h = 0;
  while (f) {
    f.read(buf.data(), std::streamsize(buf.size()));
    h = digest(h, buf.data(), size_t(f.gcount()));
  }
  return h;
}

}  // namespace

std::unique_ptr<Job> Job::join(const TrainConfig& c) {
  if (launcher_world_size() <= 1) return nullptr;
  std::unique_ptr<Comm> comm = Comm::join(c.dist_timeout);
  if (comm->size() <= 1) return nullptr;
  return std::unique_ptr<Job>(new Job(std::move(comm), c));
}

Job::Job(std::unique_ptr<Comm> comm, const TrainConfig& c) : comm_(std::move(comm)) {
  allreduce_ = grad_format_name(parse_grad_format(c.allreduce, "flag --allreduce"));
  error_feedback_ = c.error_feedback;
  sync_bn_ = c.sync_bn;
  const std::string n = std::to_string(size());
  if (c.device != "cpu") refuse("flag --device " + c.device + ": data-parallel training runs on the CPU; expected --device cpu");
  if (c.batch_size % size() != 0)
    refuse("flag --batch-size " + std::to_string(c.batch_size) + " with " + n +
           " ranks: the global batch is split into equal per-rank batches; expected a multiple of " + n);
  if (c.error_feedback && allreduce_ != "dfp16")
    refuse("flag --error-feedback: keeps the rounding error of the dfp16 allreduce; expected --allreduce dfp16");
}

Job::~Job() = default;

void Job::refuse(const std::string& message) {
  agreed_ = true;
  fail(Status::invalid_argument, message);
}

void Job::agree_on_start(const Error* error) {
  const uint64_t mine[2] = {error ? 1u : 0u, error ? digest(uint64_t(error->status()), std::string(error->what())) : 0};
  std::vector<uint64_t> all(size_t(size()) * 2);
  comm_->allgather(mine, all.data(), sizeof mine, "the comparison of the ranks' start-up");
  std::string ranks;
  bool said_before = false;  // a lower rank failed with the same message: it reports it
  for (int r = 0; r < size(); ++r)
    if (all[size_t(r) * 2] != 0) {
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      said_before |= r < rank() && error && all[size_t(r) * 2 + 1] == mine[1];
    }
  if (ranks.empty()) return;
  agreed_ = true;
  if (error) throw RefusalOfEveryRank(*error, RefusalOfEveryRank::Quiet{said_before});
  throw RefusalOfEveryRank(Error(Status::invalid_argument, "rank " + ranks + " failed at start-up (its message says why)"),
                           RefusalOfEveryRank::Quiet{true});
}

void Job::check_same_run(const std::string& settings, const Dataset& train, const Dataset& test) {
  const uint64_t mine[3] = {digest(0, settings), digest(data_digest(train), &test.count, sizeof test.count) ^
                                                     data_digest(test), program_digest()};
  std::vector<uint64_t> all(size_t(size()) * 3);
  comm_->allgather(mine, all.data(), sizeof mine, "the comparison of the ranks' settings at start-up");
  const char* what[3] = {"flags (the settings that decide the result)", "data", "dfp program"};
  std::string differ;
  for (int k = 0; k < 3; ++k) {
    std::string ranks;
    for (int r = 1; r < size(); ++r)
      if (all[size_t(r) * 3 + k] != all[size_t(k)]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    if (!ranks.empty()) differ += (differ.empty() ? "" : "; ") + std::string("rank ") + ranks + " started with other " + what[k] + " than rank 0";
  }
  if (!differ.empty())
    refuse("the ranks of this job differ: " + differ +
           "; expected every rank started with the same flags, data and program (one mpirun command line)");
}

void Job::broadcast_state(Model& m) {
  // The broadcast would silently replace what a rank loaded with rank 0's weights: a rank given
  // its own --init-from (or a file of that name that differs on its machine) is refused first.
  uint64_t h = 0;
  for (const Parameter& p : m.parameters()) h = digest(h, p.value, p.size * sizeof(float));
  for (auto& [name, buf] : m.buffers()) h = digest(h, buf->data(), buf->size() * sizeof(float));
  std::vector<uint64_t> all(static_cast<size_t>(size()));
  comm_->allgather(&h, all.data(), sizeof h, "the comparison of the ranks' initial weights");
  std::string ranks;
  for (int r = 1; r < size(); ++r)
    if (all[size_t(r)] != all[0]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  if (!ranks.empty())
    refuse("the ranks of this job differ: rank " + ranks + " starts from other weights than rank 0 (flag --init-from: "
           "another file, or a file whose bytes differ on that rank's machine); expected every rank to start from the "
           "same weights");
  for (Parameter& p : m.parameters()) comm_->broadcast(p.value, p.size * sizeof(float), 0, "the broadcast of the initial weights");
  broadcast_buffers(m);
  m.weights_updated();
}

void Job::broadcast_buffers(Model& m) {
  for (auto& [name, buf] : m.buffers())
    comm_->broadcast(buf->data(), buf->size() * sizeof(float), 0, "the broadcast of the BatchNorm statistics");
}

void Job::attach(const Context& ctx, Model& m, const TrainConfig& c) {
  reducer_ = std::make_unique<GradientReducer>(ctx, *comm_, m, parse_grad_format(allreduce_, "flag --allreduce"),
                                               size_t(c.bucket_kib) * 1024, c.error_feedback, c.seed);
  model_ = &m;
  m.set_batch_offset(rank() * (c.batch_size / size()));  // dropout masks as one process draws them
  if (sync_bn_)
    m.set_statistics_sum([comm = comm_.get()](double* values, size_t count) {
      comm->allreduce(values, count, Type::f64, Op::sum, "the synchronised BatchNorm statistics");
    });
}

void Job::detach() noexcept {
  reducer_.reset();
  if (model_) {
    model_->set_statistics_sum({});
    model_->set_batch_offset(0);
  }
  model_ = nullptr;
}

void Job::check_same_weights(Model& m, int epoch) {
  uint64_t h = 0;
  for (const Parameter& p : m.parameters()) h = digest(h, p.value, p.size * sizeof(float));
  std::vector<uint64_t> all(static_cast<size_t>(size()));
  comm_->allgather(&h, all.data(), sizeof h, "the comparison of the ranks' weights");
  std::string ranks;
  for (int r = 1; r < size(); ++r)
    if (all[size_t(r)] != all[0]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  if (!ranks.empty())
    refuse("after epoch " + std::to_string(epoch) + " the weights of rank " + ranks +
           " differ from rank 0's: the MPI library's allreduce gave the ranks different sums (use --allreduce dfp16, "
           "whose integer sum is the same on every rank)");
}

void Job::sum(double* values, int count) {
  comm_->allreduce(values, size_t(count), Type::f64, Op::sum, "the sum of the epoch's metrics");
}

void Job::put_checkpoint(Checkpoint& ck) {
  ck.meta["ranks"] = std::to_string(size());
  ck.meta["allreduce"] = allreduce_;
  ck.meta["error_feedback"] = error_feedback_ ? "true" : "false";
  ck.meta["sync_bn"] = sync_bn_ ? "true" : "false";
  if (!error_feedback_) return;
  std::vector<float>& mine = reducer_->residual();
  std::vector<float> all(rank() == 0 ? mine.size() * size_t(size()) : 0);
  comm_->gather(mine.data(), all.data(), mine.size() * sizeof(float), 0, "the gathering of the error-feedback residuals");
  if (rank() != 0) return;
  for (int r = 0; r < size(); ++r)
    ck.tensors["dist.residual.rank" + std::to_string(r)].assign(all.begin() + ptrdiff_t(size_t(r) * mine.size()),
                                                                 all.begin() + ptrdiff_t(size_t(r + 1) * mine.size()));
}

void Job::get_checkpoint(const Checkpoint& ck, const std::string& path) {
  const auto ranks = ck.meta.find("ranks");
  const std::string stored = ranks == ck.meta.end() ? "1" : ranks->second;
  if (stored != std::to_string(size()))
    refuse("checkpoint '" + path + "' was written by a job of " + stored + " rank(s); this job has " +
           std::to_string(size()) +
           ": resume with the same number of ranks (each rank's data shard and error feedback depend on it)");
  const auto ar = ck.meta.find("allreduce");
  if (ar != ck.meta.end() && ar->second != allreduce_)
    refuse("checkpoint '" + path + "' was written with --allreduce " + ar->second + "; this job uses " + allreduce_ +
           ": resume with the allreduce it was written with");
  const auto ef = ck.meta.find("error_feedback");
  if ((ef != ck.meta.end() && ef->second == "true") != error_feedback_)
    refuse("checkpoint '" + path + "' was written " + (error_feedback_ ? "without" : "with") +
           " --error-feedback; resume with the setting it was written with");
  const auto sb = ck.meta.find("sync_bn");
  if ((sb != ck.meta.end() && sb->second == "true") != sync_bn_)
    refuse("checkpoint '" + path + "' was written " + (sync_bn_ ? "without" : "with") +
           " --sync-bn; resume with the setting it was written with");
  if (!error_feedback_) return;
  const std::string name = "dist.residual.rank" + std::to_string(rank());
  const auto it = ck.tensors.find(name);
  std::vector<float>& mine = reducer_->residual();
  DFP_CHECK(it != ck.tensors.end() && it->second.size() == mine.size(), Status::corrupt_data,
            "checkpoint '" + path + "': tensor '" + name + "' missing or of another size; expected " +
                std::to_string(mine.size()) + " values");
  mine = it->second;
}

void Job::check_lone_resume(const Checkpoint& ck, const std::string& path) {
  const auto ranks = ck.meta.find("ranks");
  DFP_CHECK(ranks == ck.meta.end() || ranks->second == "1", Status::invalid_argument,
            "checkpoint '" + path + "' was written by a data-parallel job of " +
                (ranks == ck.meta.end() ? std::string("?") : ranks->second) +
                " ranks; resume it with mpirun -np " + (ranks == ck.meta.end() ? std::string("N") : ranks->second) +
                " (each rank's data shard and error feedback depend on it)");
}

}  // namespace dfp::parallel
