// kuiper/runtime: samplers, stop strings, the generation loop and the chat session. The
// generation tests run the converted qwen3-tiny fixture on the CPU and hold it to the
// transformers goldens.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "kuiper/runtime/chat_session.h"
#include "kuiper/runtime/generator.h"
#include "kuiper/runtime/sampler.h"
#include "kuiper/runtime/stop_strings.h"
#include "support/assertions.h"
#include "support/fixture_checkpoint.h"
#include "support/golden.h"
#include "support/paths.h"

namespace kuiper {
namespace {

// ---------------------------------------------------------------------------- samplers

// Logits whose softmax is exactly `probs`.
std::vector<float> logits_of(const std::vector<float>& probs) {
  std::vector<float> logits;
  for (float p : probs) logits.push_back(std::log(p));
  return logits;
}

SamplingParams plain_sampling(uint64_t seed = 1) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = seed;
  return p;
}

std::vector<int32_t> ids_of(const std::vector<TokenProbability>& candidates) {
  std::vector<int32_t> ids;
  for (const TokenProbability& c : candidates) ids.push_back(c.id);
  return ids;
}

TEST(Sampler, GreedyIsArgMaxAtTemperatureZero) {
  SamplingParams p = plain_sampling();
  p.temperature = 0.0f;
  Sampler s = *Sampler::create(p);
  const std::vector<float> logits = {0.1f, 2.5f, -1.0f, 2.4f};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(s.sample(logits.data(), 4, {}), 1);
}

TEST(Sampler, SameSeedSameTokensOtherSeedOtherTokens) {
  const std::vector<float> logits(1000, 0.0f);  // uniform: every draw is up to the generator
  auto draws = [&](uint64_t seed) {
    Sampler s = *Sampler::create(plain_sampling(seed));
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i) out.push_back(s.sample(logits.data(), 1000, {}));
    return out;
  };
  EXPECT_EQ(draws(42), draws(42));
  EXPECT_NE(draws(42), draws(43));
}

TEST(Sampler, DrawsFollowTheDistribution) {
  const std::vector<float> logits = logits_of({0.5f, 0.3f, 0.2f});
  Sampler s = *Sampler::create(plain_sampling(7));
  std::map<int32_t, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++counts[s.sample(logits.data(), 3, {})];
  EXPECT_NEAR(counts[0] / double(n), 0.5, 0.02);
  EXPECT_NEAR(counts[1] / double(n), 0.3, 0.02);
  EXPECT_NEAR(counts[2] / double(n), 0.2, 0.02);
}

TEST(Sampler, TopKKeepsTheKMostLikely) {
  SamplingParams p = plain_sampling();
  p.top_k = 2;
  Sampler s = *Sampler::create(p);
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f};
  const std::vector<TokenProbability> c = s.candidates(logits.data(), 4, {});
  EXPECT_EQ(ids_of(c), (std::vector<int32_t>{1, 2}));
  // Renormalised over the survivors: e^3 / (e^3 + e^2).
  EXPECT_NEAR(c[0].probability, 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
}

TEST(Sampler, TopPKeepsTheSmallestSetReachingP) {
  const std::vector<float> logits = logits_of({0.1f, 0.4f, 0.2f, 0.3f});
  SamplingParams p = plain_sampling();
  p.top_p = 0.6f;  // 0.4 alone is short of 0.6; 0.4 + 0.3 crosses it
  EXPECT_EQ(ids_of(Sampler::create(p)->candidates(logits.data(), 4, {})),
            (std::vector<int32_t>{1, 3}));
  p.top_p = 0.75f;  // 0.7 is short; the 0.2 token crosses
  EXPECT_EQ(ids_of(Sampler::create(p)->candidates(logits.data(), 4, {})),
            (std::vector<int32_t>{1, 3, 2}));
  p.top_p = 0.3f;  // the most likely token alone is enough
  EXPECT_EQ(ids_of(Sampler::create(p)->candidates(logits.data(), 4, {})),
            (std::vector<int32_t>{1}));
}

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheTop) {
  const std::vector<float> logits = logits_of({0.5f, 0.3f, 0.15f, 0.05f});
  SamplingParams p = plain_sampling();
  p.min_p = 0.5f;  // floor 0.25: keeps 0.5 and 0.3
  EXPECT_EQ(ids_of(Sampler::create(p)->candidates(logits.data(), 4, {})),
            (std::vector<int32_t>{0, 1}));
  p.min_p = 0.2f;  // floor 0.1: keeps 0.15 too
  EXPECT_EQ(ids_of(Sampler::create(p)->candidates(logits.data(), 4, {})),
            (std::vector<int32_t>{0, 1, 2}));
}

