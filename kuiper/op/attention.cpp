#include "kuiper/op/attention.h"

#include <glog/logging.h>

#include "kuiper/op/kernels/cpu/cpu_kernels.h"
#include "kuiper/op/ops.h"

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

namespace {

// The paged form's metadata: shapes and dtypes always; on the CPU (where the values can be read
// without a copy) the values too: query spans that tile q, positions within the table's reach
// and block ids within the pool.
Status check_paged_batch(const AttentionArgs& a) {
  const PagedBatch& b = a.paged;
  const int64_t B = b.sequences();
  auto int32_on_q = [&](const Tensor& t) {
    return t.defined() && t.dtype() == DataType::kInt32 && t.device() == a.q.device();
  };
  if (B < 1 || !int32_on_q(b.query_begin) || b.query_begin.ndim() != 1 ||
      !int32_on_q(b.starts) || b.starts.ndim() != 1 || b.starts.dim(0) != B ||
      !int32_on_q(b.block_tables) || b.block_tables.ndim() != 2 || b.block_tables.dim(0) != B ||
      b.block_tables.dim(1) < 1) {
    return Status::Error("attention: paged batch metadata query_begin " +
                         b.query_begin.describe() + ", starts " + b.starts.describe() +
                         ", block_tables " + b.block_tables.describe() +
                         " must be int32 [B + 1], [B], [B, W] on q's device");
  }
  if (b.live.defined() && (!int32_on_q(b.live) || b.live.numel() != 1)) {
    return Status::Error("attention: paged batch live " + b.live.describe() +
                         " must be int32 [1] on q's device");
  }
  if (b.block_size < 1 || a.k_cache.dim(0) % b.block_size != 0) {
    return Status::Error("attention: paged block_size " + std::to_string(b.block_size) +
                         " does not divide the pool of " + std::to_string(a.k_cache.dim(0)) +
                         " rows");
  }
  const int64_t reach = b.block_tables.dim(1) * b.block_size;
  if (b.max_queries < 1 || b.max_keys < b.max_queries || b.max_keys > reach) {
    return Status::Error("attention: paged bounds max_queries " + std::to_string(b.max_queries) +
                         ", max_keys " + std::to_string(b.max_keys) + " outside [1, " +
                         std::to_string(reach) + "]");
  }
  if (a.q.device() != DeviceType::kCpu) return Status::Ok();
  const int32_t* begin = b.query_begin.data<int32_t>();
  const int32_t* starts = b.starts.data<int32_t>();
  const int32_t* table = b.block_tables.data<int32_t>();
  const int64_t blocks = a.k_cache.dim(0) / b.block_size;
  if (b.live.defined() && (b.live.data<int32_t>()[0] < 1 || b.live.data<int32_t>()[0] > B)) {
    return Status::Error("attention: paged batch live " +
                         std::to_string(b.live.data<int32_t>()[0]) + " outside [1, " +
                         std::to_string(B) + "]");
  }
  if (begin[0] != 0 || begin[B] != a.q.dim(0)) {
    return Status::Error("attention: paged queries must span q's " + std::to_string(a.q.dim(0)) +
                         " rows");
  }
  for (int64_t i = 0; i < B; ++i) {
    const int64_t T = begin[i + 1] - begin[i];
    if (T < 1 || T > b.max_queries || starts[i] < 0 || starts[i] + T > b.max_keys) {
      return Status::Error("attention: paged sequence " + std::to_string(i) + " has " +
                           std::to_string(T) + " queries from position " +
                           std::to_string(starts[i]) + ", outside the bounds");
    }
    for (int64_t j = 0; j < (starts[i] + T + b.block_size - 1) / b.block_size; ++j) {
      const int32_t id = table[i * b.block_tables.dim(1) + j];
      if (id < 0 || id >= blocks) {
        return Status::Error("attention: paged sequence " + std::to_string(i) + " names block " +
                             std::to_string(id) + " of a pool of " + std::to_string(blocks));
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Status check_attention_args(const AttentionArgs& a) {
  const Tensor& q = a.q;
  if (q.ndim() != 3 || a.k_cache.ndim() != 3 || a.v_cache.shape() != a.k_cache.shape() ||
      a.out.shape() != q.shape() || q.dim(2) != a.k_cache.dim(2) ||
      q.dim(1) % a.k_cache.dim(1) != 0 || a.k_cache.dtype() != q.dtype() ||
      a.out.dtype() != q.dtype()) {
    return Status::Error("attention: q " + q.describe() + ", cache " + a.k_cache.describe() +
                         ", out " + a.out.describe() + " do not fit together");
  }
  if (a.paged.defined()) return check_paged_batch(a);
  if (a.start < 0 || a.start + q.dim(0) > a.k_cache.dim(0)) {
    return Status::Error("attention: positions [" + std::to_string(a.start) + ", " +
                         std::to_string(a.start + q.dim(0)) + ") exceed the cache of " +
                         std::to_string(a.k_cache.dim(0)));
  }
  return Status::Ok();
}

namespace {

// args.input's caches in op::qk_norm_rope_cache's shape: [rows, num_kv_heads * head_dim].
Result<Tensor> flat_cache(const Tensor& cache) {
  return cache.reshape({cache.dim(0), cache.dim(1) * cache.dim(2)});
}

}  // namespace

Status check_attention_input(const AttentionArgs& a) {
  const AttentionInput& in = a.input;
  KUIPER_ASSIGN_OR_RETURN(const Tensor k_cache, flat_cache(a.k_cache));
  KUIPER_ASSIGN_OR_RETURN(const Tensor v_cache, flat_cache(a.v_cache));
  if (in.qkv.ndim() != 3 || in.qkv.dim(1) != a.q.dim(1) + 2 * a.k_cache.dim(1)) {
    return Status::Error("attention: input qkv " + in.qkv.describe() + " does not fit q " +
                         a.q.describe() + " and " + std::to_string(a.k_cache.dim(1)) +
                         " kv heads");
  }
  return check_qk_norm_rope_cache(in.qkv, a.q, in.q_norm, in.k_norm, in.positions, in.rope,
                                  k_cache, v_cache, &in.rope_positions);
}

Status prepare_attention_input(const AttentionArgs& a) {
  KUIPER_RETURN_IF_ERROR(check_attention_input(a));
  const AttentionInput& in = a.input;
  Tensor qkv = in.qkv, q = a.q;
  KUIPER_ASSIGN_OR_RETURN(Tensor k_cache, flat_cache(a.k_cache));
  KUIPER_ASSIGN_OR_RETURN(Tensor v_cache, flat_cache(a.v_cache));
  return qk_norm_rope_cache(qkv, q, in.q_norm, in.k_norm, in.eps, in.positions, in.rope, k_cache,
                            v_cache, &in.rope_positions);
}

namespace {

class CpuAttention final : public AttentionOp {
 public:
  const char* name() const override { return "cpu-reference"; }
  Status forward(const AttentionArgs& a) override {
    KUIPER_RETURN_IF_ERROR(check_attention_args(a));
    if (a.input.defined()) KUIPER_RETURN_IF_ERROR(prepare_attention_input(a));
    Tensor out = a.out;
    if (a.paged.defined()) {
      cpu::paged_attention(a.q, a.k_cache, a.v_cache, out, a.paged);
    } else {
      cpu::attention(a.q, a.k_cache, a.v_cache, out, a.start);
    }
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
