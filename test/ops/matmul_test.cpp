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

// Planted in x[0, 0] and w[0, 0] so that out[0, 0] holds a product of 1.2e5, past fp16's range.
constexpr float kPlantedX = 6e4f, kPlantedW = 2.0f;

struct Shape {
  int64_t T, K, N;
  std::string name() const {
    return "T" + std::to_string(T) + " K" + std::to_string(K) + " N" + std::to_string(N);
  }
};

// `brief`: the CPU-only run (CI, no GPU) leaves out the long shapes, there for the GPU's grid.
std::vector<OpCase> matmul_cases(bool brief) {
  // T == 1 takes the GEMV (vectorised when K fits 16-byte loads, scalar for odd K); T == 2 of
  // 16-bit weights the two-row GEMV (2 x 4096 x 203: a last warp with one row; 2 x 512 x 20001:
  // several tiles a block on its persistent grid); 3 to 8 rows the multi-row tensor-core GEMV
  // (8 x 1024 x 203: a stage for each warp, a partial last tile; 3 x 384 x 40: fewer stages than
  // warps; 6 x 256 x 9000: several tiles a block; 5 x 1280 x 12000: more tiles a block than
  // kMmaGemvSlots on up to about 150 SMs, their 10 stages each dealt across tiles' ends: 16-bit x
  // and weights of one type only, on the GPU only); otherwise cuBLAS for like types and the
  // tiled kernel for mixed ones.
  const Shape shapes[] = {{1, 1024, 300}, {1, 67, 45},    {1, 4096, 129},   {2, 256, 128},
                          {17, 67, 45},   {33, 512, 257}, {2, 4096, 203},   {2, 512, 20001},
                          {8, 1024, 203}, {3, 384, 40},   {6, 256, 9000},   {5, 1280, 12000}};
  std::vector<OpCase> cases;
  for (const Shape& s : shapes) {
    const bool long_shape = s.N == 12000;
    if (brief && s.N >= 9000) continue;
    for (DataType act : kActivations) {
      for (DataType w : kFloatTypes) {
        if (long_shape && (act != w || act == DataType::kFp32)) continue;
        std::vector<DataType> outs = {act};
        if (act != DataType::kFp32 && !long_shape) outs.push_back(DataType::kFp32);  // fp32 logits
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
    if (long_shape) continue;
    // fp32 logits whose product exceeds fp16's range: x[0, 0] * w[0, 0] = 6e4 * 2, summed in
    // fp32 and never rounded to 16 bits, on every path (GEMV, cuBLAS, tiled).
    for (DataType act : {DataType::kFp16, DataType::kBf16}) {
      for (DataType w : kFloatTypes) {
        OpArg x = in({s.T, s.K}, act);
        x.plant = plant_at(0, kPlantedX);
        OpArg weight = in({s.N, s.K}, w, 1.0f / std::sqrt(static_cast<float>(s.K)));
        weight.plant = plant_at(0, kPlantedW);
        cases.push_back(
            {"matmul " + s.name() + " x=" + dtype_name(act) + " w=" + dtype_name(w) +
                 " out=fp32, a product of 1.2e5",
             {x, weight, out({s.T, s.N}, DataType::kFp32)},
             [](std::vector<Tensor>& a) { return op::matmul(a[0], a[1], nullptr, a[2]); }});
      }
    }
  }
  return cases;
}

TEST(Matmul, CudaMatchesCpu) {
  SKIP_WITHOUT_CUDA();
  expect_backend_matches_cpu(matmul_cases(/*brief=*/false), DeviceType::kCuda);
}
TEST(Matmul, CasesRunOnCpu) {
  expect_backend_matches_cpu(matmul_cases(/*brief=*/true), DeviceType::kCpu);
}

// op::linear over a linear case's arguments {x, w, bias, norm weight, out}: x's RMSNorm (the
// norm weight) first unless `residual` (out += the product), SwiGLU over the gate and up rows,
// the bias where asked.
std::function<Status(std::vector<Tensor>&)> run_linear(bool residual, bool swiglu,
                                                       bool with_bias) {
  return [=](std::vector<Tensor>& a) {
    op::LinearOptions o;
    o.norm = residual ? nullptr : &a[3];
    o.eps = 1e-6;
    o.bias = with_bias ? &a[2] : nullptr;
    o.swiglu = swiglu;
    o.residual = residual;
    return op::linear(a[0], a[1], o, a[4]);
  };
}

// One row (the fused GEMV), two (the two-row GEMV), 3 to 8 (the multi-row tensor-core GEMV) and
// more (the GPU composition), vectorised and scalar K, an odd N, every weight type, with and
// without bias. Arguments: x, w, bias, norm weight, out. `brief`: the CPU-only run (CI, no GPU)
// leaves out the long shapes, there for the GPU's grid (the CPU computes them as it computes the
// short ones; they took 4 of CI's 10 minutes a test may take under ASan, and once more).
std::vector<OpCase> linear_cases(bool brief) {
  // 6144 rows make between one and two SM-fuls of GEMV blocks on an H100 (the 4-load form), or
  // with SwiGLU and an fp32 x three tiles a block on the persistent grid; 20001 rows put five
  // tiles on each block there, the last one partial. 3 to 8 rows of a long K split each tile over
  // several blocks (split_k.cuh; on an H100 8 rows of 12288 columns in 2, 4 rows of 16384 in 2,
  // with SwiGLU two tiles a block).
  const Shape shapes[] = {{1, 1024, 300}, {1, 67, 45},    {1, 4096, 129}, {1, 12288, 64},
                          {1, 512, 6144}, {1, 256, 20001}, {5, 256, 96},  {2, 2048, 101},
                          {2, 1024, 3000}, {2, 256, 20001}, {8, 1024, 203}, {4, 384, 3000},
                          {7, 2048, 101}, {8, 12288, 200}, {4, 16384, 600}};
  const auto long_shape = [](const Shape& s) { return s.K >= 12288 || s.N >= 20001; };
  std::vector<OpCase> cases;
  for (const Shape& s : shapes) {
    if (brief && long_shape(s)) continue;
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
                             run_linear(residual, swiglu, with_bias),
                             {1e-4, 4e-3, 3.2e-2}});
          }
        }
      }
    }
  }
  // The fp32 residual stream beside 16-bit activations (weights of the activation dtype, as the
  // model stores them): the norm forms read an fp32 x holding a value past fp16's range into
  // 16-bit out; the residual form adds a product of 1.2e5 (x[0, 0] * w[0, 0]) to an fp32
  // residual holding 8e4, both past fp16's range, without rounding either to 16 bits.
  for (const Shape& s : shapes) {
    if (brief && long_shape(s)) continue;
    for (DataType act : {DataType::kFp16, DataType::kBf16}) {
      for (int form = 0; form < 4; ++form) {  // norm, norm + swiglu, residual, residual + bias
        const bool swiglu = form == 1, residual = form >= 2, with_bias = form == 3;
        const int64_t rows = swiglu ? 2 * s.N : s.N;
        OpArg x = in({s.T, s.K}, residual ? act : DataType::kFp32, 2.0f);
        x.plant = plant_at(0, residual ? kPlantedX : kBeyondFp16);
        OpArg w = in({rows, s.K}, act, 1.0f / std::sqrt(static_cast<float>(s.K)));
        if (residual) w.plant = plant_at(0, kPlantedW);
        OpArg y = residual ? in_out({s.T, s.N}, DataType::kFp32) : out({s.T, s.N}, act);
        if (residual) y.plant = plant_at(1, kBeyondFp16);
        cases.push_back({"linear " + s.name() + (residual ? " x=" : " x=fp32 (8e4 planted) w=") +
                             dtype_name(act) +
                             (residual ? " residual=fp32 (8e4 planted), a product of 1.2e5"
                                       : (swiglu ? " norm swiglu" : " norm")) +
                             (with_bias ? " +bias" : ""),
                         {x, w, in({rows}, act, 0.5f), in({s.K}, act, 0.5f, 1.0f), y},
                         run_linear(residual, swiglu, with_bias),
                         {1e-4, 4e-3, 3.2e-2}});
      }
    }
  }
  return cases;
}

