// Can a CUDA-core GEMV read 16-bit weights for 2 to 8 rows of x as fast as the one-row GEMV reads
// them for one (gemv.cuh: 102% of copy on Qwen3-8B's gate+up, where cuBLAS takes 74.5 us for 8
// rows against 66.4)? A stripped copy of the one-row GEMV's main loop, not the engine's kernel:
// a warp owns two weight rows, lane l streams chunks l + 32 u of both (kLoads 16-byte loads in
// flight a row), x's T rows are staged once a block in shared memory as fp32 (swizzled as
// XsLayout does), and each chunk's 8 weights are widened once and multiplied by every row of x;
// a persistent grid of as many blocks as fit. Timed against cublasGemmEx on the same matrices,
// each cycled over copies that L2 cannot hold. Products are checked against cuBLAS's. A
// measurement tool, not part of the build (docs/PERFORMANCE.md, issue 13's section):
//
//   nvcc -O3 -arch=sm_90 scripts/rows_probe.cu -lcublas -o /tmp/rows_probe && /tmp/rows_probe
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

// Piece j (x[4j, 4j + 4)) of a row of x in shared memory: chunk c = j / 2 (8 columns, two
// pieces), its pieces swapped on every other run of 4 chunks, so that 8 lanes reading one
// piece each of consecutive chunks meet distinct bank groups.
__device__ __forceinline__ int piece_at(int j) {
  const int c = j / 2;
  return 2 * c + ((j & 1) ^ ((c >> 2) & 1));
}

// out[t][n] = sum_k x[t][k] w[n][k], fp32 out. T rows of x, kLoads loads in flight a row.
template <int T, int kLoads>
__global__ void __launch_bounds__(kThreads, 2) rows_gemv(const __half* __restrict__ w,
                                                        const __half* __restrict__ x,
                                                        float* __restrict__ out, int N, int K) {
  extern __shared__ __align__(16) float xs[];  // [T][K], piece_at order
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int chunks = K / 8;
  for (int i = threadIdx.x; i < T * chunks; i += kThreads) {
    const int t = i / chunks, c = i % chunks;
    const uint4 raw = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(t) * K)[c];
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
    float4* row = reinterpret_cast<float4*>(xs + t * K);
    const float2 a = __half22float2(h[0]), b = __half22float2(h[1]);
    const float2 d = __half22float2(h[2]), e = __half22float2(h[3]);
    row[piece_at(2 * c)] = make_float4(a.x, a.y, b.x, b.y);
    row[piece_at(2 * c + 1)] = make_float4(d.x, d.y, e.x, e.y);
  }
  __syncthreads();
  const int groups = N / 2;  // a warp's two rows
  for (int grp = blockIdx.x * kWarps + warp; grp < groups; grp += gridDim.x * kWarps) {
    const uint4* rows[2] = {reinterpret_cast<const uint4*>(w + static_cast<int64_t>(2 * grp) * K),
                            reinterpret_cast<const uint4*>(w + static_cast<int64_t>(2 * grp + 1) * K)};
    float acc[2][T];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;
    for (int c0 = lane; c0 < chunks; c0 += 32 * kLoads) {
      uint4 raw[2][kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int c = c0 + 32 * u;
#pragma unroll
        for (int r = 0; r < 2; ++r) raw[r][u] = c < chunks ? __ldcs(rows[r] + c) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int c = c0 + 32 * u;
        if (c >= chunks) break;
        float wv[2][8];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const __half2* h = reinterpret_cast<const __half2*>(&raw[r][u]);
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const float2 f = __half22float2(h[q]);
            wv[r][2 * q] = f.x;
            wv[r][2 * q + 1] = f.y;
          }
        }
#pragma unroll
        for (int t = 0; t < T; ++t) {
          const float4* row = reinterpret_cast<const float4*>(xs + t * K);
          const float4 p0 = row[piece_at(2 * c)], p1 = row[piece_at(2 * c + 1)];
          const float xv[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
#pragma unroll
          for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[r][t] += wv[r][e] * xv[e];
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int t = 0; t < T; ++t) {
        float v = acc[r][t];
#pragma unroll
        for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) out[static_cast<int64_t>(t) * N + 2 * grp + r] = v;
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

template <int T, int kLoads>
void run_rows(const char* name, int N, int K, const std::vector<__half*>& W, const __half* x,
              float* out, float* ref, cublasHandle_t h, Timer& timer, int sms) {
  const size_t smem = static_cast<size_t>(T) * K * sizeof(float);
  if (smem > 200 * 1024) {
    printf("%-10s T=%d: x does not fit (%zu KB)\n", name, T, smem >> 10);
    return;
  }
  CK(cudaFuncSetAttribute(rows_gemv<T, kLoads>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          static_cast<int>(smem)));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, rows_gemv<T, kLoads>, kThreads, smem));
  const int grid = std::min(sms * std::max(per_sm, 1), (N / 2 + kWarps - 1) / kWarps);
  const int copies = static_cast<int>(W.size());
  const float mine = timer.us([&](int i) {
    rows_gemv<T, kLoads><<<grid, kThreads, smem>>>(W[i % copies], x, out, N, K);
  });
  const float alpha = 1, beta = 0;
  const float theirs = timer.us([&](int i) {
    CK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, W[i % copies], CUDA_R_16F, K, x,
                    CUDA_R_16F, K, &beta, ref, CUDA_R_32F, N, CUBLAS_COMPUTE_32F,
                    CUBLAS_GEMM_DEFAULT));
  });
  // The last calls used the same copy ((3 + 40 - 1) % copies): compare them.
  std::vector<float> a(static_cast<size_t>(T) * N), b(a.size());
  CK(cudaMemcpy(a.data(), out, a.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(b.data(), ref, b.size() * 4, cudaMemcpyDeviceToHost));
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  const double gb = static_cast<double>(N) * K * 2 / 1e9;
  printf("%-10s T=%d loads %d: %2d blocks/SM  rows_gemv %7.1f us (%5.0f GB/s)  cuBLAS %7.1f us"
         " (%5.0f GB/s)  max |diff| %.2e of %.2e\n",
         name, T, kLoads, per_sm, mine, gb / mine * 1e6, theirs, gb / theirs * 1e6, worst, scale);
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
                        Shape{"gate+up", 24576, 4096}, Shape{"down", 4096, 12288}}) {
    const size_t wbytes = static_cast<size_t>(s.N) * s.K * 2;
    const int copies = static_cast<int>(std::max<size_t>(1, std::min<size_t>(8, (400u << 20) / wbytes)));
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
    run_rows<1, 8>(s.name, s.N, s.K, W, x, out, ref, h, timer, sms);
    run_rows<2, 8>(s.name, s.N, s.K, W, x, out, ref, h, timer, sms);
    run_rows<4, 8>(s.name, s.N, s.K, W, x, out, ref, h, timer, sms);
    run_rows<4, 4>(s.name, s.N, s.K, W, x, out, ref, h, timer, sms);
    run_rows<8, 4>(s.name, s.N, s.K, W, x, out, ref, h, timer, sms);
    run_rows<8, 2>(s.name, s.N, s.K, W, x, out, ref, h, timer, sms);
    for (auto p : W) CK(cudaFree(p));
    CK(cudaFree(x));
    CK(cudaFree(out));
    CK(cudaFree(ref));
  }
  return 0;
}
