// A request's tokens as the scheduler sees them: the prompt and the tokens sampled so far, how
// many of them the KV cache holds, and the blocks it holds them in.
#pragma once

#include <cstdint>
#include <vector>

#include "kuiper/runtime/block_table.h"
#include "kuiper/runtime/cache_keys.h"

namespace kuiper {

struct Sequence {
  int64_t id = 0;
  std::vector<int32_t> tokens;  // the prompt, then the sampled tokens
  std::vector<uint64_t> keys;   // each token's prefix cache key (cache_keys.h)
  // Tokens [0, computed) have their keys and values in `blocks`; the rest are still to run.
  // The scheduler keeps these two and `running`.
  int64_t computed = 0;
  BlockTable blocks;
  bool running = false;

  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  int64_t remaining() const { return size() - computed; }
  // A sampled token joins the sequence (it runs in the next step that schedules it).
  void append(int32_t id) {
    tokens.push_back(id);
    keys.push_back(token_key(id));
  }
};

}  // namespace kuiper
