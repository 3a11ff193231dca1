// make_cuda_attention: the CUDA side of the attention dispatch point. It decides which
// combinations of (kind, phase, dtype, device position, head_dim) exist and refuses the rest with a
// message naming the combination; each kind's file then builds its kernels for the request.
#include "kuiper/base/allocator.h"
#include "kuiper/op/kernels/cuda/attention/common.cuh"

namespace kuiper::op {

Result<std::unique_ptr<AttentionOp>> make_cuda_attention(const AttentionRequest& request) {
  using namespace cuda_attention;
  const std::string combo = "CUDA attention " + describe(request);
  if (request.device != DeviceType::kCuda) return Status::Error(combo + ": not a cuda request");
  if (!supported_dtype(request.dtype)) {
    return Status::Error(combo + ": unsupported dtype (CUDA attention runs fp32 and fp16)");
  }
  if (!supported_head_dim(request.head_dim)) {
    return Status::Error(combo + ": unsupported head_dim (CUDA attention has kernels for 64 and "
                                 "128)");
  }
  if (request.device_position && request.phase != AttentionPhase::kDecode) {
    return Status::Error(combo + ": device-position kernels exist for decode only (prefill shapes "
                                 "change every call, so it is not captured)");
  }
  if (!cuda_available()) return Status::Error(combo + ": no usable CUDA device");
  switch (request.kind) {
    case AttentionKind::kMha: return make_mha_attention(request);
    case AttentionKind::kFlash1: return make_flash1_attention(request);
    case AttentionKind::kFlash2: return make_flash2_attention(request);
  }
  return Status::Error(combo + ": unknown attention kind");
}

}  // namespace kuiper::op
