// Causal grouped-query attention over a KV cache, and the one dispatch point that picks its
// implementation for (algorithm, phase, dtype, device, device position).
#pragma once

#include <memory>

#include "kuiper/op/attention_kind.h"
#include "kuiper/op/rope_params.h"
#include "kuiper/tensor/tensor.h"

namespace kuiper::op {

enum class AttentionPhase { kPrefill, kDecode };

// A batch of sequences over a paged KV pool (continuous batching). Sequence i of B owns query
// rows [query_begin[i], query_begin[i + 1]) of q (T_i of them, at least one; a decode call has
// exactly one per sequence) at cache positions [starts[i], starts[i] + T_i); query t of it sees
// its keys [0, starts[i] + t]. Position p of sequence i lives in row
// block_tables[i][p / block_size] * block_size + p % block_size of the pool. Every tensor is
// int32 on q's device; the kernels read them there (so a captured graph replays with new values)
// and clamp what they read to the pool rather than trust it: the caller checks them. The flash2
// fp16/bf16 decode reads starts and block_tables before its PDL dependency wait, so they must be
// written before the kernel launched just before the op starts (host copies ahead of the step,
// as the model does), never by that kernel.
struct PagedBatch {
  Tensor query_begin;   // [B + 1], query_begin[0] = 0, query_begin[B] = q.dim(0)
  Tensor starts;        // [B]
  Tensor block_tables;  // [B, W]: W blocks hold a sequence's most keys, W * block_size
  int64_t block_size = 0;
  // Host-known bounds that size the launch: no sequence has more than max_queries queries nor
  // more than max_keys keys (starts[i] + T_i). Ops made with AttentionRequest::device_position
  // size the grid for W * block_size keys instead, so one capture serves every step.
  int64_t max_queries = 0;
  int64_t max_keys = 0;
  // Optional int32 [1] on q's device, read there like starts: sequences [live[0], B) are padding
  // (a captured decode graph serves B sequences and this step has fewer). An implementation may
  // skip them and then leaves their rows of out as they were; the flash2 fp16/bf16 decode does,
  // every other one attends for them as for any sequence. Clamped to [1, B] on the device.
  Tensor live;
  bool defined() const { return query_begin.defined(); }
  int64_t sequences() const { return query_begin.defined() ? query_begin.numel() - 1 : 0; }
};

// The step's q, k and v as the stacked q/k/v product left them, before the per-head RMSNorms
// and RoPE (decode through the model's fused forms). When defined, the call first does what
// op::qk_norm_rope_cache(qkv, q, q_norm, k_norm, eps, positions, rope, caches, &rope_positions)
// does: q (normalised, rotated) into AttentionArgs::q, k and v into the cache rows `positions`.
// The flash2 fp16/bf16 decode over a paged pool does it inside its kernel (one launch less a
// layer); every other combination runs op::qk_norm_rope_cache first. qkv's k heads may be left
// either way. Like starts and the block tables, positions and rope_positions are read before the
// kernel's PDL wait: they must not be written by the kernel launched just before the op.
struct AttentionInput {
  Tensor qkv;  // [T, num_heads + 2 * num_kv_heads, head_dim]
  const Tensor* q_norm = nullptr;  // [head_dim] or null
  const Tensor* k_norm = nullptr;
  double eps = 0.0;
  Tensor positions;       // [T] int32: the cache rows of the step's keys and values
  Tensor rope_positions;  // [T] int32: the rotary positions
  RopeParams rope;
  bool defined() const { return qkv.defined(); }
};

// One call: either one sequence over a contiguous cache (`start` / `device_position`), or, when
// `paged` is defined, a batch of sequences over the pool (k_cache and v_cache are then the whole
// pool, [blocks * block_size, num_kv_heads, head_dim]; `start` and `device_position` unused).
struct AttentionArgs {
  Tensor q;        // [T, num_heads, head_dim] (paged: every sequence's queries, in order)
  Tensor k_cache;  // [max_ctx, num_kv_heads, head_dim]; rows [0, start + T) are valid
  Tensor v_cache;  // same shape as k_cache
  Tensor out;      // [T, num_heads, head_dim]
  int64_t start = 0;  // position of the first query; query t sees keys [0, start + t]
  // For ops made with AttentionRequest::device_position: the position, an int32 [1] device
  // tensor read by the kernels instead of `start`, so a captured graph replays at every step.
  Tensor device_position;
  PagedBatch paged;
  AttentionInput input;
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
  // Decode reads its position from AttentionArgs::device_position (CUDA graphs): the kernels
  // then size every launch for the cache capacity, never for the position. Paged: the launch is
  // sized for W * block_size keys per sequence whatever max_keys says.
  bool device_position = false;
  int64_t head_dim = 0;
  // Split-KV decode (flash2 fp16/bf16, flash1): the blocks of the decode grid, all kv heads' and
  // head groups' splits together. 0 lets the kernel choose from the SM count; tests and benchmarks
  // set it to exercise or compare other grids. flash2 fp16/bf16 spreads the keys of every (kv head,
  // head group) evenly over exactly this many blocks (fewer when the context cannot fill them);
  // flash1 gives each (kv head, row block) decode_grid / their count splits. The fp32 flash2 decode
  // splits into fixed chunks and ignores it.
  int decode_grid = 0;
  // Programmatic dependent launch for the kernels that use it (flash2 fp16/bf16 decode): on by
  // default; off for A/B timing.
  bool pdl = true;
};

// Checks shapes, dtypes and the position range of a call; every implementation runs it first.
Status check_attention_args(const AttentionArgs& args);

// The checks of args.input (shapes, dtypes, devices, cache rows), and its preparation by
// op::qk_norm_rope_cache, for the implementations that do not fuse it.
Status check_attention_input(const AttentionArgs& args);
Status prepare_attention_input(const AttentionArgs& args);

// The attention op for a request, or an error saying which combination is unsupported. Nothing
// is silently replaced by another algorithm. On the CPU all three kinds are served by the one
// exact reference kernel (the CPU backend is the reference, not a performance path).
Result<std::unique_ptr<AttentionOp>> make_attention(const AttentionRequest& request);

}  // namespace kuiper::op
