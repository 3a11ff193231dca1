#include "kuiper/runtime/scheduler.h"

#include <algorithm>

namespace kuiper {

double SchedulerStats::cached_fraction() const {
  return admitted_tokens > 0 ? static_cast<double>(cached_tokens) / admitted_tokens : 0.0;
}

Scheduler::Scheduler(BlockPool& pool, const SchedulerOptions& options)
    : pool_(pool), options_(options) {}

void Scheduler::add(Sequence* sequence) {
  sequence->computed = 0;
  sequence->running = false;
  waiting_.push_back(sequence);
}

void Scheduler::remove(Sequence* sequence) {
  if (sequence->running) {
    running_.erase(std::find(running_.begin(), running_.end(), sequence));
  } else {
    const auto it = std::find(waiting_.begin(), waiting_.end(), sequence);
    if (it != waiting_.end()) waiting_.erase(it);
  }
  sequence->blocks.release(pool_, sequence->keys, sequence->computed);
  sequence->computed = 0;
  sequence->running = false;
}

void Scheduler::preempt(Sequence* sequence) {
  running_.erase(std::find(running_.begin(), running_.end(), sequence));
  sequence->blocks.release(pool_, sequence->keys, sequence->computed);
  sequence->computed = 0;
  sequence->running = false;
  waiting_.push_front(sequence);
  ++stats_.preemptions;
}

std::vector<ScheduledSpan> Scheduler::schedule() {
  std::vector<ScheduledSpan> batch;
  int64_t budget = options_.max_batch_tokens;
  const size_t max_batch = static_cast<size_t>(options_.max_batch);

  // Blocks for positions [0, tokens) of `s`, preempting the newest running sequences until they
  // fit. False when `s` itself had to go. A victim never has a span in this step yet: decode
  // tokens are taken oldest first, so every one before `s` is older than `s`; and only the
  // newest running sequence can be part way through its prefill (a sequence is admitted only
  // when the budget outlasted every prefill before it), so a prefill chunk's `s` is the newest.
  auto make_room = [&](Sequence* s, int64_t tokens) {
    while (!s->blocks.reserve(pool_, tokens)) {
      Sequence* victim = running_.back();
      preempt(victim);
      if (victim == s) return false;
    }
    return true;
  };

  // Decode tokens first (one each, so every running sequence keeps moving), then prefill chunks,
  // oldest first.
  const std::vector<Sequence*> order = running_;
  for (const bool decoding : {true, false}) {
    for (Sequence* s : order) {
      if (!s->running || s->remaining() == 0 || (s->remaining() == 1) != decoding) continue;
      if (budget == 0 || batch.size() >= max_batch) break;
      const int64_t n = std::min(s->remaining(), budget);
      if (!make_room(s, s->computed + n)) continue;
      batch.push_back({s, s->computed, n});
      budget -= n;
    }
  }

  // A prompt whose first block a running sequence is still prefilling waits for that prefill:
  // its blocks then come from the prefix cache, rather than the same keys and values being
  // computed twice side by side (a shared system prompt reaching many requests at once).
  auto behind_a_shared_prefill = [&](const Sequence* s) {
    const int64_t bs = pool_.block_size();
    if (s->size() <= bs) return false;
    for (const Sequence* r : running_) {
      if (r->remaining() > 1 && r->size() > bs &&
          std::equal(s->keys.begin(), s->keys.begin() + bs, r->keys.begin())) {
        return true;
      }
    }
    return false;
  };

  // Admissions, first come first served: the queue's head waits until it fits.
  while (!waiting_.empty() && budget > 0 && running_.size() < max_batch) {
    Sequence* s = waiting_.front();
    if (behind_a_shared_prefill(s)) break;
    s->computed = s->blocks.attach_prefix(pool_, s->keys, s->size() - 1);
    const int64_t n = std::min(s->remaining(), budget);
    if (!s->blocks.reserve(pool_, s->computed + n)) {
      s->blocks.release(pool_, s->keys, s->computed);
      s->computed = 0;
      break;
    }
    stats_.admitted_tokens += s->size();
    stats_.cached_tokens += s->computed;
    waiting_.pop_front();
    s->running = true;
    running_.push_back(s);
    batch.push_back({s, s->computed, n});
    budget -= n;
  }
  return batch;
}

void Scheduler::completed(const ScheduledSpan& span) {
  Sequence* s = span.sequence;
  s->computed = span.start + span.count;
  s->blocks.cache_full_blocks(pool_, s->keys, s->computed);
}

}  // namespace kuiper
