// Interleaved multimodal RoPE (Qwen3-VL), CPU reference: rope() with each frequency's position
// taken from the t, h or w row of positions [3, T].
#include <cmath>

#include "kuiper/op/kernels/cpu/cpu_kernels.h"
#include "kuiper/op/kernels/mrope_axes.h"

namespace kuiper::cpu {

void mrope(Tensor& x, const Tensor& positions, double theta,
           const std::vector<int64_t>& sections) {
  const int64_t T = x.dim(0), heads = x.dim(1), d = x.dim(2), half = d / 2;
  const std::vector<uint8_t> axes = op::mrope_axes(half, sections);
  // fp32 inv_freq and angles, as Hugging Face computes them (and as rope() does).
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] = 1.0f / std::pow(static_cast<float>(theta),
                                  static_cast<float>(2 * i) / static_cast<float>(d));
  }
  const int32_t* pos = positions.data<int32_t>();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float p = static_cast<float>(pos[axes[static_cast<size_t>(i)] * T + t]);
      const float angle = p * inv_freq[i];
      const float c = std::cos(angle), s = std::sin(angle);
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x.data<float>() + (t * heads + h) * d;
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
      }
    }
  }
}

}  // namespace kuiper::cpu
