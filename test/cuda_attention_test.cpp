// The CUDA attention kernels (mha, flash1, flash2; prefill and decode; fp32, fp16 and bf16;
// decode with a device position; one contiguous sequence or a paged batch) against the CPU
// reference on random inputs. Outputs are poisoned
// with NaN before each run and cache rows past the valid prefix hold NaN, so an unwritten output or
// a read beyond the context fails the comparison.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kuiper/base/allocator.h"
#include "kuiper/base/device_graph.h"
#include "kuiper/op/attention.h"
#include "kuiper/op/kernels/cpu/cpu_kernels.h"
#include "kuiper/op/kernels/cuda/attention/decode_partition.h"
#include "kuiper/op/ops.h"
#include "support/assertions.h"

#ifdef KUIPER_WITH_CUDA
#include <cuda_runtime.h>

#include "kuiper/base/cuda_runtime.h"
#endif

namespace kuiper::op {
namespace {

constexpr int kKvHeads = 2;

struct Case {
  AttentionKind kind;
  AttentionPhase phase;
  DataType dtype;
  bool device_position;
  int head_dim;
  int group;  // query heads per kv head
  int T;      // queries
  int start;  // position of the first query; the context is start + T keys
  int grid = 0;  // decode: AttentionRequest::decode_grid (0: the kernel's choice)
};

std::string case_label(const Case& c) {
  return std::string(attention_name(c.kind)) +
         (c.phase == AttentionPhase::kPrefill ? "_prefill_" : "_decode_") + dtype_name(c.dtype) +
         (c.device_position ? "_devpos" : "") + "_d" + std::to_string(c.head_dim) + "_g" +
         std::to_string(c.group) + "_T" + std::to_string(c.T) + "_s" + std::to_string(c.start) +
         (c.grid > 0 ? "_grid" + std::to_string(c.grid) : "");
}

std::string case_name(const testing::TestParamInfo<Case>& info) { return case_label(info.param); }

// Host fp32 tensors whose values are exactly representable in the tested dtype, so the
// reference sees the numbers the GPU sees.
Tensor random_host(std::vector<int64_t> shape, DataType dtype, float lo, float hi, uint32_t seed) {
  Tensor t = *Tensor::empty(std::move(shape), DataType::kFp32);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    p[i] = dist(rng);
    if (dtype == DataType::kFp16) p[i] = fp16_to_float(float_to_fp16(p[i]));
    if (dtype == DataType::kBf16) p[i] = bf16_to_float(float_to_bf16(p[i]));
  }
  return t;
}

Result<Tensor> to_device(const Tensor& host_f32, DataType dtype) {
  KUIPER_ASSIGN_OR_RETURN(Tensor converted, Tensor::empty(host_f32.shape(), dtype));
  KUIPER_RETURN_IF_ERROR(convert_elements(host_f32.raw(), DataType::kFp32, converted.raw(), dtype,
                                          static_cast<size_t>(host_f32.numel())));
  return converted.to(DeviceType::kCuda);
}

Result<Tensor> to_host_f32(const Tensor& device) {
  KUIPER_ASSIGN_OR_RETURN(Tensor host, device.to(DeviceType::kCpu));
  KUIPER_ASSIGN_OR_RETURN(Tensor f32, Tensor::empty(host.shape(), DataType::kFp32));
  KUIPER_RETURN_IF_ERROR(convert_elements(host.raw(), host.dtype(), f32.raw(), DataType::kFp32,
                                          static_cast<size_t>(host.numel())));
  return f32;
}

// One problem's inputs and the CPU reference output. Inputs depend only on the shape, dtype
// and seed, so every kind and variant of a shape shares one (cached) reference.
struct Problem {
  Tensor q, k, v, ref;  // host fp32
  int max_ctx;
};

const Problem& problem_for(DataType dtype, int head_dim, int group, int T, int start) {
  static std::map<std::string, std::unique_ptr<Problem>> cache;
  const std::string key = std::string(dtype_name(dtype)) + "/" + std::to_string(head_dim) + "/" +
                          std::to_string(group) + "/" + std::to_string(T) + "/" +
                          std::to_string(start);
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  auto p = std::make_unique<Problem>();
  const int heads = kKvHeads * group, ctx = start + T;
  p->max_ctx = ctx + 3;  // rows past the context hold NaN: kernels must never read them
  const uint32_t seed = static_cast<uint32_t>(std::hash<std::string>()(key));
  // q spans a wider range than k so scores have unit spread: softmax is neither flat nor one-hot.
  p->q = random_host({T, heads, head_dim}, dtype, -3.0f, 3.0f, seed);
  p->k = random_host({p->max_ctx, kKvHeads, head_dim}, dtype, -1.0f, 1.0f, seed + 1);
  p->v = random_host({p->max_ctx, kKvHeads, head_dim}, dtype, -1.0f, 1.0f, seed + 2);
  for (int64_t i = static_cast<int64_t>(ctx) * kKvHeads * head_dim; i < p->k.numel(); ++i) {
    p->k.data<float>()[i] = NAN;
    p->v.data<float>()[i] = NAN;
  }
  p->ref = *Tensor::empty({T, heads, head_dim}, DataType::kFp32);
  cpu::attention(p->q, p->k, p->v, p->ref, start);
  return *(cache[key] = std::move(p));
}

// Max abs error against the reference, relative to the output's scale (its largest |value|).
// Any non-finite output (an unwritten NaN-poisoned element) fails. The 16-bit types' tolerance is
// 4 units of their rounding (fp16 2^-11, bf16 2^-8): the output and P are rounded to them.
void expect_close(const Tensor& got, const Tensor& ref, DataType dtype) {
  double scale = 0.0, err = 0.0;
  int64_t bad = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double r = ref.data<float>()[i], g = got.data<float>()[i];
    scale = std::max(scale, std::fabs(r));
    if (!std::isfinite(g)) ++bad;
    else err = std::max(err, std::fabs(g - r));
  }
  EXPECT_EQ(bad, 0) << "non-finite outputs (unwritten or NaN read)";
  const double tol = dtype == DataType::kFp32   ? 1e-4 * std::max(1.0, scale)
                     : dtype == DataType::kFp16 ? 2e-3 * scale + 1e-5
                                                : 1.6e-2 * scale + 1e-5;
  EXPECT_LE(err, tol) << "max abs error " << err << " at output scale " << scale;
}

Result<Tensor> nan_tensor(const std::vector<int64_t>& shape, DataType dtype) {
  KUIPER_ASSIGN_OR_RETURN(Tensor t, Tensor::empty(shape, DataType::kFp32));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = NAN;
  return to_device(t, dtype);
}

Status sync() {
#ifdef KUIPER_WITH_CUDA
  return cuda::check(cudaStreamSynchronize(cuda::stream()), "cudaStreamSynchronize");
#else
  return Status::Ok();
#endif
}

// Runs op into args.out twice, poisoned with NaN before each run (the second reuses the op's
// scratch buffers, as decode steps do), and compares each output with ref.
void expect_forward_twice(AttentionOp& op, AttentionArgs& args, const Tensor& ref,
                          DataType dtype) {
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    ASSERT_TRUE(args.out.copy_from(*nan_tensor(args.out.shape(), dtype)).ok());
    Status st = op.forward(args);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_TRUE(sync().ok());
    Result<Tensor> got = to_host_f32(args.out);
    ASSERT_TRUE(got.ok()) << got.status().message();
    expect_close(*got, ref, dtype);
  }
}

class CudaAttention : public testing::TestWithParam<Case> {};

TEST_P(CudaAttention, MatchesCpuReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)";
  const Case& c = GetParam();
  const Problem& p = problem_for(c.dtype, c.head_dim, c.group, c.T, c.start);

  AttentionRequest request;
  request.kind = c.kind;
  request.phase = c.phase;
  request.dtype = c.dtype;
  request.device = DeviceType::kCuda;
  request.device_position = c.device_position;
  request.head_dim = c.head_dim;
  request.decode_grid = c.grid;
  Result<std::unique_ptr<AttentionOp>> op = make_attention(request);
  ASSERT_TRUE(op.ok()) << op.status().message();

  AttentionArgs args;
  args.q = *to_device(p.q, c.dtype);
  args.k_cache = *to_device(p.k, c.dtype);
  args.v_cache = *to_device(p.v, c.dtype);
  Result<Tensor> out = nan_tensor(p.q.shape(), c.dtype);
  ASSERT_TRUE(out.ok()) << out.status().message();
  args.out = *out;
  args.start = c.start;
  if (c.device_position) {
    // The host start is deliberately wrong: the kernel must take the position from the device.
    args.start = 0;
    Tensor pos = *Tensor::empty({1}, DataType::kInt32);
    pos.data<int32_t>()[0] = c.start;
    args.device_position = *pos.to(DeviceType::kCuda);
  }
  expect_forward_twice(**op, args, p.ref, c.dtype);
}

