// Whether warpgroup MMA (wgmma, sm_90a) keeps a GEMM of 64 rows of x streaming its weights at
// the rate a bare cp.async ring reaches (scripts/ring_probe.cu). It takes the ring of
// docs/experiments/gemm-rows.patch (stream-K over units of 128 weight rows, one block an SM,
// 128-byte swizzled rows) and does the arithmetic on wgmma m64n64k16 instead of mma.sync: each of
// the block's two warpgroups takes 64 weight rows x the 64 rows of x, both operands read from the
// ring by descriptors. Variants: units of 64 or 128 columns, wgmma groups waited for each unit or
// kept one in flight, weights and x in rings of their own, units of 256 weight rows (x's share
// of the ring halved), and a producer warpgroup that copies while the other two compute
// (mbarriers, no block barrier). Cut tiles are added into out by
// fp32 atomics (a probe: the order of the sum is free). It checks every variant against cuBLAS,
// then times them beside cuBLAS on Qwen3-8B's q|k|v, o, gate|up and down with the weights cold. A
// measurement tool, not part of the build (docs/PERFORMANCE.md, issue 13's section, the GEMM of
// tens of rows):
//
//   nvcc -O3 -gencode arch=compute_90a,code=sm_90a scripts/wgmma_probe.cu -lcublas -o /tmp/wgmma_probe && /tmp/wgmma_probe
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "probe.cuh"


constexpr int kT = 64;           // rows of x
constexpr int kBN = 128;         // weight rows a tile (two warpgroups of 64)
constexpr int kWBytes = kBN * 64 * 2;  // a 64-column half: 128-byte rows, the swizzle's width
constexpr int kXBytes = kT * 64 * 2;
constexpr int kStageBytes = kWBytes + kXBytes;  // of a 64-column unit: 24 KB

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
// A K-major operand of 128-byte rows, 128-byte swizzle (chunk c of row r at c ^ (r % 8)), rows
// packed (8-row groups 1024 bytes apart).
__device__ __forceinline__ uint64_t descriptor(uint32_t addr) {
  uint64_t d = (addr & 0x3FFFF) >> 4;
  d |= uint64_t{1} << 16;              // leading byte offset: unused for swizzled K-major
  d |= uint64_t{1024 >> 4} << 32;      // stride byte offset: the next 8 rows
  d |= uint64_t{1} << 62;              // 128-byte swizzle
  return d;
}
__device__ __forceinline__ void wgmma_64x64x16(float (&d)[32], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(1));
}

// kHalves: a unit is kHalves x 64 columns (16 or 32 KB of weights), each 64-column half its own
// swizzled region. kOverlap: a unit's wgmma group stays in flight while the next unit's is
// issued (wait for all but the newest), and the ring loads kStages - 2 units ahead, so that the
// slot it fills was read two units ago; otherwise each unit waits for its group and the ring
// loads kStages - 1 ahead.
template <int kStages, int kHalves, bool kOverlap>
__global__ void __launch_bounds__(256, 1)
    wgmma_gemm(const half* __restrict__ w, const half* __restrict__ x, float* out, int N, int K) {
  constexpr int kUnitCols = 64 * kHalves, kStage = kHalves * kStageBytes;
  constexpr int kAhead = kOverlap ? kStages - 2 : kStages - 1;
  extern __shared__ uint8_t raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t{1023});
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;
  const int ks = K / kUnitCols, tiles = N / kBN;
  const int64_t units = int64_t{tiles} * ks;
  const int64_t begin = blockIdx.x * units / gridDim.x, end = (blockIdx.x + 1) * units / gridDim.x;
  const int n = static_cast<int>(end - begin);
  int load_tile = static_cast<int>(begin / ks), load_k = static_cast<int>(begin % ks);
  // A stage: the weights' halves (16 KB each), then x's (8 KB each).
  auto load = [&](int i) {
    uint8_t* st = smem + (i % kStages) * kStage;
#pragma unroll
    for (int q = 0; q < kHalves * kWBytes / 16 / 256; ++q) {
      const int j = tid + 256 * q, h = j / 1024, r = (j % 1024) / 8, ch = j % 8;
      cp16(smem_u32(st + h * kWBytes + r * 128 + ((ch ^ (r & 7)) * 16)),
           w + int64_t(load_tile * kBN + r) * K + load_k * kUnitCols + h * 64 + ch * 8);
    }
#pragma unroll
    for (int q = 0; q < kHalves * kXBytes / 16 / 256; ++q) {
      const int j = tid + 256 * q, h = j / 512, r = (j % 512) / 8, ch = j % 8;
      cp16(smem_u32(st + kHalves * kWBytes + h * kXBytes + r * 128 + ((ch ^ (r & 7)) * 16)),
           x + int64_t(r) * K + load_k * kUnitCols + h * 64 + ch * 8);
    }
    if (++load_k == ks) { load_k = 0; ++load_tile; }
  };
