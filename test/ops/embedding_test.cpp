// op::embedding: the CPU reference reads rows of any table dtype; every backend matches it.
#include <gtest/gtest.h>

#include "kuiper/op/ops.h"
#include "ops/harness.h"
#include "support/tensors.h"

namespace kuiper::test {
namespace {

TEST(Embedding, CpuGathersRowsOfABf16Table) {
  Tensor table = *Tensor::empty({10, 4}, DataType::kBf16);
  for (int i = 0; i < 40; ++i) table.data<uint16_t>()[i] = float_to_bf16(static_cast<float>(i));
  Tensor emb = poisoned({2, 4}, DataType::kFp32);
  ASSERT_OK(op::embedding(table, int_tensor({7, 2}, {2}), emb));
  EXPECT_EQ(emb.data<float>()[0], 28.0f);
  EXPECT_EQ(emb.data<float>()[5], 9.0f);
}

std::vector<OpCase> embedding_cases() {
  const int64_t V = 37, H = 67, T = 5;
  std::vector<OpCase> cases;
  for (DataType table : kFloatTypes) {
    for (DataType act : kActivations) {
      cases.push_back(
          {std::string("embedding table=") + dtype_name(table) + " out=" + dtype_name(act),
           {in({V, H}, table), ints({0, 36, 5, 5, 17}, {T}), out({T, H}, act)},
           [](std::vector<Tensor>& a) { return op::embedding(a[0], a[1], a[2]); }});
    }
  }
  // A bf16 table holds values past fp16's range; gathered into the fp32 residual stream they
  // stay exact.
  OpArg table = in({V, H}, DataType::kBf16);
  table.plant = plant_at(5 * H + 3, kBeyondFp16);
  OpArg rows = out({T, H}, DataType::kFp32);
  rows.tolerance = 0.0;
  cases.push_back({"embedding table=bf16 (8e4 planted) out=fp32",
                   {table, ints({0, 36, 5, 5, 17}, {T}), rows},
                   [](std::vector<Tensor>& a) { return op::embedding(a[0], a[1], a[2]); }});
  return cases;
}

KUIPER_OP_BACKEND_TEST(Embedding, embedding_cases)

}  // namespace
}  // namespace kuiper::test
