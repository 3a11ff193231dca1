// Quantized weights (kuiper/op/weight.h): the host E4M3 conversion, the CPU quantizer's error
// bound and the layout checks (these run without a GPU), then the CUDA kernels against the CPU
// reference: op::quantize and op::dequantize bit for bit, and op::matmul / op::linear of every
// format (the GEMVs for up to 8 rows; dequantize + cuBLAS, or FP8 tensor cores for large block-wise
// FP8 weights, for more) in every fused form.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kuiper/base/dtype.h"
#include "kuiper/op/kernels/cuda/gemv_partition.h"
#include "kuiper/op/ops.h"
#include "ops/harness.h"
#include "support/tensors.h"

namespace kuiper::test {
namespace {

using op::WeightFormat;

// ---- the host conversion and the CPU quantizer ----

TEST(Fp8E4m3, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const float f = fp8_e4m3_to_float(static_cast<uint8_t>(c));
    if ((c & 0x7f) == 0x7f) {  // the two NaN codes
      EXPECT_TRUE(std::isnan(f)) << c;
      continue;
    }
    EXPECT_EQ(float_to_fp8_e4m3(f), c) << c << " = " << f;
  }
}

TEST(Fp8E4m3, RoundsTiesToEvenAndSaturates) {
  EXPECT_EQ(float_to_fp8_e4m3(1.0625f), 0x38);   // 1 + 1/16: between 1 (0x38) and 1.125
  EXPECT_EQ(float_to_fp8_e4m3(1.1875f), 0x3a);   // between 1.125 (0x39) and 1.25 (0x3a)
  EXPECT_EQ(float_to_fp8_e4m3(1.07f), 0x39);     // past the tie
  EXPECT_EQ(float_to_fp8_e4m3(std::ldexp(1.0f, -10)), 0x00);      // half the smallest step
  EXPECT_EQ(float_to_fp8_e4m3(3 * std::ldexp(1.0f, -10)), 0x02);  // 1.5 steps: to 2
  EXPECT_EQ(float_to_fp8_e4m3(-3 * std::ldexp(1.0f, -10)), 0x82);
  EXPECT_EQ(float_to_fp8_e4m3(448.0f), 0x7e);
  EXPECT_EQ(float_to_fp8_e4m3(500.0f), 0x7e);
  EXPECT_EQ(float_to_fp8_e4m3(-1e9f), 0xfe);
  EXPECT_EQ(float_to_fp8_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(fp8_e4m3_to_float(0x7e), 448.0f);
}

struct Format {
  WeightFormat format;
  int64_t block_rows, block_cols;  // block_cols = K: per channel
  std::string name() const {
    std::string s = op::weight_format_name(format);
    if (format == WeightFormat::kFp8) {
      return s + (block_rows == 1 ? " per channel" : " block " + std::to_string(block_rows) +
                                                         "x" + std::to_string(block_cols));
    }
    return s + " group " + std::to_string(block_cols);
  }
};

Result<op::Weight> quantized(const Tensor& w, const Format& f) {
  const int64_t N = w.dim(0), K = w.dim(1);
  const int64_t cols = f.block_cols == 0 ? K : f.block_cols;
  KUIPER_ASSIGN_OR_RETURN(op::Weight q,
                          op::empty_weight(f.format, N, K, f.block_rows, cols, w.device()));
  KUIPER_RETURN_IF_ERROR(op::quantize(w, q));
  return q;
}

// block_cols 0: the whole row (per-channel FP8).
const Format kFormats[] = {{WeightFormat::kFp8, 128, 128}, {WeightFormat::kFp8, 1, 0},
                           {WeightFormat::kInt8, 1, 32},   {WeightFormat::kInt8, 1, 128},
                           {WeightFormat::kInt4, 1, 32},   {WeightFormat::kInt4, 1, 128}};

// The tensor-core GEMV's grid (host arithmetic, no GPU): the fewest teams that keep the most
// tiles a team takes where every team that fits runs. The critical path is unchanged, and one
// team fewer would lengthen it.
TEST(GemvPartition, FewestTeamsKeepTheMostTilesATeamTakes) {
  using cuda::gemv_mma_teams;
  EXPECT_EQ(gemv_mma_teams(288, 264), 144);   // Qwen2.5-7B q|k|v, 132 SMs: 72 blocks, not 132
  EXPECT_EQ(gemv_mma_teams(384, 264), 192);   // Qwen3-8B q|k|v
  EXPECT_EQ(gemv_mma_teams(2368, 264), 264);  // Qwen2.5-7B gate|up: 9 tiles a team, all teams
  EXPECT_EQ(gemv_mma_teams(1536, 264), 256);  // Qwen3-8B gate|up: 6 a team
  EXPECT_EQ(gemv_mma_teams(224, 264), 224);   // fewer tiles than teams: one each
  EXPECT_EQ(gemv_mma_teams(0, 264), 1);
  EXPECT_EQ(gemv_mma_teams(5, 0), 1);  // nothing fits: one team takes all
  for (const int64_t fit : {1, 2, 7, 64, 132, 264, 528}) {
    for (int64_t tiles = 1; tiles <= 3000; ++tiles) {
      const int64_t teams = gemv_mma_teams(tiles, fit);
      const int64_t most = (tiles + fit - 1) / fit;
      ASSERT_GE(teams, 1) << tiles << " tiles, " << fit << " fit";
      ASSERT_LE(teams, std::min(tiles, fit)) << tiles << " tiles, " << fit << " fit";
      ASSERT_EQ((tiles + teams - 1) / teams, most) << tiles << " tiles, " << fit << " fit";
      if (teams > 1) {
        ASSERT_GT((tiles + teams - 2) / (teams - 1), most) << tiles << " tiles, " << fit << " fit";
      }
    }
  }
}

TEST(Quantize, CpuRoundTripStaysWithinTheStatedBound) {
  const int64_t N = 200, K = 256;  // N: a partial 128-row FP8 block
  const Tensor w = random_tensor({N, K}, 7, DataType::kFp32, 0.3f);
  for (const Format& f : kFormats) {
    auto q = quantized(w, f);
    ASSERT_OK(q.status());
    ASSERT_OK(op::check_weight(*q));
    Tensor back = poisoned({N, K}, DataType::kFp32);
    ASSERT_OK(op::dequantize(*q, back));
    const float* a = w.data<float>();
    const float* b = back.data<float>();
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t k = 0; k < K; ++k) {
        double bound;
        if (f.format == WeightFormat::kFp8) {
          const float s = q->scales.data<float>()[(n / q->block_rows) * q->scales.dim(1) +
                                                   k / q->block_cols];
          bound = std::max(std::fabs(a[n * K + k]) * 0.0625, s * std::ldexp(1.0, -10));
        } else {
          bound = fp16_to_float(q->scales.data<uint16_t>()[n * q->scales.dim(1) + k / q->block_cols]);
        }
        ASSERT_LE(std::fabs(b[n * K + k] - a[n * K + k]), bound * (1 + 1e-6))
            << f.name() << " at " << n << ", " << k;
      }
    }
  }
}

