// dfp: the data pipeline. Image-classification datasets in their published on-disk formats,
// augmentation, and a prefetching batch loader that writes the blocked activation layout.
//
// Formats:
//   IDX (MNIST, Fashion-MNIST): plain or gzip-compressed (zlib reads both transparently).
//     images: big-endian uint32 magic 0x00000803, count, rows, cols, then count*rows*cols bytes;
//     labels: big-endian uint32 magic 0x00000801, count, then count bytes.
//   CIFAR-10 binary:  records of 1 label byte + 3072 pixel bytes (R, G, B planes of 32x32).
//   CIFAR-100 binary: records of 1 coarse label byte + 1 fine label byte + 3072 pixel bytes.
//   Image folder (ImageNet layout, as torchvision's ImageFolder): DIR/train/<class>/*.jpg and
//     DIR/val/<class>/*.jpg, JPEG files decoded by the Loader as it builds each batch.
//
// Errors: every problem with a file (missing, not a regular file, truncated, corrupt, wrong magic
// number, label out of range, counts that disagree, trailing bytes, bytes after a gzip stream)
// throws dfp::Error naming the file, the record or header field, and what was expected. A loader
// never returns partially read data.
//
// Determinism: the shuffle order is a function of (seed, epoch) only, and each sample's
// augmentation random numbers of (seed, epoch, the sample's index in the dataset) only, so a
// Loader's batches are bit-identical for any thread count and any timing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dfp {

class Context;

// A dataset: either in memory as 8-bit pixels (IDX, CIFAR), or file-backed (an image folder):
// one JPEG file per sample, decoded, cropped and resized to channels x height x width by the
// Loader when it builds the batch, so the dataset never has to fit in memory.
struct Dataset {
  std::string name;
  std::string source;  // what the images were read from (the image file, batch files or split folder), for messages
  int count = 0, channels = 0, height = 0, width = 0, classes = 0;
  // In memory (files empty):
  std::vector<uint8_t> pixels;  // count * channels * height * width; CHW per image
  std::vector<uint8_t> labels;  // count, each < classes (at most 256 classes)
  // File-backed (files not empty; pixels and labels empty): channels = 3 (RGB; grayscale and
  // CMYK JPEGs are converted), height x width = the Loader's output size.
  std::vector<std::string> files;        // count paths
  std::vector<int32_t> file_labels;      // count, each < classes (any number of classes)
  std::vector<std::string> class_names;  // classes names, label i = class_names[i]

  bool file_backed() const noexcept { return !files.empty(); }
  int label(int i) const noexcept { return file_backed() ? file_labels[size_t(i)] : labels[size_t(i)]; }
  size_t image_bytes() const noexcept { return size_t(channels) * height * width; }
  // In-memory datasets only.
  const uint8_t* image(int i) const noexcept { return pixels.data() + size_t(i) * image_bytes(); }
};

// One IDX image file and its IDX label file (each plain or gzip: a file starting with the gzip
// magic bytes 1F 8B is inflated, member after member; anything after the last member is
// Error(corrupt_data)). channels = 1, height = rows, width = cols; every label must be < classes.
// The dataset's name is the image file's name.
Dataset load_idx(const std::string& images_file, const std::string& labels_file, int classes);

// MNIST-style directory: {train,t10k}-{images-idx3,labels-idx1}-ubyte, optionally ending in
// ".gz", and also accepted with "." instead of the second "-" (train-images.idx3-ubyte). 10
// classes.
Dataset load_mnist_like(const std::string& dir, bool train, const std::string& name);

// CIFAR-10 binary version: train = every data_batch_*.bin in dir, in name order; test = every
// test_batch*.bin. A file whose size is not a whole number of 3073-byte records is an error.
Dataset load_cifar10(const std::string& dir, bool train);

// CIFAR-100 binary version: dir/train.bin or dir/test.bin, 3074-byte records; the fine label
// (100 classes) is the label, the coarse label is checked (< 20) and dropped.
Dataset load_cifar100(const std::string& dir, bool train);

