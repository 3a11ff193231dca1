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
//   3. (rows that may cut: cuts_vocabulary) each token's probability as the CPU stores it (a
//      float) into probs, and their sum;
//   4. top-p's cut (rows with top_p < 1): the token at which the probabilities' running sum along
//      the sorted order (most likely first, ties by id) reaches top_p, found by a search;
//   5. the kept mass (rows with top-p or min-p): the sum over the tokens top-p's cut and min-p's
//      floor keep (min-p keeps a prefix: the probabilities never rise along the sorted order);
//   6. the draw, in id order (as torch.multinomial walks the probabilities): each block sums its
//      chunk's kept tokens' probabilities (floats as the CPU stores them, renormalised where the
//      row may cut, from probs, else each found again from its key; in probability units) by
//      runs of kRunTokens ids and in all, and the row's last block walks
//      the chunks' sums, then the chosen chunk's runs, then the run's tokens to the one whose
//      interval of the running sum holds the uniform.
// Top-p's search finds the token whose interval [running sum before it, through it) holds a
// value: three radix passes over the keys from the top bits down (11 + 11 + 10), each summing
// every bin's probabilities into a histogram and keeping the bin that holds the value, as the
// select keeps the bin of its n-th key (past_end where the value lies past the sum); then, among
// the keys equal to the one found (each of the same probability), the token in id order. Every
// sum is in probability units (sample_math.h), so exact and in any order.
constexpr int kMostChunks = 32;
// The fewest tokens a chunk takes (a few rounds of the block).
constexpr int64_t kLeastChunk = 4 * kThreads;

// The tie walk's slots: a chunk's tokens in kSlots equal parts (the last shorter), each with its
// count of tied keys, so that the last block walks one part instead of the chunk.
constexpr int kSlots = 32;

// A whole row's state through the chain, zeroed before its first phase.
struct WholeRow {
  unsigned long long histogram[kBins];    // the search pass's sum in each bin
  double parts[kMostChunks];              // each chunk's sum in the phase
  unsigned long long picks[kMostChunks];  // each chunk's smallest key or count of ties
  unsigned slots[kMostChunks][kSlots];    // each chunk's count of the tied keys in each slot
  unsigned long long mass[kMostChunks];   // each chunk's kept measure (the draw)
  int last_kept[kMostChunks];             // each chunk's largest kept id, -1 if none (the draw)
  unsigned arrived;                       // the row's blocks done with the phase
  uint32_t top;                           // the smallest key
  double total;                           // the softmax's denominator
  double kept;                            // the kept tokens' probability
  float floor;                            // min-p's least probability (0: none)
  int cut;                                // top-p keeps the tokens through (cut_key, cut_id)
  uint32_t cut_key;
  int64_t cut_id;
  // Top-p's running search: the key bits found so far, the probability of the keys before those
  // bits, the value sought, and whether it lies past the sum.
  uint32_t prefix, mask;
  unsigned long long below, value;
  int past_end;
};

