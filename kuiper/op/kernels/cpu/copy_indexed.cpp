// out[to[j]] = src[from[j]]: the indices were checked by op::copy_indexed.
#include "kuiper/op/kernels/cpu/cpu_kernels.h"

namespace kuiper::cpu {

void copy_indexed(const Tensor& src, const Tensor& from, const Tensor& to, Tensor& out) {
  for (int64_t j = 0; j < from.numel(); ++j) {
    out.data<int32_t>()[to.data<int32_t>()[j]] = src.data<int32_t>()[from.data<int32_t>()[j]];
  }
}

}  // namespace kuiper::cpu
