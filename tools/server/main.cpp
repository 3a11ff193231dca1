// kuiper-server: an OpenAI-compatible HTTP server on the continuous-batching engine.
//   kuiper-server --model M.bin [--host 127.0.0.1] [--port 8080] [--api-key KEY]
//                 [--max-queue N] [--max-batch N] [--max-context N] [--device ...] ...
// SIGTERM or SIGINT: refuse new requests (503), let the ones in flight finish (for at most
// --shutdown-grace seconds, then cancel them), stop, exit 0.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "kuiper/model/model.h"
#include "kuiper/model/model_file.h"
#include "kuiper/runtime/engine.h"
#include "kuiper/runtime/vision_input.h"
#include "tools/program_flags.h"
#include "tools/server/engine_loop.h"
#include "tools/server/http_server.h"
#include "tools/server/metrics.h"

DEFINE_string(model, "", "Kuiper model file (.bin) from kuiper-convert");
DEFINE_string(host, "127.0.0.1", "address to listen on");
DEFINE_int32(port, 8080, "port to listen on; 0: any free port (the log says which)");
DEFINE_string(api_key, "", "require Authorization: Bearer KEY on /v1/ routes");
DEFINE_int64(max_queue, 256, "requests that may wait for the engine; more are refused (429)");
DEFINE_string(served_model_name, "", "the model's name in the API (default: the file's name)");
DEFINE_double(shutdown_grace, 30, "seconds requests in flight may take after SIGTERM/SIGINT");
DEFINE_int32(http_threads, 0,
             "connections served at once; 0: --max-batch + --max-queue + 16");
DEFINE_bool(no_think, false, "Qwen3: answer without a thinking block unless a request asks");
// The engine and model flags, as qwen*_infer and kuiper-bench spell them.
DEFINE_int64(max_batch, 0, "requests run at once; 0: 64 on cuda, 8 on cpu");
DEFINE_int64(max_batch_tokens, 2048, "tokens one engine step runs (prefill chunks + decodes)");
DEFINE_int64(max_context, 4096, "KV cache length in tokens per request; 0: the model's maximum");
DEFINE_string(kv_cache, "",
              "KV cache pool: a fraction of the free GPU memory (0.9) or a size (8GiB, 512MiB); "
              "default: room for --max-batch requests of --max-context tokens");
DEFINE_int64(kv_block_size, 16, "tokens per KV cache block (the prefix cache shares whole blocks)");
DEFINE_string(attention, "flash2", "attention algorithm: mha, flash1 or flash2");
DEFINE_string(device, "", "cpu or cuda (default: cuda when a GPU is usable, else cpu)");
DEFINE_string(dtype, "auto",
              "activation dtype: auto (the checkpoint's on cuda, fp32 on cpu), bf16, fp16 or fp32");
DEFINE_bool(cuda_graph, true, "decode through a captured CUDA graph (cuda only)");
DEFINE_bool(fp8_activations, false,
            "FP8 weights multiply activations rounded to FP8 (W8A8: a scale per row and 128 "
            "columns, as transformers, vLLM and SGLang run FP8 checkpoints); off: the product "
            "with the dequantized weights");

