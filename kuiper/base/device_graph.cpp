#include "kuiper/base/device_graph.h"

#include <utility>

#ifdef KUIPER_WITH_CUDA
#include "kuiper/base/cuda_runtime.h"
#endif

namespace kuiper {

DeviceGraph::DeviceGraph(DeviceGraph&& other) noexcept
    : exec_(std::exchange(other.exec_, nullptr)) {}

DeviceGraph& DeviceGraph::operator=(DeviceGraph&& other) noexcept {
  if (this != &other) {
    reset();
    exec_ = std::exchange(other.exec_, nullptr);
  }
  return *this;
}

DeviceGraph::~DeviceGraph() { reset(); }

#ifdef KUIPER_WITH_CUDA

void DeviceGraph::reset() {
  if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
  exec_ = nullptr;
}

Result<DeviceGraph> DeviceGraph::capture(const std::function<Status()>& body) {
  const cudaStream_t stream = cuda::stream();
  KUIPER_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status recorded = body();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (!recorded.ok() || ended != cudaSuccess) {
    (void)cudaGetLastError();  // the invalidated capture's error must not taint later launches
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    if (!recorded.ok()) return recorded.With("capturing a device graph");
    return cuda::check(ended, "cudaStreamEndCapture");
  }
  DeviceGraph out;
  const cudaError_t made = cudaGraphInstantiate(&out.exec_, graph, 0);
  (void)cudaGraphDestroy(graph);
  if (made != cudaSuccess) {
    out.exec_ = nullptr;
    return cuda::check(made, "cudaGraphInstantiate");
  }
  return out;
}

Status DeviceGraph::replay() const {
  if (empty()) return Status::Error("replaying an empty device graph");
  return cuda::check(cudaGraphLaunch(exec_, cuda::stream()), "cudaGraphLaunch");
}

#else

void DeviceGraph::reset() { exec_ = nullptr; }

Result<DeviceGraph> DeviceGraph::capture(const std::function<Status()>&) {
  return Status::Error("this build of Kuiper has no CUDA support: device graphs need it");
}

Status DeviceGraph::replay() const {
  return Status::Error("this build of Kuiper has no CUDA support: device graphs need it");
}

#endif  // KUIPER_WITH_CUDA

}  // namespace kuiper
