// What a token of the KV cache stands for, for the prefix cache: its key is its id, except that
// an image-pad token's key names the image and which of its pads it is (equal ids, different
// pictures, different keys and values). A full block of the cache is named by a hash chain over
// its keys and its parent's hash, so equal hashes mean equal prefixes (64-bit hashes: a chance
// collision among a million cached blocks has odds of about 1 in 10^7).
#pragma once

#include <cstdint>
#include <vector>

#include "kuiper/base/span.h"
#include "kuiper/vision/preprocess.h"

namespace kuiper {

// The hash chain's start: the parent of a sequence's first block.
constexpr uint64_t kRootBlockHash = 0x9e3779b97f4a7c15ull;

// FNV-1a 64 of an image's grid and pixel values.
uint64_t image_fingerprint(const ProcessedImage& image);

// One key per token of `ids`: the id, or for the k-th token of the i-th run of `image_pad_id`
// tokens a key made of fingerprints[i] and k (never equal to a token id). `image_pad_id` < 0:
// the ids hold no images. Runs beyond fingerprints.size() are keyed by their ids.
std::vector<uint64_t> token_keys(const std::vector<int32_t>& ids, int32_t image_pad_id,
                                 const std::vector<uint64_t>& fingerprints);

// The key of a token that is no image pad (a generated one).
inline uint64_t token_key(int32_t id) { return static_cast<uint32_t>(id); }

// The hash of a block holding `keys` after the block whose hash is `parent`.
uint64_t block_hash(uint64_t parent, Span<const uint64_t> keys);

}  // namespace kuiper
