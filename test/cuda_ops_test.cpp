// Every CUDA kernel against the CPU reference on random inputs: fp32 and fp16 activations, all
// weight dtypes, one token and many, odd sizes. Outputs are poisoned with NaN before each run so
// an element the kernel forgets to write fails the comparison.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kuiper/base/allocator.h"
#include "kuiper/op/ops.h"
#include "kuiper/tensor/tensor.h"
#ifdef KUIPER_WITH_CUDA
#include "kuiper/base/cuda_runtime.h"
#endif

#include "support/assertions.h"

namespace kuiper {
namespace {

constexpr DataType kFloatTypes[] = {DataType::kFp32, DataType::kFp16, DataType::kBf16};
constexpr DataType kActivations[] = {DataType::kFp32, DataType::kFp16};

uint64_t next_seed() {
  static uint64_t seed = 1234;
  return ++seed;
}

// Fresh random fp32 values on the host, already rounded to `as` so the reference sees exactly
// what the device gets.
Tensor random_host(std::vector<int64_t> shape, DataType as, float scale = 1.0f,
                   float offset = 0.0f) {
  Tensor rounded = *Tensor::empty(shape, as);
  EXPECT_TRUE(op::fill_random(rounded, next_seed(), scale, offset).ok());
  Tensor f = *Tensor::empty(shape, DataType::kFp32);
  EXPECT_TRUE(convert_elements(rounded.raw(), as, f.raw(), DataType::kFp32,
                               static_cast<size_t>(f.numel()))
                  .ok());
  return f;
}

// The host fp32 tensor converted to `dtype` on the GPU.
Tensor to_device(const Tensor& host, DataType dtype) {
  Tensor converted = *Tensor::empty(host.shape(), dtype);
  EXPECT_TRUE(convert_elements(host.raw(), DataType::kFp32, converted.raw(), dtype,
                               static_cast<size_t>(host.numel()))
                  .ok());
  return *converted.to(DeviceType::kCuda);
}

// A GPU tensor of NaN (all-ones bits are NaN in fp32, fp16 and bf16; -1 for int32).
Tensor poisoned(std::vector<int64_t> shape, DataType dtype) {
  Tensor host = *Tensor::empty(shape, dtype);
  std::memset(host.raw(), 0xff, host.nbytes());
  return *host.to(DeviceType::kCuda);
}

Tensor to_host_fp32(const Tensor& dev) {
  Tensor host = *dev.to(DeviceType::kCpu);
  Tensor f = *Tensor::empty(dev.shape(), DataType::kFp32);
  EXPECT_TRUE(convert_elements(host.raw(), host.dtype(), f.raw(), DataType::kFp32,
                               static_cast<size_t>(f.numel()))
                  .ok());
  return f;
}

// max |out - ref| / max |ref|; NaN anywhere gives infinity.
double rel_error(const Tensor& out, const Tensor& ref) {
  double max_diff = 0, max_ref = 1e-30;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double o = out.data<float>()[i], r = ref.data<float>()[i];
    if (std::isnan(o)) return INFINITY;
    max_diff = std::max(max_diff, std::fabs(o - r));
    max_ref = std::max(max_ref, std::fabs(r));
  }
  return max_diff / max_ref;
}

// fp32 results agree to rounding; fp16 results carry one fp16 rounding (2^-11) and some fp32
// accumulation-order noise on top.
double tolerance(DataType out) { return out == DataType::kFp32 ? 2e-5 : 2e-3; }

TEST(CudaOps, Embedding) {
  SKIP_WITHOUT_CUDA();
  const int64_t V = 37, H = 67, T = 5;
  for (DataType table_t : kFloatTypes) {
    for (DataType act : kActivations) {
      SCOPED_TRACE(std::string(dtype_name(table_t)) + " table, " + dtype_name(act) + " out");
      Tensor table = random_host({V, H}, table_t);
      std::vector<int32_t> id_values = {0, 36, 5, 5, 17};
      Tensor ids = Tensor::view(id_values.data(), {T}, DataType::kInt32, DeviceType::kCpu);
      Tensor ref = *Tensor::empty({T, H}, DataType::kFp32);
      ASSERT_OK(op::embedding(table, ids, ref));
      Tensor out = poisoned({T, H}, act);
      Tensor dev_ids = *ids.to(DeviceType::kCuda);
      ASSERT_OK(op::embedding(to_device(table, table_t), dev_ids, out));
      EXPECT_LE(rel_error(to_host_fp32(out), ref), tolerance(act));
    }
  }
}

TEST(CudaOps, RmsNormRowsAndHeads) {
  SKIP_WITHOUT_CUDA();
  // [R, D] rows, and the per-head form: x [T, heads, d] normalised over d.
  const std::vector<std::vector<int64_t>> shapes = {{7, 133}, {1, 4096}, {3, 5, 64}};
  for (const auto& shape : shapes) {
    for (DataType w_t : kFloatTypes) {
      for (DataType act : kActivations) {
        for (bool in_place : {false, true}) {
          SCOPED_TRACE(shape_string(shape) + " " + dtype_name(w_t) + " weight, " +
                       dtype_name(act) + (in_place ? ", in place" : ""));
          Tensor x = random_host(shape, act, 2.0f);
          Tensor w = random_host({shape.back()}, w_t, 0.5f, 1.0f);
          Tensor ref = *Tensor::empty(shape, DataType::kFp32);
          ASSERT_OK(op::rmsnorm(x, w, 1e-6, ref));
          Tensor dx = to_device(x, act);
          Tensor out = in_place ? dx : poisoned(shape, act);
          ASSERT_OK(op::rmsnorm(dx, to_device(w, w_t), 1e-6, out));
          EXPECT_LE(rel_error(to_host_fp32(out), ref), tolerance(act));
        }
      }
    }
  }
}

TEST(CudaOps, RopeMatchesReference) {
  SKIP_WITHOUT_CUDA();
  for (int64_t d : {64, 128, 6}) {
    for (DataType act : kActivations) {
      SCOPED_TRACE("head_dim " + std::to_string(d) + ", " + dtype_name(act));
      const int64_t T = 6, heads = 3;
      std::vector<int32_t> pos = {0, 1, 7, 100, 4095, 40000};
      Tensor positions = Tensor::view(pos.data(), {T}, DataType::kInt32, DeviceType::kCpu);
      Tensor x = random_host({T, heads, d}, act);
      Tensor ref = *x.to(DeviceType::kCpu);
      ASSERT_OK(op::rope(ref, positions, 1e6));
      Tensor dx = to_device(x, act);
      ASSERT_OK(op::rope(dx, *positions.to(DeviceType::kCuda), 1e6));
      // Large angles: host and device sin/cos may round differently in the last bit.
      EXPECT_LE(rel_error(to_host_fp32(dx), ref), act == DataType::kFp32 ? 1e-5 : 2e-3);
    }
  }
}

TEST(CudaOps, SwiGluAndAdd) {
  SKIP_WITHOUT_CUDA();
  for (int64_t n : {1, 1001, 3 * 4096}) {
    for (DataType act : kActivations) {
      SCOPED_TRACE(std::to_string(n) + " " + dtype_name(act));
      Tensor a = random_host({n}, act, 4.0f), b = random_host({n}, act);
      Tensor ref = *Tensor::empty({n}, DataType::kFp32);
      ASSERT_OK(op::swiglu(a, b, ref));
      Tensor out = poisoned({n}, act);
      ASSERT_OK(op::swiglu(to_device(a, act), to_device(b, act), out));
      EXPECT_LE(rel_error(to_host_fp32(out), ref), tolerance(act));

      ASSERT_OK(op::add(a, b, ref));
      Tensor da = to_device(a, act);
      ASSERT_OK(op::add(da, to_device(b, act), da));  // aliasing form, as the residual uses it
      EXPECT_LE(rel_error(to_host_fp32(da), ref), tolerance(act));
    }
  }
}

TEST(CudaOps, KvWriteAtDevicePositions) {
  SKIP_WITHOUT_CUDA();
  for (DataType act : kActivations) {
    SCOPED_TRACE(dtype_name(act));
    const int64_t rows = 11, D = 24, T = 3;
    std::vector<int32_t> pos = {4, 0, 10};
    Tensor positions = Tensor::view(pos.data(), {T}, DataType::kInt32, DeviceType::kCpu);
    Tensor cache = random_host({rows, D}, act), k = random_host({T, D}, act);
    Tensor ref = *cache.to(DeviceType::kCpu);
    ASSERT_OK(op::kv_write(k, ref, positions));
    Tensor dcache = to_device(cache, act);
    ASSERT_OK(op::kv_write(to_device(k, act), dcache, *positions.to(DeviceType::kCuda)));
    EXPECT_EQ(rel_error(to_host_fp32(dcache), ref), 0.0);
  }
  Tensor cache = *Tensor::empty({4, 2}, DataType::kFp32);
  Tensor k = *Tensor::empty({1, 2}, DataType::kFp32);
  int32_t bad = 4;
  Tensor pos = Tensor::view(&bad, {1}, DataType::kInt32, DeviceType::kCpu);
  EXPECT_FALSE(op::kv_write(k, cache, pos).ok());
}

TEST(CudaOps, ArgmaxFirstOnTies) {
  SKIP_WITHOUT_CUDA();
  for (DataType act : kActivations) {
    SCOPED_TRACE(dtype_name(act));
    const int64_t R = 3, V = 151936;
    Tensor logits = random_host({R, V}, act, 8.0f);
    logits.data<float>()[V + 7] = 100.0f;  // row 1: a tie, the first index must win
    logits.data<float>()[V + 900] = 100.0f;
    logits.data<float>()[2 * V + V - 1] = 100.0f;  // row 2: the last element
    Tensor ref = *Tensor::empty({R}, DataType::kInt32);
    ASSERT_OK(op::argmax(logits, ref));
    Tensor out = poisoned({R}, DataType::kInt32);
    ASSERT_OK(op::argmax(to_device(logits, act), out));
    Tensor got = *out.to(DeviceType::kCpu);
    for (int64_t r = 0; r < R; ++r) EXPECT_EQ(got.data<int32_t>()[r], ref.data<int32_t>()[r]);
    EXPECT_EQ(got.data<int32_t>()[1], 7);
  }
}

TEST(CudaOps, MatmulAllTypesAndShapes) {
  SKIP_WITHOUT_CUDA();
  struct Shape {
    int64_t T, K, N;
  };
  // T == 1 takes the GEMV (vectorised when K fits 16-byte loads, scalar for odd K); T > 1 takes
  // cuBLAS for like types and the tiled kernel for mixed ones.
  const Shape shapes[] = {{1, 1024, 300}, {1, 67, 45}, {1, 4096, 129}, {2, 256, 128},
                          {17, 67, 45},   {33, 512, 257}};
  for (const Shape& s : shapes) {
    for (DataType act : kActivations) {
      for (DataType w_t : kFloatTypes) {
        std::vector<DataType> outs = {act};
        if (act != DataType::kFp32) outs.push_back(DataType::kFp32);  // fp32 logits from fp16
        for (DataType out_t : outs) {
          for (bool with_bias : {false, true}) {
            SCOPED_TRACE("T" + std::to_string(s.T) + " K" + std::to_string(s.K) + " N" +
                         std::to_string(s.N) + " x " + dtype_name(act) + " w " +
                         dtype_name(w_t) + " out " + dtype_name(out_t) +
                         (with_bias ? " +bias" : ""));
            Tensor x = random_host({s.T, s.K}, act);
            Tensor w = random_host({s.N, s.K}, w_t, 1.0f / std::sqrt(static_cast<float>(s.K)));
            Tensor bias = random_host({s.N}, w_t, 0.5f);
            Tensor ref = *Tensor::empty({s.T, s.N}, DataType::kFp32);
            ASSERT_OK(op::matmul(x, w, with_bias ? &bias : nullptr, ref));
            Tensor out = poisoned({s.T, s.N}, out_t);
            Tensor dbias = to_device(bias, w_t);
            ASSERT_OK(op::matmul(to_device(x, act), to_device(w, w_t),
                                 with_bias ? &dbias : nullptr, out));
            EXPECT_LE(rel_error(to_host_fp32(out), ref), tolerance(out_t));
          }
        }
      }
    }
  }
}

// The fused GEMV forms of op::linear against the CPU composition (rmsnorm, matmul, swiglu, add)
// on random inputs: one row (the fused GEMV) and several (the GPU composition), vectorised and
// scalar K, an odd N, every weight type, with and without bias.
TEST(CudaOps, LinearFusedForms) {
  SKIP_WITHOUT_CUDA();
  struct Shape {
    int64_t T, K, N;
  };
  // 6144 rows make between one and two SM-fuls of GEMV blocks on an H100 (the 4-load form).
  const Shape shapes[] = {{1, 1024, 300}, {1, 67, 45},  {1, 4096, 129}, {1, 12288, 64},
                          {1, 512, 6144}, {5, 256, 96}};
  for (const Shape& s : shapes) {
    for (DataType act : kActivations) {
      for (DataType w_t : kFloatTypes) {
        for (int form = 0; form < 3; ++form) {  // norm, norm + swiglu, residual
          const bool norm = form != 2, swiglu = form == 1, residual = form == 2;
          for (bool with_bias : {false, true}) {
            SCOPED_TRACE("T" + std::to_string(s.T) + " K" + std::to_string(s.K) + " N" +
                         std::to_string(s.N) + " x " + dtype_name(act) + " w " +
                         dtype_name(w_t) + (norm ? " norm" : "") + (swiglu ? " swiglu" : "") +
                         (residual ? " residual" : "") + (with_bias ? " +bias" : ""));
            const int64_t rows = swiglu ? 2 * s.N : s.N;
            Tensor x = random_host({s.T, s.K}, act, 2.0f);
            Tensor w = random_host({rows, s.K}, w_t, 1.0f / std::sqrt(static_cast<float>(s.K)));
            Tensor bias = random_host({rows}, w_t, 0.5f);
            Tensor gamma = random_host({s.K}, w_t, 0.5f, 1.0f);
            Tensor start = random_host({s.T, s.N}, act);
            op::LinearOptions o;
            o.norm = norm ? &gamma : nullptr;
            o.eps = 1e-6;
            o.bias = with_bias ? &bias : nullptr;
            o.swiglu = swiglu;
            o.residual = residual;
            Tensor ref = *start.to(DeviceType::kCpu);
            ASSERT_OK(op::linear(x, w, o, ref));

            Tensor dbias = to_device(bias, w_t), dgamma = to_device(gamma, w_t);
            o.norm = norm ? &dgamma : nullptr;
            o.bias = with_bias ? &dbias : nullptr;
            Tensor out = residual ? to_device(start, act) : poisoned({s.T, s.N}, act);
            ASSERT_OK(op::linear(to_device(x, act), to_device(w, w_t), o, out));
            // fp16: the GPU rounds the products (and the gate/up pair, the residual sum) to fp16
            // where the unfused ops store them; the CPU reference computes in fp32.
            EXPECT_LE(rel_error(to_host_fp32(out), ref), act == DataType::kFp32 ? 1e-4 : 4e-3);
          }
        }
      }
    }
  }
}

TEST(CudaOps, QkNormRopeCacheMatchesUnfusedOps) {
  SKIP_WITHOUT_CUDA();
  for (int64_t d : {128, 64, 6}) {
    for (DataType act : kActivations) {
      for (bool with_norm : {true, false}) {
        // rotary positions apart from the cache rows (Qwen3-VL text after images), or the same
        for (bool apart : {false, true}) {
          SCOPED_TRACE("head_dim " + std::to_string(d) + ", " + dtype_name(act) +
                       (with_norm ? ", qk norm" : "") + (apart ? ", rope positions apart" : ""));
          const int64_t T = 4, Hq = 6, Hkv = 2, rows = 50;
          std::vector<int32_t> pos = {3, 0, 49, 17}, rot = {900, 7, 51, 30000};
          Tensor positions = Tensor::view(pos.data(), {T}, DataType::kInt32, DeviceType::kCpu);
          Tensor rotary = Tensor::view(rot.data(), {T}, DataType::kInt32, DeviceType::kCpu);
          Tensor q = random_host({T, Hq, d}, act, 2.0f), k = random_host({T, Hkv, d}, act, 2.0f);
          Tensor v = random_host({T, Hkv * d}, act);
          Tensor qn = random_host({d}, act, 0.5f, 1.0f), kn = random_host({d}, act, 0.5f, 1.0f);
          Tensor kc = random_host({rows, Hkv * d}, act), vc = random_host({rows, Hkv * d}, act);
          // The reference: the unfused ops, RoPE at the rotary positions, rows at the cache rows.
          Tensor rq = *q.to(DeviceType::kCpu), rk = *k.to(DeviceType::kCpu);
          Tensor rkc = *kc.to(DeviceType::kCpu), rvc = *vc.to(DeviceType::kCpu);
          if (with_norm) {
            ASSERT_OK(op::rmsnorm(rq, qn, 1e-6, rq));
            ASSERT_OK(op::rmsnorm(rk, kn, 1e-6, rk));
          }
          ASSERT_OK(op::rope(rq, apart ? rotary : positions, 1e6));
          ASSERT_OK(op::rope(rk, apart ? rotary : positions, 1e6));
          ASSERT_OK(op::kv_write(*rk.reshape({T, Hkv * d}), rkc, positions));
          ASSERT_OK(op::kv_write(v, rvc, positions));
          Tensor dq = to_device(q, act), dk = to_device(k, act);
          Tensor dkc = to_device(kc, act), dvc = to_device(vc, act);
          Tensor dqn = to_device(qn, act), dkn = to_device(kn, act);
          const Tensor drot = *rotary.to(DeviceType::kCuda);
          ASSERT_OK(op::qk_norm_rope_cache(dq, dk, to_device(v, act), with_norm ? &dqn : nullptr,
                                           with_norm ? &dkn : nullptr, 1e-6,
                                           *positions.to(DeviceType::kCuda), 1e6, dkc, dvc,
                                           apart ? &drot : nullptr));
          const double tol = act == DataType::kFp32 ? 1e-5 : 2e-3;
          EXPECT_LE(rel_error(to_host_fp32(dq), rq), tol);
          EXPECT_LE(rel_error(to_host_fp32(dk), rk), tol);
          EXPECT_LE(rel_error(to_host_fp32(dkc), rkc), tol);
          EXPECT_EQ(rel_error(to_host_fp32(dvc), rvc), 0.0);  // a copy
        }
      }
    }
  }
}

TEST(CudaOps, FillRandomSameBitsAsCpu) {
  SKIP_WITHOUT_CUDA();
  for (DataType t : kFloatTypes) {
    SCOPED_TRACE(dtype_name(t));
    Tensor host = *Tensor::empty({1001}, t);
    ASSERT_OK(op::fill_random(host, 77, 0.3f, 1.0f));
    Tensor dev = poisoned({1001}, t);
    ASSERT_OK(op::fill_random(dev, 77, 0.3f, 1.0f));
    Tensor back = *dev.to(DeviceType::kCpu);
    EXPECT_EQ(std::memcmp(back.raw(), host.raw(), host.nbytes()), 0);
  }
}

#ifdef KUIPER_WITH_CUDA
TEST(CudaOps, CachingAllocatorReusesBlocks) {
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
