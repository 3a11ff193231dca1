// Row-wise argmax, the first index on ties. NaN and -inf never win: a row without a finite value
// gives 0, as on CUDA.
#include <cfloat>

#include "kuiper/op/kernels/cpu/cpu_kernels.h"

namespace kuiper::cpu {

void argmax(const Tensor& logits, Tensor& out) {
  const int64_t V = logits.dim(-1), R = logits.numel() / V;
  for (int64_t r = 0; r < R; ++r) {
    const float* row = logits.data<float>() + r * V;
    int64_t best = -1;
    for (int64_t i = 0; i < V; ++i) {
      if (!(row[i] >= -FLT_MAX)) continue;  // NaN or -inf
      if (best < 0 || row[i] > row[best]) best = i;
    }
    out.data<int32_t>()[r] = static_cast<int32_t>(best < 0 ? 0 : best);
  }
}

}  // namespace kuiper::cpu
