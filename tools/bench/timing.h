// Timing helpers: the median of repeated runs, and calls timed with events on the engine stream.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "kuiper/base/cuda_runtime.h"
#include "kuiper/base/device_graph.h"
#include "kuiper/base/status.h"
#include "tools/bench/flags.h"

namespace kuiper::bench {


inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs `once` (which returns its own duration) up to --repeat times, stopping early once the
// runs add up to --max-repeat-s; the median.
template <typename Once>
Result<double> repeated(Once&& once) {
  std::vector<double> runs;
  double total = 0;
  for (int r = 0; r < FLAGS_repeat; ++r) {
    KUIPER_ASSIGN_OR_RETURN(double s, once());
    runs.push_back(s);
    total += s;
    if (total > FLAGS_max_repeat_s) break;
  }
  return median(runs);
}

// Times call(i) with events on the engine stream: calls are issued back to back in batches
// (launch latency hidden as in a real step), the batch size chosen so a batch takes about 2 ms;
// the median of the batches, per call. With `graph`, one batch is captured into a CUDA graph
// after the eager warm-up and the graph is replayed, as the decode step runs in a model (no
// host launch cost between calls; PDL launches become programmatic graph edges).
template <typename Call>
Result<double> time_on_stream(Call&& call, bool graph = false) {
  cudaStream_t stream = kuiper::cuda::stream();
  cudaEvent_t start, stop;
  KUIPER_CUDA_CHECK(cudaEventCreate(&start));
  KUIPER_CUDA_CHECK(cudaEventCreate(&stop));
  DeviceGraph recorded;  // empty until `graph` captures a batch
  int index = 0;
  auto issue = [&](int n) -> Status {
    if (!recorded.empty()) return recorded.replay();
    for (int i = 0; i < n; ++i) KUIPER_RETURN_IF_ERROR(call(index++));
    return Status::Ok();
  };
  auto batch = [&](int n) -> Result<double> {
    KUIPER_CUDA_CHECK(cudaEventRecord(start, stream));
    KUIPER_RETURN_IF_ERROR(issue(n));
    KUIPER_CUDA_CHECK(cudaEventRecord(stop, stream));
    KUIPER_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    KUIPER_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ms / 1e3 / n;
  };
  // One batch captured (not run), replayed by issue() from then on.
  auto capture = [&](int n) -> Status {
    KUIPER_ASSIGN_OR_RETURN(recorded, DeviceGraph::capture([&] { return issue(n); }));
    return Status::Ok();
  };
  // A first call alone does the op's one-time setup (scratch allocation, kernel attributes),
  // which must not count in the batch that sizes the rest; then the size of one call.
  Result<double> first = batch(1);
  if (first.ok()) first = batch(3);
  double per_call = first.ok() ? *first : 0.0;
  const int inner = static_cast<int>(std::clamp(std::ceil(2e-3 / std::max(per_call, 1e-7)), 1.0, 200.0));
  const int batches = static_cast<int>(
      std::clamp(std::ceil(0.5 / std::max(per_call * inner, 1e-7)), 3.0, 25.0));
  std::vector<double> seconds;
  Status status = first.status();
  if (status.ok() && graph) {
    status = capture(inner);
    if (status.ok()) status = batch(inner).status();  // the graph's first launch uploads it
  }
  for (int b = 0; b < batches && status.ok(); ++b) {
    Result<double> s = batch(inner);
    if (s.ok()) seconds.push_back(*s);
    status = s.status();
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  KUIPER_RETURN_IF_ERROR(status);
  return median(seconds);
}

}  // namespace kuiper::bench
