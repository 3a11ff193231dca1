// out[t, :] = table[ids[t], :] widened to fp32, whatever the table's stored type.
#include "kuiper/op/kernels/cpu/cpu_kernels.h"

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

}  // namespace kuiper::cpu
