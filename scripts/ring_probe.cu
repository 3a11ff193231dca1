// What a GEMM that streams its weights through shared memory can read from DRAM, by the bytes it
// keeps in flight: one block an SM (256 threads) streams a weight matrix of 4096 16-bit columns
// (Qwen3-8B's q|k|v, 6144 rows, and gate|up, 24576) as units of BN rows x UB bytes a row, each
// block an equal run of consecutive units (along K, then the next BN rows: stream-K's order),
// through a ring of as many units as fit 160 KB (at most 12) by cp.async (every thread 16 bytes at
// a time), and of 180 KB by 1-D bulk copies (cp.async.bulk, one a row, issued by one warp,
// completing on an mbarrier). Nothing is computed. A measurement tool, not part of the build
// (docs/PERFORMANCE.md, issue 13's section, the GEMM of tens of rows):
//
//   nvcc -O3 -arch=sm_90 scripts/ring_probe.cu -o /tmp/ring_probe && /tmp/ring_probe
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>

#include "probe.cuh"
__device__ __forceinline__ void cp16(uint32_t d, const void* s) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(s));
}
template <int S>
__global__ void __launch_bounds__(256, 1) ring_s(const uint4* w, int rows, int row_chunks, int BN, int UC, uint32_t* sink) {
  extern __shared__ uint4 sm[];
  const int unit_chunks = BN * UC;
  const int ks = row_chunks / UC, tiles = rows / BN;
  const int64_t units = (int64_t)tiles * ks;
  const int64_t b0 = blockIdx.x * units / gridDim.x, b1 = (blockIdx.x + 1) * units / gridDim.x;
  const int n = (int)(b1 - b0);
  auto load = [&](int i) {
    const int64_t u = b0 + i; const int t = u / ks, k = u % ks;
    uint4* d = sm + (i % S) * unit_chunks;
    for (int j = threadIdx.x; j < unit_chunks; j += 256) {
      const int r = j / UC, c = j % UC;
      cp16((uint32_t)__cvta_generic_to_shared(d + j), w + (int64_t)(t * BN + r) * row_chunks + k * UC + c);
    }
  };
#pragma unroll
  for (int i = 0; i < S - 1; ++i) { if (i < n) load(i); asm volatile("cp.async.commit_group;\n"); }
  uint32_t acc = 0;
  for (int i = 0; i < n; ++i) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(S - 2));
    __syncthreads();
    if (i + S - 1 < n) load(i + S - 1);
    asm volatile("cp.async.commit_group;\n");
    const uint4* d = sm + (i % S) * unit_chunks;
    acc ^= d[threadIdx.x % unit_chunks].x;
  }
  if (acc == 12345) sink[0] = acc;
}

