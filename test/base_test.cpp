#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kuiper/base/allocator.h"
#include "kuiper/base/dtype.h"
#include "kuiper/tensor/tensor.h"
#include "support/assertions.h"

namespace kuiper {
namespace {

TEST(DataType, Fp16RoundTripsEveryHalfValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = fp16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(float_to_fp16(f), h) << "half bits " << h;
  }
}

TEST(DataType, Fp16RoundsToNearestEven) {
  EXPECT_EQ(fp16_to_float(float_to_fp16(1.0f + 1.0f / 2048)), 1.0f);  // tie, even is 1.0
  EXPECT_EQ(fp16_to_float(float_to_fp16(1.0f + 3.0f / 2048)), 1.0f + 2.0f / 1024);
  EXPECT_TRUE(std::isinf(fp16_to_float(float_to_fp16(70000.0f))));
  EXPECT_EQ(fp16_to_float(float_to_fp16(65504.0f)), 65504.0f);
  EXPECT_EQ(fp16_to_float(float_to_fp16(5.9604645e-8f)), 5.9604645e-8f);  // smallest subnormal
}

TEST(DataType, ConvertingPastFp16sRangeIsAnErrorGivingTheLargestValue) {
  // 65519 rounds down to 65504; 65520 is the first value that rounds to inf.
  const float fits[] = {65504.0f, -65519.0f, 1.0f, INFINITY, NAN};
  uint16_t half[5];
  EXPECT_OK(convert_elements(fits, DataType::kFp32, half, DataType::kFp16, 5));
  EXPECT_EQ(fp16_to_float(half[1]), -65504.0f);
  EXPECT_TRUE(std::isinf(fp16_to_float(half[3])));  // inf in, inf out: nothing was lost

  const float wide[] = {1.0f, -70000.0f, 65520.0f, 2.0f};
  uint16_t out[4];
  Status s = convert_elements(wide, DataType::kFp32, out, DataType::kFp16, 4);
  EXPECT_EQ(s.message(), "values up to 70000 in magnitude do not fit fp16 (largest 65504)");
  EXPECT_EQ(fp16_to_float(out[3]), 2.0f);  // every element was still written

  // bf16 has fp32's range: the same values fit.
  EXPECT_OK(convert_elements(wide, DataType::kFp32, out, DataType::kBf16, 4));
  const uint16_t big_bf16[] = {float_to_bf16(70000.0f)};
  EXPECT_FALSE(convert_elements(big_bf16, DataType::kBf16, out, DataType::kFp16, 1).ok());
}

TEST(DataType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  float halfway;
  uint32_t u = 0x3f808000u;  // exactly between 0x3f80 and 0x3f81: even wins
  std::memcpy(&halfway, &u, 4);
  EXPECT_EQ(float_to_bf16(halfway), 0x3f80);
  u = 0x3f818000u;
  std::memcpy(&halfway, &u, 4);
  EXPECT_EQ(float_to_bf16(halfway), 0x3f82);
  EXPECT_EQ(bf16_to_float(0xc000), -2.0f);
}

TEST(DataType, ParseNamesAndRejectUnknown) {
  EXPECT_EQ(*parse_dtype("bf16"), DataType::kBf16);
  Result<DataType> bad = parse_dtype("fp8");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("fp8"), std::string::npos);
}

TEST(Result, StatusIsOkExactlyWhenThereIsAValue) {
  Result<int> value = 3;
  EXPECT_TRUE(value.ok());
  EXPECT_TRUE(value.status().ok());  // `return r.status();` forwards success
  Result<int> error = Status::Error("broken");
  EXPECT_FALSE(error.ok());
  EXPECT_EQ(error.status().message(), "broken");
  Result<int> from_ok = Status::Ok();  // no value: an error, not a silent success
  EXPECT_FALSE(from_ok.ok());
  EXPECT_FALSE(from_ok.status().ok());
}

TEST(Tensor, RowsShareMemoryAndReshapeChecksCount) {
  Result<Tensor> t = Tensor::empty({4, 3}, DataType::kFp32);
  ASSERT_OK(t);
  for (int i = 0; i < 12; ++i) t->data<float>()[i] = static_cast<float>(i);
  Tensor r = t->rows(2, 2);
  EXPECT_EQ(r.shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(r.data<float>()[0], 6.0f);
  EXPECT_OK(t->reshape({3, 4}));
  EXPECT_FALSE(t->reshape({5, 2}).ok());
}

TEST(Tensor, QueuedCopyIsWithinOneDeviceAndLandsBeforeLaterWork) {
  std::vector<DeviceType> devices = {DeviceType::kCpu};
  if (cuda_available()) devices.push_back(DeviceType::kCuda);
  for (const DeviceType device : devices) {
    Result<Tensor> host = Tensor::empty({1000}, DataType::kInt32);
    ASSERT_OK(host);
    for (int i = 0; i < 1000; ++i) host->data<int32_t>()[i] = 7 * i + 1;
    Result<Tensor> src = host->to(device);
    ASSERT_OK(src);
    Result<Tensor> dst = Tensor::empty({1000}, DataType::kInt32, device);
    ASSERT_OK(dst);
    // Two queued copies into one place: the later one's bytes are what a later read sees.
    Tensor first = src->rows(0, 500), second = src->rows(500, 500);
    Tensor into = dst->rows(0, 500);
    ASSERT_OK(into.queue_copy_from(first));
    ASSERT_OK(into.queue_copy_from(second));
    ASSERT_OK(dst->rows(500, 500).queue_copy_from(first));
    Result<Tensor> back = dst->to(DeviceType::kCpu);  // a waited copy, queued after them
    ASSERT_OK(back);
    for (int i = 0; i < 500; ++i) {
      ASSERT_EQ(back->data<int32_t>()[i], 7 * (i + 500) + 1) << device_name(device) << " " << i;
      ASSERT_EQ(back->data<int32_t>()[500 + i], 7 * i + 1) << device_name(device) << " " << i;
    }
    EXPECT_FALSE(into.queue_copy_from(src->rows(0, 400)).ok());  // another shape
    if (device == DeviceType::kCuda) {
      EXPECT_FALSE(into.queue_copy_from(host->rows(0, 500)).ok());  // another device
    }
  }
}

TEST(Tensor, CudaIsAClearErrorWithoutAGpu) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present; this checks the GPU-less build";
  Result<Tensor> t = Tensor::empty({4}, DataType::kFp32, DeviceType::kCuda);
  ASSERT_FALSE(t.ok());
  EXPECT_FALSE(t.status().message().empty());
}

}  // namespace
}  // namespace kuiper
