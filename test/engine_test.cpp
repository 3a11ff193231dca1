// kuiper/runtime's Engine and Scheduler: many requests in one batch give what each gives alone
// (different lengths, shared prefixes, chunked prefill beside decode, images, seeded sampling),
// preemption by a tiny KV pool changes nothing, the prefix cache is hit and counted, and a bad
// request fails alone. The paging and prefix tests run a fake model with small blocks
// (support/fake_model.h), whose logits change with any wrong block, position or image row; the
// others run the tiny fixtures on the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "kuiper/runtime/engine.h"
#include "kuiper/runtime/generator.h"
#include "kuiper/runtime/vision_input.h"
#include "support/assertions.h"
#include "support/fake_model.h"
#include "support/fixture_checkpoint.h"
#include "support/golden.h"
#include "support/paths.h"

namespace kuiper {
namespace {

using test::FakeModel;
using test::FakeModelShape;

const Tokenizer& qwen_tokenizer() {
  static const Tokenizer tokenizer =
      Tokenizer::from_file(test::tokenizer_dir() + "/tokenizer.json").value();
  return tokenizer;
}

GenerationOptions greedy(int64_t max_tokens) {
  GenerationOptions o;
  o.sampling.temperature = 0.0f;
  o.max_tokens = max_tokens;
  o.ignore_eos = true;
  return o;
}

GenerationOptions seeded(int64_t max_tokens, uint64_t seed) {
  GenerationOptions o = greedy(max_tokens);
  o.sampling.temperature = 1.0f;
  o.sampling.top_k = 0;
  o.sampling.top_p = 1.0f;
  o.sampling.min_p = 0.0f;
  o.sampling.seed = seed;
  return o;
}

struct Prompt {
  std::vector<int32_t> ids;
  GenerationOptions options;
  std::vector<ProcessedImage> images;
};

// Adds every prompt to `engine` at once and steps until all are done: their results in the
// order given.
std::vector<Result<Generation>> run_all(Engine& engine, const std::vector<Prompt>& prompts) {
  std::map<int64_t, size_t> index;
  std::vector<Result<Generation>> out(prompts.size(), Status::Error("not run"));
  for (size_t i = 0; i < prompts.size(); ++i) {
    Result<int64_t> id = engine.add_request(prompts[i].ids, prompts[i].images, prompts[i].options);
    if (!id.ok()) {
      out[i] = id.status();
      continue;
    }
    index[*id] = i;
  }
  while (engine.unfinished() > 0) {
    Result<std::vector<FinishedRequest>> finished = engine.step();
    if (!finished.ok()) {
      ADD_FAILURE() << finished.status().message();
      break;
    }
    for (FinishedRequest& f : *finished) out[index.at(f.id)] = std::move(f.generation);
  }
  return out;
}

std::unique_ptr<Engine> make_engine(Model& model, EngineOptions options = {}) {
  Result<std::unique_ptr<Engine>> engine = Engine::create(model, qwen_tokenizer(), options);
  EXPECT_OK(engine);
  return engine.ok() ? std::move(engine).value() : nullptr;
}

EngineOptions engine_options(int64_t max_batch, int64_t max_batch_tokens) {
  EngineOptions o;
  o.max_batch = max_batch;
  o.max_batch_tokens = max_batch_tokens;
  return o;
}

// Each prompt alone, on a fresh model from `make` and an engine of one request.
template <typename Make>
std::vector<Result<Generation>> run_alone(const std::vector<Prompt>& prompts, Make make) {
  std::vector<Result<Generation>> out;
  for (const Prompt& p : prompts) {
    std::unique_ptr<Model> model = make();
    std::unique_ptr<Engine> engine = make_engine(*model, engine_options(1, 1 << 20));
    out.push_back(std::move(run_all(*engine, {p})[0]));
  }
  return out;
}

void expect_same_tokens(const std::vector<Result<Generation>>& got,
                        const std::vector<Result<Generation>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    ASSERT_OK(want[i]);
    ASSERT_OK(got[i]);
    EXPECT_EQ(got[i]->ids, want[i]->ids);
    EXPECT_EQ(got[i]->text, want[i]->text);
    EXPECT_EQ(got[i]->finish, want[i]->finish);
  }
}

std::vector<int32_t> ids_from(int n, int first, int step = 1) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back((first + i * step) % 30);
  return ids;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// ---------------------------------------------------------------------------- fake model

FakeModelShape small_blocks(int64_t blocks = 32) {
  FakeModelShape shape;
  shape.block_size = 4;
  shape.blocks = blocks;
  shape.max_context = 64;
  return shape;
}

TEST(Engine, MixedBatchGivesEachPromptItsTokensAlone) {
  const std::vector<int32_t> shared = ids_from(9, 3);
  const std::vector<Prompt> prompts = {
      {ids_from(3, 1), greedy(6)},
      {concat(shared, {5, 6}), greedy(4)},
      {ids_from(14, 7, 3), greedy(9)},
      {{12}, greedy(3)},
      {concat(shared, ids_from(5, 20)), greedy(7)},
      {shared, greedy(5)},
  };
  auto make = [] { return FakeModel::create(small_blocks()); };
  const std::vector<Result<Generation>> alone = run_alone(prompts, make);
  std::unique_ptr<FakeModel> model = make();
  std::unique_ptr<Engine> engine = make_engine(*model, engine_options(4, 5));
  ASSERT_NE(engine, nullptr);
  expect_same_tokens(run_all(*engine, prompts), alone);

  // The budget of 5 tokens made prefill chunks run beside decode tokens, at most 4 at once.
  bool mixed = false;
  for (const auto& batch : model->batches()) {
    EXPECT_LE(batch.size(), 4u);
    int64_t tokens = 0, decodes = 0;
    for (const auto& [start, count] : batch) {
      tokens += count;
      decodes += count == 1 && start > 0;
    }
    EXPECT_LE(tokens, 5);
    mixed = mixed || (decodes > 0 && decodes < static_cast<int64_t>(batch.size()));
  }
  EXPECT_TRUE(mixed);
  EXPECT_EQ(engine->unfinished(), 0u);
  EXPECT_EQ(engine->pool().available(), engine->pool().blocks());  // every block given back
}

EngineOptions overlap(int64_t max_batch, int64_t max_batch_tokens, bool on) {
  EngineOptions o = engine_options(max_batch, max_batch_tokens);
  o.overlap_steps = on;
  return o;
}

// Overlapped decode steps (EngineOptions::overlap_steps: the next step launched on the device's
// tokens before the host reads them) give each request what the same batch stepped in turn
// gives: requests ending on an end token or a stop string while the step after is already
// launched, at their max_tokens and at the context's end, and arrivals taking freed places.
TEST(Engine, OverlappedStepsGiveWhatStepsInTurnGive) {
  GenerationOptions at_eos = greedy(20), at_stop = greedy(20), to_the_end = greedy(-1);
  at_eos.ignore_eos = false;
  at_stop.stop = {"9,"};  // two tokens (the Qwen tokenizer's ids 24 and 11)
  const std::vector<Prompt> prompts = {
      {ids_from(5, 1), at_eos},       {ids_from(7, 3), at_stop},  {ids_from(3, 2), greedy(9)},
      {ids_from(40, 5), to_the_end},  {ids_from(6, 9), greedy(15)}, {ids_from(4, 11), greedy(3)},
      {ids_from(9, 13), at_eos},
  };
  std::vector<Result<Generation>> got[2];
  int64_t fed[2] = {0, 0}, mixed = 0, steps = 0;
  for (int on = 0; on < 2; ++on) {
    FakeModelShape shape = small_blocks(40);
    shape.eos_token_ids = {7, 19, 23};
    std::unique_ptr<FakeModel> model = FakeModel::create(shape);
    std::unique_ptr<Engine> engine = make_engine(*model, overlap(4, 64, on == 1));
    ASSERT_NE(engine, nullptr);
    got[on] = run_all(*engine, prompts);
    fed[on] = model->fed_steps();
    mixed = model->mixed_fed_steps();
    steps = static_cast<int64_t>(model->batches().size());
    EXPECT_EQ(engine->pool().available(), engine->pool().blocks());  // every block given back
  }
  expect_same_tokens(got[1], got[0]);
  EXPECT_EQ(fed[0], 0);
  // Every step but the first is fed by the one before (arrivals, finishes and all), some of them
  // beside prefill chunks or requests sitting out.
  EXPECT_EQ(fed[1], steps - 1);
  EXPECT_GE(mixed, 2);
  // The cases the test means to cover did come up.
  std::vector<FinishReason> reasons;
  for (const Result<Generation>& g : got[1]) reasons.push_back(g->finish);
  for (FinishReason want : {FinishReason::kEndToken, FinishReason::kStopString,
                            FinishReason::kMaxTokens, FinishReason::kContextFull}) {
    EXPECT_NE(std::find(reasons.begin(), reasons.end(), want), reasons.end())
        << finish_reason_name(want);
  }
}

// Overlapped steps in a pool too small for the batch: the scheduler preempts requests that hold a
// placeholder for a token still on the device (and may take them back later, their placeholder
// fed), and each still gives what it gives alone.
TEST(Engine, OverlappedStepsWithPreemptionGiveWhatEachGivesAlone) {
  std::vector<Prompt> prompts;
  for (int i = 0; i < 5; ++i) prompts.push_back({ids_from(6 + i, 2 + 3 * i), greedy(14 - i)});
  auto make = [] { return FakeModel::create(small_blocks(12)); };
  std::unique_ptr<FakeModel> model = make();
  std::unique_ptr<Engine> engine = make_engine(*model, overlap(4, 64, true));
  ASSERT_NE(engine, nullptr);
  expect_same_tokens(run_all(*engine, prompts), run_alone(prompts, make));
  EXPECT_GT(engine->stats().preemptions, 0);
  EXPECT_GT(model->fed_steps(), 10);
  EXPECT_EQ(engine->pool().available(), engine->pool().blocks());
}

// Requests that draw their tokens on the device (seeded, no penalty) are overlapped like greedy
// ones: each draws its uniforms in the same order as stepped in turn, so a batch of drawing and
// greedy requests, arriving and ending at different steps, gives the same tokens either way.
TEST(Engine, OverlappedDrawsGiveWhatStepsInTurnGive) {
  GenerationOptions warped = seeded(9, 5);
  warped.sampling.top_k = 6;
  warped.sampling.top_p = 0.8f;
  warped.sampling.temperature = 0.7f;
  const std::vector<Prompt> prompts = {
      {ids_from(5, 1), seeded(12, 1)}, {ids_from(7, 3), greedy(8)}, {ids_from(3, 2), warped},
      {ids_from(6, 9), seeded(15, 2)}, {ids_from(4, 11), greedy(3)}, {ids_from(9, 13), seeded(6, 3)},
  };
  std::vector<Result<Generation>> got[2];
  int64_t fed = 0, steps = 0;
  for (int on = 0; on < 2; ++on) {
    std::unique_ptr<FakeModel> model = FakeModel::create(small_blocks(40));
    std::unique_ptr<Engine> engine = make_engine(*model, overlap(4, 64, on == 1));
    ASSERT_NE(engine, nullptr);
    got[on] = run_all(*engine, prompts);
    fed = model->fed_steps();
    steps = static_cast<int64_t>(model->batches().size());
    EXPECT_EQ(engine->pool().available(), engine->pool().blocks());
  }
  expect_same_tokens(got[1], got[0]);
  EXPECT_EQ(fed, steps - 1);
  // The draws did draw: a seeded request's tokens differ from the greedy ones of its prompt.
  std::unique_ptr<FakeModel> model = FakeModel::create(small_blocks(40));
  std::unique_ptr<Engine> engine = make_engine(*model, overlap(4, 64, true));
  const std::vector<Result<Generation>> argmax = run_all(*engine, {{ids_from(5, 1), greedy(12)}});
  ASSERT_OK(argmax[0]);
  ASSERT_OK(got[1][0]);
  EXPECT_NE(argmax[0]->ids, got[1][0]->ids);
}

// A request whose tokens the host samples holds the overlap back while it runs or waits; the
// greedy requests beside it are overlapped before it comes and after it ends, and every request
// gives what the same requests stepped in turn give.
TEST(Engine, ARequestSampledOnTheHostHoldsTheOverlapBack) {
  std::vector<Result<Generation>> got[2];
  int64_t fed = 0;
  for (int on = 0; on < 2; ++on) {
    std::unique_ptr<FakeModel> model = FakeModel::create(small_blocks(40));
    std::unique_ptr<Engine> engine = make_engine(*model, overlap(4, 64, on == 1));
    ASSERT_NE(engine, nullptr);
    GenerationOptions penalised = seeded(4, 9);  // OpenAI's penalty: counted on the host
    penalised.sampling.presence_penalty = 0.5f;
    const Prompt first = {ids_from(5, 1), greedy(20)}, sampled = {ids_from(4, 7), penalised};
    Result<int64_t> a = engine->add_request(first.ids, {}, first.options);
    ASSERT_OK(a);
    std::vector<Result<Generation>> done(2, Status::Error("not finished"));
    int64_t fed_before = -1;
    for (int i = 0; engine->unfinished() > 0; ++i) {
      if (i == 4) {  // a few fed steps in, the sampled request arrives
        fed_before = model->fed_steps();
        ASSERT_OK(engine->add_request(sampled.ids, {}, sampled.options));
      }
      Result<std::vector<FinishedRequest>> finished = engine->step();
      ASSERT_OK(finished);
      for (FinishedRequest& f : *finished) done[f.id == *a ? 0 : 1] = std::move(f.generation);
    }
    got[on] = std::move(done);
    if (on == 1) {
      EXPECT_GT(fed_before, 1);
      fed = model->fed_steps() - fed_before;
    }
  }
  expect_same_tokens(got[1], got[0]);
  // From its arrival the 20-token request runs about 16 more steps, 4 of them beside the sampled
  // one (and the step that reads the sampled one's last token); the rest are fed again.
  EXPECT_GT(fed, 5);
  EXPECT_LT(fed, 14);
}

// Prompts longer than the step's budget: the first steps prefill chunks that sample nothing, go
// in flight with no tokens, and the steps after them are launched on no fed tokens.
TEST(Engine, OverlappedStepsAfterChunksThatSampleNothing) {
  const std::vector<Prompt> prompts = {{ids_from(21, 4), greedy(6)}, {ids_from(13, 8), greedy(5)}};
  auto make = [] { return FakeModel::create(small_blocks(40)); };
  std::unique_ptr<FakeModel> model = make();
  std::unique_ptr<Engine> engine = make_engine(*model, overlap(2, 8, true));
  ASSERT_NE(engine, nullptr);
  expect_same_tokens(run_all(*engine, prompts), run_alone(prompts, make));
  EXPECT_GT(model->fed_steps(), 5);
  EXPECT_EQ(engine->pool().available(), engine->pool().blocks());
}

// A request cancelled while a step holding it is in flight reports the tokens read so far; the
// one beside it goes on to what it gives alone.
TEST(Engine, CancelWhileAStepIsInFlight) {
  std::unique_ptr<FakeModel> model = FakeModel::create(small_blocks());
  std::unique_ptr<Engine> engine = make_engine(*model, overlap(4, 64, true));
  ASSERT_NE(engine, nullptr);
  const Prompt kept = {ids_from(5, 1), greedy(12)};
  Result<int64_t> a = engine->add_request(kept.ids, {}, kept.options);
  Result<int64_t> b = engine->add_request(ids_from(6, 4), {}, greedy(12));
  ASSERT_OK(a);
  ASSERT_OK(b);
  for (int i = 0; i < 50 && model->fed_steps() < 2; ++i) ASSERT_OK(engine->step());
  ASSERT_EQ(model->fed_steps(), 2);
  engine->cancel(*b);
  std::vector<Result<Generation>> done(2, Status::Error("not finished"));
  while (engine->unfinished() > 0) {
    Result<std::vector<FinishedRequest>> finished = engine->step();
    ASSERT_OK(finished);
    for (FinishedRequest& f : *finished) done[f.id == *a ? 0 : 1] = std::move(f.generation);
  }
  ASSERT_OK(done[1]);
  EXPECT_EQ(done[1]->finish, FinishReason::kInterrupted);
  EXPECT_GE(done[1]->ids.size(), 2u);
  EXPECT_LT(done[1]->ids.size(), 12u);
  expect_same_tokens({std::move(done[0])},
                     run_alone({kept}, [] { return FakeModel::create(small_blocks()); }));
  EXPECT_EQ(engine->pool().available(), engine->pool().blocks());
}

TEST(Engine, PreemptionByATinyPoolGivesTheSameTokens) {
  // 6 blocks of 4 rows; each request grows to 5 + 12 tokens (5 blocks), so three at once must
  // take turns: the newest is preempted and recomputed later.
  const std::vector<Prompt> prompts = {
      {ids_from(5, 1), greedy(12)}, {ids_from(5, 2), greedy(12)}, {ids_from(5, 9, 2), greedy(12)}};
  auto make = [] { return FakeModel::create(small_blocks(6)); };
  const std::vector<Result<Generation>> alone = run_alone(prompts, make);
  std::unique_ptr<FakeModel> model = make();
  std::unique_ptr<Engine> engine = make_engine(*model, engine_options(3, 64));
  ASSERT_NE(engine, nullptr);
  expect_same_tokens(run_all(*engine, prompts), alone);
  EXPECT_GT(engine->stats().preemptions, 0);
}

TEST(Engine, SampledRequestsArePreemptedWithoutChangingTheirDraws) {
  const std::vector<Prompt> prompts = {{ids_from(5, 1), seeded(12, 1)},
                                       {ids_from(5, 2), seeded(12, 2)},
                                       {ids_from(5, 1), seeded(12, 3)}};
  auto make = [] { return FakeModel::create(small_blocks(6)); };
  const std::vector<Result<Generation>> alone = run_alone(prompts, make);
  std::unique_ptr<FakeModel> model = make();
  std::unique_ptr<Engine> engine = make_engine(*model, engine_options(3, 64));
  expect_same_tokens(run_all(*engine, prompts), alone);
  EXPECT_GT(engine->stats().preemptions, 0);
}

TEST(Engine, PrefixCacheReusesFullBlocksAndCountsThem) {
  std::unique_ptr<FakeModel> model = FakeModel::create(small_blocks(8));
  std::unique_ptr<Engine> engine = make_engine(*model, engine_options(4, 64));
  const std::vector<int32_t> system = ids_from(10, 4);  // two full blocks and two tokens

  const std::vector<Result<Generation>> first = run_all(*engine, {{system, greedy(2)}});
  ASSERT_OK(first[0]);
  EXPECT_EQ(first[0]->stats.prefilled_tokens, 10);
  EXPECT_EQ(engine->stats().cached_tokens, 0);

  // Sharing the first 9 tokens: the two full blocks are found; the tail of the first request
  // (positions 8..10: its 2 prompt tokens and its first generated one) shares one more.
  const Prompt second = {concat(ids_from(9, 4), {1, 2, 3}), greedy(5)};
  const std::vector<Result<Generation>> got = run_all(*engine, {second});
  ASSERT_OK(got[0]);
  EXPECT_EQ(got[0]->stats.prompt_tokens, 12);
  EXPECT_EQ(got[0]->stats.prefilled_tokens, 3);
  EXPECT_EQ(engine->stats().cached_tokens, 9);
  EXPECT_EQ(engine->stats().admitted_tokens, 10 + 12);
  expect_same_tokens(got, run_alone({second}, [] { return FakeModel::create(small_blocks(8)); }));
}

TEST(Engine, ARequestSharesBlocksThatARunningOneFilled) {
  // Two requests share a prompt of three full blocks; the second arrives once the first has
  // run: both read the same blocks at once.
  std::unique_ptr<FakeModel> model = FakeModel::create(small_blocks(8));
  std::unique_ptr<Engine> engine = make_engine(*model, engine_options(4, 64));
  const std::vector<int32_t> prompt = ids_from(13, 2);
  ASSERT_OK(engine->add_request(prompt, {}, greedy(6)));
  ASSERT_OK(engine->step());  // the prompt runs and three blocks fill
  ASSERT_OK(engine->add_request(prompt, {}, greedy(6)));
  std::vector<Generation> done;
  while (engine->unfinished() > 0) {
    Result<std::vector<FinishedRequest>> finished = engine->step();
    ASSERT_OK(finished);
    for (FinishedRequest& f : *finished) {
      ASSERT_OK(f.generation);
      done.push_back(*f.generation);
    }
  }
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].ids, done[1].ids);
  EXPECT_EQ(done[1].stats.prefilled_tokens, 1);  // 12 cached tokens, the last one runs
  EXPECT_NEAR(engine->stats().cached_fraction(), 12.0 / 26.0, 1e-12);
}

