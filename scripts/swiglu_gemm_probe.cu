// Whether a gate|up GEMM of our own with SwiGLU in its epilogue beats cuBLAS's gate|up followed by
// the SwiGLU kernel, at 64 rows of x (Qwen3-8B fp16: gate and up 12288 x 4096 each). Issue 13's
// 64-sequence bar: the small kernels between the cuBLAS GEMMs take 4.7-7.6% of the step
// (docs/PERFORMANCE.md, "What the small kernels cost a step inside the graph"), so a fused GEMM
// may be a little slower than cuBLAS's and still win.
//
// The GEMM is scripts/wgmma_probe.cu's best form (stream-K over units of 128 weight rows x 128
// columns, one block an SM, a cp.async ring of 4 units of 48 KB with one wgmma group kept in
// flight, two warpgroups on wgmma m64n64k16, each 64 weight rows x the 64 rows of x). Here a
// tile's 128 weight rows are 64 gate rows and the 64 up rows of the same intermediate columns:
// warpgroup 0 sums gate, warpgroup 1 up, and each thread of the two holds the same (row, token)
// positions. A block that holds a tile whole leaves both warpgroups' sums in shared memory and
// writes h = silu(gate) * up from there. A tile cut between blocks (at most two a block: its
// first and last) is added into an fp32 workspace by atomics, and the block whose units complete
// the tile (a counter a tile) reads it back after its loop, writes h and zeroes the workspace and
// the counter for the next launch. ptxas keeps the wgmma overlapped only with every use of the
// sums outside branches and the cut tiles' epilogue after the loop (C7517 remains, as in
// wgmma_probe.cu; C7518, serialised wgmma, otherwise).
//
// Both forms run as chains of 8 layers (8 weight copies, 1.6 GB: cold) captured in a CUDA graph;
// the fused h is checked against cuBLAS + SwiGLU first. A measurement tool, not part of the build:
//
//   nvcc -O3 -gencode arch=compute_90a,code=sm_90a scripts/swiglu_gemm_probe.cu -lcublas -o /tmp/swiglu_gemm_probe && /tmp/swiglu_gemm_probe
//
// Written in the forty-third session, run in the forty-fourth (H200): h within fp16 rounding of
// cuBLAS + SwiGLU (7.1e-4 of max |h|), 74.8 us a layer against cuBLAS + SwiGLU's 55.4
// (docs/PERFORMANCE.md, "The SwiGLU-epilogue GEMM, run").
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "probe.cuh"


constexpr int kT = 64;                     // rows of x
constexpr int kHidden = 4096, kInter = 12288, kLayers = 8;
constexpr int kBN = 128;                   // weight rows a tile: 64 gate, then 64 up
constexpr int kCols = kBN / 2;             // intermediate columns a tile
constexpr int kTiles = kInter / kCols;     // 192
constexpr int kUnitCols = 128;             // K columns a unit: two 64-column halves
constexpr int kWBytes = kBN * 64 * 2;      // a half's weights: 128-byte rows, the swizzle's width
constexpr int kXBytes = kT * 64 * 2;       // a half's x
constexpr int kStage = 2 * (kWBytes + kXBytes);  // 48 KB
constexpr int kStages = 4;
constexpr int kAhead = kStages - 2;        // one wgmma group stays in flight
constexpr int kHandBytes = 256 * 32 * 4;   // both warpgroups' sums of a whole tile
constexpr int kSmem = kStages * kStage + kHandBytes + 1024;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
// A K-major operand of 128-byte rows, 128-byte swizzle (chunk c of row r at c ^ (r % 8)).
__device__ __forceinline__ uint64_t descriptor(uint32_t addr) {
  uint64_t d = (addr & 0x3FFFF) >> 4;
  d |= uint64_t{1} << 16;
  d |= uint64_t{1024 >> 4} << 32;
  d |= uint64_t{1} << 62;
  return d;
}
// d = A B + (keep ? d : 0).
__device__ __forceinline__ void wgmma_64x64x16(float (&d)[32], uint64_t da, uint64_t db,
                                               int keep) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),
        "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(keep));
}

