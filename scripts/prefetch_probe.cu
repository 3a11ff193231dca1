// Whether a small kernel before a cuBLAS GEMM (an RMSNorm, SwiGLU) can fill DRAM's idle time by
// asking L2 for part of the GEMM's weights (cp.async.bulk.prefetch.L2), at the batched decode's
// 64 and 256 rows. Each pair "small kernel, GEMM" runs 60 times in one CUDA graph, the weights
// rotated over 512 MB so that they are cold. Patterns of what is asked for, up to a budget:
//   prefix      the first bytes of the matrix, in memory order;
//   rows/8      whole rows, m of every 8 (a share of every output tile's rows);
//   heads/s     the first bytes of each of s equal K-ranges of every row (what a CTA of an
//               s-way split-K reads first).
// Each pattern is asked for two ways (the cells: bulk / lines): cp.async.bulk.prefetch.L2 of up
// to 16 KB a thread, or prefetch.global.L2 a 128-byte line.
// A measurement tool, not part of the build (docs/PERFORMANCE.md, issue 13's section):
//
//   nvcc -O3 -arch=sm_90 scripts/prefetch_probe.cu -lcublas -o /tmp/prefetch_probe && /tmp/prefetch_probe
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "probe.cuh"


struct Segment {
  uint64_t offset;
  uint32_t bytes;
};

// An RMSNorm of `rows` rows of k values (one block a row), which first asks L2 for its share of
// the segments.
__global__ void norm_prefetch(const half* x, half* y, int k, const char* w, const Segment* seg,
                              int segs, bool lines) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (lines) {  // one prefetch.global.L2 a 128-byte line: segments are dealt a warp each
    for (int i = t / 32; i < segs; i += gridDim.x * blockDim.x / 32) {
      for (uint32_t o = (t % 32) * 128; o < seg[i].bytes; o += 32 * 128) {
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(w + seg[i].offset + o));
      }
    }
  } else {
    for (int i = t; i < segs; i += gridDim.x * blockDim.x) {
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(w + seg[i].offset),
                   "r"(seg[i].bytes)
                   : "memory");
    }
  }
  __shared__ float part[32];
  const half* row = x + int64_t{blockIdx.x} * k;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < k; i += blockDim.x) {
    const float v = __half2float(row[i]);
    ss += v * v;
  }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    ss = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (threadIdx.x == 0) part[0] = rsqrtf(ss / k + 1e-6f);
  }
  __syncthreads();
  const float r = part[0];
  for (int i = threadIdx.x; i < k; i += blockDim.x) {
    y[int64_t{blockIdx.x} * k + i] = __float2half(__half2float(row[i]) * r);
  }
}

constexpr uint32_t kChunk = 16384;

void add(std::vector<Segment>& s, uint64_t offset, uint64_t bytes) {
  for (uint64_t o = 0; o < bytes; o += kChunk) {
    s.push_back({offset + o, uint32_t(std::min<uint64_t>(kChunk, bytes - o))});
  }
}

// The pattern's segments of an n x k fp16 matrix, about `budget` bytes.
std::vector<Segment> pattern(const std::string& name, int n, int k, uint64_t budget) {
  std::vector<Segment> s;
  const uint64_t row = uint64_t(k) * 2, total = row * n;
  if (name == "none" || budget == 0) return s;
  if (name == "prefix") {
    add(s, 0, std::min(budget, total));
  } else if (name == "rows/8") {
    const int m = int(std::lround(8.0 * budget / total));
    for (int r = 0; r < n; ++r) {
      if (r % 8 < m) add(s, r * row, row);
    }
  } else {  // heads/S
    const int slices = std::stoi(name.substr(6));
    const uint64_t slice = row / slices / 16 * 16;
    uint64_t head = uint64_t(double(budget) / total * slice) / 16 * 16;
    head = std::min(head, slice);
    for (int r = 0; r < n; ++r) {
      for (int j = 0; j < slices; ++j) add(s, r * row + j * slice, head);
    }
  }
  return s;
}