TEST(Engine, RequestsArrivingTogetherPrefillASharedPrefixOnce) {
  // Three requests queued at once share a prompt start of three full blocks: the first prefills
  // it, the others wait for that prefill and take its blocks from the prefix cache.
  std::unique_ptr<FakeModel> model = FakeModel::create(small_blocks(16));
  std::unique_ptr<Engine> engine = make_engine(*model, engine_options(4, 64));
  const std::vector<int32_t> shared = ids_from(12, 3);
  std::vector<Prompt> prompts;
  for (int i = 0; i < 3; ++i) prompts.push_back({concat(shared, ids_from(2, 20 + i)), greedy(3)});
  const std::vector<Result<Generation>> got = run_all(*engine, prompts);
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK(got[static_cast<size_t>(i)]);
    EXPECT_EQ(got[static_cast<size_t>(i)]->stats.prefilled_tokens, i == 0 ? 14 : 2) << i;
  }
  EXPECT_EQ(engine->stats().cached_tokens, 2 * 12);
  expect_same_tokens(got, run_alone(prompts, [] { return FakeModel::create(small_blocks(16)); }));
}

TEST(Engine, LiveTokensCountASharedBlockOnce) {
  // Three requests share three full blocks of prompt. The live tokens count each block once, so
  // they never exceed the rows of the blocks in use (counting the shared blocks once a request,
  // as the live count did, put a shared system prompt far past 100% "live"). Steps in turn, so
  // that each step() has run the spans it scheduled (overlapped, the blocks count the tokens of
  // the steps read so far).
  std::unique_ptr<FakeModel> model = FakeModel::create(small_blocks(16));
  std::unique_ptr<Engine> engine = make_engine(*model, overlap(4, 64, false));
  const std::vector<int32_t> shared = ids_from(12, 3);
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK(engine->add_request(concat(shared, ids_from(2, 20 + i)), {}, greedy(3)));
  }
  std::vector<std::pair<int64_t, int64_t>> live_and_used;
  while (engine->unfinished() > 0) {
    ASSERT_OK(engine->step());
    const StepStats& step = engine->last_step();
    const int64_t live = engine->live_tokens();
    EXPECT_LE(live, step.used_blocks * 4);
    live_and_used.emplace_back(live, step.used_blocks);
  }
  // After the second step the first request holds 15 tokens (the three shared blocks and 3 in a
  // block of its own), the second 14 (the shared blocks and 2 of its own): 17 live tokens in 5
  // blocks, where adding the requests' tokens gives 29.
  ASSERT_GE(live_and_used.size(), 2u);
  EXPECT_EQ(live_and_used[1], std::make_pair(int64_t{17}, int64_t{5}));
}

