// The input of Model::forward: a batch of sequences, each a span of its tokens with where its KV
// cache lives, how its tokens rotate, its images' features and which logits rows it wants.
//
// The KV cache is a pool the model owns: per layer, Model::kv_blocks() blocks of
// Model::kv_block_size() token rows each (ModelOptions sizes it). A sequence names its blocks in
// a block table: block table entry j holds cache positions [j * block_size, (j + 1) * block_size).
//
// A forward runs each entry's span at cache positions [start, start + T): it writes the span's
// keys and values into its blocks, its tokens attending to positions [0, start + t]. The caller
// guarantees that positions [0, start) of each sequence already hold that sequence's keys and
// values (an earlier forward wrote them, or they are a shared prefix's blocks), and that no two
// entries of one batch write the same block (checked). Continuous batching puts decode tokens
// (T = 1) and prefill chunks of different sequences in one batch; a chunked prefill is one entry
// per chunk, in successive forwards, each continuing at the cache position the last one reached.
//
// Rotary positions are 1-D by default: token t rotates at start + t + rope_offset on every axis
// (rope_offset is the delta the images before the span left on an M-RoPE model; on any model it
// can shift a span's rotation, e.g. to check it far along a long context). A
// span holding image-pad tokens gives explicit 3-D M-RoPE positions instead (qwen3_vl_rope_index)
// and the features of its images: the span's k-th image-pad token takes row image_row + k of the
// embeddings (replacing its token embedding) and of each deepstack feature (added after decoder
// layer k), so a chunk passes the whole images' features and the row its first pad token takes.
#pragma once

#include <cstdint>

#include "kuiper/base/span.h"
#include "kuiper/model/images.h"

namespace kuiper {

// The logits rows a sequence wants from its span.
enum class LogitRows {
  kNone,  // none (a prefill chunk before the last)
  kLast,  // the span's last token (sampling the next token)
  kAll,   // every token of the span (scoring, comparisons)
};

struct SequenceInput {
  // The span's token ids; token t sits at cache position start + t. At least one.
  Span<const int32_t> tokens;
  int64_t start = 0;
  // KV block ids covering positions [0, start + T), in position order.
  Span<const int32_t> blocks;
  // 1-D rotary positions: start + t + rope_offset.
  int64_t rope_offset = 0;
  // 3-D rotary positions (M-RoPE models): [3, T] row-major, the t row, then h, then w. When given
  // they replace the 1-D ones; a span holding image-pad tokens needs them.
  Span<const int32_t> rope_positions;
  // The features of the images whose pad tokens are in the span (null: none). Any device, fp32
  // or the activation dtype; features already on the model's device in its activation dtype are
  // used in place, others are copied per call.
  const ImageFeatures* image = nullptr;
  int64_t image_row = 0;  // the feature row of the span's first image-pad token
  LogitRows logits = LogitRows::kLast;
  // >= 0: the span's last token is row `fed` of the tokens given to Model::forward(batch,
  // tokens), on the device, read there in place of tokens' last id (a placeholder, which must
  // still be a text id of the vocabulary). The engine feeds a step the tokens the step before
  // took on the device, before the host has them.
  int64_t fed = -1;
};

// How many logits rows `sequence` asks for.
inline int64_t logit_rows(const SequenceInput& sequence) {
  switch (sequence.logits) {
    case LogitRows::kNone: return 0;
    case LogitRows::kLast: return 1;
    case LogitRows::kAll: return static_cast<int64_t>(sequence.tokens.size());
  }
  return 0;
}

}  // namespace kuiper