#pragma unroll
  for (int i = 0; i < kAhead; ++i) {
    if (i < n) load(i);
    asm volatile("cp.async.commit_group;\n");
  }
  float acc[32];
#pragma unroll
  for (int e = 0; e < 32; ++e) acc[e] = 0.0f;
  int tile = static_cast<int>(begin / ks), k = static_cast<int>(begin % ks);
  for (int i = 0; i < n; ++i) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kAhead - 1));
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();  // unit i is in; the slot loaded next was last read by finished wgmma groups
    if (i + kAhead < n) load(i + kAhead);
    asm volatile("cp.async.commit_group;\n");
    const uint32_t st = smem_u32(smem + (i % kStages) * kStage);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      const uint32_t a0 = st + h * kWBytes + wg * 64 * 128, b0 = st + kHalves * kWBytes + h * kXBytes;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        wgmma_64x64x16(acc, descriptor(a0 + kk * 32), descriptor(b0 + kk * 32));
      }
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    const bool tile_ends = k == ks - 1;
    if (++k == ks) k = 0;
    if (kOverlap && !(tile_ends || i == n - 1)) {
      asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
      continue;
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    if (tile_ends || i == n - 1) {
      // acc[4j + e]: weight row 16 warp + g (+ 8 for e >= 2) of the warpgroup's 64, x row 8 j + 2 c
      // (+ 1 for odd e).
      const int row = tile * kBN + wg * 64 + warp * 16 + g;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int t = 8 * j + 2 * c;
        atomicAdd(out + int64_t(t) * N + row, acc[4 * j]);
        atomicAdd(out + int64_t(t + 1) * N + row, acc[4 * j + 1]);
        atomicAdd(out + int64_t(t) * N + row + 8, acc[4 * j + 2]);
        atomicAdd(out + int64_t(t + 1) * N + row + 8, acc[4 * j + 3]);
      }
#pragma unroll
      for (int e = 0; e < 32; ++e) acc[e] = 0.0f;
      ++tile;
    }
  }
}

