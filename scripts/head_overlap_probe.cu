// Whether the attention half of a batched decode layer gains from cutting it by kv heads into P
// parts on two streams: part p's q|k|v GEMM (its N slice), its attention, and its share of o_proj
// (the K slice of its heads, added into the fp32 residual), with the GEMMs on one stream and the
// attention parts on another, so that part p's attention (memory-bound) runs beside part p+1's
// q|k|v GEMM and part p-1's o GEMM (compute-bound at 256 rows). Unlike micro-batches of
// sequences, every weight is still read once a step. Qwen3-8B fp16 shapes (q|k|v 6144 x 4096, o
// 4096 x 4096, 8 kv heads of 128, 147 KB of K and V a token over 36 layers), T sequences at 512
// keys each.
//
// The attention is a stand-in: `kv_stream` streams the layer's K and V bytes (T x 512 keys x 4
// KB) through a 3-tile ring of 32 KB (64 KB in flight a block, 2 blocks of 4 warps an SM, as the
// engine's flash2 decode), with REPS rounds of arithmetic on each 16 bytes it holds, so that it
// is as busy as the real kernel (whose schedulers issue in 27-32% of cycles). Its grid is the
// engine's (264 blocks) or fewer, leaving SMs to the GEMM beside it. Each schedule is captured
// in one CUDA graph of 12 layers (cold weights and K/V) and replayed. A measurement tool, not
// part of the build (docs/PERFORMANCE.md, issue 13's section):
//
//   nvcc -O3 -arch=sm_90 scripts/head_overlap_probe.cu -lcublas -o /tmp/head_overlap && /tmp/head_overlap 256 64
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe.cuh"


constexpr int kHidden = 4096, kQkv = 6144, kLayers = 12, kKeys = 512;
constexpr int64_t kKvBytesPerToken = 8 * 128 * 2 * 2;  // one layer: 8 kv heads, K and V, fp16
constexpr int kTile = 32 * 1024, kStages = 3, kThreads = 128;
constexpr int kSmem = kStages * kTile + 4 * 1024;  // ~100 KB: two blocks an SM

__device__ __forceinline__ void cp16(uint32_t d, const void* s) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(s));
}

// Streams bytes [b * n / grid, (b + 1) * n / grid) of kv in 32 KB tiles (n a multiple of 32 KB
// a block), REPS dependent rounds of arithmetic on each 16 bytes a thread holds.
__global__ void __launch_bounds__(kThreads, 2)
    kv_stream(const uint4* kv, int64_t tiles, int reps, float* sink) {
  extern __shared__ uint4 ring[];
  const int64_t t0 = blockIdx.x * tiles / gridDim.x, t1 = (blockIdx.x + 1) * tiles / gridDim.x;
  const int n = static_cast<int>(t1 - t0);
  constexpr int kChunks = kTile / 16;
  auto load = [&](int i) {
    uint4* d = ring + (i % kStages) * kChunks;
    const uint4* s = kv + (t0 + i) * kChunks;
#pragma unroll
    for (int j = 0; j < kChunks / kThreads; ++j) {
      const int c = threadIdx.x + j * kThreads;
      cp16(static_cast<uint32_t>(__cvta_generic_to_shared(d + c)), s + c);
    }
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < n) load(i);
    asm volatile("cp.async.commit_group;\n");
  }
  float acc = 0.0f;
  for (int i = 0; i < n; ++i) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2));
    __syncthreads();
    if (i + kStages - 1 < n) load(i + kStages - 1);
    asm volatile("cp.async.commit_group;\n");
    const uint4* d = ring + (i % kStages) * kChunks;
#pragma unroll 4
    for (int j = 0; j < kChunks / kThreads; ++j) {
      const uint4 v = d[threadIdx.x + j * kThreads];
      float x = __uint_as_float(v.x & 0x3fffffffu) + __uint_as_float(v.w & 0x3fffffffu);
      for (int r = 0; r < reps; ++r) x = fmaf(x, 0.999f, 1e-3f);
      acc += x;
    }
  }
  if (acc == 12345.678f) sink[blockIdx.x] = acc;  // keeps the work; never true in practice
}

struct Setup {
  int T;
  cublasHandle_t handle;
  cudaStream_t g, a;  // the GEMMs' stream, the attention's
  __half *wqkv, *wo, *x, *qkv, *attn;
  uint4* kv;
  float *res, *sink;
  int64_t kv_layer_bytes;
};

