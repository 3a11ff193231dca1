// What the CPU and CUDA samplers share so that both pick the same token: the units the draw sums
// probabilities in, and which rows renormalise.
#pragma once

#include <cstdint>

#include "kuiper/op/kernels/host_device.h"
#include "kuiper/op/ops.h"

namespace kuiper {

// Whole units of 2^-60. Integer sums are exact, so they are the same in any order (a GPU's blocks
// add theirs in whatever order they finish); a float probability is a whole number of units down
// to 2^-37, below that it is rounded down.
inline KUIPER_HOST_DEVICE unsigned long long probability_units(double p) {
  return static_cast<unsigned long long>(p * 1152921504606846976.0);  // 2^60
}

// Whether the warpers may drop tokens of a row of V (top-k below V, top-p below 1, min-p above
// 0); only such rows renormalise what they keep. A row that keeps its whole vocabulary draws from
// the softmax as it is (its probabilities add up to 1 within rounding either way).
inline KUIPER_HOST_DEVICE bool cuts_vocabulary(const op::SampleParams& p, int64_t V) {
  return (p.top_k > 0 && p.top_k < V) || p.top_p < 1.0f || p.min_p > 0.0f;
}

}  // namespace kuiper
