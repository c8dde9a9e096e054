// The name tables between dfp's zoo and torchvision, one per model family (torch_names.cpp).
#pragma once

#include <string>
#include <vector>

namespace dfp::torch_format {

struct NameTable {
  const char* family;
  bool (*covers)(const std::string& architecture);
  // dfp tensor name -> torchvision's; nullptr where the names match exactly.
  std::string (*to_torch)(const std::string& architecture, const std::string& name);
  // torchvision tensors that have no dfp counterpart (glob patterns), ignored on loading.
  std::vector<std::string> torch_only;
  // Said with a strict load's error ("" for none).
  const char* hint;
};

// The table of `architecture` (a zoo name); names match exactly for one that no table covers.
const NameTable& name_table(const std::string& architecture);

}  // namespace dfp::torch_format