std::vector<Case> all_cases() {
  const AttentionKind kinds[] = {AttentionKind::kMha, AttentionKind::kFlash1,
                                 AttentionKind::kFlash2};
  const DataType dtypes[] = {DataType::kFp32, DataType::kFp16, DataType::kBf16};
  std::vector<Case> cases;
  for (AttentionKind kind : kinds) {
    for (DataType dtype : dtypes) {
      for (int d : {64, 128}) {
        for (int group : {1, 2, 4, 8}) {
          for (int kv : {1, 7, 64, 255, 256, 1000, 4097}) {
            for (bool device_position : {false, true}) {
              cases.push_back(
                  {kind, AttentionPhase::kDecode, dtype, device_position, d, group, 1, kv - 1});
            }
          }
          // Prefill: tile-size multiples and not, and multi-turn prefills (start > 0).
          const int shapes[][2] = {{1, 0},   {7, 0},    {64, 0}, {255, 0},
                                   {256, 0}, {100, 155}, {37, 963}};
          for (const auto& s : shapes) {
            cases.push_back({kind, AttentionPhase::kPrefill, dtype, false, d, group, s[0], s[1]});
          }
        }
        // Long prefills on one GQA ratio only: the CPU reference is quadratic.
        cases.push_back({kind, AttentionPhase::kPrefill, dtype, false, d, 2, 1000, 0});
        cases.push_back({kind, AttentionPhase::kPrefill, dtype, false, d, 2, 129, 3968});
      }
    }
    for (DataType dtype : {DataType::kFp16, DataType::kBf16}) {
      cases.push_back({kind, AttentionPhase::kPrefill, dtype, false, 128, 4, 4097, 0});
    }
  }
  // Split-KV decode at explicit grids (flash2 fp16/bf16 and flash1 read decode_grid): one split per
  // (kv head, row block), a few, more than the context can fill (capped), with contexts shorter
  // than, equal to and just past the tiles, and GQA groups up to and past one block's 16 heads.
  // flash1 has one row block per kv head here, so its grid is kKvHeads times the splits.
  for (AttentionKind kind : {AttentionKind::kFlash1, AttentionKind::kFlash2}) {
    for (DataType dtype : {DataType::kFp32, DataType::kFp16, DataType::kBf16}) {
      if (kind == AttentionKind::kFlash2 && dtype == DataType::kFp32) continue;
      for (int splits : {1, 2, 3, 7, 64, 1000}) {
        for (int kv : {1, 63, 65, 129, 1000, 4097}) {
          for (bool device_position : {false, true}) {
            const int grid = kind == AttentionKind::kFlash1 ? splits * kKvHeads : splits;
            cases.push_back({kind, AttentionPhase::kDecode, dtype, device_position, 128, 4, 1,
                             kv - 1, grid});
          }
        }
      }
      // flash2 fp16/bf16 spreads the work over decode_grid blocks: kv heads x head groups (2 units
      // for groups up to 16, 4 for 20) spread over 3 or 5 blocks cross unit boundaries, over 2
      // or 4 end exactly on them; kv lengths 1 and 2 leave one block for every unit.
      if (kind == AttentionKind::kFlash2) {
        for (int group : {4, 8, 16, 20}) {
          for (int grid : {2, 3, 4, 5, 132}) {
            for (int kv : {1, 2, 3, 64, 129, 1001}) {
              for (bool device_position : {false, true}) {
                cases.push_back({kind, AttentionPhase::kDecode, dtype, device_position, 128,
                                 group, 1, kv - 1, grid});
              }
            }
          }
        }
      }
      for (int group : {16, 20}) {
        for (int grid : {0, 3}) {
          cases.push_back({kind, AttentionPhase::kDecode, dtype, true, 128, group, 1, 2999, grid});
          cases.push_back({kind, AttentionPhase::kDecode, dtype, false, 64, group, 1, 700, grid});
        }
      }
    }
  }
  // The groups above overlap (e.g. flash2 fp16 group 4 at 2 or 3 blocks): each case once.
  std::vector<Case> unique;
  std::set<std::string> seen;
  for (const Case& c : cases) {
    if (seen.insert(case_label(c)).second) unique.push_back(c);
  }
  return unique;
}

INSTANTIATE_TEST_SUITE_P(All, CudaAttention, testing::ValuesIn(all_cases()), case_name);

// ---- the paged batch (AttentionArgs::paged) ----

// Sequences of one paged batch: (queries, start) pairs.
using Sequences = std::vector<std::pair<int, int>>;

// A mixed batch for each phase: single queries, chunked prefills starting past position 0, a
// sequence whose keys span dozens of blocks, keys ending exactly on a block boundary and one
// past it.
Sequences mixed_sequences(AttentionPhase phase) {
  if (phase == AttentionPhase::kDecode) {
    return {{1, 0}, {1, 15}, {1, 16}, {1, 100}, {1, 1030}, {1, 31}, {1, 63}};
  }
  return {{1, 0}, {37, 0}, {1, 200}, {64, 100}, {130, 515}, {5, 27}, {16, 16}};
}

// Many sequences of random lengths: more (sequence, kv head) units than the GPU has SMs in
// decode, so the flash2 decode's blocks each hold several sequences.
Sequences many_sequences(AttentionPhase phase, uint32_t seed) {
  std::mt19937 rng(seed);
  const bool decode = phase == AttentionPhase::kDecode;
  std::uniform_int_distribution<int> queries(1, 24), start(0, decode ? 400 : 120);
  Sequences s(decode ? 100 : 20);
  for (auto& [t, st] : s) {
    t = decode ? 1 : queries(rng);
    st = start(rng);
  }
  return s;
}

// A hundred single-query sequences of nearly one length (281 to 300 keys): the flash2 16-bit
// decode's blocks hold whole units where they fill its grid (decode_unit_run), which random
// lengths do not allow.
Sequences even_sequences() {
  Sequences s(100);
  for (size_t i = 0; i < s.size(); ++i) s[i] = {1, 280 + static_cast<int>(i * 7 % 20)};
  return s;
}

// A hundred single-query sequences of 240 to 339 keys, spread as a serving batch's are: the
// longest 17% above the mean, within one unit's worth of a block of two whole units
// (decode_unit_run_slack: grid 100 over 200 units), beyond it for longer runs (grids 1, 3, 7).
Sequences spread_sequences() {
  Sequences s(100);
  for (size_t i = 0; i < s.size(); ++i) s[i] = {1, 239 + static_cast<int>(i * 37 % 100)};
  return s;
}

// Which batch a paged case runs.
enum class Batch { kMixed, kMany, kEven, kSpread };

const char* batch_name(Batch b) {
  return b == Batch::kMixed  ? "mixed"
         : b == Batch::kMany ? "many"
         : b == Batch::kEven ? "even"
                             : "spread";
}

// A paged batch on the host: q rows of every sequence in order, the pool with each sequence's
// blocks at scrambled places (a random permutation of the pool's blocks), NaN in every pool row
// that holds no key of a sequence (spare blocks, the tail of a sequence's last block) so that a
// wrong row read shows, table entries past a sequence's blocks pointing outside the pool, and the
// CPU reference run per sequence over a gathered contiguous copy of its keys.
struct PagedProblem {
  Sequences seqs;
  int block_size = 0, width = 0, pool_blocks = 0, max_queries = 0, max_keys = 0;
  std::vector<int32_t> query_begin, starts, tables;
  Tensor q, k, v, ref;  // host fp32
};

