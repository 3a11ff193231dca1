#include "demo/infer_options.h"

#include <cmath>
#include <random>
#include <sstream>

#include <gflags/gflags.h>

#include "tools/program_flags.h"

DEFINE_string(model, "", "Kuiper model file (.bin) from kuiper-convert");
DEFINE_string(tokenizer, "",
              "tokenizer.json, or a directory holding it (and tokenizer_config.json for the chat "
              "template), to use instead of the one in the model file");
DEFINE_string(prompt, "", "user message to answer (with -i: the first turn)");
DEFINE_string(system, "", "system prompt");
DEFINE_string(image, "",
              "vision-language models: an image file (PNG or JPEG) shown with --prompt (or the "
              "first message of -i) before its text; repeat the flag for several");
DEFINE_bool(interactive, false, "chat in a REPL (also -i)");
DEFINE_string(prompts_file, "",
              "batch mode: a text file with one prompt per line, or .jsonl with {\"prompt\": ...} "
              "or {\"messages\": [...]} per line and optional sampling fields (and \"images\": "
              "[paths] for vision-language models)");
DEFINE_string(output, "", "write results as JSONL to this file (batch mode: default stdout)");
DEFINE_int64(max_tokens, -1, "most tokens to generate per reply; -1: until an end token or "
             "the end of the context");
DEFINE_int64(max_context, 4096, "KV cache length in tokens; 0: the model's maximum");
DEFINE_double(temperature, 0.8, "sampling temperature; 0 is greedy (arg-max)");
DEFINE_int32(top_k, 40, "keep the k most likely tokens; 0 keeps all");
DEFINE_double(top_p, 0.95, "keep the smallest set of tokens whose probability reaches p; 1 is off");
DEFINE_double(min_p, 0.05, "drop tokens less likely than min_p times the most likely; 0 is off");
DEFINE_double(repeat_penalty, 1.0, "penalty for repeating recent tokens; 1 is off");
DEFINE_int32(repeat_last_n, 64, "how many recent tokens the repeat penalty looks at; -1: all");
DEFINE_int64(seed, -1, "random seed for reproducible sampling; -1 draws one");
DEFINE_string(stop, "", "stop string (repeat the flag or give a comma list); not emitted");
DEFINE_bool(stream, false, "print the reply as it is generated");
DEFINE_bool(no_think, false, "Qwen3: answer without a thinking block (enable_thinking=false)");
DEFINE_bool(ignore_eos, false, "keep generating past the model's end tokens");
DEFINE_string(attention, "flash2", "attention algorithm: mha, flash1 or flash2");
DEFINE_string(device, "", "cpu or cuda (default: cuda when a GPU is usable, else cpu)");
DEFINE_string(dtype, "auto",
              "activation dtype: auto (the dtype the checkpoint is stored in on cuda, fp32 on "
              "cpu), bf16, fp16 or fp32");
DEFINE_bool(cuda_graph, true,
            "decode through a captured CUDA graph (default: on with --device cuda; "
            "--no-cuda-graph decodes eagerly)");
DEFINE_bool(fp8_activations, false,
            "FP8 weights multiply activations rounded to FP8 (W8A8: a scale per row and 128 "
            "columns, as transformers, vLLM and SGLang run FP8 checkpoints); off: the product "
            "with the dequantized weights");
DEFINE_bool(stats, false, "print prompt, prefill and decode statistics after each reply");

// Batch mode's concurrency and the KV pool.
DEFINE_int64(max_batch, 0,
             "batch mode: prompts run at once; 0: 64 on cuda, 8 on cpu");
DEFINE_string(kv_cache, "",
              "KV cache pool: a fraction of the free GPU memory (0.9) or a size (8GiB, 512MiB); "
              "default: room for --max-batch sequences of --max-context tokens");
DEFINE_int64(kv_block_size, 16, "tokens per KV cache block (the prefix cache shares whole blocks)");

