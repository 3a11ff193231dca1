// kuiper-bench: how fast a model runs on this GPU, as a table users can paste.
//
//   kuiper-bench --config models/qwen3-8b.json --dtype fp16 --prompt 512 --gen 128 \
//                --attention mha,flash1,flash2 --cuda-graph
//   kuiper-bench --attention-only --heads 32 --kv-heads 8 --head-dim 128 --kv-len 4096
//   kuiper-bench --matmul-only --config models/qwen3-8b.json
//
// Model mode builds the model from a Hugging Face config.json with random weights generated on
// the GPU (no checkpoint needed; speed does not depend on the values) or loads --model M.bin,
// then times a prefill of --prompt tokens and --gen greedy decode steps, each step ending with
// the argmax copied to the host as a real generation loop would. Decode speed is also given as
// the bytes a step must read (every weight matrix once, plus the KV cache so far) over its time,
// and as a share of this GPU's device-to-device copy bandwidth, measured here.
// Attention-only mode times the attention op alone through make_attention; matmul-only mode
// times op::matmul alone on the config's weight shapes.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
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
DEFINE_int32(gen, 128, "tokens generated after the prompt");
DEFINE_string(attention, "flash2", "mha, flash1, flash2, or a comma-separated list");
DEFINE_bool(cuda_graph, false, "decode through a captured CUDA graph");
DEFINE_int32(repeat, 3, "timed runs per configuration; the median is reported");
DEFINE_bool(json, false, "print JSON instead of a markdown table");
DEFINE_bool(attention_only, false, "time the attention op alone");
DEFINE_bool(matmul_only, false,
            "time op::matmul alone for each weight shape of --config: the decode GEMV (T = 1, "
            "GB/s of weights) and the prefill GEMM (T = --prompt, TFLOP/s)");
DEFINE_int32(heads, 32, "attention-only: query heads");
DEFINE_int32(kv_heads, 8, "attention-only: key/value heads");
DEFINE_int32(head_dim, 128, "attention-only: head dimension");
DEFINE_int32(kv_len, 4096, "attention-only: keys in the cache (context length)");
DEFINE_int32(prefill_len, 512, "attention-only: queries of the prefill case (the last ones)");

