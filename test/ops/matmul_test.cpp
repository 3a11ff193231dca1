// op::matmul and op::linear: the CPU reference against the double-precision product, every
// backend against the CPU (all weight dtypes, GEMV and GEMM shapes, fp32 logits from 16-bit), and
// linear's fused forms against the CPU composition (rmsnorm, matmul, swiglu, add).
#include <gtest/gtest.h>

#include <cmath>

#include "kuiper/op/ops.h"
#include "ops/harness.h"
#include "support/tensors.h"

namespace kuiper::test {
namespace {

TEST(Matmul, CpuReadsEveryWeightDtypeAndAddsBias) {
  const int64_t T = 5, K = 37, N = 70;  // sizes that are not multiples of the blocking
  Tensor x = random_tensor({T, K}, 1), w = random_tensor({N, K}, 2);
  Tensor bias = random_tensor({N}, 3);
  for (DataType wt : kFloatTypes) {
    Tensor wc = upload(w, wt, DeviceType::kCpu);
    const Tensor widened = to_host_fp32(wc);
    Tensor out = poisoned({T, N}, DataType::kFp32);
    ASSERT_OK(op::matmul(x, wc, &bias, out));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t n = 0; n < N; ++n) {
        double ref = bias.data<float>()[n];
        for (int64_t k = 0; k < K; ++k) {
          ref += double(x.data<float>()[t * K + k]) * widened.data<float>()[n * K + k];
        }
        EXPECT_NEAR(out.data<float>()[t * N + n], ref, 1e-5) << dtype_name(wt);
      }
    }
  }
}

TEST(Matmul, RejectsMismatchedShapes) {
  Tensor x = random_tensor({2, 8}, 4), w = random_tensor({4, 9}, 5);
  Tensor out = poisoned({2, 4}, DataType::kFp32);
  Status s = op::matmul(x, w, nullptr, out);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("matmul"), std::string::npos);
}

struct Shape {
  int64_t T, K, N;
  std::string name() const {
    return "T" + std::to_string(T) + " K" + std::to_string(K) + " N" + std::to_string(N);
  }
};

std::vector<OpCase> matmul_cases() {
  // T == 1 takes the GEMV (vectorised when K fits 16-byte loads, scalar for odd K); T > 1 takes
  // cuBLAS for like types and the tiled kernel for mixed ones.
  const Shape shapes[] = {{1, 1024, 300}, {1, 67, 45},  {1, 4096, 129},
                          {2, 256, 128},  {17, 67, 45}, {33, 512, 257}};
  std::vector<OpCase> cases;
  for (const Shape& s : shapes) {
    for (DataType act : kActivations) {
      for (DataType w : kFloatTypes) {
        std::vector<DataType> outs = {act};
        if (act != DataType::kFp32) outs.push_back(DataType::kFp32);  // fp32 logits from 16-bit
        for (DataType o : outs) {
          const std::string name = "matmul " + s.name() + " x=" + dtype_name(act) +
                                   " w=" + dtype_name(w) + " out=" + dtype_name(o);
          const float w_scale = 1.0f / std::sqrt(static_cast<float>(s.K));
          cases.push_back(
              {name,
               {in({s.T, s.K}, act), in({s.N, s.K}, w, w_scale), out({s.T, s.N}, o)},
               [](std::vector<Tensor>& a) { return op::matmul(a[0], a[1], nullptr, a[2]); }});
          cases.push_back(
              {name + " +bias",
               {in({s.T, s.K}, act), in({s.N, s.K}, w, w_scale), out({s.T, s.N}, o),
                in({s.N}, w, 0.5f)},
               [](std::vector<Tensor>& a) { return op::matmul(a[0], a[1], &a[3], a[2]); }});
        }
      }
    }
  }
  return cases;
}

KUIPER_OP_BACKEND_TEST(Matmul, matmul_cases)

// One row (the fused GEMV) and several (the GPU composition), vectorised and scalar K, an odd
// N, every weight type, with and without bias. Arguments: x, w, bias, norm weight, out.
std::vector<OpCase> linear_cases() {
  // 6144 rows make between one and two SM-fuls of GEMV blocks on an H100 (the 4-load form).
  const Shape shapes[] = {{1, 1024, 300}, {1, 67, 45},    {1, 4096, 129},
                          {1, 12288, 64}, {1, 512, 6144}, {5, 256, 96}};
  std::vector<OpCase> cases;
  for (const Shape& s : shapes) {
    for (DataType act : kActivations) {
      for (DataType w : kFloatTypes) {
        for (int form = 0; form < 3; ++form) {  // norm, norm + swiglu, residual
          const bool swiglu = form == 1, residual = form == 2;
          for (bool with_bias : {false, true}) {
            const int64_t rows = swiglu ? 2 * s.N : s.N;
            // 16-bit: the GPU rounds the products (and the gate/up pair, the residual sum) to the
            // activation type where the unfused ops store them; the CPU reference computes in fp32.
            cases.push_back({"linear " + s.name() + " x=" + dtype_name(act) +
                                 " w=" + dtype_name(w) + (residual ? " residual" : " norm") +
                                 (swiglu ? " swiglu" : "") + (with_bias ? " +bias" : ""),
                             {in({s.T, s.K}, act, 2.0f),
                              in({rows, s.K}, w, 1.0f / std::sqrt(static_cast<float>(s.K))),
                              in({rows}, w, 0.5f), in({s.K}, w, 0.5f, 1.0f),
                              residual ? in_out({s.T, s.N}, act) : out({s.T, s.N}, act)},
                             [=](std::vector<Tensor>& a) {
                               op::LinearOptions o;
                               o.norm = residual ? nullptr : &a[3];
                               o.eps = 1e-6;
                               o.bias = with_bias ? &a[2] : nullptr;
                               o.swiglu = swiglu;
                               o.residual = residual;
                               return op::linear(a[0], a[1], o, a[4]);
                             },
                             {1e-4, 4e-3, 3.2e-2}});
          }
        }
      }
    }
  }
  return cases;
}

KUIPER_OP_BACKEND_TEST(Linear, linear_cases)

}  // namespace
}  // namespace kuiper::test
