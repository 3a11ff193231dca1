// Whether a residual GEMM and the RMSNorm after it (o_proj then post_norm, down_proj then the next
// layer's input_norm) take less time as a K-split GEMM of partials and one kernel that adds them
// into the residual and normalises it, than as today's pair (cuBLAS with beta = 1 into the fp32
// residual, its own split-K reduce where it splits, then the RMSNorm kernel). The fused form has
// one launch less where cuBLAS splits on its own and none more where it does not; the question is
// what cuBLAS's strided-batched GEMM of K / s columns costs against its own choice.
//
// Each form runs 60 times in one CUDA graph with the weights rotated over 512 MB (cold), at the
// batched decode's 64 and 256 rows, on Qwen3-8B's o (4096 x 4096) and down (4096 x 12288). Both
// forms' residual and normalised rows are checked against each other first. Splits that do not
// cut K into slices of a multiple of 64 columns are left out ("-"). A measurement tool,
// not part of the build (docs/PERFORMANCE.md, issue 13's section):
//
//   nvcc -O3 -arch=sm_90 scripts/split_norm_probe.cu -lcublas -o /tmp/split_norm_probe && /tmp/split_norm_probe
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "probe.cuh"


constexpr int kThreads = 256;
constexpr float kEps = 1e-6f;

__device__ float block_sum(float v) {
  __shared__ float part[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) s += part[w];
  __syncthreads();
  return s;
}

// y[t] = x[t] / rms(x[t]) * gamma, one block a row (the engine's RMSNorm of fp32 residual rows).
__global__ void rmsnorm(const float* x, const half* gamma, half* y, int n) {
  const float* row = x + int64_t{blockIdx.x} * n;
  float ss = 0.0f;
  for (int i = threadIdx.x * 4; i < n; i += kThreads * 4) {
    const float4 v = *reinterpret_cast<const float4*>(row + i);
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  const float r = rsqrtf(block_sum(ss) / n + kEps);
  for (int i = threadIdx.x * 4; i < n; i += kThreads * 4) {
    const float4 v = *reinterpret_cast<const float4*>(row + i);
    half* o = y + int64_t{blockIdx.x} * n + i;
    o[0] = __float2half(v.x * r * __half2float(gamma[i]));
    o[1] = __float2half(v.y * r * __half2float(gamma[i + 1]));
    o[2] = __float2half(v.z * r * __half2float(gamma[i + 2]));
    o[3] = __float2half(v.w * r * __half2float(gamma[i + 3]));
  }
}

// x[t] += the s partials' row t, then y[t] = RMSNorm(x[t]) * gamma: one block a row, the row kept
// in registers between the sum and the norm (n = 4096: 4 float4 a thread).
template <int kPer>
__global__ void add_partials_norm(const float* part, int s, int64_t part_stride, float* x,
                                  const half* gamma, half* y, int n) {
  float4 v[kPer];
  float* row = x + int64_t{blockIdx.x} * n;
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = (j * kThreads + threadIdx.x) * 4;
    v[j] = *reinterpret_cast<const float4*>(row + i);
    for (int p = 0; p < s; ++p) {
      const float4 a =
          __ldcg(reinterpret_cast<const float4*>(part + p * part_stride + int64_t{blockIdx.x} * n + i));
      v[j].x += a.x;
      v[j].y += a.y;
      v[j].z += a.z;
      v[j].w += a.w;
    }
    *reinterpret_cast<float4*>(row + i) = v[j];
    ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
  }
  const float r = rsqrtf(block_sum(ss) / n + kEps);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = (j * kThreads + threadIdx.x) * 4;
    half* o = y + int64_t{blockIdx.x} * n + i;
    o[0] = __float2half(v[j].x * r * __half2float(gamma[i]));
    o[1] = __float2half(v[j].y * r * __half2float(gamma[i + 1]));
    o[2] = __float2half(v[j].z * r * __half2float(gamma[i + 2]));
    o[3] = __float2half(v[j].w * r * __half2float(gamma[i + 3]));
  }
}