// Weights and x in rings of their own, 128-column units: warpgroup 0 copies the weights (kWStages
// units of 32 KB, kWStages - 1 ahead), warpgroup 1 x's tiles (kXStages of 16 KB, kXStages - 1
// ahead: x comes from L2), each waiting for its own copies; both then compute. Each unit waits for
// its wgmma group.
template <int kWStages, int kXStages>
__global__ void __launch_bounds__(256, 1)
    wgmma_split(const half* __restrict__ w, const half* __restrict__ x, float* out, int N, int K) {
  constexpr int kUnitCols = 128, kW = 2 * kWBytes, kX = 2 * kXBytes;
  extern __shared__ uint8_t raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t{1023});
  uint8_t* xs = smem + kWStages * kW;
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const int g = lane / 4, c = lane % 4, t128 = tid % 128;
  const int ks = K / kUnitCols, tiles = N / kBN;
  const int64_t units = int64_t{tiles} * ks;
  const int64_t begin = blockIdx.x * units / gridDim.x, end = (blockIdx.x + 1) * units / gridDim.x;
  const int n = static_cast<int>(end - begin);
  int load_tile = static_cast<int>(begin / ks), load_k = static_cast<int>(begin % ks);
  auto advance = [&]() {
    if (++load_k == ks) { load_k = 0; ++load_tile; }
  };
  auto load_w = [&]() {  // the next unit's weights (warpgroup 0)
    uint8_t* st = smem + ((load_tile * ks + load_k - begin) % kWStages) * kW;
#pragma unroll
    for (int q = 0; q < kW / 16 / 128; ++q) {
      const int j = t128 + 128 * q, h = j / 1024, r = (j % 1024) / 8, ch = j % 8;
      cp16(smem_u32(st + h * kWBytes + r * 128 + ((ch ^ (r & 7)) * 16)),
           w + int64_t(load_tile * kBN + r) * K + load_k * kUnitCols + h * 64 + ch * 8);
    }
  };
  auto load_x = [&]() {  // the next unit's x (warpgroup 1)
    uint8_t* st = xs + ((load_tile * ks + load_k - begin) % kXStages) * kX;
#pragma unroll
    for (int q = 0; q < kX / 16 / 128; ++q) {
      const int j = t128 + 128 * q, h = j / 512, r = (j % 512) / 8, ch = j % 8;
      cp16(smem_u32(st + h * kXBytes + r * 128 + ((ch ^ (r & 7)) * 16)),
           x + int64_t(r) * K + load_k * kUnitCols + h * 64 + ch * 8);
    }
  };
  const int ahead = wg == 0 ? kWStages - 1 : kXStages - 1;
  int issued = 0;  // units this warpgroup has asked for
  for (; issued < ahead; ++issued) {
    if (issued < n) { if (wg == 0) load_w(); else load_x(); advance(); }
    asm volatile("cp.async.commit_group;\n");
  }
  float acc[32];
#pragma unroll
  for (int e = 0; e < 32; ++e) acc[e] = 0.0f;
  int tile = static_cast<int>(begin / ks), k = static_cast<int>(begin % ks);
  for (int i = 0; i < n; ++i) {
    if (wg == 0) {
      asm volatile("cp.async.wait_group %0;\n" ::"n"(kWStages - 2));
    } else {
      asm volatile("cp.async.wait_group %0;\n" ::"n"(kXStages - 2));
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();  // unit i is in; every warpgroup is done with unit i - 1
    if (issued < n) { if (wg == 0) load_w(); else load_x(); advance(); }
    ++issued;
    asm volatile("cp.async.commit_group;\n");
    const uint32_t sw = smem_u32(smem + (i % kWStages) * kW), sx = smem_u32(xs + (i % kXStages) * kX);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t a0 = sw + h * kWBytes + wg * 64 * 128, b0 = sx + h * kXBytes;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        wgmma_64x64x16(acc, descriptor(a0 + kk * 32), descriptor(b0 + kk * 32));
      }
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    const bool tile_ends = k == ks - 1;
    if (++k == ks) k = 0;
    if (tile_ends || i == n - 1) {
      const int row = tile * kBN + wg * 64 + warp * 16 + g;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int t = 8 * j + 2 * c;
        atomicAdd(out + int64_t(t) * N + row, acc[4 * j]);
        atomicAdd(out + int64_t(t + 1) * N + row, acc[4 * j + 1]);
        atomicAdd(out + int64_t(t) * N + row + 8, acc[4 * j + 2]);
        atomicAdd(out + int64_t(t + 1) * N + row + 8, acc[4 * j + 3]);
      }
#pragma unroll
      for (int e = 0; e < 32; ++e) acc[e] = 0.0f;
      ++tile;
    }
  }
}

