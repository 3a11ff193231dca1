// Sampling on the device, so a decode step copies back 4-byte tokens instead of logits rows.
// The arithmetic follows the CPU reference (kernels/cpu/sample.cpp) step for step, so the two
// pick the same token for the same uniform draw except where a probability lands within a
// rounding of a boundary. One pipeline serves op::sample (one row) and op::sample_rows (S rows,
// each with its own SampleRow in a device table):
//   1. keys[r][i] = row r's penalised(logit[i]) * (1 / temperature) as a sort key with r above
//      it, ids[r][i] = i;
//   2. one radix sort of all S * V (key, id) pairs (S up to kRowsPerSort, more rows take several
//      sorts): rows stay apart (r is the key's top bits) and each comes out most likely first;
//      the sort is stable, so equal logits keep the lower id first, the CPU's tie rule;
//   3. one block a row over its first n = top_k (or V) sorted keys: softmax in double, top-p
//      prefix, min-p cut, renormalise (where the row may cut: cuts_vocabulary), inverse-CDF
//      draw at the host's uniform over the kept tokens in id order (as torch.multinomial walks
//      them), its sums in probability units (draw_by_id); greedy rows take the first key, the
//      arg-max.
// Where at least kSelectMinRows rows each keep at most kSelectMost tokens (top_k in [1,
// kSelectMost], or greedy: one), steps 1 and 2 are cheaper (the sort of S * V pairs was about
// 0.5 ms of a 64-sequence step, 2.5 ms of a 256-sequence one):
//   1'. keys of 32 bits, no ids, the rows apart by place only;
//   2'. one block a row finds its n-th smallest key by radix select (three passes of a shared
//      histogram over the row), gathers the keys below it and, in id order, as many equal to it
//      as n needs (the stable sort's tie rule), and sorts those n (key, id) pairs; step 3 reads
//      them as it reads the sort's.
// Rows that draw from the whole vocabulary but for top-p and min-p (top-k 0: the OpenAI API's
// default, whatever top-p and min-p), in a group of any size, take 1' and, instead of 2' and 3:
//   2''. a chain of kernels, each row cut into chunks of a block each, forms the softmax over the
//      unsorted keys, finds top-p's cut as the token at which the running sum along the sorted
//      order reaches top_p, by the same radix passes with each bin's sum instead of its count,
//      then the id among the keys equal to it; min-p's cut is a bound on the probability; the
//      draw sums the kept tokens' probabilities in id order by runs of ids and walks them
//      (sample_whole.cu).
// Any other row (top-k above kSelectMost and below V) sends its group of rows to the sort. The
// sums run in another order than the CPU's (as the block reductions of step 3 already do), so the
// rule above holds: the same token but within a rounding of a boundary.
// op::sample's greedy rows without the penalty are the arg-max kernel over the logits.
#include <cub/cub.cuh>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"
#include "kuiper/op/kernels/cuda/sample_keys.cuh"
#include "kuiper/op/kernels/cuda/sample_whole.h"