namespace {

using kuiper::DataType;
using kuiper::DeviceType;
using kuiper::Result;
using kuiper::Status;
using kuiper::Tensor;
using nlohmann::json;

#ifdef KUIPER_WITH_CUDA

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

// Bytes one decode step must read: every weight matrix (the matrices are stored in the
// activation dtype on the GPU), one embedding row, and the K and V cache rows so far.
double decode_bytes(const kuiper::ModelConfig& c, size_t elem, int64_t context) {
  const double H = c.hidden_size, I = c.intermediate_size;
  const double per_layer = H * c.q_dim() * 2 + H * c.kv_dim() * 2 + 3 * H * I;
  const double weights = (per_layer * c.num_layers + c.vocab_size * H + H) * elem;
  const double kv = 2.0 * c.num_layers * c.kv_dim() * static_cast<double>(context) * elem;
  return weights + kv;
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

Result<json> bench_model(const std::string& kind, DataType activation, double copy_gbs) {
  kuiper::ModelOptions options;
  options.device = DeviceType::kCuda;
  KUIPER_ASSIGN_OR_RETURN(options.attention, kuiper::parse_attention(kind));
  options.activation = activation;
  options.max_context = FLAGS_prompt + FLAGS_gen + 1;
  options.cuda_graph = FLAGS_cuda_graph;
  kuiper::cuda::reset_peak_memory();
  std::unique_ptr<kuiper::Model> model;
  std::string name;
  if (!FLAGS_model.empty()) {
    KUIPER_ASSIGN_OR_RETURN(model, kuiper::Model::load(FLAGS_model, options));
    name = FLAGS_model;
  } else {
    KUIPER_ASSIGN_OR_RETURN(kuiper::ModelConfig config, read_config());
    KUIPER_ASSIGN_OR_RETURN(model, kuiper::Model::random(config, options));
    name = FLAGS_config.substr(FLAGS_config.find_last_of('/') + 1);
  }
  const kuiper::ModelConfig& c = model->config();

  std::vector<int32_t> prompt(static_cast<size_t>(FLAGS_prompt));
  for (size_t i = 0; i < prompt.size(); ++i) {
    prompt[i] = static_cast<int32_t>((i * 7919 + 13) % static_cast<size_t>(c.vocab_size));
  }
  KUIPER_ASSIGN_OR_RETURN(Tensor next, Tensor::empty({1}, DataType::kInt32, DeviceType::kCuda));
  int32_t token = 0;
  // Greedy pick on the GPU, the id copied back: the step a generation loop takes.
  auto pick = [&](const Tensor& logits) -> Status {
    KUIPER_RETURN_IF_ERROR(kuiper::op::argmax(logits, next));
    return kuiper::copy_bytes(&token, DeviceType::kCpu, next.raw(), DeviceType::kCuda, 4);
  };
  // One run: prefill, then `gen` decode steps. The first (untimed) run also warms up cuBLAS
  // and captures the decode graph.
  auto run = [&](int gen, double* prefill_s, double* decode_s) -> Status {
    KUIPER_CUDA_CHECK(cudaDeviceSynchronize());
    auto t0 = std::chrono::steady_clock::now();
    KUIPER_ASSIGN_OR_RETURN(Tensor logits, model->forward(prompt, 0, false));
    KUIPER_RETURN_IF_ERROR(pick(logits));
    *prefill_s = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < gen; ++i) {
      KUIPER_ASSIGN_OR_RETURN(logits, model->forward({token}, FLAGS_prompt + i, false));
      KUIPER_RETURN_IF_ERROR(pick(logits));
    }
    *decode_s = seconds_since(t0);
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
  const size_t elem = kuiper::dtype_size(activation);
  const double step_s = FLAGS_gen > 0 ? decode / FLAGS_gen : 0.0;
  const double gbs =
      step_s > 0 ? decode_bytes(c, elem, FLAGS_prompt + FLAGS_gen / 2) / step_s / 1e9 : 0.0;
  const kuiper::cuda::MemoryStats mem = kuiper::cuda::memory_stats();
  return json{{"model", name},
              {"dtype", FLAGS_dtype},
              {"activation", kuiper::dtype_name(activation)},
              {"attention", kind},
              {"cuda_graph", FLAGS_cuda_graph},
              {"prompt", FLAGS_prompt},
              {"gen", FLAGS_gen},
              {"prefill_ms", prefill * 1e3},
              {"prefill_tok_s", FLAGS_prompt / prefill},
              {"decode_tok_s", FLAGS_gen > 0 ? FLAGS_gen / decode : 0.0},
              {"decode_ms_per_token", step_s * 1e3},
              {"decode_gb_s", gbs},
              {"copy_gb_s", copy_gbs},
              {"decode_pct_of_copy", 100.0 * gbs / copy_gbs},
              {"peak_gib", static_cast<double>(mem.peak) / (1u << 30)}};
}

// Times call() with events on the engine stream: warm-up, then the median of many calls.
template <typename Call>
Result<double> time_on_stream(Call&& call) {
  cudaEvent_t start, stop;
  KUIPER_CUDA_CHECK(cudaEventCreate(&start));
  KUIPER_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> seconds;
  for (int i = 0; i < 53; ++i) {
    KUIPER_CUDA_CHECK(cudaEventRecord(start, kuiper::cuda::stream()));
    KUIPER_RETURN_IF_ERROR(call(i));
    KUIPER_CUDA_CHECK(cudaEventRecord(stop, kuiper::cuda::stream()));
    KUIPER_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    KUIPER_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (i >= 3) seconds.push_back(ms / 1e3);
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
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
      }
    }
    rows.push_back(row);
  }
  return rows;
}

