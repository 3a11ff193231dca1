// Exact causal grouped-query attention, the reference every GPU variant is tested against: one
// sequence over a contiguous cache, or a batch of sequences over a paged pool (AttentionArgs).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kuiper/op/kernels/cpu/cpu_kernels.h"

namespace kuiper::cpu {

namespace {

// One sequence: queries [q0, q0 + T) of q at positions [start, start + T); position p's keys
// and values are row p of the caches when `table` is null, else row
// table[p / block_size] * block_size + p % block_size.
void attend(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, Tensor& out,
            int64_t q0, int64_t T, int64_t start, const int32_t* table, int64_t block_size) {
  const int64_t heads = q.dim(1), d = q.dim(2);
  const int64_t kv_heads = k_cache.dim(1), group = heads / kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  auto row = [&](int64_t p) {
    return table == nullptr ? p : table[p / block_size] * block_size + p % block_size;
  };
#pragma omp parallel
  {
    std::vector<float> scores(static_cast<size_t>(start + T));
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t kvh = h / group, len = start + t + 1;
        const float* qv = q.data<float>() + ((q0 + t) * heads + h) * d;
        float max_score = -INFINITY;
        for (int64_t j = 0; j < len; ++j) {
          const float* kv = k_cache.data<float>() + (row(j) * kv_heads + kvh) * d;
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
        float* o = out.data<float>() + ((q0 + t) * heads + h) * d;
        std::fill(o, o + d, 0.0f);
        for (int64_t j = 0; j < len; ++j) {
          const float p = scores[j] / sum;
          const float* vv = v_cache.data<float>() + (row(j) * kv_heads + kvh) * d;
          for (int64_t i = 0; i < d; ++i) o[i] += p * vv[i];
        }
      }
    }
  }
}

}  // namespace

void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, Tensor& out,
               int64_t start) {
  attend(q, k_cache, v_cache, out, 0, q.dim(0), start, nullptr, 0);
}

void paged_attention(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, Tensor& out,
                     const op::PagedBatch& batch) {
  const int32_t* begin = batch.query_begin.data<int32_t>();
  const int32_t* starts = batch.starts.data<int32_t>();
  const int64_t width = batch.block_tables.dim(1);
  for (int64_t i = 0; i < batch.sequences(); ++i) {
    attend(q, k_pool, v_pool, out, begin[i], begin[i + 1] - begin[i], starts[i],
           batch.block_tables.data<int32_t>() + i * width, batch.block_size);
  }
}

}  // namespace kuiper::cpu
