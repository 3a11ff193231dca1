// kuiper-bench: how fast a model, the attention op or the matmul op runs on this GPU, or how
// much the Engine serves (--throughput, also on the CPU), as markdown tables and as JSON
// (--json FILE) for scripts/plot_perf.py and scripts/perf_report.sh.
// README.md beside this file describes each mode, its flags and how to read the figures.

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "kuiper/base/allocator.h"
#include "kuiper/base/status.h"
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
  const Result<DataType> dtype = kuiper::parse_dtype(FLAGS_dtype);
  if (!dtype.ok()) return dtype.status().With("--dtype");
  const DataType stored = dtype.value();
  json doc{{"tool", "kuiper-bench"}, {"command", command}, {"mode", "throughput"},
           {"dtype", FLAGS_dtype},   {"cuda_graph", FLAGS_cuda_graph},
           {"peak_tflop_s", FLAGS_peak_tflops}};
  if (setup.device == DeviceType::kCpu) {
    if (stored != DataType::kFp32) {
      return Status::Error("--device cpu runs fp32 only: give --dtype fp32, not " + FLAGS_dtype);
    }
    if (FLAGS_cuda_graph) return Status::Error("--cuda-graph needs --device cuda");
    setup.activation = DataType::kFp32;
    doc["device"] = json{{"name", "cpu"}};
  } else {
#ifdef KUIPER_WITH_CUDA
    if (!kuiper::cuda_available()) {
      return Status::Error("--device cuda needs a usable CUDA GPU (or give --device cpu)");
    }
    if (stored != DataType::kFp16 && stored != DataType::kBf16 && stored != DataType::kFp32) {
      return Status::Error("--dtype: expected fp16, bf16 or fp32, not " + FLAGS_dtype);
    }
    // As in model mode: bf16 weights are converted to fp16 at load and run fp16.
    setup.activation = stored == DataType::kFp32 ? DataType::kFp32 : DataType::kFp16;
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
  doc["model"] = setup.name;
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

#ifdef KUIPER_WITH_CUDA

Status run_on_gpu(const std::string& command) {
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
    if (FLAGS_prompt < 1 || FLAGS_gen < 0 || (!contexts.empty() && FLAGS_gen < 1)) {
      return Status::Error("--prompt must be >= 1 and --gen >= 0 (>= 1 with --contexts)");
    }
    doc["mode"] = "model";
    ModelSetup setup;
    setup.activation = activation;
    setup.copy_gbs = copy_gbs;
    KUIPER_RETURN_IF_ERROR(read_model_shape(&setup.config, &setup.name));
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

Status run_on_gpu(const std::string&) {
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
  FLAGS_logtostderr = true;  // the library's logs (VLOG, shown with --v=1) go to stderr, not files
  google::InitGoogleLogging(argv[0]);
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
  const kuiper::Status status = kuiper::bench::run(command);
  if (!status.ok()) {
    std::fprintf(stderr, "kuiper-bench: %s\n", status.message().c_str());
    return 1;
  }
  return 0;
}