__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// w: [2 I, H], gate rows then up rows; x: [T, H]; h: [T, I]. work: [T, 2 I] fp32 zeros and
// done: [kTiles] zeros, both left zero again.
__global__ void __launch_bounds__(256, 1)
    swiglu_gemm(const half* __restrict__ w, const half* __restrict__ x, half* __restrict__ h,
                float* work, int* done) {
  constexpr int ks = kHidden / kUnitCols;  // units a tile
  extern __shared__ uint8_t raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t{1023});
  float* hand = reinterpret_cast<float*>(smem + kStages * kStage);
  __shared__ int last;
  // The cut tiles this block completes (at most its first and last), whose h it writes after
  // the loop: inside it, the epilogue's code made ptxas serialise the wgmma (C7518).
  int finished[2], finishing = 0;
  const int tid = threadIdx.x, wg = tid / 128;
  const int64_t units = int64_t{kTiles} * ks;
  const int64_t begin = blockIdx.x * units / gridDim.x, end = (blockIdx.x + 1) * units / gridDim.x;
  const int n = static_cast<int>(end - begin);
  int load_tile = static_cast<int>(begin / ks), load_k = static_cast<int>(begin % ks);
  // Weight row r (0..127) of tile t: gate row 64 t + r, or up row I + 64 t + r - 64.
  auto weight_row = [](int t, int r) {
    return r < kCols ? kCols * t + r : kInter + kCols * t + (r - kCols);
  };
  auto load = [&](int i) {
    uint8_t* st = smem + (i % kStages) * kStage;
#pragma unroll
    for (int q = 0; q < 2 * kWBytes / 16 / 256; ++q) {
      const int j = tid + 256 * q, hf = j / 1024, r = (j % 1024) / 8, ch = j % 8;
      cp16(smem_u32(st + hf * kWBytes + r * 128 + ((ch ^ (r & 7)) * 16)),
           w + int64_t(weight_row(load_tile, r)) * kHidden + load_k * kUnitCols + hf * 64 + ch * 8);
    }
#pragma unroll
    for (int q = 0; q < 2 * kXBytes / 16 / 256; ++q) {
      const int j = tid + 256 * q, hf = j / 512, r = (j % 512) / 8, ch = j % 8;
      cp16(smem_u32(st + 2 * kWBytes + hf * kXBytes + r * 128 + ((ch ^ (r & 7)) * 16)),
           x + int64_t(r) * kHidden + load_k * kUnitCols + hf * 64 + ch * 8);
    }
    if (++load_k == ks) {
      load_k = 0;
      ++load_tile;
    }
  };
