// The frequencies of the 2-D vision rotary embedding, shared by the CPU and CUDA kernels so both
// turn by the same fp32 angles.
#pragma once

#include <cmath>
#include <cstdint>

namespace kuiper {

// Frequency j in [0, d/4) of a head of dim d: 1 / theta^(2j / (d/2)), in fp32 the way Hugging
// Face's VisionRotaryEmbedding(head_dim / 2) builds inv_freq.
inline float rope_2d_inv_freq(double theta, int64_t d, int64_t j) {
  return 1.0f / std::pow(static_cast<float>(theta),
                         static_cast<float>(2 * j) / static_cast<float>(d / 2));
}

}  // namespace kuiper
