#include "tools/bench/sample_bench.h"

#include <random>
#include <string>
#include <vector>

#include "kuiper/op/ops.h"
#include "tools/bench/flags.h"
#include "tools/bench/timing.h"

namespace kuiper::bench {

Result<json> bench_sample() {
  KUIPER_ASSIGN_OR_RETURN(kuiper::ModelConfig c, read_config());
  std::vector<int64_t> counts = {1, 8, 64, 256};
  if (!FLAGS_decode_batch.empty()) {
    KUIPER_ASSIGN_OR_RETURN(counts, split_lengths("decode-batch", FLAGS_decode_batch));
  }
  const int64_t V = c.vocab_size;
  op::SampleParams params;
  params.temperature = static_cast<float>(FLAGS_temperature);
  params.top_k = FLAGS_top_k;
  params.top_p = static_cast<float>(FLAGS_top_p);
  params.min_p = static_cast<float>(FLAGS_min_p);
  json rows = json::array();
  for (const int64_t S : counts) {
    // Logits uniform in [-8, 8), a model's spread, each row its own.
    KUIPER_ASSIGN_OR_RETURN(Tensor logits, Tensor::empty({S, V}, DataType::kFp32,
                                                         DeviceType::kCuda));
    KUIPER_RETURN_IF_ERROR(kuiper::op::fill_random(logits, 7 + static_cast<uint64_t>(S), 8.0f, 0.0f));
    KUIPER_ASSIGN_OR_RETURN(Tensor out, Tensor::empty({S}, DataType::kInt32, DeviceType::kCuda));
    std::mt19937_64 rng(static_cast<uint64_t>(S));
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    std::vector<op::SampleRow> table(static_cast<size_t>(S));
    for (int64_t r = 0; r < S; ++r) {
      table[static_cast<size_t>(r)].row = r;
      table[static_cast<size_t>(r)].params = params;
      table[static_cast<size_t>(r)].uniform = uniform(rng);
    }
    op::SampleWorkspace ws;
    KUIPER_ASSIGN_OR_RETURN(double seconds, time_on_stream([&](int) {
                              return kuiper::op::sample_rows(logits, table, {}, ws, out);
                            }));
    rows.push_back(json{{"rows", S},
                        {"vocab", V},
                        {"temperature", params.temperature},
                        {"top_k", params.top_k},
                        {"top_p", params.top_p},
                        {"min_p", params.min_p},
                        {"us", seconds * 1e6},
                        {"logits_gb_s", 4.0 * S * V / seconds / 1e9}});
  }
  return rows;
}

}  // namespace kuiper::bench