struct WholeArgs {
  const uint32_t* keys;  // [S, V] 32-bit keys
  int64_t V;
  const op::SampleRow* rows;
  float* probs;  // [S, V] scratch
  WholeRow* state;
  unsigned long long* runs;  // [S, runs_per_row]: the draw's kept measure of each run of ids
  int64_t runs_per_row;
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

// The draw's runs: kRunTokens consecutive ids, a warp's 32 lanes of 4.
constexpr int kRunTokens = 128;

// Chunk c of a row: [c * length, (c + 1) * length) within V, the length a multiple of
// kRunTokens, so that a run never crosses chunks and where V is a multiple of 4 (each row's
// keys 16-byte aligned) every chunk's keys load as 16-byte words.
__device__ int64_t chunk_length(int64_t V, int chunks) {
  return ((V + chunks - 1) / chunks + kRunTokens - 1) / kRunTokens * kRunTokens;
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
__device__ float softmax_prob(uint32_t key, float top, double total) {
  return static_cast<float>(exp(static_cast<double>(__fsub_rn(key_value(key), top))) / total);
}
__device__ float prob_of_key(uint32_t key, const WholeRow* st) {
  return softmax_prob(key, key_value(st->top), st->total);
}

// What the draw keeps, read once a block from the row's state.
struct Cuts {
  int cut;
  uint32_t cut_key;
  int64_t cut_id;
  float floor;
  double kept;
  bool renormalise;  // the row may cut (cuts_vocabulary): probs and kept are set
  float top;         // the softmax's top logit and denominator
  double total;
};
__device__ Cuts cuts_of(const WholeRow* st, const op::SampleParams& p, int64_t V) {
  return {st->cut, st->cut_key, st->cut_id, st->floor, st->kept,
          cuts_vocabulary(p, V), key_value(st->top), st->total};
}

// Whether the draw keeps token i (key k, probability p): within top-p's cut and min-p's floor.
__device__ bool kept_token(const Cuts& c, uint32_t k, int64_t i, float p) {
  if (c.cut && (k > c.cut_key || (k == c.cut_key && i > c.cut_id))) return false;
  return !(p < c.floor);
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

// Phase 3 (rows that may cut); sets up top-p's search.
__global__ void __launch_bounds__(kThreads) whole_probs_kernel(WholeArgs a) {
  const WholeChunk w = whole_chunk(a);
  const op::SampleParams& params = w.sample->params;
  if (!draws_whole(params, a.V) || !cuts_vocabulary(params, a.V)) return;
  const float top = key_value(w.st->top);
  const double total = w.st->total;
  double sum = 0.0;
  const auto prob = [&](int64_t i, uint32_t k) {
    const float p = softmax_prob(k, top, total);
    w.probs[i] = p;
    return static_cast<double>(p);
  };
  if (!chunk_sum(w, a.V, a.chunks, prob, &sum) || threadIdx.x != 0) return;
  WholeRow* st = w.st;
  st->kept = sum;
  st->floor = params.min_p > 0.0f ? __fmul_rn(params.min_p, static_cast<float>(1.0 / total)) : 0.0f;
  if (params.top_p < 1.0f) {
    // The first token whose running sum reaches top_p: the one whose interval holds top_p's
    // units less one.
    const unsigned long long target = probability_units(static_cast<double>(params.top_p));
    begin_search(st, target > 0 ? target - 1 : 0);
  }
}

// Phase 5: the kept tokens' mass.
__global__ void __launch_bounds__(kThreads) whole_kept_kernel(WholeArgs a) {
  const WholeChunk w = whole_chunk(a);
  const op::SampleParams& params = w.sample->params;
  if (!draws_whole(params, a.V) || !cuts_vocabulary(params, a.V)) return;
  const Cuts cuts = cuts_of(w.st, params, a.V);
  double kept = 0.0;
  const auto kept_prob = [&](int64_t i, uint32_t k) {
    const float p = w.probs[i];
    return kept_token(cuts, k, i, p) ? static_cast<double>(p) : 0.0;
  };
  if (chunk_sum(w, a.V, a.chunks, kept_prob, &kept) && threadIdx.x == 0) w.st->kept = kept;
}

// A pass of top-p's search: the bits below `shift` + kDigitBits, down to `shift` (0 where
// negative).
__global__ void __launch_bounds__(kThreads) whole_pass_kernel(WholeArgs a, int shift) {
  __shared__ FixedBins bins;
  __shared__ typename MassScan::TempStorage scan;
  __shared__ unsigned shared_bin;
  __shared__ unsigned long long shared_below;
  const WholeChunk w = whole_chunk(a);
  if (!draws_whole(w.sample->params, a.V) || !(w.sample->params.top_p < 1.0f)) return;
  WholeRow* st = w.st;
  if (st->past_end) return;
  const int t = threadIdx.x;
  const int low = shift < 0 ? 0 : shift;
  const uint32_t digit_mask = (1u << (shift + kDigitBits - low)) - 1u;
  const uint32_t prefix = st->prefix, mask = st->mask;
  for (int b = 2 * t; b < 2 * t + 2; ++b) {
    bins.lo[b] = 0;
    bins.hi[b] = 0;
  }
  __syncthreads();
  for_each_key(w, a.V, [&](int64_t i, uint32_t k) {
    if ((k & mask) != prefix) return;
    const float p = w.probs[i];
    add_fixed(bins, (k >> low) & digit_mask, probability_units(static_cast<double>(p)));
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

// Top-p's search's last step: the cut at the token among the keys equal to the one found, in id
// order; none past the end (the running sum never reaches top_p).
__global__ void __launch_bounds__(kThreads) whole_ties_kernel(WholeArgs a) {
  __shared__ typename KeyReduce::TempStorage count_reduce;
  __shared__ typename SelectScan::TempStorage scan;
  __shared__ unsigned long long shared_id;
  __shared__ int64_t shared_begin, shared_end;
  __shared__ unsigned long long shared_skip;
  __shared__ unsigned slot_count[kSlots];
  const WholeChunk w = whole_chunk(a);
  if (!draws_whole(w.sample->params, a.V) || !(w.sample->params.top_p < 1.0f)) return;
  WholeRow* st = w.st;
  const int t = threadIdx.x;
  if (st->past_end) return;
  // The tied keys (equal to the one found) counted in each slot of the chunk.
  const uint32_t key = st->prefix;
  const int64_t slot_length = (w.end - w.begin + kSlots - 1) / kSlots;
  if (t < kSlots) slot_count[t] = 0;
  __syncthreads();
  unsigned count = 0;
  for_each_key(w, a.V, [&](int64_t i, uint32_t k) {
    if (k == key) {
      atomicAdd(&slot_count[(i - w.begin) / slot_length], 1u);
      ++count;
    }
  });
  count = KeyReduce(count_reduce).Sum(count);
  if (t < kSlots) st->slots[w.c][t] = slot_count[t];
  if (t == 0) st->picks[w.c] = count;
  if (!arrive_last(st, a.chunks)) return;
  // Each tied key has the same probability: the one sought passes `skip` of them in id order.
  // Thread 0 finds its chunk and slot by the counts, the block the token in it by a scan a tile.
  if (t == 0) {
    const float p = prob_of_key(key, st);
    unsigned long long skip = (st->value - st->below) / probability_units(static_cast<double>(p));
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
    const bool equal = i < shared_end && w.row[i] == key;
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
  st->cut = 1;
  st->cut_key = key;
  st->cut_id = static_cast<int64_t>(shared_id);
}

// The draw's measure of token i of the chunk: its probability as the CPU stores it (a float; in a
// row that may cut, renormalised over what the cuts keep) in probability units, 0 where the cuts
// drop it or past the chunk; *kept whether the cuts keep it.
__device__ unsigned long long draw_measure(const Cuts& c, const WholeChunk& w, int64_t i,
                                           bool* kept) {
  *kept = false;
  if (i >= w.end) return 0;
  if (!c.renormalise) {  // every token, its softmax probability as it is
    *kept = true;
    return probability_units(static_cast<double>(softmax_prob(w.row[i], c.top, c.total)));
  }
  const float p = w.probs[i];
  if (!kept_token(c, c.cut ? w.row[i] : 0u, i, p)) return 0;
  *kept = true;
  const float renormalised = static_cast<float>(static_cast<double>(p) / c.kept);
  return probability_units(static_cast<double>(renormalised));
}

__device__ unsigned long long warp_sum_units(unsigned long long v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Phase 6: the draw. Each warp sums the runs of kRunTokens ids of the chunk it takes (lane l the
// ids 4 l to 4 l + 3 of a run) into a.runs, the block its chunk's sum and largest kept id into the
// row's state; the row's last block finds the chunk, the run and the token, each by its running
// sum in id order.
__global__ void __launch_bounds__(kThreads) whole_draw_kernel(WholeArgs a) {
  __shared__ typename MassScan::TempStorage scan;
  __shared__ typename KeyReduce::TempStorage last_reduce;
  __shared__ unsigned long long warp_masses[kThreads / 32];
  __shared__ int chunk;
  __shared__ int64_t run;
  __shared__ unsigned long long rest;
  const WholeChunk w = whole_chunk(a);
  if (!draws_whole(w.sample->params, a.V)) return;
  WholeRow* st = w.st;
  const Cuts cuts = cuts_of(st, w.sample->params, a.V);
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  unsigned long long* runs = a.runs + w.r * a.runs_per_row;
  unsigned long long mass = 0;
  uint32_t last = 0;  // largest kept id + 1, 0 for none
  for (int64_t first = w.begin + warp * kRunTokens; first < w.end;
       first += (kThreads / 32) * kRunTokens) {
    unsigned long long lane_sum = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t i = first + 4 * lane + e;
      bool kept = false;
      lane_sum += draw_measure(cuts, w, i, &kept);
      if (kept) last = static_cast<uint32_t>(i + 1);
    }
    const unsigned long long sum = warp_sum_units(lane_sum);
    if (lane == 0) runs[first / kRunTokens] = sum;
    mass += sum;
  }
  if (lane == 0) warp_masses[warp] = mass;
  last = KeyReduce(last_reduce).Reduce(last, [](uint32_t x, uint32_t y) { return max(x, y); });
  __syncthreads();
  if (t == 0) {
    unsigned long long chunk_mass = 0;
    for (int i = 0; i < kThreads / 32; ++i) chunk_mass += warp_masses[i];
    st->mass[w.c] = chunk_mass;
    st->last_kept[w.c] = static_cast<int>(last) - 1;
  }
  if (!arrive_last(st, a.chunks)) return;
  // The chunk; past the sum of all (the uniform in the rounding gap at the top), the largest
  // kept id.
  if (t == 0) {
    unsigned long long target = probability_units(w.sample->uniform);
    int c = 0;
    for (; c < a.chunks; ++c) {
      const unsigned long long m = __ldcg(&st->mass[c]);
      if (target < m) break;
      target -= m;
    }
    if (c == a.chunks) {
      int largest = -1;
      for (int i = 0; i < a.chunks; ++i) largest = max(largest, __ldcg(&st->last_kept[i]));
      a.out[w.r] = largest;
    }
    chunk = c;
    rest = target;
  }
  __syncthreads();
  if (chunk == a.chunks) return;
  // The run, by a scan of the chunk's runs a tile at a time.
  const int64_t length = chunk_length(a.V, a.chunks);
  const int64_t begin = min(a.V, chunk * length), end = min(a.V, begin + length);
  const int64_t first_run = begin / kRunTokens, end_run = (end + kRunTokens - 1) / kRunTokens;
  unsigned long long carry = 0;
  for (int64_t base = first_run; base < end_run; base += kThreads) {
    const int64_t i = base + t;
    const unsigned long long m = i < end_run ? __ldcg(&runs[i]) : 0;
    unsigned long long before = 0, tile = 0;
    MassScan(scan).ExclusiveSum(m, before, tile);
    const unsigned long long target = rest;
    __syncthreads();  // every thread has read rest
    const bool here = carry + before <= target && target < carry + before + m;
    if (here) {
      run = i;
      rest = target - carry - before;
    }
    if (__syncthreads_or(here)) break;
    carry += tile;
  }
  // The token: warp 0 over the run's ids, its lanes' sums scanned.
  if (warp != 0) return;
  WholeChunk in = w;  // the chosen chunk's bounds
  in.begin = begin;
  in.end = end;
  const int64_t first = run * kRunTokens + 4 * lane;
  bool kept = false;
  unsigned long long lane_sum = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) lane_sum += draw_measure(cuts, in, first + e, &kept);
  unsigned long long inclusive = lane_sum;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const unsigned long long v = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive += v;
  }
  unsigned long long target = rest;
  const unsigned long long before = inclusive - lane_sum;
  if (before <= target && target < inclusive) {
    target -= before;
    for (int e = 0;; ++e) {
      const unsigned long long m = draw_measure(cuts, in, first + e, &kept);
      if (target < m) {
        a.out[w.r] = static_cast<int32_t>(first + e);
        break;
      }
      target -= m;
    }
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
  if (plan.kept) {
    whole_probs_kernel<<<grid, kThreads, 0, stream()>>>(a);
    KUIPER_CUDA_CHECK_LAUNCH("sampling whole-row probability kernel");
  }
  if (plan.top_p) {
    for (int shift = 32 - kDigitBits; shift > -kDigitBits; shift -= kDigitBits) {
      whole_pass_kernel<<<grid, kThreads, 0, stream()>>>(a, shift);
      KUIPER_CUDA_CHECK_LAUNCH("sampling whole-row top-p pass");
    }
    whole_ties_kernel<<<grid, kThreads, 0, stream()>>>(a);
    KUIPER_CUDA_CHECK_LAUNCH("sampling whole-row top-p ties");
  }
  if (plan.kept) {
    whole_kept_kernel<<<grid, kThreads, 0, stream()>>>(a);
    KUIPER_CUDA_CHECK_LAUNCH("sampling whole-row kept-mass kernel");
  }
  whole_draw_kernel<<<grid, kThreads, 0, stream()>>>(a);
  KUIPER_CUDA_CHECK_LAUNCH("sampling whole-row draw kernel");
  return Status::Ok();
}

// Chunks a row: as many as the GPU holds blocks of the chain at once (one wave; a wave and a
// bit more would take nearly two), each of at least kLeastChunk tokens.
Result<int> whole_chunks(int64_t S, int64_t V) {
  KUIPER_ASSIGN_OR_RETURN(const int sms, sm_count());
  static PerDevice<int> resident;  // blocks a multiprocessor holds of the largest kernel
  KUIPER_ASSIGN_OR_RETURN(const int per_sm, resident.get([]() -> Result<int> {
    int n = 0;
    KUIPER_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &n, whole_pass_kernel, kThreads, 0));
    return std::max(n, 1);
  }));
  const int64_t want = static_cast<int64_t>(sms) * per_sm / S;
  const int64_t most = std::max<int64_t>(1, V / kLeastChunk);
  return static_cast<int>(std::max<int64_t>(1, std::min({want, most, int64_t{kMostChunks}})));
}

}  // namespace

Status draw_whole_rows(const uint32_t* keys32, int64_t S, int64_t V, const op::SampleRow* rows,
                       const WholePlan& plan, op::SampleWorkspace& ws, int32_t* out) {
  // The rows' states, then their runs' sums.
  const int64_t runs_per_row = (V + kRunTokens - 1) / kRunTokens;
  const size_t state_bytes = static_cast<size_t>(S) * sizeof(WholeRow);
  const size_t bytes = state_bytes + static_cast<size_t>(S * runs_per_row) * sizeof(uint64_t);
  if (!ws.whole.defined() || ws.whole.nbytes() < bytes) {
    KUIPER_ASSIGN_OR_RETURN(ws.whole, Tensor::empty({static_cast<int64_t>(bytes)},
                                                    DataType::kUint8, DeviceType::kCuda));
  }
  KUIPER_ASSIGN_OR_RETURN(const int chunks, whole_chunks(S, V));
  char* whole = static_cast<char*>(ws.whole.raw());
  const WholeArgs args{keys32,
                       V,
                       rows,
                       reinterpret_cast<float*>(ws.alt_ids.raw()),
                       reinterpret_cast<WholeRow*>(whole),
                       reinterpret_cast<unsigned long long*>(whole + state_bytes),
                       runs_per_row,
                       chunks,
                       out};
  return whole_draw(args, S, plan);
}

}  // namespace kuiper::cuda