namespace kuiper::cuda {

namespace {

using namespace sampling;

// Rows sorted together at most: the workspace holds 24 bytes per row and vocabulary entry (233 MB
// for 64 rows of Qwen's 151936), allocated after the KV pool took its share of the memory, and
// 64 rows already fill the GPU (one sort of 256 rows is only about a tenth faster than four).
constexpr int64_t kRowsPerSort = 64;
// The fewest rows the select takes: a block a row leaves the GPU idle below that, where the sort
// of one row uses all of it (H200, Qwen's vocabulary, with the copy back: one row 0.123 ms
// selected against 0.105 sorted; 8 rows 0.124 against 0.161, 64 rows 0.169 against 0.627).
constexpr int64_t kSelectMinRows = 4;

__device__ float inv_temperature(const op::SampleParams& p) {
  return p.temperature == 0.0f ? 1.0f : __fdiv_rn(1.0f, p.temperature);
}

// The sort key of warped logit v in row r: r in the top 32 bits above order_key(v), so an
// ascending sort gives the rows in order and each most likely first.
__device__ uint64_t sort_key(int64_t r, float v) {
  return (static_cast<uint64_t>(r) << 32) | order_key(v);
}

// Where a row's key goes: the sort's (key, id) pairs, or only the select's 32-bit key.
__device__ void store_key(uint64_t* keys, int64_t r, int64_t V, int64_t i, float v) {
  keys[r * V + i] = sort_key(r, v);
}
__device__ void store_key(uint32_t* keys, int64_t r, int64_t V, int64_t i, float v) {
  keys[r * V + i] = order_key(v);
}

// Grid (V / 256, S): row r's keys (and ids, where not null).
template <typename Key>
__global__ void scale_kernel(const float* __restrict__ logits,
                             const op::SampleRow* __restrict__ rows, int64_t V,
                             Key* __restrict__ keys, int32_t* __restrict__ ids) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= V) return;
  const int64_t r = blockIdx.y;
  const op::SampleRow& row = rows[r];
  store_key(keys, r, V, i, __fmul_rn(logits[row.row * V + i], inv_temperature(row.params)));
  if (ids != nullptr) ids[r * V + i] = static_cast<int32_t>(i);
}

// Grid (longest window / 256, S), one thread per recent id of row r. A repeated id is written by
// several threads, all with the same value computed from the unpenalised logit, so it is
// penalised once, as on the CPU.
template <typename Key>
__global__ void penalty_kernel(const float* __restrict__ logits,
                               const op::SampleRow* __restrict__ rows,
                               const int32_t* __restrict__ recent, int64_t V,
                               Key* __restrict__ keys) {
  const int64_t r = blockIdx.y;
  const op::SampleRow& row = rows[r];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const float penalty = row.params.repeat_penalty;
  if (j >= row.recent_count || penalty == 1.0f) return;
  const int32_t id = recent[row.recent_begin + j];
  if (id < 0 || id >= V) return;
  const float v = logits[row.row * V + id];
  const float p = v > 0.0f ? __fdiv_rn(v, penalty) : __fmul_rn(v, penalty);
  store_key(keys, r, V, id, __fmul_rn(p, inv_temperature(row.params)));
}

// The tokens row r keeps at most: one greedy, else top_k (0: all).
__device__ int64_t kept_most(const op::SampleParams& p, int64_t V) {
  if (p.temperature == 0.0f) return 1;
  return p.top_k > 0 && p.top_k < V ? p.top_k : V;
}

// Step 2' of the file comment. Block r, over row r's 32-bit keys (ascending: most likely first),
// leaves its n = kept_most() <= kSelectMost smallest (key, id) pairs, in the stable sort's order,
// at the start of row r of sorted_keys / sorted_ids (as the sort's pairs: the key in the low 32
// bits).
using SelectSort = cub::BlockRadixSort<uint64_t, kThreads, 1>;
// One phase at a time: the histogram (select), the candidates (gather), the sort's storage (once
// every thread holds its candidate).
union SelectPhases {
  unsigned histogram[kBins];
  uint64_t candidates[kSelectMost];
  typename SelectSort::TempStorage sort;
};

