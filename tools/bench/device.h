// What the GPU is and how much of it is free, and its copy bandwidth: the ceiling memory-bound
// figures are compared with.
#pragma once

#include <cstddef>

#include <nlohmann/json.hpp>

#include "kuiper/base/status.h"

namespace kuiper::bench {

using nlohmann::json;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Device-to-device copy bandwidth, counting bytes read plus bytes written: the ceiling a
// memory-bound kernel can hope for on this GPU.
Result<double> copy_bandwidth_gbs();
// What the GPU is, for the JSON header.
json device_info();
// Free bytes a model can use: what CUDA has free plus the caching allocator's cached blocks
// (released to whoever asks next).
size_t usable_bytes();
// Memory in use on the device by every process, GiB.
double device_used_gib();

}  // namespace kuiper::bench