// out[T, n] = x[T, K] W[rows n, K]^T (+ out when residual), W's rows from row0, x's columns and
// W's columns from col0 (ld of both: ld).
void gemm(Setup& s, const __half* w, int64_t ldw, int n, int k, const __half* x, int64_t ldx,
          void* out, int64_t ldo, bool residual) {
  const float one = 1.0f, zero = 0.0f;
  CK(cublasGemmEx(s.handle, CUBLAS_OP_T, CUBLAS_OP_N, n, s.T, k, &one, w, CUDA_R_16F, ldw, x,
                  CUDA_R_16F, ldx, residual ? &one : &zero, out,
                  residual ? CUDA_R_32F : CUDA_R_16F, ldo, CUBLAS_COMPUTE_32F,
                  CUBLAS_GEMM_DEFAULT));
}

void attention(Setup& s, cudaStream_t st, int layer, int part, int parts, int grid, int reps) {
  const int64_t part_bytes = s.kv_layer_bytes / parts;
  const uint4* base = s.kv + (layer * s.kv_layer_bytes + part * part_bytes) / 16;
  kv_stream<<<grid, kThreads, kSmem, st>>>(base, part_bytes / kTile, reps, s.sink);
}

// One layer's q|k|v, attention and o in `parts` parts by kv head (1: the engine's order, one
// stream), the attention on `grid` blocks.
void layer(Setup& s, int l, int parts, int grid, int reps, std::vector<cudaEvent_t>& ev) {
  const __half* wqkv = s.wqkv + int64_t(l) * kQkv * kHidden;
  const __half* wo = s.wo + int64_t(l) * kHidden * kHidden;
  const int qn = kQkv / parts, ok = kHidden / parts;
  if (parts == 1) {
    gemm(s, wqkv, kHidden, kQkv, kHidden, s.x, kHidden, s.qkv, kQkv, false);
    attention(s, s.g, l, 0, 1, grid, reps);
    gemm(s, wo, kHidden, kHidden, kHidden, s.attn, kHidden, s.res, kHidden, true);
    return;
  }
  // GEMM stream: every part's q|k|v (each recorded), then each part's o after its attention.
  for (int p = 0; p < parts; ++p) {
    gemm(s, wqkv + int64_t(p) * qn * kHidden, kHidden, qn, kHidden, s.x, kHidden,
         s.qkv + p * qn, kQkv, false);
    CK(cudaEventRecord(ev[p], s.g));
    CK(cudaStreamWaitEvent(s.a, ev[p], 0));
    attention(s, s.a, l, p, parts, grid, reps);
    CK(cudaEventRecord(ev[parts + p], s.a));
  }
  for (int p = 0; p < parts; ++p) {
    CK(cudaStreamWaitEvent(s.g, ev[parts + p], 0));
    gemm(s, wo + p * ok, kHidden, kHidden, ok, s.attn + p * ok, kHidden, s.res, kHidden, true);
  }
}

