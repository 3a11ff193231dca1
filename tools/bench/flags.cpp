#include "tools/bench/flags.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kuiper/op/ops.h"

DEFINE_string(quantize, "",
              "quantize the random (--config) weights: fp8 (E4M3, 128x128 block scales), int8 "
              "or int4 (a scale and zero per --group columns of a row); empty: plain");
DEFINE_int32(group, 128, "--quantize int8/int4: columns per scale group");
DEFINE_string(quantize_lm_head, "",
              "quantize the random (--config) model's untied lm_head too: fp8, int8 or int4 "
              "(kuiper-convert --quantize-lm-head); empty: it stays in the activation dtype");
DEFINE_bool(fp8_activations, false,
            "FP8 weights multiply activations rounded to FP8 (W8A8: a scale per row and 128 "
            "columns, as transformers, vLLM and SGLang run FP8 checkpoints); off: the product "
            "with the dequantized weights");
DEFINE_string(config, "", "Hugging Face config.json: benchmark that shape with random weights");
DEFINE_string(model, "", "Kuiper model file (.bin) to benchmark instead of --config");
DEFINE_string(dtype, "auto",
              "activation dtype, which --config's random weights are made in too: auto (the "
              "dtype --model's weights are stored in, --config's torch_dtype; bf16 with "
              "--attention-only), bf16, fp16 or fp32");
DEFINE_int32(prompt, 512, "prompt (prefill) length in tokens");
DEFINE_int32(gen, 128, "tokens generated after the prompt (after each context with --contexts)");
DEFINE_string(attention, "flash2", "mha, flash1, flash2, or a comma-separated list");
DEFINE_bool(cuda_graph, true, "decode through a captured CUDA graph (--no-cuda-graph: eagerly)");
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
DEFINE_int64(max_context, 0,
             "KV cache length of one sequence in tokens (model mode: the cache; throughput: the "
             "context a request may reach, as the programs' --max-context, while the KV pool "
             "stays sized for the workload); 0: what the runs need");
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
DEFINE_bool(sample_only, false,
            "time op::sample_rows alone: --decode-batch rows (default 1,8,64,256) of --config's "
            "vocabulary at --temperature, --top-k, --top-p and --min-p");
DEFINE_int32(heads, 32, "attention-only: query heads");
DEFINE_int32(kv_heads, 8, "attention-only: key/value heads");
DEFINE_int32(head_dim, 128, "attention-only: head dimension");
DEFINE_int32(kv_len, 4096, "attention-only: keys in the cache (context length)");
DEFINE_int32(prefill_len, 512, "attention-only: queries of the prefill case (the last ones)");
DEFINE_bool(replay_graph, true,
            "attention-only with --cuda-graph: time the decode replayed from a captured graph "
            "(false: launched on the stream)");
DEFINE_int32(decode_grid, 0,
             "attention-only: blocks of the split-KV decode grid (0: the kernel's choice)");
DEFINE_bool(pdl, true, "attention-only: launch the flash2 fp16 decode with PDL (A/B timing)");
DEFINE_string(decode_kv_lens, "",
              "attention-only: decode (one query) at each of these kv lengths; with "
              "--causal-lens, replaces the --kv-len/--prefill-len cases");
DEFINE_string(decode_batch, "",
              "attention-only: batched decode over a paged KV pool, one case for each of these "
              "sequence counts B: B sequences of --kv-len keys in one call (GB/s of all their "
              "K/V); replaces the other cases. sample-only: the row counts");
DEFINE_int32(kv_len_spread, 0,
             "attention-only --decode-batch: sequence lengths spread evenly over --kv-len -/+ "
             "half of this, in a shuffled order, as a serving engine's batch is (0: all equal)");
DEFINE_int32(block_size, 16, "attention-only --decode-batch: KV pool block size (rows)");
DEFINE_string(causal_lens, "",
              "attention-only: causal prefill of T queries over T keys from position 0 for "
              "each of these T");
DEFINE_bool(throughput, false,
            "serve --num-prompts random prompts through the Engine at each --concurrency and "
            "report tok/s, TTFT and inter-token latency");
DEFINE_string(device, "cuda", "throughput: cuda or cpu (the CPU runs fp32)");
DEFINE_int32(num_prompts, 0,
             "throughput: requests, all queued at the start (0: 4 x the concurrency at each "
             "point, the first of one random sequence of prompts)");