namespace kuiper::demo {

namespace {

// One line naming the flag, the value given and what it accepts.
Status bad_flag(const std::string& flag, const std::string& value, const std::string& accepted) {
  return Status::Error("--" + flag + " " + value + ": expected " + accepted);
}

std::string number_text(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

void split_stops(const std::string& value, std::vector<std::string>* stops) {
  std::stringstream ss(value);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) stops->push_back(item);
  }
}

// gflags knows neither one-letter flags nor dashes inside names, and keeps only the last value
// of a repeated flag. Rewrites `-i` to --interactive and the rest as gflags_spelling does
// (--top-p, --no-cuda-graph), and takes every --stop out of the arguments into `stops` and every
// --image into `images`. The value after a flag that takes one is left as it is, so
// `--prompt -i` is a prompt.
Result<std::vector<std::string>> rewrite_args(int argc, char** argv,
                                              std::vector<std::string>* stops,
                                              std::vector<std::string>* images) {
  std::vector<std::string> out = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      for (; i < argc; ++i) out.push_back(argv[i]);
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      out.push_back(arg);
      continue;
    }
    if (arg == "-i") {
      out.push_back("--interactive");
      continue;
    }
    arg = gflags_spelling(arg);
    const size_t dashes = arg[1] == '-' ? 2 : 1;
    const size_t eq = arg.find('=');
    const std::string name =
        arg.substr(dashes, eq == std::string::npos ? std::string::npos : eq - dashes);
    const bool has_value = eq != std::string::npos;
    gflags::CommandLineFlagInfo info;
    const bool takes_value = gflags::GetCommandLineFlagInfo(name.c_str(), &info) && info.type != "bool";
    if (name == "stop") {
      if (!has_value && i + 1 >= argc) return Status::Error("--stop needs a value");
      const size_t before = stops->size();
      split_stops(has_value ? arg.substr(eq + 1) : std::string(argv[++i]), stops);
      if (stops->size() == before) {
        return Status::Error("--stop needs a non-empty string (several are separated by commas)");
      }
      continue;
    }
    if (name == "image") {
      if (!has_value && i + 1 >= argc) return Status::Error("--image needs a file");
      const std::string path = has_value ? arg.substr(eq + 1) : std::string(argv[++i]);
      if (path.empty()) return Status::Error("--image needs a file");
      images->push_back(path);
      continue;
    }
    out.push_back(arg);
    if (takes_value && !has_value && i + 1 < argc) out.push_back(argv[++i]);
  }
  return out;
}

Status check_sampling_flags() {
  if (!(FLAGS_temperature >= 0.0) || !std::isfinite(FLAGS_temperature)) {
    return bad_flag("temperature", number_text(FLAGS_temperature), "a number >= 0 (0 is greedy)");
  }
  if (FLAGS_top_k < 0) {
    return bad_flag("top-k", std::to_string(FLAGS_top_k), "an integer >= 0 (0 keeps all tokens)");
  }
  if (!(FLAGS_top_p > 0.0 && FLAGS_top_p <= 1.0)) {
    return bad_flag("top-p", number_text(FLAGS_top_p), "a number in (0, 1] (1 is off)");
  }
  if (!(FLAGS_min_p >= 0.0 && FLAGS_min_p <= 1.0)) {
    return bad_flag("min-p", number_text(FLAGS_min_p), "a number in [0, 1] (0 is off)");
  }
  if (!(FLAGS_repeat_penalty > 0.0) || !std::isfinite(FLAGS_repeat_penalty)) {
    return bad_flag("repeat-penalty", number_text(FLAGS_repeat_penalty),
                    "a number > 0 (1 is off)");
  }
  if (FLAGS_repeat_last_n < -1) {
    return bad_flag("repeat-last-n", std::to_string(FLAGS_repeat_last_n),
                    "an integer >= 0, or -1 for all tokens");
  }
  if (FLAGS_seed < -1) {
    return bad_flag("seed", std::to_string(FLAGS_seed), "an integer >= 0, or -1 for a random one");
  }
  return Status::Ok();
}

}  // namespace