namespace kuiper::server {
namespace {

std::string file_stem(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const size_t dot = name.rfind('.');
  return dot == std::string::npos || dot == 0 ? name : name.substr(0, dot);
}

Status serve(sigset_t signals) {
  if (FLAGS_model.empty()) return Status::Error("--model is required (a .bin from kuiper-convert)");
  if (FLAGS_max_queue < 0) return Status::Error("--max-queue must be >= 0");
  if (FLAGS_port < 0 || FLAGS_port > 65535) return Status::Error("--port must be in [0, 65535]");
  if (FLAGS_max_batch < 0) return Status::Error("--max-batch must be >= 1, or 0 for the default");
  if (FLAGS_max_context < 0) return Status::Error("--max-context must be >= 0");
  if (!(FLAGS_shutdown_grace >= 0)) return Status::Error("--shutdown-grace must be >= 0");

  ModelOptions model_options;
  Result<DeviceType> device = FLAGS_device.empty()
                                  ? (cuda_available() ? DeviceType::kCuda : DeviceType::kCpu)
                                  : parse_device(FLAGS_device);
  if (!device.ok()) return device.status().With("--device");
  model_options.device = *device;
  Result<AttentionKind> attention = parse_attention(FLAGS_attention);
  if (!attention.ok()) return attention.status().With("--attention");
  model_options.attention = *attention;
  KUIPER_RETURN_IF_ERROR(set_model_flags(
      FLAGS_dtype, FLAGS_cuda_graph, !gflags::GetCommandLineFlagInfoOrDie("cuda_graph").is_default,
      &model_options));
  model_options.fp8_activations = FLAGS_fp8_activations;
  const int64_t max_batch =
      FLAGS_max_batch > 0 ? FLAGS_max_batch : (*device == DeviceType::kCuda ? 64 : 8);

  KUIPER_ASSIGN_OR_RETURN(std::shared_ptr<ModelFile> file, ModelFile::open(FLAGS_model));
  const ModelConfig& config = file->config();
  const int64_t model_max = config.context_limit();
  model_options.max_context = FLAGS_max_context == 0 ? model_max : FLAGS_max_context;
  if (model_options.max_context > model_max) {
    if (!gflags::GetCommandLineFlagInfoOrDie("max_context").is_default) {
      return Status::Error("--max-context " + std::to_string(model_options.max_context) +
                           ": above the model's maximum of " + std::to_string(model_max));
    }
    model_options.max_context = model_max;
  }
  model_options.max_sequences = max_batch;
  KUIPER_RETURN_IF_ERROR(set_kv_cache_flag(FLAGS_kv_cache, &model_options));
  if (FLAGS_kv_block_size < 1 || FLAGS_kv_block_size > 4096) {
    return Status::Error("--kv-block-size must be in [1, 4096], not " +
                         std::to_string(FLAGS_kv_block_size));
  }
  model_options.kv_block_size = FLAGS_kv_block_size;
  if (file->tokenizer_json().empty()) return Status::Error(FLAGS_model + " holds no tokenizer");
  KUIPER_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::from_json(file->tokenizer_json()));
  KUIPER_ASSIGN_OR_RETURN(ChatTemplate chat_template,
                          ChatTemplate::from_tokenizer_config(file->tokenizer_config_json()));
  ChatOptions chat;
  if (FLAGS_no_think) chat.extra["enable_thinking"] = false;
  std::optional<ImageInput> vision;
  if (config.vision.has_value()) {
    KUIPER_ASSIGN_OR_RETURN(vision, ImageInput::from_model_file(*file));
  }
  KUIPER_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::load(FLAGS_model, model_options));
  EngineOptions engine_options;
  engine_options.max_batch = max_batch;
  engine_options.max_batch_tokens = FLAGS_max_batch_tokens;
  KUIPER_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                          Engine::create(*model, tokenizer, engine_options));

  Metrics metrics;
  EngineLoop loop(*engine, max_batch + FLAGS_max_queue, metrics);
  ServerOptions options;
  options.host = FLAGS_host;
  options.port = FLAGS_port;
  options.api_key = FLAGS_api_key;
  options.model_name =
      FLAGS_served_model_name.empty() ? file_stem(FLAGS_model) : FLAGS_served_model_name;
  options.http_threads = FLAGS_http_threads > 0
                             ? FLAGS_http_threads
                             : static_cast<int>(max_batch + FLAGS_max_queue + 16);
  HttpServer http(*engine, chat_template, chat, vision ? &*vision : nullptr, loop, metrics,
                  options);
  KUIPER_RETURN_IF_ERROR(http.bind());
  loop.start();

  // SIGTERM / SIGINT (blocked in every thread) arrive here: refuse new requests, give the
  // ones in flight the grace period, then cancel what is left and stop.
  std::thread signal_thread([&, signals] {
    int signal_number = 0;
    sigwait(&signals, &signal_number);
    if (signal_number == SIGUSR1) return;  // the server stopped by itself
    LOG(INFO) << "signal " << signal_number << " (" << strsignal(signal_number)
              << "): refusing new requests; " << loop.in_flight() << " in flight finish";
    http.drain();
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration<double>(FLAGS_shutdown_grace);
    while (http.active() > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (http.active() > 0) {
      LOG(WARNING) << "grace period over: cancelling " << loop.in_flight() << " requests";
      loop.cancel_all();
      while (http.active() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    // A non-streamed response is written just after its handler returns.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    http.stop();
  });
  LOG(INFO) << "kuiper-server: serving \"" << options.model_name << "\" on http://"
            << options.host << ":" << http.port() << " (" << device_name(*device)
            << ", max batch " << max_batch << ", context " << engine->max_context()
            << " tokens, " << engine->pool().blocks() << " KV blocks)";
  std::fprintf(stderr, "listening on http://%s:%d\n", options.host.c_str(), http.port());
  std::fflush(stderr);
  http.listen();
  loop.stop();
  pthread_kill(signal_thread.native_handle(), SIGUSR1);
  signal_thread.join();
  LOG(INFO) << "kuiper-server: stopped";
  return Status::Ok();
}

}  // namespace
}  // namespace kuiper::server

int main(int argc, char** argv) {
  if (kuiper::start_program(
          argc, argv,
          "an OpenAI-compatible server:\n  kuiper-server --model M.bin [--host 127.0.0.1] "
          "[--port 8080] [--api-key KEY] [--max-queue N] [--max-batch N] [--max-context N]\n"
          "Flags may be written with dashes or underscores (--api-key, --api_key).")) {
    return 0;
  }
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) args.push_back(i == 0 ? argv[0] : kuiper::gflags_spelling(argv[i]));
  std::vector<char*> ptrs;
  for (std::string& a : args) ptrs.push_back(a.data());
  int parsed_argc = static_cast<int>(ptrs.size());
  char** parsed_argv = ptrs.data();
  gflags::ParseCommandLineFlags(&parsed_argc, &parsed_argv, true);
  if (parsed_argc > 1) {
    std::fprintf(stderr, "kuiper-server: unexpected argument '%s'\n", parsed_argv[1]);
    return 1;
  }
  // Signals are taken by one thread (sigwait); every thread started later inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is a failed write, not the end
  const kuiper::Status status = kuiper::server::serve(signals);
  if (!status.ok()) {
    std::fprintf(stderr, "kuiper-server: %s\n", status.message().c_str());
    return 1;
  }
  return 0;
}