PagedProblem make_paged_problem(DataType dtype, int head_dim, int block_size, Sequences seqs,
                                uint32_t seed, int width = 0, int pool_blocks = 0) {
  PagedProblem p;
  p.seqs = std::move(seqs);
  p.block_size = block_size;
  const int B = static_cast<int>(p.seqs.size()), heads = kKvHeads * 4;
  int total_q = 0, needed = 0, most_blocks = 0;
  for (const auto& [t, st] : p.seqs) {
    p.query_begin.push_back(total_q);
    p.starts.push_back(st);
    total_q += t;
    const int blocks = (st + t + block_size - 1) / block_size;
    needed += blocks;
    most_blocks = std::max(most_blocks, blocks);
    p.max_queries = std::max(p.max_queries, t);
    p.max_keys = std::max(p.max_keys, st + t);
  }
  p.query_begin.push_back(total_q);
  p.width = std::max(width, most_blocks + 2);  // spare entries: never read
  p.pool_blocks = std::max(pool_blocks, needed + 5);
  std::vector<int32_t> order(static_cast<size_t>(p.pool_blocks));
  for (int i = 0; i < p.pool_blocks; ++i) order[static_cast<size_t>(i)] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937(seed + 7));
  p.tables.assign(static_cast<size_t>(B) * p.width, 1 << 30);
  const int rows = p.pool_blocks * block_size;
  p.q = random_host({total_q, heads, head_dim}, dtype, -3.0f, 3.0f, seed);
  p.k = random_host({rows, kKvHeads, head_dim}, dtype, -1.0f, 1.0f, seed + 1);
  p.v = random_host({rows, kKvHeads, head_dim}, dtype, -1.0f, 1.0f, seed + 2);
  const int64_t row_elems = int64_t{kKvHeads} * head_dim;
  std::vector<bool> used(static_cast<size_t>(rows), false);
  p.ref = *Tensor::empty({total_q, heads, head_dim}, DataType::kFp32);
  size_t next = 0;
  for (int i = 0; i < B; ++i) {
    const auto [t, st] = p.seqs[static_cast<size_t>(i)];
    const int keys = st + t;
    for (int b = 0; b * block_size < keys; ++b) {
      p.tables[static_cast<size_t>(i) * p.width + b] = order[next++];
    }
    Tensor kc = *Tensor::empty({keys, kKvHeads, head_dim}, DataType::kFp32);
    Tensor vc = *Tensor::empty({keys, kKvHeads, head_dim}, DataType::kFp32);
    for (int pos = 0; pos < keys; ++pos) {
      const int row = p.tables[static_cast<size_t>(i) * p.width + pos / block_size] * block_size +
                      pos % block_size;
      used[static_cast<size_t>(row)] = true;
      std::copy_n(p.k.data<float>() + row * row_elems, row_elems, kc.data<float>() + pos * row_elems);
      std::copy_n(p.v.data<float>() + row * row_elems, row_elems, vc.data<float>() + pos * row_elems);
    }
    const int64_t q_elems = int64_t{heads} * head_dim, q0 = p.query_begin[static_cast<size_t>(i)];
    Tensor qi = *Tensor::empty({t, heads, head_dim}, DataType::kFp32);
    std::copy_n(p.q.data<float>() + q0 * q_elems, t * q_elems, qi.data<float>());
    Tensor out = *Tensor::empty({t, heads, head_dim}, DataType::kFp32);
    cpu::attention(qi, kc, vc, out, st);
    std::copy_n(out.data<float>(), t * q_elems, p.ref.data<float>() + q0 * q_elems);
  }
  for (int row = 0; row < rows; ++row) {
    if (used[static_cast<size_t>(row)]) continue;
    std::fill_n(p.k.data<float>() + row * row_elems, row_elems, NAN);
    std::fill_n(p.v.data<float>() + row * row_elems, row_elems, NAN);
  }
  return p;
}

Result<Tensor> int_tensor_on_device(const std::vector<int32_t>& values, std::vector<int64_t> shape) {
  KUIPER_ASSIGN_OR_RETURN(Tensor host, Tensor::empty(std::move(shape), DataType::kInt32));
  std::copy(values.begin(), values.end(), host.data<int32_t>());
  return host.to(DeviceType::kCuda);
}

// The paged call's arguments on the device, out poisoned with NaN.
AttentionArgs paged_device_args(const PagedProblem& p, DataType dtype) {
  AttentionArgs args;
  args.q = *to_device(p.q, dtype);
  args.k_cache = *to_device(p.k, dtype);
  args.v_cache = *to_device(p.v, dtype);
  args.out = *nan_tensor(p.q.shape(), dtype);
  const int64_t B = static_cast<int64_t>(p.seqs.size());
  args.paged.query_begin = *int_tensor_on_device(p.query_begin, {B + 1});
  args.paged.starts = *int_tensor_on_device(p.starts, {B});
  args.paged.block_tables = *int_tensor_on_device(p.tables, {B, p.width});
  args.paged.block_size = p.block_size;
  args.paged.max_queries = p.max_queries;
  args.paged.max_keys = p.max_keys;
  return args;
}

struct PagedCase {
  AttentionKind kind;
  AttentionPhase phase;
  DataType dtype;
  bool device_position;
  int head_dim;
  int block_size;
  Batch batch;
  int grid = 0;  // AttentionRequest::decode_grid
};

std::string paged_case_name(const testing::TestParamInfo<PagedCase>& info) {
  const PagedCase& c = info.param;
  return std::string(attention_name(c.kind)) +
         (c.phase == AttentionPhase::kPrefill ? "_prefill_" : "_decode_") + dtype_name(c.dtype) +
         (c.device_position ? "_devpos" : "") + "_d" + std::to_string(c.head_dim) + "_bs" +
         std::to_string(c.block_size) + "_" + batch_name(c.batch) +
         (c.grid > 0 ? "_grid" + std::to_string(c.grid) : "");
}

const PagedProblem& paged_problem_for(const PagedCase& c) {
  static std::map<std::string, std::unique_ptr<PagedProblem>> cache;
  const std::string key = std::string(dtype_name(c.dtype)) + "/" + std::to_string(c.head_dim) +
                          "/" + std::to_string(c.block_size) + "/" + (c.phase == AttentionPhase::kPrefill ? "prefill" : "decode") + "/" +
                          batch_name(c.batch);
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  const uint32_t seed = static_cast<uint32_t>(std::hash<std::string>()(key));
  Sequences seqs = c.batch == Batch::kMany  ? many_sequences(c.phase, seed)
                   : c.batch == Batch::kEven   ? even_sequences()
                   : c.batch == Batch::kSpread ? spread_sequences()
                                               : mixed_sequences(c.phase);
  auto p = std::make_unique<PagedProblem>(
      make_paged_problem(c.dtype, c.head_dim, c.block_size, std::move(seqs), seed));
  return *(cache[key] = std::move(p));
}

class CudaAttentionPaged : public testing::TestWithParam<PagedCase> {};

TEST_P(CudaAttentionPaged, MatchesCpuReferencePerSequence) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)";
  const PagedCase& c = GetParam();
  const PagedProblem& p = paged_problem_for(c);
  AttentionRequest request{c.kind, c.phase, c.dtype, DeviceType::kCuda, c.device_position,
                           c.head_dim};
  request.decode_grid = c.grid;
  Result<std::unique_ptr<AttentionOp>> op = make_attention(request);
  ASSERT_TRUE(op.ok()) << op.status().message();
  AttentionArgs args = paged_device_args(p, c.dtype);
  expect_forward_twice(**op, args, p.ref, c.dtype);
}