TEST(Quantize, LayoutsRefuseShapesTheyCannotHold) {
  const auto refused = [](const Result<op::Weight>& w, const std::string& words) {
    ASSERT_FALSE(w.ok());
    EXPECT_NE(w.status().message().find(words), std::string::npos) << w.status().message();
  };
  refused(op::empty_weight(WeightFormat::kInt4, 4, 62, 1, 31, DeviceType::kCpu), "even");
  refused(op::empty_weight(WeightFormat::kInt8, 4, 64, 1, 48, DeviceType::kCpu), "divide");
  refused(op::empty_weight(WeightFormat::kInt8, 4, 64, 2, 32, DeviceType::kCpu), "one row");
  refused(op::empty_weight(WeightFormat::kPlain, 4, 64, 1, 32, DeviceType::kCpu), "cannot");
  auto w = op::empty_weight(WeightFormat::kInt8, 4, 64, 1, 32, DeviceType::kCpu);
  ASSERT_OK(w.status());
  op::Weight bad = *w;
  bad.scales = Tensor::empty({4, 3}, DataType::kFp16, DeviceType::kCpu).value();
  Status s = op::check_weight(bad);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("scales must be fp16 [4,2]"), std::string::npos) << s.message();
  bad = *w;
  bad.zeros = Tensor();
  EXPECT_FALSE(op::check_weight(bad).ok());
  auto fp8 = op::empty_weight(WeightFormat::kFp8, 200, 300, 128, 128, DeviceType::kCpu);
  ASSERT_OK(fp8.status());
  EXPECT_EQ(fp8->scales.dim(0), 2);  // partial edge blocks
  EXPECT_EQ(fp8->scales.dim(1), 3);
}

// ---- CUDA against the CPU ----

std::vector<uint8_t> host_bytes(const Tensor& t) {
  Tensor h = t.to(DeviceType::kCpu).value();
  const auto* p = static_cast<const uint8_t*>(h.raw());
  return std::vector<uint8_t>(p, p + h.nbytes());
}

