#include "kuiper/runtime/cache_keys.h"

namespace kuiper {

namespace {

// splitmix64's finaliser: every input bit moves every output bit.
uint64_t mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Token ids fit in 32 bits; image keys set the top bit, so the two never meet.
constexpr uint64_t kImageKeyBit = 1ull << 63;

}  // namespace

uint64_t image_fingerprint(const ProcessedImage& image) {
  uint64_t h = 14695981039346656037ull;
  auto add = [&h](const void* data, size_t size) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) h = (h ^ p[i]) * 1099511628211ull;
  };
  add(image.grid.data(), sizeof(image.grid));
  add(image.pixel_values.data(), image.pixel_values.size() * sizeof(float));
  return h;
}

std::vector<uint64_t> token_keys(const std::vector<int32_t>& ids, int32_t image_pad_id,
                                 const std::vector<uint64_t>& fingerprints) {
  std::vector<uint64_t> keys(ids.size());
  size_t image = 0;
  for (size_t i = 0; i < ids.size();) {
    if (image_pad_id < 0 || ids[i] != image_pad_id || image >= fingerprints.size()) {
      keys[i] = token_key(ids[i]);
      ++i;
      continue;
    }
    const uint64_t fingerprint = fingerprints[image++];
    for (uint64_t k = 0; i < ids.size() && ids[i] == image_pad_id; ++i, ++k) {
      keys[i] = kImageKeyBit | (mix(fingerprint ^ mix(k)) >> 1);
    }
  }
  return keys;
}

uint64_t block_hash(uint64_t parent, Span<const uint64_t> keys) {
  uint64_t h = mix(parent);
  for (uint64_t key : keys) h = mix(h ^ mix(key + kRootBlockHash));
  return h;
}

}  // namespace kuiper
