// Images as the model takes them: pixel values in (for the vision tower), features out (for the
// decoder's image-pad rows). Decoding and preprocessing image files is the vision layer's job; the
// runtime turns its output into ImagePixels.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "kuiper/tensor/tensor.h"

namespace kuiper {

struct ImagePixels {
  // fp32 CPU [patches, patch_dim]: every image's patches concatenated in order, each image's in
  // the image processor's order (each run of merge^2 rows is one merged token's block).
  Tensor values;
  // (t, h, w) in patches per image, in order; h and w multiples of the merge size.
  std::vector<std::array<int64_t, 3>> grids;
};

// The vision tower's output for some images, one row per merged token (image-pad token), the
// images' rows in order.
struct ImageFeatures {
  Tensor embeds;                  // [N, hidden]: replace the image-pad tokens' embeddings
  std::vector<Tensor> deepstack;  // k-th: [N, hidden], added to those rows after decoder layer k
};

}  // namespace kuiper