Result<json> bench_attention(const std::string& kind, DataType activation) {
  const int64_t H = FLAGS_heads, KVH = FLAGS_kv_heads, D = FLAGS_head_dim, L = FLAGS_kv_len;
  const int64_t P = std::min<int64_t>(FLAGS_prefill_len, L);
  json rows = json::array();
  for (auto phase : {kuiper::op::AttentionPhase::kDecode, kuiper::op::AttentionPhase::kPrefill}) {
    const bool decode = phase == kuiper::op::AttentionPhase::kDecode;
    kuiper::op::AttentionRequest request;
    KUIPER_ASSIGN_OR_RETURN(request.kind, kuiper::parse_attention(kind));
    request.phase = phase;
    request.dtype = activation;
    request.device = DeviceType::kCuda;
    request.graph_safe = decode && FLAGS_cuda_graph;
    request.head_dim = D;
    KUIPER_ASSIGN_OR_RETURN(std::unique_ptr<kuiper::op::AttentionOp> op,
                            kuiper::op::make_attention(request));
    const int64_t T = decode ? 1 : P, start = L - T;
    kuiper::op::AttentionArgs args;
    KUIPER_ASSIGN_OR_RETURN(args.q, Tensor::empty({T, H, D}, activation, DeviceType::kCuda));
    KUIPER_ASSIGN_OR_RETURN(args.k_cache, Tensor::empty({L, KVH, D}, activation, DeviceType::kCuda));
    KUIPER_ASSIGN_OR_RETURN(args.v_cache, Tensor::empty({L, KVH, D}, activation, DeviceType::kCuda));
    KUIPER_ASSIGN_OR_RETURN(args.out, Tensor::empty({T, H, D}, activation, DeviceType::kCuda));
    KUIPER_RETURN_IF_ERROR(kuiper::op::fill_random(args.q, 1, 1.0f, 0.0f));
    KUIPER_RETURN_IF_ERROR(kuiper::op::fill_random(args.k_cache, 2, 1.0f, 0.0f));
    KUIPER_RETURN_IF_ERROR(kuiper::op::fill_random(args.v_cache, 3, 1.0f, 0.0f));
    args.start = start;
    const int32_t pos = static_cast<int32_t>(start);
    KUIPER_ASSIGN_OR_RETURN(args.device_position,
                            Tensor::empty({1}, DataType::kInt32, DeviceType::kCuda));
    KUIPER_RETURN_IF_ERROR(kuiper::copy_bytes(args.device_position.raw(), DeviceType::kCuda, &pos,
                                              DeviceType::kCpu, 4));
    KUIPER_ASSIGN_OR_RETURN(double seconds, time_on_stream([&](int) { return op->forward(args); }));
    const double kv_bytes = 2.0 * L * KVH * D * kuiper::dtype_size(activation);
    // Causal: query t sees start + t + 1 keys; QK^T and PV are 2 flops per multiply-add each.
    double keys = 0;
    for (int64_t t = 0; t < T; ++t) keys += static_cast<double>(start + t + 1);
    const double flops = 4.0 * H * D * keys;
    rows.push_back(json{{"attention", kind},
                        {"kernel", op->name()},
                        {"phase", decode ? "decode" : "prefill"},
                        {"heads", H},
                        {"kv_heads", KVH},
                        {"head_dim", D},
                        {"kv_len", L},
                        {"queries", T},
                        {"us", seconds * 1e6},
                        {"kv_gb_s", kv_bytes / seconds / 1e9},
                        {"tflop_s", flops / seconds / 1e12}});
  }
  return rows;
}

void print_table(const json& rows) {
  if (FLAGS_matmul_only) {
    std::printf("| weight | N | K | decode us | decode GB/s | %% of D2D copy | prefill T | "
                "prefill us | prefill TFLOP/s |\n|---|---|---|---|---|---|---|---|---|\n");
    for (const json& r : rows) {
      std::printf("| %s | %lld | %lld | %.1f | %.0f | %.0f%% | %lld | %.1f | %.0f |\n",
                  r["shape"].get<std::string>().c_str(), r["N"].get<long long>(),
                  r["K"].get<long long>(), r["decode_us"].get<double>(),
                  r["decode_gb_s"].get<double>(), r["decode_pct_of_copy"].get<double>(),
                  r["prefill_tokens"].get<long long>(), r["prefill_us"].get<double>(),
                  r["prefill_tflop_s"].get<double>());
    }
    return;
  }
  if (FLAGS_attention_only) {
    std::printf("| attention | kernel | phase | heads | kv heads | head dim | kv len | queries | us | "
                "KV GB/s | TFLOP/s |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const json& r : rows) {
      std::printf("| %s | %s | %s | %lld | %lld | %lld | %lld | %lld | %.1f | %.0f | %.1f |\n",
                  r["attention"].get<std::string>().c_str(), r["kernel"].get<std::string>().c_str(),
                  r["phase"].get<std::string>().c_str(), r["heads"].get<long long>(),
                  r["kv_heads"].get<long long>(), r["head_dim"].get<long long>(),
                  r["kv_len"].get<long long>(), r["queries"].get<long long>(),
                  r["us"].get<double>(), r["kv_gb_s"].get<double>(), r["tflop_s"].get<double>());
    }
    return;
  }
  std::printf("| model | dtype | attention | graph | prompt | gen | prefill ms | prefill tok/s | "
              "decode tok/s | decode GB/s | %% of D2D copy | peak GiB |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const json& r : rows) {
    std::printf("| %s | %s | %s | %s | %d | %d | %.1f | %.0f | %.1f | %.0f | %.0f%% | %.2f |\n",
                r["model"].get<std::string>().c_str(), r["dtype"].get<std::string>().c_str(),
                r["attention"].get<std::string>().c_str(), r["cuda_graph"].get<bool>() ? "on" : "off",
                r["prompt"].get<int>(), r["gen"].get<int>(), r["prefill_ms"].get<double>(),
                r["prefill_tok_s"].get<double>(), r["decode_tok_s"].get<double>(),
                r["decode_gb_s"].get<double>(), r["decode_pct_of_copy"].get<double>(),
                r["peak_gib"].get<double>());
  }
  std::printf("\nD2D copy bandwidth (read + write): %.0f GB/s\n", rows[0]["copy_gb_s"].get<double>());
}

