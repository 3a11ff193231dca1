// Quantized weights on the GPU (kuiper/op/weight.h). Placeholder until the kernels land.
#include "kuiper/op/kernels/cuda/cuda_kernels.h"

namespace kuiper::cuda {

namespace {
Status missing(const op::Weight& w) {
  return Status::Error("CUDA kernels for " + w.describe() + " are not built yet");
}
}  // namespace

Status quantized_matmul(const Tensor&, const op::Weight& w, const Tensor*, Tensor&) {
  return missing(w);
}
Result<bool> quantized_linear(const Tensor&, const op::Weight& w, const op::LinearOptions&,
                              Tensor&) {
  return missing(w);
}
Status dequantize(const op::Weight& w, Tensor&) { return missing(w); }
Status quantize(const Tensor&, op::Weight& w) { return missing(w); }

}  // namespace kuiper::cuda
