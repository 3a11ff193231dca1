#include "kuiper/base/cuda_runtime.h"

namespace kuiper::cuda {

cudaStream_t stream() {
  // Created once and never destroyed: kernels may still be queued on it while static objects
  // are torn down at exit. If creation fails the legacy default stream (null) is used; every
  // kernel still runs, only graph capture (which the legacy stream refuses) reports an error.
  static const cudaStream_t engine_stream = [] {
    cudaStream_t s = nullptr;
    if (cudaStreamCreate(&s) != cudaSuccess) {
      (void)cudaGetLastError();
      return static_cast<cudaStream_t>(nullptr);
    }
    return s;
  }();
  return engine_stream;
}

}  // namespace kuiper::cuda
