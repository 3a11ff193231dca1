// kuiper/runtime's KV block bookkeeping: the pool's users and free blocks, the prefix cache's
// full blocks (shared along a hash chain) and tails (taken over by one later sequence), least
// recently used eviction, and the keys that tell images apart.
#include <gtest/gtest.h>

#include <numeric>

#include "kuiper/runtime/block_pool.h"
#include "kuiper/runtime/block_table.h"
#include "kuiper/runtime/cache_keys.h"

namespace kuiper {
namespace {

std::vector<uint64_t> keys_of(const std::vector<int32_t>& ids) {
  return token_keys(ids, -1, {});
}

// 0, 1, ..., n - 1 plus `offset`.
std::vector<int32_t> iota_ids(int n, int offset = 0) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), offset);
  return ids;
}

TEST(BlockPool, GivesEveryBlockOnceThenNone) {
  BlockPool pool(4, 3);
  EXPECT_EQ(pool.available(), 3);
  EXPECT_EQ(pool.allocate(), 0);  // block 0 first: where a lone Model::forward writes
  EXPECT_EQ(pool.allocate(), 1);
  EXPECT_EQ(pool.allocate(), 2);
  EXPECT_EQ(pool.allocate(), -1);
  pool.release(1);
  EXPECT_EQ(pool.available(), 1);
  EXPECT_EQ(pool.allocate(), 1);
  EXPECT_EQ(pool.blocks_for(0), 0);
  EXPECT_EQ(pool.blocks_for(4), 1);
  EXPECT_EQ(pool.blocks_for(5), 2);
}

TEST(BlockTable, ReserveAddsBlocksOnlyWhenAllFit) {
  BlockPool pool(4, 3);
  BlockTable a, b;
  EXPECT_TRUE(a.reserve(pool, 5));  // two blocks
  EXPECT_EQ(a.blocks().size(), 2u);
  EXPECT_FALSE(b.reserve(pool, 9));  // three needed, one left: none taken
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(pool.available(), 1);
  EXPECT_TRUE(a.reserve(pool, 8));  // still two
  EXPECT_EQ(a.blocks().size(), 2u);
}

TEST(BlockTable, FullBlocksAreSharedAlongTheirHashChain) {
  BlockPool pool(4, 8);
  const std::vector<uint64_t> keys = keys_of(iota_ids(10));
  BlockTable first;
  ASSERT_TRUE(first.reserve(pool, 10));
  first.cache_full_blocks(pool, keys, 10);  // blocks 0 and 1 are full, the third holds 2 rows

  // The same ten tokens: two full blocks shared, the third is the first's own (not cached yet).
  BlockTable second;
  EXPECT_EQ(second.attach_prefix(pool, keys, 9), 8);
  ASSERT_EQ(second.blocks().size(), 2u);
  EXPECT_EQ(second.blocks()[0], first.blocks()[0]);
  EXPECT_EQ(second.blocks()[1], first.blocks()[1]);
  EXPECT_EQ(pool.users(first.blocks()[0]), 2);

  // A prompt that differs in its second block shares only the first.
  std::vector<int32_t> other = iota_ids(10);
  other[5] = 99;
  BlockTable third;
  EXPECT_EQ(third.attach_prefix(pool, keys_of(other), 9), 4);
  // The same block content after another first block is another block: the chain differs.
  std::vector<int32_t> shifted = iota_ids(10);
  shifted[0] = 77;
  BlockTable fourth;
  EXPECT_EQ(fourth.attach_prefix(pool, keys_of(shifted), 9), 0);
}

TEST(BlockTable, NeverAttachesMoreThanTheLimit) {
  BlockPool pool(4, 8);
  const std::vector<uint64_t> keys = keys_of(iota_ids(8));
  BlockTable first;
  ASSERT_TRUE(first.reserve(pool, 8));
  first.cache_full_blocks(pool, keys, 8);
  // The whole prompt is cached, but its last token must run to give logits: limit 7 leaves
  // the second block out (a full block is shared whole or not at all).
  BlockTable second;
  EXPECT_EQ(second.attach_prefix(pool, keys, 7), 4);
}

TEST(BlockTable, ReleasedBlocksStayCachedUntilEvictedLeastRecentlyUsedFirst) {
  BlockPool pool(4, 4);
  const std::vector<uint64_t> a = keys_of(iota_ids(8, 0)), b = keys_of(iota_ids(8, 100));
  BlockTable ta, tb;
  ASSERT_TRUE(ta.reserve(pool, 8));
  ta.release(pool, a, 8);  // a's two blocks cached with no users: a is the older
  ASSERT_TRUE(tb.reserve(pool, 8));
  tb.release(pool, b, 8);
  EXPECT_EQ(pool.available(), 4);
  EXPECT_EQ(pool.evictions(), 0);

  // Two fresh blocks: a's blocks go (its last block first), b's stay findable.
  BlockTable fresh;
  ASSERT_TRUE(fresh.reserve(pool, 8));
  EXPECT_EQ(pool.evictions(), 2);
  BlockTable again_a, again_b;
  EXPECT_EQ(again_a.attach_prefix(pool, a, 8), 0);
  EXPECT_EQ(again_b.attach_prefix(pool, b, 8), 8);

  // A use makes b's blocks the most recent; with b in use nothing more can be evicted.
  BlockTable more;
  EXPECT_FALSE(more.reserve(pool, 1));
  again_b.release(pool, b, 8);
  EXPECT_TRUE(more.reserve(pool, 1));
  EXPECT_EQ(pool.evictions(), 3);
}

