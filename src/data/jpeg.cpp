// JPEG decoding with DCT scaling, and the RandomResizedCrop / Resize + CenterCrop geometry.
#include "src/data/jpeg.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "dfp/data.hpp"
#include "dfp/status.hpp"
#include "base/random.hpp"

namespace dfp::jpeg {

namespace {

// Larger files or images are refused before anything is sized from them: no photograph comes
// near, a corrupt or hostile header could.
constexpr uint64_t kMaxFileBytes = uint64_t(1) << 30;
constexpr uint64_t kMaxPixels = uint64_t(1) << 28;

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

// The decoder's factors 1/8, 1/4, 1/2, 1/1, ascending. libjpeg-turbo also offers 3/8, 5/8, 6/8
// and 7/8, but its inverse DCTs for those are plain C: on a 500x375 4:2:0 JPEG, 5/8 to 7/8 take
// 1.3 to 1.9 times as long as the SIMD full-size decode, and 3/8 longer than 1/2.
const std::vector<Scale>& downscale_factors() {
  static const std::vector<Scale> factors = [] {
    std::vector<Scale> f;
    int n = 0;
    const tjscalingfactor* sf = tjGetScalingFactors(&n);
    auto power_of_two_fraction = [](tjscalingfactor x) {
      if (x.num <= 0 || x.num > x.denom || x.denom % x.num != 0) return false;
      const int q = x.denom / x.num;
      return q <= 8 && (q & (q - 1)) == 0;
    };
    for (int i = 0; sf && i < n; ++i)
      if (power_of_two_fraction(sf[i])) f.push_back(Scale{sf[i].num, sf[i].denom});
    std::sort(f.begin(), f.end(), [](Scale a, Scale b) { return a.num * b.denom < b.num * a.denom; });
    if (f.empty() || f.back().num != f.back().denom) f.push_back(Scale{1, 1});
    return f;
  }();
  return factors;
}

// What a file that is not a JPEG probably is, from its first bytes.
std::string guess_format(const uint8_t* p, size_t n) {
  auto starts = [&](const char* magic, size_t len) { return n >= len && std::memcmp(p, magic, len) == 0; };
  if (starts("\x89PNG", 4)) return " (a PNG file)";
  if (starts("GIF8", 4)) return " (a GIF file)";
  if (starts("BM", 2)) return " (a BMP file?)";
  if (starts("RIFF", 4) && n >= 12 && std::memcmp(p + 8, "WEBP", 4) == 0) return " (a WebP file)";
  if (starts("II*\0", 4) || starts("MM\0*", 4)) return " (a TIFF file)";
  if (starts("<", 1)) return " (text: HTML or XML?)";
  return "";
}

}  // namespace

int scaled_size(int n, Scale s) noexcept { return int((int64_t(n) * s.num + s.denom - 1) / s.denom); }

Box random_resized_crop(int height, int width, const AugmentOptions& a, uint64_t key) {
  const double area = double(height) * width;
  const double log_r0 = std::log(double(a.ratio_min)), log_r1 = std::log(double(a.ratio_max));
  for (int attempt = 0; attempt < 10; ++attempt) {
    const uint64_t k = key + kDrawResizedCrop + 4 * uint64_t(attempt);
    const double target = area * (a.scale_min + (double(a.scale_max) - a.scale_min) * uniform01(mix64(k)));
    const double aspect = std::exp(log_r0 + (log_r1 - log_r0) * uniform01(mix64(k + 1)));
    // Python's round(): half to even, as std::nearbyint in the default rounding mode.
    const double w = std::nearbyint(std::sqrt(target * aspect));
    const double h = std::nearbyint(std::sqrt(target / aspect));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const int hi = int(h), wi = int(w);
      const int y = int(uniform_below(mix64(k + 2), uint32_t(height - hi + 1)));
      const int x = int(uniform_below(mix64(k + 3), uint32_t(width - wi + 1)));
      return Box{double(y), double(x), h, w};
    }
  }
  // Fallback: the central crop, its aspect ratio clamped to the range.
  const double in_ratio = double(width) / height;
  int w = width, h = height;
  if (in_ratio < a.ratio_min)
    h = std::min(height, int(std::nearbyint(w / double(a.ratio_min))));
  else if (in_ratio > a.ratio_max)
    w = std::min(width, int(std::nearbyint(h * double(a.ratio_max))));
  return Box{double((height - h) / 2), double((width - w) / 2), double(h), double(w)};
}

