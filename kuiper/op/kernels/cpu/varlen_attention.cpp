// Bidirectional attention over packed sequences (the vision tower's), reference: fp32
// activations, the softmax and the weighted sum in double, so this stays the exact side of
// every comparison.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kuiper/op/kernels/cpu/cpu_kernels.h"

namespace kuiper::cpu {

void varlen_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                      int64_t heads, Tensor& out) {
  const int64_t T = q.dim(0), width = q.dim(1), d = width / heads;
  const int32_t* cu = cu_seqlens.data<int32_t>();
  const int64_t S = cu_seqlens.numel() - 1;
  // The sequence of each token (ops.cpp has checked cu_seqlens).
  std::vector<int64_t> seq_of(static_cast<size_t>(T));
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t t = cu[s]; t < cu[s + 1]; ++t) seq_of[t] = s;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const float* Q = q.data<float>();
  const float* K = k.data<float>();
  const float* V = v.data<float>();
  float* O = out.data<float>();
#pragma omp parallel
  {
    std::vector<float> scores;
    std::vector<double> acc(static_cast<size_t>(d));
#pragma omp for schedule(dynamic, 4) collapse(2)
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t begin = cu[seq_of[t]], end = cu[seq_of[t] + 1];
        const float* qr = Q + t * width + h * d;
        scores.assign(static_cast<size_t>(end - begin), 0.0f);
        float max_score = -INFINITY;
        for (int64_t j = begin; j < end; ++j) {
          const float* kr = K + j * width + h * d;
          float dot = 0.0f;
          for (int64_t c = 0; c < d; ++c) dot += qr[c] * kr[c];
          scores[j - begin] = dot * scale;
          max_score = std::max(max_score, scores[j - begin]);
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        double denom = 0.0;
        for (int64_t j = begin; j < end; ++j) {
          const double p = std::exp(static_cast<double>(scores[j - begin]) - max_score);
          denom += p;
          const float* vr = V + j * width + h * d;
          for (int64_t c = 0; c < d; ++c) acc[c] += p * vr[c];
        }
        float* o = O + t * width + h * d;
        for (int64_t c = 0; c < d; ++c) o[c] = static_cast<float>(acc[c] / denom);
      }
    }
  }
}

}  // namespace kuiper::cpu
