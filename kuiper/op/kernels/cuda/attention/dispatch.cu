// make_cuda_attention: the CUDA side of the attention dispatch point. It decides which
// combinations of (kind, phase, dtype, device position, head_dim) exist and refuses the rest
// with a message naming the combination; the op it makes runs the kind's launcher (ops.cuh).
#include "kuiper/base/allocator.h"
#include "kuiper/op/kernels/cuda/attention/ops.cuh"

namespace kuiper::op {
namespace {

// The CUDA attention op of every kind: checks each call against the request it was made for and
// runs the kind's launcher with the buffers it keeps between calls.
class CudaAttention final : public AttentionOp {
 public:
  explicit CudaAttention(const AttentionRequest& r) : request_(r) {
    name_ = std::string("cuda-") + attention_name(r.kind);
    if (r.kind == AttentionKind::kFlash2) {
      name_ += r.phase == AttentionPhase::kPrefill ? "-prefill" : "-decode";
    }
    if (r.device_position) name_ += "-device-position";
  }
  const char* name() const override { return name_.c_str(); }

  Status forward(const AttentionArgs& a) override {
    using namespace cuda_attention;
    KUIPER_RETURN_IF_ERROR(check_cuda_call(a, request_));
    if (a.input.defined()) {
      // The flash2 16-bit decode over a paged pool prepares q, k and v inside its kernel.
      bool fused = request_.kind == AttentionKind::kFlash2 &&
                   request_.phase == AttentionPhase::kDecode;
      if (fused) {
        KUIPER_ASSIGN_OR_RETURN(fused,
                                flash2_decode_fuses_input(make_geometry(a, request_), request_));
      }
      KUIPER_RETURN_IF_ERROR(fused ? check_attention_input(a) : prepare_attention_input(a));
      if (!fused) {
        AttentionArgs prepared = a;
        prepared.input = AttentionInput();
        return forward(prepared);
      }
    }
    const Geometry g = make_geometry(a, request_);
    switch (request_.kind) {
      case AttentionKind::kMha: return run_mha(a, g, request_, buffers_);
      case AttentionKind::kFlash1: return run_flash1(a, g, request_, buffers_);
      case AttentionKind::kFlash2: return run_flash2(a, g, request_, buffers_);
    }
    return Status::Error("attention " + describe(request_) + ": unknown kind");
  }

 private:
  const AttentionRequest request_;
  std::string name_;
  cuda_attention::AttentionBuffers buffers_;
};

}  // namespace

Result<std::unique_ptr<AttentionOp>> make_cuda_attention(const AttentionRequest& request) {
  using namespace cuda_attention;
  const std::string combo = "CUDA attention " + describe(request);
  if (request.device != DeviceType::kCuda) return Status::Error(combo + ": not a cuda request");
  if (!supported_dtype(request.dtype)) {
    return Status::Error(combo + ": unsupported dtype (CUDA attention runs fp32, fp16 and bf16)");
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
  return std::unique_ptr<AttentionOp>(new CudaAttention(request));
}

}  // namespace kuiper::op
