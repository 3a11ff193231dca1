// The CUDA caching allocator: a freed block comes back for a request of its size bucket, and the
// memory statistics follow; copy_rows moves a table's rows between pitches.
#include <gtest/gtest.h>

#include <vector>

#include "kuiper/base/allocator.h"
#ifdef KUIPER_WITH_CUDA
#include "kuiper/base/cuda_runtime.h"
#endif

#include "support/assertions.h"

namespace kuiper {
namespace {

#ifdef KUIPER_WITH_CUDA
TEST(CudaAllocator, CachingAllocatorReusesBlocks) {
  SKIP_WITHOUT_CUDA();
  Allocator* a = *allocator_for(DeviceType::kCuda);
  void* p = *a->allocate(3 << 20);
  a->release(p, 3 << 20);
  // Same bucket: the cached block comes back, no cudaMalloc.
  void* q = *a->allocate((3 << 20) - 100);
  EXPECT_EQ(p, q);
  const cuda::MemoryStats before = cuda::memory_stats();
  EXPECT_GE(before.in_use, size_t{3} << 20);
  EXPECT_GE(before.peak, before.in_use);
  a->release(q, (3 << 20) - 100);
  EXPECT_EQ(cuda::memory_stats().in_use + (size_t{3} << 20), before.in_use);
}

// A host table's rows go into the first entries of wider device rows, the rest of each device
// row keeps its poison, and the rows come back through a copy the other way.
TEST(CudaCopyRows, HostRowsIntoWiderDeviceRowsAndBack) {
  SKIP_WITHOUT_CUDA();
  constexpr size_t kRows = 37, kUsed = 5, kWidth = 256, kInt = sizeof(int32_t);
  std::vector<int32_t> src(kRows * kUsed);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<int32_t>(i * 7 + 1);
  Allocator* a = *allocator_for(DeviceType::kCuda);
  void* device = *a->allocate(kRows * kWidth * kInt);
  const std::vector<int32_t> poison(kRows * kWidth, -1);
  ASSERT_OK(copy_bytes(device, DeviceType::kCuda, poison.data(), DeviceType::kCpu,
                       poison.size() * kInt));
  ASSERT_OK(copy_rows(device, kWidth * kInt, DeviceType::kCuda, src.data(), kUsed * kInt,
                      DeviceType::kCpu, kUsed * kInt, kRows));
  std::vector<int32_t> whole(kRows * kWidth);
  ASSERT_OK(copy_bytes(whole.data(), DeviceType::kCpu, device, DeviceType::kCuda,
                       whole.size() * kInt));
  for (size_t r = 0; r < kRows; ++r) {
    for (size_t j = 0; j < kWidth; ++j) {
      const int32_t want = j < kUsed ? src[r * kUsed + j] : -1;
      ASSERT_EQ(whole[r * kWidth + j], want) << "row " << r << " entry " << j;
    }
  }
  std::vector<int32_t> back(kRows * kUsed, 0);
  ASSERT_OK(copy_rows(back.data(), kUsed * kInt, DeviceType::kCpu, device, kWidth * kInt,
                      DeviceType::kCuda, kUsed * kInt, kRows));
  EXPECT_EQ(back, src);
  a->release(device, kRows * kWidth * kInt);
}
#endif

}  // namespace
}  // namespace kuiper
