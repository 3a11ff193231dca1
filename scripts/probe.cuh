// What the measurement probes in this folder share (each probe.cu includes it by its own folder,
// so the nvcc command in a probe's header still builds it alone): a check that stops the probe on
// a failed CUDA, cuBLAS or cuBLASLt call, and a deterministic fill of 16-bit buffers.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

inline const char* probe_status_name(cudaError_t e) { return cudaGetErrorString(e); }
template <typename Status>
const char* probe_status_name(Status) {
  return "";
}

// Stops the probe where x (a CUDA, cuBLAS or cuBLASLt status: 0 is success) fails, naming the
// call and where it stands.
#define CK(x)                                                                       \
  do {                                                                              \
    const auto ck_status_ = (x);                                                    \
    if (static_cast<int>(ck_status_) != 0) {                                        \
      std::printf("error %d %s at %s:%d: %s\n", static_cast<int>(ck_status_),       \
                  probe_status_name(ck_status_), __FILE__, __LINE__, #x);           \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

// p[i] in [-scale, scale), from a hash of i and the seed: the same values on every run.
__global__ void fill(__half* p, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t v = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    v ^= v >> 13;
    v *= 0x5bd1e995u;
    v ^= v >> 15;
    p[i] = __float2half(scale * ((v & 0xffff) / 32768.0f - 1.0f));
  }
}
