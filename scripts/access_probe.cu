// How the order of a warp's 16-byte loads over a weight matrix moves DRAM read bandwidth, at the
// same bytes in flight: the one-row GEMV's (a warp load reads 512 contiguous bytes of one row)
// against the tensor-core GEMV's (a warp load reads 64 bytes of each of 8 rows: lanes (g, c) take
// chunk c of row g) and the middle ground (128 bytes of 4 rows), and a layout where the
// tensor-core GEMV's loads would be contiguous (its 8 x 64 bytes stored together, as a
// pre-permuted weight would hold them). Each lane keeps kInFlight loads in flight and xors them
// into one word so nothing is optimised away. A measurement tool, not part of the build
// (docs/PERFORMANCE.md, issue 15's section):
//
//   nvcc -O3 -arch=sm_90 scripts/access_probe.cu -o /tmp/access_probe && /tmp/access_probe
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "probe.cuh"


constexpr int kInFlight = 8;  // 16-byte loads per lane between uses
constexpr int kThreads = 256;

// The matrix: rows x row_bytes, read once. A warp covers `rows_per_load` rows per load
// instruction, 512 / rows_per_load contiguous bytes of each; `packed` lays those pieces next to
// each other in memory (the address a lane reads is then warp base + 16 lane).
__global__ void read_kernel(const uint4* __restrict__ w, int64_t rows, int64_t row_bytes,
                            int rows_per_load, bool packed, uint32_t* sink) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / 32);
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  const int lanes_per_row = 32 / rows_per_load;
  const int64_t chunks_per_row = row_bytes / 16;
  // A tile is rows_per_load rows x chunks_per_row chunks (a tile of the GEMV); a unit is one round
  // of kInFlight loads over a tile. Each warp takes an equal run of consecutive units, so every
  // variant spreads the same bytes evenly and a warp walks along its rows.
  const int64_t tiles = rows / rows_per_load;
  const int64_t steps = chunks_per_row / lanes_per_row;  // load instructions over a tile
  const int64_t rounds = steps / kInFlight;              // units a tile
  const int64_t units = tiles * rounds;
  const int r = lane / lanes_per_row, c = lane % lanes_per_row;
  uint32_t acc = 0;
  for (int64_t u = units * warp / warps; u < units * (warp + 1) / warps; ++u) {
    const int64_t t = u / rounds, s0 = (u % rounds) * kInFlight;
    uint4 v[kInFlight];
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      const int64_t s = s0 + i;
      int64_t at;
      if (packed) {  // the tile's loads in issue order, 512 bytes each
        at = (t * steps + s) * 32 + lane;
      } else {  // row-major: row t * rows_per_load + r, chunk s * lanes_per_row + c
        at = (t * rows_per_load + r) * chunks_per_row + s * lanes_per_row + c;
      }
      v[i] = __ldcs(w + at);
    }
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
  }
  if (acc == 0x12345678u) *sink = acc;  // practically never: keeps the loads
}

int main() {
  const int64_t row_bytes = 4096 * 2;         // a 4096-wide fp16 row
  const int64_t rows = 24576;                 // Qwen3-8B gate|up: 201 MB
  const int64_t bytes = rows * row_bytes;
  const int copies = 3;                       // cycled so that L2 holds none of it
  uint4* w[copies];
  for (auto& p : w) {
    CK(cudaMalloc(&p, bytes));
    CK(cudaMemset(p, 1, bytes));
  }
  uint32_t* sink;
  CK(cudaMalloc(&sink, 4));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  printf("%lld MB a pass, %d SMs, %d loads of 16 bytes in flight a lane\n",
         static_cast<long long>(bytes >> 20), sms, kInFlight);
  for (int blocks_per_sm : {2, 4}) {
    for (int rows_per_load : {1, 4, 8}) {
      for (bool packed : {false, true}) {
        if (rows_per_load == 1 && packed) continue;  // already contiguous
        const int grid = sms * blocks_per_sm;
        auto pass = [&](int i) {
          read_kernel<<<grid, kThreads>>>(w[i % copies], rows, row_bytes, rows_per_load, packed,
                                          sink);
        };
        for (int i = 0; i < 3; ++i) pass(i);
        CK(cudaEventRecord(e0));
        const int reps = 30;
        for (int i = 0; i < reps; ++i) pass(i);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaGetLastError());
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double us = 1e3 * ms / reps;
        printf("%d blocks an SM, %d row(s) a warp load (%3d bytes each)%s: %7.1f us, %6.0f GB/s\n",
               blocks_per_sm, rows_per_load, static_cast<int>(512 / rows_per_load),
               packed ? ", packed" : "        ", us, bytes / us / 1e3);
      }
    }
  }
  return 0;
}