TEST(Sampler, TemperatureScalesTheLogitsBeforeTheWarpers) {
  const std::vector<float> logits = {2.0f, 0.0f};
  SamplingParams p = plain_sampling();
  p.temperature = 2.0f;
  const std::vector<TokenProbability> c = Sampler::create(p)->candidates(logits.data(), 2, {});
  EXPECT_NEAR(c[0].probability, 1.0 / (1.0 + std::exp(-1.0)), 1e-6);  // softmax([1, 0])
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  std::vector<float> logits = {2.0f, -2.0f, 1.0f, 0.5f};
  // Token 1 repeats: it is still penalised once, as Hugging Face does.
  apply_repetition_penalty(2.0f, {0, 1, 1}, &logits);
  EXPECT_EQ(logits, (std::vector<float>{1.0f, -4.0f, 1.0f, 0.5f}));
}

TEST(Sampler, RepetitionPenaltyChangesTheGreedyChoiceWithinItsWindow) {
  SamplingParams p = plain_sampling();
  p.temperature = 0.0f;
  p.repeat_penalty = 2.0f;
  p.repeat_last_n = 2;
  const std::vector<float> logits = {3.0f, 2.0f, 0.0f};
  Sampler s = *Sampler::create(p);
  EXPECT_EQ(s.sample(logits.data(), 3, {2, 0}), 1);     // 3 / 2 < 2
  EXPECT_EQ(s.sample(logits.data(), 3, {0, 2, 2}), 0);  // token 0 is outside the window
}

TEST(Sampler, RefusesOutOfRangeParameters) {
  SamplingParams p;
  p.top_p = 1.5f;
  Result<Sampler> s = Sampler::create(p);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("top_p"), std::string::npos);
  p = SamplingParams();
  p.temperature = -1.0f;
  EXPECT_FALSE(Sampler::create(p).ok());
  p = SamplingParams();
  p.min_p = 2.0f;
  EXPECT_FALSE(Sampler::create(p).ok());
  p = SamplingParams();
  p.repeat_penalty = 0.0f;
  EXPECT_FALSE(Sampler::create(p).ok());
}

// ---------------------------------------------------------------------------- stop strings

TEST(StopStrings, FindsAStopStringSpreadOverSeveralPieces) {
  StopStrings stops({"World"});
  std::string shown;
  for (const char* piece : {"Hel", "lo W", "or"}) {
    StopStrings::Step step = stops.feed(piece);
    EXPECT_FALSE(step.stopped);
    shown += step.text;
  }
  EXPECT_EQ(shown, "Hello ");  // "Wor" is held back: it may be the start of "World"
  StopStrings::Step step = stops.feed("ld and more");
  EXPECT_TRUE(step.stopped);
  EXPECT_EQ(shown + step.text, "Hello ");
}

TEST(StopStrings, ReleasesHeldTextThatTurnsOutNotToBeAStop) {
  StopStrings stops({"abc"});
  EXPECT_EQ(stops.feed("xa").text, "x");
  StopStrings::Step step = stops.feed("bd");
  EXPECT_FALSE(step.stopped);
  EXPECT_EQ(step.text, "abd");
  EXPECT_EQ(stops.feed("ab").text, "");
  EXPECT_EQ(stops.flush(), "ab");
}

TEST(StopStrings, TheEarliestOfSeveralStopsWins) {
  StopStrings stops({"END", "\n\n"});
  StopStrings::Step step = stops.feed("one\n\ntwo END");
  EXPECT_TRUE(step.stopped);
  EXPECT_EQ(step.text, "one");
}

// ---------------------------------------------------------------------------- generation

// qwen3-tiny's transformers goldens (golden.safetensors), read once.
const test::Golden& tiny_golden() {
  static const test::Golden golden = test::Golden::load("qwen3-tiny");
  return golden;
}

// The chat prompt "Hello! Who are you?" with the chat template applied.
const std::vector<int32_t>& chat_ids() { return tiny_golden().at("chat.ids").i32; }

// The qwen3-tiny fixture on the CPU in fp32, with its tokenizer and chat template.
struct TinyModel {
  std::unique_ptr<Model> model;
  std::unique_ptr<Generator> generator;
  std::unique_ptr<ChatTemplate> chat_template;
};

