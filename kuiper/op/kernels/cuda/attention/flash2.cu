// The FlashAttention-2 launcher: the phase's kernels (prefill in flash2_prefill.cu, decode in
// flash2_decode.cu; their shapes in flash2_traits.cuh).
#include "kuiper/op/kernels/cuda/attention/flash2_traits.cuh"
#include "kuiper/op/kernels/cuda/attention/ops.cuh"

namespace kuiper::op::cuda_attention {

Status run_flash2(const AttentionArgs& a, const Geometry& g, const AttentionRequest& r,
                  AttentionBuffers& buffers) {
  if (r.phase == AttentionPhase::kPrefill) return launch_flash2_prefill(a, g, r);
  return launch_flash2_decode(a, g, r, buffers);
}

}  // namespace kuiper::op::cuda_attention
