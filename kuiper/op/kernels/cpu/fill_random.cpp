// t[i] = offset + scale * u(seed, i), the hash shared with the CUDA kernel (random_uniform.h).
#include "kuiper/op/kernels/cpu/cpu_kernels.h"
#include "kuiper/op/kernels/random_uniform.h"

namespace kuiper::cpu {

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