std::vector<PagedCase> paged_cases() {
  const AttentionKind kinds[] = {AttentionKind::kMha, AttentionKind::kFlash1,
                                 AttentionKind::kFlash2};
  const DataType dtypes[] = {DataType::kFp32, DataType::kFp16, DataType::kBf16};
  std::vector<PagedCase> cases;
  for (AttentionKind kind : kinds) {
    for (DataType dtype : dtypes) {
      for (int d : {64, 128}) {
        for (int bs : {16, 32}) {
          cases.push_back({kind, AttentionPhase::kPrefill, dtype, false, d, bs, Batch::kMixed});
          for (bool dp : {false, true}) {
            cases.push_back({kind, AttentionPhase::kDecode, dtype, dp, d, bs, Batch::kMixed});
          }
        }
      }
      cases.push_back({kind, AttentionPhase::kPrefill, dtype, false, 128, 16, Batch::kMany});
      for (bool dp : {false, true}) {
        cases.push_back({kind, AttentionPhase::kDecode, dtype, dp, 128, 16, Batch::kMany});
      }
    }
  }
  // Explicit grids: the flash2 16-bit decode's blocks cut units of several sequences, or are two
  // a unit of the mixed batch (2 * 7 * kKvHeads: thread block clusters on sm_90, a one-key
  // sequence leaving one block of its clusters no keys), or hold whole units: the even batch's
  // 200 units in 1, 3, 7 (the last block holding fewer) or 100 blocks (decode_unit_run), where
  // the many batch's uneven lengths split the same grids' keys evenly instead, and the spread
  // batch's do in 1, 3 and 7 but not in 100 (decode_unit_run_slack); 28 and 130 blocks do not
  // fit whole units. flash1's splits per (sequence, kv head) (grid / units) of 1 and 3.
  for (DataType dtype : {DataType::kFp16, DataType::kBf16}) {
    for (int grid : {0, 1, 3, 7, 2 * 7 * kKvHeads, 100, 130}) {
      for (Batch batch : {Batch::kMixed, Batch::kMany, Batch::kEven, Batch::kSpread}) {
        if (grid == 0 && batch != Batch::kEven) continue;  // above
        cases.push_back({AttentionKind::kFlash2, AttentionPhase::kDecode, dtype, true, 128, 16,
                         batch, grid});
      }
    }
    cases.push_back({AttentionKind::kFlash1, AttentionPhase::kDecode, dtype, true, 128, 16,
                     Batch::kMixed, 3 * 7 * kKvHeads});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, CudaAttentionPaged, testing::ValuesIn(paged_cases()),
                         paged_case_name);

// The step's q, k and v given raw (AttentionArgs::input, decode): the flash2 16-bit decode
// prepares them in its kernel where its blocks keep an SM each (a few sequences, explicit grids
// whose blocks cut units of several sequences), every other call composes op::qk_norm_rope_cache
// and the attention. Both must give the composition's output on the same device and leave the
// same newest cache rows, which start as NaN in the pool (a kernel that read them instead of the
// prepared rows would show). The rotary positions differ from the cache rows, as in Qwen3-VL.
struct InputCase {
  AttentionKind kind;
  DataType dtype;
  bool many;
  bool norms;
  int grid;
  int head_dim = 128;
};

class CudaAttentionPagedInput : public testing::TestWithParam<InputCase> {};

TEST_P(CudaAttentionPagedInput, EqualsTheComposition) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)";
  const InputCase& c = GetParam();
  const int D = c.head_dim;
  const PagedProblem& p =
      paged_problem_for({AttentionKind::kFlash2, AttentionPhase::kDecode, c.dtype, true, D, 16,
                         c.many ? Batch::kMany : Batch::kMixed});
  const int B = static_cast<int>(p.seqs.size()), heads = kKvHeads * 4;
  const uint32_t seed = 91 + static_cast<uint32_t>(c.many) * 7 + static_cast<uint32_t>(c.norms);
  const Tensor qkv = random_host({B, heads + 2 * kKvHeads, D}, c.dtype, -2.0f, 2.0f, seed);
  const Tensor q_norm = random_host({D}, c.dtype, 0.5f, 1.5f, seed + 1);
  const Tensor k_norm = random_host({D}, c.dtype, 0.5f, 1.5f, seed + 2);
  std::vector<int32_t> positions, rotary;
  Tensor k = *Tensor::empty(p.k.shape(), DataType::kFp32), v = *Tensor::empty(p.v.shape(), DataType::kFp32);
  ASSERT_TRUE(k.copy_from(p.k).ok());
  ASSERT_TRUE(v.copy_from(p.v).ok());
  const int64_t row_elems = int64_t{kKvHeads} * D;
  for (int i = 0; i < B; ++i) {
    const int st = p.seqs[static_cast<size_t>(i)].second;
    const int row = p.tables[static_cast<size_t>(i) * p.width + st / p.block_size] * p.block_size +
                    st % p.block_size;
    positions.push_back(row);
    rotary.push_back(st + 3 * i);
    std::fill_n(k.data<float>() + row * row_elems, row_elems, NAN);
    std::fill_n(v.data<float>() + row * row_elems, row_elems, NAN);
  }
  AttentionRequest request{c.kind, AttentionPhase::kDecode, c.dtype, DeviceType::kCuda, true, D};
  request.decode_grid = c.grid;
  Result<std::unique_ptr<AttentionOp>> op = make_attention(request);
  ASSERT_TRUE(op.ok()) << op.status().message();
  const Tensor q_norm_dev = *to_device(q_norm, c.dtype), k_norm_dev = *to_device(k_norm, c.dtype);
  // Each way from the same inputs: the output and the newest cache rows, on the host.
  auto run = [&](bool given_raw, Tensor& out, Tensor& newest) {
    AttentionArgs args = paged_device_args(p, c.dtype);
    args.k_cache = *to_device(k, c.dtype);
    args.v_cache = *to_device(v, c.dtype);
    AttentionInput in;
    in.qkv = *to_device(qkv, c.dtype);
    in.q_norm = c.norms ? &q_norm_dev : nullptr;
    in.k_norm = c.norms ? &k_norm_dev : nullptr;
    in.eps = 1e-6;
    in.positions = *int_tensor_on_device(positions, {B});
    in.rope_positions = *int_tensor_on_device(rotary, {B});
    in.rope.theta = 1000000.0;
    if (given_raw) {
      args.input = in;
    } else {
      args.q = *nan_tensor(p.q.shape(), c.dtype);
      Tensor kf = *args.k_cache.reshape({args.k_cache.dim(0), row_elems});
      Tensor vf = *args.v_cache.reshape({args.v_cache.dim(0), row_elems});
      ASSERT_TRUE(qk_norm_rope_cache(in.qkv, args.q, in.q_norm, in.k_norm, in.eps, in.positions,
                                     in.rope, kf, vf, &in.rope_positions)
                      .ok());
    }
    Status st = (*op)->forward(args);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_TRUE(sync().ok());
    out = *to_host_f32(args.out);
    const Tensor kc = *to_host_f32(args.k_cache), vc = *to_host_f32(args.v_cache);
    newest = *Tensor::empty({B, 2, row_elems}, DataType::kFp32);
    for (int i = 0; i < B; ++i) {
      const int64_t row = positions[static_cast<size_t>(i)];
      std::copy_n(kc.data<float>() + row * row_elems, row_elems,
                  newest.data<float>() + (2 * i) * row_elems);
      std::copy_n(vc.data<float>() + row * row_elems, row_elems,
                  newest.data<float>() + (2 * i + 1) * row_elems);
    }
  };
  Tensor out_raw, newest_raw, out_composed, newest_composed;
  run(true, out_raw, newest_raw);
  run(false, out_composed, newest_composed);
  expect_close(out_raw, out_composed, c.dtype);
  expect_close(newest_raw, newest_composed, c.dtype);
}

