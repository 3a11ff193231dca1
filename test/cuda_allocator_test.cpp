// The CUDA caching allocator: a freed block comes back for a request of its size bucket, and the
// memory statistics follow.
#include <gtest/gtest.h>

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
#endif

}  // namespace
}  // namespace kuiper
