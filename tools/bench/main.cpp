// kuiper-bench: how fast a model runs on this GPU, as markdown tables users can paste and as
// JSON (--json FILE) that scripts/plot_perf.py and scripts/perf_report.sh consume.
//
//   kuiper-bench --config models/qwen3-8b.json --dtype fp16 --prompt 512 --gen 128
//                --attention mha,flash1,flash2 --cuda-graph
//   kuiper-bench --config models/qwen3-8b.json --attention mha,flash1,flash2 --cuda-graph
//                --contexts 512,4096,16384,32768 --gen 32
//                --prefill-lengths 512,1024,2048,4096,8192,16384 --json model.json
//   kuiper-bench --attention-only --heads 32 --kv-heads 8 --head-dim 128 --kv-len 4096
//   kuiper-bench --attention-only --cuda-graph --decode-kv-lens 4096,32768 --causal-lens 2048,8192
//   kuiper-bench --matmul-only --config models/qwen3-8b.json
//
// Model mode builds the model from a Hugging Face config.json with random weights generated on
// the GPU (no checkpoint needed; speed does not depend on the values) or loads --model M.bin.
// Without --contexts / --prefill-lengths it times a prefill of --prompt tokens and --gen greedy
// decode steps. With --contexts it fills the KV cache to each context in turn (a prefill of
// random tokens in --fill-chunk pieces, continuing from the previous context) and times --gen
// decode steps there; the peak memory of that sweep is the memory figure (weights, KV cache and
// what comes on top). With --prefill-lengths it times one prefill of each prompt length from
// position 0. Every decode step ends with the argmax copied to the host, as a generation loop
// does. Decode speed is also given as the bytes a step must read (every weight matrix once, plus
// the KV cache so far) over its time, and as a share of this GPU's device-to-device copy
// bandwidth, measured here; prefill and attention as TFLOP/s and a share of --peak-tflops.
// Attention-only mode times the attention op alone through make_attention (the KV cache rotated
// through enough copies that L2 cannot hold it); matmul-only mode times op::matmul alone on the
// config's weight shapes.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gflags/gflags.h>
#include <nlohmann/json.hpp>

#include "kuiper/model/model.h"
#include "kuiper/op/attention.h"
#include "kuiper/op/ops.h"
#ifdef KUIPER_WITH_CUDA
#include "kuiper/base/cuda_runtime.h"
#endif

DEFINE_string(config, "", "Hugging Face config.json: benchmark that shape with random weights");
DEFINE_string(model, "", "Kuiper model file (.bin) to benchmark instead of --config");
DEFINE_string(dtype, "fp16",
              "fp16, bf16 or fp32 (bf16 weights run as fp16 activations with fp16 matrices)");
DEFINE_int32(prompt, 512, "prompt (prefill) length in tokens");
DEFINE_int32(gen, 128, "tokens generated after the prompt (after each context with --contexts)");
DEFINE_string(attention, "flash2", "mha, flash1, flash2, or a comma-separated list");
DEFINE_bool(cuda_graph, false, "decode through a captured CUDA graph");
DEFINE_int32(repeat, 3, "timed runs per configuration; the median is reported");
DEFINE_double(max_repeat_s, 5.0,
              "stop repeating a measurement once its timed runs took this many seconds "
              "(there is always at least one)");
DEFINE_string(json, "",
              "also write every measurement as JSON to FILE ('-': JSON on stdout instead of "
              "the tables)");
DEFINE_string(contexts, "",
              "model mode: decode tok/s vs context; fill the KV cache to each of these "
              "contexts (comma-separated) and time --gen decode steps there");
DEFINE_string(prefill_lengths, "",
              "model mode: prefill tok/s vs prompt length; one prefill of each of these "
              "lengths (comma-separated) from position 0");
DEFINE_int32(fill_chunk, 4096, "--contexts: tokens per forward call while filling the cache");
DEFINE_int64(max_context, 0, "model mode: KV cache length in tokens; 0: what the runs need");
DEFINE_double(max_fill_s, 180.0,
              "--contexts: skip the remaining contexts of an attention kind once filling its "
              "cache has taken this many seconds");
