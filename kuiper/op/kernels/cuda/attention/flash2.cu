// The FlashAttention-2 op: checks a call and hands it to the phase's launcher (prefill in
// flash2_prefill.cu, decode in flash2_decode.cu; their shapes in flash2_traits.cuh).
#include "kuiper/op/kernels/cuda/attention/flash2_traits.cuh"

namespace kuiper::op::cuda_attention {
namespace {

class Flash2Attention final : public AttentionOp {
 public:
  explicit Flash2Attention(const AttentionRequest& r) : request_(r) {}
  const char* name() const override {
    if (request_.phase == AttentionPhase::kPrefill) return "cuda-flash2-prefill";
    return request_.device_position ? "cuda-flash2-decode-device-position" : "cuda-flash2-decode";
  }

  Status forward(const AttentionArgs& a) override {
    KUIPER_RETURN_IF_ERROR(check_cuda_call(a, request_));
    const Geometry g = make_geometry(a, request_.device_position);
    if (request_.phase == AttentionPhase::kPrefill) return launch_flash2_prefill(a, g, request_);
    return launch_flash2_decode(a, g, request_, decode_buffers_);
  }

 private:
  AttentionRequest request_;
  Flash2DecodeBuffers decode_buffers_;
};

}  // namespace

Result<std::unique_ptr<AttentionOp>> make_flash2_attention(const AttentionRequest& request) {
  return std::unique_ptr<AttentionOp>(new Flash2Attention(request));
}

}  // namespace kuiper::op::cuda_attention
