// Sampling on the device, so a decode step copies back a 4-byte token instead of a logits row.
// The arithmetic follows the CPU reference (kernels/cpu/sample.cpp) step for step, so the two
// pick the same token for the same uniform draw except where a probability lands within a
// rounding of a boundary:
//   1. keys[i] = penalised(logit[i]) * (1 / temperature), ids[i] = i;
//   2. sort (key, id) pairs most likely first: CUB's radix sort is stable, so equal keys keep the
//      lower id first, the CPU's tie rule;
//   3. one block over the first n = top_k (or V) sorted keys: softmax in double, top-p prefix,
//      min-p cut, renormalise, inverse-CDF draw at the host's uniform.
// Greedy (temperature 0) is the arg-max kernel over the penalised logits.
#include <cub/cub.cuh>

#include <algorithm>

#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"

namespace kuiper::cuda {

namespace {

constexpr int kThreads = 1024;

__global__ void scale_kernel(const float* __restrict__ logits, float* __restrict__ keys,
                             int32_t* __restrict__ ids, int64_t V, float inv_temperature) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= V) return;
  keys[i] = __fmul_rn(logits[i], inv_temperature);
  ids[i] = static_cast<int32_t>(i);
}

// One thread per recent id. A repeated id is written by several threads, all with the same value
// computed from the unpenalised logit, so it is penalised once, as on the CPU.
__global__ void penalty_kernel(const float* __restrict__ logits, const int32_t* __restrict__ recent,
                               int64_t n, float* __restrict__ keys, int64_t V, float penalty,
                               float inv_temperature) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  const int32_t id = recent[j];
  if (id < 0 || id >= V) return;
  const float v = logits[id];
  const float p = v > 0.0f ? __fdiv_rn(v, penalty) : __fmul_rn(v, penalty);
  keys[id] = __fmul_rn(p, inv_temperature);
}

using BlockReduce = cub::BlockReduce<double, kThreads>;
using BlockScan = cub::BlockScan<double, kThreads>;

union SharedStorage {
  typename BlockReduce::TempStorage reduce;
  typename BlockScan::TempStorage scan;
};

// Sum of value(i) over [0, n) in double, broadcast to every thread.
template <typename Value>
__device__ double block_sum(int64_t n, Value value, SharedStorage& storage, double* result) {
  double local = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) local += value(i);
  const double total = BlockReduce(storage.reduce).Sum(local);
  if (threadIdx.x == 0) *result = total;
  __syncthreads();
  const double out = *result;
  __syncthreads();
  return out;
}

// The first i in [0, n) whose running sum value(0) + ... + value(i) passes `crossed`, or n. The
// scan goes tile by tile so a block of kThreads covers any n, stopping at the tile that crosses.
template <typename Value, typename Crossed>
__device__ int64_t first_crossing(int64_t n, Value value, Crossed crossed, SharedStorage& storage,
                                  int64_t* found) {
  if (threadIdx.x == 0) *found = n;
  __syncthreads();
  double carry = 0.0;
  for (int64_t base = 0; base < n; base += kThreads) {
    const int64_t i = base + threadIdx.x;
    const double x = i < n ? value(i) : 0.0;
    double inclusive, tile_total;
    BlockScan(storage.scan).InclusiveSum(x, inclusive, tile_total);
    if (i < n && crossed(carry + inclusive)) atomicMin(reinterpret_cast<unsigned long long*>(found),
                                                       static_cast<unsigned long long>(i));
    __syncthreads();
    if (*found < n) break;
    carry += tile_total;
  }
  const int64_t out = *found;
  __syncthreads();
  return out;
}

// Steps 3 of the file comment, one block of kThreads; `n` is the top-k prefix of the sorted row.
__global__ void __launch_bounds__(kThreads)
    draw_kernel(const float* __restrict__ keys, const int32_t* __restrict__ ids, int64_t n,
                float top_p, float min_p, double uniform, int32_t* __restrict__ out) {
  __shared__ SharedStorage storage;
  __shared__ double shared_sum;
  __shared__ int64_t shared_index;
  const float top = keys[0];
  auto weight = [&](int64_t i) { return exp(static_cast<double>(__fsub_rn(keys[i], top))); };
  const double total = block_sum(n, weight, storage, &shared_sum);
  // The softmax probability as the CPU stores it: a float.
  auto prob = [&](int64_t i) { return static_cast<float>(weight(i) / total); };
  auto prob_d = [&](int64_t i) { return static_cast<double>(prob(i)); };

  // Top-p: the smallest prefix whose mass reaches top_p, the crossing token included.
  int64_t kept = n;
  if (top_p < 1.0f) {
    const double target = top_p;
    const int64_t i = first_crossing(
        n, prob_d, [&](double mass) { return mass >= target; }, storage, &shared_index);
    kept = i < n ? i + 1 : n;
  }
  // Min-p: probabilities never increase along the sorted row, so the cut is the first one below
  // the floor (the top token always stays).
  if (min_p > 0.0f) {
    const float floor = __fmul_rn(min_p, prob(0));
    if (threadIdx.x == 0) shared_index = kept;
    __syncthreads();
    for (int64_t i = 1 + threadIdx.x; i < kept; i += kThreads) {
      if (prob(i) < floor) {
        atomicMin(reinterpret_cast<unsigned long long*>(&shared_index),
                  static_cast<unsigned long long>(i));
      }
    }
    __syncthreads();
    kept = shared_index;
    __syncthreads();
  }
  const double kept_mass = block_sum(kept, prob_d, storage, &shared_sum);
  auto renormalised = [&](int64_t i) {
    return static_cast<double>(static_cast<float>(prob_d(i) / kept_mass));
  };
  const int64_t pick = first_crossing(
      kept, renormalised, [&](double mass) { return uniform < mass; }, storage, &shared_index);
  // Past the end only when uniform fell in the rounding gap at the top of the distribution.
  if (threadIdx.x == 0) out[0] = ids[pick < kept ? pick : kept - 1];
}

