#include "kuiper/tokenizer/tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include <utf8proc.h>

#include "kuiper/tokenizer/added_tokens.h"
#include "kuiper/tokenizer/bpe.h"
#include "kuiper/tokenizer/byte_level.h"
#include "kuiper/tokenizer/regex_splitter.h"
#include "kuiper/tokenizer/tokenizer_json.h"
#include "kuiper/tokenizer/utf8.h"

namespace kuiper {

struct Tokenizer::Impl {
  std::vector<std::string> token_text;   // by id
  std::vector<std::string> token_bytes;  // by id
  std::vector<bool> special;             // by id
  std::unordered_map<std::string, int32_t> ids;
  bool nfc;
  AddedTokenMatcher raw_added;         // matched before normalization
  AddedTokenMatcher normalized_added;  // matched after it
  RegexSplitter splitter;
  BpeModel bpe;
};

namespace {

// NFC by utf8proc. Code points below U+0300 are never changed by NFC (the first combining
// mark is U+0300), and their UTF-8 never has a byte >= 0xCC, so such text, most English and
// code, skips the library.
Status normalize_nfc(std::string_view text, std::string* out) {
  bool may_change = false;
  for (char c : text) may_change |= static_cast<uint8_t>(c) >= 0xCC;
  if (!may_change) {
    out->assign(text);
    return Status::Ok();
  }
  utf8proc_uint8_t* normalized = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &normalized,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (length < 0) {
    return Status::Error(std::string("NFC normalization failed: ") + utf8proc_errmsg(length));
  }
  out->assign(reinterpret_cast<const char*>(normalized), static_cast<size_t>(length));
  std::free(normalized);
  return Status::Ok();
}

// Words repeat a lot in real text; one encode call remembers each word's ids so BPE runs once
// per distinct word. The cache lives for one call, so a shared Tokenizer needs no locking.
class WordCache {
 public:
  void encode(const BpeModel& bpe, std::string_view word, std::vector<int32_t>* ids) {
    auto [it, inserted] = spans_.try_emplace(std::string(word));
    if (inserted) {
      const size_t begin = ids_.size();
      bpe.encode_word(word, &ids_);
      it->second = {begin, ids_.size()};
    }
    ids->insert(ids->end(), ids_.begin() + it->second.first, ids_.begin() + it->second.second);
  }

 private:
  std::unordered_map<std::string, std::pair<size_t, size_t>> spans_;  // word -> range of ids_
  std::vector<int32_t> ids_;
};

const std::string& empty_string() {
  static const std::string empty;
  return empty;
}

}  // namespace

Result<Tokenizer> Tokenizer::from_json(const std::string& tokenizer_json_text) {
  KUIPER_ASSIGN_OR_RETURN(TokenizerSpec spec, parse_tokenizer_json(tokenizer_json_text));
  KUIPER_ASSIGN_OR_RETURN(BpeModel bpe, BpeModel::build(spec.vocab, spec.merges));
  KUIPER_ASSIGN_OR_RETURN(
      RegexSplitter splitter,
      RegexSplitter::compile(spec.split_pattern, spec.split_pattern_is_literal));

  int32_t max_id = -1;
  for (const auto& [token, id] : spec.vocab) max_id = std::max(max_id, id);
  for (const AddedToken& token : spec.added_tokens) max_id = std::max(max_id, token.id);
  const size_t size = static_cast<size_t>(max_id) + 1;
  std::vector<std::string> token_text(size);
  std::vector<bool> special(size, false);
  for (const auto& [token, id] : spec.vocab) {
    if (!token_text[id].empty()) {
      return Status::Error("tokens \"" + token_text[id] + "\" and \"" + token +
                           "\" share id " + std::to_string(id));
    }
    token_text[id] = token;
  }
  // Added tokens win where they reuse a vocabulary id, as in Hugging Face.
  std::unordered_map<std::string, int32_t> ids = std::move(spec.vocab);
  std::vector<AddedToken> raw_added, normalized_added;
  for (AddedToken& token : spec.added_tokens) {
    token_text[token.id] = token.content;
    special[token.id] = token.special;
    ids[token.content] = token.id;
    if (!token.normalized) {
      raw_added.push_back(token);
      continue;
    }
    if (spec.nfc) {
      std::string normalized;
      KUIPER_RETURN_IF_ERROR(normalize_nfc(token.content, &normalized));
      token.content = std::move(normalized);
    }
    normalized_added.push_back(token);
  }
  std::vector<std::string> token_bytes(size);
  for (size_t id = 0; id < size; ++id) token_bytes[id] = byte_level::decode(token_text[id]);

  return Tokenizer(std::make_shared<const Impl>(Impl{
      std::move(token_text), std::move(token_bytes), std::move(special), std::move(ids), spec.nfc,
      AddedTokenMatcher(std::move(raw_added)), AddedTokenMatcher(std::move(normalized_added)),
      std::move(splitter), std::move(bpe)}));
}

Result<Tokenizer> Tokenizer::from_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return Status::Error("cannot open " + path + ": " + std::strerror(errno));
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) return Status::Error("cannot read " + path);
  auto tokenizer = from_json(text.str());
  if (!tokenizer.ok()) return tokenizer.status().With(path);
  return tokenizer;
}

Result<std::vector<int32_t>> Tokenizer::encode(const std::string& text) const {
  const size_t bad = utf8::find_invalid(text);
  if (bad != std::string_view::npos) {
    return Status::Error("invalid UTF-8 at byte offset " + std::to_string(bad));
  }
  const Impl& impl = *impl_;
  std::vector<int32_t> ids;
  WordCache cache;
  const auto encode_word = [&](std::string_view word) { cache.encode(impl.bpe, word, &ids); };
  const std::string_view raw = text;
  std::string normalized;
  for (const TextSpan& span : impl.raw_added.split(raw)) {
    if (span.id >= 0) {
      ids.push_back(span.id);
      continue;
    }
    std::string_view plain = raw.substr(span.begin, span.end - span.begin);
    if (impl.nfc) {
      KUIPER_RETURN_IF_ERROR(normalize_nfc(plain, &normalized));
      plain = normalized;
    }
    for (const TextSpan& inner : impl.normalized_added.split(plain)) {
      if (inner.id >= 0) {
        ids.push_back(inner.id);
        continue;
      }
      KUIPER_RETURN_IF_ERROR(
          impl.splitter.split(plain.substr(inner.begin, inner.end - inner.begin), encode_word));
    }
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string bytes;
  for (int32_t id : ids) bytes += token_bytes(id);
  std::string text;
  utf8::append_lossy(bytes, /*at_end=*/true, &text);
  return text;
}

std::optional<int32_t> Tokenizer::token_id(const std::string& token) const {
  const auto it = impl_->ids.find(token);
  if (it == impl_->ids.end()) return std::nullopt;
  return it->second;
}

const std::string& Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return empty_string();
  return impl_->token_text[id];
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return empty_string();
  return impl_->token_bytes[id];
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->token_text.size()); }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special[id];
}

}  // namespace kuiper
