#include "kuiper/op/attention.h"

#include <glog/logging.h>

#include "kuiper/op/kernels/cpu/cpu_kernels.h"

namespace kuiper {

const char* attention_name(AttentionKind a) {
  switch (a) {
    case AttentionKind::kMha: return "mha";
    case AttentionKind::kFlash1: return "flash1";
    case AttentionKind::kFlash2: return "flash2";
  }
  return "?";
}

Result<AttentionKind> parse_attention(const std::string& name) {
  for (AttentionKind a : {AttentionKind::kMha, AttentionKind::kFlash1, AttentionKind::kFlash2}) {
    if (name == attention_name(a)) return a;
  }
  return Status::Error("unknown attention '" + name + "' (expected mha, flash1 or flash2)");
}

}  // namespace kuiper

namespace kuiper::op {

Status check_attention_args(const AttentionArgs& a) {
  const Tensor& q = a.q;
  if (q.ndim() != 3 || a.k_cache.ndim() != 3 || a.v_cache.shape() != a.k_cache.shape() ||
      a.out.shape() != q.shape() || q.dim(2) != a.k_cache.dim(2) ||
      q.dim(1) % a.k_cache.dim(1) != 0 || a.k_cache.dtype() != q.dtype() ||
      a.out.dtype() != q.dtype()) {
    return Status::Error("attention: q " + q.describe() + ", cache " + a.k_cache.describe() +
                         ", out " + a.out.describe() + " do not fit together");
  }
  if (a.start < 0 || a.start + q.dim(0) > a.k_cache.dim(0)) {
    return Status::Error("attention: positions [" + std::to_string(a.start) + ", " +
                         std::to_string(a.start + q.dim(0)) + ") exceed the cache of " +
                         std::to_string(a.k_cache.dim(0)));
  }
  return Status::Ok();
}

namespace {

class CpuAttention final : public AttentionOp {
 public:
  const char* name() const override { return "cpu-reference"; }
  Status forward(const AttentionArgs& a) override {
    KUIPER_RETURN_IF_ERROR(check_attention_args(a));
    Tensor out = a.out;
    cpu::attention(a.q, a.k_cache, a.v_cache, out, a.start);
    return Status::Ok();
  }
};

}  // namespace

#ifdef KUIPER_WITH_CUDA
// kuiper/op/kernels/cuda/attention_dispatch.cu: the CUDA kernels for a request, or why not.
Result<std::unique_ptr<AttentionOp>> make_cuda_attention(const AttentionRequest& request);
#endif

namespace {

Result<std::unique_ptr<AttentionOp>> make_backend_attention(const AttentionRequest& request) {
  if (request.device == DeviceType::kCpu) {
    if (request.dtype != DataType::kFp32) {
      return Status::Error(std::string("attention on the CPU computes in fp32, not ") +
                           dtype_name(request.dtype));
    }
    if (request.device_position) {
      return Status::Error("a device position (CUDA graphs) needs the cuda device");
    }
    return std::unique_ptr<AttentionOp>(new CpuAttention());
  }
#ifdef KUIPER_WITH_CUDA
  return make_cuda_attention(request);
#else
  return Status::Error("this build of Kuiper has no CUDA support");
#endif
}

}  // namespace

Result<std::unique_ptr<AttentionOp>> make_attention(const AttentionRequest& request) {
  Result<std::unique_ptr<AttentionOp>> op = make_backend_attention(request);
  if (op.ok()) {
    VLOG(1) << "attention " << (request.phase == AttentionPhase::kPrefill ? "prefill" : "decode")
            << ": " << (*op)->name() << " (" << dtype_name(request.dtype) << ", head_dim "
            << request.head_dim << ")";
  }
  return op;
}

}  // namespace kuiper::op
