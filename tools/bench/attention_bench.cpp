#include "tools/bench/attention_bench.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "kuiper/op/attention.h"
#include "kuiper/op/ops.h"
#include "tools/bench/cost_model.h"
#include "tools/bench/flags.h"
#include "tools/bench/timing.h"

namespace kuiper::bench {

namespace {

// One attention case: T queries at positions [L - T, L) over a cache of L keys. The K/V cache is
// rotated through enough copies (at least 256 MB in all) that repeated calls cannot find it in
// L2, as in a model step, where each layer reads its own cache.
Result<json> bench_attention_case(const std::string& kind, DataType activation, bool decode,
                                  int64_t L, int64_t T, double copy_gbs) {
  const int64_t H = FLAGS_heads, KVH = FLAGS_kv_heads, D = FLAGS_head_dim;
  kuiper::op::AttentionRequest request;
  KUIPER_ASSIGN_OR_RETURN(request.kind, kuiper::parse_attention(kind));
  request.phase = decode ? kuiper::op::AttentionPhase::kDecode : kuiper::op::AttentionPhase::kPrefill;
  request.dtype = activation;
  request.device = DeviceType::kCuda;
  request.device_position = decode && FLAGS_cuda_graph;
  request.head_dim = D;
  request.decode_grid = FLAGS_decode_grid;
  request.pdl = FLAGS_pdl;
  KUIPER_ASSIGN_OR_RETURN(std::unique_ptr<kuiper::op::AttentionOp> op,
                          kuiper::op::make_attention(request));
  const int64_t start = L - T;
  const size_t elem = kuiper::dtype_size(activation);
  const double kv_bytes = 2.0 * L * KVH * D * elem;
  const int copies = static_cast<int>(std::clamp(std::ceil(256e6 / kv_bytes), 1.0, 64.0));
  std::vector<kuiper::op::AttentionArgs> args(static_cast<size_t>(copies));
  Tensor q, out, position;
  KUIPER_ASSIGN_OR_RETURN(q, Tensor::empty({T, H, D}, activation, DeviceType::kCuda));
  KUIPER_ASSIGN_OR_RETURN(out, Tensor::empty({T, H, D}, activation, DeviceType::kCuda));
  KUIPER_RETURN_IF_ERROR(kuiper::op::fill_random(q, 1, 1.0f, 0.0f));
  KUIPER_ASSIGN_OR_RETURN(position, Tensor::empty({1}, DataType::kInt32, DeviceType::kCuda));
  const int32_t pos = static_cast<int32_t>(start);
  KUIPER_RETURN_IF_ERROR(
      kuiper::copy_bytes(position.raw(), DeviceType::kCuda, &pos, DeviceType::kCpu, 4));
  for (int i = 0; i < copies; ++i) {
    kuiper::op::AttentionArgs& a = args[static_cast<size_t>(i)];
    a.q = q;
    a.out = out;
    KUIPER_ASSIGN_OR_RETURN(a.k_cache, Tensor::empty({L, KVH, D}, activation, DeviceType::kCuda));
    KUIPER_ASSIGN_OR_RETURN(a.v_cache, Tensor::empty({L, KVH, D}, activation, DeviceType::kCuda));
    KUIPER_RETURN_IF_ERROR(kuiper::op::fill_random(a.k_cache, 2 + 2 * i, 1.0f, 0.0f));
    KUIPER_RETURN_IF_ERROR(kuiper::op::fill_random(a.v_cache, 3 + 2 * i, 1.0f, 0.0f));
    a.start = start;
    a.device_position = position;
  }
  // Device-position decode is timed as it runs in a model: replayed from a captured graph.
  const bool graph = request.device_position && FLAGS_replay_graph;
  KUIPER_ASSIGN_OR_RETURN(double seconds, time_on_stream(
                                              [&](int i) {
                                                return op->forward(args[static_cast<size_t>(i % copies)]);
                                              },
                                              graph));
  const double flops = causal_attention_flops(H, D, start, T);
  const double gbs = kv_bytes / seconds / 1e9, tflops = flops / seconds / 1e12;
  return json{{"attention", kind},
              {"kernel", op->name()},
              {"dtype", kuiper::dtype_name(activation)},
              {"phase", decode ? "decode" : "prefill"},
              {"heads", H},
              {"kv_heads", KVH},
              {"head_dim", D},
              {"kv_len", L},
              {"queries", T},
              {"kv_copies", copies},
              {"timing", graph ? "graph replay" : "stream"},
              {"us", seconds * 1e6},
              {"kv_gb_s", gbs},
              {"kv_pct_of_copy", 100.0 * gbs / copy_gbs},
              {"flops", flops},
              {"tflop_s", tflops},
              {"pct_of_peak", 100.0 * tflops / FLAGS_peak_tflops}};
}

// B decode sequences of L keys each in one paged call (AttentionArgs::paged): the pool holds
// every sequence's blocks in a scrambled order, as a serving engine's does after a while. The
// pool is rotated through copies like the contiguous cache above.
Result<json> bench_paged_decode(const std::string& kind, DataType activation, int64_t B, int64_t L,
                                double copy_gbs) {
  const int64_t H = FLAGS_heads, KVH = FLAGS_kv_heads, D = FLAGS_head_dim, bs = FLAGS_block_size;
  kuiper::op::AttentionRequest request;
  KUIPER_ASSIGN_OR_RETURN(request.kind, kuiper::parse_attention(kind));
  request.phase = kuiper::op::AttentionPhase::kDecode;
  request.dtype = activation;
  request.device = DeviceType::kCuda;
  request.device_position = FLAGS_cuda_graph;
  request.head_dim = D;
  request.decode_grid = FLAGS_decode_grid;
  request.pdl = FLAGS_pdl;
  KUIPER_ASSIGN_OR_RETURN(std::unique_ptr<kuiper::op::AttentionOp> op,
                          kuiper::op::make_attention(request));
  // Sequence i has lens[i] keys: L each, or spread evenly over L -/+ spread / 2 and shuffled.
  const int64_t spread = FLAGS_kv_len_spread;
  std::vector<int64_t> lens(static_cast<size_t>(B), L);
  for (int64_t i = 0; i < B && B > 1; ++i) {
    lens[static_cast<size_t>(i)] = L - spread / 2 + spread * i / (B - 1);
  }
  std::shuffle(lens.begin(), lens.end(), std::mt19937(2));
  const int64_t longest = *std::max_element(lens.begin(), lens.end());
  const int64_t keys = std::accumulate(lens.begin(), lens.end(), int64_t{0});
  const int64_t W = (longest + bs - 1) / bs, blocks = B * W;
  const size_t elem = kuiper::dtype_size(activation);
  const double kv_bytes = 2.0 * keys * KVH * D * elem;
  const int copies = static_cast<int>(std::clamp(std::ceil(256e6 / kv_bytes), 1.0, 64.0));
  std::vector<int32_t> begin(static_cast<size_t>(B + 1)), starts(static_cast<size_t>(B));
  for (int64_t i = 0; i <= B; ++i) begin[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  for (int64_t i = 0; i < B; ++i) {
    starts[static_cast<size_t>(i)] = static_cast<int32_t>(lens[static_cast<size_t>(i)] - 1);
  }
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int64_t i = 0; i < blocks; ++i) table[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  std::shuffle(table.begin(), table.end(), std::mt19937(1));
  auto upload = [](const std::vector<int32_t>& values, std::vector<int64_t> shape) -> Result<Tensor> {
    KUIPER_ASSIGN_OR_RETURN(Tensor t, Tensor::empty(std::move(shape), DataType::kInt32,
                                                    DeviceType::kCuda));
    KUIPER_RETURN_IF_ERROR(kuiper::copy_bytes(t.raw(), DeviceType::kCuda, values.data(),
                                              DeviceType::kCpu, values.size() * 4));
    return t;
  };
  kuiper::op::PagedBatch paged;
  KUIPER_ASSIGN_OR_RETURN(paged.query_begin, upload(begin, {B + 1}));
  KUIPER_ASSIGN_OR_RETURN(paged.starts, upload(starts, {B}));
  KUIPER_ASSIGN_OR_RETURN(paged.block_tables, upload(table, {B, W}));
  paged.block_size = bs;
  paged.max_queries = 1;
  paged.max_keys = longest;
  Tensor q, out;
  KUIPER_ASSIGN_OR_RETURN(q, Tensor::empty({B, H, D}, activation, DeviceType::kCuda));
  KUIPER_ASSIGN_OR_RETURN(out, Tensor::empty({B, H, D}, activation, DeviceType::kCuda));
  KUIPER_RETURN_IF_ERROR(kuiper::op::fill_random(q, 1, 1.0f, 0.0f));
  std::vector<kuiper::op::AttentionArgs> args(static_cast<size_t>(copies));
  for (int i = 0; i < copies; ++i) {
    kuiper::op::AttentionArgs& a = args[static_cast<size_t>(i)];
    a.q = q;
    a.out = out;
    a.paged = paged;
    KUIPER_ASSIGN_OR_RETURN(a.k_cache,
                            Tensor::empty({blocks * bs, KVH, D}, activation, DeviceType::kCuda));
    KUIPER_ASSIGN_OR_RETURN(a.v_cache,
                            Tensor::empty({blocks * bs, KVH, D}, activation, DeviceType::kCuda));
    KUIPER_RETURN_IF_ERROR(kuiper::op::fill_random(a.k_cache, 2 + 2 * i, 1.0f, 0.0f));
    KUIPER_RETURN_IF_ERROR(kuiper::op::fill_random(a.v_cache, 3 + 2 * i, 1.0f, 0.0f));
  }
  const bool graph = request.device_position && FLAGS_replay_graph;
  KUIPER_ASSIGN_OR_RETURN(double seconds, time_on_stream(
                                              [&](int i) {
                                                return op->forward(args[static_cast<size_t>(i % copies)]);
                                              },
                                              graph));
  double flops = 0.0;
  for (int64_t len : lens) flops += causal_attention_flops(H, D, len - 1, 1);
  const double gbs = kv_bytes / seconds / 1e9, tflops = flops / seconds / 1e12;
  return json{{"attention", kind},
              {"kernel", op->name()},
              {"dtype", kuiper::dtype_name(activation)},
              {"phase", "decode"},
              {"queries", B},  // one a sequence: the report's queries column is the batch
              {"sequences", B},
              {"kv_len_spread", spread},
              {"block_size", bs},
              {"heads", H},
              {"kv_heads", KVH},
              {"head_dim", D},
              {"kv_len", L},
              {"kv_copies", copies},
              {"timing", graph ? "graph replay" : "stream"},
              {"us", seconds * 1e6},
              {"kv_gb_s", gbs},
              {"kv_pct_of_copy", 100.0 * gbs / copy_gbs},
              {"flops", flops},
              {"tflop_s", tflops},
              {"pct_of_peak", 100.0 * tflops / FLAGS_peak_tflops}};
}

}  // namespace

Result<json> bench_attention(const std::string& kind, DataType activation, double copy_gbs) {
  json rows = json::array();
  if (!FLAGS_decode_batch.empty()) {
    KUIPER_ASSIGN_OR_RETURN(std::vector<int64_t> batches,
                            split_lengths("decode-batch", FLAGS_decode_batch));
    for (int64_t B : batches) {
      KUIPER_ASSIGN_OR_RETURN(json r, bench_paged_decode(kind, activation, B, FLAGS_kv_len,
                                                         copy_gbs));
      rows.push_back(r);
    }
    return rows;
  }
  if (FLAGS_decode_kv_lens.empty() && FLAGS_causal_lens.empty()) {
    const int64_t L = FLAGS_kv_len, P = std::min<int64_t>(FLAGS_prefill_len, L);
    KUIPER_ASSIGN_OR_RETURN(json d, bench_attention_case(kind, activation, true, L, 1, copy_gbs));
    rows.push_back(d);
    KUIPER_ASSIGN_OR_RETURN(json p, bench_attention_case(kind, activation, false, L, P, copy_gbs));
    rows.push_back(p);
    return rows;
  }
  KUIPER_ASSIGN_OR_RETURN(std::vector<int64_t> kv_lens,
                          split_lengths("decode-kv-lens", FLAGS_decode_kv_lens));
  KUIPER_ASSIGN_OR_RETURN(std::vector<int64_t> causal, split_lengths("causal-lens", FLAGS_causal_lens));
  for (int64_t L : kv_lens) {
    KUIPER_ASSIGN_OR_RETURN(json r, bench_attention_case(kind, activation, true, L, 1, copy_gbs));
    rows.push_back(r);
  }
  for (int64_t T : causal) {
    KUIPER_ASSIGN_OR_RETURN(json r, bench_attention_case(kind, activation, false, T, T, copy_gbs));
    rows.push_back(r);
  }
  return rows;
}

}  // namespace kuiper::bench
