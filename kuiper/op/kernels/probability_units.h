// The units the draw sums probabilities in, shared by the CPU and CUDA samplers so both walk the
// same running sum: whole units of 2^-60. Integer sums are exact, so they are the same in any
// order (a GPU's blocks add theirs in whatever order they finish); a float probability is a whole
// number of units down to 2^-37, below that it is rounded down.
#pragma once

#include <cstdint>

#include "kuiper/op/kernels/host_device.h"

namespace kuiper {

inline KUIPER_HOST_DEVICE unsigned long long probability_units(double p) {
  return static_cast<unsigned long long>(p * 1152921504606846976.0);  // 2^60
}

}  // namespace kuiper