#pragma unroll
  for (int i = 0; i < kAhead; ++i) {
    if (i < n) load(i);
    asm volatile("cp.async.commit_group;\n");
  }
  // Each tile's first product replaces the sums (wgmma's scale-d off), so they are never reset:
  // left dead after the hand-over, the registers are free for the epilogue (a reset, or the sums
  // kept live across it, made ptxas serialise the wgmma: C7518).
  float acc[32];
  int tile = static_cast<int>(begin / ks), k = static_cast<int>(begin % ks);
  int tile_units = 0;  // units of `tile` this block has summed
  for (int i = 0; i < n; ++i) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kAhead - 1));
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();  // unit i is in; the slot loaded next was last read by finished groups
    if (i + kAhead < n) load(i + kAhead);
    asm volatile("cp.async.commit_group;\n");
    const uint32_t st = smem_u32(smem + (i % kStages) * kStage);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const uint32_t a0 = st + hf * kWBytes + wg * 64 * 128, b0 = st + 2 * kWBytes + hf * kXBytes;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        wgmma_64x64x16(acc, descriptor(a0 + kk * 32), descriptor(b0 + kk * 32),
                       tile_units > 0 || hf > 0 || kk > 0);
      }
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    ++tile_units;
    const bool tile_ends = k == ks - 1 || i == n - 1;  // block-uniform
    if (++k == ks) k = 0;
    if (!tile_ends) {
      asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
      continue;
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    // Every thread leaves its sums in shared memory, uniformly (a branch around the use of the
    // sums serialises the wgmma: ptxas C7518). acc[4 j + e] of thread thr of warpgroup wg is
    // weight row 16 warp + g (+ 8 for e >= 2) of the warpgroup's 64 (its gate or up column) by
    // token 8 j + 2 c (+ 1 for odd e); output (t, cc) finds its gate sum in warpgroup 0's
    // thread and its up sum in the same thread of warpgroup 1.
#pragma unroll
    for (int e = 0; e < 32; ++e) hand[e * 256 + tid] = acc[e];
    __syncthreads();
    auto sum_at = [&](int t, int cc, int up) {
      const int thr = (cc / 16) * 32 + (cc % 8) * 4 + (t % 8) / 2;  // warp, g, c
      const int e = 4 * (t / 8) + (t & 1) + (cc % 16 >= 8 ? 2 : 0);
      return hand[e * 256 + 128 * up + thr];
    };
    if (tile_units == ks) {  // the whole tile here: h straight from the sums, a row at a time
      for (int idx = tid; idx < kT * kCols; idx += 256) {
        const int t = idx / kCols, cc = idx % kCols;
        h[int64_t(t) * kInter + kCols * tile + cc] =
            __float2half(silu_times(sum_at(t, cc, 0), sum_at(t, cc, 1)));
      }
    } else {
      // A cut tile: the sums into the workspace, then the block completing its units writes h.
      for (int idx = tid; idx < 2 * kT * kCols; idx += 256) {
        const int up = idx / (kT * kCols), t = (idx / kCols) % kT, cc = idx % kCols;
        atomicAdd(work + int64_t(t) * 2 * kInter + up * kInter + kCols * tile + cc,
                  sum_at(t, cc, up));
      }
      __threadfence();
      __syncthreads();
      if (tid == 0) last = atomicAdd(done + tile, tile_units) + tile_units == ks;
      __syncthreads();
      if (last) finished[finishing++] = tile;  // block-uniform; written after the loop
    }
    // The hand-over area is written again only after the loop's next barrier.
    tile_units = 0;
    ++tile;
  }
  for (int f = 0; f < finishing; ++f) {
    const int t0 = finished[f];
    for (int idx = tid; idx < kT * kCols; idx += 256) {
      const int t = idx / kCols, cc = idx % kCols;
      // Read at L2 and zeroed for the next launch in one atomic each.
      float* gp = work + int64_t(t) * 2 * kInter + kCols * t0 + cc;
      const float gv = atomicExch(gp, 0.0f), uv = atomicExch(gp + kInter, 0.0f);
      h[int64_t(t) * kInter + kCols * t0 + cc] = __float2half(silu_times(gv, uv));
    }
    if (tid == 0) done[t0] = 0;
  }
}

