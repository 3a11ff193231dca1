#include "demo/repl.h"

#include <csignal>
#include <cstdio>
#include <optional>

#include "demo/line_editor.h"

namespace kuiper::demo {

namespace {

// Raised by Ctrl-C. During a reply the generator reads it before every token; at the prompt
// the line editor takes it as "clear the line".
std::atomic<bool> g_interrupted{false};

extern "C" void on_sigint(int) { g_interrupted.store(true); }

void install_sigint_handler() {
  struct sigaction action = {};
  action.sa_handler = on_sigint;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART: a Ctrl-C must end the terminal read at the prompt
  sigaction(SIGINT, &action, nullptr);
}

constexpr const char* kHelp =
    "Type a message and press Enter. End a line with \\ to continue it on the next line, or\n"
    "put \"\"\" on a line of its own to start and end a block of several lines.\n"
    "Ctrl-C stops a reply (or clears the line), Ctrl-D quits.\n"
    "  /clear        start a new conversation\n"
    "  /stats        statistics of the last reply\n"
    "  /system TEXT  set the system prompt (and start a new conversation); /system alone "
    "removes it\n"
    "  /help         this text\n"
    "  /quit         leave (also /exit)\n";
constexpr const char* kImageHelp =
    "  /image PATH   show an image (PNG or JPEG) with your next message; repeat for several,\n"
    "                /image alone drops them\n";

std::string trim(const std::string& s) {
  const size_t begin = s.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t") + 1 - begin);
}

// One message from the user, which may span several lines; nullopt at the end of input. A
// message with a line that is not UTF-8 is not sent: it goes to the history (its bad bytes as
// U+FFFD) and the user is told, so that Up brings it back to edit.
std::optional<std::string> read_message(LineEditor& editor, const char* program) {
  std::string message;
  bool in_block = false;
  bool continued = false;
  while (true) {
    std::string line;
    const LineEditor::Event event = editor.read(in_block || continued ? "... " : "> ", &line);
    if (event == LineEditor::Event::kEnd) {
      if (!message.empty()) return message;  // the end of a piped file ends the last message
      return std::nullopt;
    }
    if (event == LineEditor::Event::kInterrupted) {
      message.clear();
      in_block = continued = false;
      continue;
    }
    if (editor.not_utf8()) {
      editor.add_history(message.empty() ? line : message + "\n" + line);
      std::fprintf(stderr,
                   "%s: that line held bytes that are not UTF-8 (shown as U+FFFD); the message "
                   "was not sent (Up brings it back)\n",
                   program);
      message.clear();
      in_block = continued = false;
      continue;
    }
    if (line == "\"\"\"") {
      if (in_block) {
        editor.add_history(message);
        return message;
      }
      in_block = true;
      continue;
    }
    if (in_block) {
      message += message.empty() && !continued ? line : "\n" + line;
      continued = true;
      continue;
    }
    if (!line.empty() && line.back() == '\\') {
      line.pop_back();
      message += continued ? "\n" + line : line;
      continued = true;
      continue;
    }
    message += continued ? "\n" + line : line;
    if (message.empty()) continue;
    editor.add_history(message);
    return message;
  }
}

}  // namespace

int run_repl(ChatSession& session, const InferOptions& options, const ImageInput* vision,
             std::vector<PromptImage> images, const char* program) {
  install_sigint_handler();
  LineEditor editor(program, &g_interrupted);
  std::fprintf(stderr, "%s: chatting; /help for commands, Ctrl-D to quit\n", program);
  std::optional<GenerationStats> last_stats;

  // The images of the next message: kept until a message is answered, so a failed turn can be
  // sent again with them.
  std::vector<PromptImage> pending = std::move(images);
  auto reply = [&](const std::string& text) {
    g_interrupted.store(false);
    Result<Generation> result = session.send(
        text, pixels_of(pending), options.generation,
        [](const std::string& piece) {
          std::fwrite(piece.data(), 1, piece.size(), stdout);
          std::fflush(stdout);
        },
        &g_interrupted);
    g_interrupted.store(false);
    if (!result.ok()) {
      std::fprintf(stderr, "error: %s\n", result.status().message().c_str());
      return;
    }
    pending.clear();
    std::fputc('\n', stdout);
    std::fflush(stdout);
    last_stats = result->stats;
    if (result->finish == FinishReason::kInterrupted) std::fprintf(stderr, "[interrupted]\n");
    if (result->finish == FinishReason::kContextFull) {
      std::fprintf(stderr, "[the context of %lld tokens is full: /clear to start over]\n",
                   static_cast<long long>(session.generator().max_context()));
    }
    if (options.stats) std::fprintf(stderr, "%s\n", result->stats.summary().c_str());
  };

  if (!options.prompt.empty()) reply(options.prompt);
  while (std::optional<std::string> message = read_message(editor, program)) {
    const std::string& m = *message;
    if (m == "/quit" || m == "/exit") break;
    if (m == "/help") {
      std::fputs(kHelp, stderr);
      if (vision != nullptr) std::fputs(kImageHelp, stderr);
    } else if (m == "/clear") {
      session.clear();
      std::fprintf(stderr, "[new conversation%s]\n",
                   pending.empty() ? "" : "; the attached images are dropped");
      pending.clear();
    } else if (m == "/image" || m.rfind("/image ", 0) == 0) {
      const std::string path = trim(m.substr(6));
      if (vision == nullptr) {
        std::fprintf(stderr, "error: this model takes no images\n");
      } else if (path.empty()) {
        std::fputs(pending.empty() ? "usage: /image PATH\n" : "[the attached images are dropped]\n",
                   stderr);
        pending.clear();
      } else if (Result<PromptImage> image = vision->load(path); !image.ok()) {
        std::fprintf(stderr, "error: %s\n", image.status().message().c_str());
      } else {
        const int64_t tokens = vision->tokens(*image);
        pending.push_back(std::move(image).value());
        std::fprintf(stderr, "[%s: %lld image tokens; %zu image%s go%s with your next message]\n",
                     path.c_str(), static_cast<long long>(tokens), pending.size(),
                     pending.size() == 1 ? "" : "s", pending.size() == 1 ? "es" : "");
      }
    } else if (m == "/stats") {
      std::fprintf(stderr, "%s\n", last_stats ? last_stats->summary().c_str() : "no reply yet");
    } else if (m == "/system" || m.rfind("/system ", 0) == 0) {
      session.set_system(m.size() > 8 ? m.substr(8) : "");
      std::fprintf(stderr, "[system prompt %s; new conversation]\n",
                   session.system().empty() ? "removed" : "set");
    } else if (m[0] == '/' && m.find_first_of(" \n") == std::string::npos) {
      std::fprintf(stderr, "unknown command %s (/help lists them)\n", m.c_str());
    } else {
      reply(m);
    }
  }
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace kuiper::demo
