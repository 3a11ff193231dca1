// The smallest complete Qwen3 configuration, for tests that write a model file by hand.
#pragma once

#include "kuiper/model/config.h"

namespace kuiper::test {

// Qwen3 (q/k norm, tied embeddings): 2 layers of hidden size 16, 2 query heads and 1 kv head of
// dimension 8, an MLP of 24, a vocabulary of 32, 64 positions, end token 2. Every tensor fits
// in a few KiB; a test sets what it needs otherwise.
inline ModelConfig tiny_qwen3_config() {
  ModelConfig c;
  c.arch = Architecture::kQwen3;
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_layers = 2;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = true;
  c.qk_norm = true;
  c.eos_token_ids = {2};
  return c;
}

}  // namespace kuiper::test
