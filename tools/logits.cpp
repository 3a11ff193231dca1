// kuiper-logits: runs a prompt of token ids through a model and writes the last position's
// logits as raw little-endian float32, for comparing against other implementations. For a
// vision-language model, --image (repeatable) gives the images whose <|image_pad|> runs the ids
// hold, one run of the image's merged token count per image, in order.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "kuiper/model/model.h"
#include "kuiper/runtime/vision_input.h"
#include "tools/program_flags.h"

DEFINE_string(model, "", "Kuiper model file (.bin)");
DEFINE_string(tokens, "", "comma-separated token ids, e.g. 151644,872,198");
DEFINE_string(device, "cpu", "cpu or cuda");
DEFINE_string(attention, "flash2", "mha, flash1 or flash2");
DEFINE_string(dtype, "auto",
              "activation dtype: auto (the dtype the checkpoint is stored in on cuda, fp32 on "
              "cpu), bf16, fp16 or fp32");
DEFINE_bool(cuda_graph, true,
            "--decode: decode through a captured CUDA graph (default: on with --device cuda; "
            "--no-cuda-graph decodes eagerly)");
DEFINE_bool(fp8_activations, false,
            "FP8 weights multiply activations rounded to FP8 (W8A8: a scale per row and 128 "
            "columns, as transformers, vLLM and SGLang run FP8 checkpoints); off: the product "
            "with the dequantized weights");
DEFINE_string(out, "", "file for the logits (raw float32, vocab_size values)");
DEFINE_bool(decode, false,
            "feed the tokens one at a time through the decode path (with --image: those after "
            "the last image)");
DEFINE_string(image, "",
              "vision-language models: an image file (PNG or JPEG) for the next run of image pad "
              "tokens in --tokens; repeat the flag for several");

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

// The arguments for gflags, every flag in its spelling (gflags_spelling: --no-cuda-graph), and
// every --image taken out into `images` (gflags keeps only the last value of a repeated flag).
Result<std::vector<std::string>> rewrite_args(int argc, char** argv,
                                              std::vector<std::string>* images) {
  std::vector<std::string> out = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = kuiper::gflags_spelling(argv[i]);
    if (arg == "--") {
      while (i < argc) out.push_back(argv[i++]);
      break;
    }
    const bool eq = arg.rfind("--image=", 0) == 0;
    if (eq || arg == "--image") {
      if (!eq && i + 1 >= argc) return Status::Error("--image needs a file");
      const std::string path = eq ? arg.substr(arg.find('=') + 1) : std::string(argv[++i]);
      if (path.empty()) return Status::Error("--image needs a file");
      images->push_back(path);
      continue;
    }
    out.push_back(arg);
  }
  return out;
}

// The images' pixel values, after checking the ids hold their image pads.
Result<std::vector<kuiper::ProcessedImage>> load_images(const std::vector<std::string>& paths,
                                                        const std::vector<int32_t>& ids) {
  KUIPER_ASSIGN_OR_RETURN(std::shared_ptr<kuiper::ModelFile> file,
                          kuiper::ModelFile::open(FLAGS_model));
  if (!file->config().vision.has_value()) {
    if (paths.empty()) return std::vector<kuiper::ProcessedImage>();
    return Status::Error("--image: " + FLAGS_model + " is a " +
                         kuiper::architecture_name(file->config().arch) +
                         " model: it takes no images");
  }
  KUIPER_ASSIGN_OR_RETURN(kuiper::ImageInput input, kuiper::ImageInput::from_model_file(*file));
  std::vector<kuiper::ProcessedImage> images;
  for (const std::string& path : paths) {
    KUIPER_ASSIGN_OR_RETURN(kuiper::PromptImage image, input.load(path));
    images.push_back(std::move(image.pixels));
  }
  const kuiper::Status pads = kuiper::check_image_pads(
      ids, input.image_pad_id(), kuiper::image_tokens(file->config(), images));
  if (!pads.ok()) return pads.With("--tokens");
  return images;
}

