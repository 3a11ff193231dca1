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

// Fewest keys a block takes: short contexts use fewer blocks, each of one to two of the kernel's
// 64-key tiles, rather than many blocks of one. Fewer blocks start sooner beside the GEMV before
// them, which leaves only some SMs free, and leave fewer partials to combine; each block's range
// is longer. Measured on the H200 (kuiper-bench, bf16, int4 weights and lm_head, batch 1, 512 +
// 128 tokens, graph; two runs each; the twenty-eighth session), 64 / 96 / 128 / 192 keys:
// Qwen2.5-7B (4 units: 40 / 28 / 20 / 12 blocks) 512.7, 505.7 / 517.1, 517.0 / 505.7, 507.3 /
// 485.3, 493.0 tok/s; Qwen3-8B (8 units: 80 / 48 / 40 / 24) 443.8, 444.4 / 451.5, 450.6 / 453.6,
// 455.6 / 437.0, 435.6. Past a few sequences, or at 4096 keys, the grid is full either way.
constexpr int kDecodeMinBlockKeys = 96;

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

// Blocks a thread block cluster when `blocks` hold the keys of `units` (1: no clusters). Where
// they are exactly two a unit, each unit's pair runs as one cluster: the two split the unit's
// keys evenly, each leaves its partial in its own shared memory and the first merges both
// through distributed shared memory (flash2_decode.cu), where unclustered blocks pass their
// partials through L2 and the last to arrive, found by an atomic, merges them. Measured on the
// H200 (Qwen3-8B fp16, kuiper-bench --throughput at 448 + 128 tokens), in clusters against
// without: 8 sequences (64 units, 128 blocks) 1391-1401 -> 1445-1453 tok/s, 8 at 3968 + 128
// 1060 -> 1087; but 4 sequences in clusters of 4 (the same 128 blocks) 759-761 -> 682-684 and 2
// in clusters of 8 407 -> 375, one sequence (64 blocks) in clusters of 8 no different (216.4 ->
// 215.9): a larger cluster is placed on the SMs of one GPC at once and waits for its slowest.
KUIPER_DECODE_HD int decode_cluster_blocks(int blocks, int units) {
  return blocks == 2 * units ? 2 : 1;
}

// Whole units a block, where a batch has more (sequence, kv head, head group) units than the
// grid has blocks: block b then holds units [b * run, (b + 1) * run), writes each straight to
// out, and no unit goes through partials and the combine. The host takes a run (and the grid of
// ceil(units / run) blocks) where runs of whole units fill the grid to within
// kDecodeUnitRunSlack percent (decode_unit_run); the device keeps it only where the lengths
// allow too (decode_keeps_unit_run), else it splits the same grid's keys evenly as above. Measured
// on the H200 (32 q / 8 kv heads, d 128, 512 keys a sequence, us alone; Qwen3-8B fp16 full-batch
// decode tok/s; twenty-ninth session, two calls), the balanced split against this: 64 sequences
// (512 units on 256 blocks of 2, against 264 balanced) 48.9, 49.4 -> 38.7, 38.7 us and 9018,
// 8730 -> 9407, 9247 tok/s; 256 (2048 units, 256 blocks of 8) 167.4, 168.5 -> 140.7, 142.8 us and
// 16767, 15774 -> 17850, 16708. (As an environment switch first, the rule alone gave 49.1 -> 44.2
// us at 64; the rest came with this form of the kernel, whose one sequence of 32768 keys, which
// never runs whole units, also went 46.6, 46.4 -> 39.7, 39.6 us: docs/PERFORMANCE.md.)
constexpr int kDecodeUnitRunSlack = 5;  // percent

// The units a block of `grid` holds whole (0: none, the balanced split).
KUIPER_DECODE_HD int decode_unit_run(int units, int grid) {
  if (grid < 1 || units <= grid) return 0;
  const int run = (units + grid - 1) / grid;
  return int64_t{100} * run * grid <= int64_t{100 + kDecodeUnitRunSlack} * units ? run : 0;
}

// How much longer than an even share (percent) the longest block of runs of `run` whole units
// may stream before the balanced split is faster: one unit's worth, 100 / run (rounded up), and
// at least kDecodeUnitRunSlack. The balanced split cuts about two units a block, so its partials
// and their combine weigh most where a block holds few units, and the blocks of runs share the
// SMs' bandwidth, so the longest one costs less than its length. Measured on the H200
// (`kuiper-bench --attention-only --attention flash2 --dtype fp16 --decode-batch 64,256 --kv-len
// 512 --kv-len-spread S`: lengths spread evenly over 512 -/+ S / 2, us, balanced split against
// runs; thirty-first session): 64 sequences (runs of 2) S = 128: 45.5 / 39.5, 256: 45.6 / 40.3,
// 512: 45.9 / 45.4, 960: 66.9 / 55.9; 256 sequences (runs of 8) S = 128: 151.4 / 146.8, 256:
// 152.7 / 155.3, 512: 160.7 / 178.5 (equal lengths: 38.6 and 142.9 us).
KUIPER_DECODE_HD int decode_unit_run_slack(int run) {
  const int unit = run > 0 ? (100 + run - 1) / run : 0;
  return unit > kDecodeUnitRunSlack ? unit : kDecodeUnitRunSlack;
}

// Whether `blocks` blocks of `run` whole units each stay within decode_unit_run_slack of the
// balanced share when the longest sequence has `longest` keys and all of them `work` (flattened)
// keys: a block holding run units of the longest sequence streams at most that much longer than
// an even split.
KUIPER_DECODE_HD bool decode_keeps_unit_run(int64_t work, int64_t longest, int run, int blocks) {
  return run > 0 &&
         100 * run * longest * blocks <= (100 + decode_unit_run_slack(run)) * work;
}

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
