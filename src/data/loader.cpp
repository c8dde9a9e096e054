// Loader: shuffling, augmentation and prefetching of batches in the nChw16c layout.
//
// Threading. One producer std::thread fills a ring of kRing preallocated batch buffers ahead of
// the consumer; inside a batch the samples are spread over a oneTBB arena of ctx.threads()
// threads (or the constructor's `threads`). The arena is the loader's own: work queued in the
// context's arena could be picked up by a training step's worker waiting inside its own parallel
// loop and delay that step.
//
// Determinism. Every sample is written by exactly one task from inputs that depend only on
// (seed, epoch, the sample's dataset index): the shuffle order is a Fisher-Yates permutation
// driven by a counter-based hash of (seed, epoch), and the crop/flip draws are hashes of
// (seed, epoch, index). No random state is shared, so thread count and timing cannot matter.
//
// File-backed datasets. Each sample's JPEG is read and decoded by the task that writes it, in a
// per-thread jpeg::Decoder whose buffers are reused; the crop window is drawn from the same
// (seed, epoch, index) stream, so decoded batches are as thread-independent as in-memory ones.
//
// Synchronisation. Batch b of an epoch lives in slot b % kRing. The producer may fill batch b
// once the consumer has released batch b - kRing; the consumer holds the batch it was last given
// until its next call to next(). start_epoch() first waits for the producer to finish the batch it
// is writing, so the permutation and epoch it rewrites are never read concurrently.
#include <tbb/blocked_range.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/conv.hpp"
#include "dfp/data.hpp"
#include "dfp/status.hpp"
#include "src/core/aligned_buffer.hpp"
#include "base/random.hpp"
#include "src/data/jpeg.hpp"

namespace dfp {

namespace {

// One batch held by the consumer, one being prefetched: filling a batch (decoding its JPEGs
// included) takes a small part of a training step, so a second batch ahead would only hold
// memory (103 MB for ImageNet's 224x224 at batch 32, 13 of 16 lanes the blocked layout's padding).
constexpr int kRing = 2;

}  // namespace

struct Loader::Impl {
  // ---- fixed at construction ----
  const Dataset* data = nullptr;
  int batch = 0, batches = 0;
  int part = 0, parts = 1, local = 0;  // set_shard: this loader's part of each batch, `local` images
  bool shuffle = false;
  AugmentOptions aug;
  uint64_t seed = 0;
  int threads = 1;
  int C = 0, H = 0, W = 0;
  bool files = false;          // file-backed dataset: decode JPEGs
  int resize = 0;              // file-backed evaluation: shorter side before the center crop
  size_t image_floats = 0;     // one image in nChw16c
  std::vector<float> lut;      // [C][256]: pixel byte -> normalised value
  std::vector<int32_t> order;  // this epoch's sample order
  struct Slot {
    AlignedBuffer<float> images;
    AlignedBuffer<int32_t> labels;
    int size = 0;
  };
  Slot slots[kRing];
  tbb::task_arena arena;
  // File-backed: one decoder and one H x W RGB crop per thread that produces samples.
  struct Scratch {
    jpeg::Decoder decoder;
    std::vector<uint8_t> rgb;
  };
  mutable tbb::enumerable_thread_specific<Scratch> scratch;

  // ---- shared between consumer and producer, guarded by m ----
  std::mutex m;
  std::condition_variable to_producer, to_consumer;
  bool stop = false;     // destructor: producer exits
  bool active = false;   // an epoch is running and the producer may start batches
  bool busy = false;     // the producer is writing a batch outside the lock
  bool started = false;  // start_epoch() has been called at least once
  bool holding = false;  // the consumer holds batch `consumed - 1`
  int epoch = 0;
  int produced = 0, released = 0, consumed = 0;
  std::exception_ptr error;
  double wait_seconds = 0;

  std::thread producer;

  ~Impl() {
    {
      std::lock_guard<std::mutex> lk(m);
      stop = true;
    }
    to_producer.notify_all();
    if (producer.joinable()) producer.join();
  }