__global__ void __launch_bounds__(kThreads)
    select_kernel(const uint32_t* __restrict__ keys, int64_t V,
                  const op::SampleRow* __restrict__ rows, uint64_t* __restrict__ sorted_keys,
                  int32_t* __restrict__ sorted_ids) {
  __shared__ SelectPhases phase;
  __shared__ typename SelectScan::TempStorage scan;
  __shared__ unsigned shared_bin, shared_below, shared_count, shared_less, shared_equal;
  unsigned* const histogram = phase.histogram;
  uint64_t* const candidates = phase.candidates;
  const int64_t r = blockIdx.x;
  if (draws_whole(rows[r].params, V)) return;  // the whole-row chain's (step 2'')
  const uint32_t* row = keys + r * V;
  const unsigned n = static_cast<unsigned>(kept_most(rows[r].params, V));
  const int t = threadIdx.x;

  // The n-th smallest key, 11 + 11 + 10 bits from the top; `wanted` ends as the number of keys
  // equal to it that the n smallest hold.
  uint32_t prefix = 0, mask = 0;
  unsigned wanted = n;
  for (int shift = 32 - kDigitBits; shift > -kDigitBits; shift -= kDigitBits) {
    const int low = shift < 0 ? 0 : shift;
    const uint32_t digit_mask = (1u << (shift + kDigitBits - low)) - 1u;
    histogram[2 * t] = 0;
    histogram[2 * t + 1] = 0;
    __syncthreads();
    for (int64_t i = t; i < V; i += kThreads) {
      const uint32_t k = row[i];
      if ((k & mask) == prefix) atomicAdd(&histogram[(k >> low) & digit_mask], 1u);
    }
    __syncthreads();
    const unsigned h0 = histogram[2 * t], h1 = histogram[2 * t + 1];
    unsigned before = 0;
    SelectScan(scan).ExclusiveSum(h0 + h1, before);
    if (before < wanted && wanted <= before + h0) {
      shared_bin = 2 * t;
      shared_below = before;
      shared_count = h0;
    } else if (before + h0 < wanted && wanted <= before + h0 + h1) {
      shared_bin = 2 * t + 1;
      shared_below = before + h0;
      shared_count = h1;
    }
    __syncthreads();
    prefix |= shared_bin << low;
    mask |= digit_mask << low;
    wanted -= shared_below;
    __syncthreads();  // shared_bin and the histogram are read before the next pass writes them
  }
  const uint32_t threshold = prefix;
  const unsigned less = n - wanted;
  const unsigned equals = shared_count;  // keys equal to the threshold in the row

  // The keys below the threshold, in any order (the sort below orders them), then `wanted` of
  // those equal to it. Where the n smallest hold every equal key (no tie across the threshold:
  // the usual case), in any order too; else the lowest ids, ranked by a scan of each tile (ids
  // rise along a tile and from tile to tile), carried.
  if (t == 0) {
    shared_less = 0;
    shared_equal = 0;
  }
  __syncthreads();
  if (equals == wanted) {
    for (int64_t i = t; i < V; i += kThreads) {
      const uint32_t k = row[i];
      if (k > threshold) continue;
      const uint64_t pair = (static_cast<uint64_t>(k) << 32) | static_cast<uint32_t>(i);
      if (k < threshold) {
        candidates[atomicAdd(&shared_less, 1u)] = pair;
      } else {
        candidates[less + atomicAdd(&shared_equal, 1u)] = pair;
      }
    }
  } else {
    unsigned equal_before = 0;
    for (int64_t base = 0; base < V; base += kThreads) {
      const int64_t i = base + t;
      const uint32_t k = i < V ? row[i] : 0xffffffffu;
      const bool equal = i < V && k == threshold;
      const uint64_t pair = (static_cast<uint64_t>(k) << 32) | static_cast<uint32_t>(i);
      if (i < V && k < threshold) candidates[atomicAdd(&shared_less, 1u)] = pair;
      unsigned rank = 0, tile_equal = 0;
      SelectScan(scan).ExclusiveSum(equal ? 1u : 0u, rank, tile_equal);
      if (equal && equal_before + rank < wanted) candidates[less + equal_before + rank] = pair;
      equal_before += tile_equal;
      __syncthreads();  // the scan's storage is reused by the next tile
    }
  }
  __syncthreads();

  uint64_t item[1] = {static_cast<unsigned>(t) < n ? candidates[t] : ~uint64_t{0}};
  __syncthreads();  // the candidates are read before the sort's storage takes their place
  SelectSort(phase.sort).Sort(item);
  if (static_cast<unsigned>(t) < n) {
    sorted_keys[r * V + t] = (static_cast<uint64_t>(r) << 32) | (item[0] >> 32);
    sorted_ids[r * V + t] = static_cast<int32_t>(item[0] & 0xffffffffu);
  }
}

