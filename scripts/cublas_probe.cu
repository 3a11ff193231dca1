// cuBLAS's choices for the 16-bit GEMMs of batched decode, cold: cublasGemmEx's default against
// every candidate cublasLt's heuristic offers (up to 32), for the Qwen3-8B fp16 shapes at 8 to 256
// rows (+res: beta = 1 into an fp32 out, the residual form). Each weight is cycled over enough
// copies (up to 400 MB) that L2 holds none of it, as in a model. A measurement tool, not part of
// the build (docs/PERFORMANCE.md, issue 13's section):
//
//   nvcc -O2 -arch=sm_90 scripts/cublas_probe.cu -lcublasLt -lcublas -o /tmp/cublas_probe && /tmp/cublas_probe
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cstdio>
#include <vector>
#include <algorithm>

#include "probe.cuh"
// Weights and x filled with small random fp16 values (zeros would draw less power than a model's).
int main(int argc, char** argv) {
  struct Shape { const char* name; int N, K; bool f32out, acc; };
  std::vector<Shape> shapes = {{"qkv", 6144, 4096, false, false}, {"q", 4096, 4096, false, false}, {"kv", 2048, 4096, false, false}, {"o+res", 4096, 4096, true, true},
      {"o", 4096, 4096, false, false}, {"o+res16", 4096, 4096, false, true}, {"gate_up", 24576, 4096, false, false}, {"down", 4096, 12288, false, false}, {"down+res", 4096, 12288, true, true}, {"lm_head", 151936, 4096, true, false}};
  std::vector<int> Ts = {8, 16, 64, 256};
  if (argc > 1) { Ts.clear(); for (int i = 1; i < argc; ++i) Ts.push_back(atoi(argv[i])); }
  cublasHandle_t h; CK(cublasCreate(&h));
  cublasLtHandle_t lt; CK(cublasLtCreate(&lt));
  size_t wsb = 32 << 20; void* ws; CK(cudaMalloc(&ws, wsb)); CK(cublasSetWorkspace(h, ws, wsb));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  for (auto& s : shapes) {
    size_t wbytes = (size_t)s.N * s.K * 2;
    int copies = std::max<int>(1, (int)((400u << 20) / wbytes)); if (copies > 8) copies = 8;
    std::vector<void*> W(copies);
    unsigned seed = 1;
    for (auto& p : W) { CK(cudaMalloc(&p, wbytes)); fill<<<1024, 256>>>((__half*)p, wbytes / 2, seed++, 0.025f); }
    for (int T : Ts) {
      void *x, *out; CK(cudaMalloc(&x, (size_t)T * s.K * 2)); fill<<<64, 256>>>((__half*)x, (size_t)T * s.K, 99, 0.025f);
      CK(cudaMalloc(&out, (size_t)T * s.N * 4)); CK(cudaMemset(out, 0, (size_t)T * s.N * 4));
      float alpha = 1, beta = s.acc ? 1 : 0;
      cudaDataType_t ct = s.f32out ? CUDA_R_32F : CUDA_R_16F;
      auto time = [&](auto fn) { for (int i = 0; i < 3; ++i) fn(i % copies); cudaEventRecord(e0); int R = 40;
        for (int i = 0; i < R; ++i) fn(i % copies); cudaEventRecord(e1); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); return 1000 * ms / R; };
      float tdef = time([&](int c) { CK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.N, T, s.K, &alpha, W[c], CUDA_R_16F, s.K, x, CUDA_R_16F, s.K, &beta, out, ct, s.N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)); });
      cublasLtMatmulDesc_t op; CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
      CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA));
      CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB));
      cublasLtMatrixLayout_t a, b, c;
      CK(cublasLtMatrixLayoutCreate(&a, CUDA_R_16F, s.K, s.N, s.K));
      CK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16F, s.K, T, s.K));
      CK(cublasLtMatrixLayoutCreate(&c, ct, s.N, T, s.N));
      cublasLtMatmulPreference_t pref; CK(cublasLtMatmulPreferenceCreate(&pref));
      CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
      cublasLtMatmulHeuristicResult_t res[32]; int found = 0;
      CK(cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, 32, res, &found));
      float best = 1e9, first = 0; int bi = -1;
      for (int i = 0; i < found; ++i) {
        float t = time([&](int cc) { CK(cublasLtMatmul(lt, op, &alpha, W[cc], a, x, b, &beta, out, c, out, c, &res[i].algo, ws, wsb, 0)); });
        if (i == 0) first = t; if (t < best) { best = t; bi = i; }
      }
      double ideal = (wbytes + (double)T * s.K * 2 + (double)T * s.N * (s.f32out ? 4 : 2) * (s.acc ? 2 : 1)) / 3.0e6;
      printf("%-9s T=%3d  gemmEx %7.1f us  lt[0] %7.1f  lt best %7.1f (#%d of %d)  ideal@3TB/s %6.1f\n", s.name, T, tdef, first, best, bi, found, ideal);
      cublasLtMatmulPreferenceDestroy(pref); cublasLtMatrixLayoutDestroy(a); cublasLtMatrixLayoutDestroy(b); cublasLtMatrixLayoutDestroy(c); cublasLtMatmulDescDestroy(op);
      cudaFree(x); cudaFree(out);
    }
    for (auto p : W) cudaFree(p);
  }
  return 0;
}
