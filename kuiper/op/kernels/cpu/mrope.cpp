// Interleaved multimodal RoPE (Qwen3-VL), CPU reference: rope() with each frequency's position
// taken from the t, h or w row of positions [3, T].
#include <vector>

#include "kuiper/op/kernels/cpu/cpu_kernels.h"
#include "kuiper/op/kernels/cpu/rotate_heads.h"
#include "kuiper/op/kernels/mrope_axes.h"

namespace kuiper::cpu {

void mrope(Tensor& x, const Tensor& positions, const op::RopeParams& rope,
           const std::vector<int64_t>& sections) {
  const int64_t T = x.dim(0), d = x.dim(2), half = d / 2;
  const std::vector<uint8_t> axes = op::mrope_axes(half, sections);
  std::vector<float> inv_freq(static_cast<size_t>(half));
  rope_inv_freqs(rope, d, half, inv_freq.data());
  const int32_t* pos = positions.data<int32_t>();
  rotate_heads(x, static_cast<float>(rope.attention_factor), [&](int64_t t, int64_t i) {
    return static_cast<float>(pos[axes[static_cast<size_t>(i)] * T + t]) * inv_freq[i];
  });
}

}  // namespace kuiper::cpu