std::vector<InputCase> input_cases() {
  std::vector<InputCase> cases;
  for (DataType dtype : {DataType::kFp16, DataType::kBf16}) {
    for (bool norms : {false, true}) {
      for (int grid : {0, 1, 3, 7, 2 * 7 * kKvHeads, 130}) {  // 28: clusters, as above
        cases.push_back({AttentionKind::kFlash2, dtype, false, norms, grid});
      }
      cases.push_back({AttentionKind::kFlash2, dtype, true, norms, 0});  // more units than SMs
      cases.push_back({AttentionKind::kFlash1, dtype, false, norms, 0});
    }
  }
  cases.push_back({AttentionKind::kFlash2, DataType::kFp32, false, true, 0});
  cases.push_back({AttentionKind::kMha, DataType::kFp32, false, true, 0});
  for (DataType dtype : {DataType::kFp16, DataType::kBf16}) {
    cases.push_back({AttentionKind::kFlash2, dtype, false, true, 0, 64});
    cases.push_back({AttentionKind::kFlash2, dtype, false, false, 7, 64});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(
    All, CudaAttentionPagedInput, testing::ValuesIn(input_cases()),
    [](const testing::TestParamInfo<InputCase>& info) {
      const InputCase& c = info.param;
      return std::string(attention_name(c.kind)) + "_" + dtype_name(c.dtype) +
             (c.many ? "_many" : "_mixed") + (c.norms ? "_norms" : "") +
             (c.grid > 0 ? "_grid" + std::to_string(c.grid) : "") + "_d" +
             std::to_string(c.head_dim);
    });

// The 16-bit flash2 decode's default grid (host arithmetic): one block an SM, a multiple of the
// units, while blocks split units; every resident block once there are more units than SMs; and
// a block keeps an SM to itself exactly when the grid fits the SMs one a block.
TEST(AttentionDecodePartition, DefaultGridKeepsAnSmABlockUntilBlocksHoldWholeUnits) {
  using namespace cuda_attention;
  // H100, Qwen3-8B: 8 kv heads a sequence, 264 blocks resident two an SM.
  EXPECT_EQ(decode_default_grid(8, 132, 264), 128);     // batch 1
  EXPECT_EQ(decode_default_grid(64, 132, 264), 128);    // batch 8: two blocks a unit
  EXPECT_EQ(decode_default_grid(132, 132, 264), 132);   // one unit a block
  EXPECT_EQ(decode_default_grid(133, 132, 264), 264);   // past the SMs
  EXPECT_EQ(decode_default_grid(512, 132, 264), 264);   // batch 64
  EXPECT_EQ(decode_default_grid(2048, 132, 132), 132);  // a batch whose lengths fill the SMs
  EXPECT_EQ(decode_default_grid(200, 132, 0), 132);     // never fewer than the SMs
  EXPECT_EQ(decode_default_grid(1, 7, 14), 7);
  for (int units : {1, 8, 64, 132, 133, 512}) {
    const int grid = decode_default_grid(units, 132, 264);
    EXPECT_EQ(decode_block_alone(grid, 132), units <= 132) << units << " units";
  }
}

// The 16-bit flash2 decode's thread block clusters (host arithmetic): exactly where the blocks
// that hold keys are two a unit, pairs; nowhere else.
TEST(AttentionDecodePartition, TwoBlocksAUnitRunAsClustersOfTwo) {
  using namespace cuda_attention;
  EXPECT_EQ(decode_cluster_blocks(128, 64), 2);  // H100, Qwen3-8B at 8 sequences
  EXPECT_EQ(decode_cluster_blocks(2, 1), 2);
  EXPECT_EQ(decode_cluster_blocks(128, 32), 1);  // four a unit: measured slower in clusters
  EXPECT_EQ(decode_cluster_blocks(64, 8), 1);    // eight a unit: no faster
  EXPECT_EQ(decode_cluster_blocks(64, 64), 1);   // one a unit: nothing to combine
  EXPECT_EQ(decode_cluster_blocks(132, 64), 1);  // blocks crossing units
  EXPECT_EQ(decode_cluster_blocks(132, 264), 1);
  // Qwen3-8B's default grid at each batch on 132 SMs: clusters at 6 to 8 sequences (48 to 64
  // units in 96 to 128 blocks), not at 1 to 5 (three or more blocks a unit) or past 8 (one).
  for (int batch = 1; batch <= 16; ++batch) {
    const int units = 8 * batch;
    const int grid = decode_blocks(int64_t{units} * 4096, decode_default_grid(units, 132, 264),
                                   units);
    EXPECT_EQ(decode_cluster_blocks(grid, units), batch >= 6 && batch <= 8 ? 2 : 1) << batch;
  }
}

// The 16-bit flash2 decode's whole-unit runs (host arithmetic): taken only where a batch has
// more units than blocks and runs of whole units fill the grid to within the slack; the blocks
// that hold them are no more than the grid and every one holds at least one unit. The device
// keeps them only where the longest sequence's run stays within decode_unit_run_slack of an even
// share.
TEST(AttentionDecodePartition, WholeUnitRunsFillTheGrid) {
  using namespace cuda_attention;
  EXPECT_EQ(decode_unit_run(512, 264), 2);    // Qwen3-8B, 64 sequences: 256 blocks of 2
  EXPECT_EQ(decode_unit_run(2048, 264), 8);   // 256 sequences: 256 blocks of 8
  EXPECT_EQ(decode_unit_run(300, 264), 0);    // runs of 2 would leave 150 blocks for 264 slots
  EXPECT_EQ(decode_unit_run(264, 264), 0);    // one unit a block already
  EXPECT_EQ(decode_unit_run(64, 128), 0);     // blocks split units
  EXPECT_EQ(decode_unit_run(200, 7), 29);     // 7 blocks, the last of 26
  EXPECT_EQ(decode_unit_run(200, 28), 0);     // runs of 8: 25 blocks of 28
  EXPECT_EQ(decode_unit_run(5, 0), 0);
  bool some = false, none = false;
  for (int units = 1; units <= 3000; units += 7) {
    for (int grid : {1, 3, 7, 100, 132, 264, 512}) {
      const int run = decode_unit_run(units, grid);
      if (run == 0) {
        none = true;
        continue;
      }
      some = true;
      SCOPED_TRACE(std::to_string(units) + " units, grid " + std::to_string(grid));
      const int blocks = (units + run - 1) / run;
      EXPECT_GT(units, grid);
      EXPECT_LE(blocks, grid);
      EXPECT_LT((blocks - 1) * run, units);  // the last block holds at least one unit
      EXPECT_LE(100 * run * grid, (100 + kDecodeUnitRunSlack) * units);
      // Equal lengths keep the runs on the device; one sequence twice the mean does not.
      EXPECT_TRUE(decode_keeps_unit_run(int64_t{units} * 500, 500, run, blocks));
      EXPECT_FALSE(decode_keeps_unit_run(int64_t{units} * 500, 1000, run, blocks));
    }
  }
  EXPECT_TRUE(some && none);
  EXPECT_FALSE(decode_keeps_unit_run(int64_t{512} * 500, 500, 0, 256));  // no run asked
  // The slack is one unit's worth of a block, at least kDecodeUnitRunSlack.
  EXPECT_EQ(decode_unit_run_slack(2), 50);
  EXPECT_EQ(decode_unit_run_slack(3), 34);
  EXPECT_EQ(decode_unit_run_slack(8), 13);
  EXPECT_EQ(decode_unit_run_slack(20), kDecodeUnitRunSlack);
  EXPECT_EQ(decode_unit_run_slack(40), kDecodeUnitRunSlack);
  // Qwen3-8B at 64 and 256 sequences, lengths 448 to 576 (a serving batch's spread): kept; at
  // 256 a sequence of 600 keys is more than one unit's worth of a block of 8.
  EXPECT_TRUE(decode_keeps_unit_run(int64_t{512} * 512, 576, 2, 256));
  EXPECT_FALSE(decode_keeps_unit_run(int64_t{512} * 512, 800, 2, 256));
  EXPECT_TRUE(decode_keeps_unit_run(int64_t{2048} * 512, 576, 8, 256));
  EXPECT_FALSE(decode_keeps_unit_run(int64_t{2048} * 512, 600, 8, 256));
}

// The 16-bit flash2 decode's balanced partition (host arithmetic, no GPU): the blocks tile the
// flattened (unit, key) work exactly, in equal shares to within one key, and decode_block_of
// names the blocks that touch each unit (the partials its combine merges); a grid that is a
// multiple of the units keeps every block inside one. Covers ranges that cross unit
// boundaries, end exactly on one, and units of 1 or 2 keys.
TEST(AttentionDecodePartition, TilesTheWorkEvenly) {
  using namespace cuda_attention;
  bool crossed = false, ended_on_boundary = false;
  for (int units : {1, 2, 3, 4, 8, 16}) {
    for (int len : {1, 2, 3, 63, 64, 65, 95, 96, 97, 127, 191, 193, 1000, 4096, 4097, 32768}) {
      for (int grid : {1, 2, 3, 5, 7, 128, 132, 512}) {
        SCOPED_TRACE(std::to_string(units) + " units, len " + std::to_string(len) + ", grid " +
                     std::to_string(grid));
        const int64_t work = static_cast<int64_t>(units) * len;
        const int blocks = decode_blocks(work, grid, units);
        ASSERT_GE(blocks, 1);
        ASSERT_LE(blocks, grid);
        const int64_t most = (work + kDecodeMinBlockKeys - 1) / kDecodeMinBlockKeys;
        if (blocks < grid) {
          EXPECT_LE(blocks, most);
          EXPECT_GT(blocks + units, most);  // rounded down by less than one per unit
          if (most >= units) EXPECT_EQ(blocks % units, 0);
        }
        // A grid that is a multiple of the units (the default) never crosses a unit boundary.
        const bool aligned = grid % units == 0 && blocks % units == 0;
        ASSERT_EQ(decode_block_begin(work, blocks, 0), 0);
        ASSERT_EQ(decode_block_begin(work, blocks, blocks), work);
        std::vector<int> touching_first(units, -1), touching_last(units, -1);
        for (int b = 0; b < blocks; ++b) {
          const int64_t lo = decode_block_begin(work, blocks, b);
          const int64_t hi = decode_block_begin(work, blocks, b + 1);
          ASSERT_GE(hi - lo, work / blocks);
          ASSERT_LE(hi - lo, work / blocks + 1);
          ASSERT_EQ(decode_block_of(work, blocks, lo), b);
          ASSERT_EQ(decode_block_of(work, blocks, hi - 1), b);
          for (int u = static_cast<int>(lo / len); u <= (hi - 1) / len; ++u) {
            if (touching_first[u] < 0) touching_first[u] = b;
            touching_last[u] = b;
          }
          if ((lo / len) != ((hi - 1) / len)) {
            crossed = true;
            EXPECT_FALSE(aligned) << "block " << b << " crosses a unit boundary";
          }
          if (hi % len == 0 && hi < work && len > 1) ended_on_boundary = true;
        }
        for (int u = 0; u < units; ++u) {
          const int64_t u0 = static_cast<int64_t>(u) * len;
          EXPECT_EQ(decode_block_of(work, blocks, u0), touching_first[u]);
          EXPECT_EQ(decode_block_of(work, blocks, u0 + len - 1), touching_last[u]);
          EXPECT_LE(touching_last[u] - touching_first[u] + 1, blocks);
        }
      }
    }
  }
  EXPECT_TRUE(crossed);
  EXPECT_TRUE(ended_on_boundary);
}

#ifdef KUIPER_WITH_CUDA
// A problem's q and caches on the device, out poisoned with NaN, and a device position tensor
// (unset).
AttentionArgs device_args(const Problem& p, DataType dtype) {
  AttentionArgs args;
  args.q = *to_device(p.q, dtype);
  args.k_cache = *to_device(p.k, dtype);
  args.v_cache = *to_device(p.v, dtype);
  args.out = *nan_tensor(p.q.shape(), dtype);
  args.device_position = *Tensor::empty({1}, DataType::kInt32, DeviceType::kCuda);
  return args;
}

// Captures one decode step of a device-position op (after a warm-up call at max_pos, which
// allocates its buffers outside the capture) and replays it at each position, as the CUDA-graph
// decode loop does: only the device position changes between replays. Each replay is checked
// against the CPU reference over the same cache prefix.
void replay_at_positions(const AttentionRequest& request, int group, int max_pos,
                         std::initializer_list<int32_t> positions) {
  const DataType dtype = request.dtype;
  auto op = make_attention(request);
  ASSERT_TRUE(op.ok()) << op.status().message();
  const Problem& p = problem_for(dtype, static_cast<int>(request.head_dim), group, 1, max_pos);
  AttentionArgs args = device_args(p, dtype);
  int32_t* pos_dev = args.device_position.data<int32_t>();
  cudaStream_t s = cuda::stream();
  int32_t pos = max_pos;
  ASSERT_EQ(cudaMemcpyAsync(pos_dev, &pos, 4, cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_TRUE((*op)->forward(args).ok());
  ASSERT_TRUE(sync().ok());

  Result<DeviceGraph> graph = DeviceGraph::capture([&] { return (*op)->forward(args); });
  ASSERT_OK(graph);
  for (int32_t at : positions) {
    SCOPED_TRACE("position " + std::to_string(at));
    pos = at;
    ASSERT_EQ(cudaMemcpyAsync(pos_dev, &pos, 4, cudaMemcpyHostToDevice, s), cudaSuccess);
    ASSERT_TRUE(args.out.copy_from(*nan_tensor(p.q.shape(), dtype)).ok());
    ASSERT_OK(graph->replay());
    ASSERT_TRUE(sync().ok());
    Tensor ref = *Tensor::empty(p.q.shape(), DataType::kFp32);
    cpu::attention(p.q, p.k, p.v, ref, at);
    expect_close(*to_host_f32(args.out), ref, dtype);
  }
}

// The 16-bit activation types: each graph test below runs for both.
constexpr DataType kHalfTypes[] = {DataType::kFp16, DataType::kBf16};

// Every kind's device-position decode, captured once and replayed at several positions.
TEST(CudaAttentionGraph, ReplaysAtAnyPosition) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (DataType dtype : kHalfTypes) {
    for (AttentionKind kind :
         {AttentionKind::kMha, AttentionKind::kFlash1, AttentionKind::kFlash2}) {
      SCOPED_TRACE(std::string(attention_name(kind)) + " " + dtype_name(dtype));
      const AttentionRequest request{kind, AttentionPhase::kDecode, dtype, DeviceType::kCuda,
                                     true, 128};
      replay_at_positions(request, 4, 3000, {5, 700, 3000});
    }
  }
}

// The flash2 fp16/bf16 decode graph replayed at short, odd, tile-edge and long positions for GQA
// groups of 4, 8 and 16 and block counts that cross kv-head boundaries (3, 5) or not (the SM
// count's default), launched with PDL and without: the partition is recomputed on the device
// from each position.
TEST(CudaAttentionGraph, Flash2BalancedPartitionReplays) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (DataType dtype : kHalfTypes) {
    for (int group : {4, 8, 16}) {
      for (int blocks : {0, 3, 5}) {
        for (bool pdl : {true, false}) {
          SCOPED_TRACE(std::string(dtype_name(dtype)) + " group " + std::to_string(group) +
                       " blocks " + std::to_string(blocks) + (pdl ? " pdl" : " no pdl"));
          AttentionRequest request{AttentionKind::kFlash2, AttentionPhase::kDecode, dtype,
                                   DeviceType::kCuda, true, 128};
          request.decode_grid = blocks;
          request.pdl = pdl;
          replay_at_positions(request, group, 2999, {0, 1, 2, 62, 63, 64, 128, 777, 2999, 5});
        }
      }
    }
  }
}

// PDL: two flash2 decodes back to back, the second reading the first's output as its query.
// The first triggers its dependents at its start, so the second runs early and is correct only
// if it waits for the first before reading q (an early read sees the NaN poison). Eager and in
// a graph.
void decode_waits_for_the_kernel_before(DataType dtype) {
  const int d = 128, group = 4, at = 4000;
  AttentionRequest request{AttentionKind::kFlash2, AttentionPhase::kDecode, dtype,
                           DeviceType::kCuda, true, d};
  auto first = make_attention(request);
  auto second = make_attention(request);
  ASSERT_TRUE(first.ok() && second.ok());
  const Problem& p = problem_for(dtype, d, group, 1, at);
  AttentionArgs a1 = device_args(p, dtype);
  cudaStream_t s = cuda::stream();
  const int32_t pos = at;
  ASSERT_EQ(cudaMemcpyAsync(a1.device_position.data<int32_t>(), &pos, 4, cudaMemcpyHostToDevice, s),
            cudaSuccess);
  AttentionArgs a2 = a1;
  a2.q = a1.out;
  a2.out = *nan_tensor(p.q.shape(), dtype);
  auto check = [&]() {
    Tensor q2 = *to_host_f32(a1.out);  // exactly the values the second kernel read
    expect_close(q2, p.ref, dtype);
    Tensor ref = *Tensor::empty(p.q.shape(), DataType::kFp32);
    cpu::attention(q2, p.k, p.v, ref, at);
    expect_close(*to_host_f32(a2.out), ref, dtype);
  };
  auto poison = [&]() {
    ASSERT_TRUE(a1.out.copy_from(*nan_tensor(p.q.shape(), dtype)).ok());
    ASSERT_TRUE(a2.out.copy_from(*nan_tensor(p.q.shape(), dtype)).ok());
  };
  for (int run = 0; run < 3; ++run) {  // eager (the first also allocates the scratch)
    poison();
    ASSERT_TRUE((*first)->forward(a1).ok());
    ASSERT_TRUE((*second)->forward(a2).ok());
    ASSERT_TRUE(sync().ok());
    check();
  }
  Result<DeviceGraph> graph = DeviceGraph::capture([&]() -> Status {
    KUIPER_RETURN_IF_ERROR((*first)->forward(a1));
    return (*second)->forward(a2);
  });
  ASSERT_OK(graph);
  for (int run = 0; run < 3; ++run) {
    poison();
    ASSERT_OK(graph->replay());
    ASSERT_TRUE(sync().ok());
    check();
  }
}

TEST(CudaAttentionGraph, Flash2DecodeWaitsForTheKernelBefore) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (DataType dtype : kHalfTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    decode_waits_for_the_kernel_before(dtype);
  }
}

// Runs `launch` eagerly three times, then captured in a graph and replayed three times; before
// each run `prepare` resets the inputs, after it `check` compares.
template <typename Prepare, typename Launch, typename Check>
void eager_then_graph(Prepare prepare, Launch launch, Check check) {
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE("eager run " + std::to_string(run));
    prepare();
    ASSERT_TRUE(launch().ok());
    ASSERT_TRUE(sync().ok());
    check();
  }
  Result<DeviceGraph> graph = DeviceGraph::capture([&] { return launch(); });
  ASSERT_OK(graph);
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE("graph replay " + std::to_string(run));
    prepare();
    ASSERT_OK(graph->replay());
    ASSERT_TRUE(sync().ok());
    check();
  }
}