Box resize_center_crop(int height, int width, int resize, int out_h, int out_w) {
  // torchvision Resize(int): the shorter side becomes `resize`, the longer
  // int(resize * long / short), rounded down.
  int rh = resize, rw = resize;
  if (width <= height)
    rh = int(int64_t(resize) * height / width);
  else
    rw = int(int64_t(resize) * width / height);
  // CenterCrop: top = int(round((rh - out_h) / 2.0)), round half to even.
  const double top = std::nearbyint((rh - out_h) / 2.0), left = std::nearbyint((rw - out_w) / 2.0);
  const double fy = double(height) / rh, fx = double(width) / rw;
  return Box{top * fy, left * fx, out_h * fy, out_w * fx};
}

Scale choose_scale(int height, int width, const Box& box, int out_h, int out_w) {
  const auto& factors = downscale_factors();
  Scale pick = factors.back();
  for (const Scale& f : factors)
    if (box.h * f.num >= out_h * double(f.denom) - 1e-9 && box.w * f.num >= out_w * double(f.denom) - 1e-9) {
      pick = f;
      break;
    }
  // tjDecompress2 is asked for a size and picks the largest factor producing it; take that one,
  // so that the geometry here is the decoder's.
  const int sh = scaled_size(height, pick), sw = scaled_size(width, pick);
  for (auto it = factors.rbegin(); it != factors.rend(); ++it)
    if (scaled_size(height, *it) == sh && scaled_size(width, *it) == sw) return *it;
  return pick;
}

Decoder::Decoder() {
  handle_ = tjInitDecompress();
  DFP_CHECK(handle_ != nullptr, Status::internal,
            std::string("TurboJPEG: cannot create a decompressor: ") + tjGetErrorStr2(nullptr));
}

Decoder::~Decoder() {
  if (handle_) tjDestroy(static_cast<tjhandle>(handle_));
}

void Decoder::read_file(const std::string& path) {
  path_ = path;
  width_ = height_ = 0;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DFP_CHECK(fd >= 0, Status::io_error, in_quotes(path) + ": cannot open: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st{};
  DFP_CHECK(::fstat(fd, &st) == 0, Status::io_error, in_quotes(path) + ": cannot stat: " + std::strerror(errno));
  DFP_CHECK(S_ISREG(st.st_mode), Status::io_error, in_quotes(path) + ": not a regular file, expected a JPEG file");
  const uint64_t size = uint64_t(st.st_size);
  DFP_CHECK(size > 0, Status::corrupt_data, in_quotes(path) + ": empty file, expected a JPEG image");
  DFP_CHECK(size <= kMaxFileBytes, Status::corrupt_data,
            in_quotes(path) + ": " + std::to_string(size) + " bytes, expected a JPEG file of at most 1 GiB");
  file_.resize(size_t(size));
  size_t done = 0;
  while (done < size) {
    const ssize_t r = ::read(fd, file_.data() + done, size_t(size) - done);
    if (r < 0 && errno == EINTR) continue;
    DFP_CHECK(r >= 0, Status::io_error, in_quotes(path) + ": read failed: " + std::strerror(errno));
    DFP_CHECK(r > 0, Status::io_error,
              in_quotes(path) + ": the file ended after " + std::to_string(done) + " of its " +
                  std::to_string(size) + " bytes while it was read (did it change?)");
    done += size_t(r);
  }
  parse_header();
}

void Decoder::set_data(const uint8_t* data, size_t size, const std::string& name) {
  path_ = name;
  width_ = height_ = 0;
  DFP_CHECK(size > 0, Status::corrupt_data, in_quotes(name) + ": empty file, expected a JPEG image");
  file_.assign(data, data + size);
  parse_header();
}

void Decoder::parse_header() {
  const uint8_t* p = file_.data();
  const size_t n = file_.size();
  if (n < 2 || p[0] != 0xFF || p[1] != 0xD8) {
    char got[16];
    std::snprintf(got, sizeof got, n >= 2 ? "%02X %02X" : "%02X", p[0], n >= 2 ? p[1] : 0);
    dfp::fail(Status::corrupt_data, in_quotes(path_) + ": not a JPEG file: it starts with bytes " + got +
                                        guess_format(p, n) + ", expected the JPEG start-of-image marker FF D8");
  }
  int w = 0, h = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(static_cast<tjhandle>(handle_), p, static_cast<unsigned long>(n), &w, &h, &subsamp,
                          &colorspace) != 0)
    fail_decode("header");
  DFP_CHECK(w >= 1 && h >= 1 && uint64_t(w) * uint64_t(h) <= kMaxPixels, Status::corrupt_data,
            in_quotes(path_) + ": JPEG header declares " + std::to_string(w) + "x" + std::to_string(h) +
                " pixels, expected at least 1x1 and at most 2^28 pixels");
  width_ = w;
  height_ = h;
  // libjpeg converts YCbCr and grayscale to RGB itself, but CMYK and YCCK only to CMYK.
  cmyk_ = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
}

