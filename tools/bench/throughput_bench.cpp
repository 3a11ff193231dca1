#include "tools/bench/throughput_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <unordered_map>

#include "kuiper/model/model.h"
#include "kuiper/runtime/engine.h"
#include "tools/bench/cost_model.h"
#include "tools/bench/device.h"
#include "tools/bench/flags.h"
#include "tools/bench/word_tokenizer.h"

namespace kuiper::bench {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Nearest-rank percentile (p in (0, 1]) of `v`; 0 for none.
double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

struct Workload {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> outputs;
};

struct WorkloadShape {
  int64_t requests = 0;
  int64_t input_len = 0;
  int64_t output_len = 0;
  double jitter = 0;
  int64_t shared_prefix = 0;
  uint64_t seed = 0;
};

// Random token ids: every prompt is the shared prefix, then at least one token of its own up to
// its drawn length; lengths drawn uniformly within +-jitter of the mean.
Workload make_workload(const kuiper::ModelConfig& c, const WorkloadShape& shape) {
  std::mt19937_64 rng(shape.seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(c.vocab_size - 1));
  std::uniform_real_distribution<double> spread(-shape.jitter, shape.jitter);
  auto draw = [&](int64_t mean) {
    return std::max<int64_t>(1, std::llround(static_cast<double>(mean) * (1.0 + spread(rng))));
  };
  std::vector<int32_t> prefix(static_cast<size_t>(shape.shared_prefix));
  for (int32_t& id : prefix) id = token(rng);
  Workload w;
  for (int64_t i = 0; i < shape.requests; ++i) {
    const auto length =
        static_cast<size_t>(std::max(draw(shape.input_len), shape.shared_prefix + 1));
    std::vector<int32_t> prompt = prefix;
    while (prompt.size() < length) prompt.push_back(token(rng));
    w.prompts.push_back(std::move(prompt));
    w.outputs.push_back(draw(shape.output_len));
  }
  return w;
}

// What serving a workload at one concurrency measured.
struct Served {
  double seconds = 0;
  int64_t steps = 0;  // Engine::step() calls: one forward each
  std::vector<ServedRequest> requests;
  std::vector<double> ttft;  // per request, from the start (every request is queued then)
  std::vector<double> itl;   // every gap between two tokens of one request
  SchedulerStats stats;
  int64_t evictions = 0;
  // Steps that only decoded, every running sequence one token (the steady state the batched
  // decode peer measures): their tokens and time.
  int64_t decode_tokens = 0;
  double decode_seconds = 0;
  double decode_forward_seconds = 0;  // of which the forward and sampling (Engine::last_step)
  // Of those, the steps where every slot of the batch decoded (decode_tokens == concurrency):
  // exactly the peer's workload, B sequences a step, without the steps of a draining batch.
  int64_t full_tokens = 0;
  double full_seconds = 0;
  // The step that held the most of the KV pool: blocks in use and the live tokens in them.
  int64_t peak_used_blocks = 0;
  int64_t peak_live_tokens = 0;
  int64_t kv_blocks = 0, kv_block_size = 0;  // the pool
};

// Queues every request of `w` on a fresh engine (an empty prefix cache) and steps it until all
// are done. Each token's arrival is timed by the request's text callback: with the word
// tokenizer every token streams as one piece.
Result<Served> serve(kuiper::Model& model, const Tokenizer& tokenizer, const Workload& w,
                     int64_t concurrency) {
  const size_t n = w.prompts.size();
  std::vector<std::vector<Clock::time_point>> arrivals(n);  // outlives the engine's callbacks
  std::unordered_map<int64_t, size_t> index;
  EngineOptions engine_options;
  engine_options.max_batch = concurrency;
  engine_options.max_batch_tokens = FLAGS_max_batch_tokens;
  engine_options.overlap_steps = FLAGS_overlap_steps;
  KUIPER_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                          Engine::create(model, tokenizer, engine_options));
  GenerationOptions options;
  options.sampling.temperature = static_cast<float>(FLAGS_temperature);  // 0: the arg-max
  options.sampling.top_k = FLAGS_top_k;
  options.sampling.top_p = static_cast<float>(FLAGS_top_p);
  options.sampling.min_p = static_cast<float>(FLAGS_min_p);
  options.ignore_eos = true;
  const Clock::time_point start = Clock::now();
  for (size_t i = 0; i < n; ++i) {
    arrivals[i].reserve(static_cast<size_t>(w.outputs[i]));
    options.max_tokens = w.outputs[i];
    options.sampling.seed = i + 1;
    std::vector<Clock::time_point>* times = &arrivals[i];
    TextCallback on_text = [times](const std::string&) { times->push_back(Clock::now()); };
    KUIPER_ASSIGN_OR_RETURN(const int64_t id,
                            engine->add_request(w.prompts[i], {}, options, std::move(on_text)));
    index[id] = i;
  }
  Served s;
  s.requests.resize(n);
  while (engine->unfinished() > 0) {
    const Clock::time_point step_start = Clock::now();
    KUIPER_ASSIGN_OR_RETURN(std::vector<FinishedRequest> done, engine->step());
    ++s.steps;
    const StepStats& step = engine->last_step();
    if (step.prefill_tokens == 0 && step.decode_tokens > 0) {
      s.decode_tokens += step.decode_tokens;
      s.decode_seconds += seconds_between(step_start, Clock::now());
      s.decode_forward_seconds += step.forward_seconds;
      if (step.decode_tokens == concurrency) {
        s.full_tokens += step.decode_tokens;
        s.full_seconds += seconds_between(step_start, Clock::now());
      }
    }
    if (step.used_blocks > s.peak_used_blocks) {
      s.peak_used_blocks = step.used_blocks;
      s.peak_live_tokens = engine->live_tokens();
    }
    for (const FinishedRequest& f : done) {
      const size_t i = index.at(f.id);
      const std::string which = "request " + std::to_string(i);
      if (!f.generation.ok()) return f.generation.status().With(which);
      const Generation& g = f.generation.value();
      const auto want = static_cast<size_t>(w.outputs[i]);
      if (g.ids.size() != want || arrivals[i].size() != want) {
        return Status::Error(which + ": " + std::to_string(g.ids.size()) + " tokens (" +
                             std::to_string(arrivals[i].size()) + " streamed) of " +
                             std::to_string(want) + ", finished: " + finish_reason_name(g.finish));
      }
      const auto prompt = static_cast<int64_t>(w.prompts[i].size());
      s.requests[i] = {prompt, prompt - g.stats.prefilled_tokens, w.outputs[i]};
    }
  }
  s.seconds = seconds_between(start, Clock::now());
  for (const std::vector<Clock::time_point>& times : arrivals) {
    s.ttft.push_back(seconds_between(start, times.front()));
    for (size_t k = 1; k < times.size(); ++k) {
      s.itl.push_back(seconds_between(times[k - 1], times[k]));
    }
  }
  s.stats = engine->stats();
  s.evictions = engine->pool().evictions();
  s.kv_blocks = engine->pool().blocks();
  s.kv_block_size = engine->pool().block_size();
  return s;
}

