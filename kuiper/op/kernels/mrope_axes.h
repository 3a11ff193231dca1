// Qwen3-VL's interleaved multimodal RoPE layout, shared by the CPU and CUDA kernels: which
// position axis (0 = t, 1 = h, 2 = w) rotary frequency i reads. Frequencies 1, 4, 7, ... below
// 3 * sections[1] take h, frequencies 2, 5, 8, ... below 3 * sections[2] take w, the rest t.
#pragma once

#include <cstdint>
#include <vector>

namespace kuiper::op {

inline std::vector<uint8_t> mrope_axes(int64_t half, const std::vector<int64_t>& sections) {
  std::vector<uint8_t> axes(static_cast<size_t>(half), 0);
  for (int64_t i = 0; i < half; ++i) {
    if (i % 3 == 1 && i < 3 * sections[1]) axes[static_cast<size_t>(i)] = 1;
    if (i % 3 == 2 && i < 3 * sections[2]) axes[static_cast<size_t>(i)] = 2;
  }
  return axes;
}

}  // namespace kuiper::op
