// Bytes read from a device buffer without waiting for them: start() queues the copy on the
// engine stream into page-locked host memory (so the host goes on at once), wait() blocks until
// that copy has landed and gives the bytes. A CPU source is copied at once. The engine reads a
// step's sampled tokens this way while it launches the next step.
#pragma once

#include <cstddef>
#include <vector>

#include "kuiper/base/allocator.h"
#include "kuiper/base/status.h"

namespace kuiper {

class PendingRead {
 public:
  PendingRead() = default;
  ~PendingRead();
  PendingRead(const PendingRead&) = delete;
  PendingRead& operator=(const PendingRead&) = delete;

  // Queues a copy of `bytes` from `src` on `device`, after everything already queued there. The
  // source must stay as it is until the copy has run. A read still pending is waited for first.
  Status start(const void* src, DeviceType device, size_t bytes);
  // The bytes of the last start(), once they have landed (valid until the next start()).
  Result<const void*> wait();

 private:
  void release();

  void* host_ = nullptr;    // page-locked (CUDA)
  size_t capacity_ = 0;
  void* event_ = nullptr;   // cudaEvent_t recorded after the copy
  bool pending_ = false;    // a CUDA copy queued and not yet waited for
  std::vector<unsigned char> cpu_;  // a CPU source's bytes
  bool from_cpu_ = false;
};

}  // namespace kuiper