// The row of one concurrency: rates, latencies, the prefix cache, and (with a bandwidth) the
// roofline: the time the run's bytes take at the copy bandwidth (the weights once per step, the
// KV rows each decode token attends to) or its FLOPs at --peak-tflops, whichever is longer,
// over the measured time.
json point_row(const std::string& kind, const ThroughputSetup& setup, int64_t concurrency,
               const Served& s) {
  const kuiper::ModelConfig& c = setup.config;
  const size_t elem = kuiper::dtype_size(setup.activation);
  int64_t prompt_tokens = 0, prefilled = 0, output_tokens = 0;
  double flops = 0, kv_bytes = 0;
  for (const ServedRequest& r : s.requests) {
    prompt_tokens += r.prompt;
    prefilled += r.prompt - r.cached;
    output_tokens += r.output;
    flops += served_flops(c, r);
    kv_bytes += served_decode_kv_bytes(c, elem, r);
  }
  const auto requests = static_cast<double>(s.requests.size());
  const int64_t run_tokens = prefilled + output_tokens - static_cast<int64_t>(s.requests.size());
  json row{{"model", setup.name},
           {"attention", kind},
           {"device", FLAGS_device},
           {"dtype", kuiper::dtype_name(setup.activation)},
           {"cuda_graph", FLAGS_cuda_graph && setup.device == DeviceType::kCuda},
           {"concurrency", concurrency},
           {"requests", s.requests.size()},
           {"input_len", static_cast<double>(prompt_tokens) / requests},
           {"output_len", static_cast<double>(output_tokens) / requests},
           {"len_jitter", FLAGS_len_jitter},
           {"shared_prefix", FLAGS_shared_prefix},
           {"max_batch_tokens", FLAGS_max_batch_tokens},
           {"overlap_steps", FLAGS_overlap_steps},
           {"temperature", FLAGS_temperature},
           {"top_k", FLAGS_top_k},
           {"top_p", FLAGS_top_p},
           {"min_p", FLAGS_min_p},
           {"seconds", s.seconds},
           {"steps", s.steps},
           {"tokens_per_step", static_cast<double>(run_tokens) / static_cast<double>(s.steps)},
           {"prompt_tokens", prompt_tokens},
           {"prefilled_tokens", prefilled},
           {"output_tokens", output_tokens},
           {"output_tok_s", static_cast<double>(output_tokens) / s.seconds},
           {"total_tok_s", static_cast<double>(prompt_tokens + output_tokens) / s.seconds},
           {"request_s", requests / s.seconds},
           {"ttft_ms_p50", 1e3 * percentile(s.ttft, 0.50)},
           {"ttft_ms_p99", 1e3 * percentile(s.ttft, 0.99)},
           {"itl_ms_p50", 1e3 * percentile(s.itl, 0.50)},
           {"itl_ms_p99", 1e3 * percentile(s.itl, 0.99)},
           {"decode_tok_s", s.decode_seconds > 0 ? static_cast<double>(s.decode_tokens) /
                                                        s.decode_seconds
                                                  : 0.0},
           {"full_batch_decode_tok_s",
            s.full_seconds > 0 ? static_cast<double>(s.full_tokens) / s.full_seconds : 0.0},
           {"full_batch_decode_steps", s.full_tokens / std::max<int64_t>(concurrency, 1)},
           {"decode_forward_share", s.decode_seconds > 0
                                        ? s.decode_forward_seconds / s.decode_seconds
                                        : 0.0},
           {"decode_share", static_cast<double>(s.decode_tokens) /
                                static_cast<double>(std::max<int64_t>(output_tokens, 1))},
           {"kv_blocks", s.kv_blocks},
           {"kv_peak_used_pct", 100.0 * static_cast<double>(s.peak_used_blocks) /
                                    static_cast<double>(std::max<int64_t>(s.kv_blocks, 1))},
           {"kv_live_pct", 100.0 * static_cast<double>(s.peak_live_tokens) /
                               static_cast<double>(std::max<int64_t>(
                                   s.peak_used_blocks * s.kv_block_size, 1))},
           {"cached_fraction", s.stats.cached_fraction()},
           {"preemptions", s.stats.preemptions},
           {"evictions", s.evictions}};
  if (setup.copy_gbs > 0) {
    const double bytes =
        static_cast<double>(s.steps) * decode_bytes(c, elem, 0, setup.quantize) + kv_bytes;
    const double memory_s = bytes / (setup.copy_gbs * 1e9);
    const double compute_s = flops / (FLAGS_peak_tflops * 1e12);
    row["bytes"] = bytes;
    row["flops"] = flops;
    row["copy_gb_s"] = setup.copy_gbs;
    row["memory_bound_s"] = memory_s;
    row["compute_bound_s"] = compute_s;
    row["bound"] = memory_s >= compute_s ? "memory" : "compute";
    row["roofline_pct"] = 100.0 * std::max(memory_s, compute_s) / s.seconds;
  }
  return row;
}

