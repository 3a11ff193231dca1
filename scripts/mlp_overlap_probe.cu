// The batched decode's MLP (gate|up GEMM, SwiGLU, down GEMM + residual) at T rows, Qwen3-8B
// fp16 shapes, timed inside a CUDA graph two ways: as the engine runs it (three kernels one after
// another), and cut along the intermediate dimension into two parts A and B whose gate|up GEMMs
// and SwiGLUs run on two streams, so that part B's GEMM fills the SMs part A's last wave leaves
// idle and down's first half (K over part A) can start before part B's gate|up ends. A
// measurement tool, not part of the build (docs/PERFORMANCE.md, issue 13's section):
//
//   nvcc -O2 -arch=sm_90 scripts/mlp_overlap_probe.cu -lcublas -o /tmp/mlp_probe && /tmp/mlp_probe
#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe.cuh"


constexpr int kHidden = 4096, kInter = 12288, kLayers = 8;

// h[t, c0 + j] = silu(g) * u for j in [0, c1 - c0), the part's gate g at gu[t, 2 c0 + j] and
// its up u at gu[t, c0 + c1 + j] (gate_up's layout).
__global__ void swiglu(const __half* gu, __half* h, int T, int c0, int c1) {
  const int w = c1 - c0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < T * w; i += gridDim.x * blockDim.x) {
    const int t = i / w, j = i % w, c = c0 + j;
    const float g = __half2float(gu[static_cast<size_t>(t) * 2 * kInter + 2 * c0 + j]);
    const float u = __half2float(gu[static_cast<size_t>(t) * 2 * kInter + c0 + c1 + j]);
    h[static_cast<size_t>(t) * kInter + c] = __float2half(g / (1.0f + __expf(-g)) * u);
  }
}

struct Layer {
  __half* gate_up;  // [2 I, H]: gate rows, then up rows
  __half* down;     // [H, I]
};

struct Buffers {
  __half* x;     // [T, H]
  __half* gu;    // [T, 2 I]
  __half* h;     // [T, I]
  float* res;    // [T, H]
};

