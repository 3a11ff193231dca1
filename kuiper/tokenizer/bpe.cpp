#include "kuiper/tokenizer/bpe.h"

#include <queue>

#include "kuiper/tokenizer/byte_level.h"
#include "kuiper/tokenizer/utf8.h"

namespace kuiper {
namespace {

Result<int32_t> lookup(const std::unordered_map<std::string, int32_t>& vocab,
                       const std::string& token) {
  const auto it = vocab.find(token);
  if (it == vocab.end()) return Status::Error("token \"" + token + "\" is not in the vocab");
  return it->second;
}

// A merge that was possible when queued. Ordered as Hugging Face orders it (lowest rank, then
// leftmost), because ties decide the result: "aaa" must become "aa" + "a", not "a" + "aa".
struct Candidate {
  int32_t rank;
  int32_t pos;     // the left symbol
  int32_t result;  // the merged id, to recognise a candidate made stale by an earlier merge
  bool operator>(const Candidate& other) const {
    return rank != other.rank ? rank > other.rank : pos > other.pos;
  }
};

// One symbol of the word in a doubly linked list, so a merge is O(1) and positions stay put.
struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;  // -1 at either end
  bool merged_away;
};

}  // namespace

Result<BpeModel> BpeModel::build(const std::unordered_map<std::string, int32_t>& vocab,
                                 const std::vector<std::pair<std::string, std::string>>& merges) {
  BpeModel model;
  for (int b = 0; b < 256; ++b) {
    std::string text;
    utf8::append_code_point(byte_level::code_point_of(static_cast<uint8_t>(b)), &text);
    auto id = lookup(vocab, text);
    if (!id.ok()) return id.status().With("the vocab has no token for byte " + std::to_string(b));
    model.byte_ids_[b] = id.value();
  }
  model.merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    auto left_id = lookup(vocab, left);
    auto right_id = lookup(vocab, right);
    auto result_id = lookup(vocab, left + right);
    for (const auto* id : {&left_id, &right_id, &result_id}) {
      if (!id->ok()) {
        return id->status().With("merge " + std::to_string(rank) + " (\"" + left + "\" \"" +
                                 right + "\")");
      }
    }
    model.merges_[pair_key(left_id.value(), right_id.value())] =
        Merge{static_cast<int32_t>(rank), result_id.value()};
  }
  return model;
}

const BpeModel::Merge* BpeModel::find_merge(int32_t left, int32_t right) const {
  const auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::encode_word(std::string_view bytes, std::vector<int32_t>* ids) const {
  const auto n = static_cast<int32_t>(bytes.size());
  std::vector<Symbol> symbols(bytes.size());
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] = Symbol{byte_ids_[static_cast<uint8_t>(bytes[i])], i - 1, i + 1 < n ? i + 1 : -1,
                        false};
    if (i > 0) {
      if (const Merge* m = find_merge(symbols[i - 1].id, symbols[i].id)) {
        queue.push({m->rank, i - 1, m->result});
      }
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.merged_away || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const Merge* current = find_merge(left.id, right.id);
    if (current == nullptr || current->result != top.result) continue;

    left.id = top.result;
    right.merged_away = true;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const Merge* m = find_merge(symbols[left.prev].id, left.id)) {
        queue.push({m->rank, left.prev, m->result});
      }
    }
    if (left.next >= 0) {
      if (const Merge* m = find_merge(left.id, symbols[left.next].id)) {
        queue.push({m->rank, top.pos, m->result});
      }
    }
  }
  for (int32_t i = 0; i >= 0 && i < n; i = symbols[i].next) ids->push_back(symbols[i].id);
}

}  // namespace kuiper
