// What sample.cu and sample_whole.cu share: the 32-bit order of warped logits (the sort's and the
// radix passes' key), which rows draw from the whole vocabulary, and the blocks' shapes.
#pragma once

#include <cub/cub.cuh>

#include <cstdint>

#include "kuiper/op/kernels/sample_math.h"
#include "kuiper/op/ops.h"

namespace kuiper::cuda::sampling {

inline constexpr int kThreads = 1024;
// The most tokens a row may keep for the radix select (one candidate a thread of the block).
inline constexpr int kSelectMost = kThreads;
// The radix passes: 11 + 11 + 10 bits of a 32-bit key, a histogram bin of 11 bits two a thread.
inline constexpr int kDigitBits = 11;
inline constexpr int kBins = 1 << kDigitBits;
static_assert(kBins == 2 * kThreads, "two histogram bins a thread");

using SelectScan = cub::BlockScan<unsigned, kThreads>;
using KeyReduce = cub::BlockReduce<uint32_t, kThreads>;
using MassScan = cub::BlockScan<unsigned long long, kThreads>;
using BlockReduce = cub::BlockReduce<double, kThreads>;

// Warped logit v's bits mapped to an unsigned order (sign flipped for positives, all bits for
// negatives) and inverted, so that ascending keys are the most likely first. -0 becomes +0: the
// CPU's comparison holds them equal (the lower id first).
inline __device__ uint32_t order_key(float v) {
  const uint32_t bits = __float_as_uint(v == 0.0f ? 0.0f : v);
  const uint32_t ordered = (bits & 0x80000000u) != 0 ? ~bits : (bits | 0x80000000u);
  return ~ordered;
}

// The warped logit a key holds (in its low 32 bits).
inline __device__ float key_value(uint64_t key) {
  const uint32_t ordered = ~static_cast<uint32_t>(key);
  return __uint_as_float((ordered & 0x80000000u) != 0 ? (ordered & 0x7fffffffu) : ~ordered);
}

// A block's histogram of sums in probability units (sample_math.h) as two 32-bit words a
// bin, so that every add is a native 32-bit shared atomic: v's low word into lo (its wrap
// carried) and its high word into hi. A bin's sum is hi * 2^32 + lo while it stays below 2^64 (a
// probability sum: at most 2^60).
struct FixedBins {
  unsigned lo[kBins];
  unsigned hi[kBins];
};
inline __device__ void add_fixed(FixedBins& bins, unsigned bin, unsigned long long v) {
  const unsigned low = static_cast<unsigned>(v);
  const unsigned old = atomicAdd(&bins.lo[bin], low);
  const unsigned high = static_cast<unsigned>(v >> 32) + (old + low < old ? 1u : 0u);
  if (high != 0) atomicAdd(&bins.hi[bin], high);
}
inline __device__ unsigned long long fixed_sum(const FixedBins& bins, int bin) {
  return (static_cast<unsigned long long>(bins.hi[bin]) << 32) + bins.lo[bin];
}

// The draw's shared memory in draw_by_id.
struct DrawById {
  FixedBins bins;
  typename MassScan::TempStorage scan;
  typename KeyReduce::TempStorage reduce;
  unsigned bin;
  unsigned long long below;
};

// The draw of one block over n kept tokens held in any order, token i with id id_of(i) (distinct,
// in [0, V)) and measure(i) in probability units: the token whose interval of the running sum of
// the measures in id order holds `target` (the uniform in units), or the largest id where
// target lies past the sum of all (a rounding gap at the top). A search over the ids' bits from
// the top, kDigitBits at a time (one pass where V <= 2^11, two where V <= 2^22): each pass sums
// the measures of the ids that share the bits found so far into a histogram of the next bits and
// keeps the bin that holds the target. Every thread of the block calls it; every thread gets the
// id.
template <typename IdOf, typename Measure>
__device__ int32_t draw_by_id(int64_t n, int64_t V, IdOf id_of, Measure measure,
                              unsigned long long target, DrawById& sh) {
  const int t = threadIdx.x;
  int high = 1;  // ids < 2^high
  while (high < 31 && (int64_t{1} << high) < V) ++high;
  uint32_t prefix = 0, mask = 0;
  unsigned long long below = 0;
  for (bool first = true; high > 0; first = false) {
    const int low = high > kDigitBits ? high - kDigitBits : 0;
    const uint32_t digit_mask = (1u << (high - low)) - 1u;
    for (int b = 2 * t; b < 2 * t + 2; ++b) {
      sh.bins.lo[b] = 0;
      sh.bins.hi[b] = 0;
    }
    __syncthreads();
    for (int64_t i = t; i < n; i += kThreads) {
      const uint32_t id = static_cast<uint32_t>(id_of(i));
      if ((id & mask) == prefix) add_fixed(sh.bins, (id >> low) & digit_mask, measure(i));
    }
    __syncthreads();
    const unsigned long long h0 = fixed_sum(sh.bins, 2 * t), h1 = fixed_sum(sh.bins, 2 * t + 1);
    unsigned long long before = 0, all = 0;
    MassScan(sh.scan).ExclusiveSum(h0 + h1, before, all);
    if (first && target >= all) {  // every thread sees the same
      uint32_t last = 0;
      for (int64_t i = t; i < n; i += kThreads) last = max(last, static_cast<uint32_t>(id_of(i)));
      last = KeyReduce(sh.reduce).Reduce(last, [](uint32_t x, uint32_t y) { return max(x, y); });
      if (t == 0) sh.bin = last;
      __syncthreads();
      return static_cast<int32_t>(sh.bin);
    }
    const unsigned long long start = below + before;
    if (start <= target && target < start + h0) {
      sh.bin = 2 * t;
      sh.below = start;
    } else if (start + h0 <= target && target < start + h0 + h1) {
      sh.bin = 2 * t + 1;
      sh.below = start + h0;
    }
    __syncthreads();
    prefix |= sh.bin << low;
    mask |= digit_mask << low;
    below = sh.below;
    __syncthreads();  // the bin is read before the next pass writes it
    high = low;
  }
  return static_cast<int32_t>(prefix);
}

// Whether a row draws from its whole vocabulary but for top-p and min-p (top-k 0: the OpenAI
// API's default), past what the select keeps: sample_whole.cu's rows.
inline __host__ __device__ bool draws_whole(const op::SampleParams& p, int64_t V) {
  return p.temperature != 0.0f && (p.top_k <= 0 || p.top_k >= V) && V > kSelectMost;
}

}  // namespace kuiper::cuda::sampling
