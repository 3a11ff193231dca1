// The whole-vocabulary draw of op::sample_rows (step 2'' of sample.cu), without the sort.
#include "kuiper/op/kernels/cuda/sample_whole.h"

#include <algorithm>
#include <type_traits>

#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#include "kuiper/op/kernels/cuda/primitives.cuh"
#include "kuiper/op/kernels/cuda/sample_keys.cuh"

namespace kuiper::cuda {

namespace {

using namespace sampling;

// Step 2'' of sample.cu's comment, for the rows that keep their whole vocabulary but for top-p
// and min-p (draws_whole). A row is cut into `chunks` chunks, a block each (grid (chunks, S)), so
// that a few rows still fill the GPU, and the draw is a chain of kernels, a phase each. In every
// phase a chunk's block leaves its part in the row's WholeRow, and the last of the row's blocks to
// finish (arrive_last) combines the parts in chunk order (the result does not depend on which
// block finished when) and sets up what follows:
//   1. the smallest key (the most likely token);
//   2. the softmax's denominator, exp(l - top) summed in double;
//   3. each token's probability as the CPU stores it (a float) into probs, and their sum;
//   4. top-p's cut (rows with top_p < 1): the token at which the probabilities' running sum along
//      the sorted order (most likely first, ties by id) reaches top_p, found by a search;
//   5. the kept mass (rows with top-p or min-p): the sum over the tokens top-p's cut and min-p's
//      floor keep (min-p keeps a prefix: the probabilities never rise along the sorted order);
//   6. the draw: the kept token at which the running sum of the renormalised probabilities
//      passes the uniform, by the same search.
// A search finds the token whose interval [running sum before it, through it) holds a value:
// three radix passes over the keys from the top bits down (11 + 11 + 10), each summing every
// bin's measure into a histogram and keeping the bin that holds the value, as the select keeps
// the bin of its n-th key (past_end where the value lies past the members' sum); then, among the
// member keys equal to the one found (each of the same measure), the token in id order. The sums
// are in fixed point (units of 2^-60: integer sums, so exact and in any order; a float
// probability is a whole number of those units down to 2^-37).
constexpr double kFixedOne = 1152921504606846976.0;  // 2^60
__device__ unsigned long long fixed_point(double p) {
  return static_cast<unsigned long long>(p * kFixedOne);
}

constexpr int kMostChunks = 32;
// The fewest tokens a chunk takes (a few rounds of the block).
constexpr int64_t kLeastChunk = 4 * kThreads;

// The tie walk's slots: a chunk's tokens in kSlots equal runs (the last shorter), each with its
// count of tied members, so that the last block walks one run instead of the chunk.
constexpr int kSlots = 32;

// A whole row's state through the chain, zeroed before its first phase.
struct WholeRow {
  unsigned long long histogram[kBins];    // the search pass's sum in each bin
  double parts[kMostChunks];              // each chunk's sum in the phase
  unsigned long long picks[kMostChunks];  // each chunk's smallest key, count or last member
  unsigned slots[kMostChunks][kSlots];    // each chunk's count of the tied members in each slot
  unsigned arrived;                       // the row's blocks done with the phase
  uint32_t top;                           // the smallest key
  double total;                           // the softmax's denominator
  double kept;                            // the kept tokens' probability
  float floor;                            // min-p's least probability (0: none)
  int cut;                                // top-p keeps the tokens through (cut_key, cut_id)
  uint32_t cut_key;
  int64_t cut_id;
  // The running search: the key bits found so far, the measure of the member keys before those
  // bits, the value sought, and whether it lies past the members' sum.
  uint32_t prefix, mask;
  unsigned long long below, value;
  int past_end;
};

enum class Search { kTopP, kDraw };

struct WholeArgs {
  const uint32_t* keys;  // [S, V] 32-bit keys
  int64_t V;
  const op::SampleRow* rows;
  float* probs;  // [S, V] scratch
  WholeRow* state;
  int chunks;
  int32_t* out;
};

// Block (c, r)'s part of the chain: row r's keys, probabilities and state, its chunk [begin, end).
struct WholeChunk {
  int c;
  int64_t r, begin, end;
  const uint32_t* row;
  float* probs;
  WholeRow* st;
  const op::SampleRow* sample;
};

// Chunk c of a row: [c * length, (c + 1) * length) within V, the length a multiple of 4 so that
// where V is (each row's keys 16-byte aligned) every chunk's keys load as 16-byte words.
__device__ int64_t chunk_length(int64_t V, int chunks) {
  return ((V + chunks - 1) / chunks + 3) / 4 * 4;
}

__device__ WholeChunk whole_chunk(const WholeArgs& a) {
  WholeChunk w;
  w.c = static_cast<int>(blockIdx.x);
  w.r = blockIdx.y;
  const int64_t length = chunk_length(a.V, a.chunks);
  w.begin = min(a.V, w.c * length);
  w.end = min(a.V, w.begin + length);
  w.row = a.keys + w.r * a.V;
  w.probs = a.probs + w.r * a.V;
  w.st = a.state + w.r;
  w.sample = a.rows + w.r;
  return w;
}

// Whether the block is the last of its row's to finish the phase (its parts written before, by
// any of its threads); that block then reads the others' parts by ld.cg and combines them.
// Resets the count.
__device__ bool arrive_last(WholeRow* st, int chunks) {
  __shared__ int last;
  __threadfence();  // every thread's part (stores, atomics) ordered before the count
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(&st->arrived, 1u) == static_cast<unsigned>(chunks - 1);
    if (last) st->arrived = 0;
  }
  __syncthreads();
  if (last) __threadfence();
  return last != 0;
}

__device__ void begin_search(WholeRow* st, unsigned long long value) {
  st->prefix = 0;
  st->mask = 0;
  st->below = 0;
  st->value = value;
  st->past_end = 0;
}

// A token's probability from its key, as phase 3 stores it.
__device__ float prob_of_key(uint32_t key, const WholeRow* st) {
  const float top = key_value(st->top);
  return static_cast<float>(exp(static_cast<double>(__fsub_rn(key_value(key), top))) / st->total);
}

// What the draw keeps, read once a block from the row's state.
struct Cuts {
  int cut;
  uint32_t cut_key;
  int64_t cut_id;
  float floor;
  double kept;
};
__device__ Cuts cuts_of(const WholeRow* st) {
  return {st->cut, st->cut_key, st->cut_id, st->floor, st->kept};
}

// Whether the draw keeps token i (key k, probability p): within top-p's cut and min-p's floor.
__device__ bool kept_token(const Cuts& c, uint32_t k, int64_t i, float p) {
  if (c.cut && (k > c.cut_key || (k == c.cut_key && i > c.cut_id))) return false;
  return !(p < c.floor);
}

// What a search sums: top-p's the probabilities of every token, the draw's the renormalised
// probabilities of the kept ones.
template <Search kind>
__device__ bool member(const Cuts& c, uint32_t k, int64_t i, float p) {
  return kind == Search::kTopP || kept_token(c, k, i, p);
}
template <Search kind>
__device__ unsigned long long measure(const Cuts& c, float p) {
  if (kind == Search::kTopP) return fixed_point(static_cast<double>(p));
  return fixed_point(static_cast<double>(static_cast<float>(static_cast<double>(p) / c.kept)));
}

// A block's histogram of fixed-point sums as two 32-bit words a bin, so that every add is a
// native 32-bit shared atomic: v's low word into lo (its wrap carried) and its high word into hi.
// A bin's sum is hi * 2^32 + lo while it stays below 2^64 (a probability sum: at most 2^60).
struct FixedBins {
  unsigned lo[kBins];
  unsigned hi[kBins];
};
__device__ void add_fixed(FixedBins& bins, unsigned bin, unsigned long long v) {
  const unsigned low = static_cast<unsigned>(v);
  const unsigned old = atomicAdd(&bins.lo[bin], low);
  const unsigned high = static_cast<unsigned>(v >> 32) + (old + low < old ? 1u : 0u);
  if (high != 0) atomicAdd(&bins.hi[bin], high);
}
__device__ unsigned long long fixed_sum(const FixedBins& bins, int bin) {
  return (static_cast<unsigned long long>(bins.hi[bin]) << 32) + bins.lo[bin];
}
template <Search kind>
__device__ bool searches(const op::SampleParams& p) {
  return kind == Search::kDraw || p.top_p < 1.0f;
}

// Calls f(i, key) for each token i of the chunk, always in the same order for the same chunk.
// Where V is a multiple of 4, thread t takes the 16-byte words t, t + kThreads, ..., two loaded
// before the first is used, each word's four tokens in order; else the tokens t, t + kThreads,
// ..., four loaded before the first is used (more loads in flight).
template <typename F>
__device__ void for_each_key(const WholeChunk& w, int64_t V, F f) {
  if (V % 4 == 0) {
    const uint4* words = reinterpret_cast<const uint4*>(w.row + w.begin);
    const int64_t n = (w.end - w.begin) / 4;
    int64_t q = threadIdx.x;
    for (; q + kThreads < n; q += 2 * kThreads) {
      const uint4 a = words[q], b = words[q + kThreads];
      const int64_t i = w.begin + 4 * q, j = i + 4 * kThreads;
      f(i, a.x), f(i + 1, a.y), f(i + 2, a.z), f(i + 3, a.w);
      f(j, b.x), f(j + 1, b.y), f(j + 2, b.z), f(j + 3, b.w);
    }
    if (q < n) {
      const uint4 a = words[q];
      const int64_t i = w.begin + 4 * q;
      f(i, a.x), f(i + 1, a.y), f(i + 2, a.z), f(i + 3, a.w);
    }
    return;
  }
  int64_t i = w.begin + threadIdx.x;
  for (; i + 3 * kThreads < w.end; i += 4 * kThreads) {
    uint32_t k[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) k[u] = w.row[i + u * kThreads];
#pragma unroll
    for (int u = 0; u < 4; ++u) f(i + u * kThreads, k[u]);
  }
  for (; i < w.end; i += kThreads) f(i, w.row[i]);
}

// Phase 1.
__global__ void __launch_bounds__(kThreads) whole_top_kernel(WholeArgs a) {
  __shared__ typename KeyReduce::TempStorage reduce;
  const WholeChunk w = whole_chunk(a);
  if (!draws_whole(w.sample->params, a.V)) return;
  uint32_t smallest = 0xffffffffu;
  for_each_key(w, a.V, [&](int64_t, uint32_t k) { smallest = min(smallest, k); });
  smallest = KeyReduce(reduce).Reduce(smallest, [](uint32_t x, uint32_t y) { return min(x, y); });
  if (threadIdx.x == 0) w.st->picks[w.c] = smallest;
  if (!arrive_last(w.st, a.chunks) || threadIdx.x != 0) return;
  uint32_t top = 0xffffffffu;
  for (int c = 0; c < a.chunks; ++c) top = min(top, static_cast<uint32_t>(__ldcg(&w.st->picks[c])));
  w.st->top = top;
}

// The sum of the chunk's value(i, key) in double, left as the chunk's part; true in the last block,
// with the row's sum (the parts in chunk order) in *sum.
template <typename Value>
__device__ bool chunk_sum(const WholeChunk& w, int64_t V, int chunks, Value value, double* sum) {
  __shared__ typename BlockReduce::TempStorage reduce;
  double local = 0.0;
  for_each_key(w, V, [&](int64_t i, uint32_t k) { local += value(i, k); });
  const double part = BlockReduce(reduce).Sum(local);
  if (threadIdx.x == 0) w.st->parts[w.c] = part;
  if (!arrive_last(w.st, chunks)) return false;
  *sum = 0.0;
  for (int c = 0; c < chunks; ++c) *sum += __ldcg(&w.st->parts[c]);
  return true;
}

// Phase 2.
__global__ void __launch_bounds__(kThreads) whole_total_kernel(WholeArgs a) {
  const WholeChunk w = whole_chunk(a);
  if (!draws_whole(w.sample->params, a.V)) return;
  const float top = key_value(w.st->top);
  double total = 0.0;
  const auto weight = [&](int64_t, uint32_t k) {
    return exp(static_cast<double>(__fsub_rn(key_value(k), top)));
  };
  if (chunk_sum(w, a.V, a.chunks, weight, &total) && threadIdx.x == 0) w.st->total = total;
}

// Phase 3; sets up top-p's search, or the draw's where nothing is cut.
__global__ void __launch_bounds__(kThreads) whole_probs_kernel(WholeArgs a) {
  const WholeChunk w = whole_chunk(a);
  const op::SampleParams& params = w.sample->params;
  if (!draws_whole(params, a.V)) return;
  const float top = key_value(w.st->top);
  const double total = w.st->total;
  double sum = 0.0;
  const auto prob = [&](int64_t i, uint32_t k) {
    const float p =
        static_cast<float>(exp(static_cast<double>(__fsub_rn(key_value(k), top))) / total);
    w.probs[i] = p;
    return static_cast<double>(p);
  };
  if (!chunk_sum(w, a.V, a.chunks, prob, &sum) || threadIdx.x != 0) return;
  WholeRow* st = w.st;
  st->kept = sum;
  st->floor = params.min_p > 0.0f ? __fmul_rn(params.min_p, static_cast<float>(1.0 / total)) : 0.0f;
  if (params.top_p < 1.0f) {
    // The first token whose running sum reaches top_p: the one whose interval holds top_p's
    // fixed point less one unit.
    const unsigned long long target = fixed_point(static_cast<double>(params.top_p));
    begin_search(st, target > 0 ? target - 1 : 0);
  } else if (!(params.min_p > 0.0f)) {
    begin_search(st, fixed_point(w.sample->uniform));
  }
}

// Phase 5: the kept tokens' mass; sets up the draw's search.
__global__ void __launch_bounds__(kThreads) whole_kept_kernel(WholeArgs a) {
  const WholeChunk w = whole_chunk(a);
  const op::SampleParams& params = w.sample->params;
  if (!draws_whole(params, a.V) || (params.top_p >= 1.0f && !(params.min_p > 0.0f))) return;
  const Cuts cuts = cuts_of(w.st);
  double kept = 0.0;
  const auto kept_prob = [&](int64_t i, uint32_t k) {
    const float p = w.probs[i];
    return kept_token(cuts, k, i, p) ? static_cast<double>(p) : 0.0;
  };
  if (!chunk_sum(w, a.V, a.chunks, kept_prob, &kept) || threadIdx.x != 0) return;
  w.st->kept = kept;
  begin_search(w.st, fixed_point(w.sample->uniform));
}

// A pass of a search: the bits below `shift` + kDigitBits, down to `shift` (0 where negative).
template <Search kind>
__global__ void __launch_bounds__(kThreads) whole_pass_kernel(WholeArgs a, int shift) {
  __shared__ FixedBins bins;
  __shared__ typename MassScan::TempStorage scan;
  __shared__ unsigned shared_bin;
  __shared__ unsigned long long shared_below;
  const WholeChunk w = whole_chunk(a);
  if (!draws_whole(w.sample->params, a.V) || !searches<kind>(w.sample->params)) return;
  WholeRow* st = w.st;
  if (st->past_end) return;
  const int t = threadIdx.x;
  const int low = shift < 0 ? 0 : shift;
  const uint32_t digit_mask = (1u << (shift + kDigitBits - low)) - 1u;
  const uint32_t prefix = st->prefix, mask = st->mask;
  const Cuts cuts = cuts_of(st);
  for (int b = 2 * t; b < 2 * t + 2; ++b) {
    bins.lo[b] = 0;
    bins.hi[b] = 0;
  }
  __syncthreads();
  for_each_key(w, a.V, [&](int64_t i, uint32_t k) {
    if ((k & mask) != prefix) return;
    const float p = w.probs[i];
    if (member<kind>(cuts, k, i, p)) add_fixed(bins, (k >> low) & digit_mask, measure<kind>(cuts, p));
  });
  __syncthreads();
  for (int b = 2 * t; b < 2 * t + 2; ++b) {
    const unsigned long long sum = fixed_sum(bins, b);
    if (sum != 0) atomicAdd(&st->histogram[b], sum);
  }
  if (!arrive_last(st, a.chunks)) return;
  const unsigned long long h0 = __ldcg(&st->histogram[2 * t]);
  const unsigned long long h1 = __ldcg(&st->histogram[2 * t + 1]);
  st->histogram[2 * t] = 0;  // for the next pass
  st->histogram[2 * t + 1] = 0;
  unsigned long long before = 0, all = 0;
  MassScan(scan).ExclusiveSum(h0 + h1, before, all);
  const unsigned long long value = st->value;
  if (shift == 32 - kDigitBits && value >= all) {  // every thread sees the same
    if (t == 0) st->past_end = 1;
    return;
  }
  const unsigned long long start = st->below + before;
  if (start <= value && value < start + h0) {
    shared_bin = 2 * t;
    shared_below = start;
  } else if (start + h0 <= value && value < start + h0 + h1) {
    shared_bin = 2 * t + 1;
    shared_below = start + h0;
  }
  __syncthreads();
  if (t == 0) {
    st->prefix = prefix | (shared_bin << low);
    st->mask = mask | (digit_mask << low);
    st->below = shared_below;
  }
}

// A search's last step: the token among the member keys equal to the one found, or past the end
// the last member (the largest member key, its largest id). Top-p's cut, or the draw's token.
template <Search kind>
__global__ void __launch_bounds__(kThreads) whole_ties_kernel(WholeArgs a) {
  __shared__ typename KeyReduce::TempStorage count_reduce;
  __shared__ typename SelectScan::TempStorage scan;
  __shared__ unsigned long long shared_id;
  __shared__ int64_t shared_begin, shared_end;
  __shared__ unsigned long long shared_skip;
  __shared__ unsigned slot_count[kSlots];
  using LastReduce = cub::BlockReduce<unsigned long long, kThreads>;
  __shared__ typename LastReduce::TempStorage last_reduce;
  const WholeChunk w = whole_chunk(a);
  if (!draws_whole(w.sample->params, a.V) || !searches<kind>(w.sample->params)) return;
  WholeRow* st = w.st;
  const int t = threadIdx.x;
  const Cuts cuts = cuts_of(st);
  const auto is_member = [&](uint32_t k, int64_t i) { return member<kind>(cuts, k, i, w.probs[i]); };
  if (st->past_end) {
    if (kind == Search::kTopP) return;  // the running sum never reaches top_p: nothing is cut
    unsigned long long last = 0;  // (key, id) packed: the largest is the last in sorted order
    for_each_key(w, a.V, [&](int64_t i, uint32_t k) {
      if (is_member(k, i)) last = max(last, (static_cast<unsigned long long>(k) << 32) | i);
    });
    last = LastReduce(last_reduce).Reduce(last, [](unsigned long long x, unsigned long long y) {
      return max(x, y);
    });
    if (t == 0) st->picks[w.c] = last;
    if (!arrive_last(st, a.chunks) || t != 0) return;
    for (int c = 0; c < a.chunks; ++c) last = max(last, __ldcg(&st->picks[c]));
    a.out[w.r] = static_cast<int32_t>(last & 0xffffffffu);
    return;
  }
  // The tied members (the keys equal to the one found) counted in each slot of the chunk.
  const uint32_t key = st->prefix;
  const int64_t slot_length = (w.end - w.begin + kSlots - 1) / kSlots;
  if (t < kSlots) slot_count[t] = 0;
  __syncthreads();
  unsigned count = 0;
  for_each_key(w, a.V, [&](int64_t i, uint32_t k) {
    if (k == key && is_member(key, i)) {
      atomicAdd(&slot_count[(i - w.begin) / slot_length], 1u);
      ++count;
    }
  });
  count = KeyReduce(count_reduce).Sum(count);
  if (t < kSlots) st->slots[w.c][t] = slot_count[t];
  if (t == 0) st->picks[w.c] = count;
  if (!arrive_last(st, a.chunks)) return;
  // Each tied member has the same measure: the one sought passes `skip` of them in id order.
  // Thread 0 finds its chunk and slot by the counts, the block the token in it by a scan a tile.
  if (t == 0) {
    const float p = prob_of_key(key, st);
    unsigned long long skip = (st->value - st->below) / measure<kind>(cuts, p);
    const int64_t length = chunk_length(a.V, a.chunks);
    int c = 0;
    for (; c < a.chunks - 1; ++c) {
      const unsigned long long n = __ldcg(&st->picks[c]);
      if (skip < n) break;
      skip -= n;
    }
    const int64_t begin = min(a.V, c * length), end = min(a.V, begin + length);
    const int64_t slot = (end - begin + kSlots - 1) / kSlots;
    int s = 0;
    for (; s < kSlots - 1; ++s) {
      const unsigned n = __ldcg(&st->slots[c][s]);
      if (skip < n) break;
      skip -= n;
    }
    shared_begin = min(end, begin + s * slot);
    shared_end = min(end, shared_begin + slot);
    shared_skip = skip;
  }
  __syncthreads();
  unsigned long long seen = 0;
  for (int64_t base = shared_begin; base < shared_end; base += kThreads) {
    const int64_t i = base + t;
    const bool equal = i < shared_end && w.row[i] == key && is_member(key, i);
    const unsigned tile_equal = static_cast<unsigned>(__syncthreads_count(equal));
    if (seen + tile_equal > shared_skip) {
      unsigned rank = 0;
      SelectScan(scan).ExclusiveSum(equal ? 1u : 0u, rank);
      if (equal && seen + rank == shared_skip) shared_id = static_cast<unsigned long long>(i);
      break;
    }
    seen += tile_equal;
  }
  __syncthreads();
  if (t != 0) return;
  if (kind == Search::kDraw) {
    a.out[w.r] = static_cast<int32_t>(shared_id);
  } else {
    st->cut = 1;
    st->cut_key = key;
    st->cut_id = static_cast<int64_t>(shared_id);
  }
}

// The chain for the group's whole rows.
Status whole_draw(const WholeArgs& a, int64_t S, const WholePlan& plan) {
  KUIPER_CUDA_CHECK(cudaMemsetAsync(a.state, 0, static_cast<size_t>(S) * sizeof(WholeRow),
                                    stream()));
  const dim3 grid(static_cast<unsigned>(a.chunks), static_cast<unsigned>(S));
  whole_top_kernel<<<grid, kThreads, 0, stream()>>>(a);
  KUIPER_CUDA_CHECK_LAUNCH("sampling whole-row top kernel");
  whole_total_kernel<<<grid, kThreads, 0, stream()>>>(a);
  KUIPER_CUDA_CHECK_LAUNCH("sampling whole-row total kernel");
  whole_probs_kernel<<<grid, kThreads, 0, stream()>>>(a);
  KUIPER_CUDA_CHECK_LAUNCH("sampling whole-row probability kernel");
  const auto search = [&](auto kind) -> Status {
    constexpr Search k = decltype(kind)::value;
    for (int shift = 32 - kDigitBits; shift > -kDigitBits; shift -= kDigitBits) {
      whole_pass_kernel<k><<<grid, kThreads, 0, stream()>>>(a, shift);
      KUIPER_CUDA_CHECK_LAUNCH("sampling whole-row search pass");
    }
    whole_ties_kernel<k><<<grid, kThreads, 0, stream()>>>(a);
    KUIPER_CUDA_CHECK_LAUNCH("sampling whole-row search ties");
    return Status::Ok();
  };
  if (plan.top_p) {
    KUIPER_RETURN_IF_ERROR(search(std::integral_constant<Search, Search::kTopP>{}));
  }
  if (plan.kept) {
    whole_kept_kernel<<<grid, kThreads, 0, stream()>>>(a);
    KUIPER_CUDA_CHECK_LAUNCH("sampling whole-row kept-mass kernel");
  }
  return search(std::integral_constant<Search, Search::kDraw>{});
}

// Chunks a row: as many as the GPU holds blocks of the chain at once (one wave; a wave and a
// bit more would take nearly two), each of at least kLeastChunk tokens.
Result<int> whole_chunks(int64_t S, int64_t V) {
  KUIPER_ASSIGN_OR_RETURN(const int sms, sm_count());
  static PerDevice<int> resident;  // blocks a multiprocessor holds of the largest kernel
  KUIPER_ASSIGN_OR_RETURN(const int per_sm, resident.get([]() -> Result<int> {
    int n = 0;
    KUIPER_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &n, whole_pass_kernel<Search::kDraw>, kThreads, 0));
    return std::max(n, 1);
  }));
  const int64_t want = static_cast<int64_t>(sms) * per_sm / S;
  const int64_t most = std::max<int64_t>(1, V / kLeastChunk);
  return static_cast<int>(std::max<int64_t>(1, std::min({want, most, int64_t{kMostChunks}})));
}

}  // namespace

Status draw_whole_rows(const uint32_t* keys32, int64_t S, int64_t V, const op::SampleRow* rows,
                       const WholePlan& plan, op::SampleWorkspace& ws, int32_t* out) {
  const size_t bytes = static_cast<size_t>(S) * sizeof(WholeRow);
  if (!ws.whole.defined() || ws.whole.nbytes() < bytes) {
    KUIPER_ASSIGN_OR_RETURN(ws.whole, Tensor::empty({static_cast<int64_t>(bytes)},
                                                    DataType::kUint8, DeviceType::kCuda));
  }
  KUIPER_ASSIGN_OR_RETURN(const int chunks, whole_chunks(S, V));
  const WholeArgs args{keys32, V, rows, reinterpret_cast<float*>(ws.alt_ids.raw()),
                       reinterpret_cast<WholeRow*>(ws.whole.raw()), chunks, out};
  return whole_draw(args, S, plan);
}

}  // namespace kuiper::cuda
