// GEMM probe (issue 13): how fast cuBLAS runs Qwen3-8B's batched-decode projections, the way
// Kuiper calls it (cublasGemmEx, fp16, fp32 accumulation, out[T, N] = x[T, K] @ w[N, K]^T),
// against every algorithm cuBLASLt's heuristic offers for the same problem (up to 32), each timed.
// Weights rotate over enough copies to leave the L2 cold, as in a decode step. Prints one row a
// (projection, T): us and GB/s (weight bytes over time) of GemmEx, of Lt's first choice and of the
// fastest Lt algorithm, with that algorithm's split-K and tile ids.
//
//   nvcc -O2 -std=c++17 -arch=sm_90 docs/experiments/gemm_probe.cu -lcublas -lcublasLt -o probe
//   ./probe [T ...]          (default T: 16 32 64 128 256)
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK_CUDA(x)                                                                 \
  do {                                                                                \
    cudaError_t e = (x);                                                              \
    if (e != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)
#define CHECK_BLAS(x)                                                                 \
  do {                                                                                \
    cublasStatus_t status_ = (x);                                                           \
    if (status_ != CUBLAS_STATUS_SUCCESS) {                                               \
      std::fprintf(stderr, "%s:%d %s: status %d\n", __FILE__, __LINE__, #x, int(status_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

struct Shape {
  const char* name;
  int n, k;
};

constexpr int kReps = 30;
constexpr size_t kColdBytes = size_t{512} << 20;  // weight copies rotate over at least this

// Median-free: the mean of kReps back-to-back launches, each on the next weight copy.
template <typename F>
float time_us(F launch, int copies) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) launch(i % copies);
  CHECK_CUDA(cudaEventRecord(a));
  for (int i = 0; i < kReps; ++i) launch(i % copies);
  CHECK_CUDA(cudaEventRecord(b));
  CHECK_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  return ms * 1000.0f / kReps;
}

int main(int argc, char** argv) {
  std::vector<int> ts;
  for (int i = 1; i < argc; ++i) ts.push_back(std::atoi(argv[i]));
  if (ts.empty()) ts = {16, 32, 64, 128, 256};
  const Shape shapes[] = {{"q|k|v", 6144, 4096},
                          {"o", 4096, 4096},
                          {"gate|up", 24576, 4096},
                          {"down", 4096, 12288},
                          {"lm_head", 151936, 4096}};
  cublasHandle_t blas;
  cublasLtHandle_t lt;
  CHECK_BLAS(cublasCreate(&blas));
  CHECK_BLAS(cublasLtCreate(&lt));
  const size_t workspace_bytes = size_t{32} << 20;
  void* workspace;
  CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
  CHECK_BLAS(cublasSetWorkspace(blas, workspace, workspace_bytes));
  std::printf("| projection | T | GemmEx us | GemmEx GB/s | Lt first us | Lt best us | Lt best GB/s "
              "| best / GemmEx | best algo (id, tile, split-K) | algos |\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Shape& s : shapes) {
    const size_t w_bytes = size_t{2} * s.n * s.k;
    const int copies = static_cast<int>(std::max<size_t>(1, (kColdBytes + w_bytes - 1) / w_bytes));
    std::vector<__half*> w(copies);
    for (auto& p : w) {
      CHECK_CUDA(cudaMalloc(&p, w_bytes));
      CHECK_CUDA(cudaMemset(p, 0x11, w_bytes));  // small finite halves
    }
    for (int t : ts) {
      __half *x, *out;
      CHECK_CUDA(cudaMalloc(&x, size_t{2} * t * s.k));
      CHECK_CUDA(cudaMalloc(&out, size_t{2} * t * s.n));
      CHECK_CUDA(cudaMemset(x, 0x11, size_t{2} * t * s.k));
      const float alpha = 1.0f, beta = 0.0f;
      // Column-major: out^T[N, T] = w^T'[N, K] (w read as K x N, transposed) * x^T[K, T].
      const float gemmex = time_us(
          [&](int c) {
            CHECK_BLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, s.n, t, s.k, &alpha, w[c],
                                    CUDA_R_16F, s.k, x, CUDA_R_16F, s.k, &beta, out, CUDA_R_16F,
                                    s.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
          },
          copies);
      cublasLtMatmulDesc_t op;
      CHECK_BLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      CHECK_BLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
      CHECK_BLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
      cublasLtMatrixLayout_t la, lb, lc;
      CHECK_BLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_16F, s.k, s.n, s.k));
      CHECK_BLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16F, s.k, t, s.k));
      CHECK_BLAS(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16F, s.n, t, s.n));
      cublasLtMatmulPreference_t pref;
      CHECK_BLAS(cublasLtMatmulPreferenceCreate(&pref));
      CHECK_BLAS(cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof(workspace_bytes)));
      cublasLtMatmulHeuristicResult_t results[32];
      int found = 0;
      CHECK_BLAS(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 32, results, &found));
      float first = -1, best = 1e30f;
      int best_i = -1;
      for (int i = 0; i < found; ++i) {
        if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
        const float us = time_us(
            [&](int c) {
              CHECK_BLAS(cublasLtMatmul(lt, op, &alpha, w[c], la, x, lb, &beta, out, lc, out, lc,
                                        &results[i].algo, workspace, workspace_bytes, 0));
            },
            copies);
        if (i == 0) first = us;
        if (us < best) best = us, best_i = i;
      }
      int algo_id = -1, tile = -1, splits = -1;
      if (best_i >= 0) {
        size_t written;
        cublasLtMatmulAlgoConfigGetAttribute(&results[best_i].algo, CUBLASLT_ALGO_CONFIG_ID,
                                             &algo_id, sizeof(algo_id), &written);
        cublasLtMatmulAlgoConfigGetAttribute(&results[best_i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID,
                                             &tile, sizeof(tile), &written);
        cublasLtMatmulAlgoConfigGetAttribute(&results[best_i].algo,
                                             CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                             sizeof(splits), &written);
      }
      const double gb = (w_bytes + 2.0 * t * (s.k + s.n)) / 1e3;  // bytes / us = MB/s; / 1e3 GB/s
      std::printf("| %s | %d | %.1f | %.0f | %.1f | %.1f | %.0f | %.2f | %d (#%d), %d, %d | %d |\n",
                  s.name, t, gemmex, gb / gemmex, first, best, gb / best, best / gemmex, algo_id,
                  best_i, tile, splits, found);
      std::fflush(stdout);
      cublasLtMatmulPreferenceDestroy(pref);
      cublasLtMatrixLayoutDestroy(la);
      cublasLtMatrixLayoutDestroy(lb);
      cublasLtMatrixLayoutDestroy(lc);
      cublasLtMatmulDescDestroy(op);
      CHECK_CUDA(cudaFree(x));
      CHECK_CUDA(cudaFree(out));
    }
    for (auto* p : w) CHECK_CUDA(cudaFree(p));
  }
  return 0;
}
