#include "kuiper/runtime/block_pool.h"

#include <algorithm>

namespace kuiper {

BlockPool::BlockPool(int64_t block_size, int64_t blocks)
    : block_size_(block_size), blocks_(static_cast<size_t>(blocks)) {
  // Block 0 first: a lone sequence uses the block a plain Model::forward uses.
  for (int64_t b = blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

int32_t BlockPool::allocate() {
  int32_t block = -1;
  if (!free_.empty()) {
    block = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    block = lru_.front();
    unlist(block);
    uncache(block);
    ++evictions_;
  } else {
    return -1;
  }
  blocks_[static_cast<size_t>(block)].users = 1;
  return block;
}

void BlockPool::release(int32_t block) {
  Block& b = blocks_[static_cast<size_t>(block)];
  if (--b.users > 0) return;
  if (b.cached == Cached::kNo) {
    free_.push_back(block);
  } else {
    b.lru = lru_.insert(lru_.end(), block);
  }
}

void BlockPool::unlist(int32_t block) {
  lru_.erase(blocks_[static_cast<size_t>(block)].lru);
}

void BlockPool::uncache(int32_t block) {
  Block& b = blocks_[static_cast<size_t>(block)];
  if (b.cached == Cached::kFull) {
    full_.erase(b.hash);
  } else if (b.cached == Cached::kTail) {
    auto [first, last] = tails_.equal_range(b.hash);
    for (auto it = first; it != last; ++it) {
      if (it->second == block) {
        tails_.erase(it);
        break;
      }
    }
    b.keys.clear();
  }
  b.cached = Cached::kNo;
}

int32_t BlockPool::acquire_full(uint64_t hash) {
  const auto it = full_.find(hash);
  if (it == full_.end()) return -1;
  Block& b = blocks_[static_cast<size_t>(it->second)];
  if (b.users++ == 0) unlist(it->second);
  return it->second;
}

void BlockPool::cache_full(int32_t block, uint64_t hash) {
  Block& b = blocks_[static_cast<size_t>(block)];
  if (b.cached != Cached::kNo || !full_.emplace(hash, block).second) return;
  b.cached = Cached::kFull;
  b.hash = hash;
}

void BlockPool::cache_tail(int32_t block, uint64_t parent, std::vector<uint64_t> keys) {
  Block& b = blocks_[static_cast<size_t>(block)];
  if (b.cached != Cached::kNo || keys.empty()) return;
  b.cached = Cached::kTail;
  b.hash = parent;
  b.keys = std::move(keys);
  tails_.emplace(parent, block);
}

BlockPool::Tail BlockPool::acquire_tail(uint64_t parent, Span<const uint64_t> keys) {
  Tail best;
  auto [first, last] = tails_.equal_range(parent);
  for (auto it = first; it != last; ++it) {
    const Block& b = blocks_[static_cast<size_t>(it->second)];
    if (b.users > 0) continue;  // its sequence is still releasing it
    const std::vector<uint64_t>& cached = b.keys;
    const size_t n = std::min(cached.size(), keys.size());
    size_t shared = 0;
    while (shared < n && cached[shared] == keys[shared]) ++shared;
    if (static_cast<int64_t>(shared) > best.tokens) {
      best = {it->second, static_cast<int64_t>(shared)};
    }
  }
  if (best.block < 0) return best;
  unlist(best.block);
  uncache(best.block);
  blocks_[static_cast<size_t>(best.block)].users = 1;
  return best;
}

}  // namespace kuiper