TEST(Quantize, CudaMatchesCpuBitForBit) {
  SKIP_WITHOUT_CUDA();
  // 200 x 320: partial FP8 blocks both ways; 320 columns take groups of 32, not 128.
  const int64_t N = 200;
  for (const Format& f : kFormats) {
    const int64_t K = f.block_cols == 128 && f.format != WeightFormat::kFp8 ? 384 : 320;
    for (DataType dt : kFloatTypes) {
      const Tensor host = random_tensor({N, K}, 11, dt, 0.7f);
      const Tensor cpu_w = upload(host, dt, DeviceType::kCpu);
      const Tensor gpu_w = upload(host, dt, DeviceType::kCuda);
      auto qc = quantized(cpu_w, f);
      auto qg = quantized(gpu_w, f);
      ASSERT_OK(qc.status());
      ASSERT_OK(qg.status());
      const std::string what = f.name() + " from " + dtype_name(dt);
      EXPECT_EQ(host_bytes(qc->values), host_bytes(qg->values)) << what;
      EXPECT_EQ(host_bytes(qc->scales), host_bytes(qg->scales)) << what;
      if (qc->zeros.defined()) EXPECT_EQ(host_bytes(qc->zeros), host_bytes(qg->zeros)) << what;
      for (DataType out : kFloatTypes) {
        Tensor dc = poisoned({N, K}, out), dg = poisoned({N, K}, out, DeviceType::kCuda);
        ASSERT_OK(op::dequantize(*qc, dc));
        ASSERT_OK(op::dequantize(*qg, dg));
        EXPECT_EQ(host_bytes(dc), host_bytes(dg)) << what << " dequantized to " << dtype_name(out);
      }
    }
  }
}

// FP8 activations (weight.h): the product is with x rounded to FP8 a group of 128 columns of a
// row at a time, each group's scale its largest |x| / 448, an all-zero group staying zero; the
// rounding moves the product off the one with x as given.
TEST(QuantizedMatmul, Fp8ActivationsRoundEachGroupOfXToFp8) {
  const int64_t T = 3, K = 384, N = 40;
  Tensor x = random_tensor({T, K}, 3, DataType::kFp32, 2.0f);
  for (int64_t k = 128; k < 256; ++k) x.data<float>()[K + k] = 0.0f;  // row 1, group 1
  x.data<float>()[2 * K + 5] = 300.0f;  // one large value: its group's other codes get small
  auto q = quantized(random_tensor({N, K}, 4, DataType::kFp32, 0.05f),
                     {WeightFormat::kFp8, 128, 128});
  ASSERT_OK(q.status());
  op::Weight w8a8 = *q;
  w8a8.fp8_activations = true;
  Tensor got = poisoned({T, N}, DataType::kFp32), as_given = poisoned({T, N}, DataType::kFp32);
  ASSERT_OK(op::matmul(x, w8a8, nullptr, got));
  ASSERT_OK(op::matmul(x, *q, nullptr, as_given));
  Tensor w = poisoned({N, K}, DataType::kFp32);
  ASSERT_OK(op::dequantize(*q, w));
  const std::vector<float> a = host_floats(got), b = host_floats(as_given), wv = host_floats(w);
  const float* xv = x.data<float>();
  double err = 0, moved = 0, scale = 0;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      double want = 0;
      for (int64_t g = 0; g < K / 128; ++g) {
        float amax = 0.0f;
        for (int64_t k = g * 128; k < (g + 1) * 128; ++k) {
          amax = std::max(amax, std::fabs(xv[t * K + k]));
        }
        const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
        const float inv = amax > 0.0f ? 448.0f / amax : 1.0f;
        double sum = 0;
        for (int64_t k = g * 128; k < (g + 1) * 128; ++k) {
          sum += double(fp8_e4m3_to_float(float_to_fp8_e4m3(xv[t * K + k] * inv))) * wv[n * K + k];
        }
        want += double(s) * sum;
      }
      err = std::max(err, std::fabs(a[t * N + n] - want));
      moved = std::max(moved, std::fabs(double(b[t * N + n]) - want));
      scale = std::max(scale, std::fabs(want));
    }
  }
  EXPECT_LE(err / scale, 1e-5);
  EXPECT_GE(moved / scale, 1e-3);
}

TEST(QuantizedMatmul, Fp8ActivationsNeedFp8WeightsOfWholeGroups) {
  const Tensor w = random_tensor({32, 200}, 4, DataType::kFp32, 0.05f);
  for (const Format& f :
       {Format{WeightFormat::kFp8, 128, 128}, Format{WeightFormat::kInt8, 1, 40}}) {
    auto q = quantized(w, f);
    ASSERT_OK(q.status());
    q->fp8_activations = true;
    Tensor out = poisoned({1, 32}, DataType::kFp32);
    const Status s = op::matmul(random_tensor({1, 200}, 3), *q, nullptr, out);
    ASSERT_FALSE(s.ok()) << f.name();
    EXPECT_NE(s.message().find("FP8 activations need FP8 weights"), std::string::npos)
        << s.message();
  }
}

