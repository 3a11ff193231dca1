// Rotary embedding in place, rotate-half form: pair (i, i + d/2) of token t turns by
// positions[t] * inv_freq[i], cos and sin times the attention factor.
#include <vector>

#include "kuiper/op/kernels/cpu/cpu_kernels.h"
#include "kuiper/op/kernels/cpu/rotate_heads.h"

namespace kuiper::cpu {

void rope(Tensor& x, const Tensor& positions, const op::RopeParams& rope) {
  const int64_t d = x.dim(2);
  std::vector<float> inv_freq(static_cast<size_t>(d / 2));
  rope_inv_freqs(rope, d, d / 2, inv_freq.data());
  const int32_t* pos = positions.data<int32_t>();
  rotate_heads(x, static_cast<float>(rope.attention_factor), [&](int64_t t, int64_t i) {
    return static_cast<float>(pos[t]) * inv_freq[i];
  });
}

}  // namespace kuiper::cpu