// PDL, as in a decode step: qk_norm_rope_cache (launched with PDL, it lets the attention start
// right after its own wait) writes the rotated q and the newest K/V row; the flash2 decode,
// which starts loading its first tiles before its wait, must see both. The newest cache row
// starts as NaN, so a tile of it read early poisons the output. Positions cover a range too
// short for early loads (1 block), the newest row inside a block's first tiles and past them.
void decode_sees_the_row_written_just_before(DataType dtype) {
  const int d = 128, kvh = 8, heads = 32;
  for (int pos : {40, 1000, 4000, 9000}) {
    SCOPED_TRACE("position " + std::to_string(pos));
    const int max_ctx = pos + 3;
    AttentionRequest request{AttentionKind::kFlash2, AttentionPhase::kDecode, dtype,
                             DeviceType::kCuda, true, d};
    auto attention = make_attention(request);
    ASSERT_TRUE(attention.ok());
    const uint32_t seed = 100 + pos;
    const Tensor q0 = random_host({1, heads, d}, dtype, -3.0f, 3.0f, seed);
    const Tensor k0 = random_host({1, kvh, d}, dtype, -1.0f, 1.0f, seed + 1);
    const Tensor v0 = random_host({1, kvh * d}, dtype, -1.0f, 1.0f, seed + 2);
    Tensor k_host = random_host({max_ctx, kvh * d}, dtype, -1.0f, 1.0f, seed + 3);
    Tensor v_host = random_host({max_ctx, kvh * d}, dtype, -1.0f, 1.0f, seed + 4);
    for (int64_t i = static_cast<int64_t>(pos) * kvh * d; i < k_host.numel(); ++i) {
      k_host.data<float>()[i] = NAN;  // the newest row (written by the op before) and beyond
      v_host.data<float>()[i] = NAN;
    }
    const Tensor k_poisoned = *to_device(k_host, dtype), v_poisoned = *to_device(v_host, dtype);
    Tensor q = *to_device(q0, dtype), k = *to_device(k0, dtype), v = *to_device(v0, dtype);
    Tensor k_cache = *to_device(k_host, dtype), v_cache = *to_device(v_host, dtype);
    Tensor positions = *Tensor::empty({1}, DataType::kInt32, DeviceType::kCuda);
    ASSERT_TRUE(kuiper::copy_bytes(positions.raw(), DeviceType::kCuda, &pos, DeviceType::kCpu, 4).ok());
    AttentionArgs args;
    args.q = q;
    args.k_cache = *k_cache.reshape({max_ctx, kvh, d});
    args.v_cache = *v_cache.reshape({max_ctx, kvh, d});
    args.out = *nan_tensor({1, heads, d}, dtype);
    args.device_position = positions;
    auto prepare = [&]() {
      ASSERT_TRUE(q.copy_from(*to_device(q0, dtype)).ok());  // RoPE works in place
      ASSERT_TRUE(k.copy_from(*to_device(k0, dtype)).ok());
      ASSERT_TRUE(k_cache.copy_from(k_poisoned).ok());
      ASSERT_TRUE(v_cache.copy_from(v_poisoned).ok());
      ASSERT_TRUE(args.out.copy_from(*nan_tensor({1, heads, d}, dtype)).ok());
    };
    auto launch = [&]() -> Status {
      KUIPER_RETURN_IF_ERROR(qk_norm_rope_cache(q, k, v, nullptr, nullptr, 1e-6, positions,
                                                1e6, k_cache, v_cache));
      return (*attention)->forward(args);
    };
    auto check = [&]() {
      // The reference reads what the GPU holds after the step: the rotated q and the cache with
      // the newest row written (checked to be finite, i.e. written).
      const Tensor qr = *to_host_f32(q);
      const Tensor kc = *to_host_f32(*k_cache.reshape({max_ctx, kvh, d}));
      const Tensor vc = *to_host_f32(*v_cache.reshape({max_ctx, kvh, d}));
      for (int i = 0; i < kvh * d; ++i) {
        ASSERT_TRUE(std::isfinite(kc.data<float>()[static_cast<int64_t>(pos) * kvh * d + i]));
        ASSERT_EQ(vc.data<float>()[static_cast<int64_t>(pos) * kvh * d + i], v0.data<float>()[i]);
      }
      Tensor ref = *Tensor::empty({1, heads, d}, DataType::kFp32);
      cpu::attention(qr, kc, vc, ref, pos);
      expect_close(*to_host_f32(args.out), ref, dtype);
    };
    eager_then_graph(prepare, launch, check);
  }
}