// The engine's SwiGLU after cuBLAS: gu [T, 2 I] (gate columns, then up) -> h [T, I].
__global__ void swiglu(const half* gu, half* h) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= kT * kInter) return;
  const int t = i / kInter, cc = i % kInter;
  h[i] = __float2half(silu_times(__half2float(gu[int64_t(t) * 2 * kInter + cc]),
                                 __half2float(gu[int64_t(t) * 2 * kInter + kInter + cc])));
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaFuncSetAttribute(swiglu_gemm, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const int64_t wn = int64_t{2} * kInter * kHidden;
  half *w, *x, *gu, *h_ref, *h_ours;
  float* work;
  int* done;
  CK(cudaMalloc(&w, wn * 2 * kLayers));
  CK(cudaMalloc(&x, int64_t{kT} * kHidden * 2));
  CK(cudaMalloc(&gu, int64_t{kT} * 2 * kInter * 2));
  CK(cudaMalloc(&h_ref, int64_t{kT} * kInter * 2));
  CK(cudaMalloc(&h_ours, int64_t{kT} * kInter * 2));
  CK(cudaMalloc(&work, int64_t{kT} * 2 * kInter * 4));
  CK(cudaMalloc(&done, kTiles * 4));
  CK(cudaMemset(work, 0, int64_t{kT} * 2 * kInter * 4));
  CK(cudaMemset(done, 0, kTiles * 4));
  fill<<<1024, 256>>>(w, wn * kLayers, 1, 1.0f / std::sqrt(float(kHidden)));
  fill<<<256, 256>>>(x, int64_t{kT} * kHidden, 7, 1.0f);
  cublasHandle_t handle;
  CK(cublasCreate(&handle));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cublasSetStream(handle, s));
  void* ws;
  CK(cudaMalloc(&ws, 32 << 20));
  CK(cublasSetWorkspace(handle, ws, 32 << 20));
  const float one = 1.0f, zero = 0.0f;
  auto reference = [&](const half* wl) {
    cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, 2 * kInter, kT, kHidden, &one, wl, CUDA_R_16F,
                 kHidden, x, CUDA_R_16F, kHidden, &zero, gu, CUDA_R_16F, 2 * kInter,
                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    swiglu<<<(kT * kInter + 255) / 256, 256, 0, s>>>(gu, h_ref);
  };
  auto ours = [&](const half* wl) {
    swiglu_gemm<<<sms, 256, kSmem, s>>>(wl, x, h_ours, work, done);
  };

  // Correctness: every layer's weights, twice (the workspace and counters must come back zero).
  double worst = 0;
  for (int rep = 0; rep < 2; ++rep) {
    for (int l = 0; l < kLayers; ++l) {
      reference(w + l * wn);
      ours(w + l * wn);
      CK(cudaStreamSynchronize(s));
      CK(cudaGetLastError());
      std::vector<half> a(size_t(kT) * kInter), b(a.size());
      CK(cudaMemcpy(a.data(), h_ours, a.size() * 2, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(b.data(), h_ref, b.size() * 2, cudaMemcpyDeviceToHost));
      double err = 0, mag = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        err = std::max(err, std::fabs(double(__half2float(a[i])) - __half2float(b[i])));
        mag = std::max(mag, std::fabs(double(__half2float(b[i]))));
      }
      worst = std::max(worst, err / mag);
    }
  }
  printf("fused h against cuBLAS + SwiGLU: worst max abs error / max |h| = %.2e\n", worst);

  // Timing: 8 layers a graph, replayed.
  auto time_chain = [&](auto form) -> float {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) != cudaSuccess) return -1;
    for (int l = 0; l < kLayers; ++l) form(w + l * wn);
    if (cudaStreamEndCapture(s, &graph) != cudaSuccess) return -1;
    if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) return -1;
    for (int r = 0; r < 3; ++r) cudaGraphLaunch(exec, s);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<float> us;
    for (int r = 0; r < 5; ++r) {
      cudaEventRecord(e0, s);
      for (int i = 0; i < 10; ++i) cudaGraphLaunch(exec, s);
      cudaEventRecord(e1, s);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      us.push_back(1000 * ms / (10 * kLayers));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    std::sort(us.begin(), us.end());
    return us[2];
  };
  const float t_ref = time_chain(reference), t_ours = time_chain(ours);
  CK(cudaGetLastError());
  printf("| 64 rows, gate|up + SwiGLU, us a layer | cuBLAS + SwiGLU kernel | fused wgmma |\n");
  printf("|---|---|---|\n| 24576 x 4096 | %.1f | %.1f |\n", t_ref, t_ours);
  return 0;
}
