// Row-wise and elementwise reference kernels.
#include <cmath>
#include <vector>

#include "kuiper/op/kernels/cpu/cpu_kernels.h"
#include "kuiper/op/kernels/random_uniform.h"

namespace kuiper::cpu {

void embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  const int64_t T = ids.numel(), H = table.dim(1);
  const size_t row_bytes = static_cast<size_t>(H) * dtype_size(table.dtype());
  const char* base = static_cast<const char*>(table.raw());
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const int64_t id = ids.data<int32_t>()[t];
    (void)convert_elements(base + id * row_bytes, table.dtype(), out.data<float>() + t * H,
                           DataType::kFp32, static_cast<size_t>(H));
  }
}

void rmsnorm(const Tensor& x, const Tensor& weight, double eps, Tensor& out) {
  const int64_t D = weight.numel(), R = x.numel() / D;
  std::vector<float> w(static_cast<size_t>(D));
  (void)convert_elements(weight.raw(), weight.dtype(), w.data(), DataType::kFp32, w.size());
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float* in = x.data<float>() + r * D;
    float* o = out.data<float>() + r * D;
    float sum = 0.0f;
    for (int64_t i = 0; i < D; ++i) sum += in[i] * in[i];
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(D) + static_cast<float>(eps));
    for (int64_t i = 0; i < D; ++i) o[i] = w[i] * (in[i] * inv);
  }
}

void rope(Tensor& x, const Tensor& positions, double theta) {
  const int64_t T = x.dim(0), heads = x.dim(1), d = x.dim(2), half = d / 2;
  // Hugging Face computes inv_freq and the angles in fp32; so do we, to match its rounding.
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] = 1.0f / std::pow(static_cast<float>(theta),
                                  static_cast<float>(2 * i) / static_cast<float>(d));
  }
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float pos = static_cast<float>(positions.data<int32_t>()[t]);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * inv_freq[i];
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

void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  const int64_t n = gate.numel();
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  float* o = out.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  const int64_t n = a.numel();
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  float* o = out.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}

void kv_write(const Tensor& k, Tensor& cache, const Tensor& positions) {
  const int64_t T = k.dim(0), D = k.dim(1);
  for (int64_t t = 0; t < T; ++t) {
    const float* src = k.data<float>() + t * D;
    std::copy(src, src + D, cache.data<float>() + positions.data<int32_t>()[t] * D);
  }
}

void argmax(const Tensor& logits, Tensor& out) {
  const int64_t V = logits.dim(-1), R = logits.numel() / V;
  for (int64_t r = 0; r < R; ++r) {
    const float* row = logits.data<float>() + r * V;
    int64_t best = 0;
    for (int64_t i = 1; i < V; ++i) {
      if (row[i] > row[best]) best = i;
    }
    out.data<int32_t>()[r] = static_cast<int32_t>(best);
  }
}

void fill_random(Tensor& t, uint64_t seed, float scale, float offset) {
  const int64_t n = t.numel();
  const size_t width = dtype_size(t.dtype());
  char* base = static_cast<char*>(t.raw());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float v = random_uniform(seed, static_cast<uint64_t>(i), scale, offset);
    (void)convert_elements(&v, DataType::kFp32, base + i * width, t.dtype(), 1);
  }
}

}  // namespace kuiper::cpu
