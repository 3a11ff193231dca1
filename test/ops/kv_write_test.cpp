// op::kv_write: the CPU reference copies each row to its cache row and leaves the others alone;
// host positions outside the cache are refused; every backend matches the CPU exactly.
#include <gtest/gtest.h>

#include <cstring>

#include "kuiper/op/ops.h"
#include "ops/harness.h"
#include "support/tensors.h"

namespace kuiper::test {
namespace {

TEST(KvWrite, CpuWritesEachRowAtItsPositionOnly) {
  const int64_t rows = 7, D = 5;
  Tensor cache = random_tensor({rows, D}, 30), k = random_tensor({3, D}, 31);
  const Tensor before = *cache.to(DeviceType::kCpu);
  const std::vector<int32_t> pos = {4, 0, 6};
  ASSERT_OK(op::kv_write(k, cache, int_tensor(pos, {3})));
  for (int64_t r = 0; r < rows; ++r) {
    const float* want = before.data<float>() + r * D;
    for (size_t t = 0; t < pos.size(); ++t) {
      if (pos[t] == r) want = k.data<float>() + static_cast<int64_t>(t) * D;
    }
    EXPECT_EQ(std::memcmp(cache.data<float>() + r * D, want, D * sizeof(float)), 0) << "row " << r;
  }
}

TEST(KvWrite, RefusesHostPositionsOutsideTheCache) {
  Tensor cache = random_tensor({4, 2}, 32), k = random_tensor({1, 2}, 33);
  for (int32_t bad : {4, -1}) {
    const Status s = op::kv_write(k, cache, int_tensor({bad}, {1}));
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("outside"), std::string::npos) << s.message();
  }
}

std::vector<OpCase> kv_write_cases() {
  std::vector<OpCase> cases;
  for (DataType act : kActivations) {
    OpCase c{std::string("kv_write ") + dtype_name(act),
             {in({3, 24}, act), in_out({11, 24}, act), ints({4, 0, 10}, {3})},
             [](std::vector<Tensor>& a) { return op::kv_write(a[0], a[1], a[2]); }};
    c.args[1].tolerance = 0.0;  // a copy
    cases.push_back(c);
  }
  return cases;
}

KUIPER_OP_BACKEND_TEST(KvWrite, kv_write_cases)

}  // namespace
}  // namespace kuiper::test