TEST(CudaAttentionGraph, Flash2DecodeSeesTheRowWrittenJustBefore) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (DataType dtype : kHalfTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    decode_sees_the_row_written_just_before(dtype);
  }
}

// PDL with a position that changes under the kernel: the decode before writes its output into
// the memory the second decode reads its position from. The first's values of V for kv head 0
// are all one vector whose first two 16-bit values have the bits of int32 `pos` (low half first),
// so head 0's output, dims 0-1, is exactly that position. Before it lands the memory holds the
// NaN poison (clamped: the last cache row), which a block starting early reads as its guess; the
// output must be attention at `pos`.
void decode_rereads_a_position_written_just_before(DataType dtype) {
  // 3000 (0x0BB8): a normal fp16 and a normal bf16, then +0.
  const int d = 128, group = 4, at = 4000, pos = 3000;
  auto from_bits = [dtype](uint16_t bits) {
    return dtype == DataType::kFp16 ? fp16_to_float(bits) : bf16_to_float(bits);
  };
  AttentionRequest request{AttentionKind::kFlash2, AttentionPhase::kDecode, dtype,
                           DeviceType::kCuda, true, d};
  auto first = make_attention(request);
  auto second = make_attention(request);
  ASSERT_TRUE(first.ok() && second.ok());
  const Problem& p = problem_for(dtype, d, group, 1, at);
  Tensor v1 = *Tensor::empty(p.v.shape(), DataType::kFp32);
  std::copy(p.v.data<float>(), p.v.data<float>() + p.v.numel(), v1.data<float>());
  const float low = from_bits(static_cast<uint16_t>(pos & 0xFFFF));
  const float high = from_bits(static_cast<uint16_t>(pos >> 16));
  for (int t = 0; t <= at; ++t) {  // kv head 0 of every row in the context
    float* row = v1.data<float>() + static_cast<int64_t>(t) * kKvHeads * d;
    row[0] = low;
    row[1] = high;
    for (int i = 2; i < d; ++i) row[i] = p.v.data<float>()[i];  // row 0's values
  }
  AttentionArgs a1 = device_args(p, dtype);
  a1.v_cache = *to_device(v1, dtype);
  ASSERT_TRUE(kuiper::copy_bytes(a1.device_position.raw(), DeviceType::kCuda, &at,
                                 DeviceType::kCpu, 4).ok());
  AttentionArgs a2;
  a2.q = a1.q;
  a2.k_cache = *to_device(p.k, dtype);
  a2.v_cache = *to_device(p.v, dtype);
  a2.out = *nan_tensor(p.q.shape(), dtype);
  a2.device_position = Tensor::view(a1.out.raw(), {1}, DataType::kInt32, DeviceType::kCuda);
  Tensor ref = *Tensor::empty(p.q.shape(), DataType::kFp32);
  cpu::attention(p.q, p.k, p.v, ref, pos);
  auto prepare = [&]() {
    ASSERT_TRUE(a1.out.copy_from(*nan_tensor(p.q.shape(), dtype)).ok());
    ASSERT_TRUE(a2.out.copy_from(*nan_tensor(p.q.shape(), dtype)).ok());
  };
  auto launch = [&]() -> Status {
    KUIPER_RETURN_IF_ERROR((*first)->forward(a1));
    return (*second)->forward(a2);
  };
  auto check = [&]() {
    int32_t written = 0;
    ASSERT_TRUE(kuiper::copy_bytes(&written, DeviceType::kCpu, a1.out.raw(), DeviceType::kCuda, 4).ok());
    ASSERT_EQ(written, pos);
    expect_close(*to_host_f32(a2.out), ref, dtype);
  };
  eager_then_graph(prepare, launch, check);
}

TEST(CudaAttentionGraph, Flash2DecodeRereadsAPositionWrittenJustBefore) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (DataType dtype : kHalfTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    decode_rereads_a_position_written_just_before(dtype);
  }
}