// The rows of a stacked weight (q|k|v) multiply as the rows of the whole.
TEST(QuantizedMatmul, RowViewsGiveTheirRowsProducts) {
  SKIP_WITHOUT_CUDA();
  const int64_t K = 256, N = 3 * 128;
  for (const Format& f : kFormats) {
    for (int64_t T : {1, 5}) {
      const Tensor x = upload(random_tensor({T, K}, 3), DataType::kFp32, DeviceType::kCuda);
      const Tensor w = upload(random_tensor({N, K}, 4, DataType::kFp32, 0.1f), DataType::kFp32,
                              DeviceType::kCuda);
      auto q = quantized(w, f);
      ASSERT_OK(q.status());
      Tensor whole = poisoned({T, N}, DataType::kFp32, DeviceType::kCuda);
      ASSERT_OK(op::matmul(x, *q, nullptr, whole));
      const std::vector<float> all = host_floats(whole);
      for (int64_t part = 0; part < 3; ++part) {
        Tensor rows = poisoned({T, 128}, DataType::kFp32, DeviceType::kCuda);
        ASSERT_OK(op::matmul(x, q->rows(part * 128, 128), nullptr, rows));
        const std::vector<float> got = host_floats(rows);
        for (int64_t t = 0; t < T; ++t) {
          for (int64_t n = 0; n < 128; ++n) {
            ASSERT_NEAR(got[t * 128 + n], all[t * N + part * 128 + n], 1e-4)
                << f.name() << " T " << T << " part " << part << " row " << n;
          }
        }
      }
    }
  }
}

// bf16 rows of x far outside fp16's range (3e5, past its 65504; 1e-6, in its subnormals) beside
// one of ordinary size through the tensor-core GEMV, which multiplies in fp16 and stages a row
// outside [2^-4, 2^15) again times a power of two: each row's results
// within 1e-4 of its largest, as the ordinary row's, against the CPU's double sums with the
// dequantized weights, and bit for bit as the row alone. Then the fused norm (x the fp32
// residual stream, out bf16) with norm weights of 3e5 and 1e-7, every normalised row outside the
// window, against the CPU's op::linear within 1e-2 of the largest (fp16's subnormal step is 60%
// of 1e-7).
TEST(QuantizedMatmul, CudaGemvTakesBf16RowsOutsideFp16sRange) {
  SKIP_WITHOUT_CUDA();
  const int64_t K = 512, N = 48;
  const float row_scales[] = {3e5f, 1.0f, 1e-6f};
  const int64_t T = 3;
  Tensor host_x = random_tensor({T, K}, 3, DataType::kFp32, 2.0f);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) host_x.data<float>()[t * K + k] *= row_scales[t];
  }
  const Tensor x = upload(host_x, DataType::kBf16, DeviceType::kCuda);
  const std::vector<float> xv = host_floats(x);  // x as bf16 holds it
  const Format formats[] = {{WeightFormat::kFp8, 128, 128}, {WeightFormat::kInt8, 1, 128},
                            {WeightFormat::kInt4, 1, 128}};
  for (const Format& f : formats) {
    const Tensor w = upload(random_tensor({N, K}, 4, DataType::kFp32, 0.05f), DataType::kFp32,
                            DeviceType::kCuda);
    auto q = quantized(w, f);
    ASSERT_OK(q.status());
    Tensor dequantized = poisoned({N, K}, DataType::kFp32, DeviceType::kCuda);
    ASSERT_OK(op::dequantize(*q, dequantized));
    const std::vector<float> wv = host_floats(dequantized);
    Tensor out = poisoned({T, N}, DataType::kFp32, DeviceType::kCuda);
    ASSERT_OK(op::matmul(x, *q, nullptr, out));
    const std::vector<float> got = host_floats(out);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> want(N);
      double largest = 0;
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t k = 0; k < K; ++k) want[n] += double(xv[t * K + k]) * wv[n * K + k];
        largest = std::max(largest, std::fabs(want[n]));
      }
      Tensor alone = poisoned({1, N}, DataType::kFp32, DeviceType::kCuda);
      ASSERT_OK(op::matmul(x.rows(t, 1), *q, nullptr, alone));
      const std::vector<float> one = host_floats(alone);
      for (int64_t n = 0; n < N; ++n) {
        ASSERT_TRUE(std::isfinite(got[t * N + n])) << f.name() << " row " << t;
        ASSERT_LE(std::fabs(got[t * N + n] - want[n]), 1e-4 * largest)
            << f.name() << " row " << t << " (x times " << row_scales[t] << ") column " << n;
        ASSERT_EQ(one[n], got[t * N + n]) << f.name() << " row " << t << " alone, column " << n;
      }
    }
  }
  const Tensor host_residual = random_tensor({T, K}, 6, DataType::kFp32, 2.0f);
  for (const float norm_scale : {3e5f, 1e-7f}) {
    const Tensor host_norm = random_tensor({K}, 7, DataType::kBf16, 0.5f * norm_scale, norm_scale);
    for (const Format& f : formats) {
      const Tensor host_w = random_tensor({N, K}, 8, DataType::kFp32, 0.05f);
      std::vector<float> results[2];
      for (DeviceType device : {DeviceType::kCpu, DeviceType::kCuda}) {
        const Tensor residual = upload(host_residual, DataType::kFp32, device);
        const Tensor norm = upload(host_norm, DataType::kBf16, device);
        auto q = quantized(upload(host_w, DataType::kFp32, device), f);
        ASSERT_OK(q.status());
        // bf16 out on CUDA; fp32 on the CPU, whose activations are fp32 only.
        Tensor y = poisoned({T, N}, device == DeviceType::kCuda ? DataType::kBf16 : DataType::kFp32,
                            device);
        op::LinearOptions o;
        o.norm = &norm;
        ASSERT_OK(op::linear(residual, *q, o, y));
        results[device == DeviceType::kCuda] = host_floats(y);
      }
      double largest = 0;
      for (float v : results[0]) largest = std::max(largest, double(std::fabs(v)));
      for (int64_t i = 0; i < T * N; ++i) {
        ASSERT_TRUE(std::isfinite(results[1][i])) << f.name() << " norm x " << norm_scale;
        ASSERT_LE(std::fabs(results[1][i] - results[0][i]), 1e-2 * largest)
            << f.name() << " norm x " << norm_scale << " element " << i;
      }
    }
  }
}