int main() {
  cublasHandle_t h;
  cublasCreate(&h);
  void* ws;
  CK(cudaMalloc(&ws, 32 << 20));
  cublasSetWorkspace(h, ws, 32 << 20);
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cublasSetStream(h, st);
  struct Shape { const char* name; int n, k; } shapes[] = {
      {"q|k|v", 6144, 4096}, {"o", 4096, 4096}, {"gate|up", 24576, 4096}, {"down", 4096, 12288}};
  const char* patterns[] = {"none", "prefix", "rows/8", "heads/1", "heads/2", "heads/3", "heads/4"};
  const uint64_t budgets[] = {8ull << 20, 16ull << 20};
  Segment* dseg;
  CK(cudaMalloc(&dseg, sizeof(Segment) * (1 << 20)));
  printf("| rows | weight | GEMM alone us | norm + GEMM, none |");
  for (uint64_t b : budgets) {
    for (int p = 1; p < 7; ++p) printf(" %s %llu MB |", patterns[p], (unsigned long long)(b >> 20));
  }
  printf("\n|---|---|---|---|");
  for (int i = 0; i < 12; ++i) printf("---|");
  printf("\n");
  for (int rows : {64, 256}) {
    for (const Shape& s : shapes) {
      const int64_t wn = int64_t{s.n} * s.k;
      const int copies = int(std::ceil(512e6 / (wn * 2.0)));
      half *w, *x, *xn, *out;
      CK(cudaMalloc(&w, wn * 2 * copies));
      CK(cudaMalloc(&x, int64_t{rows} * s.k * 2));
      CK(cudaMalloc(&xn, int64_t{rows} * s.k * 2));
      CK(cudaMalloc(&out, int64_t{rows} * s.n * 2));
      fill<<<1024, 256>>>(w, wn * copies, 1, 1.0f / std::sqrt(float(s.k)));
      fill<<<256, 256>>>(x, int64_t{rows} * s.k, 7, 1.0f);
      CK(cudaDeviceSynchronize());
      const float one = 1.0f, zero = 0.0f;
      const int reps = 60;
      // Times `reps` of [norm with segs, GEMM] (or the GEMM alone) in one graph.
      auto timed = [&](int segs, bool norm, bool lines, float* us) -> int {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (int r = 0; r < reps; ++r) {
          const half* wc = w + (r % copies) * wn;
          if (norm) {
            norm_prefetch<<<rows, 256, 0, st>>>(x, xn, s.k, reinterpret_cast<const char*>(wc),
                                               dseg, segs, lines);
          }
          cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.n, rows, s.k, &one, wc, CUDA_R_16F, s.k,
                       norm ? xn : x, CUDA_R_16F, s.k, &zero, out, CUDA_R_16F, s.n,
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        }
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphLaunch(ge, st));  // warm
        CK(cudaStreamSynchronize(st));
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        float best = 1e30f;
        for (int round = 0; round < 3; ++round) {
          cudaEventRecord(e0, st);
          CK(cudaGraphLaunch(ge, st));
          cudaEventRecord(e1, st);
          CK(cudaEventSynchronize(e1));
          float ms;
          cudaEventElapsedTime(&ms, e0, e1);
          best = std::fmin(best, ms);
        }
        *us = best * 1000.0f / reps;
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
        return 0;
      };
      float alone, base;
      if (timed(0, false, false, &alone) || timed(0, true, false, &base)) return 1;
      printf("| %d | %s | %.1f | %.1f |", rows, s.name, alone, base);
      for (uint64_t b : budgets) {
        for (int p = 1; p < 7; ++p) {
          std::vector<Segment> seg = pattern(patterns[p], s.n, s.k, b);
          CK(cudaMemcpy(dseg, seg.data(), seg.size() * sizeof(Segment), cudaMemcpyHostToDevice));
          float us;
          float us2;
          if (timed(int(seg.size()), true, false, &us) ||
              timed(int(seg.size()), true, true, &us2)) {
            return 1;
          }
          printf(" %.1f / %.1f |", us, us2);
        }
      }
      printf("\n");
      fflush(stdout);
      cudaFree(w);
      cudaFree(x);
      cudaFree(xn);
      cudaFree(out);
    }
  }
  return 0;
}