// us a layer of the schedule, median of 5 rounds of 5 replays of a graph of kLayers layers.
float time_schedule(Setup& s, int parts, int grid, int reps, int what) {
  std::vector<cudaEvent_t> ev(2 * parts);
  for (auto& event : ev) CK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(s.g, cudaStreamCaptureModeGlobal));
  for (int l = 0; l < kLayers; ++l) {
    if (what == 0) layer(s, l, parts, grid, reps, ev);
    if (what == 1) gemm(s, s.wqkv + int64_t(l) * kQkv * kHidden, kHidden, kQkv, kHidden, s.x,
                        kHidden, s.qkv, kQkv, false);
    if (what == 2) attention(s, s.g, l, 0, 1, grid, reps);
    if (what == 3) gemm(s, s.wo + int64_t(l) * kHidden * kHidden, kHidden, kHidden, kHidden,
                        s.attn, kHidden, s.res, kHidden, true);
  }
  CK(cudaStreamEndCapture(s.g, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  for (int r = 0; r < 3; ++r) CK(cudaGraphLaunch(exec, s.g));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> us;
  for (int r = 0; r < 5; ++r) {
    CK(cudaEventRecord(e0, s.g));
    for (int i = 0; i < 5; ++i) CK(cudaGraphLaunch(exec, s.g));
    CK(cudaEventRecord(e1, s.g));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    us.push_back(1000 * ms / (5 * kLayers));
  }
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  for (auto& event : ev) CK(cudaEventDestroy(event));
  std::sort(us.begin(), us.end());
  return us[2];
}

int main(int argc, char** argv) {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaFuncSetAttribute(kv_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  cublasHandle_t handle;
  CK(cublasCreate(&handle));
  void* ws;
  CK(cudaMalloc(&ws, 64 << 20));
  CK(cublasSetWorkspace(handle, ws, 64 << 20));
  for (int arg = 1; arg < argc; ++arg) {
    Setup s{};
    s.T = atoi(argv[arg]);
    s.handle = handle;
    CK(cudaStreamCreateWithFlags(&s.g, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s.a, cudaStreamNonBlocking));
    CK(cublasSetStream(handle, s.g));
    s.kv_layer_bytes = int64_t(s.T) * kKeys * kKvBytesPerToken;
    CK(cudaMalloc(&s.wqkv, int64_t(kLayers) * kQkv * kHidden * 2));
    CK(cudaMalloc(&s.wo, int64_t(kLayers) * kHidden * kHidden * 2));
    CK(cudaMalloc(&s.x, int64_t(s.T) * kHidden * 2));
    CK(cudaMalloc(&s.qkv, int64_t(s.T) * kQkv * 2));
    CK(cudaMalloc(&s.attn, int64_t(s.T) * kHidden * 2));
    CK(cudaMalloc(&s.res, int64_t(s.T) * kHidden * 4));
    CK(cudaMalloc(&s.sink, 4096 * 4));
    CK(cudaMalloc(&s.kv, kLayers * s.kv_layer_bytes));
    fill<<<1024, 256>>>(s.wqkv, int64_t(kLayers) * kQkv * kHidden, 1, 0.025f);
    fill<<<1024, 256>>>(s.wo, int64_t(kLayers) * kHidden * kHidden, 2, 0.025f);
    fill<<<256, 256>>>(s.x, int64_t(s.T) * kHidden, 3, 0.025f);
    fill<<<256, 256>>>(s.attn, int64_t(s.T) * kHidden, 4, 0.025f);
    fill<<<1024, 256>>>(reinterpret_cast<__half*>(s.kv), kLayers * s.kv_layer_bytes / 2, 5, 0.025f);
    CK(cudaMemset(s.res, 0, int64_t(s.T) * kHidden * 4));
    CK(cudaDeviceSynchronize());
    const float mb = s.kv_layer_bytes / 1e6f;
    printf("\n## %d sequences: K and V %.0f MB a layer; alone, us a layer\n\n", s.T, mb);
    const float t_qkv = time_schedule(s, 1, 2 * sms, 0, 1);
    const float t_o = time_schedule(s, 1, 2 * sms, 0, 3);
    printf("q|k|v GEMM %.1f, o GEMM + residual %.1f\n\n", t_qkv, t_o);
    printf("| REPS | attention alone (GB/s) | sequential | 2 parts, %d blocks | 2 parts, %d | "
           "2 parts, %d | 4 parts, %d | best / sequential |\n|---|---|---|---|---|---|---|---|\n",
           2 * sms, 2 * (sms - 16), 2 * (sms - 32), 2 * sms);
    for (int reps : {0, 32, 128}) {
      const float t_a = time_schedule(s, 1, 2 * sms, reps, 2);
      const float seq = time_schedule(s, 1, 2 * sms, reps, 0);
      const float p2 = time_schedule(s, 2, 2 * sms, reps, 0);
      const float p2a = time_schedule(s, 2, 2 * (sms - 16), reps, 0);
      const float p2b = time_schedule(s, 2, 2 * (sms - 32), reps, 0);
      const float p4 = time_schedule(s, 4, 2 * sms, reps, 0);
      const float best = std::min(std::min(p2, p2a), std::min(p2b, p4));
      printf("| %d | %.1f (%.0f) | %.1f | %.1f | %.1f | %.1f | %.1f | %.3f |\n", reps, t_a,
             mb * 1e3f / t_a, seq, p2, p2a, p2b, p4, best / seq);
    }
    CK(cudaGetLastError());
    cudaFree(s.wqkv), cudaFree(s.wo), cudaFree(s.x), cudaFree(s.qkv), cudaFree(s.attn);
    cudaFree(s.res), cudaFree(s.sink), cudaFree(s.kv);
  }
  return 0;
}