DEFINE_double(max_prefill_s, 30.0,
              "--prefill-lengths: skip a length (and the longer ones) when the previous "
              "length's time, scaled by the square of the length ratio, exceeds this");
DEFINE_double(peak_tflops, 989.4,
              "compute ceiling for the percentages: dense fp16 tensor-core TFLOP/s (989.4 is "
              "the H100 SXM datasheet figure)");
DEFINE_bool(attention_only, false, "time the attention op alone");
DEFINE_bool(matmul_only, false,
            "time op::matmul alone for each weight shape of --config: the decode GEMV (T = 1, "
            "GB/s of weights) and the prefill GEMM (T = --prompt, TFLOP/s)");
DEFINE_int32(heads, 32, "attention-only: query heads");
DEFINE_int32(kv_heads, 8, "attention-only: key/value heads");
DEFINE_int32(head_dim, 128, "attention-only: head dimension");
DEFINE_int32(kv_len, 4096, "attention-only: keys in the cache (context length)");
DEFINE_int32(prefill_len, 512, "attention-only: queries of the prefill case (the last ones)");
DEFINE_bool(replay_graph, true,
            "attention-only with --cuda-graph: time the decode replayed from a captured graph "
            "(false: launched on the stream)");
DEFINE_int32(decode_splits, 0,
             "attention-only: KV splits per kv head of split-KV decode (0: the kernel's choice)");
DEFINE_string(decode_kv_lens, "",
              "attention-only: decode (one query) at each of these kv lengths; with "
              "--causal-lens, replaces the --kv-len/--prefill-len cases");
DEFINE_string(causal_lens, "",
              "attention-only: causal prefill of T queries over T keys from position 0 for "
              "each of these T");

namespace {

using kuiper::DataType;
using kuiper::DeviceType;
using kuiper::Result;
using kuiper::Status;
using kuiper::Tensor;
using nlohmann::json;

#ifdef KUIPER_WITH_CUDA

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The Status of a Result: Ok when it holds a value (Result::status() is meant for failures).
template <typename T>
Status status_of(const Result<T>& r) {
  return r.ok() ? Status::Ok() : r.status();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Result<std::vector<std::string>> split_kinds(const std::string& list) {
  std::vector<std::string> kinds;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!kuiper::parse_attention(item).ok()) return kuiper::parse_attention(item).status();
    kinds.push_back(item);
  }
  if (kinds.empty()) return Status::Error("--attention: no kind given");
  return kinds;
}

// "512,4096" -> {512, 4096}, sorted; every value must be a positive integer.
Result<std::vector<int64_t>> split_lengths(const std::string& flag, const std::string& list) {
  std::vector<int64_t> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < 1) {
      return Status::Error("--" + flag + ": '" + item + "' is not a positive integer");
    }
    out.push_back(v);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Device-to-device copy bandwidth, counting bytes read plus bytes written: the ceiling a
// memory-bound kernel can hope for on this GPU.
Result<double> copy_bandwidth_gbs() {
  constexpr size_t kBytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  KUIPER_CUDA_CHECK(cudaMalloc(&a, kBytes));
  KUIPER_CUDA_CHECK(cudaMalloc(&b, kBytes));
  KUIPER_CUDA_CHECK(cudaMemset(a, 1, kBytes));
  cudaEvent_t start, stop;
  KUIPER_CUDA_CHECK(cudaEventCreate(&start));
  KUIPER_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> seconds;
  for (int i = 0; i < 12; ++i) {
    KUIPER_CUDA_CHECK(cudaEventRecord(start));
    KUIPER_CUDA_CHECK(cudaMemcpy(b, a, kBytes, cudaMemcpyDeviceToDevice));
    KUIPER_CUDA_CHECK(cudaEventRecord(stop));
    KUIPER_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    KUIPER_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (i >= 2) seconds.push_back(ms / 1e3);  // the first copies warm up
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  (void)cudaFree(a);
  (void)cudaFree(b);
  return 2.0 * kBytes / median(seconds) / 1e9;
}

// What the GPU is, for the JSON header.
json device_info() {
  json info;
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) == cudaSuccess && cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
    info["name"] = prop.name;
    info["sm_count"] = prop.multiProcessorCount;
    info["memory_gib"] = static_cast<double>(prop.totalGlobalMem) / kGiB;
    info["l2_mib"] = prop.l2CacheSize / (1024.0 * 1024.0);
  }
  int driver = 0, runtime = 0;
  if (cudaDriverGetVersion(&driver) == cudaSuccess) info["cuda_driver"] = driver;
  if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) info["cuda_runtime"] = runtime;
  return info;
}

