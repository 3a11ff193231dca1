#include "demo/batch_mode.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <unordered_map>

#include "demo/prompts_file.h"
#include "demo/result_record.h"
#include "kuiper/runtime/chat_session.h"

namespace kuiper::demo {

namespace {

// The prompt ids of a request (image pads expanded) and its images' pixel values.
Status prepare(const BatchRequest& request, const Engine& engine,
               const ChatTemplate& chat_template, const ChatOptions& chat_options,
               const ImageInput* vision, std::vector<int32_t>* ids,
               std::vector<ProcessedImage>* images) {
  const ModelConfig& config = engine.model().config();
  if (!request.images.empty() && vision == nullptr) {
    return Status::Error(std::string("\"images\": a ") + architecture_name(config.arch) +
                         " model takes no images");
  }
  for (const std::string& path : request.images) {
    KUIPER_ASSIGN_OR_RETURN(PromptImage image, vision->load(path));
    images->push_back(std::move(image.pixels));
  }
  KUIPER_ASSIGN_OR_RETURN(*ids, encode_chat(chat_template, engine.tokenizer(), request.messages,
                                            chat_options));
  if (vision != nullptr) {
    KUIPER_ASSIGN_OR_RETURN(*ids, expand_image_pads(*ids, vision->image_pad_id(),
                                                    image_tokens(config, *images)));
  }
  return Status::Ok();
}

// "1:02:03", "2:03" or "3s".
std::string duration_text(double seconds) {
  const long long s = static_cast<long long>(seconds + 0.5);
  char text[32];
  if (s >= 3600) {
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  } else if (s >= 60) {
    std::snprintf(text, sizeof text, "%lld:%02lld", s / 60, s % 60);
  } else {
    std::snprintf(text, sizeof text, "%llds", s);
  }
  return text;
}

}  // namespace

int run_batch(Engine& engine, const ChatTemplate& chat_template, const ChatOptions& chat_options,
              const InferOptions& options, const ImageInput* vision, const char* program) {
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

  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const size_t total = lines->size();
  // Each line's record once it is known; written as soon as every line before it is.
  std::vector<std::optional<std::string>> records(total);
  size_t written = 0, next = 0, finished = 0, failed = 0;
  int64_t generated = 0;
  std::unordered_map<int64_t, size_t> running;  // engine request id -> line index
  auto write_ready = [&] {
    for (; written < total && records[written]; ++written) {
      out << *records[written];
      records[written].reset();
    }
    out.flush();
  };
  auto progress = [&](size_t i, const std::string& what) {
    ++finished;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    const double eta =
        elapsed * static_cast<double>(total - finished) / static_cast<double>(finished);
    std::fprintf(stderr, "[%zu/%zu] line %lld: %s | %.1f tok/s, ETA %s\n", finished, total,
                 static_cast<long long>((*lines)[i].line), what.c_str(),
                 elapsed > 0.0 ? static_cast<double>(generated) / elapsed : 0.0,
                 duration_text(eta).c_str());
  };
  auto fail = [&](size_t i, const nlohmann::ordered_json& id, const Status& status) {
    ++failed;
    std::fprintf(stderr, "%s: %s:%lld: %s\n", program, options.prompts_file.c_str(),
                 static_cast<long long>((*lines)[i].line), status.message().c_str());
    records[i] = jsonl_line(error_record(id, (*lines)[i].line, status.message()));
    progress(i, "failed");
  };

  // Lines join the engine's queue while it holds fewer than two batches, so there is always a
  // next request to admit but the file is not read into memory all at once (images included).
  const size_t queue = 2 * static_cast<size_t>(options.max_batch);
  while (next < total || engine.unfinished() > 0) {
    while (next < total && engine.unfinished() < queue) {
      const size_t i = next++;
      const PromptLine& line = (*lines)[i];
      if (!line.request.ok()) {
        fail(i, line.line, line.request.status());
        continue;
      }
      const BatchRequest& request = *line.request;
      std::vector<int32_t> ids;
      std::vector<ProcessedImage> images;
      Status status = prepare(request, engine, chat_template, chat_options, vision, &ids, &images);
      if (status.ok()) {
        Result<int64_t> id =
            engine.add_request(std::move(ids), std::move(images), request.generation);
        if (id.ok()) {
          running[*id] = i;
          continue;
        }
        status = id.status();
      }
      fail(i, request.id, status);
    }
    write_ready();
    if (engine.unfinished() == 0) continue;
    Result<std::vector<FinishedRequest>> step = engine.step();
    if (!step.ok()) {
      std::fprintf(stderr, "%s: %s\n", program, step.status().message().c_str());
      return 1;
    }
    for (FinishedRequest& f : *step) {
      const size_t i = running.at(f.id);
      running.erase(f.id);
      const BatchRequest& request = *(*lines)[i].request;
      if (!f.generation.ok()) {
        fail(i, request.id, f.generation.status());
        continue;
      }
      const Generation& g = *f.generation;
      generated += g.stats.generated_tokens;
      records[i] = jsonl_line(result_record(request.id, request.echo, g,
                                            request.generation.sampling.seed));
      progress(i, std::to_string(g.stats.generated_tokens) + " tokens, " +
                      finish_reason_name(g.finish));
      if (options.stats) std::fprintf(stderr, "%s\n", g.stats.summary().c_str());
    }
    write_ready();
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  std::fprintf(stderr,
               "%s: %zu of %zu prompts done, %zu failed; %lld tokens generated in %.2f s "
               "(%.1f tok/s), %.0f%% of prompt tokens from the prefix cache\n",
               program, total - failed, total, failed, static_cast<long long>(generated), elapsed,
               elapsed > 0.0 ? static_cast<double>(generated) / elapsed : 0.0,
               100.0 * engine.stats().cached_fraction());
  if (!out) {
    std::fprintf(stderr, "%s: writing the results failed\n", program);
    return 1;
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace kuiper::demo
