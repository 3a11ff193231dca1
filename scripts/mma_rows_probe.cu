// Can tensor cores read 16-bit weights for up to 8 rows of x as fast as the one-row GEMV reads
// them for one? cuBLAS takes 74.5 us for Qwen3-8B's gate+up at 8 rows where the one-row GEMV
// takes 66.4 (102% of copy), and the CUDA-core loop of scripts/rows_probe.cu loses to cuBLAS at 8
// rows. This kernel: 16 weight rows a tile, a tile's K split over a block's 8 warps; each warp
// streams its part through a ring of S stages in shared memory (cp.async, each instruction 2
// rows x 256 contiguous bytes), reads its mma operands with 16-byte shared loads in an order of
// its own (K's order inside a 16-column step does not matter if x is read the same way), x's 8
// rows staged once a block (16-bit), one m16n8k16 mma per 16 columns, the 8 warps' sums added at
// a tile's end; a persistent grid of one block an SM. Timed against cublasGemmEx on the same cold
// copies, products checked against cuBLAS's. A measurement tool, not part of the build
// (docs/PERFORMANCE.md, issue 13's section):
//
//   nvcc -O3 -arch=sm_90 scripts/mma_rows_probe.cu -lcublas -o /tmp/mma_rows_probe && /tmp/mma_rows_probe
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe.cuh"


constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kStageCols = 128;  // a stage: 16 rows x 256 bytes, 16 chunks of 16 bytes a row

// Chunk c of a row of 16 chunks (or of x), moved by 4 on odd rows so that the 8 lanes of a
// shared load (rows 2p and 2p + 1, 4 chunks each) meet distinct banks.
__device__ __forceinline__ int swz(int c, int row) { return c ^ ((row & 1) << 2); }

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void mma16816(float (&d)[4], unsigned a0, unsigned a1, unsigned a2,
                                         unsigned a3, unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// out[n][row] = sum_k x[n][k] w[row][k] for n < T <= 8, fp32 out. K a multiple of 8 x 128.
template <int S>
__global__ void __launch_bounds__(kThreads, 1) mma_rows(const __half* __restrict__ w,
                                                       const __half* __restrict__ x,
                                                       float* __restrict__ out, int N, int K,
                                                       int T) {
  extern __shared__ __align__(16) uint4 smem[];
  const int xchunks = K / 8;
  uint4* xs = smem;                                // [8][xchunks]
  uint4* ring = xs + 8 * xchunks;                  // [warps][S][16 rows][16 chunks]
  float* red = reinterpret_cast<float*>(ring + kWarps * S * 256);  // [2][warps][128]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int tiles = (N + 15) / 16;
  const int slice = K / kWarps, spt = slice / kStageCols;
  const int mine = static_cast<int>(blockIdx.x) < tiles ? (tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  const int total = mine * spt;
  uint4* my_ring = ring + warp * S * 256;
  auto issue = [&](int s) {
    if (s < total) {
      const int tile = blockIdx.x + (s / spt) * gridDim.x;
      const int col0 = warp * slice + (s % spt) * kStageCols;
      uint4* buf = my_ring + (s % S) * 256;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int r = 2 * i + lane / 16, c = lane % 16;
        const int row = tile * 16 + r;
        const bool valid = row < N;
        cp_async16(buf + r * 16 + swz(c, r),
                   w + static_cast<int64_t>(valid ? row : 0) * K + col0 + c * 8, valid);
      }
    }
    cp_commit();
  };
  for (int s = 0; s < S - 1; ++s) issue(s);
  for (int i = threadIdx.x; i < 8 * xchunks; i += kThreads) {
    const int n = i / xchunks, c = i % xchunks;
    xs[n * xchunks + swz(c, n)] =
        n < T ? reinterpret_cast<const uint4*>(x + static_cast<int64_t>(n) * K)[c]
              : make_uint4(0, 0, 0, 0);
  }
  __syncthreads();
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int s = 0; s < total; ++s) {
    issue(s + S - 1);
    cp_wait<S - 1>();
    __syncwarp();
    const uint4* buf = my_ring + (s % S) * 256;
    const int st = s % spt;
    const int xc0 = (warp * slice + st * kStageCols) / 8;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int q = 4 * r + t;
      const uint4 wa = buf[g * 16 + swz(q, g)];
      const uint4 wb = buf[(g + 8) * 16 + swz(q, g + 8)];
      const uint4 xv = xs[g * xchunks + swz(xc0 + q, g)];
      mma16816(acc, wa.x, wb.x, wa.y, wb.y, xv.x, xv.y);
      mma16816(acc, wa.z, wb.z, wa.w, wb.w, xv.z, xv.w);
    }
    __syncwarp();
    if (st == spt - 1) {
      const int ti = s / spt, tile = blockIdx.x + ti * gridDim.x;
      float* part = red + (ti & 1) * kWarps * 128;
      reinterpret_cast<float4*>(part + warp * 128)[lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
      __syncthreads();
      if (threadIdx.x < 128) {
        float v = 0.0f;
#pragma unroll
        for (int k = 0; k < kWarps; ++k) v += part[k * 128 + threadIdx.x];
        const int l = threadIdx.x / 4, j = threadIdx.x % 4;
        const int row = tile * 16 + l / 4 + (j >= 2 ? 8 : 0), n = 2 * (l % 4) + (j & 1);
        if (row < N && n < T) out[static_cast<int64_t>(n) * N + row] = v;
      }
    }
  }
}

