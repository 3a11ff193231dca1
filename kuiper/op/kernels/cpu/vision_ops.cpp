// Reference kernels of the vision tower: LayerNorm, GELU, 2-D rotary embedding and
// bidirectional attention over packed sequences. fp32 activations; sums in double where a row
// is reduced, so these stay the exact side of every comparison.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kuiper/op/kernels/cpu/cpu_kernels.h"
#include "kuiper/op/kernels/rope_2d_freq.h"

namespace kuiper::cpu {

namespace {

std::vector<float> as_floats(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  (void)convert_elements(t.raw(), t.dtype(), v.data(), DataType::kFp32, v.size());
  return v;
}

}  // namespace

void layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
               Tensor& out) {
  const int64_t D = weight.numel(), R = x.numel() / D;
  const std::vector<float> w = as_floats(weight), b = as_floats(bias);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float* in = x.data<float>() + r * D;
    float* o = out.data<float>() + r * D;
    double sum = 0.0;
    for (int64_t i = 0; i < D; ++i) sum += in[i];
    const double mean = sum / static_cast<double>(D);
    double sq = 0.0;
    for (int64_t i = 0; i < D; ++i) sq += (in[i] - mean) * (in[i] - mean);
    const float inv = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(D) + eps));
    const float m = static_cast<float>(mean);
    for (int64_t i = 0; i < D; ++i) o[i] = (in[i] - m) * inv * w[i] + b[i];
  }
}

void gelu(const Tensor& x, op::GeluKind kind, Tensor& out) {
  const int64_t n = x.numel();
  const float* in = x.data<float>();
  float* o = out.data<float>();
  if (kind == op::GeluKind::kTanh) {
    const float k = std::sqrt(2.0f / static_cast<float>(M_PI));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float v = in[i];
      o[i] = 0.5f * v * (1.0f + std::tanh(k * (v + 0.044715f * v * v * v)));
    }
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float v = in[i];
      o[i] = 0.5f * v * (1.0f + std::erf(v * static_cast<float>(M_SQRT1_2)));
    }
  }
}

void rope_2d(Tensor& x, const Tensor& positions, double theta) {
  const int64_t T = x.dim(0), heads = x.dim(1), d = x.dim(2), half = d / 2, quarter = d / 4;
  std::vector<float> inv_freq(static_cast<size_t>(quarter));
  for (int64_t j = 0; j < quarter; ++j) inv_freq[j] = rope_2d_inv_freq(theta, d, j);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float row = static_cast<float>(positions.data<int32_t>()[2 * t]);
    const float col = static_cast<float>(positions.data<int32_t>()[2 * t + 1]);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = i < quarter ? row * inv_freq[i] : col * inv_freq[i - quarter];
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