using BlockScan = cub::BlockScan<double, kThreads>;

union SharedStorage {
  typename BlockReduce::TempStorage reduce;
  typename BlockScan::TempStorage scan;
  typename KeyReduce::TempStorage key_reduce;
  typename MassScan::TempStorage mass_scan;
};

// Sum of value(i) over [0, n) in double, broadcast to every thread.
template <typename Value>
__device__ double block_sum(int64_t n, Value value, SharedStorage& storage, double* result) {
  double local = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) local += value(i);
  const double total = BlockReduce(storage.reduce).Sum(local);
  if (threadIdx.x == 0) *result = total;
  __syncthreads();
  const double out = *result;
  __syncthreads();
  return out;
}

// The first i in [0, n) whose running sum value(0) + ... + value(i) passes `crossed`, or n. The
// scan goes tile by tile so a block of kThreads covers any n, stopping at the tile that crosses.
template <typename Value, typename Crossed>
__device__ int64_t first_crossing(int64_t n, Value value, Crossed crossed, SharedStorage& storage,
                                  int64_t* found) {
  if (threadIdx.x == 0) *found = n;
  __syncthreads();
  double carry = 0.0;
  for (int64_t base = 0; base < n; base += kThreads) {
    const int64_t i = base + threadIdx.x;
    const double x = i < n ? value(i) : 0.0;
    double inclusive, tile_total;
    BlockScan(storage.scan).InclusiveSum(x, inclusive, tile_total);
    if (i < n && crossed(carry + inclusive)) atomicMin(reinterpret_cast<unsigned long long*>(found),
                                                       static_cast<unsigned long long>(i));
    __syncthreads();
    if (*found < n) break;
    carry += tile_total;
  }
  const int64_t out = *found;
  __syncthreads();
  return out;
}

// Step 3 of the file comment: block r draws row r's token from its sorted keys and ids.
__global__ void __launch_bounds__(kThreads)
    draw_kernel(const uint64_t* __restrict__ sorted_keys, const int32_t* __restrict__ sorted_ids,
                int64_t V, const op::SampleRow* __restrict__ rows, bool skip_whole,
                int32_t* __restrict__ out) {
  __shared__ SharedStorage storage;
  __shared__ DrawById draw_storage;
  __shared__ double shared_sum;
  __shared__ int64_t shared_index;
  const int64_t r = blockIdx.x;
  const uint64_t* keys = sorted_keys + r * V;
  const int32_t* ids = sorted_ids + r * V;
  const op::SampleParams& params = rows[r].params;
  if (skip_whole && draws_whole(params, V)) return;  // the whole-row chain's (step 2'')
  if (params.temperature == 0.0f) {  // greedy: the most likely, the lowest id among equals
    if (threadIdx.x == 0) out[r] = ids[0];
    return;
  }
  const int64_t n = params.top_k > 0 && params.top_k < V ? params.top_k : V;
  const float top_p = params.top_p;
  const float min_p = params.min_p;
  const double uniform = rows[r].uniform;
  const float top = key_value(keys[0]);
  auto weight = [&](int64_t i) {
    return exp(static_cast<double>(__fsub_rn(key_value(keys[i]), top)));
  };
  const double total = block_sum(n, weight, storage, &shared_sum);
  // The softmax probability as the CPU stores it: a float.
  auto prob = [&](int64_t i) { return static_cast<float>(weight(i) / total); };
  auto prob_d = [&](int64_t i) { return static_cast<double>(prob(i)); };

  // Top-p: the smallest prefix whose mass reaches top_p, the crossing token included.
  int64_t kept = n;
  if (top_p < 1.0f) {
    const double target = top_p;
    const int64_t i = first_crossing(
        n, prob_d, [&](double mass) { return mass >= target; }, storage, &shared_index);
    kept = i < n ? i + 1 : n;
  }
  // Min-p: probabilities never increase along the sorted row, so the cut is the first one below
  // the floor (the top token always stays).
  if (min_p > 0.0f) {
    const float floor = __fmul_rn(min_p, prob(0));
    if (threadIdx.x == 0) shared_index = kept;
    __syncthreads();
    for (int64_t i = 1 + threadIdx.x; i < kept; i += kThreads) {
      if (prob(i) < floor) {
        atomicMin(reinterpret_cast<unsigned long long*>(&shared_index),
                  static_cast<unsigned long long>(i));
      }
    }
    __syncthreads();
    kept = shared_index;
    __syncthreads();
  }
  // The draw walks the kept tokens in id order (draw_by_id), each renormalised as the CPU
  // stores it (a float) where the parameters may cut any.
  const bool renormalise = cuts_vocabulary(params, V);
  const double kept_mass = renormalise ? block_sum(kept, prob_d, storage, &shared_sum) : 1.0;
  auto measure = [&](int64_t i) {
    const double p = prob_d(i);
    return probability_units(renormalise ? static_cast<double>(static_cast<float>(p / kept_mass))
                                         : p);
  };
  const int32_t id = draw_by_id(kept, V, [&](int64_t i) { return ids[i]; }, measure,
                                probability_units(uniform), draw_storage);
  if (threadIdx.x == 0) out[r] = id;
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + 255) / 256); }