// The paged device-position decode of every kind, captured once and replayed after the batch's
// state changed in device memory: new starts, block tables (another scramble of the pool), q and
// pool contents, and back. The grid is sized for the tables' W * block_size keys a sequence.
TEST(CudaAttentionGraph, PagedDecodeReplaysWithNewStartsAndTables) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int d = 128, bs = 16, width = 21, pool_blocks = 120;
  const Sequences first = {{1, 0}, {1, 40}, {1, 300}, {1, 17}, {1, 129}};
  const Sequences second = {{1, 299}, {1, 5}, {1, 64}, {1, 0}, {1, 200}};
  for (DataType dtype : {DataType::kFp32, DataType::kFp16, DataType::kBf16}) {
    const PagedProblem p1 = make_paged_problem(dtype, d, bs, first, 11, width, pool_blocks);
    const PagedProblem p2 = make_paged_problem(dtype, d, bs, second, 12, width, pool_blocks);
    for (AttentionKind kind :
         {AttentionKind::kMha, AttentionKind::kFlash1, AttentionKind::kFlash2}) {
      SCOPED_TRACE(std::string(attention_name(kind)) + " " + dtype_name(dtype));
      auto op = make_attention(
          {kind, AttentionPhase::kDecode, dtype, DeviceType::kCuda, true, d});
      ASSERT_TRUE(op.ok()) << op.status().message();
      AttentionArgs args = paged_device_args(p1, dtype);
      ASSERT_OK((*op)->forward(args));  // allocates the op's buffers outside the capture
      ASSERT_TRUE(sync().ok());
      Result<DeviceGraph> graph = DeviceGraph::capture([&] { return (*op)->forward(args); });
      ASSERT_OK(graph);
      for (const PagedProblem* p : {&p2, &p1, &p2}) {
        const int64_t B = static_cast<int64_t>(p->seqs.size());
        ASSERT_OK(args.q.copy_from(*to_device(p->q, dtype)));
        ASSERT_OK(args.k_cache.copy_from(*to_device(p->k, dtype)));
        ASSERT_OK(args.v_cache.copy_from(*to_device(p->v, dtype)));
        ASSERT_OK(args.paged.starts.copy_from(*int_tensor_on_device(p->starts, {B})));
        ASSERT_OK(args.paged.block_tables.copy_from(
            *int_tensor_on_device(p->tables, {B, p->width})));
        ASSERT_OK(args.out.copy_from(*nan_tensor(p->q.shape(), dtype)));
        ASSERT_TRUE(sync().ok());
        ASSERT_OK(graph->replay());
        ASSERT_TRUE(sync().ok());
        expect_close(*to_host_f32(args.out), p->ref, dtype);
      }
    }
  }
}

// A decode graph padded past its step's sequences (PagedBatch::live, as the model's graph buckets
// are): captured once, replayed with fewer and fewer live sequences. The flash2 16-bit decode
// leaves the pads' rows of out as they were (NaN here) and gives every live sequence its
// reference output, in each of its partitions: the balanced split (random lengths, default grid
// and 130 blocks), whole-unit runs (even lengths, 100 blocks of 2 units: kept at 99 live, when
// the last block holds only pads, refused at 97), a block a live unit where they fit the grid
// (even lengths, 50 live on 100 blocks; random lengths where they allow it) and pairs of blocks a
// unit (28 blocks over the mixed batch: clusters on sm_90, whose pads' pairs hold no keys).
TEST(CudaAttentionGraph, Flash2DecodeSkipsThePadsPastLive) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  struct PadCase {
    Batch batch;
    int grid;
    std::vector<int32_t> lives;
  };
  const PadCase cases[] = {{Batch::kMany, 0, {100, 99, 61, 1}},
                           {Batch::kMany, 130, {100, 77, 2}},
                           {Batch::kEven, 100, {100, 99, 97, 50}},
                           {Batch::kMixed, 2 * 7 * kKvHeads, {7, 6, 3, 1}}};
  for (DataType dtype : {DataType::kFp16, DataType::kBf16}) {
    for (const PadCase& c : cases) {
      const PagedCase pc{AttentionKind::kFlash2, AttentionPhase::kDecode, dtype, true, 128, 16,
                         c.batch, c.grid};
      const PagedProblem& p = paged_problem_for(pc);
      const int B = static_cast<int>(p.seqs.size());
      AttentionRequest request{AttentionKind::kFlash2, AttentionPhase::kDecode, dtype,
                               DeviceType::kCuda, true, 128};
      request.decode_grid = c.grid;
      auto op = make_attention(request);
      ASSERT_OK(op);
      AttentionArgs args = paged_device_args(p, dtype);
      args.paged.live = *int_tensor_on_device({B}, {1});
      ASSERT_OK((*op)->forward(args));  // the op's buffers, outside the capture
      ASSERT_TRUE(sync().ok());
      Result<DeviceGraph> graph = DeviceGraph::capture([&] { return (*op)->forward(args); });
      ASSERT_OK(graph);
      for (int32_t live : c.lives) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + batch_name(c.batch) + " grid " +
                     std::to_string(c.grid) + ", " + std::to_string(live) + " of " +
                     std::to_string(B) + " live");
        ASSERT_OK(args.paged.live.copy_from(*int_tensor_on_device({live}, {1})));
        ASSERT_OK(args.out.copy_from(*nan_tensor(p.q.shape(), dtype)));
        ASSERT_TRUE(sync().ok());
        ASSERT_OK(graph->replay());
        ASSERT_TRUE(sync().ok());
        const Tensor got = *to_host_f32(args.out);
        expect_close(got.rows(0, live), p.ref.rows(0, live), dtype);
        const Tensor pads = got.rows(live, B - live);
        int64_t written = 0;
        for (int64_t i = 0; i < pads.numel(); ++i) written += !std::isnan(pads.data<float>()[i]);
        EXPECT_EQ(written, 0) << "elements of the pads' rows written";
      }
    }
  }
}

// The paged form's host checks: metadata shapes, one query a sequence in decode, a block size
// that divides the pool, launch bounds that fit the tables.
TEST(CudaAttentionDispatch, RefusesMalformedPagedCalls) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const PagedProblem p = make_paged_problem(DataType::kFp16, 64, 16,
                                            mixed_sequences(AttentionPhase::kPrefill), 5);
  auto prefill = make_attention(
      {AttentionKind::kFlash2, AttentionPhase::kPrefill, DataType::kFp16, DeviceType::kCuda,
       false, 64});
  auto decode = make_attention(
      {AttentionKind::kFlash2, AttentionPhase::kDecode, DataType::kFp16, DeviceType::kCuda,
       false, 64});
  ASSERT_TRUE(prefill.ok() && decode.ok());
  const AttentionArgs good = paged_device_args(p, DataType::kFp16);
  ASSERT_OK((*prefill)->forward(good));
  auto refused = [&](AttentionOp& op, const AttentionArgs& a, const std::string& words) {
    Status st = op.forward(a);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find(words), std::string::npos) << st.message();
  };
  refused(**decode, good, "one query per sequence");
  AttentionArgs a = good;
  a.paged.block_size = 0;
  refused(**prefill, a, "block_size");
  a = good;
  a.paged.max_queries = 0;
  refused(**prefill, a, "max_queries");
  a = good;
  a.paged.max_keys = p.width * p.block_size + 1;
  refused(**prefill, a, "max_keys");
  a = good;
  a.paged.starts = *Tensor::empty({3}, DataType::kInt32, DeviceType::kCuda);
  refused(**prefill, a, "[B + 1], [B], [B, W]");
  a = good;
  a.paged.block_tables = *Tensor::empty({static_cast<int64_t>(p.seqs.size()) * p.width},
                                        DataType::kInt32, DeviceType::kCuda);
  refused(**prefill, a, "int32");
  a = good;
  a.paged.live = *Tensor::empty({2}, DataType::kInt32, DeviceType::kCuda);
  refused(**prefill, a, "live");
}

TEST(CudaAttentionDispatch, RefusesUnsupportedCombinationsByName) {
  auto message = [](AttentionRequest r) {
    r.device = DeviceType::kCuda;
    auto op = make_attention(r);
    return op.ok() ? std::string("accepted") : op.status().message();
  };
  AttentionRequest r{AttentionKind::kFlash2, AttentionPhase::kDecode, DataType::kFp16,
                     DeviceType::kCuda, false, 96};
  EXPECT_NE(message(r).find("flash2 decode fp16 head_dim 96"), std::string::npos) << message(r);
  r.head_dim = 128;
  r.dtype = DataType::kInt8;
  EXPECT_NE(message(r).find("flash2 decode int8 head_dim 128: unsupported dtype"),
            std::string::npos)
      << message(r);
  // Every kind and phase runs bf16 (on a machine with a GPU; without one, the refusal says so).
  r.dtype = DataType::kBf16;
  const std::string expected = cuda_available() ? "accepted" : "no usable CUDA device";
  for (AttentionKind kind : {AttentionKind::kMha, AttentionKind::kFlash1, AttentionKind::kFlash2}) {
    for (AttentionPhase phase : {AttentionPhase::kPrefill, AttentionPhase::kDecode}) {
      r.kind = kind;
      r.phase = phase;
      EXPECT_NE(message(r).find(expected), std::string::npos) << message(r);
    }
  }
  r.device_position = true;  // the graph-safe decode
  EXPECT_NE(message(r).find(expected), std::string::npos) << message(r);
  r.dtype = DataType::kFp16;
  r.phase = AttentionPhase::kPrefill;
  r.device_position = true;
  EXPECT_NE(message(r).find("device-position"), std::string::npos) << message(r);
}
#endif

}  // namespace
}  // namespace kuiper::op