Status run() {
  if (!kuiper::cuda_available()) return Status::Error("kuiper-bench needs a usable CUDA GPU");
  KUIPER_ASSIGN_OR_RETURN(DataType stored, kuiper::parse_dtype(FLAGS_dtype));
  if (stored != DataType::kFp16 && stored != DataType::kBf16 && stored != DataType::kFp32) {
    return Status::Error("--dtype: expected fp16, bf16 or fp32, not " + FLAGS_dtype);
  }
  // bf16 has no activation kernels: bf16 weights are converted to fp16 at load and run fp16.
  const DataType activation = stored == DataType::kFp32 ? DataType::kFp32 : DataType::kFp16;
  if (stored == DataType::kBf16 && !FLAGS_json) {
    std::printf("note: --dtype bf16 runs as fp16 activations with the matrices converted to fp16\n");
  }
  KUIPER_ASSIGN_OR_RETURN(std::vector<std::string> kinds, split_kinds(FLAGS_attention));
  json rows = json::array();
  if (FLAGS_matmul_only) {
    if (FLAGS_config.empty()) return Status::Error("--matmul-only needs --config CONFIG.json");
    KUIPER_ASSIGN_OR_RETURN(double copy_gbs, copy_bandwidth_gbs());
    KUIPER_ASSIGN_OR_RETURN(rows, bench_matmul(activation, copy_gbs));
  } else if (FLAGS_attention_only) {
    for (const std::string& kind : kinds) {
      KUIPER_ASSIGN_OR_RETURN(json r, bench_attention(kind, activation));
      for (const json& row : r) rows.push_back(row);
    }
  } else {
    if (FLAGS_config.empty() == FLAGS_model.empty()) {
      return Status::Error("give exactly one of --config CONFIG.json and --model M.bin");
    }
    if (FLAGS_prompt < 1 || FLAGS_gen < 0 || FLAGS_repeat < 1) {
      return Status::Error("--prompt must be >= 1, --gen >= 0, --repeat >= 1");
    }
    KUIPER_ASSIGN_OR_RETURN(double copy_gbs, copy_bandwidth_gbs());
    for (const std::string& kind : kinds) {
      Result<json> r = bench_model(kind, activation, copy_gbs);
      if (!r.ok()) return r.status().With(kind);
      rows.push_back(*r);
    }
  }
  if (FLAGS_json) {
    std::printf("%s\n", rows.dump(2).c_str());
  } else {
    print_table(rows);
  }
  return Status::Ok();
}

#else

Status run() { return Status::Error("this build of Kuiper has no CUDA support"); }

#endif

}  // namespace

int main(int argc, char** argv) {
  // Accept --cuda-graph as well as gflags' --cuda_graph: dashes in flag names become underscores.
  std::vector<std::string> args(argv, argv + argc);
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
  const Status status = run();
  if (!status.ok()) {
    std::fprintf(stderr, "kuiper-bench: %s\n", status.message().c_str());
    return 1;
  }
  return 0;
}
