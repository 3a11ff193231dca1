// The rotary-embedding arithmetic of every rope kernel (rope, mrope, rope_2d and the fused
// qk_norm_rope_cache, on the CPU and on CUDA), written once so that all of them turn by the same
// fp32 angles and rotate the same way. Hugging Face computes inv_freq and the angles in fp32;
// so do we, to match its rounding.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kuiper/op/kernels/host_device.h"
#include "kuiper/op/rope_params.h"

namespace kuiper {

// Frequency i of a rotation over `dim` channels: 1 / theta^(2i / dim) in fp32, as Hugging Face
// builds inv_freq. dim is head_dim for the text rope and M-RoPE, head_dim / 2 for the vision
// 2-D rope (VisionRotaryEmbedding(head_dim / 2): each of its two axes turns a quarter of the
// channels). Host only: device powf may differ from the host's by an ulp, so the CUDA kernels
// take the host's table as a kernel parameter (baked into a captured graph at no cost).
inline float rope_inv_freq(double theta, int64_t dim, int64_t i) {
  return 1.0f / std::pow(static_cast<float>(theta),
                         static_cast<float>(2 * i) / static_cast<float>(dim));
}

// Frequency i of `p` over `dim` channels. YaRN blends the extrapolated frequency (the one above)
// and the interpolated one (divided by factor) by a ramp in i, each step rounded to fp32 in
// transformers' order (_compute_yarn_parameters).
inline float rope_inv_freq(const op::RopeParams& p, int64_t dim, int64_t i) {
  if (p.scaling == op::RopeScaling::kNone) return rope_inv_freq(p.theta, dim, i);
  const float pos_freq = std::pow(static_cast<float>(p.theta),
                                  static_cast<float>(2 * i) / static_cast<float>(dim));
  const float extrapolation = 1.0f / pos_freq;
  const float interpolation = 1.0f / (static_cast<float>(p.factor) * pos_freq);
  const float ramp = (static_cast<float>(i) - static_cast<float>(p.low)) /
                     static_cast<float>(p.high - p.low);
  const float keep = 1.0f - std::min(std::max(ramp, 0.0f), 1.0f);  // extrapolation's share
  return interpolation * (1.0f - keep) + extrapolation * keep;
}

// out[i] = rope_inv_freq(p, dim, i) for i in [0, n).
inline void rope_inv_freqs(const op::RopeParams& p, int64_t dim, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = rope_inv_freq(p, dim, i);
}

struct RotatedPair {
  float first, second;
};

// Rotate-half: the channel pair (x[i], x[i + d/2]) = (a, b) turned by the angle whose cosine is
// c and sine s, i.e. x * cos + rotate_half(x) * sin with rotate_half(x) = (-b, a).
inline KUIPER_HOST_DEVICE RotatedPair rotate_half(float a, float b, float c, float s) {
  return {a * c - b * s, b * c + a * s};
}

}  // namespace kuiper
