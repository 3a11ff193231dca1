// Do cuBLAS's GEMM kernels wait for their producer under programmatic dependent launch (PDL), and
// what would letting them start early save? The batched decode step launches its own kernels
// with PDL (each waits with griddepcontrol.wait, then lets the next kernel launch), but a cuBLAS
// GEMM starts only when the kernel before it has finished. In a captured graph the edge into a
// GEMM's first kernel can be made programmatic, after the capture (cudaGraphAddDependencies) or
// during it (cudaStreamUpdateCaptureDependencies before the cuBLAS call). A measurement tool, not
// part of the build (docs/PERFORMANCE.md, issue 13's section):
//
//   nvcc -O2 -arch=sm_90 scripts/pdl_cublas_probe.cu -lcublas -o /tmp/pdl_cublas_probe &&
//     /tmp/pdl_cublas_probe [T ...]        (default: 64 256)
//
// 1. Safety, for each Qwen3-8B projection shape and a small one: a graph of [x = 0] -> produce
//    (PDL: waits, lets the next kernel start at once, spins 40 us, then writes x = 1) -> the
//    cuBLAS GEMM (weights of ones: every output is K when it read the new x). With 132 producer
//    blocks every SM holds one and a GEMM block that needs a whole SM cannot start beside it, so
//    an early read goes unseen; with 1 block, 131 SMs are free.
//    Answer (H200, CUDA 13.0's cuBLAS, 2026-11-30): with 1 producer block every output of every
//    shape was read early, by either way of making the edge: cuBLAS's kernels do not wait, and a
//    programmatic edge into them is a race.
// 2. Time: 36 layers of [norm-like kernel (PDL) -> q|k|v GEMM -> kernel (PDL) -> o GEMM + residual
//    -> kernel (PDL) -> gate|up GEMM -> kernel (PDL) -> down GEMM + residual], each layer's own
//    weights, one graph, replayed: the edges into the GEMMs ordinary against programmatic. Since
//    the GEMMs do not wait, the programmatic figure is of a wrong schedule (a bound, not a gain).
#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <vector>

#include "probe.cuh"


__device__ __forceinline__ void gdc_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void gdc_launch() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void fill_value(__half* p, size_t n, float v) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] = __float2half(v);
}

// Waits, lets the next kernel start, spins, then writes x = 1.
__global__ void produce(__half* x, size_t n, unsigned spin_ns) {
  gdc_wait();
  gdc_launch();
  const unsigned long long t0 = now_ns();
  while (now_ns() - t0 < spin_ns) {
  }
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] = __float2half(1.0f);
}

// An RMSNorm's traffic: a block a row, reads `in`'s row, writes the scaled row to `out`.
__global__ void norm_like(const __half* in, __half* out, int K) {
  gdc_wait();
  gdc_launch();
  const __half* r = in + (size_t)blockIdx.x * K;
  __half* o = out + (size_t)blockIdx.x * K;
  float ss = 0;
  for (int i = threadIdx.x; i < K; i += blockDim.x) ss += __half2float(r[i]) * __half2float(r[i]);
  __shared__ float part[32];
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < (int)(blockDim.x >> 5); ++w) total += part[w];
  const float scale = rsqrtf(total / K + 1e-6f);
  for (int i = threadIdx.x; i < K; i += blockDim.x) o[i] = __float2half(__half2float(r[i]) * scale);
}

template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t s, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.stream = s;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  CK(cudaLaunchKernelEx(&config, kernel, args...));
}

// Makes every ordinary edge from one of `ours` (kernels that trigger after their wait) into a
// kernel node that is not one of them programmatic. Returns how many it changed.
int programmatic_into_others(cudaGraph_t g, const std::set<const void*>& ours) {
  size_t n = 0;
  CK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n));
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  CK(cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &n));
  auto kernel_of = [](cudaGraphNode_t node) -> const void* {
    cudaGraphNodeType type;
    CK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeKernel) return nullptr;
    cudaKernelNodeParams p;
    if (cudaGraphKernelNodeGetParams(node, &p) != cudaSuccess) {
      cudaGetLastError();
      return (const void*)1;  // a kernel of a library (not a runtime function)
    }
    return p.func;
  };
  int changed = 0;
  for (size_t i = 0; i < n; ++i) {
    if (data[i].type != cudaGraphDependencyTypeDefault) continue;
    const void* f = kernel_of(from[i]);
    const void* t = kernel_of(to[i]);
    if (f == nullptr || t == nullptr || !ours.count(f) || ours.count(t)) continue;
    CK(cudaGraphRemoveDependencies(g, &from[i], &to[i], &data[i], 1));
    cudaGraphEdgeData e = {};
    e.from_port = cudaGraphKernelNodePortProgrammatic;
    e.type = cudaGraphDependencyTypeProgrammatic;
    CK(cudaGraphAddDependencies(g, &from[i], &to[i], &e, 1));
    ++changed;
  }
  return changed;
}

