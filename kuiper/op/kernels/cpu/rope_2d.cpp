// 2-D rotary embedding of image patches in place: pair (i, i + d/2) turns by row * f(i) for
// i < d/4 and by col * f(i - d/4) after, f the rope frequencies over d/2 channels.
#include <vector>

#include "kuiper/op/kernels/cpu/cpu_kernels.h"
#include "kuiper/op/kernels/cpu/rotate_heads.h"

namespace kuiper::cpu {

void rope_2d(Tensor& x, const Tensor& positions, double theta) {
  const int64_t d = x.dim(2), quarter = d / 4;
  std::vector<float> inv_freq(static_cast<size_t>(quarter));
  rope_inv_freqs(theta, d / 2, quarter, inv_freq.data());
  const int32_t* pos = positions.data<int32_t>();
  rotate_heads(x, 1.0f, [&](int64_t t, int64_t i) {
    const float row = static_cast<float>(pos[2 * t]);
    const float col = static_cast<float>(pos[2 * t + 1]);
    return i < quarter ? row * inv_freq[i] : col * inv_freq[i - quarter];
  });
}

}  // namespace kuiper::cpu
