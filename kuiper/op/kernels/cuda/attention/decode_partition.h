// The balanced work partition of the fp16 flash2 split-KV decode (flash-decoding), shared by the
// kernel and its host-side tests (plain C++: no CUDA types).
//
// The work is `units` (kv head, head group) pairs times `len` keys each, flattened unit-major
// into [0, units * len); a paged batch lays its sequences' units one after another, each of its
// own sequence's length (flash2_decode.cu), and the arithmetic below is the same. A launch has a fixed grid of `grid` blocks (fixed on the host from the
// SM count, never from the position), of which the first decode_blocks(work, grid, units) hold keys:
// block b takes [work * b / blocks, work * (b + 1) / blocks), so every block gets the same
// number of keys to within one and a block may cross from one unit into the next (writing one
// partial per unit it touches). Everything here depends on len, which only the device knows in
// device-position decode, so the kernel recomputes it each launch.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KUIPER_DECODE_HD __host__ __device__ __forceinline__
#else
#define KUIPER_DECODE_HD inline
#endif

namespace kuiper::op::cuda_attention {

// Fewest keys a block takes (one tile of the kernel): short contexts use fewer blocks rather
// than blocks that each load a mostly empty tile.
constexpr int kDecodeMinBlockKeys = 64;

// Blocks that hold keys: `grid`, or when the work does not fill that many with the minimum
// each, fewer: rounded down to a multiple of `units` (when there are at least that many), so a
// grid that is a multiple of `units` keeps every block inside one unit. A multiple of `units`
// divides each unit's keys evenly with no block crossing into the next (block u * s + j of s
// per unit starts at u * len + floor(j * len / s)); measured on the H100 (32 q / 8 kv heads,
// d 128), 132 balanced blocks whose ranges cross units (17.1 us at 4096 keys, 57.8 at 32768)
// lose to 128 that do not (14.3, 54.9): a crossing block restarts its load pipeline and writes
// a second partial, which costs more than the 3% of SMs it wins back.
KUIPER_DECODE_HD int decode_blocks(int64_t work, int grid, int units) {
  const int64_t most = (work + kDecodeMinBlockKeys - 1) / kDecodeMinBlockKeys;
  if (most >= grid) return grid;
  int blocks = static_cast<int>(most < 1 ? 1 : most);
  if (blocks >= units) blocks -= blocks % units;
  return blocks;
}

// The grid a launch asks for (before decode_blocks trims it to the work), from the unit count,
// the SMs and `resident`, the blocks that fit at once with the merge area the group needs. While
// the units are no more than the SMs, blocks split units and each keeps an SM to itself (one
// long range streams better than two short ones): the largest multiple of the units that fits
// the SMs. Past that, blocks hold whole units and every block that fits runs (more loads in
// flight). Figures in flash2_decode.cu (launch_decode_tc).
KUIPER_DECODE_HD int decode_default_grid(int units, int sms, int64_t resident) {
  if (units <= sms) return sms / units * units;
  return static_cast<int>(resident > sms ? resident : sms);
}

// Whether blocks of this grid must keep an SM each (they ask for shared memory that leaves no
// room for a second): any grid that fits the SMs one a block.
KUIPER_DECODE_HD bool decode_block_alone(int grid, int sms) { return grid <= sms; }

// First flat key of block b (b == blocks gives the end of the work).
KUIPER_DECODE_HD int64_t decode_block_begin(int64_t work, int blocks, int b) {
  return work * b / blocks;
}

// The block whose range holds flat key x: the largest b with begin(b) <= x, i.e.
// floor(b * work / blocks) <= x  <=>  b * work < (x + 1) * blocks.
KUIPER_DECODE_HD int decode_block_of(int64_t work, int blocks, int64_t x) {
  return static_cast<int>(((x + 1) * blocks + work - 1) / work - 1);
}

}  // namespace kuiper::op::cuda_attention