TEST(Engine, EvictedPrefixesAreRecomputed) {
  // A pool of 4 blocks: a second, unrelated request needs all of them and evicts the first's.
  std::unique_ptr<FakeModel> model = FakeModel::create(small_blocks(4));
  std::unique_ptr<Engine> engine = make_engine(*model, engine_options(1, 64));
  const Prompt a = {ids_from(8, 1), greedy(1)}, b = {ids_from(15, 11), greedy(1)};
  const std::vector<Result<Generation>> first = run_all(*engine, {a});
  ASSERT_OK(first[0]);
  EXPECT_EQ(run_all(*engine, {a})[0]->stats.prefilled_tokens, 4);  // one block cached
  ASSERT_OK(run_all(*engine, {b})[0]);
  EXPECT_GT(engine->pool().evictions(), 0);
  const std::vector<Result<Generation>> again = run_all(*engine, {a});
  ASSERT_OK(again[0]);
  EXPECT_EQ(again[0]->stats.prefilled_tokens, 8);
  EXPECT_EQ(again[0]->ids, first[0]->ids);
}

TEST(Engine, SeededSamplingDoesNotDependOnTheBatch) {
  const std::vector<Prompt> prompts = {{ids_from(6, 1), seeded(10, 7)},
                                       {ids_from(6, 1), seeded(10, 8)},
                                       {ids_from(3, 5), seeded(10, 7)}};
  auto make = [] { return FakeModel::create(small_blocks()); };
  const std::vector<Result<Generation>> alone = run_alone(prompts, make);
  std::unique_ptr<FakeModel> model = make();
  std::unique_ptr<Engine> engine = make_engine(*model, engine_options(3, 4));
  expect_same_tokens(run_all(*engine, prompts), alone);
  EXPECT_NE(alone[0]->ids, alone[1]->ids);  // the seed matters
}