DEFINE_int32(input_len, 512, "throughput: prompt tokens per request (the mean with --len-jitter)");
DEFINE_int32(output_len, 128,
             "throughput: tokens generated per request, end tokens ignored (the mean with "
             "--len-jitter)");
DEFINE_double(len_jitter, 0.0,
              "throughput: draw each request's lengths uniformly within this fraction of "
              "--input-len and --output-len (0: fixed; below 1)");
DEFINE_string(concurrency, "1,8,64,256",
              "throughput: requests running at once (the engine's max batch), one run each");
DEFINE_int32(shared_prefix, 0,
             "throughput: every prompt starts with the same this many tokens (a system prompt)");
DEFINE_int64(max_batch_tokens, 2048, "throughput: tokens one engine step runs at most");
DEFINE_bool(overlap_steps, true,
            "throughput: launch each step before the host reads the last one's tokens "
            "(EngineOptions::overlap_steps); --no-overlap-steps runs them in turn");
DEFINE_double(temperature, 0.0,
              "throughput: each request's sampling temperature (0: greedy arg-max); above 0 the "
              "tokens are drawn (--top-k, --top-p, --min-p; the OpenAI API's defaults are 0, 1 "
              "and 0) with a seed a request");
DEFINE_int32(top_k, 40, "throughput: each request's top-k with --temperature (0: all)");
DEFINE_double(top_p, 0.95, "throughput: each request's top-p with --temperature (1: all)");
DEFINE_double(min_p, 0.05, "throughput: each request's min-p with --temperature (0: all)");
DEFINE_bool(warmup, true,
            "throughput: before each concurrency, run that many short requests on a fresh "
            "engine (cuBLAS heuristics, CUDA graphs)");
DEFINE_uint64(seed, 1, "throughput: seed of the random prompts and lengths");

namespace kuiper::bench {

using nlohmann::json;

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

namespace {

Result<json> read_config_json() {
  std::ifstream in(FLAGS_config);
  if (!in) return Status::Error("--config: cannot open " + FLAGS_config);
  json hf;
  try {
    in >> hf;
  } catch (const std::exception& e) {
    return Status::Error("--config: " + FLAGS_config + ": " + e.what());
  }
  return hf;
}

}  // namespace

Result<kuiper::ModelConfig> read_config() {
  KUIPER_ASSIGN_OR_RETURN(json hf, read_config_json());
  return kuiper::ModelConfig::from_hf(hf);
}

Result<DataType> read_config_dtype() {
  KUIPER_ASSIGN_OR_RETURN(json hf, read_config_json());
  // transformers 5 writes "dtype", earlier versions "torch_dtype".
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (!hf.contains(key) || !hf[key].is_string()) continue;
    const std::string name = hf[key].get<std::string>();
    if (name == "bfloat16") return DataType::kBf16;
    if (name == "float16") return DataType::kFp16;
    if (name == "float32") return DataType::kFp32;
    return Status::Error("--config: " + FLAGS_config + ": " + key + " '" + name +
                         "' is not bfloat16, float16 or float32: give --dtype");
  }
  return Status::Error("--config: " + FLAGS_config +
                       " names no torch_dtype for --dtype auto to follow: give --dtype");
}

Result<op::WeightFormat> quantize_format() {
  if (FLAGS_quantize.empty()) return op::WeightFormat::kPlain;
  KUIPER_ASSIGN_OR_RETURN(const op::WeightFormat f, op::parse_weight_format(FLAGS_quantize));
  if (f == op::WeightFormat::kPlain) return Status::Error("--quantize plain: leave it unset");
  return f;
}

QuantizeBlock quantize_block(op::WeightFormat format) {
  if (format == op::WeightFormat::kFp8) return {128, 128};
  return {1, FLAGS_group};
}

Result<op::Weight> quantize_weight(const Tensor& plain) {
  KUIPER_ASSIGN_OR_RETURN(const op::WeightFormat f, quantize_format());
  if (f == op::WeightFormat::kPlain) return op::Weight(plain);
  const QuantizeBlock b = quantize_block(f);
  KUIPER_ASSIGN_OR_RETURN(op::Weight w, op::empty_weight(f, plain.dim(0), plain.dim(1), b.rows,
                                                         b.cols, plain.device()));
  KUIPER_RETURN_IF_ERROR(op::quantize(plain, w));
  w.fp8_activations = FLAGS_fp8_activations && f == op::WeightFormat::kFp8;
  return w;
}

}  // namespace kuiper::bench