// (Re)allocates the workspace for a vocabulary of V; a no-op once it fits.
Status prepare(op::SampleWorkspace& ws, int64_t V) {
  if (ws.keys.defined() && ws.keys.numel() == V && ws.keys.device() == DeviceType::kCuda) {
    return Status::Ok();
  }
  const int n = static_cast<int>(V);
  KUIPER_ASSIGN_OR_RETURN(ws.keys, Tensor::empty({V}, DataType::kFp32, DeviceType::kCuda));
  KUIPER_ASSIGN_OR_RETURN(ws.ids, Tensor::empty({V}, DataType::kInt32, DeviceType::kCuda));
  KUIPER_ASSIGN_OR_RETURN(ws.sorted_keys, Tensor::empty({V}, DataType::kFp32, DeviceType::kCuda));
  KUIPER_ASSIGN_OR_RETURN(ws.sorted_ids, Tensor::empty({V}, DataType::kInt32, DeviceType::kCuda));
  size_t bytes = 0;
  KUIPER_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
      nullptr, bytes, ws.keys.data<float>(), ws.sorted_keys.data<float>(), ws.ids.data<int32_t>(),
      ws.sorted_ids.data<int32_t>(), n, 0, 32, stream()));
  KUIPER_ASSIGN_OR_RETURN(ws.sort_temp,
                          Tensor::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))},
                                        DataType::kInt8, DeviceType::kCuda));
  return Status::Ok();
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + 255) / 256); }

}  // namespace

Status sample(const Tensor& logits, const Tensor& recent, const op::SampleParams& params,
              double uniform, op::SampleWorkspace& ws, Tensor& out) {
  const int64_t V = logits.numel();
  const int64_t n_recent = recent.defined() ? recent.numel() : 0;
  const bool penalise = params.repeat_penalty != 1.0f && n_recent > 0;
  const bool greedy = params.temperature == 0.0f;
  if (greedy && !penalise) return argmax(logits, out);

  KUIPER_RETURN_IF_ERROR(prepare(ws, V));
  const float inv_temperature = greedy ? 1.0f : 1.0f / params.temperature;
  scale_kernel<<<blocks_for(V), 256, 0, stream()>>>(logits.data<float>(), ws.keys.data<float>(),
                                                    ws.ids.data<int32_t>(), V, inv_temperature);
  KUIPER_CUDA_CHECK_LAUNCH("sampling scale kernel");
  if (penalise) {
    penalty_kernel<<<blocks_for(n_recent), 256, 0, stream()>>>(
        logits.data<float>(), recent.data<int32_t>(), n_recent, ws.keys.data<float>(), V,
        params.repeat_penalty, inv_temperature);
    KUIPER_CUDA_CHECK_LAUNCH("sampling penalty kernel");
  }
  if (greedy) return argmax(ws.keys, out);

  size_t bytes = ws.sort_temp.nbytes();
  KUIPER_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
      ws.sort_temp.raw(), bytes, ws.keys.data<float>(), ws.sorted_keys.data<float>(),
      ws.ids.data<int32_t>(), ws.sorted_ids.data<int32_t>(), static_cast<int>(V), 0, 32,
      stream()));
  const int64_t n = params.top_k > 0 && params.top_k < V ? params.top_k : V;
  draw_kernel<<<1, kThreads, 0, stream()>>>(ws.sorted_keys.data<float>(),
                                            ws.sorted_ids.data<int32_t>(), n, params.top_p,
                                            params.min_p, uniform, out.data<int32_t>());
  KUIPER_CUDA_CHECK_LAUNCH("sampling draw kernel");
  return Status::Ok();
}

}  // namespace kuiper::cuda