TEST(Engine, ABadRequestFailsAlone) {
  const std::vector<Prompt> prompts = {
      {ids_from(6, 1), greedy(5)}, {{1, 2, 500, 3}, greedy(5)}, {ids_from(4, 3), greedy(5)}};
  std::unique_ptr<FakeModel> model = FakeModel::create(small_blocks());
  std::unique_ptr<Engine> engine = make_engine(*model, engine_options(3, 64));
  const std::vector<Result<Generation>> got = run_all(*engine, prompts);
  ASSERT_FALSE(got[1].ok());
  EXPECT_NE(got[1].status().message().find("token id 500"), std::string::npos)
      << got[1].status().message();
  const std::vector<Result<Generation>> alone =
      run_alone({prompts[0], prompts[2]}, [] { return FakeModel::create(small_blocks()); });
  expect_same_tokens({got[0], got[2]}, alone);
}

TEST(Engine, RefusesRequestsItCannotServe) {
  std::unique_ptr<FakeModel> model = FakeModel::create(small_blocks(8));  // 32 rows
  std::unique_ptr<Engine> engine = make_engine(*model);
  EXPECT_FALSE(engine->add_request({}, {}, greedy(1)).ok());
  Result<int64_t> too_long = engine->add_request(ids_from(33, 0), {}, greedy(1));
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("33 tokens, longer than the context of 32"),
            std::string::npos)
      << too_long.status().message();
  EXPECT_FALSE(engine->add_request({1}, {}, greedy(0)).ok());
  GenerationOptions bad = greedy(1);
  bad.sampling.top_p = 2.0f;
  EXPECT_FALSE(engine->add_request({1}, {}, bad).ok());
  GenerationOptions empty_stop = greedy(1);
  empty_stop.stop = {"x", ""};
  EXPECT_FALSE(engine->add_request({1}, {}, empty_stop).ok());
  ProcessedImage image;
  Result<int64_t> images = engine->add_request({1}, {image}, greedy(1));
  ASSERT_FALSE(images.ok());
  EXPECT_NE(images.status().message().find("takes no images"), std::string::npos);
  EXPECT_EQ(engine->unfinished(), 0u);
  EXPECT_FALSE(Engine::create(*model, qwen_tokenizer(), engine_options(0, 8)).ok());
  EXPECT_FALSE(Engine::create(*model, qwen_tokenizer(), engine_options(1, 0)).ok());
}