struct Timer {
  cudaEvent_t a, b;
  Timer() {
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
  }
  template <typename F>
  float us(F&& f, int reps = 40) {
    for (int i = 0; i < 3; ++i) f(i);
    CK(cudaEventRecord(a));
    for (int i = 0; i < reps; ++i) f(i);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    return 1000.0f * ms / reps;
  }
};

template <int S>
void run_mma(const char* name, int N, int K, int T, const std::vector<__half*>& W,
             const __half* x, float* out, float* ref, cublasHandle_t h, Timer& timer, int sms) {
  const size_t smem = static_cast<size_t>(8) * K * 2 + static_cast<size_t>(kWarps) * S * 4096 +
                      2 * kWarps * 128 * 4;
  if (smem > 227 * 1024 || K % (kWarps * kStageCols) != 0) {
    printf("%-10s T=%d S=%d: does not fit (%zu KB)\n", name, T, S, smem >> 10);
    return;
  }
  CK(cudaFuncSetAttribute(mma_rows<S>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          static_cast<int>(smem)));
  const int tiles = (N + 15) / 16;
  const int grid = std::min(sms, tiles);
  const int copies = static_cast<int>(W.size());
  CK(cudaMemset(out, 0xff, static_cast<size_t>(8) * N * 4));  // poisoned
  const float mine = timer.us([&](int i) {
    mma_rows<S><<<grid, kThreads, smem>>>(W[i % copies], x, out, N, K, T);
  });
  const float alpha = 1, beta = 0;
  const float theirs = timer.us([&](int i) {
    CK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, W[i % copies], CUDA_R_16F, K, x,
                    CUDA_R_16F, K, &beta, ref, CUDA_R_32F, N, CUBLAS_COMPUTE_32F,
                    CUBLAS_GEMM_DEFAULT));
  });
  std::vector<float> a(static_cast<size_t>(T) * N), b(a.size());
  CK(cudaMemcpy(a.data(), out, a.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(b.data(), ref, b.size() * 4, cudaMemcpyDeviceToHost));
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  const double gb = static_cast<double>(N) * K * 2 / 1e9;
  printf("%-10s T=%d S=%d: mma_rows %7.1f us (%5.0f GB/s)  cuBLAS %7.1f us (%5.0f GB/s)  max "
         "|diff| %.2e of %.2e\n",
         name, T, S, mine, gb / mine * 1e6, theirs, gb / theirs * 1e6, worst, scale);
}

int main() {
  cublasHandle_t h;
  CK(cublasCreate(&h));
  size_t wsb = size_t{32} << 20;
  void* ws;
  CK(cudaMalloc(&ws, wsb));
  CK(cublasSetWorkspace(h, ws, wsb));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  Timer timer;
  struct Shape {
    const char* name;
    int N, K;
  };
  for (const Shape s : {Shape{"o_proj", 4096, 4096}, Shape{"qkv", 6144, 4096},
                        Shape{"gate+up", 24576, 4096}, Shape{"lm_head", 151936, 4096},
                        Shape{"q25 qkv", 4608, 3584}}) {
    const size_t wbytes = static_cast<size_t>(s.N) * s.K * 2;
    const int copies = static_cast<int>(std::max<size_t>(2, std::min<size_t>(8, (400u << 20) / wbytes)));
    std::vector<__half*> W(copies);
    unsigned seed = 1;
    for (auto& p : W) {
      CK(cudaMalloc(&p, wbytes));
      fill<<<1024, 256>>>(p, wbytes / 2, seed++, 0.025f);
    }
    __half* x;
    float *out, *ref;
    CK(cudaMalloc(&x, static_cast<size_t>(8) * s.K * 2));
    CK(cudaMalloc(&out, static_cast<size_t>(8) * s.N * 4));
    CK(cudaMalloc(&ref, static_cast<size_t>(8) * s.N * 4));
    fill<<<64, 256>>>(x, static_cast<size_t>(8) * s.K, 99, 1.0f);
    run_mma<4>(s.name, s.N, s.K, 8, W, x, out, ref, h, timer, sms);
    run_mma<3>(s.name, s.N, s.K, 8, W, x, out, ref, h, timer, sms);
    run_mma<2>(s.name, s.N, s.K, 8, W, x, out, ref, h, timer, sms);
    run_mma<4>(s.name, s.N, s.K, 4, W, x, out, ref, h, timer, sms);
    for (auto p : W) CK(cudaFree(p));
    CK(cudaFree(x));
    CK(cudaFree(out));
    CK(cudaFree(ref));
  }
  return 0;
}
