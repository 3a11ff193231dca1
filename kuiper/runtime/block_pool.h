// The KV cache's blocks as the runtime hands them out: a fixed pool of Model::kv_blocks() blocks
// of Model::kv_block_size() token rows, each with a count of the sequences using it, and a prefix
// cache over the blocks no sequence uses any more.
//
// The prefix cache keeps two kinds of blocks:
// - full blocks, named by the hash chain of their keys (cache_keys.h): any number of sequences
//   whose prompts start with the same tokens share them, read-only;
// - tails: a sequence's last, partly filled block, named by its parent's hash and holding the
//   keys of its filled rows. One later sequence that starts with some of those keys takes the
//   block over and writes on after them (a chat's next turn; with one block per sequence, the
//   only reuse there is).
// Cached blocks with no users are evicted least recently used first when fresh blocks run out.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "kuiper/base/span.h"

namespace kuiper {

class BlockPool {
 public:
  // block_size, blocks: at least 1.
  BlockPool(int64_t block_size, int64_t blocks);

  int64_t block_size() const { return block_size_; }
  int64_t blocks() const { return static_cast<int64_t>(blocks_.size()); }
  // Blocks allocate() can give out now: unused ones and cached ones with no users.
  int64_t available() const { return static_cast<int64_t>(free_.size() + lru_.size()); }
  // Blocks holding `tokens` positions.
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  // Sequences using `block`.
  int32_t users(int32_t block) const { return blocks_[static_cast<size_t>(block)].users; }
  // Cached blocks given out fresh so far.
  int64_t evictions() const { return evictions_; }

  // A block for one user, its contents undefined: an unused one, else the least recently used
  // cached one (forgotten by the cache). -1 when every block is in use.
  int32_t allocate();
  // One user fewer. A block nobody uses stays cached (the most recently used) when it is in the
  // prefix cache, else it is free.
  void release(int32_t block);

  // The cached full block named `hash` with one more user, or -1.
  int32_t acquire_full(uint64_t hash);
  // Names the full block `block` (in use) `hash` in the cache. Nothing changes when another
  // block already has that name: the first one written is the one shared.
  void cache_full(int32_t block, uint64_t hash);

  // Puts the partly filled block `block`, whose only user is the caller, in the cache as a tail
  // after the block named `parent`, its filled rows holding `keys`. The caller then releases it.
  void cache_tail(int32_t block, uint64_t parent, std::vector<uint64_t> keys);
  // The cached tail after `parent` whose keys share the longest prefix with `keys`, taken out
  // of the cache with the caller as its only user: the block and how many rows it shares; block
  // -1 when no tail shares any.
  struct Tail {
    int32_t block = -1;
    int64_t tokens = 0;
  };
  Tail acquire_tail(uint64_t parent, Span<const uint64_t> keys);

 private:
  enum class Cached { kNo, kFull, kTail };
  struct Block {
    int32_t users = 0;
    Cached cached = Cached::kNo;
    uint64_t hash = 0;               // a full block's name, a tail's parent
    std::vector<uint64_t> keys;      // a tail's filled rows
    std::list<int32_t>::iterator lru;  // its place in lru_ while cached with no users
  };

  // Takes a cached block with no users out of the LRU list (it gets a user).
  void unlist(int32_t block);
  // Forgets what the cache knows of `block`.
  void uncache(int32_t block);

  int64_t block_size_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_;  // unused and not cached; the back is given out first
  std::list<int32_t> lru_;     // cached with no users, least recently used first
  std::unordered_map<uint64_t, int32_t> full_;
  std::unordered_multimap<uint64_t, int32_t> tails_;  // parent -> block
  int64_t evictions_ = 0;
};

}  // namespace kuiper