// The bits of a sort key for S rows: the logit's 32 and enough above them for r < S.
int end_bit(int64_t S) {
  int bits = 32;
  while ((int64_t{1} << (bits - 32)) < S) ++bits;
  return bits;
}

uint64_t* key_buffer(const Tensor& t) { return reinterpret_cast<uint64_t*>(t.raw()); }

// (Re)allocates the workspace for S rows of V and a table of `table_bytes`; a no-op once it fits.
Status prepare(op::SampleWorkspace& ws, int64_t S, int64_t V, size_t table_bytes) {
  if (!ws.ids.defined() || ws.ids.dim(1) != V || ws.ids.dim(0) < S) {
    const int64_t rows = ws.ids.defined() && ws.ids.dim(1) == V ? std::max(S, ws.ids.dim(0)) : S;
    for (Tensor* keys : {&ws.keys, &ws.alt_keys}) {
      KUIPER_ASSIGN_OR_RETURN(*keys, Tensor::empty({rows, V * 8}, DataType::kUint8,
                                                   DeviceType::kCuda));
    }
    for (Tensor* ids : {&ws.ids, &ws.alt_ids}) {
      KUIPER_ASSIGN_OR_RETURN(*ids, Tensor::empty({rows, V}, DataType::kInt32, DeviceType::kCuda));
    }
  }
  cub::DoubleBuffer<uint64_t> keys(key_buffer(ws.keys), key_buffer(ws.alt_keys));
  cub::DoubleBuffer<int32_t> ids(ws.ids.data<int32_t>(), ws.alt_ids.data<int32_t>());
  size_t sort_bytes = 0;
  KUIPER_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, ids,
                                                    static_cast<int>(S * V), 0, end_bit(S),
                                                    stream()));
  if (!ws.sort_temp.defined() || ws.sort_temp.nbytes() < sort_bytes) {
    KUIPER_ASSIGN_OR_RETURN(ws.sort_temp,
                            Tensor::empty({static_cast<int64_t>(std::max<size_t>(sort_bytes, 1))},
                                          DataType::kUint8, DeviceType::kCuda));
  }
  if (!ws.table.defined() || ws.table.nbytes() < table_bytes) {
    KUIPER_ASSIGN_OR_RETURN(ws.table, Tensor::empty({static_cast<int64_t>(table_bytes)},
                                                    DataType::kUint8, DeviceType::kCuda));
  }
  return Status::Ok();
}

// How a group of rows is drawn: without the sort where there are enough of them and each keeps
// few enough tokens (steps 1' and 2') or draws from its whole vocabulary (step 2''); else by
// the sort (steps 1 and 2).
struct Plan {
  bool sort = true;
  bool selects = false;  // some rows keep at most kSelectMost tokens
  bool whole = false;    // some rows draw from the whole vocabulary
  WholePlan cuts;        // what the whole rows cut
};

