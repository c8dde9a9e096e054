// Fuzz target: JPEG decoding and the crop paths of file-backed datasets: the header, then the
// evaluation crop (resize + centre crop) and a RandomResizedCrop window, each decoded at the
// scale chosen for a 32x32 output. A bad file must throw dfp::Error.
#include <vector>

#include "dfp/data.hpp"
#include "dfp/status.hpp"
#include "src/data/jpeg.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static dfp::jpeg::Decoder decoder;
  std::vector<uint8_t> out(32 * 32 * 3);
  try {
    decoder.set_data(data, size, "fuzz input");
    const int h = decoder.height(), w = decoder.width();
    decoder.render(dfp::jpeg::resize_center_crop(h, w, 36, 32, 32), 32, 32, out.data());
    dfp::AugmentOptions a = dfp::image_folder_augment(true);
    decoder.render(dfp::jpeg::random_resized_crop(h, w, a, size), 32, 32, out.data());
  } catch (const dfp::Error&) {
  }
  return 0;
}
