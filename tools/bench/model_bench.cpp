#include "tools/bench/model_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "kuiper/base/allocator.h"
#include "kuiper/base/cuda_runtime.h"
#include "kuiper/model/model.h"
#include "kuiper/op/ops.h"
#include "tools/bench/cost_model.h"
#include "tools/bench/device.h"
#include "tools/bench/flags.h"
#include "tools/bench/timing.h"

namespace kuiper::bench {

Status bench_model(const std::string& kind, const ModelSetup& setup,
                   const std::vector<int64_t>& contexts, const std::vector<int64_t>& lengths,
                   Report* report, const std::function<Status()>& flush) {
  const kuiper::ModelConfig& c = setup.config;
  const size_t elem = kuiper::dtype_size(setup.activation);
  const bool sweep = !contexts.empty() || !lengths.empty();
  int64_t need_context = FLAGS_prompt + FLAGS_gen + 1;
  if (sweep) {
    need_context = 1;
    if (!contexts.empty()) need_context = contexts.back() + FLAGS_gen + 2;
    if (!lengths.empty()) need_context = std::max(need_context, lengths.back());
  }
  const int64_t max_context = FLAGS_max_context > 0 ? FLAGS_max_context : need_context;
  if (max_context < need_context) {
    return Status::Error("--max-context " + std::to_string(max_context) + " is shorter than the " +
                         std::to_string(need_context) + " tokens the runs need");
  }

  // Refuse up front, saying why, when the model cannot fit.
  int64_t biggest_forward = sweep ? 1 : FLAGS_prompt;
  if (!contexts.empty()) biggest_forward = std::min<int64_t>(FLAGS_fill_chunk, contexts.back());
  if (!lengths.empty()) biggest_forward = std::max(biggest_forward, lengths.back());
  const double weights = weight_bytes(c, elem, setup.quantize);
  const double kv = kv_cache_bytes(c, elem, max_context);
  const double need = weights + kv + workspace_bytes(c, elem, biggest_forward) +
                      workspace_bytes(c, elem, 1) +
                      16.0 * c.num_heads * static_cast<double>(max_context) * 4 +  // mha scratch
                      (64 << 20);  // cuBLAS workspace and attention partials
  const double usable = static_cast<double>(usable_bytes());
  if (need > usable) {
    char msg[512];
    std::snprintf(msg, sizeof msg,
                  "%s does not fit: weights %.2f GiB + KV cache %.2f GiB (%lld tokens) + "
                  "activations for %lld tokens need about %.2f GiB, and %.2f GiB of GPU memory "
                  "is free; use a smaller --config, shorter --contexts/--prefill-lengths or a "
                  "smaller --fill-chunk",
                  setup.name.c_str(), weights / kGiB, kv / kGiB,
                  static_cast<long long>(max_context), static_cast<long long>(biggest_forward),
                  need / kGiB, usable / kGiB);
    return Status::Error(msg);
  }

  kuiper::ModelOptions options;
  options.device = DeviceType::kCuda;
  KUIPER_ASSIGN_OR_RETURN(options.attention, kuiper::parse_attention(kind));
  options.activation = setup.activation;
  options.max_context = max_context;
  options.cuda_graph = FLAGS_cuda_graph;
  options.quantize = setup.quantize;
  options.fp8_activations = FLAGS_fp8_activations;
  kuiper::cuda::reset_peak_memory();
  std::unique_ptr<kuiper::Model> model;
  if (!FLAGS_model.empty()) {
    KUIPER_ASSIGN_OR_RETURN(model, kuiper::Model::load(FLAGS_model, options));
  } else {
    KUIPER_ASSIGN_OR_RETURN(model, kuiper::Model::random(c, options));
  }
  KUIPER_CUDA_CHECK(cudaDeviceSynchronize());
  const kuiper::cuda::MemoryStats loaded = kuiper::cuda::memory_stats();

  // Pseudo-random token ids (a fixed LCG): the values do not change the speed.
  std::vector<int32_t> prompt(static_cast<size_t>(max_context));
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (int32_t& id : prompt) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    id = static_cast<int32_t>((state >> 33) % static_cast<uint64_t>(c.vocab_size));
  }
  KUIPER_ASSIGN_OR_RETURN(Tensor next, Tensor::empty({1}, DataType::kInt32, DeviceType::kCuda));
  int32_t token = 0;
  // Greedy pick on the GPU, the id copied back: the step a generation loop takes.
  auto pick = [&](const Tensor& logits) -> Status {
    KUIPER_RETURN_IF_ERROR(kuiper::op::argmax(logits, next));
    return kuiper::copy_bytes(&token, DeviceType::kCpu, next.raw(), DeviceType::kCuda, 4);
  };
  auto prefill_range = [&](int64_t from, int64_t count) -> Status {
    std::vector<int32_t> ids(prompt.begin() + from, prompt.begin() + from + count);
    KUIPER_ASSIGN_OR_RETURN(Tensor logits, model->forward(ids, from, false));
    return pick(logits);
  };
  // `n` decode steps after a context of `ctx` tokens; seconds.
  auto decode_steps = [&](int64_t ctx, int n) -> Result<double> {
    KUIPER_CUDA_CHECK(cudaDeviceSynchronize());
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      KUIPER_ASSIGN_OR_RETURN(Tensor logits, model->forward({token}, ctx + i, false));
      KUIPER_RETURN_IF_ERROR(pick(logits));
    }
    return seconds_since(t0);
  };

  if (!sweep) {
    // One prefill of --prompt tokens, then --gen steps; the first (untimed) run also warms up
    // cuBLAS and captures the decode graph.
    auto run = [&](int gen, double* prefill_s, double* decode_s) -> Status {
      KUIPER_CUDA_CHECK(cudaDeviceSynchronize());
      const auto t0 = std::chrono::steady_clock::now();
      KUIPER_RETURN_IF_ERROR(prefill_range(0, FLAGS_prompt));
      *prefill_s = seconds_since(t0);
      KUIPER_ASSIGN_OR_RETURN(*decode_s, decode_steps(FLAGS_prompt, gen));
      return Status::Ok();
    };
    double prefill_s = 0, decode_s = 0;
    KUIPER_RETURN_IF_ERROR(run(std::min(FLAGS_gen, 4), &prefill_s, &decode_s));
    std::vector<double> prefills, decodes;
    for (int r = 0; r < FLAGS_repeat; ++r) {
      KUIPER_RETURN_IF_ERROR(run(FLAGS_gen, &prefill_s, &decode_s));
      prefills.push_back(prefill_s);
      decodes.push_back(decode_s);
    }
    const double prefill = median(prefills), decode = median(decodes);
    const double step_s = FLAGS_gen > 0 ? decode / FLAGS_gen : 0.0;
    const double gbs =
        step_s > 0
            ? decode_bytes(c, elem, FLAGS_prompt + FLAGS_gen / 2.0, setup.quantize) / step_s / 1e9
            : 0.0;
    const kuiper::cuda::MemoryStats mem = kuiper::cuda::memory_stats();
    report->runs.push_back(json{{"model", setup.name},
                                {"dtype", kuiper::dtype_name(setup.activation)},
                                {"attention", kind},
                                {"cuda_graph", FLAGS_cuda_graph},
                                {"prompt", FLAGS_prompt},
                                {"gen", FLAGS_gen},
                                {"prefill_ms", prefill * 1e3},
                                {"prefill_tok_s", FLAGS_prompt / prefill},
                                {"prefill_tflop_s", prefill_flops(c, FLAGS_prompt) / prefill / 1e12},
                                {"decode_tok_s", FLAGS_gen > 0 ? FLAGS_gen / decode : 0.0},
                                {"decode_ms_per_token", step_s * 1e3},
                                {"decode_gb_s", gbs},
                                {"copy_gb_s", setup.copy_gbs},
                                {"decode_pct_of_copy", 100.0 * gbs / setup.copy_gbs},
                                {"peak_gib", static_cast<double>(mem.peak) / kGiB}});
    return Status::Ok();
  }

  // Decode vs context: fill the cache up to each context (continuing from the last one), then
  // time --gen steps there, always from the same position.
  if (!contexts.empty()) {
    int64_t filled = 0;
    double fill_total = 0;
    for (size_t ci = 0; ci < contexts.size(); ++ci) {
      const int64_t ctx = contexts[ci];
      if (fill_total > FLAGS_max_fill_s) {
        report->skipped.push_back(json{{"attention", kind},
                                       {"figure", "decode"},
                                       {"context", ctx},
                                       {"why", "filling the cache had taken " +
                                                   std::to_string(fill_total) +
                                                   " s > --max-fill-s"}});
        continue;
      }
      KUIPER_CUDA_CHECK(cudaDeviceSynchronize());
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t p = filled; p < ctx; p += FLAGS_fill_chunk) {
        KUIPER_RETURN_IF_ERROR(prefill_range(p, std::min<int64_t>(FLAGS_fill_chunk, ctx - p)));
      }
      const double fill_s = seconds_since(t0);
      fill_total += fill_s;
      filled = ctx;
      KUIPER_RETURN_IF_ERROR(decode_steps(ctx, 2).status());  // warm-up (and graph capture)
      KUIPER_ASSIGN_OR_RETURN(double decode_s, repeated([&] { return decode_steps(ctx, FLAGS_gen); }));
      const double step_s = decode_s / FLAGS_gen;
      const double bytes = decode_bytes(c, elem, ctx + FLAGS_gen / 2.0, setup.quantize);
      const double gbs = bytes / step_s / 1e9;
      report->decode.push_back(json{{"model", setup.name},
                                    {"attention", kind},
                                    {"cuda_graph", FLAGS_cuda_graph},
                                    {"context", ctx},
                                    {"gen", FLAGS_gen},
                                    {"max_context", max_context},
                                    {"decode_tok_s", 1.0 / step_s},
                                    {"decode_ms_per_token", step_s * 1e3},
                                    {"bytes_per_token", bytes},
                                    {"decode_gb_s", gbs},
                                    {"copy_gb_s", setup.copy_gbs},
                                    {"decode_pct_of_copy", 100.0 * gbs / setup.copy_gbs},
                                    {"ceiling_tok_s", setup.copy_gbs * 1e9 / bytes},
                                    {"fill_s", fill_s}});
      KUIPER_RETURN_IF_ERROR(flush());
    }
    KUIPER_CUDA_CHECK(cudaDeviceSynchronize());
    const kuiper::cuda::MemoryStats mem = kuiper::cuda::memory_stats();
    const double peak = static_cast<double>(mem.peak);
    report->memory.push_back(json{{"model", setup.name},
                                  {"attention", kind},
                                  {"max_context", max_context},
                                  {"context", filled},
                                  {"fill_chunk", FLAGS_fill_chunk},
                                  {"weights_gib", weights / kGiB},
                                  {"kv_cache_gib", kv / kGiB},
                                  {"after_load_gib", static_cast<double>(loaded.in_use) / kGiB},
                                  {"peak_gib", peak / kGiB},
                                  {"excess_gib", (peak - weights - kv) / kGiB},
                                  {"reserved_gib", static_cast<double>(mem.reserved) / kGiB},
                                  {"device_used_gib", device_used_gib()}});
    KUIPER_RETURN_IF_ERROR(flush());
  }

  // Prefill vs prompt length, each from position 0.
  double prev_s = 0;
  int64_t prev_len = 0;
  bool stop = false;
  for (int64_t len : lengths) {
    const double projected =
        prev_s * (static_cast<double>(len) / std::max<int64_t>(prev_len, 1)) *
        (static_cast<double>(len) / std::max<int64_t>(prev_len, 1));
    if (stop || (prev_s > 0 && projected > FLAGS_max_prefill_s)) {
      stop = true;
      char why[160];
      std::snprintf(why, sizeof why, "projected %.1f s from %lld tokens > --max-prefill-s",
                    projected, static_cast<long long>(prev_len));
      report->skipped.push_back(
          json{{"attention", kind}, {"figure", "prefill"}, {"prompt", len}, {"why", why}});
      continue;
    }
    auto once = [&]() -> Result<double> {
      KUIPER_CUDA_CHECK(cudaDeviceSynchronize());
      const auto t0 = std::chrono::steady_clock::now();
      KUIPER_RETURN_IF_ERROR(prefill_range(0, len));
      return seconds_since(t0);
    };
    // Warm-up (workspace growth, cuBLAS heuristics for the shape) unless runs are long enough
    // for it not to matter.
    if (prev_s < 2.0) KUIPER_RETURN_IF_ERROR(once().status());
    KUIPER_ASSIGN_OR_RETURN(double s, repeated(once));
    const double flops = prefill_flops(c, len);
    const double attn = c.num_layers * causal_attention_flops(c.num_heads, c.head_dim, 0, len);
    report->prefill.push_back(json{{"model", setup.name},
                                   {"attention", kind},
                                   {"prompt", len},
                                   {"prefill_ms", s * 1e3},
                                   {"prefill_tok_s", len / s},
                                   {"flops", flops},
                                   {"attention_flop_share", attn / flops},
                                   {"prefill_tflop_s", flops / s / 1e12},
                                   {"pct_of_peak", 100.0 * flops / s / 1e12 / FLAGS_peak_tflops}});
    prev_s = s;
    prev_len = len;
    KUIPER_RETURN_IF_ERROR(flush());
  }
  if (!lengths.empty()) {
    const kuiper::cuda::MemoryStats mem = kuiper::cuda::memory_stats();
    for (json& row : report->prefill) {
      if (row["attention"] == kind) row["peak_gib"] = static_cast<double>(mem.peak) / kGiB;
    }
  }
  return Status::Ok();
}

}  // namespace kuiper::bench
