// The loop every CPU rope kernel shares (rope, mrope, rope_2d): each head of x [T, heads, d]
// rotated in place, rotate-half form, pair (i, i + d/2) of token t by angle_of(t, i), cos and sin
// times `scale` (YaRN's attention factor, else 1). cos and sin are taken once per (token,
// frequency) and shared by the heads.
#pragma once

#include <cmath>

#include "kuiper/op/kernels/rope_math.h"
#include "kuiper/tensor/tensor.h"

namespace kuiper::cpu {

template <typename AngleOf>
void rotate_heads(Tensor& x, float scale, AngleOf angle_of) {
  const int64_t T = x.dim(0), heads = x.dim(1), d = x.dim(2), half = d / 2;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = angle_of(t, i);
      const float c = std::cos(angle) * scale, s = std::sin(angle) * scale;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x.data<float>() + (t * heads + h) * d;
        const RotatedPair r = rotate_half(v[i], v[i + half], c, s);
        v[i] = r.first;
        v[i + half] = r.second;
      }
    }
  }
}

}  // namespace kuiper::cpu
