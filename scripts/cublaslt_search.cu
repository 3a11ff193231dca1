// cuBLASLt's configuration space searched for the 16-bit GEMMs of batched decode, cold, beyond the
// up to 8 candidates its heuristic offers (scripts/cublas_probe.cu times those): every algorithm
// id, tile, stage count, cluster shape, split-K count, reduction scheme and CTA swizzle that
// cublasLtMatmulAlgoCheck accepts, checked in random order up to a cap a shape, each timed briefly over weight
// copies cycled past L2; the best 16 then timed again at length beside cublasGemmEx (Kuiper's call
// today) and the heuristic's best. Qwen3-8B shapes, fp16, the residual forms as Kuiper runs them
// (beta = 1 into the fp16 residual). A measurement tool, not part of the build (docs/PERFORMANCE.md,
// issue 13's section):
//
//   nvcc -O2 -arch=sm_90 scripts/cublaslt_search.cu -lcublasLt -lcublas -o /tmp/cublaslt_search &&
//     /tmp/cublaslt_search [T ...]          (default: 64 256)
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "probe.cuh"


struct Config {
  int id, tile, stages, cluster, splitk, reduction, swizzle;
  cublasLtMatmulAlgo_t algo;
  size_t workspace;
  float us;
};

int main(int argc, char** argv) {
  struct Shape {
    const char* name;
    int N, K;
    bool residual;
  };
  const std::vector<Shape> shapes = {{"q|k|v", 6144, 4096, false},
                                     {"o+res", 4096, 4096, true},
                                     {"gate|up", 24576, 4096, false},
                                     {"down+res", 4096, 12288, true}};
  std::vector<int> Ts = {64, 256};
  if (argc > 1) {
    Ts.clear();
    for (int i = 1; i < argc; ++i) Ts.push_back(atoi(argv[i]));
  }
  const int kCap = 2000;  // configurations timed briefly a shape
  cublasHandle_t h;
  CK(cublasCreate(&h));
  cublasLtHandle_t lt;
  CK(cublasLtCreate(&lt));
  size_t wsb = 64 << 20;
  void* ws;
  CK(cudaMalloc(&ws, wsb));
  CK(cublasSetWorkspace(h, ws, 32 << 20));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  int ids[256], nids = 0;
  CK(cublasLtMatmulAlgoGetIds(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16F, CUDA_R_16F,
                              CUDA_R_16F, CUDA_R_16F, 256, ids, &nids));
  printf("%d algorithm ids\n", nids);
  const int clusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO, CUBLASLT_CLUSTER_SHAPE_1x1x1,
                          CUBLASLT_CLUSTER_SHAPE_2x1x1, CUBLASLT_CLUSTER_SHAPE_1x2x1,
                          CUBLASLT_CLUSTER_SHAPE_4x1x1, CUBLASLT_CLUSTER_SHAPE_1x4x1,
                          CUBLASLT_CLUSTER_SHAPE_2x2x1};
  const int splits[] = {1, 2, 3, 4, 6, 8, 12, 16};
  std::mt19937 rng(1234);
  std::vector<std::string> table;
  for (const Shape& s : shapes) {
    const size_t wbytes = (size_t)s.N * s.K * 2;
    const int copies = std::max<int>(2, std::min<int>(8, (int)((480u << 20) / wbytes)));
    std::vector<void*> W(copies);
    unsigned seed = 1;
    for (auto& p : W) {
      CK(cudaMalloc(&p, wbytes));
      fill<<<1024, 256>>>((__half*)p, wbytes / 2, seed++, 0.025f);
    }
    for (int T : Ts) {
      void *x, *out;
      CK(cudaMalloc(&x, (size_t)T * s.K * 2));
      fill<<<64, 256>>>((__half*)x, (size_t)T * s.K, 99, 0.025f);
      CK(cudaMalloc(&out, (size_t)T * s.N * 2));
      CK(cudaMemset(out, 0, (size_t)T * s.N * 2));
      const float alpha = 1, beta = s.residual ? 1 : 0;
      auto time = [&](int reps, auto fn) {
        fn(0);
        fn(1 % copies);
        CK(cudaEventRecord(e0));
        for (int i = 0; i < reps; ++i) fn(i % copies);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        return 1000 * ms / reps;
      };
      cublasLtMatmulDesc_t op;
      CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
      CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA));
      CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB));
      cublasLtMatrixLayout_t a, b, c;
      CK(cublasLtMatrixLayoutCreate(&a, CUDA_R_16F, s.K, s.N, s.K));
      CK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16F, s.K, T, s.K));
      CK(cublasLtMatrixLayoutCreate(&c, CUDA_R_16F, s.N, T, s.N));
      auto run = [&](const cublasLtMatmulAlgo_t* algo, int copy) {
        return cublasLtMatmul(lt, op, &alpha, W[copy], a, x, b, &beta, out, c, out, c, algo, ws,
                              wsb, 0);
      };
      // The space: every configuration the check accepts.
      const auto t_enum = std::chrono::steady_clock::now();
      std::vector<Config> space, all;
      for (int k = 0; k < nids; ++k) {
        cublasLtMatmulAlgo_t algo;
        if (cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16F, CUDA_R_16F,
                                   CUDA_R_16F, CUDA_R_16F, ids[k], &algo) != 0)
          continue;
        size_t n = 0;
        std::vector<int> tiles(1, 0), stages(1, 0);
        if (cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_TILE_IDS, nullptr, 0,
                                              &n) == 0 && n > 0) {
          tiles.resize(n / sizeof(int));
          CK(cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_TILE_IDS, tiles.data(), n,
                                               &n));
        }
        if (cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_STAGES_IDS, nullptr, 0,
                                              &n) == 0 && n > 0) {
          stages.resize(n / sizeof(int));
          CK(cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_STAGES_IDS, stages.data(),
                                               n, &n));
        }
        int splitk_ok = 0, swizzle_ok = 0;
        uint32_t reduction_mask = 0;
        cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splitk_ok,
                                          sizeof splitk_ok, &n);
        cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK,
                                          &reduction_mask, sizeof reduction_mask, &n);
        cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT,
                                          &swizzle_ok, sizeof swizzle_ok, &n);
        for (int tile : tiles)
          for (int stage : stages)
            for (int cluster : clusters)
              for (int splitk : splits) {
                if (splitk > 1 && !splitk_ok) continue;
                for (int reduction : {0, 1, 2, 4}) {
                  if ((splitk == 1) != (reduction == 0)) continue;
                  if (reduction != 0 && !(reduction_mask & reduction)) continue;
                  for (int swizzle = 0; swizzle <= swizzle_ok; ++swizzle)
                    space.push_back({ids[k], tile, stage, cluster, splitk, reduction, swizzle,
                                     algo, 0, 0});
                }
              }
      }
      // Checked in random order until kCap pass or 10 s go by.
      std::shuffle(space.begin(), space.end(), rng);
      size_t checked = 0;
      for (Config& cfg : space) {
        if (all.size() >= (size_t)kCap ||
            std::chrono::steady_clock::now() - t_enum > std::chrono::seconds(10))
          break;
        ++checked;
        auto set = [&](cublasLtMatmulAlgoConfigAttributes_t attr, auto v) {
          return cublasLtMatmulAlgoConfigSetAttribute(&cfg.algo, attr, &v, sizeof v);
        };
        if (set(CUBLASLT_ALGO_CONFIG_TILE_ID, (uint32_t)cfg.tile) != 0 ||
            set(CUBLASLT_ALGO_CONFIG_STAGES_ID, (uint32_t)cfg.stages) != 0 ||
            set(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, (uint16_t)cfg.cluster) != 0 ||
            set(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, (int32_t)cfg.splitk) != 0 ||
            set(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, (uint32_t)cfg.reduction) != 0 ||
            set(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, (uint32_t)cfg.swizzle) != 0)
          continue;
        cublasLtMatmulHeuristicResult_t r;
        if (cublasLtMatmulAlgoCheck(lt, op, a, b, c, c, &cfg.algo, &r) != 0) continue;
        if (r.workspaceSize > wsb) continue;
        cfg.workspace = r.workspaceSize;
        all.push_back(cfg);
      }
      const double enum_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t_enum).count();
      // Brief timing of each; one that fails to run is dropped.
      std::vector<Config> timed;
      for (Config& cfg : all) {
        if (run(&cfg.algo, 0) != 0) {
          cudaGetLastError();
          continue;
        }
        cfg.us = time(6, [&](int cc) { CK(run(&cfg.algo, cc)); });
        timed.push_back(cfg);
      }
      std::sort(timed.begin(), timed.end(),
                [](const Config& l, const Config& r) { return l.us < r.us; });
      if (timed.size() > 16) timed.resize(16);
      // At length: GemmEx, the heuristic's best, the search's best 16; three rounds, the best of
      // each round's figure kept.
      cublasLtMatmulPreference_t pref;
      CK(cublasLtMatmulPreferenceCreate(&pref));
      CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                              sizeof wsb));
      cublasLtMatmulHeuristicResult_t heur[16];
      int found = 0;
      CK(cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, 16, heur, &found));
      float gemm_ex = 1e9, heuristic = 1e9;
      std::vector<float> best(timed.size(), 1e9);
      for (int round = 0; round < 3; ++round) {
        gemm_ex = std::min(gemm_ex, time(60, [&](int cc) {
                             CK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.N, T, s.K, &alpha,
                                             W[cc], CUDA_R_16F, s.K, x, CUDA_R_16F, s.K, &beta,
                                             out, CUDA_R_16F, s.N, CUBLAS_COMPUTE_32F,
                                             CUBLAS_GEMM_DEFAULT));
                           }));
        for (int i = 0; i < found; ++i)
          heuristic = std::min(heuristic, time(60, [&](int cc) { CK(run(&heur[i].algo, cc)); }));
        for (size_t i = 0; i < timed.size(); ++i)
          best[i] = std::min(best[i], time(60, [&](int cc) { CK(run(&timed[i].algo, cc)); }));
      }
      size_t bi = 0;
      for (size_t i = 1; i < timed.size(); ++i)
        if (best[i] < best[bi]) bi = i;
      const Config& w = timed[bi];
      const double bytes = wbytes + (double)T * s.K * 2 + (double)T * s.N * 2 * (s.residual ? 2 : 1);
      char line[512];
      snprintf(line, sizeof line,
               "| %s (%d x %d) | %d | %.1f (%.0f GB/s) | %.1f | **%.1f** (%.0f GB/s) | id %d tile %d "
               "stages %d cluster %d split %d red %d swz %d ws %zu | %zu of %zu checked of %zu, %.1f s |",
               s.name, s.N, s.K, T, gemm_ex, bytes / gemm_ex / 1e3, heuristic, best[bi],
               bytes / best[bi] / 1e3, w.id, w.tile, w.stages, w.cluster, w.splitk, w.reduction,
               w.swizzle, w.workspace, all.size(), checked, space.size(), enum_s);
      printf("%s\n", line);
      fflush(stdout);
      table.push_back(line);
      cublasLtMatmulPreferenceDestroy(pref);
      cublasLtMatrixLayoutDestroy(a);
      cublasLtMatrixLayoutDestroy(b);
      cublasLtMatrixLayoutDestroy(c);
      cublasLtMatmulDescDestroy(op);
      CK(cudaFree(x));
      CK(cudaFree(out));
    }
    for (void* p : W) CK(cudaFree(p));
  }
  printf("\n| projection (N x K) | T | cublasGemmEx us | heuristic best us | searched best us | "
         "configuration | valid of checked of the space, check time |\n|---|---|---|---|---|---|---|\n");
  for (const std::string& l : table) printf("%s\n", l.c_str());
  return 0;
}