  // One image of a file-backed dataset: read and decode the JPEG into an H x W RGB crop, then
  // flip and LUT into the image's lanes of dst.
  void make_file_sample(int idx, float* dst) const {
    Scratch& sc = scratch.local();
    if (sc.rgb.size() != size_t(H) * W * 3) sc.rgb.resize(size_t(H) * W * 3);
    const uint64_t key = stream_key(seed, kAugmentSalt, uint64_t(epoch), uint64_t(idx));
    try {
      jpeg::Decoder& dec = sc.decoder;
      dec.read_file(data->files[size_t(idx)]);
      const jpeg::Box box = aug.random_resized_crop ? jpeg::random_resized_crop(dec.height(), dec.width(), aug, key)
                                                    : jpeg::resize_center_crop(dec.height(), dec.width(), resize, H, W);
      dec.render(box, H, W, sc.rgb.data());
    } catch (const Error& e) {
      const int label = data->file_labels[size_t(idx)];
      const std::string cls = size_t(label) < data->class_names.size()
                                  ? "class '" + data->class_names[size_t(label)] + "'"
                                  : "label " + std::to_string(label);
      dfp::fail(e.status(), "dataset '" + data->name + "', sample " + std::to_string(idx) + " (" + cls + "): " + e.what());
    }
    const bool flip = aug.hflip && (mix64(key + kDrawFlip) >> 63) != 0;
    // C = 3 < kChannelBlock: one channel block, a pixel's 3 values share its 16-float lane group.
    const float *l0 = lut.data(), *l1 = l0 + 256, *l2 = l1 + 256;
    for (int h = 0; h < H; ++h) {
      float* row = dst + size_t(h) * W * kChannelBlock;
      const uint8_t* srow = sc.rgb.data() + size_t(h) * W * 3;
      for (int w = 0; w < W; ++w) {
        const uint8_t* p = srow + size_t(flip ? W - 1 - w : w) * 3;
        float* o = row + size_t(w) * kChannelBlock;
        o[0] = l0[p[0]];
        o[1] = l1[p[1]];
        o[2] = l2[p[2]];
      }
    }
  }

  // One image: crop/flip draws from (seed, epoch, idx), then the LUT, written at the image's
  // lanes of dst. Padding lanes are never written: they stay zero from the allocation.
  void make_sample(int idx, float* dst) const {
    if (files) return make_file_sample(idx, dst);
    const uint8_t* src = data->image(idx);
    const int pad = aug.pad;
    int oy = pad, ox = pad;  // crop origin in the padded image; pad = no shift
    bool flip = false;
    if (pad > 0 || aug.hflip) {
      const uint64_t key = stream_key(seed, kAugmentSalt, uint64_t(epoch), uint64_t(idx));
      if (pad > 0) {
        oy = int(uniform_below(mix64(key + kDrawPadY), uint32_t(2 * pad + 1)));
        ox = int(uniform_below(mix64(key + kDrawPadX), uint32_t(2 * pad + 1)));
      }
      if (aug.hflip) flip = (mix64(key + kDrawFlip) >> 63) != 0;
    }
    const size_t plane_stride = size_t(H) * W * kChannelBlock;
    for (int c = 0; c < C; ++c) {
      const float* l = lut.data() + size_t(c) * 256;
      const float zero = l[0];  // padding is pixel value 0, normalised like any pixel
      float* plane = dst + size_t(c / kChannelBlock) * plane_stride + c % kChannelBlock;
      for (int h = 0; h < H; ++h) {
        float* row = plane + size_t(h) * W * kChannelBlock;
        const int sy = h + oy - pad;
        if (sy < 0 || sy >= H) {
          for (int w = 0; w < W; ++w) row[size_t(w) * kChannelBlock] = zero;
          continue;
        }
        const uint8_t* srow = src + (size_t(c) * H + sy) * W;
        for (int w = 0; w < W; ++w) {
          // Output column w of the flipped crop is column W-1-w of the crop.
          const int sx = (flip ? W - 1 - w : w) + ox - pad;
          row[size_t(w) * kChannelBlock] = (sx >= 0 && sx < W) ? l[srow[sx]] : zero;
        }
      }
    }
  }

