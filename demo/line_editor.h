// Reads lines from the terminal with libedit: emacs-style editing, in-session history, and
// Ctrl-C clearing the line instead of ending the program. Works on a pipe too (no editing).
#pragma once

#include <atomic>
#include <string>

struct editline;
struct history;

namespace kuiper::demo {

class LineEditor {
 public:
  // `interrupted` is raised by the program's SIGINT handler; read() lowers it when it has
  // handled a Ctrl-C at the prompt.
  LineEditor(const char* program, std::atomic<bool>* interrupted);
  ~LineEditor();
  LineEditor(const LineEditor&) = delete;
  LineEditor& operator=(const LineEditor&) = delete;

  enum class Event { kLine, kInterrupted, kEnd };
  // Shows `prompt` and reads one line (without its newline) into *line. kInterrupted: Ctrl-C
  // cleared the line; kEnd: Ctrl-D on an empty line or the end of input.
  Event read(const std::string& prompt, std::string* line);
  // Whether the last line read held bytes that are not UTF-8 (each shown and kept as U+FFFD).
  bool not_utf8() const { return not_utf8_; }
  void add_history(const std::string& entry);

 private:
  static char* prompt_callback(editline* el);
  static int read_char(editline* el, wchar_t* out);

  editline* el_ = nullptr;
  history* history_ = nullptr;
  std::atomic<bool>* interrupted_;
  std::string prompt_;
  // The terminal opened again, non-blocking, for read_char (stdin itself when it is no
  // terminal); input_owned_: ours to close.
  int input_ = 0;
  bool input_owned_ = false;
  bool not_utf8_ = false;
  int held_ = -1;  // a byte read_char gives again (it cut a character short), or -1
};

}  // namespace kuiper::demo