// Free bytes a model can use: what CUDA has free plus the caching allocator's cached blocks
// (released to whoever asks next).
size_t usable_bytes() {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
  const kuiper::cuda::MemoryStats s = kuiper::cuda::memory_stats();
  return free + (s.reserved - s.in_use);
}

double device_used_gib() {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0.0;
  return static_cast<double>(total - free) / kGiB;
}

// Parameters of the matrices one token multiplies by (q/k/v/o, gate/up/down in every layer).
double layer_matrix_params(const kuiper::ModelConfig& c) {
  const double H = c.hidden_size, I = c.intermediate_size;
  return (H * c.q_dim() * 2 + H * c.kv_dim() * 2 + 3 * H * I) * c.num_layers;
}

// Bytes one decode step must read: every weight matrix (the matrices are stored in the
// activation dtype on the GPU), one embedding row, and the K and V cache rows so far.
double decode_bytes(const kuiper::ModelConfig& c, size_t elem, double context) {
  const double H = c.hidden_size;
  const double weights = (layer_matrix_params(c) + c.vocab_size * H + H) * elem;
  const double kv = 2.0 * c.num_layers * c.kv_dim() * context * elem;
  return weights + kv;
}

// Bytes of every weight as the GPU stores them (activation dtype).
double weight_bytes(const kuiper::ModelConfig& c, size_t elem) {
  const double H = c.hidden_size;
  double per_layer = 2 * H;  // the two norms
  if (c.qk_norm) per_layer += 2.0 * c.head_dim;
  if (c.qkv_bias) per_layer += c.q_dim() + 2.0 * c.kv_dim();
  const double embeddings = c.vocab_size * H * (c.tie_word_embeddings ? 1 : 2);
  return (layer_matrix_params(c) + per_layer * c.num_layers + embeddings + H) * elem;
}

double kv_cache_bytes(const kuiper::ModelConfig& c, size_t elem, int64_t max_context) {
  return 2.0 * c.num_layers * static_cast<double>(max_context) * c.kv_dim() * elem;
}

// Activations of a forward of T tokens (QwenModel's Workspace) plus one row of fp32 logits.
double workspace_bytes(const kuiper::ModelConfig& c, size_t elem, int64_t T) {
  const double per_token = 8 + elem * (3.0 * c.hidden_size + 2.0 * c.q_dim() + 2.0 * c.kv_dim() +
                                       2.0 * c.intermediate_size);
  return per_token * static_cast<double>(T) + 4.0 * c.vocab_size;
}

// FLOPs of causal attention for T queries starting at position `start` (query t sees
// start + t + 1 keys): QK^T and PV, 2 flops per multiply-add each. Same count as
// scripts/peer_bench.py uses for PyTorch.
double causal_attention_flops(int64_t heads, int64_t head_dim, int64_t start, int64_t T) {
  const double keys = static_cast<double>(T) * static_cast<double>(start) +
                      static_cast<double>(T) * static_cast<double>(T + 1) / 2.0;
  return 4.0 * static_cast<double>(heads) * static_cast<double>(head_dim) * keys;
}

// FLOPs of a prefill of T tokens from position 0: every layer matrix for every token, attention
// in every layer, and the lm_head for the last token only.
double prefill_flops(const kuiper::ModelConfig& c, int64_t T) {
  return 2.0 * layer_matrix_params(c) * static_cast<double>(T) +
         c.num_layers * causal_attention_flops(c.num_heads, c.head_dim, 0, T) +
         2.0 * c.vocab_size * c.hidden_size;
}

Result<kuiper::ModelConfig> read_config() {
  std::ifstream in(FLAGS_config);
  if (!in) return Status::Error("--config: cannot open " + FLAGS_config);
  json hf;
  try {
    in >> hf;
  } catch (const std::exception& e) {
    return Status::Error("--config: " + FLAGS_config + ": " + e.what());
  }
  return kuiper::ModelConfig::from_hf(hf);
}

