// kuiper-logits: runs a prompt of token ids through a model and writes the last position's
// logits as raw little-endian float32, for comparing against other implementations.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gflags/gflags.h>

#include "kuiper/model/model.h"

DEFINE_string(model, "", "Kuiper model file (.bin)");
DEFINE_string(tokens, "", "comma-separated token ids, e.g. 151644,872,198");
DEFINE_string(device, "cpu", "cpu or cuda");
DEFINE_string(attention, "flash2", "mha, flash1 or flash2");
DEFINE_string(dtype, "", "activation dtype: fp32 or fp16 (default: fp32 on cpu, fp16 on cuda)");
DEFINE_string(out, "", "file for the logits (raw float32, vocab_size values)");
DEFINE_bool(decode, false, "feed the tokens one at a time through the decode path");

namespace {

using kuiper::Result;
using kuiper::Status;

Result<std::vector<int32_t>> parse_tokens(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      long v = std::stol(item, &used);
      if (used != item.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(item);
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      return Status::Error("--tokens: '" + item + "' is not a token id");
    }
  }
  if (ids.empty()) return Status::Error("--tokens: no token ids given");
  return ids;
}

Status run() {
  if (FLAGS_model.empty()) return Status::Error("--model is required");
  if (FLAGS_out.empty()) return Status::Error("--out is required");
  KUIPER_ASSIGN_OR_RETURN(std::vector<int32_t> ids, parse_tokens(FLAGS_tokens));
  kuiper::ModelOptions options;
  Result<kuiper::DeviceType> device = kuiper::parse_device(FLAGS_device);
  if (!device.ok()) return device.status().With("--device");
  options.device = *device;
  Result<kuiper::AttentionKind> attention = kuiper::parse_attention(FLAGS_attention);
  if (!attention.ok()) return attention.status().With("--attention");
  options.attention = *attention;
  std::string dtype = FLAGS_dtype.empty()
                          ? (options.device == kuiper::DeviceType::kCpu ? "fp32" : "fp16")
                          : FLAGS_dtype;
  Result<kuiper::DataType> act = kuiper::parse_dtype(dtype);
  if (!act.ok()) return act.status().With("--dtype");
  options.activation = *act;
  options.max_context = static_cast<int64_t>(ids.size());

  KUIPER_ASSIGN_OR_RETURN(std::unique_ptr<kuiper::Model> model,
                          kuiper::Model::load(FLAGS_model, options));
  kuiper::Tensor logits;
  if (FLAGS_decode) {
    for (size_t i = 0; i < ids.size(); ++i) {
      KUIPER_ASSIGN_OR_RETURN(logits, model->forward({ids[i]}, static_cast<int64_t>(i), false));
    }
  } else {
    KUIPER_ASSIGN_OR_RETURN(logits, model->forward(ids, 0, false));
  }
  KUIPER_ASSIGN_OR_RETURN(kuiper::Tensor host, logits.to(kuiper::DeviceType::kCpu));

  std::ofstream out(FLAGS_out, std::ios::binary);
  out.write(static_cast<const char*>(host.raw()), static_cast<std::streamsize>(host.nbytes()));
  if (!out) return Status::Error("cannot write " + FLAGS_out);
  const float* v = host.data<float>();
  int64_t best = 0;
  for (int64_t i = 1; i < host.numel(); ++i) {
    if (v[i] > v[best]) best = i;
  }
  std::printf("argmax %lld (logit %.6f), %lld logits written to %s\n",
              static_cast<long long>(best), v[best], static_cast<long long>(host.numel()),
              FLAGS_out.c_str());
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "kuiper-logits --model M.bin --tokens 1,2,3 --out logits.f32 [--device cpu|cuda] "
      "[--attention mha|flash1|flash2] [--decode]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  Status status = run();
  if (!status.ok()) {
    std::fprintf(stderr, "kuiper-logits: %s\n", status.message().c_str());
    return 1;
  }
  return 0;
}
