#include "kuiper/model/rope_index.h"

#include <algorithm>
#include <string>

namespace kuiper {

Result<RopeIndex> qwen3_vl_rope_index(const std::vector<int32_t>& ids, int64_t image_token_id,
                                      int64_t merge,
                                      const std::vector<std::array<int64_t, 3>>& grids) {
  const int64_t T = static_cast<int64_t>(ids.size());
  if (merge <= 0) return Status::Error("rope index: spatial merge size must be positive");
  RopeIndex r;
  r.positions.assign(static_cast<size_t>(3 * T), 0);
  int64_t next = 0;  // the position the next text token takes: the running max + 1
  size_t image = 0;
  for (int64_t i = 0; i < T;) {
    if (ids[static_cast<size_t>(i)] != image_token_id) {
      for (int a = 0; a < 3; ++a) r.positions[static_cast<size_t>(a * T + i)] = static_cast<int32_t>(next);
      ++next;
      ++i;
      continue;
    }
    if (image == grids.size()) {
      return Status::Error("the prompt has image tokens beyond its " + std::to_string(grids.size()) +
                           " image(s) (token " + std::to_string(i) + ")");
    }
    const auto& g = grids[image];
    if (g[0] <= 0 || g[1] <= 0 || g[2] <= 0 || g[1] % merge != 0 || g[2] % merge != 0) {
      return Status::Error("image " + std::to_string(image) + ": grid (" + std::to_string(g[0]) +
                           ", " + std::to_string(g[1]) + ", " + std::to_string(g[2]) +
                           ") is not a positive grid with h and w multiples of the merge size " +
                           std::to_string(merge));
    }
    const int64_t gt = g[0], gh = g[1] / merge, gw = g[2] / merge, n = gt * gh * gw;
    int64_t run = 0;
    while (i + run < T && ids[static_cast<size_t>(i + run)] == image_token_id) ++run;
    if (run < n) {
      return Status::Error("image " + std::to_string(image) + " needs " + std::to_string(n) +
                           " image tokens but the prompt has " + std::to_string(run) +
                           " at token " + std::to_string(i));
    }
    for (int64_t t = 0; t < gt; ++t) {
      for (int64_t h = 0; h < gh; ++h) {
        for (int64_t w = 0; w < gw; ++w) {
          const size_t k = static_cast<size_t>(i + (t * gh + h) * gw + w);
          r.positions[k] = static_cast<int32_t>(next + t);
          r.positions[static_cast<size_t>(T) + k] = static_cast<int32_t>(next + h);
          r.positions[static_cast<size_t>(2 * T) + k] = static_cast<int32_t>(next + w);
        }
      }
    }
    r.spans.emplace_back(i, n);
    next += std::max({gt, gh, gw});
    i += n;
    ++image;
  }
  if (image != grids.size()) {
    return Status::Error("the prompt has tokens for " + std::to_string(image) + " image(s) but " +
                         std::to_string(grids.size()) + " were given");
  }
  r.delta = next - T;
  return r;
}

}  // namespace kuiper