Plan plan_for(const std::vector<op::SampleParams>& params, int64_t V) {
  Plan plan;
  for (const op::SampleParams& p : params) {
    if (draws_whole(p, V)) {
      plan.whole = true;
      plan.cuts.top_p = plan.cuts.top_p || p.top_p < 1.0f;
      plan.cuts.kept = plan.cuts.kept || p.top_p < 1.0f || p.min_p > 0.0f;
    } else if (p.temperature == 0.0f || (p.top_k > 0 && p.top_k <= kSelectMost) ||
               V <= kSelectMost) {
      plan.selects = true;
    } else {
      return Plan{};
    }
  }
  // Fewer rows than kSelectMinRows sort rather than select (a block a row); whole rows do not
  // (the chain spreads a row over up to 32 blocks).
  if (plan.selects && static_cast<int64_t>(params.size()) < kSelectMinRows) return Plan{};
  plan.sort = false;
  return plan;
}

// Steps 1 to 3 for S rows of logits (fp32 [*, V]) whose table (and windows' ids) the device
// already holds; `longest` is the longest window of a penalised row.
Status run_rows(const float* logits, int64_t S, int64_t V, const op::SampleRow* rows,
                const int32_t* recent, int64_t longest, const Plan& plan,
                op::SampleWorkspace& ws, int32_t* out) {
  const dim3 scale_grid(blocks_for(V), static_cast<unsigned>(S));
  const dim3 penalty_grid(blocks_for(longest), static_cast<unsigned>(S));
  const unsigned row_blocks = static_cast<unsigned>(S);
  if (!plan.sort) {
    // The 32-bit keys in alt_keys; the pairs the selecting rows keep into keys and ids.
    uint32_t* keys32 = reinterpret_cast<uint32_t*>(ws.alt_keys.raw());
    scale_kernel<<<scale_grid, 256, 0, stream()>>>(logits, rows, V, keys32, nullptr);
    KUIPER_CUDA_CHECK_LAUNCH("sampling scale kernel");
    if (longest > 0) {
      penalty_kernel<<<penalty_grid, 256, 0, stream()>>>(logits, rows, recent, V, keys32);
      KUIPER_CUDA_CHECK_LAUNCH("sampling penalty kernel");
    }
    if (plan.selects) {
      select_kernel<<<row_blocks, kThreads, 0, stream()>>>(keys32, V, rows, key_buffer(ws.keys),
                                                           ws.ids.data<int32_t>());
      KUIPER_CUDA_CHECK_LAUNCH("sampling select kernel");
      draw_kernel<<<row_blocks, kThreads, 0, stream()>>>(key_buffer(ws.keys),
                                                         ws.ids.data<int32_t>(), V, rows,
                                                         /*skip_whole=*/true, out);
      KUIPER_CUDA_CHECK_LAUNCH("sampling draw kernel");
    }
    if (plan.whole) KUIPER_RETURN_IF_ERROR(draw_whole_rows(keys32, S, V, rows, plan.cuts, ws, out));
    return Status::Ok();
  }
  cub::DoubleBuffer<uint64_t> keys(key_buffer(ws.keys), key_buffer(ws.alt_keys));
  cub::DoubleBuffer<int32_t> ids(ws.ids.data<int32_t>(), ws.alt_ids.data<int32_t>());
  scale_kernel<<<scale_grid, 256, 0, stream()>>>(logits, rows, V, keys.Current(), ids.Current());
  KUIPER_CUDA_CHECK_LAUNCH("sampling scale kernel");
  if (longest > 0) {
    penalty_kernel<<<penalty_grid, 256, 0, stream()>>>(logits, rows, recent, V, keys.Current());
    KUIPER_CUDA_CHECK_LAUNCH("sampling penalty kernel");
  }
  size_t bytes = ws.sort_temp.nbytes();
  KUIPER_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(ws.sort_temp.raw(), bytes, keys, ids,
                                                    static_cast<int>(S * V), 0, end_bit(S),
                                                    stream()));
  draw_kernel<<<row_blocks, kThreads, 0, stream()>>>(keys.Current(), ids.Current(), V, rows,
                                                     /*skip_whole=*/false, out);
  KUIPER_CUDA_CHECK_LAUNCH("sampling draw kernel");
  return Status::Ok();
}

}  // namespace