__device__ __forceinline__ uint32_t sa(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void bar_wait(uint32_t bar, uint32_t parity) {
  asm volatile("{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
// 1-D bulk copies (TMA, no tensor map), one a row of a unit, rows padded by 16 bytes in shared memory.
template <int S>
__global__ void __launch_bounds__(256, 1) bulk_s(const char* w, int rows, int row_bytes, int BN, int UB, uint32_t* sink) {
  extern __shared__ __align__(128) char smb[];
  __shared__ __align__(8) uint64_t full[S];
  const int stride = UB + 16, unit_bytes = BN * stride;
  const int ks = row_bytes / UB, tiles = rows / BN;
  const int64_t units = (int64_t)tiles * ks;
  const int64_t b0 = blockIdx.x * units / gridDim.x, b1 = (blockIdx.x + 1) * units / gridDim.x;
  const int n = (int)(b1 - b0);
  if (threadIdx.x == 0) {
    for (int i = 0; i < S; ++i) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(sa(&full[i])));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  auto issue = [&](int i) {  // warp 0
    const int64_t u = b0 + i; const int t = u / ks, k = u % ks;
    const int slot = i % S;
    const uint32_t bar = sa(&full[slot]);
    if (threadIdx.x == 0) asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(BN * UB) : "memory");
    __syncwarp();
    for (int r = threadIdx.x; r < BN; r += 32) {
      const char* src = w + (int64_t)(t * BN + r) * row_bytes + (int64_t)k * UB;
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                   ::"r"(sa(smb + slot * unit_bytes + r * stride)), "l"(src), "r"(UB), "r"(bar) : "memory");
    }
  };
  if (threadIdx.x < 32) for (int i = 0; i < S && i < n; ++i) issue(i);
  uint32_t acc = 0;
  for (int i = 0; i < n; ++i) {
    bar_wait(sa(&full[i % S]), (i / S) & 1);
    acc ^= *(const uint32_t*)(smb + (i % S) * unit_bytes + (threadIdx.x % BN) * stride);
    __syncthreads();
    if (threadIdx.x < 32 && i + S < n) issue(i + S);
  }
  if (acc == 12345) sink[0] = acc;
}
int main() {
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int64_t K = 4096;  // halves a row
  const int row_chunks = K * 2 / 16;
  const int Ns[] = {6144, 24576};
  const int copies = 4;
  uint4* w; uint32_t* sink;
  const int64_t max_bytes = (int64_t)24576 * K * 2;
  CK(cudaMalloc(&w, max_bytes * copies)); CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(w, 1, max_bytes * copies));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  printf("| rows | BN | bytes a row a unit | stages | KB in flight | GB/s |\n|---|---|---|---|---|---|\n");
  for (int N : Ns) for (int BN : {16, 32, 64, 128}) for (int UB : {128, 256, 512, 1024}) {
    const int UC = UB / 16, unit_bytes = BN * UB;
    if (unit_bytes < 4096 || unit_bytes > 65536) continue;
    int S = 160 * 1024 / unit_bytes; if (S > 12) S = 12; if (S < 3) continue;
    const size_t smem = (size_t)S * unit_bytes;
    auto run = [&](int c) {
      const uint4* wc = w + (int64_t)c * (max_bytes / 16);
      switch (S) {
#define CASE(s) case s: cudaFuncSetAttribute(ring_s<s>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem); ring_s<s><<<sms, 256, smem>>>(wc, N, row_chunks, BN, UC, sink); break;
        CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8) CASE(9) CASE(10) CASE(11) CASE(12)
      }
    };
    for (int i = 0; i < 8; ++i) run(i % copies);
    CK(cudaDeviceSynchronize());
    const int reps = 40;
    cudaEventRecord(e0);
    for (int i = 0; i < reps; ++i) run(i % copies);
    cudaEventRecord(e1); CK(cudaEventSynchronize(e1));
    float ms; cudaEventElapsedTime(&ms, e0, e1);
    const double bytes = (double)N * K * 2;
    printf("| %d | %d | %d | %d | %d | %.0f |\n", N, BN, UB, S, (S - 1) * unit_bytes / 1024, bytes * reps / (ms * 1e-3) / 1e9);
    // bulk: S units of (UB + 16) x BN
    int SB = 180 * 1024 / (BN * (UB + 16)); if (SB > 12) SB = 12; if (SB < 2) continue;
    const size_t smemb = (size_t)SB * BN * (UB + 16);
    auto runb = [&](int c) {
      const char* wc = (const char*)(w + (int64_t)c * (max_bytes / 16));
      switch (SB) {
#define CASEB(s) case s: cudaFuncSetAttribute(bulk_s<s>, cudaFuncAttributeMaxDynamicSharedMemorySize, smemb); bulk_s<s><<<sms, 256, smemb>>>(wc, N, (int)(K * 2), BN, UB, sink); break;
        CASEB(2) CASEB(3) CASEB(4) CASEB(5) CASEB(6) CASEB(7) CASEB(8) CASEB(9) CASEB(10) CASEB(11) CASEB(12)
      }
    };
    for (int i = 0; i < 8; ++i) runb(i % copies);
    CK(cudaDeviceSynchronize());
    cudaEventRecord(e0);
    for (int i = 0; i < reps; ++i) runb(i % copies);
    cudaEventRecord(e1); CK(cudaEventSynchronize(e1));
    cudaEventElapsedTime(&ms, e0, e1);
    printf("| %d | %d | %d bulk | %d | %d | %.0f |\n", N, BN, UB, SB, SB * BN * UB / 1024, bytes * reps / (ms * 1e-3) / 1e9);
  }
  return 0;
}
