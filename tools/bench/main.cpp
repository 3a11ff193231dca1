// kuiper-bench: how fast a model, the attention op or the matmul op runs on this GPU, or how
// much the Engine serves (--throughput, also on the CPU), as markdown tables and as JSON
// (--json FILE) for scripts/plot_perf.py and scripts/perf_report.sh.
// README.md beside this file describes each mode, its flags and how to read the figures.

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "kuiper/base/allocator.h"
#include "kuiper/base/status.h"
#include "kuiper/model/activation_dtype.h"
#include "tools/program_flags.h"
#include "kuiper/model/model_file.h"
#include "tools/bench/device.h"
#include "tools/bench/flags.h"
#include "tools/bench/report.h"
#include "tools/bench/throughput_bench.h"
#ifdef KUIPER_WITH_CUDA
#include "kuiper/base/cuda_runtime.h"
#include "tools/bench/attention_bench.h"
#include "tools/bench/cost_model.h"
#include "tools/bench/matmul_bench.h"
#include "tools/bench/sample_bench.h"
#include "tools/bench/model_bench.h"
#endif

namespace kuiper::bench {

namespace {

// The model shape to benchmark and its name: --model's, or --config's.
Status read_model_shape(kuiper::ModelConfig* config, std::string* name) {
  if (FLAGS_config.empty() == FLAGS_model.empty()) {
    return Status::Error("give exactly one of --config CONFIG.json and --model M.bin");
  }
  if (!FLAGS_model.empty()) {
    KUIPER_ASSIGN_OR_RETURN(std::shared_ptr<kuiper::ModelFile> file,
                            kuiper::ModelFile::open(FLAGS_model));
    *config = file->config();
    *name = FLAGS_model;
    return Status::Ok();
  }
  KUIPER_ASSIGN_OR_RETURN(*config, read_config());
  *name = FLAGS_config.substr(FLAGS_config.find_last_of('/') + 1);
  return Status::Ok();
}

// --quantize (and --group, --quantize-lm-head): how a random model's matrices are quantized, as
// kuiper-convert --quantize would (FP8 128 x 128 blocks). A model file says its own, read here.
Result<kuiper::QuantizeSpec> read_quantize() {
  if ((!FLAGS_quantize.empty() || !FLAGS_quantize_lm_head.empty()) && !FLAGS_model.empty()) {
    return Status::Error("--quantize applies to --config's random weights; a --model file holds "
                         "its own (kuiper-convert --quantize)");
  }
  if (!FLAGS_model.empty()) {
    // The file's own: its quantized projections share one format and block (kuiper-convert's),
    // so the first one describes them for the cost model's bytes a token; lm_head may differ.
    KUIPER_ASSIGN_OR_RETURN(const std::shared_ptr<kuiper::ModelFile> file,
                            kuiper::ModelFile::open(FLAGS_model));
    KUIPER_ASSIGN_OR_RETURN(const auto entries, kuiper::parse_quantization(file->metadata()));
    kuiper::QuantizeSpec spec;
    for (const auto& [name, e] : entries) {
      const int64_t block =
          e.format == op::WeightFormat::kFp8 && e.block_rows == 1 ? 0 : e.block_cols;
      if (name == "lm_head.weight") {
        spec.lm_head = e.format;
      } else if (spec.format == op::WeightFormat::kPlain) {
        spec.format = e.format;
        spec.block = block;
      }
    }
    return spec;
  }
  KUIPER_ASSIGN_OR_RETURN(const op::WeightFormat format, quantize_format());
  const bool fp8 = format == op::WeightFormat::kFp8 ||
                   (format == op::WeightFormat::kPlain && FLAGS_quantize_lm_head == "fp8");
  Result<kuiper::QuantizeSpec> q = kuiper::parse_quantize_spec(
      FLAGS_quantize, fp8 ? 128 : FLAGS_group, FLAGS_quantize_lm_head);
  if (!q.ok()) return q.status().With("--quantize");
  return q;
}

// The activation dtype, by the programs' rule (resolve_activation), and why: auto follows the
// weights (--model's stored dtype, --config's torch_dtype); attention-only mode has none and
// takes bf16, the dtype Qwen publishes.
struct DtypeChoice {
  DataType activation;
  std::string why;
};

Result<DtypeChoice> choose_dtype(DeviceType device) {
  Result<std::optional<DataType>> requested =
      kuiper::parse_activation_dtype(FLAGS_dtype, device);
  if (!requested.ok()) return requested.status().With("--dtype");
  if (requested->has_value() || device == DeviceType::kCpu) {  // no stored dtype to follow
    KUIPER_ASSIGN_OR_RETURN(DataType activation,
                            kuiper::resolve_activation(*requested, DataType::kFp32, device));
    return DtypeChoice{activation, requested->has_value() ? "--dtype" : "auto: the CPU's fp32"};
  }
  DataType stored = DataType::kBf16;
  std::string source = "attention-only: bf16, as Qwen publishes";
  if (!FLAGS_attention_only && !FLAGS_model.empty() && FLAGS_config.empty()) {
    KUIPER_ASSIGN_OR_RETURN(std::shared_ptr<kuiper::ModelFile> file,
                            kuiper::ModelFile::open(FLAGS_model));
    stored = kuiper::checkpoint_dtype(*file);
    source = "the dtype --model is stored in";
  } else if (!FLAGS_attention_only && !FLAGS_config.empty()) {
    KUIPER_ASSIGN_OR_RETURN(stored, read_config_dtype());
    source = "the torch_dtype of --config";
  }
  KUIPER_ASSIGN_OR_RETURN(DataType activation,
                          kuiper::resolve_activation(*requested, stored, device));
  return DtypeChoice{activation, requested->has_value() ? "--dtype" : "auto: " + source};
}

Status run_throughput(const std::string& command) {
  KUIPER_ASSIGN_OR_RETURN(std::vector<std::string> kinds, split_kinds(FLAGS_attention));
  KUIPER_ASSIGN_OR_RETURN(std::vector<int64_t> concurrency,
                          split_lengths("concurrency", FLAGS_concurrency));
  if (concurrency.empty()) return Status::Error("--concurrency: no value given");
  if (FLAGS_num_prompts < 0) return Status::Error("--num-prompts must be >= 0");
  if (FLAGS_input_len < 1 || FLAGS_output_len < 1) {
    return Status::Error("--input-len and --output-len must be >= 1");
  }
  if (!(FLAGS_len_jitter >= 0 && FLAGS_len_jitter < 1)) {
    return Status::Error("--len-jitter must be in [0, 1), not " + std::to_string(FLAGS_len_jitter));
  }
  if (FLAGS_shared_prefix < 0) return Status::Error("--shared-prefix must be >= 0");
  if (FLAGS_max_batch_tokens < 1) return Status::Error("--max-batch-tokens must be >= 1");
  ThroughputSetup setup;
  const Result<DeviceType> device = kuiper::parse_device(FLAGS_device);
  if (!device.ok()) return device.status().With("--device");
  setup.device = device.value();
  KUIPER_ASSIGN_OR_RETURN(DtypeChoice dtype, choose_dtype(setup.device));
  setup.activation = dtype.activation;
  json doc{{"tool", "kuiper-bench"}, {"command", command}, {"mode", "throughput"},
           {"dtype", kuiper::dtype_name(dtype.activation)},
           {"dtype_choice", dtype.why},
           {"cuda_graph", FLAGS_cuda_graph && setup.device == DeviceType::kCuda},
           {"peak_tflop_s", FLAGS_peak_tflops}};
  if (setup.device == DeviceType::kCpu) {
    doc["device"] = json{{"name", "cpu"}};
  } else {
#ifdef KUIPER_WITH_CUDA
    if (!kuiper::cuda_available()) {
      return Status::Error("--device cuda needs a usable CUDA GPU (or give --device cpu)");
    }
    doc["device"] = device_info();
    KUIPER_ASSIGN_OR_RETURN(setup.copy_gbs, copy_bandwidth_gbs());
    setup.usable_bytes = static_cast<double>(usable_bytes());
    doc["copy_gb_s"] = setup.copy_gbs;
#else
    return Status::Error("this build of Kuiper has no CUDA support: give --device cpu");
#endif
  }
  doc["activation"] = kuiper::dtype_name(setup.activation);
  KUIPER_RETURN_IF_ERROR(read_model_shape(&setup.config, &setup.name));
  KUIPER_ASSIGN_OR_RETURN(setup.quantize, read_quantize());
  doc["model"] = setup.name;
  doc["quantize"] = setup.quantize.describe();
  Report report;
  // One JSON line per concurrency as it is measured (unless stdout is the JSON document), the
  // file rewritten after each so a run cut short keeps what it measured.
  auto on_point = [&](const json& point) -> Status {
    if (FLAGS_json == "-") return Status::Ok();
    std::printf("%s\n", point.dump().c_str());
    std::fflush(stdout);
    if (FLAGS_json.empty()) return Status::Ok();
    fill(&doc, report);
    return write_json(doc);
  };
  for (const std::string& kind : kinds) {
    const Status s = bench_throughput(kind, setup, concurrency, &report, on_point);
    if (!s.ok()) return s.With(kind);
  }
  fill(&doc, report);
  if (FLAGS_json != "-") {
    std::printf("\n");
    print_tables(report, setup.copy_gbs);
  }
  if (!FLAGS_json.empty()) KUIPER_RETURN_IF_ERROR(write_json(doc));
  return Status::Ok();
}

// The GPU modes' flags that no run could use, refused before the device is looked at (so also
// on a machine without one).
Status check_gpu_flags() {
  if (FLAGS_repeat < 1) return Status::Error("--repeat must be >= 1");
  if (FLAGS_fill_chunk < 2) return Status::Error("--fill-chunk must be >= 2");
  if (!(FLAGS_peak_tflops > 0)) return Status::Error("--peak-tflops must be > 0");
  if (FLAGS_max_context < 0) return Status::Error("--max-context must be >= 0");
  if (FLAGS_sample_only) {
    if (FLAGS_config.empty()) return Status::Error("--sample-only needs --config CONFIG.json");
  } else if (FLAGS_matmul_only) {
    if (FLAGS_config.empty()) return Status::Error("--matmul-only needs --config CONFIG.json");
    if (FLAGS_prompt < 1) return Status::Error("--prompt must be >= 1 (the prefill rows)");
  } else if (FLAGS_attention_only) {
    if (FLAGS_heads < 1 || FLAGS_kv_heads < 1 || FLAGS_head_dim < 1) {
      return Status::Error("--heads, --kv-heads and --head-dim must be >= 1");
    }
    if (FLAGS_heads % FLAGS_kv_heads != 0) {
      return Status::Error("--heads (" + std::to_string(FLAGS_heads) +
                           ") must be a multiple of --kv-heads (" +
                           std::to_string(FLAGS_kv_heads) + ")");
    }
    if (FLAGS_kv_len < 1 || FLAGS_prefill_len < 1 || FLAGS_block_size < 1) {
      return Status::Error("--kv-len, --prefill-len and --block-size must be >= 1");
    }
    if (FLAGS_decode_grid < 0) return Status::Error("--decode-grid must be >= 0 (0: automatic)");
    if (FLAGS_kv_len_spread < 0 || FLAGS_kv_len_spread / 2 >= FLAGS_kv_len) {
      return Status::Error("--kv-len-spread must be >= 0 and below twice --kv-len");
    }
  } else if (FLAGS_prompt < 1 || FLAGS_gen < 0) {
    return Status::Error("--prompt must be >= 1 and --gen >= 0 (>= 1 with --contexts)");
  }
  return Status::Ok();
}

#ifdef KUIPER_WITH_CUDA

Status run_on_gpu(const std::string& command) {
  KUIPER_RETURN_IF_ERROR(check_gpu_flags());
  if (!kuiper::cuda_available()) return Status::Error("kuiper-bench needs a usable CUDA GPU");
  KUIPER_ASSIGN_OR_RETURN(DtypeChoice dtype, choose_dtype(DeviceType::kCuda));
  const DataType activation = dtype.activation;
  if (FLAGS_json != "-") {
    std::printf("%s activations (%s)\n", kuiper::dtype_name(activation), dtype.why.c_str());
  }
  KUIPER_ASSIGN_OR_RETURN(std::vector<std::string> kinds, split_kinds(FLAGS_attention));
  KUIPER_ASSIGN_OR_RETURN(std::vector<int64_t> contexts, split_lengths("contexts", FLAGS_contexts));
  KUIPER_ASSIGN_OR_RETURN(std::vector<int64_t> lengths,
                          split_lengths("prefill-lengths", FLAGS_prefill_lengths));
  Report report;
  json doc{{"tool", "kuiper-bench"},
           {"command", command},
           {"device", device_info()},
           {"dtype", kuiper::dtype_name(activation)},
           {"dtype_choice", dtype.why},
           {"cuda_graph", FLAGS_cuda_graph},
           {"repeat", FLAGS_repeat},
           {"peak_tflop_s", FLAGS_peak_tflops}};
  KUIPER_ASSIGN_OR_RETURN(double copy_gbs, copy_bandwidth_gbs());
  doc["copy_gb_s"] = copy_gbs;
  if (FLAGS_sample_only) {
    doc["mode"] = "sample";
    KUIPER_ASSIGN_OR_RETURN(report.sample, bench_sample());
  } else if (FLAGS_matmul_only) {
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
    if (FLAGS_prompt < 1 || FLAGS_gen < 0 || (!contexts.empty() && FLAGS_gen < 1)) {
      return Status::Error("--prompt must be >= 1 and --gen >= 0 (>= 1 with --contexts)");
    }
    doc["mode"] = "model";
    ModelSetup setup;
    setup.activation = activation;
    setup.copy_gbs = copy_gbs;
    KUIPER_RETURN_IF_ERROR(read_model_shape(&setup.config, &setup.name));
    KUIPER_ASSIGN_OR_RETURN(setup.quantize, read_quantize());
    const size_t elem = kuiper::dtype_size(activation);
    const double token_bytes = decode_bytes(setup.config, elem, 0, setup.quantize);
    doc["model"] = setup.name;
    doc["quantize"] = setup.quantize.describe();
    doc["weights_bytes"] = weight_bytes(setup.config, elem, setup.quantize);
    doc["decode_bytes_context_0"] = token_bytes;  // the weight bytes a decode token reads
    doc["ceiling_tok_s_context_0"] = copy_gbs * 1e9 / token_bytes;
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

Status run_on_gpu(const std::string&) {
  KUIPER_RETURN_IF_ERROR(check_gpu_flags());
  return Status::Error("this build of Kuiper has no CUDA support (--throughput --device cpu runs "
                       "without it)");
}

#endif

Status run(const std::string& command) {
  return FLAGS_throughput ? run_throughput(command) : run_on_gpu(command);
}

}  // namespace

}  // namespace kuiper::bench

int main(int argc, char** argv) {
  if (kuiper::start_program(argc, argv,
                            "kuiper-bench --config CONFIG.json | --model M.bin [flags]")) {
    return 0;
  }
  // Accept --cuda-graph and --no-cuda-graph as well as gflags' --cuda_graph and --nocuda_graph.
  std::vector<std::string> args(argv, argv + argc);
  std::string command;
  for (const std::string& a : args) command += (command.empty() ? "" : " ") + a;
  std::vector<char*> ptrs;
  for (std::string& a : args) {
    a = kuiper::gflags_spelling(a);
    ptrs.push_back(a.data());
  }
  int n = static_cast<int>(ptrs.size());
  char** p = ptrs.data();
  gflags::ParseCommandLineFlags(&n, &p, true);
  const kuiper::Status status = kuiper::bench::run(command);
  if (!status.ok()) {
    std::fprintf(stderr, "kuiper-bench: %s\n", status.message().c_str());
    return 1;
  }
  return 0;
}