  // Batch b of the epoch is positions [b * batch, (b + 1) * batch) of the order; a shard's part
  // of it (set_shard) is `local` positions from b * batch + part * local.
  void fill(int b) {
    Slot& s = slots[b % kRing];
    const int first = b * batch + part * local;
    const int n = std::max(0, std::min(local, data->count - first));
    auto body = [&](int j0, int j1) {
      for (int j = j0; j < j1; ++j) {
        const int idx = order[size_t(first + j)];
        make_sample(idx, s.images.data() + size_t(j) * image_floats);
        s.labels[size_t(j)] = data->label(idx);
      }
    };
    if (threads > 1 && n > 1) {
      arena.execute([&] {
        tbb::parallel_for(tbb::blocked_range<int>(0, n, 1),
                          [&](const tbb::blocked_range<int>& r) { body(r.begin(), r.end()); });
      });
    } else {
      body(0, n);
    }
    if (n < local) {
      // A short last batch: the slot still holds an earlier full batch past n. Zero images and
      // label -1 make any use of those entries visible instead of silently training on them.
      std::memset(s.images.data() + size_t(n) * image_floats, 0, size_t(local - n) * image_floats * sizeof(float));
      std::fill(s.labels.data() + n, s.labels.data() + local, -1);
    }
    s.size = n;
  }

  void run() {
    std::unique_lock<std::mutex> lk(m);
    for (;;) {
      to_producer.wait(lk, [&] {
        return stop || (active && !error && produced < batches && produced - released < kRing);
      });
      if (stop) return;
      const int b = produced;
      busy = true;
      lk.unlock();
      std::exception_ptr err;
      try {
        fill(b);
      } catch (...) {
        err = std::current_exception();
      }
      lk.lock();
      busy = false;
      if (err)
        error = err;
      else
        produced = b + 1;
      to_consumer.notify_all();
    }
  }

