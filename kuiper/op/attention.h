// Causal grouped-query attention over a KV cache, and the one dispatch point that picks its
// implementation for (algorithm, phase, dtype, device, graph-safety).
#pragma once

#include <memory>

#include "kuiper/op/attention_kind.h"
#include "kuiper/tensor/tensor.h"

namespace kuiper::op {

enum class AttentionPhase { kPrefill, kDecode };

struct AttentionArgs {
  Tensor q;        // [T, num_heads, head_dim]
  Tensor k_cache;  // [max_ctx, num_kv_heads, head_dim]; rows [0, start + T) are valid
  Tensor v_cache;  // same shape as k_cache
  Tensor out;      // [T, num_heads, head_dim]
  int64_t start = 0;  // position of the first query; query t sees keys [0, start + t]
  // Graph-safe decode variants read the position from this int32 [1] device tensor instead of
  // `start`, so a captured graph can be replayed at every step.
  Tensor device_position;
};

class AttentionOp {
 public:
  virtual ~AttentionOp() = default;
  virtual const char* name() const = 0;
  virtual Status forward(const AttentionArgs& args) = 0;
};

struct AttentionRequest {
  AttentionKind kind = AttentionKind::kFlash2;
  AttentionPhase phase = AttentionPhase::kPrefill;
  DataType dtype = DataType::kFp32;  // of q, the cache and out
  DeviceType device = DeviceType::kCpu;
  bool graph_safe = false;  // needs a GPU-pos kernel with fixed shared memory
  int64_t head_dim = 0;
  // Split-KV decode (flash2 fp16, flash1): KV splits per kv head. 0 lets the kernel choose from
  // the SM count; tests and benchmarks set it to exercise or compare other counts. For the flash2
  // fp16 decode it is the total block count instead (the work of all kv heads is spread over
  // it; kv heads x head groups times a split count reproduces per-head splits).
  int decode_splits = 0;
};

// Checks shapes, dtypes and the position range of a call; every implementation runs it first.
Status check_attention_args(const AttentionArgs& args);

// The attention op for a request, or an error saying which combination is unsupported. Nothing
// is silently replaced by another algorithm. On the CPU all three kinds are served by the one
// exact reference kernel (the CPU backend is the reference, not a performance path).
Result<std::unique_ptr<AttentionOp>> make_attention(const AttentionRequest& request);

}  // namespace kuiper::op
