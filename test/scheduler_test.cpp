// kuiper/runtime's Scheduler on its own (no model): what each step takes, in which order and
// under which limits, and what preemption does when the KV pool runs out.
#include <gtest/gtest.h>

#include <numeric>
#include <tuple>

#include "kuiper/runtime/scheduler.h"

namespace kuiper {
namespace {

Sequence sequence(int64_t id, int n) {
  Sequence s;
  s.id = id;
  for (int i = 0; i < n; ++i) s.append(static_cast<int32_t>(id * 100 + i));
  return s;
}

// (sequence id, start, count) of each span.
using Spans = std::vector<std::tuple<int64_t, int64_t, int64_t>>;

Spans spans_of(const std::vector<ScheduledSpan>& batch) {
  Spans out;
  for (const ScheduledSpan& s : batch) out.emplace_back(s.sequence->id, s.start, s.count);
  return out;
}

// Completes every span; a span that reached its sequence's end samples token 7.
void complete(Scheduler& scheduler, const std::vector<ScheduledSpan>& batch) {
  for (const ScheduledSpan& s : batch) {
    const bool samples = s.samples();
    scheduler.completed(s);
    if (samples) s.sequence->append(7);
  }
}

TEST(Scheduler, DecodesFirstThenPrefillChunksThenAdmissionsUnderTheLimits) {
  BlockPool pool(4, 32);
  Scheduler scheduler(pool, SchedulerOptions{3, 6});
  Sequence a = sequence(1, 10), b = sequence(2, 3), c = sequence(3, 2), d = sequence(4, 2);
  for (Sequence* s : {&a, &b, &c, &d}) scheduler.add(s);

  std::vector<ScheduledSpan> step = scheduler.schedule();
  EXPECT_EQ(spans_of(step), (Spans{{1, 0, 6}}));  // a's first chunk takes the whole budget
  complete(scheduler, step);
  step = scheduler.schedule();
  EXPECT_EQ(spans_of(step), (Spans{{1, 6, 4}, {2, 0, 2}}));
  complete(scheduler, step);  // a samples; b is 2 of 3 in
  step = scheduler.schedule();
  // a's decode token, b's last prompt token, c admitted; d waits: three run at once.
  EXPECT_EQ(spans_of(step), (Spans{{1, 10, 1}, {2, 2, 1}, {3, 0, 2}}));
  EXPECT_EQ(scheduler.running(), 3u);
  EXPECT_EQ(scheduler.waiting(), 1u);
  complete(scheduler, step);
  scheduler.remove(&b);  // finished: d takes its place
  step = scheduler.schedule();
  EXPECT_EQ(spans_of(step), (Spans{{1, 11, 1}, {3, 2, 1}, {4, 0, 2}}));
  EXPECT_EQ(scheduler.stats().admitted_tokens, 10 + 3 + 2 + 2);
  EXPECT_EQ(scheduler.stats().preemptions, 0);
}

TEST(Scheduler, PreemptsTheNewestWhenBlocksRunOutAndRequeuesItFirst) {
  BlockPool pool(2, 4);  // 8 rows
  Scheduler scheduler(pool, SchedulerOptions{4, 64});
  Sequence a = sequence(1, 3), b = sequence(2, 3), c = sequence(3, 1);
  scheduler.add(&a);
  scheduler.add(&b);
  std::vector<ScheduledSpan> step = scheduler.schedule();
  EXPECT_EQ(spans_of(step), (Spans{{1, 0, 3}, {2, 0, 3}}));  // two blocks each: the pool is full
  complete(scheduler, step);
  scheduler.add(&c);  // arrives now, behind what is preempted later
  step = scheduler.schedule();
  EXPECT_EQ(spans_of(step), (Spans{{1, 3, 1}, {2, 3, 1}}));  // position 3 is in their second block
  complete(scheduler, step);

  // Position 4 needs a third block each: b, the newer, goes back to the queue, ahead of c.
  step = scheduler.schedule();
  EXPECT_EQ(spans_of(step), (Spans{{1, 4, 1}}));
  EXPECT_EQ(scheduler.stats().preemptions, 1);
  EXPECT_EQ(scheduler.running(), 1u);
  EXPECT_EQ(scheduler.waiting(), 2u);
  EXPECT_EQ(b.computed, 0);
  EXPECT_EQ(b.size(), 5);  // its tokens, sampled ones included, are kept

  // Once a is done, b comes back before c, its first block still cached: positions 0..1 are
  // not run again.
  complete(scheduler, step);
  scheduler.remove(&a);
  step = scheduler.schedule();
  ASSERT_EQ(step.size(), 2u);
  EXPECT_EQ(spans_of(step)[0], std::make_tuple(int64_t{2}, int64_t{2}, int64_t{3}));
  EXPECT_EQ(spans_of(step)[1], std::make_tuple(int64_t{3}, int64_t{0}, int64_t{1}));
  EXPECT_EQ(scheduler.stats().cached_tokens, 2);
}

TEST(Scheduler, TheNewestPreemptsItselfWhenItCannotGrow) {
  BlockPool pool(2, 4);
  Scheduler scheduler(pool, SchedulerOptions{2, 3});
  Sequence a = sequence(1, 2), b = sequence(2, 7);
  scheduler.add(&a);
  scheduler.add(&b);
  std::vector<ScheduledSpan> step = scheduler.schedule();
  EXPECT_EQ(spans_of(step), (Spans{{1, 0, 2}, {2, 0, 1}}));
  complete(scheduler, step);
  step = scheduler.schedule();
  EXPECT_EQ(spans_of(step), (Spans{{1, 2, 1}, {2, 1, 2}}));
  complete(scheduler, step);  // every block in use
  // b's next chunk needs a fifth block: b is the newest, so b goes, and a decodes on.
  step = scheduler.schedule();
  EXPECT_EQ(spans_of(step), (Spans{{1, 3, 1}}));
  EXPECT_EQ(scheduler.stats().preemptions, 1);
  EXPECT_EQ(scheduler.running(), 1u);
  EXPECT_EQ(scheduler.waiting(), 1u);
}

TEST(Scheduler, RemoveTakesAWaitingSequenceOutOfTheQueue) {
  BlockPool pool(4, 4);
  Scheduler scheduler(pool, SchedulerOptions{1, 64});
  Sequence a = sequence(1, 3), b = sequence(2, 3);
  scheduler.add(&a);
  scheduler.add(&b);
  scheduler.remove(&b);
  EXPECT_EQ(scheduler.waiting(), 1u);
  EXPECT_EQ(spans_of(scheduler.schedule()), (Spans{{1, 0, 3}}));
  scheduler.remove(&a);
  EXPECT_TRUE(scheduler.idle());
  EXPECT_TRUE(scheduler.schedule().empty());
  EXPECT_EQ(pool.available(), 4);
}

}  // namespace
}  // namespace kuiper