TinyModel load_tiny(int64_t max_context = 512) {
  TinyModel tiny;
  const std::string path = test::converted_fixture("qwen3-tiny", DataType::kFp32);
  if (path.empty()) return tiny;
  ModelOptions options;
  options.max_context = max_context;
  Result<std::unique_ptr<Model>> model = Model::load(path, options);
  if (!model.ok()) {
    ADD_FAILURE() << model.status().message();
    return tiny;
  }
  // Tokenizer and template are the same for every test: parse them once.
  static Result<Tokenizer> tokenizer = Tokenizer::from_json((*model)->file()->tokenizer_json());
  static Result<ChatTemplate> chat_template =
      ChatTemplate::from_tokenizer_config((*model)->file()->tokenizer_config_json());
  if (!tokenizer.ok() || !chat_template.ok()) {
    ADD_FAILURE() << tokenizer.status().message() << chat_template.status().message();
    return tiny;
  }
  tiny.model = std::move(model).value();
  tiny.generator = std::make_unique<Generator>(*tiny.model, *tokenizer);
  tiny.chat_template = std::make_unique<ChatTemplate>(*chat_template);
  return tiny;
}

GenerationOptions greedy_options(int64_t max_tokens) {
  GenerationOptions o;
  o.sampling.temperature = 0.0f;
  o.max_tokens = max_tokens;
  return o;
}

TEST(Generator, GreedyContinuationMatchesTheGolden) {
  TinyModel tiny = load_tiny(1024);
  ASSERT_TRUE(tiny.generator);
  for (const std::string prompt : {"long", "chat"}) {
    SCOPED_TRACE(prompt);
    std::vector<int32_t> want = tiny_golden().at(prompt + ".greedy").i32;
    std::vector<float> margin = tiny_golden().at(prompt + ".greedy_margin").f32;
    if (prompt == "chat") {
      want = test::recorded_chat_greedy("qwen3-tiny");
      margin.assign(want.size(), 1.0f);  // no margins recorded: every step is compared
    }
    ASSERT_EQ(margin.size(), want.size());
    GenerationOptions o = greedy_options(static_cast<int64_t>(want.size()));
    o.ignore_eos = true;
    Result<Generation> g = tiny.generator->generate(tiny_golden().at(prompt + ".ids").i32, o);
    ASSERT_OK(g);
    ASSERT_EQ(g->ids.size(), want.size());
    EXPECT_EQ(g->finish, FinishReason::kMaxTokens);
    for (size_t i = 0; i < want.size(); ++i) {
      if (margin[i] < 1e-3f) break;  // a near tie: another arg-max is as valid
      ASSERT_EQ(g->ids[i], want[i]) << "step " << i;
    }
  }
}

TEST(Generator, SameSeedSameTokens) {
  TinyModel tiny = load_tiny();
  ASSERT_TRUE(tiny.generator);
  const std::vector<int32_t> prompt = chat_ids();
  GenerationOptions o;
  o.max_tokens = 12;
  o.ignore_eos = true;
  o.sampling.temperature = 1.5f;
  o.sampling.top_k = 0;
  o.sampling.min_p = 0.0f;
  o.sampling.top_p = 1.0f;
  o.sampling.seed = 1234;
  Result<Generation> a = tiny.generator->generate(prompt, o);
  Result<Generation> b = tiny.generator->generate(prompt, o);
  o.sampling.seed = 99;
  Result<Generation> c = tiny.generator->generate(prompt, o);
  ASSERT_OK(a);
  ASSERT_OK(b);
  ASSERT_OK(c);
  EXPECT_EQ(a->ids, b->ids);
  EXPECT_NE(a->ids, c->ids);
}

TEST(Generator, ReusesTheCachedPrefixAndGivesTheSameTokensAsAFreshRun) {
  TinyModel tiny = load_tiny();
  ASSERT_TRUE(tiny.generator);
  const std::vector<int32_t> first = chat_ids();
  Result<Generation> a = tiny.generator->generate(first, greedy_options(5));
  ASSERT_OK(a);
  EXPECT_EQ(a->stats.prefilled_tokens, static_cast<int64_t>(first.size()));

  // The next request extends the first prompt and its reply by three tokens.
  std::vector<int32_t> second = first;
  second.insert(second.end(), a->ids.begin(), a->ids.end());
  second.insert(second.end(), {151645, 198, 151644});
  Result<Generation> b = tiny.generator->generate(second, greedy_options(6));
  ASSERT_OK(b);
  EXPECT_EQ(b->stats.prompt_tokens, static_cast<int64_t>(second.size()));
  // The last reply token was sampled but never run, so it is prefilled with the new ones.
  EXPECT_EQ(b->stats.prefilled_tokens, 4);

  TinyModel fresh = load_tiny();
  Result<Generation> c = fresh.generator->generate(second, greedy_options(6));
  ASSERT_OK(c);
  EXPECT_EQ(c->stats.prefilled_tokens, static_cast<int64_t>(second.size()));
  EXPECT_EQ(b->ids, c->ids);

  // The same prompt again: everything but the last token comes from the cache.
  Result<Generation> d = tiny.generator->generate(second, greedy_options(6));
  ASSERT_OK(d);
  EXPECT_EQ(d->stats.prefilled_tokens, 1);
  EXPECT_EQ(d->ids, c->ids);
}