TEST(Engine, ContextFullEndsARequestAtThePoolsEnd) {
  // 8 blocks of 4: 32 rows; 30 prompt tokens leave room to run two more.
  std::unique_ptr<FakeModel> model = FakeModel::create(small_blocks(8));
  std::unique_ptr<Engine> engine = make_engine(*model);
  const std::vector<Result<Generation>> got = run_all(*engine, {{ids_from(30, 0), greedy(-1)}});
  ASSERT_OK(got[0]);
  EXPECT_EQ(got[0]->finish, FinishReason::kContextFull);
  EXPECT_EQ(got[0]->ids.size(), 3u);
}

TEST(Engine, EndTokensStopStringsAndCancel) {
  std::unique_ptr<FakeModel> model = FakeModel::create(small_blocks());
  std::unique_ptr<Engine> engine = make_engine(*model);
  const std::vector<int32_t> prompt = ids_from(5, 1);
  const std::vector<Result<Generation>> free_run = run_all(*engine, {{prompt, greedy(8)}});
  ASSERT_OK(free_run[0]);
  const std::vector<int32_t>& ids = free_run[0]->ids;
  ASSERT_EQ(ids.size(), 8u);
  const size_t first_repeat_free = [&] {
    size_t k = 2;
    while (k < ids.size() && std::count(ids.begin(), ids.begin() + k, ids[k]) > 0) ++k;
    return k;
  }();
  ASSERT_LT(first_repeat_free, ids.size());

  // That token as an end token: generation ends before it.
  FakeModelShape shape = small_blocks();
  shape.eos_token_ids = {ids[first_repeat_free]};
  std::unique_ptr<FakeModel> eos_model = FakeModel::create(shape);
  std::unique_ptr<Engine> eos_engine = make_engine(*eos_model);
  GenerationOptions stop_at_eos = greedy(8);
  stop_at_eos.ignore_eos = false;
  const std::vector<Result<Generation>> ended = run_all(*eos_engine, {{prompt, stop_at_eos}});
  ASSERT_OK(ended[0]);
  EXPECT_EQ(ended[0]->finish, FinishReason::kEndToken);
  EXPECT_EQ(ended[0]->ids, std::vector<int32_t>(ids.begin(), ids.begin() + first_repeat_free));

  // Its text as a stop string: the text ends before it.
  GenerationOptions stop = greedy(8);
  stop.stop = {qwen_tokenizer().decode({ids[first_repeat_free]})};
  std::string streamed;
  ASSERT_OK(engine->add_request(prompt, {}, stop, [&](const std::string& t) { streamed += t; }));
  Result<std::vector<FinishedRequest>> finished = engine->step();
  while (finished.ok() && finished->empty()) finished = engine->step();
  ASSERT_OK(finished);
  ASSERT_OK((*finished)[0].generation);
  const Generation& cut = *(*finished)[0].generation;
  EXPECT_EQ(cut.finish, FinishReason::kStopString);
  EXPECT_EQ(cut.text, qwen_tokenizer().decode(std::vector<int32_t>(
                          ids.begin(), ids.begin() + first_repeat_free)));
  EXPECT_EQ(streamed, cut.text);

  // Cancelled after its first step: what it has, reported as interrupted.
  Result<int64_t> id = engine->add_request(prompt, {}, greedy(8));
  ASSERT_OK(id);
  ASSERT_OK(engine->step());
  engine->cancel(*id);
  Result<std::vector<FinishedRequest>> cancelled = engine->step();
  ASSERT_OK(cancelled);
  ASSERT_EQ(cancelled->size(), 1u);
  ASSERT_OK((*cancelled)[0].generation);
  EXPECT_EQ((*cancelled)[0].generation->finish, FinishReason::kInterrupted);
  EXPECT_EQ((*cancelled)[0].generation->ids, std::vector<int32_t>{ids[0]});
  EXPECT_EQ(engine->unfinished(), 0u);
}