void Decoder::fail_decode(const char* stage) const {
  tjhandle h = static_cast<tjhandle>(handle_);
  const bool warning = tjGetErrorCode(h) == TJERR_WARNING;
  const char* msg = tjGetErrorStr2(h);
  dfp::fail(Status::corrupt_data,
            in_quotes(path_) + ": corrupt or truncated JPEG " + stage + " (libjpeg " + (warning ? "warning" : "error") +
                ": " + (msg ? msg : "unknown") + "); expected a complete, valid JPEG image");
}

void Decoder::decode(Scale s) {
  DFP_CHECK(width_ > 0, Status::internal, "jpeg::Decoder::decode before a successful read_file/set_data");
  dw_ = scaled_size(width_, s);
  dh_ = scaled_size(height_, s);
  scale_ = s;
  const size_t pixels = size_t(dw_) * size_t(dh_);
  rgb_.resize(pixels * 3);
  tjhandle h = static_cast<tjhandle>(handle_);
  // Every warning stops decoding and fails: libjpeg would otherwise fill the rest of a
  // truncated image with grey and call it a success.
  const int flags = TJFLAG_STOPONWARNING;
  if (!cmyk_) {
    if (tjDecompress2(h, file_.data(), static_cast<unsigned long>(file_.size()), rgb_.data(), dw_, 0, dh_, TJPF_RGB,
                      flags) != 0)
      fail_decode("data");
    return;
  }
  cmyk_buf_.resize(pixels * 4);
  if (tjDecompress2(h, file_.data(), static_cast<unsigned long>(file_.size()), cmyk_buf_.data(), dw_, 0, dh_,
                    TJPF_CMYK, flags) != 0)
    fail_decode("data");
  // libjpeg returns CMYK JPEGs inverted (Adobe convention: 255 = no ink), so the naive
  // conversion R = C * K / 255 (that of TurboJPEG's own tjSaveImage, and of Pillow) applies.
  const uint8_t* src = cmyk_buf_.data();
  uint8_t* dst = rgb_.data();
  for (size_t i = 0; i < pixels; ++i, src += 4, dst += 3) {
    const unsigned k = src[3];
    dst[0] = uint8_t((src[0] * k + 127) / 255);
    dst[1] = uint8_t((src[1] * k + 127) / 255);
    dst[2] = uint8_t((src[2] * k + 127) / 255);
  }
}

void Decoder::crop_resize(const Box& box, int out_h, int out_w, uint8_t* dst) {
  // Weights in fixed point, 10 fractional bits (positions to 1/1024 of a decoded pixel): integer
  // arithmetic, exact and fast; a value is at most 255 * 2^20 < 2^31.
  constexpr int kBits = 10, kOne = 1 << kBits;
  const double f = double(scale_.num) / scale_.denom;
  auto source = [&](double start, double extent, int out, int i, int limit, int& i0, int& i1, int& w1) {
    double v = (start + (i + 0.5) * extent / out) * f - 0.5;
    v = std::clamp(v, 0.0, double(limit - 1));
    i0 = int(v);  // v >= 0: truncation is floor
    i1 = std::min(i0 + 1, limit - 1);
    w1 = int(std::lround((v - i0) * kOne));
  };
  x0_.resize(size_t(out_w));
  x1_.resize(size_t(out_w));
  xw_.resize(size_t(out_w));
  for (int x = 0; x < out_w; ++x) {
    int a, b, w;
    source(box.x, box.w, out_w, x, dw_, a, b, w);
    x0_[size_t(x)] = a * 3;
    x1_[size_t(x)] = b * 3;
    xw_[size_t(x)] = w;
  }
  const size_t stride = size_t(dw_) * 3;
  for (int y = 0; y < out_h; ++y) {
    int y0, y1, wy;
    source(box.y, box.h, out_h, y, dh_, y0, y1, wy);
    const uint8_t* r0 = rgb_.data() + size_t(y0) * stride;
    const uint8_t* r1 = rgb_.data() + size_t(y1) * stride;
    uint8_t* out = dst + size_t(y) * out_w * 3;
    for (int x = 0; x < out_w; ++x) {
      const int a = x0_[size_t(x)], b = x1_[size_t(x)], wx = xw_[size_t(x)];
      for (int c = 0; c < 3; ++c) {
        const int top = int(r0[a + c]) * kOne + wx * (int(r0[b + c]) - int(r0[a + c]));
        const int bot = int(r1[a + c]) * kOne + wx * (int(r1[b + c]) - int(r1[a + c]));
        out[x * 3 + c] = uint8_t((top * kOne + wy * (bot - top) + (1 << (2 * kBits - 1))) >> (2 * kBits));
      }
    }
  }
}

}  // namespace dfp::jpeg
