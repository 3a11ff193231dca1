// HostUpload: copies to the device that return at once land in queue order, each with the bytes
// its call was given, even where the host reuses its memory at once and the stream is busy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kuiper/base/host_upload.h"
#ifdef KUIPER_WITH_CUDA
#include "kuiper/base/cuda_runtime.h"
#endif

#include "support/assertions.h"

namespace kuiper {
namespace {

TEST(HostUpload, CpuCopiesAtOnce) {
  HostUpload upload;
  std::vector<int32_t> src = {3, 1, 4, 1, 5}, dst(5, 0);
  ASSERT_OK(upload.copy(dst.data(), DeviceType::kCpu, src.data(), src.size() * sizeof(int32_t)));
  std::fill(src.begin(), src.end(), -1);
  EXPECT_EQ(dst, (std::vector<int32_t>{3, 1, 4, 1, 5}));
}

#ifdef KUIPER_WITH_CUDA
TEST(HostUpload, CudaCopiesLandInOrderWithTheirCallsBytes) {
  SKIP_WITHOUT_CUDA();
  const cudaStream_t stream = cuda::stream();
  // Sizes that grow the pinned buffers (past 4 KB, then past twice the last) and shrink again.
  const std::vector<size_t> counts = {1, 7, 1000, 5000, 3, 40000, 12, 100000, 2, 64};
  size_t total = 0;
  for (size_t n : counts) total += n;
  int32_t* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, (total + 1) * sizeof(int32_t)), cudaSuccess);
  // Work ahead of the copies (a 1 GiB fill), so that they are still queued when the host moves
  // on: the third call must wait for the first buffer's copy before it refills it.
  void* busy = nullptr;
  ASSERT_EQ(cudaMalloc(&busy, size_t{1} << 30), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(busy, 1, size_t{1} << 30, stream), cudaSuccess);
  HostUpload upload;
  std::vector<int32_t> src;
  size_t at = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    src.assign(counts[i], 0);
    for (size_t k = 0; k < counts[i]; ++k) src[k] = static_cast<int32_t>(1000003 * i + k);
    ASSERT_OK(upload.copy(device + at, DeviceType::kCuda, src.data(), counts[i] * sizeof(int32_t)));
    std::fill(src.begin(), src.end(), -1);  // the caller's memory is its own again
    at += counts[i];
  }
  // Two copies to one place: the later one's bytes are what the work after them sees.
  const int32_t first = 11, second = 22;
  ASSERT_OK(upload.copy(device + total, DeviceType::kCuda, &first, sizeof(first)));
  ASSERT_OK(upload.copy(device + total, DeviceType::kCuda, &second, sizeof(second)));
  std::vector<int32_t> got(total + 1, 0);
  ASSERT_EQ(cudaMemcpyAsync(got.data(), device, got.size() * sizeof(int32_t),
                            cudaMemcpyDeviceToHost, stream),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  at = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    for (size_t k = 0; k < counts[i]; ++k) {
      ASSERT_EQ(got[at + k], static_cast<int32_t>(1000003 * i + k)) << "copy " << i << " at " << k;
    }
    at += counts[i];
  }
  EXPECT_EQ(got[total], second);
  EXPECT_OK(upload.copy(device, DeviceType::kCuda, src.data(), 0));  // nothing to copy: nothing queued
  EXPECT_EQ(cudaFree(busy), cudaSuccess);
  EXPECT_EQ(cudaFree(device), cudaSuccess);
}
#else
TEST(HostUpload, CudaIsAnErrorWithoutCuda) {
  HostUpload upload;
  int32_t v = 1, w = 0;
  EXPECT_FALSE(upload.copy(&w, DeviceType::kCuda, &v, sizeof(v)).ok());
}
#endif

}  // namespace
}  // namespace kuiper
