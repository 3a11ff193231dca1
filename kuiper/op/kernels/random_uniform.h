// The hash behind op::fill_random, shared by the CPU and CUDA kernels so both produce the same
// bits: splitmix64 of (seed, index), 24 random bits (exact in a float), one fused multiply-add
// (correctly rounded on both sides, so no compiler contraction choice can make them differ).
#pragma once

#include <cmath>
#include <cstdint>

#include "kuiper/op/kernels/host_device.h"

namespace kuiper {

inline KUIPER_HOST_DEVICE float random_uniform(uint64_t seed, uint64_t index, float scale,
                                               float offset) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
  return fmaf(scale, 2.0f * u - 1.0f, offset);
}

}  // namespace kuiper
