// Qwen3-VL's 3-D rotary positions for a prompt holding images (transformers' get_rope_index):
// text tokens advance all three axes together, an image's merged grid spreads over h and w, and
// tokens after an image continue at cache position + the delta the image leaves.
#pragma once

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "kuiper/base/status.h"

namespace kuiper {

struct RopeIndex {
  std::vector<int32_t> positions;  // [3, T] row-major: the t row, then the h row, then the w row
  int64_t delta = 0;               // max position + 1 - T: later tokens sit at cache pos + delta
  // Per image, in order: its first image-pad token and how many it has (merged_tokens).
  std::vector<std::pair<int64_t, int64_t>> spans;
};
// grids: (t, h, w) in patches per image, in the order the images appear in ids; merge: the vision
// tower's spatial_merge_size. Every image-pad token must belong to an image: image k takes the
// next t * (h / merge) * (w / merge) tokens, which must all be image_token_id.
Result<RopeIndex> qwen3_vl_rope_index(const std::vector<int32_t>& ids, int64_t image_token_id,
                                      int64_t merge,
                                      const std::vector<std::array<int64_t, 3>>& grids);

}  // namespace kuiper