// An image of `grid` patches whose pixels follow `seed`.
ProcessedImage fake_image(std::array<int64_t, 3> grid, int seed) {
  ProcessedImage image;
  image.grid = grid;
  image.patches = grid[0] * grid[1] * grid[2];
  image.patch_dim = 3;
  for (int64_t i = 0; i < image.patches * image.patch_dim; ++i) {
    image.pixel_values.push_back(static_cast<float>((i * 31 + seed * 17) % 101) / 101.0f);
  }
  return image;
}

// text, then per image: 29 (start), `pads` image pads, 28 (end), then more text.
std::vector<int32_t> image_prompt(const std::vector<int64_t>& pads, int32_t pad_id, int text) {
  std::vector<int32_t> ids = ids_from(text, 5);
  for (int64_t n : pads) {
    ids.push_back(27);
    ids.insert(ids.end(), static_cast<size_t>(n), pad_id);
    ids.push_back(28);
    ids.push_back(static_cast<int32_t>(3 + n));
  }
  return ids;
}

FakeModelShape vision_shape() {
  FakeModelShape shape = small_blocks();
  shape.vision = true;
  return shape;
}

TEST(Engine, ImagesInABatchGiveEachPromptItsTokensAlone) {
  auto make = [] { return FakeModel::create(vision_shape()); };
  const int32_t pad = make()->image_pad_id();
  // Grids whose merged sides are shorter than their pad runs: the text after an image rotates at
  // cache position + a negative delta.
  const ProcessedImage a = fake_image({1, 4, 4}, 1), b = fake_image({1, 4, 4}, 2);
  const ProcessedImage c = fake_image({1, 4, 6}, 3);
  const std::vector<Prompt> prompts = {
      {image_prompt({4}, pad, 3), greedy(5), {a}},
      {image_prompt({4, 6}, pad, 2), greedy(6), {b, c}},
      {ids_from(7, 2), greedy(4)},
      {image_prompt({4}, pad, 3), greedy(5), {b}},  // a's ids, b's pixels
  };
  const std::vector<Result<Generation>> alone = run_alone(prompts, make);
  std::unique_ptr<FakeModel> model = make();
  std::unique_ptr<Engine> engine = make_engine(*model, engine_options(4, 3));  // images split
  expect_same_tokens(run_all(*engine, prompts), alone);
  EXPECT_NE(alone[0]->ids, alone[3]->ids);  // the pixels matter, not just the ids
}

