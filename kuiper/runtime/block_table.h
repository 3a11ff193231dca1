// The KV blocks of one sequence, in position order (entry j holds positions
// [j * block_size, (j + 1) * block_size)), taken from a BlockPool: the longest prefix the cache
// already holds, fresh blocks as the sequence grows, its full blocks offered to the cache as they
// fill, and everything given back when it finishes or is preempted.
#pragma once

#include <cstdint>
#include <vector>

#include "kuiper/runtime/block_pool.h"

namespace kuiper {

class BlockTable {
 public:
  const std::vector<int32_t>& blocks() const { return blocks_; }
  bool empty() const { return blocks_.empty(); }

  // Starts an empty table with the longest cached prefix of the tokens keyed `keys`, at most
  // `limit` tokens: full blocks along their hash chain, then a tail that shares some of the
  // following keys. Returns how many tokens it holds.
  int64_t attach_prefix(BlockPool& pool, const std::vector<uint64_t>& keys, int64_t limit);
  // Adds fresh blocks until positions [0, tokens) are covered. False, adding none, when the pool
  // has too few available.
  bool reserve(BlockPool& pool, int64_t tokens);
  // Positions [0, computed) hold the tokens keyed keys[0, computed): the full blocks among them
  // join the prefix cache.
  void cache_full_blocks(BlockPool& pool, const std::vector<uint64_t>& keys, int64_t computed);
  // Gives every block back, positions [0, computed) holding keys[0, computed): the full blocks
  // stay cached, a partly filled last block is cached as a tail, the rest is free.
  void release(BlockPool& pool, const std::vector<uint64_t>& keys, int64_t computed);

 private:
  std::vector<int32_t> blocks_;
  // The hash of each leading full block cached so far: hashes_[j] names blocks_[j].
  std::vector<uint64_t> hashes_;
};

}  // namespace kuiper
