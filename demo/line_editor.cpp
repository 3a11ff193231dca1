#include "demo/line_editor.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <clocale>
#include <cstdio>
#include <cwchar>

#include <histedit.h>

namespace kuiper::demo {

LineEditor::LineEditor(const char* program, std::atomic<bool>* interrupted)
    : interrupted_(interrupted) {
  // libedit decodes input by the locale's character type; in "C" a multi-byte character would
  // be edited as several.
  std::setlocale(LC_CTYPE, "");
  el_ = el_init(program, stdin, stdout, stderr);
  history_ = history_init();
  HistEvent event;
  ::history(history_, &event, H_SETSIZE, 1000);
  ::history(history_, &event, H_SETUNIQUE, 1);
  el_set(el_, EL_CLIENTDATA, this);
  el_set(el_, EL_PROMPT, &LineEditor::prompt_callback);
  el_set(el_, EL_EDITOR, "emacs");
  el_set(el_, EL_HIST, ::history, history_);
  el_set(el_, EL_GETCFN, &LineEditor::read_char);
  // ~/.editrc key bindings, as every libedit program reads them.
  el_source(el_, nullptr);
}

LineEditor::~LineEditor() {
  el_end(el_);
  history_end(history_);
}

char* LineEditor::prompt_callback(editline* el) {
  void* self = nullptr;
  el_get(el, EL_CLIENTDATA, &self);
  return const_cast<char*>(static_cast<LineEditor*>(self)->prompt_.c_str());
}

// libedit's own reader blocks in read(2), and a Ctrl-C that lands before that read starts (while
// the prompt is being drawn) interrupts nothing: it would wait for Enter and then throw the line
// away. This reader waits in short poll() slices and looks at the flag between them, so a
// Ctrl-C is seen whenever it comes. Bytes become characters by the locale, as libedit's do.
int LineEditor::read_char(editline* el, wchar_t* out) {
  void* self = nullptr;
  el_get(el, EL_CLIENTDATA, &self);
  const std::atomic<bool>& interrupted = *static_cast<LineEditor*>(self)->interrupted_;
  std::mbstate_t state{};
  for (;;) {
    if (interrupted.load()) {
      errno = EINTR;
      return -1;
    }
    pollfd input = {STDIN_FILENO, POLLIN, 0};
    const int ready = ::poll(&input, 1, 100);
    if (ready < 0 && errno != EINTR) return -1;
    if (ready <= 0) continue;
    char byte = 0;
    const ssize_t n = ::read(STDIN_FILENO, &byte, 1);
    if (n == 0) return 0;  // end of input
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    const size_t used = std::mbrtowc(out, &byte, 1, &state);
    if (used == static_cast<size_t>(-2)) continue;  // inside a multi-byte character
    if (used == static_cast<size_t>(-1)) {         // not a character: never pass it on raw
      state = std::mbstate_t{};
      *out = L'\uFFFD';
    }
    return 1;
  }
}

LineEditor::Event LineEditor::read(const std::string& prompt, std::string* line) {
  prompt_ = prompt;
  int count = 0;
  const char* text = el_gets(el_, &count);
  // Ctrl-C interrupts the terminal read (the SIGINT handler is installed without SA_RESTART),
  // which el_gets reports as a failed read.
  if (interrupted_->exchange(false)) {
    el_reset(el_);
    std::fputc('\n', stdout);
    return Event::kInterrupted;
  }
  if (text == nullptr || count <= 0) return Event::kEnd;
  line->assign(text, static_cast<size_t>(count));
  if (!line->empty() && line->back() == '\n') line->pop_back();
  return Event::kLine;
}

void LineEditor::add_history(const std::string& entry) {
  HistEvent event;
  ::history(history_, &event, H_ENTER, entry.c_str());
}

}  // namespace kuiper::demo
