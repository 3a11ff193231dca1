// The CUDA side of the base layer (CUDA builds only): the one stream every kernel and copy runs
// on (so a decode step can be captured as a graph), and error checking that turns a failed CUDA
// call into a Status naming the call.
#pragma once

#ifdef KUIPER_WITH_CUDA

#include <cuda_runtime.h>

#include <string>

#include "kuiper/base/status.h"

namespace kuiper::cuda {

// The engine's stream, created on first use. It is a blocking stream, so the synchronous copies
// of copy_bytes (legacy default stream) stay ordered with the kernels queued on it.
cudaStream_t stream();

// Bytes of the caching allocator (kuiper/base/cuda_allocator.cu), rounded to its buckets.
struct MemoryStats {
  size_t in_use = 0;    // handed out and not yet released
  size_t peak = 0;      // the most in_use has been since the last reset_peak_memory()
  size_t reserved = 0;  // taken from CUDA: in use plus cached free blocks
};
MemoryStats memory_stats();
void reset_peak_memory();

inline Status check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Status::Error(std::string(what) + ": " + cudaGetErrorString(err));
}

}  // namespace kuiper::cuda

// Returns an error Status from the enclosing function if a CUDA call fails.
#define KUIPER_CUDA_CHECK(call) KUIPER_RETURN_IF_ERROR(::kuiper::cuda::check((call), #call))
// After a kernel launch: reports launch-configuration errors without synchronising.
#define KUIPER_CUDA_CHECK_LAUNCH(name) \
  KUIPER_RETURN_IF_ERROR(::kuiper::cuda::check(cudaGetLastError(), name))

#endif  // KUIPER_WITH_CUDA