TEST(Engine, ThePrefixCacheTellsImagesApart) {
  std::unique_ptr<FakeModel> model = FakeModel::create(vision_shape());
  std::unique_ptr<Engine> engine = make_engine(*model, engine_options(1, 64));
  const int32_t pad = model->image_pad_id();
  const std::vector<int32_t> ids = image_prompt({4}, pad, 3);  // 3 text, start, 4 pads, end, text
  const ProcessedImage a = fake_image({1, 4, 4}, 1), b = fake_image({1, 4, 4}, 2);
  ASSERT_OK(run_all(*engine, {{ids, greedy(2), {a}}})[0]);
  // The same image: everything but the last token is cached, and no image is encoded again.
  const int64_t encoded = model->encoded_images();
  const Result<Generation> same = run_all(*engine, {{ids, greedy(2), {a}}})[0];
  ASSERT_OK(same);
  EXPECT_EQ(same->stats.prefilled_tokens, 1);
  EXPECT_EQ(model->encoded_images(), encoded);
  // Other pixels: only the first block is reused (the text and the image's start token).
  const Result<Generation> other = run_all(*engine, {{ids, greedy(2), {b}}})[0];
  ASSERT_OK(other);
  EXPECT_EQ(other->stats.prefilled_tokens, static_cast<int64_t>(ids.size()) - 4);
  const std::vector<Result<Generation>> alone = run_alone(
      {{ids, greedy(2), {b}}}, [] { return FakeModel::create(vision_shape()); });
  expect_same_tokens({other}, alone);

  // Two images, the second one new: only it goes through the vision tower.
  const std::vector<int32_t> two = image_prompt({4, 2}, pad, 3);
  const ProcessedImage c = fake_image({1, 2, 4}, 3), d = fake_image({1, 2, 4}, 4);
  ASSERT_OK(run_all(*engine, {{two, greedy(2), {a, c}}})[0]);
  const int64_t before = model->encoded_images();
  const Result<Generation> second_new = run_all(*engine, {{two, greedy(3), {a, d}}})[0];
  EXPECT_EQ(model->encoded_images(), before + 1);
  expect_same_tokens({second_new},
                     run_alone({{two, greedy(3), {a, d}}},
                               [] { return FakeModel::create(vision_shape()); }));
}

// ---------------------------------------------------------------------------- tiny fixtures

std::unique_ptr<Model> load_fixture(const std::string& fixture, int64_t sequences,
                                    int64_t max_context, DeviceType device = DeviceType::kCpu,
                                    bool cuda_graph = false) {
  ModelOptions options;
  options.device = device;
  options.cuda_graph = cuda_graph;
  options.max_context = max_context;
  options.max_sequences = sequences;
  options.prefill_chunk = 16;
  Result<std::unique_ptr<Model>> model =
      Model::load(test::converted_fixture(fixture, DataType::kFp32), options);
  EXPECT_OK(model);
  return model.ok() ? std::move(model).value() : nullptr;
}

// Each prompt alone through a Generator on a fresh model of one sequence.
std::vector<Result<Generation>> generate_alone(const std::string& fixture,
                                               const std::vector<Prompt>& prompts,
                                               DeviceType device = DeviceType::kCpu) {
  std::vector<Result<Generation>> out;
  for (const Prompt& p : prompts) {
    std::unique_ptr<Model> model = load_fixture(fixture, 1, 192, device);
    if (model == nullptr) return out;
    Generator generator(*model, qwen_tokenizer());
    out.push_back(generator.generate_with_images(p.ids, p.images, p.options));
  }
  return out;
}

TEST(EngineFixture, MixedQwen3BatchGreedyMatchesEachAlone) {
  const test::Golden g = test::Golden::load("qwen3-tiny");
  const std::vector<int32_t>& chat = g.at("chat.ids").i32;
  const std::vector<int32_t>& long_ids = g.at("long.ids").i32;
  const std::vector<int32_t> b(long_ids.begin(), long_ids.begin() + 40);
  const std::vector<int32_t> c(long_ids.begin(), long_ids.begin() + 61);  // shares b
  const std::vector<int32_t> d(long_ids.begin() + 100, long_ids.begin() + 123);
  const std::vector<Prompt> prompts = {{chat, greedy(8)},
                                       {b, greedy(6)},
                                       {c, greedy(8)},
                                       {d, greedy(5)},
                                       {concat(chat, {151645, 198}), greedy(7)}};
  const std::vector<Result<Generation>> alone = generate_alone("qwen3-tiny", prompts);
  // Four KV blocks for five requests: the last waits for the first to finish.
  std::unique_ptr<Model> model = load_fixture("qwen3-tiny", 4, 192);
  ASSERT_NE(model, nullptr);
  std::unique_ptr<Engine> engine = make_engine(*model, engine_options(4, 24));
  expect_same_tokens(run_all(*engine, prompts), alone);
}

