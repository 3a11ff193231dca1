// The CUDA side of the base layer (CUDA builds only): the one stream every kernel and copy runs
// on (so a decode step can be captured as a graph), and error checking that turns a failed CUDA
// call into a Status naming the call.
#pragma once

#ifdef KUIPER_WITH_CUDA

#include <cuda_runtime.h>

#include <string>

#include "kuiper/base/status.h"

namespace kuiper::cuda {

// The engine's stream, created on first use.
cudaStream_t stream();

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