Status sample(const Tensor& logits, const Tensor& recent, const op::SampleParams& params,
              double uniform, op::SampleWorkspace& ws, Tensor& out) {
  const int64_t V = logits.numel();
  const int64_t n_recent = recent.defined() ? recent.numel() : 0;
  const bool penalise = params.repeat_penalty != 1.0f && n_recent > 0;
  if (params.temperature == 0.0f && !penalise) return argmax(logits, out);

  const op::SampleRow row{0, params, uniform, 0, penalise ? n_recent : 0};
  KUIPER_RETURN_IF_ERROR(prepare(ws, 1, V, sizeof(row)));
  // From pageable memory: staged by the driver before the call returns, without a device sync.
  KUIPER_CUDA_CHECK(cudaMemcpyAsync(ws.table.raw(), &row, sizeof(row), cudaMemcpyHostToDevice,
                                    stream()));
  return run_rows(logits.data<float>(), 1, V, static_cast<const op::SampleRow*>(ws.table.raw()),
                  penalise ? recent.data<int32_t>() : nullptr, row.recent_count,
                  plan_for({params}, V), ws, out.data<int32_t>());
}

Status sample_rows(const Tensor& logits, const std::vector<op::SampleRow>& rows,
                   const std::vector<int32_t>& recent, op::SampleWorkspace& ws, Tensor& out) {
  const int64_t S = static_cast<int64_t>(rows.size());
  const int64_t V = logits.dim(1);
  const int64_t per_sort = std::min(S, kRowsPerSort);
  if (per_sort * V > INT32_MAX) {
    return Status::Error("sample_rows: " + std::to_string(per_sort) + " rows of " +
                         std::to_string(V) + " are more than one radix sort takes");
  }
  // The table, then the windows' ids: one copy up.
  const size_t table_bytes = rows.size() * sizeof(op::SampleRow);
  std::vector<unsigned char> table(table_bytes + recent.size() * sizeof(int32_t));
  std::memcpy(table.data(), rows.data(), table_bytes);
  if (!recent.empty()) {
    std::memcpy(table.data() + table_bytes, recent.data(), recent.size() * sizeof(int32_t));
  }
  KUIPER_RETURN_IF_ERROR(prepare(ws, per_sort, V, table.size()));
  // From pageable memory: staged by the driver before the call returns, without a device sync.
  KUIPER_CUDA_CHECK(cudaMemcpyAsync(ws.table.raw(), table.data(), table.size(),
                                    cudaMemcpyHostToDevice, stream()));
  const auto* device_table = static_cast<const unsigned char*>(ws.table.raw());
  const auto* device_rows = reinterpret_cast<const op::SampleRow*>(device_table);
  const auto* device_recent = reinterpret_cast<const int32_t*>(device_table + table_bytes);
  for (int64_t first = 0; first < S; first += per_sort) {
    const int64_t n = std::min(per_sort, S - first);
    int64_t longest = 0;
    std::vector<op::SampleParams> params;
    for (int64_t i = first; i < first + n; ++i) {
      const op::SampleRow& r = rows[static_cast<size_t>(i)];
      if (r.params.repeat_penalty != 1.0f) longest = std::max(longest, r.recent_count);
      params.push_back(r.params);
    }
    KUIPER_RETURN_IF_ERROR(run_rows(logits.data<float>(), n, V, device_rows + first,
                                    device_recent, longest, plan_for(params, V), ws,
                                    out.data<int32_t>() + first));
  }
  return Status::Ok();
}

}  // namespace kuiper::cuda
