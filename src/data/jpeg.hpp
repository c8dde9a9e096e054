// JPEG decoding (libjpeg-turbo's TurboJPEG API) and the crop geometry of file-backed datasets.
// Internal to dfp: the public API (include/dfp/data.hpp) never shows a libjpeg type.
//
// Geometry. A crop window (Box) is chosen in the coordinates of the original image, where pixel k
// covers [k, k + 1). The JPEG is then decoded at a DCT scale factor f (1/8, 1/4, 1/2, 1), at which
// original coordinate u is decoded coordinate u * f, and output pixel (y, x) of an out_h x
// out_w image samples the decoded image bilinearly at the centre of its share of the window:
//   v = (box.y + (y + 0.5) * box.h / out_h) * f - 0.5, clamped to [0, decoded height - 1]
// (likewise for x), which is torchvision's resized_crop with antialias=False.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dfp {

struct AugmentOptions;

namespace jpeg {

// A window of the original image, in its pixel coordinates (fractional for resize + crop).
struct Box {
  double y = 0, x = 0, h = 0, w = 0;
};

// torchvision's RandomResizedCrop.get_params(height x width image, scale, ratio) with the
// random numbers mix64(key + kDrawResizedCrop + 4 * attempt + k), k = 0..3 (counter_rng.hpp).
// The window is whole pixels.
Box random_resized_crop(int height, int width, const AugmentOptions& a, uint64_t key);

// Resize(resize) then CenterCrop(out_h, out_w) of a height x width image, as the window of the
// original image that the output covers. Requires resize >= max(out_h, out_w).
Box resize_center_crop(int height, int width, int resize, int out_h, int out_w);

// A DCT scaling factor of the decoder; the decoded size of a side of n pixels is
// ceil(n * num / denom).
struct Scale {
  int num = 1, denom = 1;
};
int scaled_size(int n, Scale s) noexcept;

// The smallest of 1/8, 1/4, 1/2, 1/1 at which the window still covers at least
// out_h x out_w decoded pixels (1/1 when even the full size does not: the window is upsampled).
// Of factors giving the same decoded size of a height x width image, the largest (the one the
// decoder itself picks for that size).
Scale choose_scale(int height, int width, const Box& box, int out_h, int out_w);

// One thread's decoder: a TurboJPEG handle and buffers reused from image to image.
class Decoder {
 public:
  Decoder();
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // Reads the whole file into the decoder and parses its JPEG header. Throws dfp::Error naming
  // the file: io_error when it cannot be read, corrupt_data when it is empty, not a JPEG (no
  // FF D8 start-of-image marker) or has a corrupt header.
  void read_file(const std::string& path);
  // The same from bytes in memory; `name` stands for the file in error messages.
  void set_data(const uint8_t* data, size_t size, const std::string& name);

  int width() const noexcept { return width_; }
  int height() const noexcept { return height_; }
  bool cmyk() const noexcept { return cmyk_; }

  // Decodes the whole image at factor s into packed RGB (3 bytes per pixel). Any libjpeg error
  // or warning (a truncated or corrupt file) is Error(corrupt_data) naming the file.
  void decode(Scale s);
  const uint8_t* rgb() const noexcept { return rgb_.data(); }
  int decoded_width() const noexcept { return dw_; }
  int decoded_height() const noexcept { return dh_; }
  Scale decoded_scale() const noexcept { return scale_; }

  // Resamples `box` of the last decoded image to out_h x out_w packed RGB at dst (bilinear).
  void crop_resize(const Box& box, int out_h, int out_w, uint8_t* dst);

  // The common path: choose the scale for `box`, decode, crop_resize.
  void render(const Box& box, int out_h, int out_w, uint8_t* dst) {
    decode(choose_scale(height_, width_, box, out_h, out_w));
    crop_resize(box, out_h, out_w, dst);
  }

 private:
  void parse_header();
  [[noreturn]] void fail_decode(const char* stage) const;

  void* handle_ = nullptr;  // tjhandle
  std::string path_;
  std::vector<uint8_t> file_, rgb_, cmyk_buf_;
  int width_ = 0, height_ = 0, dw_ = 0, dh_ = 0;
  bool cmyk_ = false;
  Scale scale_;
  std::vector<int32_t> x0_, x1_;  // crop_resize: per output column, byte offsets in a row
  std::vector<int32_t> xw_;       // and the weight of x1_ (fixed point)
};

}  // namespace jpeg
}  // namespace dfp
