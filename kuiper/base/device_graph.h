// DeviceGraph: device work recorded once and replayed as one launch (a CUDA graph on the engine
// stream). Everything the recorded work touches keeps its address between replays; what changes
// from one replay to the next (a decode step's token and position) is read from device memory.
#pragma once

#include <functional>

#include "kuiper/base/status.h"

struct CUgraphExec_st;  // what cudaGraphExec_t points to: this header needs no CUDA

namespace kuiper {

class DeviceGraph {
 public:
  DeviceGraph() = default;  // empty: nothing recorded
  DeviceGraph(DeviceGraph&& other) noexcept;
  DeviceGraph& operator=(DeviceGraph&& other) noexcept;
  DeviceGraph(const DeviceGraph&) = delete;
  DeviceGraph& operator=(const DeviceGraph&) = delete;
  ~DeviceGraph();

  // Records the work `body` queues on the engine stream, without running it. The body must not
  // allocate device memory or synchronise; when it fails the capture still ends, so the stream
  // stays usable, and its error is returned. An error in a build without CUDA.
  static Result<DeviceGraph> capture(const std::function<Status()>& body);

  bool empty() const { return exec_ == nullptr; }
  // Queues the recorded work on the engine stream. An error for an empty graph.
  Status replay() const;

 private:
  void reset();

  CUgraphExec_st* exec_ = nullptr;
};

}  // namespace kuiper