// Image folder in the layout of torchvision's ImageFolder and the PyTorch ImageNet example:
//   dir/train/<class>/**/*.jpg   dir/val/<class>/**/*.jpg   (.jpg, .jpeg in any letter case)
// The classes are the sorted names of the subdirectories of dir/train (label = position);
// dir/val must have exactly the same class folders. Each class's files are found recursively
// and sorted by path, so the sample order is deterministic. Names starting with '.' and files
// with other extensions are ignored; links are followed, but a link whose target lies inside
// dir/<split> outside its own class folder (its images would be labelled with a class they are not
// filed under) and a directory reached twice (a link cycle, found by device and inode) are
// Error(invalid_argument) naming the link. Only the directories are read here: each JPEG is
// opened when the Loader decodes it. image_size is the side of the square images the Loader produces
// (height = width = image_size, channels = 3). No class folder, an empty class folder, or
// differing train/val classes is Error(io_error) naming the folder.
Dataset load_image_folder(const std::string& dir, bool train, int image_size = 224);

// Random images for measuring speed without data on disk, like torchvision's FakeData and the
// PyTorch ImageNet example's --dummy: 3 x image_size x image_size uniform random bytes with
// uniform random labels, the same for every run and machine (train and test splits differ).
struct SyntheticSpec {
  int classes = 10, train = 1024, test = 256;
};
Dataset make_synthetic(const SyntheticSpec& spec, bool train, int image_size);

// By name: "fashion-mnist" (path "" = /usr/share/datasets/fashion-mnist, the Debian package),
// "mnist", "cifar10", "cifar100", "imagenet-folder" (also "imagenet" or "folder":
// load_image_folder), "synthetic" (make_synthetic; path "" or "classes=K,train=N,test=M", any
// subset, K <= 256). image_size: the folder dataset's output size (0 = 224), the synthetic
// images' side (0 = 32); any other dataset has a fixed size and requires 0. An unknown name is Error(invalid_argument) listing
// the known names; a missing directory or file is Error(io_error) naming what was looked for.
Dataset load_dataset(const std::string& name, const std::string& path, bool train, int image_size = 0);

// Requires the test split to have the training split's geometry (channels, height, width and
// classes): a model built for one cannot read the other. Error(invalid_argument) naming both
// splits' sources and shapes.
void check_same_geometry(const Dataset& train, const Dataset& test);

// Augmentation applied to every image a Loader produces, in this order:
//   1. In memory: pad > 0: zero-pad each side by `pad` pixels (value 0 in pixel space, as
//      torchvision's RandomCrop(padding) does) and crop a random HxW window: offsets uniform in
//      [0, 2*pad].
//      File-backed (pad must be 0), the JPEG becomes an HxW RGB image (H, W = the dataset's
//      height and width) by one of:
//      - random_resized_crop: torchvision's RandomResizedCrop(size, scale, ratio): up to 10
//        draws of an area fraction uniform in [scale_min, scale_max] and a log-uniform aspect
//        ratio (width/height) in [ratio_min, ratio_max]; the first window that fits is placed
//        uniformly; else the central crop with the ratio clamped to the range. The window is
//        resized to HxW (bilinear).
//      - otherwise (evaluation): Resize(resize) then CenterCrop(H, W): the shorter side is
//        scaled to `resize` (0: min(H, W) * 256 / 224 rounded down, 256 for 224), the longer in
//        proportion (rounded down), then the centre HxW window is taken.
//      The JPEG is decoded at the smallest DCT scale (1/8, 1/4, 1/2 or 1) at which the window
//      still has at least HxW pixels, then the window is resampled bilinearly (no antialias).
//   2. hflip: mirror the image left-right with probability 1/2.
//   3. normalise: x = (pixel/255 - mean[c]) / stddev[c]. mean and stddev are per channel; each
//      is either empty (mean 0, stddev 1: plain pixel/255) or has exactly `channels` entries.
struct AugmentOptions {
  int pad = 0;
  bool hflip = false;
  std::vector<float> mean, stddev;
  // File-backed datasets only.
  bool random_resized_crop = false;
  float scale_min = 0.08f, scale_max = 1.0f;
  float ratio_min = 3.0f / 4.0f, ratio_max = 4.0f / 3.0f;
  int resize = 0;
};

