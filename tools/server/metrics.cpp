#include "tools/server/metrics.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace kuiper::server {

namespace {

std::string number(double v) {
  char text[64];
  std::snprintf(text, sizeof text, "%.9g", v);
  return text;
}

void add(std::vector<std::pair<std::string, int64_t>>* counts, const std::string& key) {
  for (auto& [k, n] : *counts) {
    if (k == key) {
      ++n;
      return;
    }
  }
  counts->emplace_back(key, 1);
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value, int64_t times) {
  if (times <= 0) return;
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) -
                                       bounds_.begin());
  counts_[i] += times;
  sum_ += value * static_cast<double>(times);
  count_ += times;
}

std::string Histogram::text(const std::string& name, const std::string& help) const {
  std::ostringstream out;
  out << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out << name << "_bucket{le=\"" << number(bounds_[i]) << "\"} " << cumulative << "\n";
  }
  out << name << "_bucket{le=\"+Inf\"} " << count_ << "\n";
  out << name << "_sum " << number(sum_) << "\n" << name << "_count " << count_ << "\n";
  return out.str();
}

// The bounds vLLM uses for the same histograms.
Metrics::Metrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
             7.5, 10.0, 20.0, 40.0, 80.0}),
      inter_token_({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                    5.0, 7.5, 10.0, 20.0, 40.0, 80.0}),
      e2e_({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
            120.0, 240.0, 480.0, 960.0}) {}

void Metrics::set_gauges(const EngineGauges& gauges) {
  std::lock_guard<std::mutex> lock(mutex_);
  gauges_ = gauges;
}

EngineGauges Metrics::gauges() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return gauges_;
}

void Metrics::finished(const std::string& status, int64_t prompt_tokens, int64_t generated_tokens,
                       double ttft_seconds, double inter_token_seconds, int64_t decode_steps,
                       double e2e_seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  add(&requests_, status);
  prompt_tokens_ += prompt_tokens;
  generated_tokens_ += generated_tokens;
  if (generated_tokens > 0) ttft_.observe(ttft_seconds);
  inter_token_.observe(inter_token_seconds, decode_steps);
  e2e_.observe(e2e_seconds);
}

void Metrics::rejected(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  add(&rejected_, reason);
}

std::string Metrics::prometheus_text() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::ostringstream out;
  auto gauge = [&](const char* name, const char* help, double value) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " gauge\n"
        << name << " " << number(value) << "\n";
  };
  auto counter = [&](const char* name, const char* help, double value) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n"
        << name << " " << number(value) << "\n";
  };
  gauge("kuiper_requests_running", "Requests in the running batch.",
        static_cast<double>(gauges_.running));
  gauge("kuiper_requests_waiting", "Requests waiting for a place in the batch.",
        static_cast<double>(gauges_.waiting));
  gauge("kuiper_kv_blocks_used", "KV cache blocks held by requests.",
        static_cast<double>(gauges_.kv_blocks_used));
  gauge("kuiper_kv_blocks_total", "KV cache blocks in the pool.",
        static_cast<double>(gauges_.kv_blocks_total));
  gauge("kuiper_kv_block_size_tokens", "Tokens per KV cache block.",
        static_cast<double>(gauges_.kv_block_size));
  gauge("kuiper_prefix_cache_hit_rate",
        "Fraction of admitted prompt tokens found in the prefix cache.",
        gauges_.prefix_cache_hit_rate);
  counter("kuiper_prompt_tokens_total", "Prompt tokens of finished requests.",
          static_cast<double>(prompt_tokens_));
  counter("kuiper_generation_tokens_total", "Tokens generated.",
          static_cast<double>(generated_tokens_));
  out << "# HELP kuiper_requests_total Requests that reached the engine, by how they ended.\n"
         "# TYPE kuiper_requests_total counter\n";
  for (const auto& [status, n] : requests_) {
    out << "kuiper_requests_total{status=\"" << status << "\"} " << n << "\n";
  }
  out << "# HELP kuiper_requests_rejected_total Requests refused before the engine, by reason.\n"
         "# TYPE kuiper_requests_rejected_total counter\n";
  for (const auto& [reason, n] : rejected_) {
    out << "kuiper_requests_rejected_total{reason=\"" << reason << "\"} " << n << "\n";
  }
  out << ttft_.text("kuiper_time_to_first_token_seconds", "Time to the first token.");
  out << inter_token_.text("kuiper_inter_token_latency_seconds",
                           "Time between generated tokens (each request's mean, per token).");
  out << e2e_.text("kuiper_e2e_request_latency_seconds", "Request latency, end to end.");
  return out.str();
}

}  // namespace kuiper::server
