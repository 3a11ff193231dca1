// What sample.cu and sample_whole.cu share: the 32-bit order of warped logits (the sort's and the
// radix passes' key), which rows draw from the whole vocabulary, and the blocks' shapes.
#pragma once

#include <cub/cub.cuh>

#include <cstdint>

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

// Whether a row draws from its whole vocabulary but for top-p and min-p (top-k 0: the OpenAI
// API's default), past what the select keeps: sample_whole.cu's rows.
inline __host__ __device__ bool draws_whole(const op::SampleParams& p, int64_t V) {
  return p.temperature != 0.0f && (p.top_k <= 0 || p.top_k >= V) && V > kSelectMost;
}

}  // namespace kuiper::cuda::sampling
