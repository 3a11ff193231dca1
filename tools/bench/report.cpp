#include "tools/bench/report.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "tools/bench/flags.h"

namespace kuiper::bench {

namespace {

double num(const json& row, const char* key) {
  return row.contains(key) && row[key].is_number() ? row[key].get<double>() : 0.0;
}

long long integer(const json& row, const char* key) {
  return row.contains(key) && row[key].is_number_integer() ? row[key].get<long long>() : 0;
}

}  // namespace

void print_tables(const Report& r, double copy_gbs) {
  if (!r.matmul.empty()) {
    std::printf("| weight | N | K | decode us | decode GB/s | %% of D2D copy | prefill T | "
                "prefill us | prefill TFLOP/s |\n|---|---|---|---|---|---|---|---|---|\n");
    for (const json& m : r.matmul) {
      std::printf("| %s | %lld | %lld | %.1f | %.0f | %.0f%% | %lld | %.1f | %.0f |\n",
                  m["shape"].get<std::string>().c_str(), m["N"].get<long long>(),
                  m["K"].get<long long>(), num(m, "decode_us"), num(m, "decode_gb_s"),
                  num(m, "decode_pct_of_copy"), integer(m, "prefill_tokens"),
                  num(m, "prefill_us"), num(m, "prefill_tflop_s"));
    }
    std::printf("\n");
  }
  if (!r.sample.empty()) {
    std::printf("| rows | vocab | temperature | top-k | top-p | min-p | us | logits GB/s |\n"
                "|---|---|---|---|---|---|---|---|\n");
    for (const json& m : r.sample) {
      std::printf("| %lld | %lld | %g | %lld | %g | %g | %.1f | %.0f |\n", integer(m, "rows"),
                  integer(m, "vocab"), num(m, "temperature"), integer(m, "top_k"), num(m, "top_p"),
                  num(m, "min_p"), num(m, "us"), num(m, "logits_gb_s"));
    }
    std::printf("\n");
  }
  if (!r.attention.empty()) {
    std::printf("| attention | kernel | phase | heads | kv heads | head dim | kv len | queries | us | "
                "KV GB/s | %% of copy | TFLOP/s | %% of peak |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const json& a : r.attention) {
      std::printf("| %s | %s | %s | %lld | %lld | %lld | %lld | %lld | %.1f | %.0f | %.0f%% | %.1f | "
                  "%.1f%% |\n",
                  a["attention"].get<std::string>().c_str(), a["kernel"].get<std::string>().c_str(),
                  a["phase"].get<std::string>().c_str(), a["heads"].get<long long>(),
                  a["kv_heads"].get<long long>(), a["head_dim"].get<long long>(),
                  a["kv_len"].get<long long>(), a["queries"].get<long long>(), num(a, "us"),
                  num(a, "kv_gb_s"), num(a, "kv_pct_of_copy"), num(a, "tflop_s"),
                  num(a, "pct_of_peak"));
    }
    std::printf("\n");
  }
  if (!r.runs.empty()) {
    std::printf("| model | dtype | attention | graph | prompt | gen | prefill ms | prefill tok/s | "
                "decode tok/s | decode GB/s | %% of D2D copy | peak GiB |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const json& m : r.runs) {
      std::printf("| %s | %s | %s | %s | %d | %d | %.1f | %.0f | %.1f | %.0f | %.0f%% | %.2f |\n",
                  m["model"].get<std::string>().c_str(), m["dtype"].get<std::string>().c_str(),
                  m["attention"].get<std::string>().c_str(),
                  m["cuda_graph"].get<bool>() ? "on" : "off", m["prompt"].get<int>(),
                  m["gen"].get<int>(), num(m, "prefill_ms"), num(m, "prefill_tok_s"),
                  num(m, "decode_tok_s"), num(m, "decode_gb_s"), num(m, "decode_pct_of_copy"),
                  num(m, "peak_gib"));
    }
    std::printf("\n");
  }
  if (!r.decode.empty()) {
    std::printf("| attention | graph | context | gen | decode tok/s | ms/token | GB/s | %% of copy | "
                "ceiling tok/s | fill s |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (const json& d : r.decode) {
      std::printf("| %s | %s | %lld | %d | %.1f | %.2f | %.0f | %.0f%% | %.1f | %.1f |\n",
                  d["attention"].get<std::string>().c_str(),
                  d["cuda_graph"].get<bool>() ? "on" : "off", d["context"].get<long long>(),
                  d["gen"].get<int>(), num(d, "decode_tok_s"), num(d, "decode_ms_per_token"),
                  num(d, "decode_gb_s"), num(d, "decode_pct_of_copy"), num(d, "ceiling_tok_s"),
                  num(d, "fill_s"));
    }
    std::printf("\n");
  }
  if (!r.prefill.empty()) {
    std::printf("| attention | prompt | prefill ms | prefill tok/s | TFLOP/s | %% of peak | "
                "attention share of FLOPs |\n|---|---|---|---|---|---|---|\n");
    for (const json& p : r.prefill) {
      std::printf("| %s | %lld | %.1f | %.0f | %.1f | %.1f%% | %.0f%% |\n",
                  p["attention"].get<std::string>().c_str(), p["prompt"].get<long long>(),
                  num(p, "prefill_ms"), num(p, "prefill_tok_s"), num(p, "prefill_tflop_s"),
                  num(p, "pct_of_peak"), 100.0 * num(p, "attention_flop_share"));
    }
    std::printf("\n");
  }
  if (!r.memory.empty()) {
    std::printf("| attention | KV cache tokens | weights GiB | KV cache GiB | peak GiB | "
                "peak - weights - KV GiB | reserved GiB | device used GiB |\n"
                "|---|---|---|---|---|---|---|---|\n");
    for (const json& m : r.memory) {
      std::printf("| %s | %lld | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n",
                  m["attention"].get<std::string>().c_str(), m["max_context"].get<long long>(),
                  num(m, "weights_gib"), num(m, "kv_cache_gib"), num(m, "peak_gib"),
                  num(m, "excess_gib"), num(m, "reserved_gib"), num(m, "device_used_gib"));
    }
    std::printf("\n");
  }
  if (!r.throughput.empty()) {
    std::printf("| attention | concurrency | requests | in | out | output tok/s | decode tok/s | "
                "full-batch decode tok/s | total tok/s | req/s | TTFT p50 ms | TTFT p99 ms | "
                "ITL p50 ms | ITL p99 ms | tok/step | cached | KV used / live | %% of roofline |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const json& t : r.throughput) {
      char roofline[32] = "-";
      if (t.contains("roofline_pct")) {
        std::snprintf(roofline, sizeof roofline, "%.1f%% (%s)", num(t, "roofline_pct"),
                      t["bound"].get<std::string>().c_str());
      }
      std::printf("| %s | %lld | %lld | %.0f | %.0f | %.1f | %.1f | %.1f | %.1f | %.2f | %.1f | "
                  "%.1f | %.2f | %.2f | %.1f | %.0f%% | %.0f%% / %.0f%% | %s |\n",
                  t["attention"].get<std::string>().c_str(), t["concurrency"].get<long long>(),
                  t["requests"].get<long long>(), num(t, "input_len"), num(t, "output_len"),
                  num(t, "output_tok_s"), num(t, "decode_tok_s"),
                  num(t, "full_batch_decode_tok_s"), num(t, "total_tok_s"),
                  num(t, "request_s"), num(t, "ttft_ms_p50"), num(t, "ttft_ms_p99"),
                  num(t, "itl_ms_p50"), num(t, "itl_ms_p99"), num(t, "tokens_per_step"),
                  100.0 * num(t, "cached_fraction"), num(t, "kv_peak_used_pct"),
                  num(t, "kv_live_pct"), roofline);
    }
    std::printf("\n");
  }
  for (const json& s : r.skipped) std::printf("skipped: %s\n", s.dump().c_str());
  if (copy_gbs > 0) std::printf("D2D copy bandwidth (read + write): %.0f GB/s\n", copy_gbs);
}

Status write_json(const json& doc) {
  if (FLAGS_json == "-") {
    std::printf("%s\n", doc.dump(2).c_str());
    return Status::Ok();
  }
  std::ofstream out(FLAGS_json);
  if (!out) return Status::Error("--json: cannot write " + FLAGS_json);
  out << doc.dump(2) << "\n";
  if (!out) return Status::Error("--json: error writing " + FLAGS_json);
  return Status::Ok();
}

void fill(json* doc, const Report& report) {
  (*doc)["decode"] = report.decode;
  (*doc)["prefill"] = report.prefill;
  (*doc)["memory"] = report.memory;
  (*doc)["runs"] = report.runs;
  (*doc)["attention"] = report.attention;
  (*doc)["matmul"] = report.matmul;
  (*doc)["sample"] = report.sample;
  (*doc)["throughput"] = report.throughput;
  (*doc)["skipped"] = report.skipped;
}

}  // namespace kuiper::bench