TEST(Generator, StopStringEndsTheTextBeforeIt) {
  TinyModel tiny = load_tiny();
  ASSERT_TRUE(tiny.generator);
  const std::vector<int32_t> prompt = chat_ids();
  std::vector<std::string> pieces;
  GenerationOptions o = greedy_options(12);
  o.ignore_eos = true;
  Result<Generation> full = tiny.generator->generate(
      prompt, o, [&](const std::string& piece) { pieces.push_back(piece); });
  ASSERT_OK(full);
  std::string streamed;
  for (const std::string& p : pieces) streamed += p;
  EXPECT_EQ(streamed, full->text);
  EXPECT_EQ(full->text, tiny.generator->tokenizer().decode(full->ids));

  // A stop string made of the last character of one token and the next token's text, so it
  // lies across a token boundary.
  StreamDecoder decoder(tiny.generator->tokenizer());
  std::vector<std::string> token_texts;
  for (int32_t id : full->ids) token_texts.push_back(decoder.feed(id));
  size_t k = 2;
  while (k + 1 < token_texts.size() && (token_texts[k].empty() || token_texts[k + 1].empty())) ++k;
  ASSERT_LT(k + 1, token_texts.size());
  const std::string& before = token_texts[k];
  size_t last_char = before.size() - 1;
  while (last_char > 0 && (static_cast<unsigned char>(before[last_char]) & 0xC0) == 0x80) --last_char;
  const std::string stop = before.substr(last_char) + token_texts[k + 1];
  o.stop = {stop};
  std::string stop_streamed;
  Result<Generation> cut = tiny.generator->generate(
      prompt, o, [&](const std::string& piece) { stop_streamed += piece; });
  ASSERT_OK(cut);
  EXPECT_EQ(cut->finish, FinishReason::kStopString);
  EXPECT_EQ(cut->text, full->text.substr(0, full->text.find(stop)));
  EXPECT_EQ(stop_streamed, cut->text);
  EXPECT_EQ(cut->text.find(stop), std::string::npos);
}

TEST(Generator, StopsAtTheEndOfTheContextWithANotice) {
  const std::vector<int32_t> prompt = chat_ids();
  TinyModel tiny = load_tiny(static_cast<int64_t>(prompt.size()) + 4);
  ASSERT_TRUE(tiny.generator);
  GenerationOptions o = greedy_options(-1);
  o.ignore_eos = true;
  Result<Generation> g = tiny.generator->generate(prompt, o);
  ASSERT_OK(g);
  EXPECT_EQ(g->finish, FinishReason::kContextFull);
  // Four more positions to run, and the token sampled from the last of them.
  EXPECT_EQ(g->ids.size(), 5u);
  EXPECT_STREQ(finish_reason_name(g->finish), "context");
}

TEST(Generator, RefusesAPromptLongerThanTheContextNamingBothLengths) {
  const std::vector<int32_t> prompt = chat_ids();
  TinyModel tiny = load_tiny(10);
  ASSERT_TRUE(tiny.generator);
  Result<Generation> g = tiny.generator->generate(prompt, greedy_options(4));
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find(std::to_string(prompt.size())), std::string::npos)
      << g.status().message();
  EXPECT_NE(g.status().message().find("10"), std::string::npos) << g.status().message();
  EXPECT_FALSE(tiny.generator->generate({}, greedy_options(4)).ok());
  // The generator is still usable.
  EXPECT_OK(tiny.generator->generate({151644, 872}, greedy_options(2)));
}

TEST(Generator, InterruptStopsBetweenTokens) {
  TinyModel tiny = load_tiny();
  ASSERT_TRUE(tiny.generator);
  std::atomic<bool> interrupt{false};
  GenerationOptions o = greedy_options(200);
  o.ignore_eos = true;
  int pieces = 0;
  Result<Generation> g = tiny.generator->generate(
      chat_ids(), o,
      [&](const std::string&) {
        if (++pieces == 3) interrupt = true;
      },
      &interrupt);
  ASSERT_OK(g);
  EXPECT_EQ(g->finish, FinishReason::kInterrupted);
  EXPECT_LT(g->ids.size(), 10u);
}

