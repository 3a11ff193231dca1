// TensorSpec: a tensor a model needs, by its Hugging Face name, with the shape its config
// implies. Its own header so that config.h and vision_config.h can both use it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kuiper {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

}  // namespace kuiper
