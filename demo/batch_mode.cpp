#include "demo/batch_mode.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>

#include "demo/prompts_file.h"
#include "demo/result_record.h"
#include "kuiper/runtime/chat_session.h"

namespace kuiper::demo {

namespace {

// The prompt ids of a request (image pads expanded) and its images' pixel values.
Status prepare(const BatchRequest& request, const Generator& generator,
               const ChatTemplate& chat_template, const ChatOptions& chat_options,
               const ImageInput* vision, std::vector<int32_t>* ids,
               std::vector<ProcessedImage>* images) {
  const ModelConfig& config = generator.model().config();
  if (!request.images.empty() && vision == nullptr) {
    return Status::Error(std::string("\"images\": a ") + architecture_name(config.arch) +
                         " model takes no images");
  }
  for (const std::string& path : request.images) {
    KUIPER_ASSIGN_OR_RETURN(PromptImage image, vision->load(path));
    images->push_back(std::move(image.pixels));
  }
  KUIPER_ASSIGN_OR_RETURN(*ids, encode_chat(chat_template, generator.tokenizer(),
                                            request.messages, chat_options));
  if (vision != nullptr) {
    KUIPER_ASSIGN_OR_RETURN(*ids, expand_image_pads(*ids, vision->image_pad_id(),
                                                    image_tokens(config, *images)));
  }
  return Status::Ok();
}

}  // namespace

int run_batch(Generator& generator, const ChatTemplate& chat_template,
              const ChatOptions& chat_options, const InferOptions& options,
              const ImageInput* vision, const char* program) {
  Result<std::vector<PromptLine>> lines =
      read_prompts_file(options.prompts_file, options.generation, options.system);
  if (!lines.ok()) {
    std::fprintf(stderr, "%s: %s\n", program, lines.status().message().c_str());
    return 1;
  }
  std::ofstream file;
  if (!options.output_path.empty()) {
    file.open(options.output_path, std::ios::binary | std::ios::trunc);
    if (!file) {
      std::fprintf(stderr, "%s: cannot write %s: %s\n", program, options.output_path.c_str(),
                   std::strerror(errno));
      return 1;
    }
  }
  std::ostream& out = options.output_path.empty() ? std::cout : file;

  const size_t total = lines->size();
  size_t failed = 0;
  for (size_t i = 0; i < total; ++i) {
    const PromptLine& line = (*lines)[i];
    auto fail = [&](const nlohmann::ordered_json& id, const Status& status) {
      ++failed;
      std::fprintf(stderr, "%s: %s:%lld: %s\n", program, options.prompts_file.c_str(),
                   static_cast<long long>(line.line), status.message().c_str());
      out << jsonl_line(error_record(id, line.line, status.message())) << std::flush;
    };
    if (!line.request.ok()) {
      fail(line.line, line.request.status());
      continue;
    }
    const BatchRequest& request = *line.request;
    std::vector<int32_t> ids;
    std::vector<ProcessedImage> images;
    const Status prepared =
        prepare(request, generator, chat_template, chat_options, vision, &ids, &images);
    if (!prepared.ok()) {
      fail(request.id, prepared);
      continue;
    }
    Result<Generation> generation =
        generator.generate_with_images(ids, images, request.generation);
    if (!generation.ok()) {
      fail(request.id, generation.status());
      continue;
    }
    out << jsonl_line(result_record(request.id, request.echo, *generation,
                                    request.generation.sampling.seed))
        << std::flush;
    std::fprintf(stderr, "[%zu/%zu] line %lld: %lld tokens, %s\n", i + 1, total,
                 static_cast<long long>(line.line),
                 static_cast<long long>(generation->stats.generated_tokens),
                 finish_reason_name(generation->finish));
    if (options.stats) std::fprintf(stderr, "%s\n", generation->stats.summary().c_str());
  }
  std::fprintf(stderr, "%s: %zu of %zu prompts done, %zu failed\n", program, total - failed,
               total, failed);
  if (!out) {
    std::fprintf(stderr, "%s: writing the results failed\n", program);
    return 1;
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace kuiper::demo