// A row of a small batch (the tensor-core GEMV's T columns) multiplies bit for bit as it does
// alone, also where the batch takes several launches (K = 16384: at most 6 rows of x a launch
// on an H100, what the block's shared memory holds; 16 rows: two launches of 8), for every format
// the GEMV reads in pairs and both 16-bit types.
TEST(QuantizedMatmul, CudaRowsOfABatchEqualTheRowAlone) {
  SKIP_WITHOUT_CUDA();
  const Format formats[] = {{WeightFormat::kFp8, 128, 128},
                            {WeightFormat::kFp8, 128, 128},  // with FP8 activations
                            {WeightFormat::kInt8, 1, 128},
                            {WeightFormat::kInt4, 1, 128}};
  const int64_t N = 48;
  const std::pair<int64_t, int64_t> shapes[] = {{512, 8}, {512, 16}, {16384, 8}};  // K, T
  for (const Format& f : formats) {
    const bool fp8_activations = &f == &formats[1];
    for (const auto& [K, T] : shapes) {
      const Tensor w = upload(random_tensor({N, K}, 4, DataType::kFp32, 0.05f), DataType::kFp32,
                              DeviceType::kCuda);
      auto q = quantized(w, f);
      ASSERT_OK(q.status());
      q->fp8_activations = fp8_activations;
      for (DataType act : {DataType::kFp16, DataType::kBf16}) {
        const Tensor x = upload(random_tensor({T, K}, 3), act, DeviceType::kCuda);
        Tensor batch = poisoned({T, N}, DataType::kFp32, DeviceType::kCuda);
        ASSERT_OK(op::matmul(x, *q, nullptr, batch));
        const std::vector<float> all = host_floats(batch);
        for (int64_t t = 0; t < T; ++t) {
          Tensor alone = poisoned({1, N}, DataType::kFp32, DeviceType::kCuda);
          ASSERT_OK(op::matmul(x.rows(t, 1), *q, nullptr, alone));
          const std::vector<float> got = host_floats(alone);
          for (int64_t n = 0; n < N; ++n) {
            ASSERT_EQ(got[n], all[t * N + n]) << q->describe() << " K " << K << " T " << T << " x="
                                              << dtype_name(act)
                                              << " row " << t << " column " << n;
          }
        }
      }
    }
  }
}