// Runs `once` (which returns its own duration) up to --repeat times, stopping early once the
// runs add up to --max-repeat-s; the median.
template <typename Once>
Result<double> repeated(Once&& once) {
  std::vector<double> runs;
  double total = 0;
  for (int r = 0; r < FLAGS_repeat; ++r) {
    KUIPER_ASSIGN_OR_RETURN(double s, once());
    runs.push_back(s);
    total += s;
    if (total > FLAGS_max_repeat_s) break;
  }
  return median(runs);
}

// Everything measured for the report, grouped by kind of figure.
struct Report {
  json decode = json::array();
  json prefill = json::array();
  json memory = json::array();
  json runs = json::array();  // the plain --prompt/--gen mode
  json attention = json::array();
  json matmul = json::array();
  json skipped = json::array();
};

struct ModelSetup {
  kuiper::ModelConfig config;
  std::string name;
  DataType activation;
  double copy_gbs;
};

// The sweep a model-mode run does for one attention kind.
// `flush` is called after every measurement (the JSON file is rewritten, so a run cut short
// keeps what it measured).
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
  const double weights = weight_bytes(c, elem), kv = kv_cache_bytes(c, elem, max_context);
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
        step_s > 0 ? decode_bytes(c, elem, FLAGS_prompt + FLAGS_gen / 2.0) / step_s / 1e9 : 0.0;
    const kuiper::cuda::MemoryStats mem = kuiper::cuda::memory_stats();
    report->runs.push_back(json{{"model", setup.name},
                                {"dtype", FLAGS_dtype},
                                {"activation", kuiper::dtype_name(setup.activation)},
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
      KUIPER_RETURN_IF_ERROR(status_of(decode_steps(ctx, 2)));  // warm-up (and graph capture)
      KUIPER_ASSIGN_OR_RETURN(double decode_s, repeated([&] { return decode_steps(ctx, FLAGS_gen); }));
      const double step_s = decode_s / FLAGS_gen;
      const double bytes = decode_bytes(c, elem, ctx + FLAGS_gen / 2.0);
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
    if (prev_s < 2.0) KUIPER_RETURN_IF_ERROR(status_of(once()));
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

// Times call(i) with events on the engine stream: calls are issued back to back in batches
// (launch latency hidden as in a real step), the batch size chosen so a batch takes about 2 ms;
// the median of the batches, per call. With `graph`, one batch is captured into a CUDA graph
// after the eager warm-up and the graph is replayed, as the decode step runs in a model (no
// host launch cost between calls; PDL launches become programmatic graph edges).
template <typename Call>
Result<double> time_on_stream(Call&& call, bool graph = false) {
  cudaStream_t stream = kuiper::cuda::stream();
  cudaEvent_t start, stop;
  KUIPER_CUDA_CHECK(cudaEventCreate(&start));
  KUIPER_CUDA_CHECK(cudaEventCreate(&stop));
  cudaGraphExec_t exec = nullptr;
  int index = 0;
  auto issue = [&](int n) -> Status {
    if (exec != nullptr) return kuiper::cuda::check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
    for (int i = 0; i < n; ++i) KUIPER_RETURN_IF_ERROR(call(index++));
    return Status::Ok();
  };
  auto batch = [&](int n) -> Result<double> {
    KUIPER_CUDA_CHECK(cudaEventRecord(start, stream));
    KUIPER_RETURN_IF_ERROR(issue(n));
    KUIPER_CUDA_CHECK(cudaEventRecord(stop, stream));
    KUIPER_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    KUIPER_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ms / 1e3 / n;
  };
  // One batch captured (not run): a failure still ends the capture, or the stream stays unusable.
  auto capture = [&](int n) -> Status {
    KUIPER_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const Status body = issue(n);
    cudaGraph_t g = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &g);
    if (!body.ok() || ended != cudaSuccess) {
      (void)cudaGetLastError();
      if (g != nullptr) (void)cudaGraphDestroy(g);
      KUIPER_RETURN_IF_ERROR(body);
      return kuiper::cuda::check(ended, "capturing the timed calls");
    }
    const cudaError_t made = cudaGraphInstantiate(&exec, g, 0);
    (void)cudaGraphDestroy(g);
    if (made != cudaSuccess) exec = nullptr;
    return kuiper::cuda::check(made, "cudaGraphInstantiate (timed calls)");
  };
  // A first call alone does the op's one-time setup (scratch allocation, kernel attributes),
  // which must not count in the batch that sizes the rest; then the size of one call.
  Result<double> first = batch(1);
  if (first.ok()) first = batch(3);
  double per_call = first.ok() ? *first : 0.0;
  const int inner = static_cast<int>(std::clamp(std::ceil(2e-3 / std::max(per_call, 1e-7)), 1.0, 200.0));
  const int batches = static_cast<int>(
      std::clamp(std::ceil(0.5 / std::max(per_call * inner, 1e-7)), 3.0, 25.0));
  std::vector<double> seconds;
  Status status = status_of(first);
  if (status.ok() && graph) {
    status = capture(inner);
    if (status.ok()) status = status_of(batch(inner));  // the graph's first launch uploads it
  }
  for (int b = 0; b < batches && status.ok(); ++b) {
    Result<double> s = batch(inner);
    if (s.ok()) seconds.push_back(*s);
    status = status_of(s);
  }
  if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  KUIPER_RETURN_IF_ERROR(status);
  return median(seconds);
}

// Each distinct weight shape of the config through op::matmul. Decode cycles through enough
// copies of the weight that it cannot sit in L2, as in a real step where every matrix is read
// once.
Result<json> bench_matmul(DataType activation, double copy_gbs) {
  KUIPER_ASSIGN_OR_RETURN(kuiper::ModelConfig c, read_config());
  struct Shape {
    const char* name;
    int64_t N, K;
  };
  const Shape shapes[] = {{"q_proj", c.q_dim(), c.hidden_size},
                          {"k_proj/v_proj", c.kv_dim(), c.hidden_size},
                          {"o_proj", c.hidden_size, c.q_dim()},
                          {"gate/up_proj", c.intermediate_size, c.hidden_size},
                          {"down_proj", c.hidden_size, c.intermediate_size},
                          {"lm_head", c.vocab_size, c.hidden_size}};
  const size_t elem = kuiper::dtype_size(activation);
  json rows = json::array();
  for (const Shape& s : shapes) {
    const double bytes = static_cast<double>(s.N) * s.K * elem;
    const int copies = static_cast<int>(std::max(1.0, std::ceil(512e6 / bytes)));
    std::vector<Tensor> weights;
    for (int i = 0; i < copies; ++i) {
      KUIPER_ASSIGN_OR_RETURN(Tensor w, Tensor::empty({s.N, s.K}, activation, DeviceType::kCuda));
      KUIPER_RETURN_IF_ERROR(kuiper::op::fill_random(w, 10 + i, 0.02f, 0.0f));
      weights.push_back(w);
    }
    json row{{"shape", s.name}, {"N", s.N}, {"K", s.K}};
    for (int64_t T : {int64_t{1}, static_cast<int64_t>(FLAGS_prompt)}) {
      KUIPER_ASSIGN_OR_RETURN(Tensor x, Tensor::empty({T, s.K}, activation, DeviceType::kCuda));
      KUIPER_ASSIGN_OR_RETURN(Tensor out, Tensor::empty({T, s.N}, activation, DeviceType::kCuda));
      KUIPER_RETURN_IF_ERROR(kuiper::op::fill_random(x, 5, 1.0f, 0.0f));
      KUIPER_ASSIGN_OR_RETURN(double seconds, time_on_stream([&](int i) {
                                return kuiper::op::matmul(x, weights[i % copies], nullptr, out);
                              }));
      if (T == 1) {
        row["decode_us"] = seconds * 1e6;
        row["decode_gb_s"] = bytes / seconds / 1e9;
        row["decode_pct_of_copy"] = 100.0 * bytes / seconds / 1e9 / copy_gbs;
      } else {
        row["prefill_tokens"] = T;
        row["prefill_us"] = seconds * 1e6;
        row["prefill_tflop_s"] = 2.0 * T * s.N * s.K / seconds / 1e12;
        row["prefill_pct_of_peak"] = 100.0 * row["prefill_tflop_s"].get<double>() / FLAGS_peak_tflops;
      }
    }
    rows.push_back(row);
  }
  return rows;
}

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
  request.graph_safe = decode && FLAGS_cuda_graph;
  request.head_dim = D;
  request.decode_splits = FLAGS_decode_splits;
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
  // Graph-safe decode is timed as it runs in a model: replayed from a captured graph.
  const bool graph = request.graph_safe && FLAGS_replay_graph;
  KUIPER_ASSIGN_OR_RETURN(double seconds, time_on_stream(
                                              [&](int i) {
                                                return op->forward(args[static_cast<size_t>(i % copies)]);
                                              },
                                              graph));
  const double flops = causal_attention_flops(H, D, start, T);
  const double gbs = kv_bytes / seconds / 1e9, tflops = flops / seconds / 1e12;
  return json{{"attention", kind},
              {"kernel", op->name()},
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

Result<json> bench_attention(const std::string& kind, DataType activation, double copy_gbs) {
  json rows = json::array();
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

double num(const json& row, const char* key) {
  return row.contains(key) && row[key].is_number() ? row[key].get<double>() : 0.0;
}

void print_tables(const Report& r, double copy_gbs) {
  if (!r.matmul.empty()) {
    std::printf("| weight | N | K | decode us | decode GB/s | %% of D2D copy | prefill T | "
                "prefill us | prefill TFLOP/s |\n|---|---|---|---|---|---|---|---|---|\n");
    for (const json& m : r.matmul) {
      std::printf("| %s | %lld | %lld | %.1f | %.0f | %.0f%% | %lld | %.1f | %.0f |\n",
                  m["shape"].get<std::string>().c_str(), m["N"].get<long long>(),
                  m["K"].get<long long>(), num(m, "decode_us"), num(m, "decode_gb_s"),
                  num(m, "decode_pct_of_copy"), m["prefill_tokens"].get<long long>(),
                  num(m, "prefill_us"), num(m, "prefill_tflop_s"));
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
  (*doc)["skipped"] = report.skipped;
}

Status run(const std::string& command) {
  if (!kuiper::cuda_available()) return Status::Error("kuiper-bench needs a usable CUDA GPU");
  KUIPER_ASSIGN_OR_RETURN(DataType stored, kuiper::parse_dtype(FLAGS_dtype));
  if (stored != DataType::kFp16 && stored != DataType::kBf16 && stored != DataType::kFp32) {
    return Status::Error("--dtype: expected fp16, bf16 or fp32, not " + FLAGS_dtype);
  }
  // bf16 has no activation kernels: bf16 weights are converted to fp16 at load and run fp16.
  const DataType activation = stored == DataType::kFp32 ? DataType::kFp32 : DataType::kFp16;
  if (stored == DataType::kBf16 && FLAGS_json != "-") {
    std::printf("note: --dtype bf16 runs as fp16 activations with the matrices converted to fp16\n");
  }
  KUIPER_ASSIGN_OR_RETURN(std::vector<std::string> kinds, split_kinds(FLAGS_attention));
  KUIPER_ASSIGN_OR_RETURN(std::vector<int64_t> contexts, split_lengths("contexts", FLAGS_contexts));
  KUIPER_ASSIGN_OR_RETURN(std::vector<int64_t> lengths,
                          split_lengths("prefill-lengths", FLAGS_prefill_lengths));
  if (FLAGS_repeat < 1) return Status::Error("--repeat must be >= 1");
  if (FLAGS_fill_chunk < 2) return Status::Error("--fill-chunk must be >= 2");
  Report report;
  json doc{{"tool", "kuiper-bench"},
           {"command", command},
           {"device", device_info()},
           {"dtype", FLAGS_dtype},
           {"activation", kuiper::dtype_name(activation)},
           {"cuda_graph", FLAGS_cuda_graph},
           {"repeat", FLAGS_repeat},
           {"peak_tflop_s", FLAGS_peak_tflops}};
  KUIPER_ASSIGN_OR_RETURN(double copy_gbs, copy_bandwidth_gbs());
  doc["copy_gb_s"] = copy_gbs;
  if (FLAGS_matmul_only) {
    if (FLAGS_config.empty()) return Status::Error("--matmul-only needs --config CONFIG.json");
    doc["mode"] = "matmul";
    KUIPER_ASSIGN_OR_RETURN(report.matmul, bench_matmul(activation, copy_gbs));
  } else if (FLAGS_attention_only) {
    doc["mode"] = "attention";
    for (const std::string& kind : kinds) {
      KUIPER_ASSIGN_OR_RETURN(json r, bench_attention(kind, activation, copy_gbs));
      for (const json& row : r) report.attention.push_back(row);
      if (!FLAGS_json.empty() && FLAGS_json != "-") {  // partial results, as in model mode
        fill(&doc, report);
        KUIPER_RETURN_IF_ERROR(write_json(doc));
      }
    }
  } else {
    if (FLAGS_config.empty() == FLAGS_model.empty()) {
      return Status::Error("give exactly one of --config CONFIG.json and --model M.bin");
    }
    if (FLAGS_prompt < 1 || FLAGS_gen < 0 || (!contexts.empty() && FLAGS_gen < 1)) {
      return Status::Error("--prompt must be >= 1 and --gen >= 0 (>= 1 with --contexts)");
    }
    doc["mode"] = "model";
    ModelSetup setup;
    setup.activation = activation;
    setup.copy_gbs = copy_gbs;
    if (!FLAGS_model.empty()) {
      KUIPER_ASSIGN_OR_RETURN(std::shared_ptr<kuiper::ModelFile> file,
                              kuiper::ModelFile::open(FLAGS_model));
      setup.config = file->config();
      setup.name = FLAGS_model;
    } else {
      KUIPER_ASSIGN_OR_RETURN(setup.config, read_config());
      setup.name = FLAGS_config.substr(FLAGS_config.find_last_of('/') + 1);
    }
    const size_t elem = kuiper::dtype_size(activation);
    doc["model"] = setup.name;
    doc["weights_bytes"] = weight_bytes(setup.config, elem);
    doc["decode_bytes_context_0"] = decode_bytes(setup.config, elem, 0);
    doc["ceiling_tok_s_context_0"] = copy_gbs * 1e9 / decode_bytes(setup.config, elem, 0);
    // Partial results go to the file as they come (not to stdout, which gets the JSON once).
    auto flush = [&]() -> Status {
      if (FLAGS_json.empty() || FLAGS_json == "-") return Status::Ok();
      fill(&doc, report);
      return write_json(doc);
    };
    for (const std::string& kind : kinds) {
      const Status s = bench_model(kind, setup, contexts, lengths, &report, flush);
      if (!s.ok()) return s.With(kind);
    }
  }
  fill(&doc, report);
  if (FLAGS_json != "-") print_tables(report, copy_gbs);
  if (!FLAGS_json.empty()) KUIPER_RETURN_IF_ERROR(write_json(doc));
  return Status::Ok();
}

#else

Status run(const std::string&) { return Status::Error("this build of Kuiper has no CUDA support"); }

#endif

}  // namespace

int main(int argc, char** argv) {
  // Accept --cuda-graph as well as gflags' --cuda_graph: dashes in flag names become underscores.
  std::vector<std::string> args(argv, argv + argc);
  std::string command;
  for (const std::string& a : args) command += (command.empty() ? "" : " ") + a;
  std::vector<char*> ptrs;
  for (std::string& a : args) {
    if (a.rfind("--", 0) == 0) {
      const size_t end = std::min(a.find('='), a.size());
      std::replace(a.begin() + 2, a.begin() + static_cast<std::ptrdiff_t>(end), '-', '_');
    }
    ptrs.push_back(a.data());
  }
  int n = static_cast<int>(ptrs.size());
  char** p = ptrs.data();
  gflags::SetUsageMessage("kuiper-bench --config CONFIG.json | --model M.bin [flags]");
  gflags::ParseCommandLineFlags(&n, &p, true);
  const Status status = run(command);
  if (!status.ok()) {
    std::fprintf(stderr, "kuiper-bench: %s\n", status.message().c_str());
    return 1;
  }
  return 0;
}
