#include "kuiper/runtime/block_table.h"

#include <algorithm>

#include "kuiper/runtime/cache_keys.h"

namespace kuiper {

namespace {

// keys[begin, begin + count).
Span<const uint64_t> keys_at(const std::vector<uint64_t>& keys, int64_t begin, int64_t count) {
  return Span<const uint64_t>(keys.data() + begin, static_cast<size_t>(count));
}

}  // namespace

int64_t BlockTable::attach_prefix(BlockPool& pool, const std::vector<uint64_t>& keys,
                                  int64_t limit) {
  const int64_t bs = pool.block_size();
  limit = std::min(limit, static_cast<int64_t>(keys.size()));
  uint64_t parent = kRootBlockHash;
  int64_t tokens = 0;
  while (tokens + bs <= limit) {
    const uint64_t hash = block_hash(parent, keys_at(keys, tokens, bs));
    const int32_t block = pool.acquire_full(hash);
    if (block < 0) break;
    blocks_.push_back(block);
    hashes_.push_back(hash);
    parent = hash;
    tokens += bs;
  }
  if (tokens < limit) {
    const BlockPool::Tail tail =
        pool.acquire_tail(parent, keys_at(keys, tokens, std::min(bs, limit - tokens)));
    if (tail.block >= 0) {
      blocks_.push_back(tail.block);
      tokens += tail.tokens;
    }
  }
  return tokens;
}

bool BlockTable::reserve(BlockPool& pool, int64_t tokens) {
  const int64_t need = pool.blocks_for(tokens) - static_cast<int64_t>(blocks_.size());
  if (need <= 0) return true;
  if (need > pool.available()) return false;
  for (int64_t i = 0; i < need; ++i) blocks_.push_back(pool.allocate());
  return true;
}

void BlockTable::cache_full_blocks(BlockPool& pool, const std::vector<uint64_t>& keys,
                                   int64_t computed) {
  const int64_t bs = pool.block_size();
  for (int64_t j = static_cast<int64_t>(hashes_.size()); (j + 1) * bs <= computed; ++j) {
    const uint64_t parent = j == 0 ? kRootBlockHash : hashes_.back();
    hashes_.push_back(block_hash(parent, keys_at(keys, j * bs, bs)));
    pool.cache_full(blocks_[static_cast<size_t>(j)], hashes_.back());
  }
}

void BlockTable::release(BlockPool& pool, const std::vector<uint64_t>& keys, int64_t computed) {
  cache_full_blocks(pool, keys, computed);
  const int64_t bs = pool.block_size();
  const int64_t full = computed / bs;
  if (computed % bs != 0 && full < static_cast<int64_t>(blocks_.size())) {
    pool.cache_tail(blocks_[static_cast<size_t>(full)],
                    full == 0 ? kRootBlockHash : hashes_[static_cast<size_t>(full - 1)],
                    std::vector<uint64_t>(keys.begin() + full * bs, keys.begin() + computed));
  }
  // The last blocks first, so the least recently used end of the cache holds a prefix's tail
  // rather than its head (a head is what other prompts share).
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) pool.release(*it);
  blocks_.clear();
  hashes_.clear();
}

}  // namespace kuiper
