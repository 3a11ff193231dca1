// Row-wise argmax, the first index on ties (a row of NaN only gives 0).
#include "kuiper/op/kernels/cpu/cpu_kernels.h"

namespace kuiper::cpu {

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

}  // namespace kuiper::cpu