// Part [c0, c1) of the intermediate dimension as one plain GEMM, the weights laid out a part at a
// time (its gate rows, then its up rows: what a model would store at load for a fixed cut):
// gu[:, 2 c0 : 2 c1] = x (rows 2 c0 .. 2 c1)^T, gate columns first.
void gate_up(cublasHandle_t hd, const Layer& l, const Buffers& b, int T, int c0, int c1) {
  const float one = 1, zero = 0;
  CK(cublasGemmEx(hd, CUBLAS_OP_T, CUBLAS_OP_N, 2 * (c1 - c0), T, kHidden, &one,
                  l.gate_up + static_cast<size_t>(2) * c0 * kHidden, CUDA_R_16F, kHidden, b.x,
                  CUDA_R_16F, kHidden, &zero, b.gu + 2 * c0, CUDA_R_16F, 2 * kInter,
                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
void gate_up_whole(cublasHandle_t hd, const Layer& l, const Buffers& b, int T) {
  const float one = 1, zero = 0;
  CK(cublasGemmEx(hd, CUBLAS_OP_T, CUBLAS_OP_N, 2 * kInter, T, kHidden, &one, l.gate_up,
                  CUDA_R_16F, kHidden, b.x, CUDA_R_16F, kHidden, &zero, b.gu, CUDA_R_16F,
                  2 * kInter, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
// res += h[:, c0:c1] down[:, c0:c1]^T.
void down(cublasHandle_t hd, const Layer& l, const Buffers& b, int T, int c0, int c1) {
  const float one = 1;
  CK(cublasGemmEx(hd, CUBLAS_OP_T, CUBLAS_OP_N, kHidden, T, c1 - c0, &one, l.down + c0,
                  CUDA_R_16F, kInter, b.h + c0, CUDA_R_16F, kInter, &one, b.res, CUDA_R_32F,
                  kHidden, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
void run_swiglu(cudaStream_t s, const Buffers& b, int T, int c0, int c1) {
  const int n = T * (c1 - c0);
  swiglu<<<std::min((n + 255) / 256, 132 * 8), 256, 0, s>>>(b.gu, b.h, T, c0, c1);
  CK(cudaGetLastError());
}

int main(int argc, char** argv) {
  std::vector<int> Ts = {64, 128, 256};
  if (argc > 1) {
    Ts.clear();
    for (int i = 1; i < argc; ++i) Ts.push_back(atoi(argv[i]));
  }
  std::vector<Layer> layers(kLayers);
  unsigned seed = 1;
  for (Layer& l : layers) {
    CK(cudaMalloc(&l.gate_up, static_cast<size_t>(2) * kInter * kHidden * 2));
    CK(cudaMalloc(&l.down, static_cast<size_t>(kHidden) * kInter * 2));
    fill<<<1024, 256>>>(l.gate_up, static_cast<size_t>(2) * kInter * kHidden, seed++, 0.025f);
    fill<<<1024, 256>>>(l.down, static_cast<size_t>(kHidden) * kInter, seed++, 0.025f);
  }
  int lo = 0, hi = 0;
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  cudaStream_t s1, s2;
  CK(cudaStreamCreateWithPriority(&s1, cudaStreamNonBlocking, hi));
  CK(cudaStreamCreateWithPriority(&s2, cudaStreamNonBlocking, lo));
  cublasHandle_t h1, h2;
  CK(cublasCreate(&h1));
  CK(cublasCreate(&h2));
  const size_t wsb = size_t{32} << 20;
  void *ws1, *ws2;
  CK(cudaMalloc(&ws1, wsb));
  CK(cudaMalloc(&ws2, wsb));
  CK(cublasSetWorkspace(h1, ws1, wsb));
  CK(cublasSetWorkspace(h2, ws2, wsb));
  CK(cublasSetStream(h1, s1));
  CK(cublasSetStream(h2, s2));
  cudaEvent_t fork, joinA, joinB, e0, e1;
  CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&joinA, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&joinB, cudaEventDisableTiming));
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));

  for (const int T : Ts) {
    Buffers b;
    CK(cudaMalloc(&b.x, static_cast<size_t>(T) * kHidden * 2));
    CK(cudaMalloc(&b.gu, static_cast<size_t>(T) * 2 * kInter * 2));
    CK(cudaMalloc(&b.h, static_cast<size_t>(T) * kInter * 2));
    CK(cudaMalloc(&b.res, static_cast<size_t>(T) * kHidden * 4));
    fill<<<64, 256>>>(b.x, static_cast<size_t>(T) * kHidden, 99, 0.025f);
    CK(cudaMemset(b.res, 0, static_cast<size_t>(T) * kHidden * 4));
    CK(cudaDeviceSynchronize());

    // Captures kLayers MLPs in the form `form` (a = 0: the engine's; else the cut at a) and
    // returns the replay's us a layer (median of 5 timings of 10 replays).
    auto time_form = [&](int a, bool concurrent) {
      cudaGraph_t graph;
      CK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
      for (const Layer& l : layers) {
        if (a == 0) {
          gate_up_whole(h1, l, b, T);
          run_swiglu(s1, b, T, 0, kInter);
          down(h1, l, b, T, 0, kInter);
        } else if (!concurrent) {
          gate_up(h1, l, b, T, 0, a);
          gate_up(h1, l, b, T, a, kInter);
          run_swiglu(s1, b, T, 0, kInter);
          down(h1, l, b, T, 0, a);
          down(h1, l, b, T, a, kInter);
        } else {
          CK(cudaEventRecord(fork, s1));
          CK(cudaStreamWaitEvent(s2, fork));
          gate_up(h1, l, b, T, 0, a);
          run_swiglu(s1, b, T, 0, a);
          gate_up(h2, l, b, T, a, kInter);
          run_swiglu(s2, b, T, a, kInter);
          CK(cudaEventRecord(joinB, s2));
          down(h1, l, b, T, 0, a);
          CK(cudaStreamWaitEvent(s1, joinB));
          down(h1, l, b, T, a, kInter);
        }
      }
      CK(cudaStreamEndCapture(s1, &graph));
      cudaGraphExec_t exec;
      CK(cudaGraphInstantiate(&exec, graph, 0));
      for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(exec, s1));
      std::vector<float> us;
      for (int r = 0; r < 5; ++r) {
        CK(cudaEventRecord(e0, s1));
        for (int i = 0; i < 10; ++i) CK(cudaGraphLaunch(exec, s1));
        CK(cudaEventRecord(e1, s1));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        us.push_back(1000 * ms / (10 * kLayers));
      }
      CK(cudaGraphExecDestroy(exec));
      CK(cudaGraphDestroy(graph));
      std::sort(us.begin(), us.end());
      return us[2];
    };
    // The parts alone, to see the waves: gate|up over the first a columns of both halves.
    auto time_gate_up = [&](int a) {
      CK(cudaEventRecord(e0, s1));
      for (int i = 0; i < 40; ++i) gate_up(h1, layers[i % kLayers], b, T, 0, a);
      CK(cudaEventRecord(e1, s1));
      CK(cudaEventSynchronize(e1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      return 1000 * ms / 40;
    };
    time_gate_up(kInter);  // cuBLAS's first calls of a shape
    printf("T = %d: gate|up over a columns of each half alone (us):", T);
    for (int a = 512; a <= kInter; a += 512) printf(" %d:%.1f", a, time_gate_up(a));
    printf("\n");
    const float whole = time_form(0, false);
    printf("T = %d: the engine's MLP %.1f us a layer\n", T, whole);
    for (int a : {4096, 6144, 7680, 8192, 8448, 8704, 9216, 10240}) {
      const float seq = time_form(a, false), conc = time_form(a, true);
      printf("T = %d: cut at %d: in turn %.1f, two streams %.1f us a layer (%+.1f%%)\n", T, a,
             seq, conc, 100.0f * (whole - conc) / whole);
    }
    CK(cudaFree(b.x));
    CK(cudaFree(b.gu));
    CK(cudaFree(b.h));
    CK(cudaFree(b.res));
  }
  return 0;
}
