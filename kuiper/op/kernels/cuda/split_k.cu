#include "kuiper/op/kernels/cuda/split_k.cuh"

#include "kuiper/base/allocator.h"
#include "kuiper/op/kernels/cuda/primitives.cuh"

namespace kuiper::cuda {

namespace {

struct Workspace {
  float4* partials = nullptr;
  unsigned* arrived = nullptr;
};

Result<Workspace> make_workspace() {
  KUIPER_ASSIGN_OR_RETURN(Allocator * allocator, allocator_for(DeviceType::kCuda));
  Workspace w;
  KUIPER_ASSIGN_OR_RETURN(void* partials,
                          allocator->allocate(kSplitKMaxItems * 32 * sizeof(float4)));
  KUIPER_ASSIGN_OR_RETURN(void* arrived, allocator->allocate(kSplitKMaxItems * sizeof(unsigned)));
  w.partials = static_cast<float4*>(partials);
  w.arrived = static_cast<unsigned*>(arrived);
  // Zeroed once, synchronously, on a stream of its own: a capture on the engine stream in
  // progress neither records nor forbids it.
  cudaStream_t side = nullptr;
  KUIPER_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  const cudaError_t set = cudaMemsetAsync(w.arrived, 0, kSplitKMaxItems * sizeof(unsigned), side);
  const cudaError_t synced = cudaStreamSynchronize(side);
  const cudaError_t destroyed = cudaStreamDestroy(side);
  KUIPER_CUDA_CHECK(set);
  KUIPER_CUDA_CHECK(synced);
  KUIPER_CUDA_CHECK(destroyed);
  return w;
}

}  // namespace

Result<SplitK> split_k_workspace(int splits, int64_t K) {
  static PerDevice<Workspace> workspace;
  KUIPER_ASSIGN_OR_RETURN(const Workspace w, workspace.get(make_workspace));
  SplitK s;
  s.splits = splits;
  s.pieces = static_cast<int>(K / kSplitKColumns);
  s.partials = w.partials;
  s.arrived = w.arrived;
  return s;
}

}  // namespace kuiper::cuda
