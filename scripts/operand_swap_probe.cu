// The decode projections with x as cuBLASLt's A operand (row-major layouts: M = rows of x, N =
// weight rows) against cublasGemmEx as the engine calls it (W as A, M = weight rows), every
// candidate of the heuristic timed with the weights cold (copies rotated over 512 MB), the best
// one's output compared with GemmEx's. A measurement tool, not part of the build
// (docs/PERFORMANCE.md, "x as cuBLAS's A operand"):
//
//   nvcc -O2 -arch=sm_90 scripts/operand_swap_probe.cu -lcublasLt -lcublas -o /tmp/swap_probe && /tmp/swap_probe
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cstdio>
#include <cmath>
#include <vector>
#include <algorithm>

#include "probe.cuh"
int main() {
  struct Shape { const char* name; int N, K; };
  std::vector<Shape> shapes = {{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 24576, 4096}, {"down", 4096, 12288}};
  cublasHandle_t h; CK(cublasCreate(&h));
  cublasLtHandle_t lt; CK(cublasLtCreate(&lt));
  size_t wsb = 32 << 20; void* ws; CK(cudaMalloc(&ws, wsb)); CK(cublasSetWorkspace(h, ws, wsb));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  for (auto& s : shapes) {
    size_t wbytes = (size_t)s.N * s.K * 2;
    int copies = std::max<int>(2, (int)((512u << 20) / wbytes));
    std::vector<void*> W(copies);
    unsigned seed = 1;
    for (auto& p : W) { CK(cudaMalloc(&p, wbytes)); fill<<<1024, 256>>>((__half*)p, wbytes / 2, seed++, 0.025f); }
    for (int T : {64, 128, 256}) {
      void *x, *out, *ref; CK(cudaMalloc(&x, (size_t)T * s.K * 2)); fill<<<64, 256>>>((__half*)x, (size_t)T * s.K, 99, 0.025f);
      CK(cudaMalloc(&out, (size_t)T * s.N * 2)); CK(cudaMalloc(&ref, (size_t)T * s.N * 2));
      float alpha = 1, beta = 0;
      auto time = [&](auto fn) { for (int i = 0; i < 5; ++i) fn(i % copies); cudaEventRecord(e0); int R = 60;
        for (int i = 0; i < R; ++i) fn(i % copies); cudaEventRecord(e1); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); return 1000 * ms / R; };
      auto gemmex = [&](int c, void* o) { CK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.N, T, s.K, &alpha, W[c], CUDA_R_16F, s.K, x, CUDA_R_16F, s.K, &beta, o, CUDA_R_16F, s.N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)); };
      float tdef = time([&](int c) { gemmex(c, out); });
      gemmex(0, ref);
      // Swapped: C [T, N] row-major = A x [T, K] row-major (op N) * B: W [N, K] row-major, op T.
      cublasLtMatmulDesc_t op; CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      cublasOperation_t tA = CUBLAS_OP_N, tB = CUBLAS_OP_T;
      CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA));
      CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB));
      cublasLtMatrixLayout_t a, b, c;
      cublasLtOrder_t row = CUBLASLT_ORDER_ROW;
      CK(cublasLtMatrixLayoutCreate(&a, CUDA_R_16F, T, s.K, s.K));
      CK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16F, s.N, s.K, s.K));
      CK(cublasLtMatrixLayoutCreate(&c, CUDA_R_16F, T, s.N, s.N));
      for (auto l : {a, b, c}) CK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, sizeof row));
      cublasLtMatmulPreference_t pref; CK(cublasLtMatmulPreferenceCreate(&pref));
      CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
      cublasLtMatmulHeuristicResult_t res[16]; int found = 0;
      auto st = cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, 16, res, &found);
      float best = 1e9, first = 0; int bi = -1; double maxdiff = 0;
      for (int i = 0; st == 0 && i < found; ++i) {
        float t = time([&](int cc) { CK(cublasLtMatmul(lt, op, &alpha, x, a, W[cc], b, &beta, out, c, out, c, &res[i].algo, ws, wsb, 0)); });
        if (i == 0) first = t;
        if (t < best) { best = t; bi = i; }
      }
      if (bi >= 0) {
        CK(cublasLtMatmul(lt, op, &alpha, x, a, W[0], b, &beta, out, c, out, c, &res[bi].algo, ws, wsb, 0));
        std::vector<__half> o1((size_t)T * s.N), o2((size_t)T * s.N);
        CK(cudaMemcpy(o1.data(), out, o1.size() * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(o2.data(), ref, o2.size() * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < o1.size(); ++i) maxdiff = std::max(maxdiff, (double)fabsf(__half2float(o1[i]) - __half2float(o2[i])));
      }
      printf("%-8s T=%3d  GemmEx %6.1f us (%4.0f GB/s) | x as A: heuristic status %d, %d algos, first %6.1f, best %6.1f us, max |diff| %.2e\n",
             s.name, T, tdef, wbytes / tdef / 1e3, (int)st, found, first, best, maxdiff);
      cudaFree(x); cudaFree(out); cudaFree(ref);
    }
    for (auto p : W) cudaFree(p);
  }
}