// The torchvision ImageNet recipe for a file-backed dataset: train = RandomResizedCrop +
// hflip, otherwise resize + center crop; both normalised with the ImageNet mean
// (0.485, 0.456, 0.406) and stddev (0.229, 0.224, 0.225).
AugmentOptions image_folder_augment(bool train);

// One batch as produced by Loader::next().
struct Batch {
  // nChw16c: [batch][ceil(C/16)][H][W][16] floats; padding lanes (c >= C) are zero. When
  // size < the loader's batch size, the images past `size` are all zero.
  const float* images = nullptr;
  // batch entries; entries past `size` are -1 (never a valid class).
  const int32_t* labels = nullptr;
  // Images in this batch: the loader's batch size, except possibly the last batch of an epoch
  // when drop_last is false.
  int size = 0;
};

// Prefetching batch loader.
//
// A background producer thread decodes and augments the batches ahead of the consumer, using
// ctx.threads() threads, or `threads` when > 0 (a oneTBB arena of its own, so that it never
// queues work inside the training step's parallel loops), into a ring of preallocated buffers.
// The thread count changes no batch. Everything is allocated in the constructor; producing a
// batch of an in-memory dataset allocates nothing (a file-backed one reads and decodes each JPEG
// into per-thread buffers that are reused; a file that cannot be read or decoded, libjpeg
// warnings included (a truncated file is never padded with grey), is Error(io_error or
// corrupt_data) naming the dataset, the sample index, its class, the file and what was expected,
// rethrown by next()).
//
// Usage:  for (int e = 0; e < epochs; ++e) { loader.start_epoch(e); Batch b;
//                                            while (loader.next(b)) train_step(b); }
//
// The Dataset is referenced, not copied: it must outlive the Loader and must not change while
// the Loader exists. next() and start_epoch() are to be called from one thread.
class Loader {
 public:
  Loader(const Context& ctx, const Dataset& d, int batch, bool shuffle, bool drop_last,
         AugmentOptions aug, uint64_t seed, int threads = 0);
  // A temporary Dataset would dangle: keep the Dataset in a variable that outlives the Loader.
  Loader(const Context& ctx, Dataset&& d, int batch, bool shuffle, bool drop_last, AugmentOptions aug,
         uint64_t seed, int threads = 0) = delete;
  ~Loader();  // stops the producer, also in the middle of an epoch
  Loader(Loader&&) noexcept;
  Loader& operator=(Loader&&) noexcept;
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Images per batch this loader returns: the constructor's batch, or its part (set_shard).
  int batch_size() const noexcept;
  int batches_per_epoch() const noexcept;

  // Data-parallel training: this loader returns part `part` of `parts` equal parts of each batch
  // of the epoch's order (batch / parts images from position part * batch / parts of the batch),
  // so that the parts of all ranks are disjoint and together are the batches a lone loader
  // returns, whatever `parts` is; batches_per_epoch() is unchanged. A short last batch (without
  // drop_last) leaves the later parts short or empty (Batch::size 0). Before the first
  // start_epoch(); `batch` must divide by `parts` (Error(invalid_argument) naming both otherwise).
  void set_shard(int part, int parts);

  // Begins epoch `epoch` (>= 0): the shuffle order and augmentation draws are those of
  // (seed, epoch). May be called in the middle of an epoch: the rest of it is dropped. Resets
  // data_wait_seconds(). Invalidates the pointers of the last Batch.
  void start_epoch(int epoch);

  // The next batch of the current epoch; false once the epoch has been consumed. The Batch's
  // pointers stay valid until the next call to next() or start_epoch(). Calling next() before
  // the first start_epoch() is Error(invalid_argument). An error in the producer is rethrown here.
  bool next(Batch& out);

  // Seconds next() spent blocked waiting for the producer since the last start_epoch(): near
  // zero when the pipeline keeps up with the training step.
  double data_wait_seconds() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dfp
