// kuiper-bench: how fast a model, the attention op or the matmul op runs on this GPU, as
// markdown tables and as JSON (--json FILE) for scripts/plot_perf.py and scripts/perf_report.sh.
// README.md beside this file describes each mode, its flags and how to read the figures.

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "kuiper/base/status.h"
#ifdef KUIPER_WITH_CUDA
#include "kuiper/base/allocator.h"
#include "kuiper/base/cuda_runtime.h"
#include "kuiper/model/model_file.h"
#include "tools/bench/attention_bench.h"
#include "tools/bench/cost_model.h"
#include "tools/bench/device.h"
#include "tools/bench/flags.h"
#include "tools/bench/matmul_bench.h"
#include "tools/bench/model_bench.h"
#include "tools/bench/report.h"
#endif

namespace kuiper::bench {

namespace {

#ifdef KUIPER_WITH_CUDA

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