// Requests served at `concurrency`: --num-prompts, or four per running sequence.
int64_t requests_at(int64_t concurrency) {
  return FLAGS_num_prompts > 0 ? FLAGS_num_prompts : 4 * concurrency;
}

// The first `n` requests of `w`.
Workload first(const Workload& w, int64_t n) {
  Workload out;
  out.prompts.assign(w.prompts.begin(), w.prompts.begin() + n);
  out.outputs.assign(w.outputs.begin(), w.outputs.begin() + n);
  return out;
}

}  // namespace

Status bench_throughput(const std::string& kind, const ThroughputSetup& setup,
                        const std::vector<int64_t>& concurrency, Report* report,
                        const std::function<Status(const json& point)>& on_point) {
  const kuiper::ModelConfig& c = setup.config;
  WorkloadShape shape;
  shape.requests = requests_at(concurrency.back());
  shape.input_len = FLAGS_input_len;
  shape.output_len = FLAGS_output_len;
  shape.jitter = FLAGS_len_jitter;
  shape.shared_prefix = FLAGS_shared_prefix;
  shape.seed = FLAGS_seed;
  const Workload workload = make_workload(c, shape);
  // The warm-up's requests: prompts of at most 16 tokens, 4 generated (graph capture and replay).
  WorkloadShape warm;
  warm.input_len = std::min<int64_t>(FLAGS_input_len, 16);
  warm.output_len = 4;
  warm.seed = FLAGS_seed + 1;
  int64_t max_context = FLAGS_warmup ? warm.input_len + warm.output_len : 0;
  for (size_t i = 0; i < workload.prompts.size(); ++i) {
    max_context = std::max<int64_t>(
        max_context, static_cast<int64_t>(workload.prompts[i].size()) + workload.outputs[i]);
  }
  // A request the model's context cannot hold is refused, as the programs refuse a prompt past
  // --max-context, rather than run at positions the model was never made for.
  if (max_context > c.context_limit()) {
    return Status::Error(
        "requests of up to " + std::to_string(max_context) +
        " tokens (--input-len, --len-jitter, --shared-prefix and --output-len) do not fit the "
        "model's context of " + std::to_string(c.context_limit()) + " tokens");
  }
  // The pool holds the workload's longest request for every running sequence; --max-context
  // (as the programs take it) only sets how far a request may reach, and so the width of the
  // decode graphs' block tables.
  const int64_t sequences = std::min(concurrency.back(), shape.requests);
  const int64_t pool_context = max_context;
  if (FLAGS_max_context > 0) {
    if (FLAGS_max_context < max_context) {
      return Status::Error("--max-context " + std::to_string(FLAGS_max_context) +
                           " is shorter than the " + std::to_string(max_context) +
                           " tokens the requests need");
    }
    if (FLAGS_max_context > c.context_limit()) {
      return Status::Error("--max-context " + std::to_string(FLAGS_max_context) +
                           " is past the model's context of " +
                           std::to_string(c.context_limit()) + " tokens");
    }
    max_context = FLAGS_max_context;
  }
  const size_t elem = kuiper::dtype_size(setup.activation);
  if (setup.usable_bytes > 0) {
    const double weights = weight_bytes(c, elem, setup.quantize);
    const double kv = kv_cache_bytes(c, elem, pool_context * sequences);
    const double need =
        weights + kv + workspace_bytes(c, elem, FLAGS_max_batch_tokens) + (64 << 20);
    if (need > setup.usable_bytes) {
      char msg[512];
      std::snprintf(msg, sizeof msg,
                    "%s does not fit: weights %.2f GiB + KV cache %.2f GiB (%lld sequences of "
                    "%lld tokens) + activations need about %.2f GiB, and %.2f GiB of GPU memory "
                    "is free; use a smaller --concurrency, --num-prompts or lengths",
                    setup.name.c_str(), weights / kGiB, kv / kGiB,
                    static_cast<long long>(sequences), static_cast<long long>(pool_context),
                    need / kGiB, setup.usable_bytes / kGiB);
      return Status::Error(msg);
    }
  }

  kuiper::ModelOptions options;
  options.device = setup.device;
  KUIPER_ASSIGN_OR_RETURN(options.attention, kuiper::parse_attention(kind));
  options.activation = setup.activation;
  options.max_context = max_context;
  options.max_sequences = sequences;
  if (max_context != pool_context) {  // the pool the default would give for pool_context
    const int64_t bs = options.kv_block_size;
    options.kv_cache_bytes = static_cast<int64_t>(
        kv_cache_bytes(c, elem, sequences * ((pool_context + bs - 1) / bs) * bs));
  }
  options.cuda_graph = FLAGS_cuda_graph && setup.device == DeviceType::kCuda;
  options.quantize = setup.quantize;
  options.fp8_activations = FLAGS_fp8_activations;
  std::unique_ptr<kuiper::Model> model;
  if (!FLAGS_model.empty()) {
    KUIPER_ASSIGN_OR_RETURN(model, kuiper::Model::load(FLAGS_model, options));
  } else {
    KUIPER_ASSIGN_OR_RETURN(model, kuiper::Model::random(c, options));
  }
  KUIPER_ASSIGN_OR_RETURN(const Tokenizer tokenizer, word_tokenizer(c.vocab_size));

  for (const int64_t n : concurrency) {
    if (FLAGS_warmup) {
      // A batch of short requests on an engine of its own, so the timed one starts with an
      // empty prefix cache.
      warm.requests = std::min(n, requests_at(n));
      KUIPER_RETURN_IF_ERROR(serve(*model, tokenizer, make_workload(c, warm), n).status());
    }
    KUIPER_ASSIGN_OR_RETURN(const Served served,
                            serve(*model, tokenizer, first(workload, requests_at(n)), n));
    const json row = point_row(kind, setup, n, served);
    report->throughput.push_back(row);
    KUIPER_RETURN_IF_ERROR(on_point(row));
  }
  return Status::Ok();
}

}  // namespace kuiper::bench