Result<InferOptions> parse_infer_options(int argc, char** argv, Architecture family) {
  std::vector<std::string> stops;
  std::vector<std::string> images;
  KUIPER_ASSIGN_OR_RETURN(std::vector<std::string> args,
                          rewrite_args(argc, argv, &stops, &images));
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  int parsed_argc = static_cast<int>(arg_ptrs.size());
  char** parsed_argv = arg_ptrs.data();
  gflags::ParseCommandLineFlags(&parsed_argc, &parsed_argv, true);
  if (parsed_argc > 1) {
    return Status::Error(std::string("unexpected argument '") + parsed_argv[1] +
                         "' (flags start with --; see --help)");
  }

  InferOptions o;
  o.model_path = FLAGS_model;
  if (o.model_path.empty()) return Status::Error("--model is required (a .bin from kuiper-convert)");
  o.tokenizer_path = FLAGS_tokenizer;
  o.prompt = FLAGS_prompt;
  o.system = FLAGS_system;
  o.prompts_file = FLAGS_prompts_file;
  o.output_path = FLAGS_output;
  o.interactive = FLAGS_interactive;
  o.stream = FLAGS_stream;
  o.stats = FLAGS_stats;
  o.images = images;
  o.no_think = FLAGS_no_think;
  if (o.no_think && family != Architecture::kQwen3 && family != Architecture::kQwen3VL) {
    return Status::Error("--no-think: only Qwen3 models have a thinking mode");
  }
  if (!o.images.empty() && family != Architecture::kQwen3VL) {
    return Status::Error(std::string("--image: ") + architecture_name(family) +
                         " models take no images (qwen3_vl_infer runs vision-language models)");
  }
  if (!o.images.empty() && !o.prompts_file.empty()) {
    return Status::Error("--image goes with --prompt or -i; in a prompts file give \"images\" "
                         "per line");
  }
  if (o.interactive && !o.prompts_file.empty()) {
    return Status::Error("--prompts-file and -i/--interactive cannot be used together");
  }
  if (!o.prompts_file.empty() && !o.prompt.empty()) {
    return Status::Error("--prompts-file and --prompt cannot be used together");
  }
  if (!o.interactive && o.prompts_file.empty() && o.prompt.empty()) {
    return Status::Error("nothing to do: give --prompt, --prompts-file or -i (see --help)");
  }

  Result<DeviceType> device =
      FLAGS_device.empty() ? (cuda_available() ? DeviceType::kCuda : DeviceType::kCpu)
                           : parse_device(FLAGS_device);
  if (!device.ok()) return device.status().With("--device");
  o.model.device = *device;
  Result<AttentionKind> attention = parse_attention(FLAGS_attention);
  if (!attention.ok()) return attention.status().With("--attention");
  o.model.attention = *attention;
  KUIPER_RETURN_IF_ERROR(set_model_flags(
      FLAGS_dtype, FLAGS_cuda_graph, !gflags::GetCommandLineFlagInfoOrDie("cuda_graph").is_default,
      &o.model));
  o.model.fp8_activations = FLAGS_fp8_activations;
  if (FLAGS_max_context < 0) {
    return bad_flag("max-context", std::to_string(FLAGS_max_context),
                    "a number of tokens > 0, or 0 for the model's maximum");
  }
  o.model.max_context = FLAGS_max_context;
  o.max_context_given = !gflags::GetCommandLineFlagInfoOrDie("max_context").is_default;

  if (FLAGS_max_batch < 0) {
    return bad_flag("max-batch", std::to_string(FLAGS_max_batch),
                    "a number of prompts >= 1, or 0 for the default");
  }
  if (FLAGS_max_batch > 0 && o.prompts_file.empty()) {
    return Status::Error("--max-batch goes with --prompts-file");
  }
  o.max_batch = FLAGS_max_batch > 0 ? FLAGS_max_batch
                                    : (o.model.device == DeviceType::kCuda ? 64 : 8);
  KUIPER_RETURN_IF_ERROR(set_kv_cache_flag(FLAGS_kv_cache, &o.model));
  if (o.model.kv_cache_fraction > 0.0 && o.model.device != DeviceType::kCuda) {
    return Status::Error("--kv-cache: a fraction of free memory needs --device cuda; give a size "
                         "such as 512MiB on the CPU");
  }
  if (FLAGS_kv_block_size < 1 || FLAGS_kv_block_size > 4096) {
    return bad_flag("kv-block-size", std::to_string(FLAGS_kv_block_size),
                    "a number of tokens in [1, 4096]");
  }
  o.model.kv_block_size = FLAGS_kv_block_size;

  if (FLAGS_max_tokens == 0 || FLAGS_max_tokens < -1) {
    return bad_flag("max-tokens", std::to_string(FLAGS_max_tokens), "an integer > 0, or -1 for no limit");
  }
  KUIPER_RETURN_IF_ERROR(check_sampling_flags());
  GenerationOptions& g = o.generation;
  g.max_tokens = FLAGS_max_tokens;
  g.stop = stops;
  g.ignore_eos = FLAGS_ignore_eos;
  g.sampling.temperature = static_cast<float>(FLAGS_temperature);
  g.sampling.top_k = FLAGS_top_k;
  g.sampling.top_p = static_cast<float>(FLAGS_top_p);
  g.sampling.min_p = static_cast<float>(FLAGS_min_p);
  g.sampling.repeat_penalty = static_cast<float>(FLAGS_repeat_penalty);
  g.sampling.repeat_last_n = FLAGS_repeat_last_n;
  o.seed_given = FLAGS_seed >= 0;
  g.sampling.seed = o.seed_given ? static_cast<uint64_t>(FLAGS_seed) : std::random_device{}();
  return o;
}

}  // namespace kuiper::demo