// Units of 256 weight rows x 64 columns (32 KB) beside the same 8 KB of x, so that x's share of
// what the ring reads (from L2) halves: each warpgroup takes 128 rows as two m64 products. A
// ring of kStages units, each waiting for its wgmma groups.
template <int kStages>
__global__ void __launch_bounds__(256, 1)
    wgmma_wide(const half* __restrict__ w, const half* __restrict__ x, float* out, int N, int K) {
  constexpr int kRows = 256, kW = kRows * 128, kStage = kW + kXBytes;
  extern __shared__ uint8_t raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t{1023});
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;
  const int ks = K / 64, tiles = N / kRows;
  const int64_t units = int64_t{tiles} * ks;
  const int64_t begin = blockIdx.x * units / gridDim.x, end = (blockIdx.x + 1) * units / gridDim.x;
  const int n = static_cast<int>(end - begin);
  int load_tile = static_cast<int>(begin / ks), load_k = static_cast<int>(begin % ks);
  auto load = [&](int i) {
    uint8_t* st = smem + (i % kStages) * kStage;
#pragma unroll
    for (int q = 0; q < kW / 16 / 256; ++q) {
      const int j = tid + 256 * q, r = j / 8, ch = j % 8;
      cp16(smem_u32(st + r * 128 + ((ch ^ (r & 7)) * 16)),
           w + int64_t(load_tile * kRows + r) * K + load_k * 64 + ch * 8);
    }
#pragma unroll
    for (int q = 0; q < kXBytes / 16 / 256; ++q) {
      const int j = tid + 256 * q, r = j / 8, ch = j % 8;
      cp16(smem_u32(st + kW + r * 128 + ((ch ^ (r & 7)) * 16)), x + int64_t(r) * K + load_k * 64 + ch * 8);
    }
    if (++load_k == ks) { load_k = 0; ++load_tile; }
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < n) load(i);
    asm volatile("cp.async.commit_group;\n");
  }
  float acc0[32], acc1[32];
#pragma unroll
  for (int e = 0; e < 32; ++e) acc0[e] = acc1[e] = 0.0f;
  int tile = static_cast<int>(begin / ks), k = static_cast<int>(begin % ks);
  for (int i = 0; i < n; ++i) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2));
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if (i + kStages - 1 < n) load(i + kStages - 1);
    asm volatile("cp.async.commit_group;\n");
    const uint32_t st = smem_u32(smem + (i % kStages) * kStage);
    const uint32_t a0 = st + wg * 128 * 128, a1 = a0 + 64 * 128, b0 = st + kW;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      wgmma_64x64x16(acc0, descriptor(a0 + kk * 32), descriptor(b0 + kk * 32));
      wgmma_64x64x16(acc1, descriptor(a1 + kk * 32), descriptor(b0 + kk * 32));
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    const bool tile_ends = k == ks - 1;
    if (++k == ks) k = 0;
    if (tile_ends || i == n - 1) {
#pragma unroll
      for (int half_ = 0; half_ < 2; ++half_) {
        const float* acc = half_ == 0 ? acc0 : acc1;
        const int row = tile * kRows + wg * 128 + half_ * 64 + warp * 16 + g;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int t = 8 * j + 2 * c;
          atomicAdd(out + int64_t(t) * N + row, acc[4 * j]);
          atomicAdd(out + int64_t(t + 1) * N + row, acc[4 * j + 1]);
          atomicAdd(out + int64_t(t) * N + row + 8, acc[4 * j + 2]);
          atomicAdd(out + int64_t(t + 1) * N + row + 8, acc[4 * j + 3]);
        }
      }
