#include "demo/line_editor.h"

#include <clocale>
#include <cstdio>

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
