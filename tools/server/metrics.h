// What kuiper-server counts, written as Prometheus text for GET /metrics: the engine's state
// (requests running and waiting, KV blocks, prefix-cache hits) as the engine thread last saw
// it, counters of requests and tokens, and latency histograms.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace kuiper::server {

// A Prometheus histogram: cumulative counts per upper bound, the sum and the count.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  // Records `value` `times` times.
  void observe(double value, int64_t times = 1);
  // The histogram's lines (_bucket with le="...", _sum, _count) for metric `name`.
  std::string text(const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bound, not cumulative; the last is +Inf
  double sum_ = 0.0;
  int64_t count_ = 0;
};

struct EngineGauges {
  int64_t running = 0;
  int64_t waiting = 0;  // in the engine's queue and the server's inbox
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_block_size = 0;
  double prefix_cache_hit_rate = 0.0;  // prompt tokens found cached / prompt tokens admitted
};

// Thread-safe: the engine thread records, HTTP threads read.
class Metrics {
 public:
  Metrics();
  void set_gauges(const EngineGauges& gauges);
  EngineGauges gauges() const;
  // A request ended with `status` ("ok", "cancelled", "error", ...): its token counts and
  // latencies (first token, mean time between later tokens, end to end).
  void finished(const std::string& status, int64_t prompt_tokens, int64_t generated_tokens,
                double ttft_seconds, double inter_token_seconds, int64_t decode_steps,
                double e2e_seconds);
  void rejected(const std::string& reason);  // refused before reaching the engine (400, 429, ...)
  std::string prometheus_text() const;

 private:
  mutable std::mutex mutex_;
  EngineGauges gauges_;
  std::vector<std::pair<std::string, int64_t>> requests_;  // status -> count
  std::vector<std::pair<std::string, int64_t>> rejected_;
  int64_t prompt_tokens_ = 0;
  int64_t generated_tokens_ = 0;
  Histogram ttft_, inter_token_, e2e_;
};

}  // namespace kuiper::server