#pragma unroll
      for (int e = 0; e < 32; ++e) acc0[e] = acc1[e] = 0.0f;
      ++tile;
    }
  }
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nW%=: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Warp-specialized: a producer warpgroup copies 128-column units (weights and x, 48 KB) into a
// ring of kStages slots and never waits for the arithmetic; the two consumer warpgroups wait for a
// slot's copies on its `full` mbarrier (cp.async.mbarrier.arrive.noinc: each producer thread
// arrives once its copies land), run its wgmma group, and give the slot back on its `empty`
// mbarrier. No block barrier in the loop.
template <int kStages>
__global__ void __launch_bounds__(384, 1)
    wgmma_ws(const half* __restrict__ w, const half* __restrict__ x, float* out, int N, int K) {
  constexpr int kUnitCols = 128, kW = 2 * kWBytes, kStage = kW + 2 * kXBytes;
  extern __shared__ uint8_t raw[];
  __shared__ __align__(8) uint64_t full[kStages], empty[kStages];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t{1023});
  const int tid = threadIdx.x, wg = tid / 128, t128 = tid % 128;
  const int ks = K / kUnitCols, tiles = N / kBN;
  const int64_t units = int64_t{tiles} * ks;
  const int64_t begin = blockIdx.x * units / gridDim.x, end = (blockIdx.x + 1) * units / gridDim.x;
  const int n = static_cast<int>(end - begin);
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 128;\n" ::"r"(smem_u32(&full[i])));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 256;\n" ::"r"(smem_u32(&empty[i])));
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (wg == 2) {  // the producer
    int load_tile = static_cast<int>(begin / ks), load_k = static_cast<int>(begin % ks);
    for (int i = 0; i < n; ++i) {
      const int slot = i % kStages;
      if (i >= kStages) mbar_wait(smem_u32(&empty[slot]), ((i / kStages) + 1) & 1);
      uint8_t* st = smem + slot * kStage;
#pragma unroll
      for (int q = 0; q < kW / 16 / 128; ++q) {
        const int j = t128 + 128 * q, h = j / 1024, r = (j % 1024) / 8, ch = j % 8;
        cp16(smem_u32(st + h * kWBytes + r * 128 + ((ch ^ (r & 7)) * 16)),
             w + int64_t(load_tile * kBN + r) * K + load_k * kUnitCols + h * 64 + ch * 8);
      }
#pragma unroll
      for (int q = 0; q < 2 * kXBytes / 16 / 128; ++q) {
        const int j = t128 + 128 * q, h = j / 512, r = (j % 512) / 8, ch = j % 8;
        cp16(smem_u32(st + kW + h * kXBytes + r * 128 + ((ch ^ (r & 7)) * 16)),
             x + int64_t(r) * K + load_k * kUnitCols + h * 64 + ch * 8);
      }
      asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(&full[slot])) : "memory");
      if (++load_k == ks) { load_k = 0; ++load_tile; }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }
  const int warp = t128 / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
  float acc[32];
#pragma unroll
  for (int e = 0; e < 32; ++e) acc[e] = 0.0f;
  int tile = static_cast<int>(begin / ks), k = static_cast<int>(begin % ks);
  for (int i = 0; i < n; ++i) {
    const int slot = i % kStages;
    mbar_wait(smem_u32(&full[slot]), (i / kStages) & 1);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    const uint32_t st = smem_u32(smem + slot * kStage);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t a0 = st + h * kWBytes + wg * 64 * 128, b0 = st + kW + h * kXBytes;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        wgmma_64x64x16(acc, descriptor(a0 + kk * 32), descriptor(b0 + kk * 32));
      }
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(&empty[slot])) : "memory");
    const bool tile_ends = k == ks - 1;
    if (++k == ks) k = 0;
    if (tile_ends || i == n - 1) {
      const int row = tile * kBN + wg * 64 + warp * 16 + g;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int t = 8 * j + 2 * c;
        atomicAdd(out + int64_t(t) * N + row, acc[4 * j]);
        atomicAdd(out + int64_t(t + 1) * N + row, acc[4 * j + 1]);
        atomicAdd(out + int64_t(t) * N + row + 8, acc[4 * j + 2]);
        atomicAdd(out + int64_t(t + 1) * N + row + 8, acc[4 * j + 3]);
      }
