#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

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

TEST(Tensor, CudaIsAClearErrorWithoutAGpu) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present; this checks the GPU-less build";
  Result<Tensor> t = Tensor::empty({4}, DataType::kFp32, DeviceType::kCuda);
  ASSERT_FALSE(t.ok());
  EXPECT_FALSE(t.status().message().empty());
}

}  // namespace
}  // namespace kuiper
