// op::fill_random: values in [offset - scale, offset + scale), and the same bits on every device
// (a random-weight model is the same model on the GPU as on the CPU).
#include <gtest/gtest.h>

#include <cstring>

#include "kuiper/op/ops.h"
#include "ops/harness.h"
#include "support/tensors.h"

namespace kuiper::test {
namespace {

TEST(FillRandom, CpuValuesLieInTheRangeAndDependOnTheSeed) {
  Tensor a = *Tensor::empty({1001}, DataType::kFp32), b = *Tensor::empty({1001}, DataType::kFp32);
  ASSERT_OK(op::fill_random(a, 77, 0.3f, 1.0f));
  ASSERT_OK(op::fill_random(b, 78, 0.3f, 1.0f));
  for (int64_t i = 0; i < a.numel(); ++i) {
    EXPECT_GE(a.data<float>()[i], 0.7f);
    EXPECT_LT(a.data<float>()[i], 1.3f);
  }
  EXPECT_NE(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
}

TEST(FillRandom, CudaSameBitsAsCpu) {
  SKIP_WITHOUT_CUDA();
  for (DataType t : kFloatTypes) {
    SCOPED_TRACE(dtype_name(t));
    Tensor host = *Tensor::empty({1001}, t);
    ASSERT_OK(op::fill_random(host, 77, 0.3f, 1.0f));
    Tensor dev = poisoned({1001}, t, DeviceType::kCuda);
    ASSERT_OK(op::fill_random(dev, 77, 0.3f, 1.0f));
    Tensor back = *dev.to(DeviceType::kCpu);
    EXPECT_EQ(std::memcmp(back.raw(), host.raw(), host.nbytes()), 0);
  }
}

}  // namespace
}  // namespace kuiper::test