#pragma unroll
      for (int e = 0; e < 32; ++e) acc[e] = 0.0f;
      ++tile;
    }
  }
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // The variants: ring units, unit width (halves of 64 columns), overlap.
  struct Variant { void (*kernel)(const half*, const half*, float*, int, int); size_t smem; const char* name; int threads = 256; };
  const Variant variants[] = {
      {wgmma_gemm<6, 1, false>, 6 * kStageBytes + 1024, "6 x 16 KB"},
      {wgmma_gemm<8, 1, true>, 8 * kStageBytes + 1024, "8 x 16 KB, overlap"},
      {wgmma_gemm<4, 2, false>, 4 * 2 * kStageBytes + 1024, "4 x 32 KB"},
      {wgmma_gemm<4, 2, true>, 4 * 2 * kStageBytes + 1024, "4 x 32 KB, overlap"},
      {wgmma_split<5, 3>, 5 * 2 * kWBytes + 3 * 2 * kXBytes + 1024, "5 x 32 KB of weights, x apart"},
      {wgmma_wide<5>, 5 * (256 * 128 + kXBytes) + 1024, "5 x (256 rows x 64 columns)"},
      {wgmma_ws<4>, 4 * (2 * kWBytes + 2 * kXBytes) + 1024, "4 x 32 KB, producer warpgroup", 384}};
  constexpr int kVariants = sizeof(variants) / sizeof(variants[0]);
  for (const Variant& v : variants) {
    CK(cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(v.smem)));
  }
  cublasHandle_t h;
  cublasCreate(&h);
  struct Shape { const char* name; int N, K; } shapes[] = {
      {"q|k|v", 6144, 4096}, {"o", 4096, 4096}, {"gate|up", 24576, 4096}, {"down", 4096, 12288}};
  printf("| weight (N x K), 64 rows | max rel err vs cuBLAS (worst variant) | cuBLAS us (GB/s) |");
  for (const Variant& v : variants) printf(" wgmma, ring of %s |", v.name);
  printf("\n|---|---|---|");
  for (int i = 0; i < kVariants; ++i) printf("---|");
  printf("\n");
  for (const Shape& s : shapes) {
    const int64_t wn = int64_t{s.N} * s.K;
    const int copies = int(std::ceil(512e6 / (wn * 2.0)));
    half *w, *x, *o16;
    float *out, *ref;
    CK(cudaMalloc(&w, wn * 2 * copies));
    CK(cudaMalloc(&x, int64_t{kT} * s.K * 2));
    CK(cudaMalloc(&o16, int64_t{kT} * s.N * 2));
    CK(cudaMalloc(&out, int64_t{kT} * s.N * 4));
    CK(cudaMalloc(&ref, int64_t{kT} * s.N * 4));
    fill<<<1024, 256>>>(w, wn * copies, 1, 1.0f / std::sqrt(float(s.K)));
    fill<<<256, 256>>>(x, int64_t{kT} * s.K, 7, 1.0f);
    const float one = 1.0f, zero = 0.0f;
    cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.N, kT, s.K, &one, w, CUDA_R_16F, s.K, x, CUDA_R_16F,
                 s.K, &zero, ref, CUDA_R_32F, s.N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    const int grid = sms;
    std::vector<float> a(size_t(kT) * s.N), b(a.size());
    CK(cudaMemcpy(b.data(), ref, b.size() * 4, cudaMemcpyDeviceToHost));
    double err = 0, mag = 0;
    for (const Variant& v : variants) {
      CK(cudaMemset(out, 0, int64_t{kT} * s.N * 4));
      v.kernel<<<grid, v.threads, v.smem>>>(w, x, out, s.N, s.K);
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(a.data(), out, a.size() * 4, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < a.size(); ++i) {
        err = std::fmax(err, std::fabs(a[i] - b[i]));
        mag = std::fmax(mag, std::fabs(b[i]));
      }
    }
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    const int reps = 60;
    float ms[1 + kVariants] = {};
    auto launch = [&](int pass, int r) {
      const half* wc = w + (r % copies) * wn;
      if (pass == 0) {
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.N, kT, s.K, &one, wc, CUDA_R_16F, s.K, x,
                     CUDA_R_16F, s.K, &zero, o16, CUDA_R_16F, s.N, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
      } else {
        const Variant& v = variants[pass - 1];
        v.kernel<<<grid, v.threads, v.smem>>>(wc, x, out, s.N, s.K);
      }
    };
    for (int pass = 0; pass <= kVariants; ++pass) {
      for (int r = 0; r < 10; ++r) launch(pass, r);  // warm: cuBLAS loads its kernels lazily
      CK(cudaDeviceSynchronize());
      cudaEventRecord(e0);
      for (int r = 0; r < reps; ++r) launch(pass, r);
      cudaEventRecord(e1);
      CK(cudaEventSynchronize(e1));
      cudaEventElapsedTime(&ms[pass], e0, e1);
    }
    CK(cudaGetLastError());
    const double bytes = wn * 2.0;
    printf("| %s (%d x %d) | %.2e |", s.name, s.N, s.K, err / mag);
    for (int pass = 0; pass <= kVariants; ++pass) {
      const double us = ms[pass] * 1e3 / reps;
      printf(" %.1f (%.0f) |", us, bytes / us / 1e3);
    }
    printf("\n");
    cudaFree(w); cudaFree(x); cudaFree(o16); cudaFree(out); cudaFree(ref);
  }
  return 0;
}
