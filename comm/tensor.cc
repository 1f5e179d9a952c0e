#include "comm/tensor.h"

#include "absl/strings/str_cat.h"

namespace braid {

std::string Device::ToString() const {
  if (type == DeviceType::kCpu) return "cpu";
  return absl::StrCat("cuda:", index);
}

}  // namespace braid