int main() {
  cublasHandle_t h;
  CK(cublasCreate(&h));
  void* ws;
  CK(cudaMalloc(&ws, 64 << 20));
  CK(cublasSetWorkspace(h, ws, 64 << 20));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CK(cublasSetStream(h, st));
  struct Shape { const char* name; int n, k; } shapes[] = {{"o", 4096, 4096}, {"down", 4096, 12288}};
  const int splits[] = {2, 3, 4, 6};
  constexpr int kN = 4096, kPer = kN / (kThreads * 4);
  printf("| rows | weight | GEMM + residual alone us | + RMSNorm (today) |");
  for (int s : splits) printf(" %d K-slices + add-norm |", s);
  printf(" max rel diff |\n|---|---|---|---|");
  for (int i = 0; i < 5; ++i) printf("---|");
  printf("\n");
  half* gamma;
  CK(cudaMalloc(&gamma, kN * 2));
  fill<<<16, 256>>>(gamma, kN, 5, 1.0f);
  for (int rows : {64, 256}) {
    for (const Shape& sh : shapes) {
      const int64_t wn = int64_t{sh.n} * sh.k;
      const int copies = int(std::ceil(512e6 / (wn * 2.0)));
      half *w, *a, *y;
      float *x, *x0, *part;
      CK(cudaMalloc(&w, wn * 2 * copies));
      CK(cudaMalloc(&a, int64_t{rows} * sh.k * 2));
      CK(cudaMalloc(&y, int64_t{rows} * sh.n * 2));
      CK(cudaMalloc(&x, int64_t{rows} * sh.n * 4));
      CK(cudaMalloc(&x0, int64_t{rows} * sh.n * 4));
      CK(cudaMalloc(&part, int64_t{6} * rows * sh.n * 4));
      fill<<<1024, 256>>>(w, wn * copies, 1, 1.0f / std::sqrt(float(sh.k)));
      fill<<<256, 256>>>(a, int64_t{rows} * sh.k, 7, 1.0f);
      {
        std::vector<float> init(size_t(rows) * sh.n);
        for (size_t i = 0; i < init.size(); ++i) init[i] = std::sin(0.37f * float(i)) * 4.0f;
        CK(cudaMemcpy(x0, init.data(), init.size() * 4, cudaMemcpyHostToDevice));
      }
      CK(cudaDeviceSynchronize());
      const float one = 1.0f, zero = 0.0f;
      const int64_t part_stride = int64_t{rows} * sh.n;
      // form: 0 GEMM + residual alone, 1 today's pair, s > 1 the K-split form with s slices.
      auto enqueue = [&](int form, const half* wc) -> int {
        if (form <= 1) {
          CK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, sh.n, rows, sh.k, &one, wc, CUDA_R_16F,
                          sh.k, a, CUDA_R_16F, sh.k, &one, x, CUDA_R_32F, sh.n, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT));
          if (form == 1) rmsnorm<<<rows, kThreads, 0, st>>>(x, gamma, y, sh.n);
          return 0;
        }
        const int kk = sh.k / form;
        CK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, sh.n, rows, kk, &one, wc,
                                      CUDA_R_16F, sh.k, kk, a, CUDA_R_16F, sh.k, kk, &zero, part,
                                      CUDA_R_32F, sh.n, part_stride, form, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT));
        add_partials_norm<kPer><<<rows, kThreads, 0, st>>>(part, form, part_stride, x, gamma, y,
                                                           sh.n);
        return 0;
      };
      // The check: one call of today's pair and of each split form from the same residual.
      std::vector<float> ref_x(size_t(rows) * sh.n), got_x(ref_x.size());
      std::vector<half> ref_y(ref_x.size()), got_y(ref_x.size());
      CK(cudaMemcpy(x, x0, ref_x.size() * 4, cudaMemcpyDeviceToDevice));
      if (enqueue(1, w)) return 1;
      CK(cudaStreamSynchronize(st));
      CK(cudaMemcpy(ref_x.data(), x, ref_x.size() * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(ref_y.data(), y, ref_y.size() * 2, cudaMemcpyDeviceToHost));
      auto fits = [&](int s) { return sh.k % s == 0 && (sh.k / s) % 64 == 0; };
      double worst = 0.0;
      for (int s : splits) {
        if (!fits(s)) continue;
        CK(cudaMemcpy(x, x0, ref_x.size() * 4, cudaMemcpyDeviceToDevice));
        if (enqueue(s, w)) return 1;
        CK(cudaStreamSynchronize(st));
        CK(cudaGetLastError());
        CK(cudaMemcpy(got_x.data(), x, got_x.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(got_y.data(), y, got_y.size() * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < ref_x.size(); ++i) {
          worst = std::fmax(worst, std::fabs(got_x[i] - ref_x[i]) / (std::fabs(ref_x[i]) + 1.0));
          const float ry = __half2float(ref_y[i]), gy = __half2float(got_y[i]);
          worst = std::fmax(worst, std::fabs(gy - ry) / (std::fabs(ry) + 1.0));
        }
      }
      const int reps = 60;
      auto timed = [&](int form, float* us) -> int {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (int r = 0; r < reps; ++r) {
          if (enqueue(form, w + (r % copies) * wn)) return 1;
        }
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphLaunch(ge, st));  // warm
        CK(cudaStreamSynchronize(st));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        float best = 1e30f;
        for (int round = 0; round < 5; ++round) {
          CK(cudaEventRecord(e0, st));
          CK(cudaGraphLaunch(ge, st));
          CK(cudaEventRecord(e1, st));
          CK(cudaEventSynchronize(e1));
          float ms;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          best = std::fmin(best, ms);
        }
        *us = best * 1000.0f / reps;
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
        return 0;
      };
      float alone, today;
      if (timed(0, &alone) || timed(1, &today)) return 1;
      printf("| %d | %s | %.1f | %.1f |", rows, sh.name, alone, today);
      for (int s : splits) {
        float us;
        if (!fits(s)) {
          printf(" - |");
          continue;
        }
        if (timed(s, &us)) return 1;
        printf(" %.1f |", us);
      }
      printf(" %.1e |\n", worst);
      fflush(stdout);
      CK(cudaFree(w));
      CK(cudaFree(a));
      CK(cudaFree(y));
      CK(cudaFree(x));
      CK(cudaFree(x0));
      CK(cudaFree(part));
    }
  }
  return 0;
}
