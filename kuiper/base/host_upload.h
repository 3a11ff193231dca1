// HostUpload: small host data (a pass's token ids, positions, block tables) written to device
// memory without waiting. copy_bytes waits for its copy, and so for every kernel queued before
// it: a decode step launched while the last one still runs could not queue its kernels until the
// last step had finished. Here the bytes go into page-locked host memory and from there by the
// engine stream, ordered before whatever is queued after them. Two page-locked buffers take
// turns; a buffer is refilled only once its last copy has run (an event), so a caller that
// queues passes faster than the device runs them waits there, and only there. The write-side
// counterpart of PendingRead.
#pragma once

#include <cstddef>

#include "kuiper/base/allocator.h"
#include "kuiper/base/status.h"

namespace kuiper {

class HostUpload {
 public:
  HostUpload() = default;
  HostUpload(const HostUpload&) = delete;
  HostUpload& operator=(const HostUpload&) = delete;
  ~HostUpload();

  // Copies `bytes` bytes from host memory `src` to `dst` on `device`: a CPU destination at once,
  // a CUDA one queued on the engine stream. `src` may be reused when this returns; `dst` holds the
  // bytes for the work queued after this call. Not while the stream is being captured.
  Status copy(void* dst, DeviceType device, const void* src, size_t bytes);

 private:
  struct Buffer {
    void* host = nullptr;  // page-locked
    size_t capacity = 0;
    void* copied = nullptr;  // cudaEvent_t recorded after the buffer's last copy
  };
  Buffer buffers_[2];
  int next_ = 0;
};

}  // namespace kuiper
