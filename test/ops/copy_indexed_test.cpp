// op::copy_indexed: out[to[j]] = src[from[j]], the rest of out kept, on the CPU reference and
// every backend; indices out of range are an error on the CPU.
#include <gtest/gtest.h>

#include <vector>

#include "kuiper/op/ops.h"
#include "ops/harness.h"
#include "support/tensors.h"

namespace kuiper::test {
namespace {

std::vector<int32_t> counting(int64_t n, int32_t first, int32_t step) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = first + step * static_cast<int32_t>(i);
  return v;
}

std::vector<OpCase> copy_indexed_cases() {
  std::vector<OpCase> cases;
  // More entries than a block of threads; `to` a scattered subset of out, `from` in another
  // order and with repeats (one source row feeding two places).
  for (const int64_t n : {0, 1, 5, 300}) {
    const int64_t S = 320, O = 700;
    std::vector<int32_t> from, to;
    for (int64_t j = 0; j < n; ++j) {
      from.push_back(static_cast<int32_t>((j * 37 + 11) % S));
      to.push_back(static_cast<int32_t>((j * 3 + 5) % O));  // distinct: 3 and 700 are coprime
    }
    OpArg dst = ints(counting(O, -5, -3), {O});
    dst.role = Role::kInOut;
    cases.push_back({"copy_indexed " + std::to_string(n) + " entries",
                     {ints(counting(S, 1000, 17), {S}), ints(from, {n}), ints(to, {n}), dst},
                     [](std::vector<Tensor>& a) { return op::copy_indexed(a[0], a[1], a[2], a[3]); }});
  }
  return cases;
}

KUIPER_OP_BACKEND_TEST(CopyIndexed, copy_indexed_cases)

TEST(CopyIndexed, CpuRefusesIndicesOutOfRangeAndOtherTypes) {
  std::vector<int32_t> src = {1, 2, 3}, out = {0, 0}, at = {0}, past = {3}, below = {-1};
  auto view = [](std::vector<int32_t>& v) {
    return Tensor::view(v.data(), {static_cast<int64_t>(v.size())}, DataType::kInt32,
                        DeviceType::kCpu);
  };
  Tensor s = view(src), o = view(out), zero = view(at), three = view(past), minus = view(below);
  EXPECT_OK(op::copy_indexed(s, three.rows(0, 0), zero.rows(0, 0), o));
  EXPECT_FALSE(op::copy_indexed(s, three, zero, o).ok());  // from past src
  EXPECT_FALSE(op::copy_indexed(s, minus, zero, o).ok());
  std::vector<int32_t> two = {2};
  EXPECT_FALSE(op::copy_indexed(s, zero, view(two), o).ok());  // to past out
  EXPECT_EQ(out, (std::vector<int32_t>{0, 0}));                // nothing written
  EXPECT_FALSE(op::copy_indexed(s, view(src), zero, o).ok());  // lengths differ
  Tensor floats = random_tensor({3}, 1);
  EXPECT_FALSE(op::copy_indexed(floats, zero, zero, o).ok());
  ASSERT_OK(op::copy_indexed(s, view(two), zero, o));
  EXPECT_EQ(out, (std::vector<int32_t>{3, 0}));
}

}  // namespace
}  // namespace kuiper::test
