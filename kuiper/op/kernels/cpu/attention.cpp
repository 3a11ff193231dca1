// Exact causal grouped-query attention, the reference every GPU variant is tested against.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kuiper/op/kernels/cpu/cpu_kernels.h"

namespace kuiper::cpu {

void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, Tensor& out,
               int64_t start) {
  const int64_t T = q.dim(0), heads = q.dim(1), d = q.dim(2);
  const int64_t kv_heads = k_cache.dim(1), group = heads / kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
#pragma omp parallel
  {
    std::vector<float> scores(static_cast<size_t>(start + T));
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t kvh = h / group, len = start + t + 1;
        const float* qv = q.data<float>() + (t * heads + h) * d;
        float max_score = -INFINITY;
        for (int64_t j = 0; j < len; ++j) {
          const float* kv = k_cache.data<float>() + (j * kv_heads + kvh) * d;
          float s = 0.0f;
          for (int64_t i = 0; i < d; ++i) s += qv[i] * kv[i];
          scores[j] = s * scale;
          max_score = std::max(max_score, scores[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < len; ++j) {
          scores[j] = std::exp(scores[j] - max_score);
          sum += scores[j];
        }
        float* o = out.data<float>() + (t * heads + h) * d;
        std::fill(o, o + d, 0.0f);
        for (int64_t j = 0; j < len; ++j) {
          const float p = scores[j] / sum;
          const float* vv = v_cache.data<float>() + (j * kv_heads + kvh) * d;
          for (int64_t i = 0; i < d; ++i) o[i] += p * vv[i];
        }
      }
    }
  }
}

}  // namespace kuiper::cpu
