// The model builder's argument rules: a builder argument outside what its layer kind accepts is
// refused before the layer exists, so that a zero stride or a negative size never reaches a
// division or an allocation. Messages name the model, the layer kind and name, the field, what was
// expected and what came.
#pragma once

#include <string>

namespace dfp::model {

class LayerArgs {
 public:
  LayerArgs(const std::string& model, const char* kind, const std::string& layer);
  void need(bool ok, const char* field, const std::string& expected, const std::string& got) const;
  void need_int(bool ok, const char* field, const char* expected, long long got) const;
  // The window, stride and padding of a convolution or pooling layer (PyTorch's rules: padding at
  // most half the window for pooling, whose padded positions never win a max or are averaged).
  void window(int kernel, int stride, int pad, bool pool) const;

 private:
  std::string where_;  // "model 'm': conv 'c1'"
};

}  // namespace dfp::model
