#include "demo/line_editor.h"

#include <fcntl.h>
#include <langinfo.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <clocale>
#include <cstdio>
#include <cstring>
#include <cwchar>

#include <histedit.h>

namespace kuiper::demo {

LineEditor::LineEditor(const char* program, std::atomic<bool>* interrupted)
    : interrupted_(interrupted), input_(STDIN_FILENO) {
  // A non-blocking description of our own: O_NONBLOCK on stdin's would be the shell's too.
  if (const char* terminal = ttyname(STDIN_FILENO)) {
    const int fd = ::open(terminal, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd >= 0) {
      input_ = fd;
      input_owned_ = true;
    }
  }
  // libedit decodes input by the locale's character type: in "C" (a container without LANG) a
  // multi-byte character would be edited as several, and a line holding one was dropped. The
  // model reads UTF-8, so the editor does: the environment's locale where it is UTF-8, else
  // C.UTF-8.
  std::setlocale(LC_CTYPE, "");
  if (std::strcmp(nl_langinfo(CODESET), "UTF-8") != 0) std::setlocale(LC_CTYPE, "C.UTF-8");
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
  if (input_owned_) ::close(input_);
}

char* LineEditor::prompt_callback(editline* el) {
  void* self = nullptr;
  el_get(el, EL_CLIENTDATA, &self);
  return const_cast<char*>(static_cast<LineEditor*>(self)->prompt_.c_str());
}

// libedit's own reader blocks in read(2), and a Ctrl-C that lands before that read starts (while
// the prompt is being drawn) interrupts nothing: it would wait for Enter and then throw the line
// away. This reader waits in short poll() slices and looks at the flag between them, so a
// Ctrl-C is seen whenever it comes. Bytes become characters as UTF-8 (the constructor's locale).
// The read is non-blocking (input_): a Ctrl-C flushes the terminal's input queue, and one that
// lands between poll (input ready) and read would leave a blocking read waiting on the emptied
// queue, the interrupt already taken, until the next key (a hung prompt about once in 150
// Ctrl-Cs on a loaded machine, InferRepl.SecondTurnPrefillsOnlyNewTokensAndClearResets).
int LineEditor::read_char(editline* el, wchar_t* out) {
  void* self = nullptr;
  el_get(el, EL_CLIENTDATA, &self);
  LineEditor& editor = *static_cast<LineEditor*>(self);
  const std::atomic<bool>& interrupted = *editor.interrupted_;
  std::mbstate_t state{};
  bool partial = false;  // inside a multi-byte character
  for (;;) {
    char byte = 0;
    if (editor.held_ >= 0) {
      byte = static_cast<char>(editor.held_);
      editor.held_ = -1;
    } else {
      if (interrupted.load()) {
        errno = EINTR;
        return -1;
      }
      pollfd input = {editor.input_, POLLIN, 0};
      const int ready = ::poll(&input, 1, 100);
      if (ready < 0 && errno != EINTR) return -1;
      if (ready <= 0) continue;
      const ssize_t n = ::read(editor.input_, &byte, 1);
      if (n == 0) {  // end of input, after a character cut short if any
        if (!partial) return 0;
        *out = L'\uFFFD';
        editor.not_utf8_ = true;
        return 1;
      }
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
        return -1;
      }
    }
    const size_t used = std::mbrtowc(out, &byte, 1, &state);
    if (used == static_cast<size_t>(-2)) {
      partial = true;
      continue;
    }
    if (used == static_cast<size_t>(-1)) {  // not a character: never pass it on raw
      *out = L'\uFFFD';
      editor.not_utf8_ = true;
      // A byte that cut a character short starts the next one (a newline still ends the line).
      if (partial) editor.held_ = static_cast<unsigned char>(byte);
    }
    return 1;
  }
}

LineEditor::Event LineEditor::read(const std::string& prompt, std::string* line) {
  prompt_ = prompt;
  not_utf8_ = false;
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