  void make_order(int e) {
    for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
    if (!shuffle) return;
    const uint64_t key = stream_key(seed, kShuffleSalt, uint64_t(e), 0);
    for (size_t i = order.size() - 1; i > 0; --i) {
      const size_t j = uniform_below(mix64(key + i), uint32_t(i + 1));
      std::swap(order[i], order[j]);
    }
  }
};

Loader::Loader(const Context& ctx, const Dataset& d, int batch, bool shuffle, bool drop_last,
               AugmentOptions aug, uint64_t seed, int threads)
    : impl_(std::make_unique<Impl>()) {
  const std::string what = "Loader(dataset '" + d.name + "')";
  auto need = [&](bool ok, const std::string& msg) { DFP_CHECK(ok, Status::invalid_argument, what + ": " + msg); };
  need(d.count >= 1, "count is " + std::to_string(d.count) + ", expected >= 1");
  need(d.channels >= 1 && d.height >= 1 && d.width >= 1,
       "image shape " + std::to_string(d.channels) + "x" + std::to_string(d.height) + "x" + std::to_string(d.width) +
           ", expected every dimension >= 1");
  const bool files = d.file_backed();
  if (files) {
    need(d.classes >= 1, "classes is " + std::to_string(d.classes) + ", expected >= 1");
    need(d.channels == 3, "channels is " + std::to_string(d.channels) + ", expected 3 (RGB) for a file-backed dataset");
    need(d.files.size() == size_t(d.count),
         "files has " + std::to_string(d.files.size()) + " entries, expected count = " + std::to_string(d.count));
    need(d.file_labels.size() == size_t(d.count), "file_labels has " + std::to_string(d.file_labels.size()) +
                                                      " entries, expected count = " + std::to_string(d.count));
    for (size_t i = 0; i < d.file_labels.size(); ++i)
      if (d.file_labels[i] < 0 || d.file_labels[i] >= d.classes)
        need(false, "label of file " + std::to_string(i) + " ('" + d.files[i] + "') is " +
                        std::to_string(d.file_labels[i]) + ", expected 0 .. classes - 1 = " + std::to_string(d.classes - 1));
    need(aug.pad == 0, "AugmentOptions.pad is " + std::to_string(aug.pad) +
                           ", expected 0 for a file-backed dataset (use random_resized_crop)");
    need(std::isfinite(aug.scale_min) && std::isfinite(aug.scale_max) && aug.scale_min > 0 &&
             aug.scale_min <= aug.scale_max && aug.scale_max <= 1,
         "AugmentOptions.scale is (" + std::to_string(aug.scale_min) + ", " + std::to_string(aug.scale_max) +
             "), expected 0 < scale_min <= scale_max <= 1");
    need(std::isfinite(aug.ratio_min) && std::isfinite(aug.ratio_max) && aug.ratio_min > 0 &&
             aug.ratio_min <= aug.ratio_max,
         "AugmentOptions.ratio is (" + std::to_string(aug.ratio_min) + ", " + std::to_string(aug.ratio_max) +
             "), expected 0 < ratio_min <= ratio_max");
    need(aug.resize == 0 || (aug.resize >= std::max(d.height, d.width) && aug.resize <= 65536),
         "AugmentOptions.resize is " + std::to_string(aug.resize) + ", expected 0 or max(height, width) = " +
             std::to_string(std::max(d.height, d.width)) + " .. 65536");
  } else {
    need(d.classes >= 1 && d.classes <= 256, "classes is " + std::to_string(d.classes) + ", expected 1 .. 256");
    need(d.pixels.size() == size_t(d.count) * d.image_bytes(),
         "pixels has " + std::to_string(d.pixels.size()) + " bytes, expected count*C*H*W = " +
             std::to_string(size_t(d.count) * d.image_bytes()));
    need(d.labels.size() == size_t(d.count),
         "labels has " + std::to_string(d.labels.size()) + " entries, expected count = " + std::to_string(d.count));
    for (size_t i = 0; i < d.labels.size(); ++i)
      if (d.labels[i] >= d.classes)  // message built only on failure: this runs over every label
        need(false, "label of record " + std::to_string(i) + " is " + std::to_string(d.labels[i]) +
                        ", expected < classes = " + std::to_string(d.classes));
    need(!aug.random_resized_crop, "AugmentOptions.random_resized_crop needs a file-backed dataset (an image folder)");
  }
  need(threads >= 0, "threads is " + std::to_string(threads) + ", expected >= 0 (0 = the context's)");
  need(batch >= 1, "batch is " + std::to_string(batch) + ", expected >= 1");
  need(!drop_last || batch <= d.count, "batch " + std::to_string(batch) + " with drop_last leaves no batch of the " +
                                           std::to_string(d.count) + " samples; expected batch <= count");
  need(aug.pad >= 0 && aug.pad <= std::min(d.height, d.width),
       "AugmentOptions.pad is " + std::to_string(aug.pad) + ", expected 0 .. min(height, width) = " +
           std::to_string(std::min(d.height, d.width)));
  need(aug.mean.empty() || int(aug.mean.size()) == d.channels,
       "AugmentOptions.mean has " + std::to_string(aug.mean.size()) + " entries, expected 0 or channels = " +
           std::to_string(d.channels));
  need(aug.stddev.empty() || int(aug.stddev.size()) == d.channels,
       "AugmentOptions.stddev has " + std::to_string(aug.stddev.size()) + " entries, expected 0 or channels = " +
           std::to_string(d.channels));
  for (size_t c = 0; c < aug.mean.size(); ++c)
    need(std::isfinite(aug.mean[c]), "AugmentOptions.mean[" + std::to_string(c) + "] is not finite");
  for (size_t c = 0; c < aug.stddev.size(); ++c)
    need(std::isfinite(aug.stddev[c]) && aug.stddev[c] > 0,
         "AugmentOptions.stddev[" + std::to_string(c) + "] is " + std::to_string(aug.stddev[c]) +
             ", expected a finite value > 0");

  Impl& s = *impl_;
  s.data = &d;
  s.batch = batch;
  s.local = batch;
  s.batches = drop_last ? d.count / batch : (d.count + batch - 1) / batch;
  s.shuffle = shuffle;
  s.seed = seed;
  s.threads = std::max(1, threads > 0 ? threads : ctx.threads());
  s.C = d.channels;
  s.H = d.height;
  s.W = d.width;
  s.files = files;
  s.resize = aug.resize > 0 ? aug.resize : std::min(s.H, s.W) * 256 / 224;
  if (files && s.resize < std::max(s.H, s.W)) s.resize = std::max(s.H, s.W);  // non-square output
  s.image_floats = blocked_size(1, s.C, s.H, s.W);
  // Normalisation as a table: 256 values per channel, computed with the documented formula, so
  // the per-pixel cost is one load and the result is exactly (p/255 - mean) / stddev in float.
  s.lut.resize(size_t(s.C) * 256);
  for (int c = 0; c < s.C; ++c)
    for (int v = 0; v < 256; ++v) {
      float x = float(v) / 255.0f;
      if (!aug.mean.empty()) x -= aug.mean[size_t(c)];
      if (!aug.stddev.empty()) x /= aug.stddev[size_t(c)];
      s.lut[size_t(c) * 256 + size_t(v)] = x;
    }
  s.aug = std::move(aug);
  s.order.resize(size_t(d.count));
  for (auto& slot : s.slots) {
    // Zero-filled: the padding lanes are never written again.
    slot.images = AlignedBuffer<float>(size_t(batch) * s.image_floats);
    slot.labels = AlignedBuffer<int32_t>(size_t(batch));
  }
  s.arena.initialize(s.threads);
  s.producer = std::thread([p = impl_.get()] { p->run(); });
}

Loader::~Loader() = default;
Loader::Loader(Loader&&) noexcept = default;
Loader& Loader::operator=(Loader&&) noexcept = default;

int Loader::batch_size() const noexcept { return impl_->local; }

void Loader::set_shard(int part, int parts) {
  Impl& s = *impl_;
  const std::string what = "Loader(dataset '" + s.data->name + "')::set_shard(" + std::to_string(part) + ", " +
                           std::to_string(parts) + ")";
  DFP_CHECK(parts >= 1 && part >= 0 && part < parts, Status::invalid_argument,
            what + ": expected 0 <= part < parts");
  DFP_CHECK(s.batch % parts == 0, Status::invalid_argument,
            what + ": the batch of " + std::to_string(s.batch) + " images does not divide into " + std::to_string(parts) +
                " equal parts; expected a batch that is a multiple of " + std::to_string(parts));
  std::lock_guard<std::mutex> lk(s.m);
  DFP_CHECK(!s.started, Status::invalid_argument, what + ": expected before the first start_epoch()");
  s.part = part;
  s.parts = parts;
  s.local = s.batch / parts;
}
int Loader::batches_per_epoch() const noexcept { return impl_->batches; }

void Loader::start_epoch(int epoch) {
  DFP_CHECK(epoch >= 0, Status::invalid_argument,
            "Loader::start_epoch: epoch is " + std::to_string(epoch) + ", expected >= 0");
  Impl& s = *impl_;
  {
    std::unique_lock<std::mutex> lk(s.m);
    s.active = false;  // no new batch may start ...
    s.to_consumer.wait(lk, [&] { return !s.busy; });  // ... and the one in flight has finished
    s.make_order(epoch);
    s.epoch = epoch;
    s.produced = s.released = s.consumed = 0;
    s.holding = false;
    s.error = nullptr;
    s.wait_seconds = 0;
    s.started = true;
    s.active = true;
  }
  s.to_producer.notify_all();
}

bool Loader::next(Batch& out) {
  Impl& s = *impl_;
  std::unique_lock<std::mutex> lk(s.m);
  DFP_CHECK(s.started, Status::invalid_argument, "Loader::next: call start_epoch(epoch) before the first next()");
  if (s.holding) {
    s.holding = false;
    ++s.released;
    s.to_producer.notify_all();
  }
  if (s.consumed >= s.batches) {
    out = Batch{};
    return false;
  }
  auto ready = [&] { return s.produced > s.consumed || s.error; };
  if (!ready()) {
    const auto t0 = std::chrono::steady_clock::now();
    s.to_consumer.wait(lk, ready);
    s.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (s.error) std::rethrow_exception(s.error);
  const Impl::Slot& slot = s.slots[s.consumed % kRing];
  out.images = slot.images.data();
  out.labels = slot.labels.data();
  out.size = slot.size;
  ++s.consumed;
  s.holding = true;
  return true;
}

double Loader::data_wait_seconds() const {
  std::lock_guard<std::mutex> lk(impl_->m);
  return impl_->wait_seconds;
}

}  // namespace dfp