// Many rows of 16-bit x times a block-wise FP8 weight big enough for the FP8 tensor-core GEMM on
// an H100 (fp8_block_gemm.cu: x split into two FP8 terms, 2^25 weights and more) against the CPU's
// product with the dequantized weight: within 2^-8 of the values of x, well inside the 16-bit
// tolerance; with a bias into a 16-bit out, and rows of a stacked weight (a row view). On other
// GPUs the dequantizing path runs, to the same bound. With FP8 activations (one FP8 term, the
// codes the CPU rounds x to), against the CPU's product of the rounded x, to the same bound.
TEST(QuantizedMatmul, CudaFp8GemmOfManyRowsMatchesCpu) {
  SKIP_WITHOUT_CUDA();
  const int64_t N = 8192 + 256, K = 4096, view = 256;  // rows [view, N) are 2^25 weights
  const Tensor w = random_tensor({N, K}, 4, DataType::kFp32, 1.0f / 64);
  const Format block{WeightFormat::kFp8, 128, 128};
  auto q_cpu = quantized(w, block);
  auto q_gpu = quantized(upload(w, DataType::kFp32, DeviceType::kCuda), block);
  ASSERT_OK(q_cpu.status());
  ASSERT_OK(q_gpu.status());
  const Tensor bias = random_tensor({N - view}, 5, DataType::kFp32, 0.5f);
  const Tensor bias_gpu = upload(bias, DataType::kFp32, DeviceType::kCuda);
  const std::vector<float> bias_values = host_floats(bias);
  for (bool fp8_activations : {false, true}) {
    op::Weight w_cpu = q_cpu->rows(view, N - view), w_gpu = q_gpu->rows(view, N - view);
    w_cpu.fp8_activations = w_gpu.fp8_activations = fp8_activations;
    for (DataType act : {DataType::kFp16, DataType::kBf16}) {
      for (int64_t T : {16, 41}) {
        const Tensor x = random_tensor({T, K}, 3, act, 2.0f);
        Tensor ref = poisoned({T, N - view}, DataType::kFp32);
        ASSERT_OK(op::matmul(x, w_cpu, nullptr, ref));
        const std::vector<float> b = host_floats(ref);
        for (bool with_bias : {false, true}) {
          SCOPED_TRACE(w_gpu.describe() + " " + dtype_name(act) + " T " + std::to_string(T) +
                       (with_bias ? " +bias" : ""));
          const DataType out_dtype = with_bias ? act : DataType::kFp32;
          Tensor got = poisoned({T, N - view}, out_dtype, DeviceType::kCuda);
          ASSERT_OK(op::matmul(upload(x, act, DeviceType::kCuda), w_gpu,
                               with_bias ? &bias_gpu : nullptr, got));
          const std::vector<float> a = host_floats(got);
          ASSERT_EQ(a.size(), b.size());
          double err = 0, scale = 0;
          for (size_t i = 0; i < a.size(); ++i) {
            const double want = b[i] + (with_bias ? bias_values[i % (N - view)] : 0.0f);
            err = std::max(err, std::fabs(double(a[i]) - want));
            scale = std::max(scale, std::fabs(want));
          }
          // 16-bit outputs add their own rounding (2^-9 of a value for bf16).
          const double tol = out_dtype == DataType::kBf16 ? 6e-3 : 3e-3;
          EXPECT_LE(err / scale, tol);
        }
      }
    }
  }
}

