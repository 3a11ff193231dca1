// Continuous batching: which tokens of which sequences the next forward runs.
//
// Sequences wait in arrival order and are admitted while the step has room: at most max_batch
// sequences run at once, a step carries at most max_batch_tokens tokens, and an admitted
// sequence starts with the longest prefix the cache holds (never its last token, whose logits it
// needs). Each step takes, in this order: one token of every running sequence that is decoding,
// a chunk of every running sequence still prefilling (as much as the budget leaves), then newly
// admitted sequences' first chunks. A sequence leaves as soon as it is removed, its blocks going
// back at once.
//
// When a sequence needs a block and none is free, the newest running sequence is preempted: its
// blocks go back (into the cache, where its prefix may still be found) and it waits again at the
// front of the queue, to be recomputed from its tokens later. Its tokens and its sampler's state
// are kept, so the result is the same as without preemption.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "kuiper/runtime/block_pool.h"
#include "kuiper/runtime/sequence.h"

namespace kuiper {

struct SchedulerOptions {
  int64_t max_batch = 8;            // sequences running at once; at least 1
  int64_t max_batch_tokens = 2048;  // tokens one step runs; at least 1
};

// One entry of a step: tokens [start, start + count) of `sequence`, at cache positions
// [start, start + count) (start is where its cache ends).
struct ScheduledSpan {
  Sequence* sequence = nullptr;
  int64_t start = 0;
  int64_t count = 0;
  // The span reaches the sequence's last token: its logits give the next token.
  bool samples() const { return start + count == sequence->size(); }
};

struct SchedulerStats {
  int64_t admitted_tokens = 0;  // tokens of sequences at their admissions
  int64_t cached_tokens = 0;    // of those, found in the prefix cache (not run again)
  int64_t preemptions = 0;
  // cached_tokens / admitted_tokens; 0 before any admission.
  double cached_fraction() const;
};

class Scheduler {
 public:
  // `pool` must outlive the scheduler; options as SchedulerOptions says.
  Scheduler(BlockPool& pool, const SchedulerOptions& options);

  // Queues a sequence (tokens and keys set, nothing computed, no blocks) behind the others. It
  // must stay where it is until removed.
  void add(Sequence* sequence);
  // Takes a sequence out, waiting or running: its blocks go back to the pool, its full blocks
  // and its last partly filled one into the prefix cache.
  void remove(Sequence* sequence);

  // The next step's spans: decoding sequences, then prefill chunks, then admissions, under the
  // limits. Empty when nothing waits or runs.
  std::vector<ScheduledSpan> schedule();
  // `span`, of the last schedule(), ran: its tokens' keys and values are in the blocks.
  void completed(const ScheduledSpan& span);

  size_t waiting() const { return waiting_.size(); }
  size_t running() const { return running_.size(); }
  bool idle() const { return waiting_.empty() && running_.empty(); }
  const SchedulerStats& stats() const { return stats_; }
  const SchedulerOptions& options() const { return options_; }

 private:
  // Gives `sequence`'s blocks back and queues it at the front.
  void preempt(Sequence* sequence);

  BlockPool& pool_;
  SchedulerOptions options_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // in admission order: the newest last
  SchedulerStats stats_;
};

}  // namespace kuiper
