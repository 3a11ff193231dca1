// The grid of the one-row tensor-core GEMV (gemv_mma.cuh): how many teams a launch runs. Plain
// C++, shared by the launcher and its host-side test.
#pragma once

#include <cstdint>

namespace kuiper::cuda {

// Teams for `tiles` tiles where `fit` teams fit on the GPU at once: the fewest that keep the
// most tiles a team takes where all `fit` run, ceil(tiles / fit). The critical path is the same
// as with every team that fits; the SMs left over take the next kernel's blocks at once, which
// prepare before their PDL wait. The decode attention after q|k|v needs an SM a block, and no
// block fits beside one of two teams: on every SM its blocks waited for q|k|v to end, then
// prepared (H200, batch 1, Qwen2.5-7B int4, 288 tiles: 264 teams -> 144; the attention's start
// 3.4 -> 1.2 us after q|k|v's end, 498-499 -> 512-516 tok/s). At least one.
inline int64_t gemv_mma_teams(int64_t tiles, int64_t fit) {
  if (tiles <= 0) return 1;
  if (fit < 1) fit = 1;
  const int64_t most = (tiles + fit - 1) / fit;
  return (tiles + most - 1) / most;
}

}  // namespace kuiper::cuda