// op::matmul and op::linear of a quantized weight on every backend against the CPU. Each case
// quantizes its fp32 weight argument on its own device (op::quantize is bit-exact across them, as
// CudaMatchesCpuBitForBit checks), so both sides multiply by the same codes. Arguments: x, w
// (fp32, quantized in the case), bias, norm weight, out. `brief`: the CPU-only run (CI, no GPU)
// checks that the cases are well formed on a sample: fp32 x, one and 17 rows, the first shape.
std::vector<OpCase> quantized_cases(bool brief) {
  struct Shape {
    int64_t K, N;
  };
  std::vector<OpCase> cases;
  // The formats, then block-wise FP8 with FP8 activations (the last entry).
  std::vector<Format> formats(std::begin(kFormats), std::end(kFormats));
  formats.push_back(kFormats[0]);
  for (size_t fi = 0; fi < formats.size(); ++fi) {
    const Format& f = formats[fi];
    const bool fp8_activations = fi + 1 == formats.size();
    // FP8: partial blocks both ways, and a K that is no multiple of 16 (the scalar reader); with
    // FP8 activations, whole groups of 128 columns (a partial block of rows).
    // Integers: K a multiple of the group, and 512 columns of int4 x 32 (every chunk a group).
    std::vector<Shape> shapes;
    if (fp8_activations) {
      shapes = {{384, 200}};
    } else if (f.format == WeightFormat::kFp8) {
      shapes = {{320, 200}, {200, 72}};
    } else {
      shapes = {{f.block_cols == 128 ? int64_t{384} : int64_t{320}, 100}, {1024, 64}};
    }
    // The long shape: more tiles a block of the tensor-core GEMV's persistent grid than it has
    // slots for their sums (kMmaGemvSlots, at up to about 300 SMs), and a K of 10 or 20
    // super-steps, which the block's stream of them deals across tiles' ends; briefly.
    shapes.push_back({1280, 24000});
    if (brief) shapes.resize(1);
    for (const Shape& s : shapes) {
      const bool long_shape = s.N == 24000;
      for (DataType act : kActivations) {
        if (brief && act != DataType::kFp32) continue;
        if (long_shape && act != DataType::kBf16) continue;
        for (int64_t T : {1, 3, 8, 16, 17, 70}) {
          if (s.K == 1024 && T > 8) continue;  // the wide shape: the GEMVs' loops, briefly
          if (long_shape && T != 1 && T != 8) continue;
          if (brief && T != 1 && T != 17) continue;
          for (int form = 0; form < 5; ++form) {  // matmul, +bias, norm, norm swiglu, residual
            if (long_shape && form != 0 && form != 3) continue;
            const bool swiglu = form == 3, residual = form == 4, norm = form == 2 || swiglu;
            const bool bias = form == 1;
            // SwiGLU's halves are row views, which begin at a multiple of the FP8 block's rows.
            const int64_t N =
                swiglu ? (s.N + f.block_rows - 1) / f.block_rows * f.block_rows : s.N;
            const int64_t rows = swiglu ? 2 * N : N;
            // fp32 logits from 16-bit x for the plain product.
            const DataType out_dtype = form == 0 ? DataType::kFp32 : act;
            const std::string name =
                std::string(form == 0 ? "matmul" : "linear") + " " + f.name() +
                (fp8_activations ? " fp8 activations" : "") + " T" +
                std::to_string(T) + " K" + std::to_string(s.K) + " N" + std::to_string(N) +
                " x=" + dtype_name(act) + " out=" + dtype_name(out_dtype) +
                (bias ? " +bias" : "") + (norm ? " norm" : "") + (swiglu ? " swiglu" : "") +
                (residual ? " residual" : "");
            const Format fmt = f;
            OpArg y = residual ? in_out({T, N}, out_dtype) : out({T, N}, out_dtype);
            // fp32 logits from 16-bit x: past the row-wise GEMV, the weights are dequantized
            // into x's dtype for the GEMM (ops.h allows it), which costs x's precision.
            // FP8 activations: where the CPU's fp32 norm and the GPU's 16-bit one straddle an
            // FP8 rounding boundary, x's codes differ by a step (2^-3 of a value at most); in
            // bf16 that happens often enough that SwiGLU, the product of two such sums, has been
            // seen 3.2% off (the 16-bit roundings of gate and up on top): 4% for bf16.
            const Tolerance tol = fp8_activations ? Tolerance{4e-3, 1.6e-2, 4e-2}
                                                  : Tolerance{1e-4, 4e-3, 3.2e-2};
            if (form == 0 && act != DataType::kFp32) y.tolerance = tol.of(act);
            cases.push_back(
                {name,
                 {in({T, s.K}, act, 2.0f),
                  in({rows, s.K}, DataType::kFp32, 1.0f / std::sqrt(static_cast<float>(s.K))),
                  in({rows}, DataType::kFp32, 0.5f), in({s.K}, DataType::kFp32, 0.5f, 1.0f),
                  y},
                 [=](std::vector<Tensor>& a) -> Status {
                   KUIPER_ASSIGN_OR_RETURN(op::Weight q, quantized(a[1], fmt));
                   q.fp8_activations = fp8_activations;
                   op::LinearOptions o;
                   o.norm = norm ? &a[3] : nullptr;
                   o.bias = bias ? &a[2] : nullptr;
                   o.swiglu = swiglu;
                   o.residual = residual;
                   if (form == 0) return op::matmul(a[0], q, nullptr, a[4]);
                   return op::linear(a[0], q, o, a[4]);
                 },
                 tol});
          }
        }
      }
    }
  }
  return cases;
}

// KUIPER_OP_BACKEND_TEST's pair, with the CPU-only run on the brief sample (the whole set takes
// most of a minute on a CPU).
TEST(QuantizedMatmul, CudaMatchesCpu) {
  SKIP_WITHOUT_CUDA();
  expect_backend_matches_cpu(quantized_cases(/*brief=*/false), DeviceType::kCuda);
}
TEST(QuantizedMatmul, CasesRunOnCpu) {
  expect_backend_matches_cpu(quantized_cases(/*brief=*/true), DeviceType::kCpu);
}

// ---- the tiled layout (weight.h) ----

// tiled_offset gives every 16-byte unit of a row-major matrix a place of its own inside its group
// of 8 rows, and a warp's load (8 rows' piece s) is 512 contiguous bytes.
TEST(TiledWeight, OffsetsPermuteTheUnitsWithinEachGroupOfRows) {
  const std::pair<int64_t, int64_t> shapes[] = {{8, 64}, {16, 128}, {24, 1792}};
  for (const auto& [N, R] : shapes) {
    std::vector<int> hits(static_cast<size_t>(N * R / 16), 0);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t b = 0; b < R; b += 16) {
        const int64_t at = op::tiled_offset(n, b, R);
        ASSERT_EQ(at % 16, 0);
        ASSERT_EQ(at / (8 * R), n / 8) << "row " << n << " left its group";
        ++hits[static_cast<size_t>(at / 16)];
      }
    }
    for (int h : hits) ASSERT_EQ(h, 1) << N << " x " << R;
  }
  EXPECT_EQ(op::tiled_offset(1, 0, 128) - op::tiled_offset(0, 0, 128), 64);
  // The piece's last byte: row 7's 64th.
  EXPECT_EQ(op::tiled_offset(7, 63, 128) - op::tiled_offset(0, 0, 128), 511);
  EXPECT_EQ(op::tiled_offset(0, 64, 128) - op::tiled_offset(0, 0, 128), 512);
  EXPECT_EQ(op::tiled_offset(8, 0, 128), 8 * 128);
}

