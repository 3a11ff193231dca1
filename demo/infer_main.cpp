#include "demo/infer_main.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "demo/batch_mode.h"
#include "demo/infer_options.h"
#include "demo/repl.h"
#include "demo/result_record.h"
#include "kuiper/runtime/chat_session.h"
#include "kuiper/runtime/vision_input.h"
#include "tools/program_flags.h"

namespace kuiper::demo {

namespace {

Result<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error("cannot open " + path + ": " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool is_directory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_file(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string parent_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// The tokenizer.json and tokenizer_config.json texts: from --tokenizer (a file, or a directory
// holding it; a tokenizer_config.json beside it brings its chat template) or the model file.
struct TokenizerTexts {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
};

Result<TokenizerTexts> tokenizer_texts(const InferOptions& options, const ModelFile& file) {
  TokenizerTexts texts;
  if (options.tokenizer_path.empty()) {
    texts.tokenizer_json = file.tokenizer_json();
    if (texts.tokenizer_json.empty()) {
      return Status::Error(file.path() + " holds no tokenizer: give --tokenizer");
    }
  } else {
    const bool dir = is_directory(options.tokenizer_path);
    const std::string json_path =
        dir ? options.tokenizer_path + "/tokenizer.json" : options.tokenizer_path;
    Result<std::string> json_text = read_text_file(json_path);
    if (!json_text.ok()) return json_text.status().With("--tokenizer");
    texts.tokenizer_json = std::move(json_text).value();
    const std::string config_path = parent_dir(json_path) + "/tokenizer_config.json";
    if (is_file(config_path)) {
      KUIPER_ASSIGN_OR_RETURN(texts.tokenizer_config_json, read_text_file(config_path));
    }
  }
  if (texts.tokenizer_config_json.empty()) texts.tokenizer_config_json = file.tokenizer_config_json();
  if (texts.tokenizer_config_json.empty()) {
    return Status::Error(file.path() + " holds no chat template (tokenizer_config.json): give "
                         "--tokenizer with a tokenizer_config.json beside it");
  }
  return texts;
}

// One prompt (with --image, its images): the reply on stdout (streamed with --stream), a JSONL
// record with --output.
// `output` is the --output file, opened before the model is loaded so an unwritable path fails
// at once; null without --output.
Status run_single(Generator& generator, ChatTemplate chat_template, const ChatOptions& chat,
                  const InferOptions& options, const std::vector<PromptImage>& images,
                  std::ofstream* output, const char* program) {
  ChatSession session(generator, std::move(chat_template), chat);
  session.set_system(options.system);
  TextCallback stream;
  if (options.stream) {
    stream = [](const std::string& piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    };
  }
  KUIPER_ASSIGN_OR_RETURN(Generation generation,
                          session.send(options.prompt, pixels_of(images), options.generation,
                                       stream));
  if (!options.stream) std::fwrite(generation.text.data(), 1, generation.text.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (generation.finish == FinishReason::kContextFull) {
    std::fprintf(stderr, "%s: stopped at the end of the context (%lld tokens; --max-context)\n",
                 program, static_cast<long long>(generator.max_context()));
  }
  if (options.stats) std::fprintf(stderr, "%s\n", generation.stats.summary().c_str());
  if (output != nullptr) {
    nlohmann::ordered_json request = {{"prompt", options.prompt}};
    if (!options.images.empty()) request["images"] = options.images;
    *output << jsonl_line(result_record(1, request, generation, options.generation.sampling.seed));
    output->flush();
    if (!*output) {
      return Status::Error("cannot write " + options.output_path + ": " + std::strerror(errno));
    }
  }
  return Status::Ok();
}

// Refuses a --max-context beyond the model's context limit (positions it was never trained or
// scaled for); the default context is cut to that maximum instead.
Status fit_max_context(const ModelConfig& config, InferOptions& options) {
  const int64_t model_max = config.context_limit();
  if (options.model.max_context <= model_max) return Status::Ok();
  if (options.max_context_given) {
    return Status::Error("--max-context " + std::to_string(options.model.max_context) +
                         ": above the model's maximum of " + std::to_string(model_max) +
                         " tokens (max_position_embeddings" +
                         (config.yarn ? std::string(", or YaRN's factor x original") : "") + ")");
  }
  options.model.max_context = model_max;
  return Status::Ok();
}

Status run(int argc, char** argv, Architecture family, const char* program, int* exit_code) {
  KUIPER_ASSIGN_OR_RETURN(InferOptions options, parse_infer_options(argc, argv, family));
  // The family is checked before the weights are loaded: refusing is instant.
  KUIPER_ASSIGN_OR_RETURN(std::shared_ptr<ModelFile> file, ModelFile::open(options.model_path));
  const Architecture arch = file->config().arch;
  if (arch != family) {
    return Status::Error(options.model_path + " is a " + architecture_name(arch) +
                         " model; " + program + " runs " + architecture_name(family) +
                         " models");
  }
  KUIPER_RETURN_IF_ERROR(fit_max_context(file->config(), options));
  std::ofstream output;
  const bool single = !options.interactive && options.prompts_file.empty();
  if (single && !options.output_path.empty()) {
    output.open(options.output_path, std::ios::binary | std::ios::trunc);
    if (!output) {
      return Status::Error("--output: cannot write " + options.output_path + ": " +
                           std::strerror(errno));
    }
  }
  KUIPER_ASSIGN_OR_RETURN(TokenizerTexts texts, tokenizer_texts(options, *file));
  KUIPER_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::from_json(texts.tokenizer_json));
  KUIPER_ASSIGN_OR_RETURN(ChatTemplate chat_template,
                          ChatTemplate::from_tokenizer_config(texts.tokenizer_config_json));
  ChatOptions chat;
  if (options.no_think) chat.extra["enable_thinking"] = false;
  // Images are read before the weights are loaded: a bad one is refused at once.
  std::optional<ImageInput> image_input;
  std::vector<PromptImage> images;
  if (file->config().vision.has_value()) {
    KUIPER_ASSIGN_OR_RETURN(image_input, ImageInput::from_model_file(*file));
    for (const std::string& path : options.images) {
      KUIPER_ASSIGN_OR_RETURN(PromptImage image, image_input->load(path));
      images.push_back(std::move(image));
    }
  } else if (!options.images.empty()) {
    return Status::Error("--image: " + options.model_path + " is a " + architecture_name(arch) +
                         " model: it takes no images");
  }
  const ImageInput* vision = image_input ? &*image_input : nullptr;
  // A batch runs up to --max-batch sequences at once, and by default the KV pool holds that
  // many contexts.
  if (!options.prompts_file.empty()) options.model.max_sequences = options.max_batch;
  KUIPER_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                          Model::load(options.model_path, options.model));
  if (!options.prompts_file.empty()) {
    EngineOptions engine_options;
    engine_options.max_batch = options.max_batch;
    KUIPER_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                            Engine::create(*model, tokenizer, engine_options));
    *exit_code = run_batch(*engine, chat_template, chat, options, vision, program);
    return Status::Ok();
  }
  Generator generator(*model, tokenizer);
  if (options.interactive) {
    ChatSession session(generator, chat_template, chat);
    session.set_system(options.system);
    *exit_code = run_repl(session, options, vision, std::move(images), program);
  } else {
    KUIPER_RETURN_IF_ERROR(run_single(generator, chat_template, chat, options, images,
                                      output.is_open() ? &output : nullptr, program));
    *exit_code = 0;
  }
  return Status::Ok();
}

}  // namespace

int infer_main(int argc, char** argv, Architecture family) {
  const char* slash = std::strrchr(argv[0], '/');
  const std::string program = slash != nullptr ? slash + 1 : argv[0];
  const std::string usage =
      "chat with a " + std::string(architecture_name(family)) + " model:\n  " + program +
      " --model M.bin --prompt \"...\"        answer one prompt\n  " + program +
      " --model M.bin -i                    chat (line editing, /help)\n  " + program +
      " --model M.bin --prompts-file P.jsonl --output R.jsonl   batch\n" +
      (family == Architecture::kQwen3VL
           ? "  " + program + " --model M.bin --image a.png --prompt \"...\"   a prompt with "
             "an image (repeat --image for several; -i: /image PATH)\n"
           : std::string()) +
      "Flags may be written with dashes or underscores (--top-p, --top_p); --no-NAME turns a "
      "flag off (--no-cuda-graph).";
  if (start_program(argc, argv, usage)) return 0;
  int exit_code = 1;
  const Status status = run(argc, argv, family, program.c_str(), &exit_code);
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", program.c_str(), status.message().c_str());
    return 1;
  }
  return exit_code;
}

}  // namespace kuiper::demo