TEST(Linear, CudaMatchesCpu) {
  SKIP_WITHOUT_CUDA();
  expect_backend_matches_cpu(linear_cases(/*brief=*/false), DeviceType::kCuda);
}
TEST(Linear, CasesRunOnCpu) {
  expect_backend_matches_cpu(linear_cases(/*brief=*/true), DeviceType::kCpu);
}

TEST(Linear, CudaMixesDtypesOnlyWhereTheContractSays) {
  SKIP_WITHOUT_CUDA();
  const auto on_gpu = [](const Tensor& t, DataType dtype) {
    return upload(t, dtype, DeviceType::kCuda);
  };
  const Tensor x32 = on_gpu(random_tensor({1, 64}, 1), DataType::kFp32);
  const Tensor x16 = on_gpu(random_tensor({1, 64}, 1), DataType::kFp16);
  const Tensor w = on_gpu(random_tensor({64, 64}, 2), DataType::kFp16);
  const Tensor norm = on_gpu(random_tensor({64}, 3), DataType::kFp16);
  Tensor out16 = poisoned({1, 64}, DataType::kFp16, DeviceType::kCuda);
  Tensor out32 = poisoned({1, 32}, DataType::kFp32, DeviceType::kCuda);
  op::LinearOptions plain;
  EXPECT_FALSE(op::linear(x32, w, plain, out16).ok());  // the fp32 x would be rounded
  op::LinearOptions swiglu;
  swiglu.swiglu = true;
  EXPECT_FALSE(op::linear(x16, w, swiglu, out32).ok());
  swiglu.norm = &norm;
  Tensor gated16 = poisoned({1, 32}, DataType::kFp16, DeviceType::kCuda);
  EXPECT_OK(op::linear(x32, w, swiglu, gated16));  // normalised from fp32 into fp16
}

}  // namespace
}  // namespace kuiper::test