TEST(TiledWeight, OnlyGpuIntegerWeightsOfWholeGroupsAreTiled) {
  const Tensor w = random_tensor({16, 256}, 4, DataType::kFp32, 0.05f);
  auto q = quantized(w, {WeightFormat::kInt4, 1, 128});
  ASSERT_OK(q.status());
  EXPECT_TRUE(op::tileable(*q));
  auto tiled = op::tile(*q);  // on the CPU: left as it is
  ASSERT_OK(tiled.status());
  EXPECT_FALSE(*tiled);
  EXPECT_FALSE(q->tiled);
  op::Weight marked = *q;
  marked.tiled = true;
  EXPECT_FALSE(op::check_weight(marked).ok()) << "a CPU weight marked tiled";
  EXPECT_FALSE(op::tileable(op::Weight(w)));  // plain
  auto fp8 = quantized(w, {WeightFormat::kFp8, 128, 128});
  ASSERT_OK(fp8.status());
  EXPECT_FALSE(op::tileable(*fp8));
  auto odd = quantized(random_tensor({12, 256}, 4, DataType::kFp32, 0.05f),
                       {WeightFormat::kInt8, 1, 128});
  ASSERT_OK(odd.status());
  EXPECT_FALSE(op::tileable(*odd)) << "12 rows: not whole groups of 8";
}

// A tiled weight's products equal the row-major weight's bit for bit on every CUDA path that
// reads it (the tensor-core GEMV for 1 to 16 rows, the one-row GEMV of an fp32 x, the dequantizing
// path for many rows, the element-wise paths of groups under a chunk), dequantized, row views of
// it too, and it comes back to the CPU row-major.
TEST(TiledWeight, CudaProductsAndTheCopyBackEqualTheRowMajorWeight) {
  SKIP_WITHOUT_CUDA();
  // Group 16 of int4 is less than a 16-byte chunk: the readers' element-wise paths (at()).
  const Format formats[] = {{WeightFormat::kInt8, 1, 128},
                            {WeightFormat::kInt4, 1, 128},
                            {WeightFormat::kInt4, 1, 16}};
  const int64_t N = 48;
  for (const Format& f : formats) {
    for (int64_t K : {512, 3584}) {
      const Tensor w = upload(random_tensor({N, K}, 4, DataType::kFp32, 0.05f), DataType::kFp32,
                              DeviceType::kCuda);
      auto rows = quantized(w, f);
      auto tiled = quantized(w, f);
      ASSERT_OK(rows.status());
      ASSERT_OK(tiled.status());
      auto done = op::tile(*tiled);
      ASSERT_OK(done.status());
      ASSERT_TRUE(*done);
      ASSERT_TRUE(tiled->tiled);
      ASSERT_NE(host_bytes(tiled->values), host_bytes(rows->values)) << "not permuted";
      auto back = tiled->to(DeviceType::kCpu);
      ASSERT_OK(back.status());
      EXPECT_FALSE(back->tiled);
      EXPECT_EQ(host_bytes(back->values), host_bytes(rows->values)) << tiled->describe();
      Tensor want_w = poisoned({N, K}, DataType::kBf16, DeviceType::kCuda);
      Tensor got_w = poisoned({N, K}, DataType::kBf16, DeviceType::kCuda);
      ASSERT_OK(op::dequantize(*rows, want_w));
      ASSERT_OK(op::dequantize(*tiled, got_w));
      EXPECT_EQ(host_bytes(got_w), host_bytes(want_w)) << "dequantized " << tiled->describe();
      for (int64_t view : {int64_t{0}, int64_t{8}}) {
        const op::Weight a = rows->rows(view, N - view), b = tiled->rows(view, N - view);
        for (DataType act : {DataType::kFp16, DataType::kBf16, DataType::kFp32}) {
          for (int64_t T : {1, 3, 8, 16, 40}) {
            if (act == DataType::kFp32 && T != 1) continue;
            SCOPED_TRACE(b.describe() + " x " + dtype_name(act) + " T " + std::to_string(T) +
                         " rows from " + std::to_string(view));
            const Tensor x = upload(random_tensor({T, K}, 3), act, DeviceType::kCuda);
            Tensor want = poisoned({T, N - view}, DataType::kFp32, DeviceType::kCuda);
            Tensor got = poisoned({T, N - view}, DataType::kFp32, DeviceType::kCuda);
            ASSERT_OK(op::matmul(x, a, nullptr, want));
            ASSERT_OK(op::matmul(x, b, nullptr, got));
            ASSERT_EQ(host_floats(got), host_floats(want));
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kuiper::test