struct Shape {
  const char* name;
  int N, K;
  bool residual;
};

int main(int argc, char** argv) {
  std::vector<int> Ts = {64, 256};
  if (argc > 1) {
    Ts.clear();
    for (int i = 1; i < argc; ++i) Ts.push_back(atoi(argv[i]));
  }
  const Shape shapes[4] = {{"q|k|v", 6144, 4096, false},
                           {"o+res", 4096, 4096, true},
                           {"gate|up", 24576, 4096, false},
                           {"down+res", 4096, 12288, true}};
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cublasHandle_t h;
  CK(cublasCreate(&h));
  CK(cublasSetStream(h, s));
  void* ws;
  CK(cudaMalloc(&ws, 32 << 20));
  CK(cublasSetWorkspace(h, ws, 32 << 20));
  const std::set<const void*> ours = {(const void*)produce, (const void*)norm_like};
  auto gemm = [&](const Shape& sh, int T, const __half* w, const __half* x, __half* out) {
    const float alpha = 1, beta = sh.residual ? 1 : 0;
    CK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, sh.N, T, sh.K, &alpha, w, CUDA_R_16F, sh.K, x,
                    CUDA_R_16F, sh.K, &beta, out, CUDA_R_16F, sh.N, CUBLAS_COMPUTE_32F,
                    CUBLAS_GEMM_DEFAULT));
  };
  auto instantiate = [&](cudaGraph_t g, bool programmatic, int* changed) {
    *changed = programmatic ? programmatic_into_others(g, ours) : 0;
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, g, 0));
    return exec;
  };

  // 1. Safety.
  const Shape trial_shapes[6] = {shapes[0], shapes[1], shapes[2], shapes[3],
                                 {"small", 384, 512, false}, {"small+res", 384, 512, true}};
  printf("| shape | T | producer blocks | edge made | kernel nodes after produce | programmatic edges | replays | "
         "outputs not K (early reads) |\n");
  printf("|---|---|---|---|---|---|---|---|\n");
  bool any_early = false;
  for (int T : Ts) {
    for (const Shape& sh : trial_shapes) {
      for (int variant = 0; variant < 3; ++variant) {
        // 132 producer blocks fill every SM (a GEMM whose blocks need a whole SM cannot start
        // beside them, so an early read goes unseen); 1 block leaves 131 SMs free.
        const int during = variant == 2, producers = variant == 0 ? 132 : 1;
        __half *w, *x, *out;
        CK(cudaMalloc(&w, (size_t)sh.N * sh.K * 2));
        CK(cudaMalloc(&x, (size_t)T * sh.K * 2));
        CK(cudaMalloc(&out, (size_t)T * sh.N * 2));
        // The K of the down shape (12288) is not exact in fp16; use 1/4 weights and compare K/4.
        const float wv = sh.K > 4096 ? 0.25f : 1.0f;
        fill_value<<<1024, 256, 0, s>>>(w, (size_t)sh.N * sh.K, wv);
        CK(cudaStreamSynchronize(s));
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        fill_value<<<256, 256, 0, s>>>(x, (size_t)T * sh.K, 0.0f);
        fill_value<<<256, 256, 0, s>>>(out, (size_t)T * sh.N, 0.0f);
        launch_pdl(produce, dim3(producers), dim3(256), s, x, (size_t)T * sh.K, 40000u);
        if (during) {  // the edge set before cuBLAS launches, as the engine would
          cudaStreamCaptureStatus st;
          const cudaGraphNode_t* deps = nullptr;
          size_t nd = 0;
          CK(cudaStreamGetCaptureInfo(s, &st, nullptr, nullptr, &deps, nullptr, &nd));
          cudaGraphNode_t node = deps[0];
          cudaGraphEdgeData e = {};
          e.from_port = cudaGraphKernelNodePortProgrammatic;
          e.type = cudaGraphDependencyTypeProgrammatic;
          CK(cudaStreamUpdateCaptureDependencies(s, &node, &e, 1, cudaStreamSetCaptureDependencies));
        }
        gemm(sh, T, w, x, out);
        CK(cudaStreamEndCapture(s, &g));
        int changed = 0;
        cudaGraphExec_t exec = instantiate(g, !during, &changed);
        // What the graph holds: kernel nodes and programmatic edges.
        size_t nn = 0, ne = 0;
        CK(cudaGraphGetNodes(g, nullptr, &nn));
        std::vector<cudaGraphNode_t> nodes(nn);
        CK(cudaGraphGetNodes(g, nodes.data(), &nn));
        int kernels = 0;
        for (auto nd : nodes) {
          cudaGraphNodeType type;
          CK(cudaGraphNodeGetType(nd, &type));
          kernels += type == cudaGraphNodeTypeKernel;
        }
        CK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &ne));
        std::vector<cudaGraphNode_t> ef(ne), et(ne);
        std::vector<cudaGraphEdgeData> ed(ne);
        CK(cudaGraphGetEdges(g, ef.data(), et.data(), ed.data(), &ne));
        int prog = 0;
        for (auto& d : ed) prog += d.type == cudaGraphDependencyTypeProgrammatic;
        std::vector<__half> host((size_t)T * sh.N);
        long bad = 0;
        const int replays = 20;
        for (int r = 0; r < replays; ++r) {
          CK(cudaGraphLaunch(exec, s));
          CK(cudaMemcpyAsync(host.data(), out, host.size() * 2, cudaMemcpyDeviceToHost, s));
          CK(cudaStreamSynchronize(s));
          const float want = sh.K * wv;
          for (const __half& v : host) bad += __half2float(v) != want;
        }
        any_early |= bad > 0;
        printf("| %s | %d | %d | %s | %d | %d | %d | %ld of %zu |\n", sh.name, T, producers,
               during ? "during capture" : "after capture", kernels - 3, prog, replays, bad,
               host.size() * replays);
        CK(cudaGraphExecDestroy(exec));
        CK(cudaGraphDestroy(g));
        CK(cudaFree(w));
        CK(cudaFree(x));
        CK(cudaFree(out));
      }
    }
  }

  // 2. Time, 36 layers.
  const int L = 36;
  std::vector<__half*> W(4 * L);
  for (int l = 0; l < L; ++l)
    for (int k = 0; k < 4; ++k) {
      const size_t n = (size_t)shapes[k].N * shapes[k].K;
      CK(cudaMalloc(&W[4 * l + k], n * 2));
      fill<<<1024, 256, 0, s>>>(W[4 * l + k], n, 4 * l + k + 1, 0.025f);
    }
  printf("\n| T | ordinary edges ms a replay | programmatic into the GEMMs ms | edges changed |\n");
  printf("|---|---|---|---|\n");
  for (int T : Ts) {
    __half *hidden, *normed, *qkv, *attn, *gu, *act;
    CK(cudaMalloc(&hidden, (size_t)T * 4096 * 2));
    CK(cudaMalloc(&normed, (size_t)T * 4096 * 2));
    CK(cudaMalloc(&qkv, (size_t)T * 6144 * 2));
    CK(cudaMalloc(&attn, (size_t)T * 4096 * 2));
    CK(cudaMalloc(&gu, (size_t)T * 24576 * 2));
    CK(cudaMalloc(&act, (size_t)T * 12288 * 2));
    fill<<<256, 256, 0, s>>>(hidden, (size_t)T * 4096, 7, 0.025f);
    fill<<<256, 256, 0, s>>>(gu, (size_t)T * 24576, 8, 0.025f);
    CK(cudaStreamSynchronize(s));
    float ms[2];
    int changed[2];
    for (int variant = 0; variant < 2; ++variant) {
      cudaGraph_t g;
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      for (int l = 0; l < L; ++l) {
        launch_pdl(norm_like, dim3(T), dim3(256), s, (const __half*)hidden, normed, 4096);
        gemm(shapes[0], T, W[4 * l], normed, qkv);
        launch_pdl(norm_like, dim3(T), dim3(256), s, (const __half*)qkv, attn, 4096);
        gemm(shapes[1], T, W[4 * l + 1], attn, hidden);
        launch_pdl(norm_like, dim3(T), dim3(256), s, (const __half*)hidden, normed, 4096);
        gemm(shapes[2], T, W[4 * l + 2], normed, gu);
        launch_pdl(norm_like, dim3(T), dim3(256), s, (const __half*)gu, act, 12288);
        gemm(shapes[3], T, W[4 * l + 3], act, hidden);
      }
      CK(cudaStreamEndCapture(s, &g));
      cudaGraphExec_t exec = instantiate(g, variant == 1, &changed[variant]);
      cudaEvent_t e0, e1;
      CK(cudaEventCreate(&e0));
      CK(cudaEventCreate(&e1));
      for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(exec, s));
      float best = 1e9;
      for (int round = 0; round < 5; ++round) {
        CK(cudaEventRecord(e0, s));
        for (int i = 0; i < 10; ++i) CK(cudaGraphLaunch(exec, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        best = std::min(best, t / 10);
      }
      ms[variant] = best;
      CK(cudaGraphExecDestroy(exec));
      CK(cudaGraphDestroy(g));
    }
    printf("| %d | %.3f | %.3f | %d |\n", T, ms[0], ms[1], changed[1]);
    for (__half* p : {hidden, normed, qkv, attn, gu, act}) CK(cudaFree(p));
  }
  printf("\ncuBLAS read early somewhere: %s\n", any_early ? "YES (unsafe)" : "no");
  return 0;
}