Status run(const std::vector<std::string>& image_paths) {
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
  KUIPER_RETURN_IF_ERROR(kuiper::set_model_flags(
      FLAGS_dtype, FLAGS_cuda_graph, !gflags::GetCommandLineFlagInfoOrDie("cuda_graph").is_default,
      &options));
  options.fp8_activations = FLAGS_fp8_activations;
  options.max_context = static_cast<int64_t>(ids.size());
  KUIPER_ASSIGN_OR_RETURN(std::vector<kuiper::ProcessedImage> images,
                          load_images(image_paths, ids));

  KUIPER_ASSIGN_OR_RETURN(std::unique_ptr<kuiper::Model> model,
                          kuiper::Model::load(FLAGS_model, options));
  // One span of the sequence in KV blocks 0, 1, 2, ..., the last row's logits wanted.
  const std::vector<int32_t> blocks = model->first_blocks(static_cast<int64_t>(ids.size()));
  auto span_input = [&blocks](const std::vector<int32_t>& tokens, int64_t start) {
    kuiper::SequenceInput s;
    s.tokens = tokens;
    s.start = start;
    s.blocks = blocks;
    return s;
  };
  kuiper::Tensor logits;
  size_t prefilled = 0;  // tokens run in one prefill before the decode steps
  int64_t rope_offset = 0;  // the rotary shift the images leave for the tokens after them
  if (!images.empty()) {
    // Everything through the last image runs as one prefill, which the images need.
    const auto runs =
        kuiper::image_pad_runs(ids, static_cast<int32_t>(model->config().image_token_id));
    prefilled = FLAGS_decode ? runs.back().second : ids.size();
    const std::vector<int32_t> head(ids.begin(),
                                    ids.begin() + static_cast<std::ptrdiff_t>(prefilled));
    KUIPER_ASSIGN_OR_RETURN(kuiper::ImageSpan span,
                            kuiper::encode_image_span(*model, head, 0, images));
    kuiper::SequenceInput prompt = span_input(head, 0);
    prompt.rope_positions = span.index.positions;
    prompt.image = &span.features;
    KUIPER_ASSIGN_OR_RETURN(logits, model->forward(kuiper::Span<const kuiper::SequenceInput>(&prompt, 1)));
    rope_offset = span.index.delta;
  } else if (!FLAGS_decode) {
    prefilled = ids.size();
    KUIPER_ASSIGN_OR_RETURN(logits, model->forward(ids, 0, false));
  }
  for (size_t i = prefilled; i < ids.size(); ++i) {
    const std::vector<int32_t> token = {ids[i]};
    kuiper::SequenceInput step = span_input(token, static_cast<int64_t>(i));
    step.rope_offset = rope_offset;
    KUIPER_ASSIGN_OR_RETURN(logits, model->forward(kuiper::Span<const kuiper::SequenceInput>(&step, 1)));
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
  if (kuiper::start_program(
          argc, argv,
          "kuiper-logits --model M.bin --tokens 1,2,3 --out logits.f32 [--device cpu|cuda] "
          "[--attention mha|flash1|flash2] [--dtype auto|bf16|fp16|fp32] [--decode] "
          "[--no-cuda-graph] [--image a.png ...]")) {
    return 0;
  }
  std::vector<std::string> images;
  Result<std::vector<std::string>> args = rewrite_args(argc, argv, &images);
  Status status = args.status();
  if (status.ok()) {
    std::vector<char*> arg_ptrs;
    for (std::string& a : *args) arg_ptrs.push_back(a.data());
    int parsed_argc = static_cast<int>(arg_ptrs.size());
    char** parsed_argv = arg_ptrs.data();
    gflags::ParseCommandLineFlags(&parsed_argc, &parsed_argv, true);
    status = run(images);
  }
  if (!status.ok()) {
    std::fprintf(stderr, "kuiper-logits: %s\n", status.message().c_str());
    return 1;
  }
  return 0;
}