// Overlapped greedy steps on the GPU through the decode graphs (each step's tokens fed on the
// device into the next graph replay) give what each prompt gives alone, as the steps in turn do.
TEST(EngineFixture, OverlappedGraphStepsOnCudaMatchEachAlone) {
  SKIP_WITHOUT_CUDA();
  const test::Golden g = test::Golden::load("qwen3-tiny");
  const std::vector<int32_t>& chat = g.at("chat.ids").i32;
  const std::vector<int32_t>& long_ids = g.at("long.ids").i32;
  const std::vector<int32_t> b(long_ids.begin(), long_ids.begin() + 40);
  const std::vector<int32_t> d(long_ids.begin() + 100, long_ids.begin() + 123);
  const std::vector<Prompt> prompts = {{chat, greedy(12)}, {b, greedy(6)}, {d, greedy(9)},
                                       {concat(chat, {151645, 198}), greedy(7)}, {b, greedy(10)}};
  const std::vector<Result<Generation>> alone =
      generate_alone("qwen3-tiny", prompts, DeviceType::kCuda);
  for (const bool on : {false, true}) {
    SCOPED_TRACE(on ? "overlapped" : "in turn");
    // Three places for five requests: the last ones take the places the first ones free.
    std::unique_ptr<Model> model = load_fixture("qwen3-tiny", 3, 192, DeviceType::kCuda, true);
    ASSERT_NE(model, nullptr);
    std::unique_ptr<Engine> engine = make_engine(*model, overlap(3, 64, on));
    expect_same_tokens(run_all(*engine, prompts), alone);
  }
}

TEST(EngineFixture, SeededQwen3SamplingAloneEqualsInABatch) {
  const test::Golden g = test::Golden::load("qwen3-tiny");
  const std::vector<int32_t>& chat = g.at("chat.ids").i32;
  std::vector<Prompt> prompts;
  for (uint64_t seed : {3, 4, 5}) prompts.push_back({chat, seeded(10, seed)});
  const std::vector<Result<Generation>> alone = generate_alone("qwen3-tiny", prompts);
  std::unique_ptr<Model> model = load_fixture("qwen3-tiny", 3, 192);
  ASSERT_NE(model, nullptr);
  std::unique_ptr<Engine> engine = make_engine(*model, engine_options(3, 64));
  expect_same_tokens(run_all(*engine, prompts), alone);
  ASSERT_OK(alone[0]);
  ASSERT_OK(alone[1]);
  EXPECT_NE(alone[0]->ids, alone[1]->ids);
}

// Every kind of sampling in one batch: the rows op::sample_rows draws together (warpers,
// penalties, greedy with the penalty), a plain greedy row and one with OpenAI's penalties (the
// host's), each the same tokens as alone through the Generator (op::sample), on every device.
void expect_mixed_sampling_alone_equals_in_a_batch(DeviceType device) {
  const test::Golden g = test::Golden::load("qwen3-tiny");
  const std::vector<int32_t>& chat = g.at("chat.ids").i32;
  const std::vector<int32_t>& long_ids = g.at("long.ids").i32;
  const std::vector<int32_t> other(long_ids.begin(), long_ids.begin() + 30);
  GenerationOptions defaults = seeded(8, 21);  // llama.cpp's warpers with a penalty
  defaults.sampling = SamplingParams{};
  defaults.sampling.seed = 21;
  defaults.sampling.repeat_penalty = 1.3f;
  GenerationOptions tight = seeded(8, 22);
  tight.sampling.temperature = 0.7f;
  tight.sampling.top_p = 0.5f;
  GenerationOptions wide = seeded(8, 23);
  wide.sampling.top_k = 5;
  wide.sampling.min_p = 0.1f;
  GenerationOptions greedy_penalised = greedy(8);
  greedy_penalised.sampling.repeat_penalty = 1.5f;
  greedy_penalised.sampling.repeat_last_n = -1;
  GenerationOptions presence = seeded(8, 24);
  presence.sampling.presence_penalty = 1.0f;
  const std::vector<Prompt> prompts = {{chat, defaults},        {other, tight},
                                       {chat, wide},            {other, greedy_penalised},
                                       {chat, greedy(8)},       {other, presence}};
  const std::vector<Result<Generation>> alone = generate_alone("qwen3-tiny", prompts, device);
  std::unique_ptr<Model> model = load_fixture("qwen3-tiny", 6, 192, device);
  ASSERT_NE(model, nullptr);
  std::unique_ptr<Engine> engine = make_engine(*model, engine_options(6, 128));
  expect_same_tokens(run_all(*engine, prompts), alone);
}

TEST(EngineFixture, MixedQwen3SamplingAloneEqualsInABatch) {
  expect_mixed_sampling_alone_equals_in_a_batch(DeviceType::kCpu);
}

TEST(EngineFixture, MixedQwen3SamplingAloneEqualsInABatchOnCuda) {
  SKIP_WITHOUT_CUDA();
  expect_mixed_sampling_alone_equals_in_a_batch(DeviceType::kCuda);
}

TEST(EngineFixture, Qwen3VLImagePromptBesideTextMatchesEachAlone) {
  const std::string fixture = "qwen3-vl-tiny";
  const test::Golden g = test::Golden::load(fixture);
  std::unique_ptr<Model> model = load_fixture(fixture, 3, 192);
  ASSERT_NE(model, nullptr);
  Result<ImageInput> input = ImageInput::from_model_file(*model->file());
  ASSERT_OK(input);
  Result<PromptImage> image = input->load(test::fixtures_dir() + "/" + fixture + "/test_image.png");
  ASSERT_OK(image);
  const std::vector<int32_t>& img = g.at("img.ids").i32;
  const std::vector<Prompt> prompts = {{img, greedy(6), {image->pixels}},
                                       {g.at("chat.ids").i32, greedy(6)},
                                       {img, greedy(4), {image->pixels}}};
  const std::vector<Result<Generation>> alone = generate_alone(fixture, prompts);
  // 16 tokens a step: the image's 70 pads run in pieces beside the others.
  std::unique_ptr<Engine> engine = make_engine(*model, engine_options(3, 16));
  expect_same_tokens(run_all(*engine, prompts), alone);
  ASSERT_OK(alone[0]);
  const std::vector<int32_t>& want = g.at("img.greedy").i32;
  EXPECT_EQ(alone[0]->ids, std::vector<int32_t>(want.begin(), want.begin() + 6));
}

}  // namespace
}  // namespace kuiper