TEST(BlockTable, EvictingAHeadFirstKeepsNothingAfterIt) {
  // Released in one piece, a prefix's tail block is evicted before its head.
  BlockPool pool(2, 3);
  const std::vector<uint64_t> keys = keys_of(iota_ids(6));
  BlockTable t;
  ASSERT_TRUE(t.reserve(pool, 6));
  const std::vector<int32_t> blocks = t.blocks();
  t.release(pool, keys, 6);
  BlockTable one;
  ASSERT_TRUE(one.reserve(pool, 1));
  EXPECT_EQ(one.blocks()[0], blocks[2]);
  BlockTable again;
  EXPECT_EQ(again.attach_prefix(pool, keys, 6), 4);
}

TEST(BlockTable, APartlyFilledLastBlockIsTakenOverByTheLongestMatch) {
  BlockPool pool(8, 4);
  // Two sequences of 4 and 6 rows in one block each, both after the root.
  const std::vector<uint64_t> short_keys = keys_of({1, 2, 3, 4});
  const std::vector<uint64_t> long_keys = keys_of({1, 2, 3, 9, 9, 9});
  BlockTable s, l;
  ASSERT_TRUE(s.reserve(pool, 4));
  ASSERT_TRUE(l.reserve(pool, 6));
  const int32_t short_block = s.blocks()[0], long_block = l.blocks()[0];
  s.release(pool, short_keys, 4);
  l.release(pool, long_keys, 6);

  // 1 2 3 9 9 7 ...: five rows of the long one.
  BlockTable next;
  EXPECT_EQ(next.attach_prefix(pool, keys_of({1, 2, 3, 9, 9, 7, 7}), 6), 5);
  EXPECT_EQ(next.blocks(), std::vector<int32_t>{long_block});
  EXPECT_EQ(pool.users(long_block), 1);
  // Taken over: it is no longer in the cache for anyone else; the short one still is.
  BlockTable other;
  EXPECT_EQ(other.attach_prefix(pool, keys_of({1, 2, 3, 9, 9}), 4), 3);
  EXPECT_EQ(other.blocks(), std::vector<int32_t>{short_block});
  // Nothing in common: no block.
  BlockTable none;
  EXPECT_EQ(none.attach_prefix(pool, keys_of({5, 5}), 1), 0);
  EXPECT_TRUE(none.empty());
}

TEST(BlockTable, ATailFollowsTheFullBlocksOfItsChain) {
  BlockPool pool(4, 4);
  const std::vector<uint64_t> keys = keys_of(iota_ids(6));
  BlockTable first;
  ASSERT_TRUE(first.reserve(pool, 6));
  first.release(pool, keys, 6);  // one full block, a tail of 2 rows after it
  std::vector<int32_t> next = iota_ids(6);
  next.push_back(50);
  BlockTable second;
  EXPECT_EQ(second.attach_prefix(pool, keys_of(next), 6), 6);
  EXPECT_EQ(second.blocks().size(), 2u);
}

TEST(CacheKeys, ImagePadsAreKeyedByTheirImage) {
  const int32_t pad = 7;
  const std::vector<int32_t> ids = {1, pad, pad, 2, pad, 3};
  const std::vector<uint64_t> a = token_keys(ids, pad, {11, 22});
  const std::vector<uint64_t> b = token_keys(ids, pad, {11, 23});
  EXPECT_EQ(a[0], token_key(1));
  EXPECT_EQ(a[3], token_key(2));
  EXPECT_NE(a[1], token_key(pad));
  EXPECT_NE(a[1], a[2]);  // the pads of one image differ by their place in it
  EXPECT_EQ(a[1], b[1]);  // the first image is the same
  EXPECT_NE(a[4], b[4]);  // the second is not
  EXPECT_NE(block_hash(kRootBlockHash, a), block_hash(kRootBlockHash, b));
  EXPECT_EQ(token_keys(ids, -1, {}), keys_of(ids));
}

TEST(CacheKeys, ImageFingerprintsSeeEveryPixelAndTheGrid) {
  ProcessedImage image;
  image.pixel_values = {0.5f, 0.25f, -1.0f, 2.0f};
  image.patches = 1;
  image.patch_dim = 4;
  image.grid = {1, 1, 1};
  ProcessedImage changed = image;
  changed.pixel_values[3] = 2.5f;
  ProcessedImage regridded = image;
  regridded.grid = {1, 2, 1};
  EXPECT_EQ(image_fingerprint(image), image_fingerprint(ProcessedImage(image)));
  EXPECT_NE(image_fingerprint(image), image_fingerprint(changed));
  EXPECT_NE(image_fingerprint(image), image_fingerprint(regridded));
}

}  // namespace
}  // namespace kuiper