TEST(Generator, EndTokensIncludeImEndAndTheConfigEos) {
  TinyModel tiny = load_tiny();
  ASSERT_TRUE(tiny.generator);
  EXPECT_TRUE(tiny.generator->is_end_token(151645));  // <|im_end|>, also the config's eos
  EXPECT_TRUE(tiny.generator->is_end_token(151643));  // <|endoftext|>
  EXPECT_FALSE(tiny.generator->is_end_token(151644));
}

// ---------------------------------------------------------------------------- chat session

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

TEST(ChatSession, FirstTurnRendersTheGoldenChatIds) {
  TinyModel tiny = load_tiny();
  ASSERT_TRUE(tiny.generator);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  messages.push_back({{"role", "user"}, {"content", "Hello! Who are you?"}});
  Result<std::vector<int32_t>> ids =
      encode_chat(*tiny.chat_template, tiny.generator->tokenizer(), messages, ChatOptions());
  ASSERT_OK(ids);
  EXPECT_EQ(*ids, chat_ids());
}

TEST(ChatSession, SecondTurnPrefillsOnlyWhatIsNotCached) {
  TinyModel tiny = load_tiny();
  ASSERT_TRUE(tiny.generator);
  ChatSession session(*tiny.generator, *tiny.chat_template, ChatOptions());
  Result<Generation> one = session.send("Hello! Who are you?", greedy_options(6));
  ASSERT_OK(one);
  EXPECT_EQ(one->stats.prefilled_tokens, one->stats.prompt_tokens);
  const std::vector<int32_t> cached = tiny.generator->cached_tokens();

  Result<Generation> two = session.send("Tell me more.", greedy_options(6));
  ASSERT_OK(two);
  // Turn two's prompt: the first exchange and the new user message.
  nlohmann::ordered_json turn_two = nlohmann::ordered_json::array();
  for (size_t i = 0; i < 3; ++i) turn_two.push_back(session.messages()[i]);
  Result<std::vector<int32_t>> rendered =
      encode_chat(*tiny.chat_template, tiny.generator->tokenizer(), turn_two, ChatOptions());
  ASSERT_OK(rendered);
  EXPECT_EQ(two->stats.prompt_tokens, static_cast<int64_t>(rendered->size()));
  EXPECT_EQ(two->stats.prefilled_tokens,
            static_cast<int64_t>(rendered->size() - common_prefix(*rendered, cached)));
  // At least the whole first prompt came from the cache.
  EXPECT_LE(two->stats.prefilled_tokens, two->stats.prompt_tokens - one->stats.prompt_tokens);
  EXPECT_EQ(session.turns(), 2u);

  // The reused cache gives what a fresh model gives for the same conversation.
  TinyModel fresh = load_tiny();
  Result<Generation> check = fresh.generator->generate(*rendered, greedy_options(6));
  ASSERT_OK(check);
  EXPECT_EQ(two->ids, check->ids);

  session.clear();
  EXPECT_EQ(session.turns(), 0u);
  Result<Generation> again = session.send("Hello! Who are you?", greedy_options(6));
  ASSERT_OK(again);
  EXPECT_EQ(again->stats.prompt_tokens, one->stats.prompt_tokens);
  EXPECT_EQ(again->ids, one->ids);
}

TEST(ChatSession, AFailedTurnLeavesTheConversationAsItWas) {
  TinyModel tiny = load_tiny(40);
  ASSERT_TRUE(tiny.generator);
  ChatSession session(*tiny.generator, *tiny.chat_template, ChatOptions());
  ASSERT_OK(session.send("Hi", greedy_options(3)));
  Result<Generation> bad = session.send("caf\xC3", greedy_options(3));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("UTF-8"), std::string::npos) << bad.status().message();
  Result<Generation> long_one = session.send(std::string(200, 'x') + " " + std::string(200, 'y'),
                                             greedy_options(3));
  ASSERT_FALSE(long_one.ok());
  EXPECT_NE(long_one.status().message().find("context of 40"), std::string::npos)
      << long_one.status().message();
  EXPECT_EQ(session.turns(), 1u);
  EXPECT_OK(session.send("Ok", greedy_options(3)));
  EXPECT_EQ(session.turns(), 2u);
}

}  // namespace
}  // namespace kuiper
