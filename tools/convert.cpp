// kuiper-convert: a Hugging Face checkpoint directory -> one Kuiper model file.
//
//   kuiper-convert --hf DIR --out model.bin [--dtype fp32|fp16|bf16]
//                  [--quantize fp8|int8|int4 [--group N] [--fp8-block 128|channel]]
//
// Quantized checkpoints (FP8, AWQ, GPTQ) are read as published and keep their quantization;
// --quantize makes one from a 16-bit checkpoint (the decoder's projections, round to nearest).
//
// Progress goes to stderr; any failure is one line "kuiper-convert: <message>", exit code 1,
// and no output file (the writer only renames a complete file into place).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "kuiper/model/hf_checkpoint.h"
#include "kuiper/model/model_file.h"
#include "kuiper/model/quantization.h"
#include "tools/program_flags.h"

DEFINE_string(hf, "", "Hugging Face checkpoint directory (config.json, tokenizer, safetensors)");
DEFINE_string(out, "", "model file to write");
DEFINE_string(dtype, "", "convert every weight to fp32, fp16 or bf16 (default: keep as stored)");
DEFINE_string(quantize, "",
              "quantize the decoder's projections: fp8, int8 or int4 (embeddings, norms, a "
              "vision tower and, unless --quantize-lm-head, lm_head stay 16-bit)");
DEFINE_string(quantize_lm_head, "",
              "quantize an untied lm_head too: fp8, int8 or int4, with --quantize's --group or "
              "--fp8-block (as llama.cpp and calm do; the published releases keep it 16-bit)");
DEFINE_int32(group, 128, "--quantize int8/int4: columns per scale and zero point");
DEFINE_string(fp8_block, "128",
              "--quantize fp8: the side of the square scale block, or 'channel' for one scale a "
              "row");

namespace {

constexpr const char* kUsage =
    "kuiper-convert --hf DIR --out model.bin [--dtype fp32|fp16|bf16] "
    "[--quantize fp8|int8|int4 [--group N] [--fp8-block 128|channel]] "
    "[--quantize-lm-head fp8|int8|int4]";

int fail(const std::string& message) {
  std::fprintf(stderr, "kuiper-convert: %s\n", message.c_str());
  return 1;
}

double mib(uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// On a terminal one line is redrawn per tensor; in a log a line every 10% is enough.
class ProgressPrinter {
 public:
  ProgressPrinter() : interactive_(::isatty(STDERR_FILENO) != 0) {}

  void operator()(const kuiper::ConvertProgress& p) {
    const double percent =
        p.bytes_total > 0 ? 100.0 * static_cast<double>(p.bytes_done) / p.bytes_total : 100.0;
    const int decile = static_cast<int>(percent / 10);
    if (!interactive_ && decile == last_decile_ && p.tensors_done != p.tensors_total) return;
    last_decile_ = decile;
    // The rate so far and the time left at it (quantizing is slower than copying).
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double rate = seconds > 0 ? mib(p.bytes_done) / seconds : 0.0;
    const double eta = rate > 0 ? (mib(p.bytes_total) - mib(p.bytes_done)) / rate : 0.0;
    std::fprintf(stderr, "%s[%zu/%zu tensors] %5.1f%%  %.1f / %.1f MiB  %.1f MiB/s  ETA %.0f s%s",
                 interactive_ ? "\r" : "", p.tensors_done, p.tensors_total, percent,
                 mib(p.bytes_done), mib(p.bytes_total), rate, eta, interactive_ ? "" : "\n");
    line_open_ = interactive_;
  }

  // Ends a redrawn line so the next message starts on its own.
  void finish() {
    if (line_open_) std::fputc('\n', stderr);
    line_open_ = false;
  }

 private:
  bool interactive_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  bool line_open_ = false;
  int last_decile_ = -1;
};

}  // namespace

int main(int argc, char** argv) {
  if (kuiper::start_program(argc, argv, kUsage)) return 0;
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (argc > 1) return fail(std::string("unexpected argument '") + argv[1] + "'\nusage: " + kUsage);
  if (FLAGS_hf.empty() || FLAGS_out.empty()) {
    return fail(std::string("--hf and --out are required\nusage: ") + kUsage);
  }
  std::optional<kuiper::DataType> dtype;
  if (!FLAGS_dtype.empty()) {
    if (FLAGS_dtype == "fp32") dtype = kuiper::DataType::kFp32;
    else if (FLAGS_dtype == "fp16") dtype = kuiper::DataType::kFp16;
    else if (FLAGS_dtype == "bf16") dtype = kuiper::DataType::kBf16;
    else return fail("--dtype '" + FLAGS_dtype + "' is not one of fp32, fp16, bf16");
  }

  int64_t block = FLAGS_group;
  if (FLAGS_quantize == "fp8" || (FLAGS_quantize.empty() && FLAGS_quantize_lm_head == "fp8")) {
    if (FLAGS_fp8_block == "channel") {
      block = 0;
    } else {
      try {
        block = std::stoll(FLAGS_fp8_block);
      } catch (const std::exception&) {
        return fail("--fp8-block '" + FLAGS_fp8_block + "' is not a number or 'channel'");
      }
    }
  }
  kuiper::Result<kuiper::QuantizeSpec> quantize =
      kuiper::parse_quantize_spec(FLAGS_quantize, block, FLAGS_quantize_lm_head);
  if (!quantize.ok()) return fail("--quantize: " + quantize.status().message());

  std::fprintf(stderr, "kuiper-convert: %s -> %s%s\n", FLAGS_hf.c_str(), FLAGS_out.c_str(),
               quantize->quantized() ? (" (" + quantize->describe() + ")").c_str() : "");
  const auto start = std::chrono::steady_clock::now();
  ProgressPrinter printer;
  kuiper::Status status = kuiper::convert_checkpoint(
      FLAGS_hf, FLAGS_out, dtype, [&printer](const kuiper::ConvertProgress& p) { printer(p); },
      *quantize);
  printer.finish();
  if (!status.ok()) return fail(status.message());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // Reading the result back checks it the way every later load will.
  kuiper::Result<std::shared_ptr<kuiper::ModelFile>> model = kuiper::ModelFile::open(FLAGS_out);
  if (!model.ok()) {
    std::remove(FLAGS_out.c_str());
    return fail("the written file does not read back: " + model.status().message());
  }
  std::map<std::string, size_t> per_dtype;
  uint64_t tensor_bytes = 0;
  for (const kuiper::TensorEntry& e : (*model)->tensors()) {
    ++per_dtype[kuiper::dtype_name(e.dtype)];
    tensor_bytes += e.nbytes;
  }
  std::string dtypes;
  for (const auto& [name, count] : per_dtype) {
    dtypes += (dtypes.empty() ? "" : ", ") + std::to_string(count) + " " + name;
  }
  const kuiper::ModelConfig& c = (*model)->config();
  std::fprintf(stderr,
               "kuiper-convert: wrote %s: %s, %lld layers, hidden %lld, vocab %lld; %zu tensors "
               "(%s), %.1f MiB of weights in %.1f s\n",
               FLAGS_out.c_str(), kuiper::architecture_name(c.arch),
               static_cast<long long>(c.num_layers), static_cast<long long>(c.hidden_size),
               static_cast<long long>(c.vocab_size), (*model)->tensors().size(), dtypes.c_str(),
               mib(tensor_bytes), seconds);
  return 0;
}
