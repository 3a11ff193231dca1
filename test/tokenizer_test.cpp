// The tokenizer must give exactly Hugging Face's ids: checked against the goldens HF tokenizers
// produced for the real Qwen tokenizer, and, for the tokenizer.json features Qwen leaves unused
// (added-token flags, merge ties), against small tokenizers built here whose answers follow from
// HF's documented rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kuiper/tokenizer/byte_level.h"
#include "kuiper/tokenizer/tokenizer.h"
#include "kuiper/tokenizer/utf8.h"
#include "support/assertions.h"
#include "support/paths.h"

namespace kuiper {
namespace {

using nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream file(path);
  EXPECT_TRUE(file) << "cannot open " << path;
  std::stringstream text;
  text << file.rdbuf();
  return json::parse(text.str());
}

std::string qwen_tokenizer_path() { return test::tokenizer_dir() + "/tokenizer.json"; }

// Loading takes most of a second, so the tests share one.
const Result<Tokenizer>& qwen() {
  static const Result<Tokenizer> tokenizer = Tokenizer::from_file(qwen_tokenizer_path());
  return tokenizer;
}

const json& golden_cases() {
  static const json cases =
      read_json(test::fixtures_dir() + "/tokenizer/tokenizer_public.json");
  return cases;
}

bool valid_utf8(const std::string& text) {
  return utf8::find_invalid(text) == std::string::npos;
}

TEST(QwenTokenizer, EncodesGoldenTextsToHuggingFaceIds) {
  ASSERT_OK(qwen());
  ASSERT_FALSE(golden_cases().empty());
  for (const json& c : golden_cases()) {
    const std::string text = c.at("text");
    SCOPED_TRACE(json(text).dump());
    auto ids = qwen()->encode(text);
    ASSERT_OK(ids);
    EXPECT_EQ(ids.value(), c.at("ids").get<std::vector<int32_t>>());
  }
}

TEST(QwenTokenizer, DecodesGoldenIdsToHuggingFaceText) {
  ASSERT_OK(qwen());
  for (const json& c : golden_cases()) {
    SCOPED_TRACE(c.at("text").dump());
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    EXPECT_EQ(qwen()->decode(ids), c.at("decoded").get<std::string>());
    std::string joined;
    for (int32_t id : ids) joined += qwen()->token_bytes(id);
    EXPECT_EQ(joined, c.at("decoded").get<std::string>());
  }
}

TEST(QwenTokenizer, AddedTokensComeFromTokenizerJsonWithTheirFlags) {
  ASSERT_OK(qwen());
  const json file = read_json(qwen_tokenizer_path());
  const json& added = file.at("added_tokens");
  ASSERT_FALSE(added.empty());
  int32_t max_id = static_cast<int32_t>(file.at("model").at("vocab").size()) - 1;
  int64_t special_count = 0;
  for (const json& entry : added) {
    const std::string content = entry.at("content");
    const int32_t id = entry.at("id");
    SCOPED_TRACE(content);
    max_id = std::max(max_id, id);
    EXPECT_EQ(qwen()->token_id(content), id);
    EXPECT_EQ(qwen()->token_text(id), content);
    EXPECT_EQ(qwen()->is_special(id), entry.at("special").get<bool>());
    special_count += entry.at("special").get<bool>();
    // Matched before the regex split, so it stays whole even when glued to other text.
    const std::string text = "say" + content + "now";
    auto ids = qwen()->encode(text);
    ASSERT_OK(ids);
    EXPECT_EQ(std::count(ids->begin(), ids->end(), id), 1);
    EXPECT_EQ(qwen()->decode(ids.value()), text);
    auto alone = qwen()->encode(content);
    ASSERT_OK(alone);
    EXPECT_EQ(alone.value(), std::vector<int32_t>{id});
  }
  EXPECT_EQ(qwen()->vocab_size(), max_id + 1);
  int64_t found_special = 0;
  for (int32_t id = 0; id < qwen()->vocab_size(); ++id) found_special += qwen()->is_special(id);
  EXPECT_EQ(found_special, special_count);
}

TEST(QwenTokenizer, TokenTextAndIdAreInverse) {
  ASSERT_OK(qwen());
  for (int32_t id = 0; id < qwen()->vocab_size(); ++id) {
    const std::string& text = qwen()->token_text(id);
    ASSERT_FALSE(text.empty()) << id;
    ASSERT_EQ(qwen()->token_id(text), id) << text;
  }
  EXPECT_EQ(qwen()->token_id("no such token anywhere"), std::nullopt);
}

TEST(QwenTokenizer, IdsOutsideTheVocabularyDecodeToNothing) {
  ASSERT_OK(qwen());
  const int32_t past_end = static_cast<int32_t>(qwen()->vocab_size());
  EXPECT_EQ(qwen()->token_text(-1), "");
  EXPECT_EQ(qwen()->token_bytes(past_end), "");
  EXPECT_FALSE(qwen()->is_special(past_end));
  const auto ids = golden_cases()[0].at("ids").get<std::vector<int32_t>>();
  std::vector<int32_t> with_strays = ids;
  with_strays.insert(with_strays.begin() + 1, {-7, past_end});
  EXPECT_EQ(qwen()->decode(with_strays), qwen()->decode(ids));
}

TEST(QwenTokenizer, RejectsInvalidUtf8NamingTheByteOffset) {
  ASSERT_OK(qwen());
  const std::pair<std::string, size_t> cases[] = {
      {"ab\xFF" "cd", 2},             // never valid in UTF-8
      {"a\x80", 1},                   // continuation byte without a lead
      {"\xC0\x80", 0},                // overlong NUL
      {"x\xED\xA0\x80", 1},           // UTF-16 surrogate
      {"ok\xF4\x90\x80\x80", 2},      // above U+10FFFF
      {"abc\xE4\xBD", 3},             // cut off at the end
      {"\xE4\xBD\xA0\xE4" "a", 3},    // cut off in the middle, after a valid character
  };
  for (const auto& [text, offset] : cases) {
    SCOPED_TRACE("bad byte expected at offset " + std::to_string(offset));
    auto ids = qwen()->encode(text);
    ASSERT_FALSE(ids.ok());
    EXPECT_NE(ids.status().message().find("offset " + std::to_string(offset)), std::string::npos)
        << ids.status().message();
  }
}

TEST(QwenTokenizer, EncodesEmptyTextAndNulBytes) {
  ASSERT_OK(qwen());
  auto empty = qwen()->encode("");
  ASSERT_OK(empty);
  EXPECT_TRUE(empty->empty());
  const std::string with_nul("a\0b", 3);
  auto ids = qwen()->encode(with_nul);
  ASSERT_OK(ids);
  EXPECT_EQ(qwen()->decode(ids.value()), with_nul);
}

TEST(QwenTokenizer, RoundTripsRandomNfcText) {
  ASSERT_OK(qwen());
  // Code points from several scripts, whitespace kinds and emoji, all NFC-stable on their own
  // and with no combining marks, so decode(encode(s)) must give s back.
  const std::vector<char32_t> pool = {'a', 'Z', '0', '9', ' ', '\n', '\t', '\r', '\'', '.', '<',
                                      '|', 0xA0, 0x3000, 0x4F60, 0x597D, 0x3042, 0xAC00, 0x416,
                                      0x3A9, 0x1F600, 0x1F1E8, 0x85, 0x200B, 0xFF10, 0x2167};
  std::mt19937 rng(7);
  for (int round = 0; round < 300; ++round) {
    std::string text;
    const int length = std::uniform_int_distribution<int>(1, 40)(rng);
    for (int i = 0; i < length; ++i) utf8::append_code_point(pool[rng() % pool.size()], &text);
    auto ids = qwen()->encode(text);
    ASSERT_OK(ids);
    ASSERT_EQ(qwen()->decode(ids.value()), text);
  }
}

TEST(QwenTokenizer, CopiesShareTheLoadedTables) {
  ASSERT_OK(qwen());
  const Tokenizer copy = qwen().value();
  EXPECT_EQ(&copy.token_text(0), &qwen()->token_text(0));
}

// The single-byte tokens, found by what they decode to.
std::vector<int32_t> byte_tokens(const Tokenizer& tokenizer) {
  std::vector<int32_t> ids(256, -1);
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    const std::string& bytes = tokenizer.token_bytes(id);
    if (bytes.size() == 1 && !tokenizer.is_special(id)) ids[static_cast<uint8_t>(bytes[0])] = id;
  }
  return ids;
}

std::string stream(const Tokenizer& tokenizer, const std::vector<int32_t>& ids,
                   std::vector<std::string>* pieces) {
  StreamDecoder decoder(tokenizer);
  std::string text;
  for (int32_t id : ids) {
    pieces->push_back(decoder.feed(id));
    text += pieces->back();
  }
  pieces->push_back(decoder.flush());
  return text + pieces->back();
}

TEST(StreamDecoder, GoldenIdsStreamToGoldenTextInValidPieces) {
  ASSERT_OK(qwen());
  for (const json& c : golden_cases()) {
    SCOPED_TRACE(c.at("text").dump());
    std::vector<std::string> pieces;
    EXPECT_EQ(stream(qwen().value(), c.at("ids").get<std::vector<int32_t>>(), &pieces),
              c.at("decoded").get<std::string>());
    for (const std::string& piece : pieces) EXPECT_TRUE(valid_utf8(piece)) << piece;
  }
}

TEST(StreamDecoder, HoldsBackACharacterSplitOverByteTokens) {
  ASSERT_OK(qwen());
  const std::vector<int32_t> byte = byte_tokens(qwen().value());
  ASSERT_EQ(std::count(byte.begin(), byte.end(), -1), 0);
  StreamDecoder decoder(qwen().value());
  const std::string ni = "\xE4\xBD\xA0";  // 你
  EXPECT_EQ(decoder.feed(byte[0xE4]), "");
  EXPECT_EQ(decoder.feed(byte[0xBD]), "");
  EXPECT_EQ(decoder.feed(byte[0xA0]), ni);
  const std::string grin = "\xF0\x9F\x98\x80";  // 😀
  for (size_t i = 0; i + 1 < grin.size(); ++i) {
    EXPECT_EQ(decoder.feed(byte[static_cast<uint8_t>(grin[i])]), "");
  }
  EXPECT_EQ(decoder.feed(byte[0x80]), grin);
  EXPECT_EQ(decoder.flush(), "");
}

TEST(StreamDecoder, JoinsAMultiByteTokenToTheRestOfItsCharacter) {
  ASSERT_OK(qwen());
  // Emoji share their first bytes, so the vocabulary has a token for the first two.
  int32_t emoji_start = -1;
  for (int32_t id = 0; id < qwen()->vocab_size() && emoji_start < 0; ++id) {
    if (qwen()->token_bytes(id) == "\xF0\x9F") emoji_start = id;
  }
  ASSERT_GE(emoji_start, 0);
  const std::vector<int32_t> byte = byte_tokens(qwen().value());
  StreamDecoder decoder(qwen().value());
  const auto hello = qwen()->token_id("Hello");
  ASSERT_TRUE(hello.has_value());
  EXPECT_EQ(decoder.feed(*hello), "Hello");
  EXPECT_EQ(decoder.feed(emoji_start), "");
  EXPECT_EQ(decoder.feed(byte[0x8E]), "");
  EXPECT_EQ(decoder.feed(byte[0x89]), "\xF0\x9F\x8E\x89");  // 🎉
}

TEST(StreamDecoder, BytesThatCannotBecomeUtf8ComeOutAsReplacementCharacters) {
  ASSERT_OK(qwen());
  const std::vector<int32_t> byte = byte_tokens(qwen().value());
  const std::string fffd(utf8::kReplacement);
  StreamDecoder decoder(qwen().value());
  EXPECT_EQ(decoder.feed(byte[0xFF]), fffd);
  EXPECT_EQ(decoder.feed(byte[0xE4]), "");
  EXPECT_EQ(decoder.feed(byte['a']), fffd + "a");  // the lead byte lost its character
  EXPECT_EQ(decoder.feed(byte[0xE4]), "");
  EXPECT_EQ(decoder.feed(byte[0xBD]), "");
  const auto im_end = qwen()->token_id("<|im_end|>");
  ASSERT_TRUE(im_end.has_value());
  EXPECT_EQ(decoder.feed(*im_end), fffd + "<|im_end|>");
  EXPECT_EQ(decoder.feed(byte[0xF0]), "");
  EXPECT_EQ(decoder.flush(), fffd);  // the stream ended inside a character
  EXPECT_EQ(decoder.flush(), "");
}

TEST(StreamDecoder, MatchesDecodeOnRandomTokenSoup) {
  ASSERT_OK(qwen());
  const std::vector<int32_t> byte = byte_tokens(qwen().value());
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> any_id(0, static_cast<int32_t>(qwen()->vocab_size()) - 1);
  for (int round = 0; round < 2000; ++round) {
    std::vector<int32_t> ids(std::uniform_int_distribution<int>(1, 12)(rng));
    // Mostly single bytes, where characters get split and broken.
    for (int32_t& id : ids) id = rng() % 4 == 0 ? any_id(rng) : byte[0x80 + rng() % 0x80];
    std::vector<std::string> pieces;
    ASSERT_EQ(stream(qwen().value(), ids, &pieces), qwen()->decode(ids));
    for (const std::string& piece : pieces) ASSERT_TRUE(valid_utf8(piece));
  }
}

// A small byte-level tokenizer with Qwen's pipeline and options: the 256 byte tokens have the
// byte's value as id, then `extra_vocab` from id 256 on.
json tiny_tokenizer(const std::vector<std::string>& extra_vocab, json merges, json added) {
  static const json qwen_pipeline = [] {
    json tokenizer = read_json(qwen_tokenizer_path());
    tokenizer["model"].erase("vocab");
    tokenizer["model"].erase("merges");
    return tokenizer;
  }();
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level::encode(std::string(1, static_cast<char>(b)))] = b;
  for (size_t i = 0; i < extra_vocab.size(); ++i) vocab[extra_vocab[i]] = 256 + i;
  json tokenizer = qwen_pipeline;
  tokenizer["model"]["vocab"] = std::move(vocab);
  tokenizer["model"]["merges"] = std::move(merges);
  tokenizer["added_tokens"] = std::move(added);
  return tokenizer;
}

json merge_pair(const std::string& left, const std::string& right) {
  return json::array({left, right});
}

json added_token(int id, const std::string& content, const std::string& flag) {
  json token = {{"id", id},         {"content", content}, {"single_word", false},
                {"lstrip", false},  {"rstrip", false},    {"normalized", false},
                {"special", false}};
  if (!flag.empty()) token[flag] = true;
  return token;
}

std::vector<int32_t> bytes_of(const std::string& text) { return {text.begin(), text.end()}; }

std::vector<int32_t> encode_ok(const Tokenizer& tokenizer, const std::string& text) {
  auto ids = tokenizer.encode(text);
  EXPECT_OK(ids);
  return ids.ok() ? ids.value() : std::vector<int32_t>{};
}

TEST(TinyTokenizer, EqualRankMergesGoLeftmostFirst) {
  // The pair form and the older "left right" string form.
  for (const json& merges : {json::array({merge_pair("a", "a")}), json::array({"a a"})}) {
    auto tokenizer = Tokenizer::from_json(tiny_tokenizer({"aa"}, merges, json::array()).dump());
    ASSERT_OK(tokenizer);
    EXPECT_EQ(encode_ok(tokenizer.value(), "aaa"), (std::vector<int32_t>{256, 'a'}));
    EXPECT_EQ(encode_ok(tokenizer.value(), "aaaa"), (std::vector<int32_t>{256, 256}));
  }
}

TEST(TinyTokenizer, LowerRankMergesFirst) {
  // "abc": (b, c) outranks (a, b), so the result is a + bc, although a + b comes first.
  auto tokenizer = Tokenizer::from_json(
      tiny_tokenizer({"bc", "ab"}, json::array({merge_pair("b", "c"), merge_pair("a", "b")}),
                     json::array())
          .dump());
  ASSERT_OK(tokenizer);
  EXPECT_EQ(encode_ok(tokenizer.value(), "abc"), (std::vector<int32_t>{'a', 256}));
  EXPECT_EQ(encode_ok(tokenizer.value(), "abd"), (std::vector<int32_t>{257, 'd'}));
}

TEST(TinyTokenizer, AddedTokenFlagsStripSpaceAndRequireWholeWords) {
  const json added = {added_token(300, "<mask>", "lstrip"), added_token(301, "[R]", "rstrip"),
                      added_token(302, "word", "single_word"),
                      added_token(303, "\xC3\xA9", "normalized")};  // é, composed
  auto tokenizer = Tokenizer::from_json(tiny_tokenizer({}, json::array(), added).dump());
  ASSERT_OK(tokenizer);
  const Tokenizer& t = tokenizer.value();
  EXPECT_EQ(encode_ok(t, "x  <mask>"), (std::vector<int32_t>{'x', 300}));
  EXPECT_EQ(encode_ok(t, "[R] \t y"), (std::vector<int32_t>{301, 'y'}));
  EXPECT_EQ(encode_ok(t, "a word."), (std::vector<int32_t>{'a', ' ', 302, '.'}));
  EXPECT_EQ(encode_ok(t, "swordfish"), bytes_of("swordfish"));
  EXPECT_EQ(encode_ok(t, "words"), bytes_of("words"));
  // Decomposed e + U+0301 becomes é under NFC, so the normalized added token matches it.
  EXPECT_EQ(encode_ok(t, "e\xCC\x81"), (std::vector<int32_t>{303}));
}

TEST(TinyTokenizer, LongestAddedTokenWinsAtTheSamePosition) {
  const json added = {added_token(300, "<a>", ""), added_token(301, "<a><b>", "")};
  auto tokenizer = Tokenizer::from_json(tiny_tokenizer({}, json::array(), added).dump());
  ASSERT_OK(tokenizer);
  EXPECT_EQ(encode_ok(tokenizer.value(), "<a><b><a>"), (std::vector<int32_t>{301, 300}));
}

TEST(TinyTokenizer, RefusesFilesItCannotFollowByName) {
  const json base = tiny_tokenizer({}, json::array(), json::array());
  const auto error_for = [](const json& tokenizer) {
    auto result = Tokenizer::from_json(tokenizer.dump());
    return result.ok() ? std::string("loaded") : result.status().message();
  };
  json wordpiece = base;
  wordpiece["model"]["type"] = "WordPiece";
  EXPECT_NE(error_for(wordpiece).find("WordPiece"), std::string::npos) << error_for(wordpiece);
  json nfkc = base;
  nfkc["normalizer"] = {{"type", "NFKC"}};
  EXPECT_NE(error_for(nfkc).find("NFKC"), std::string::npos) << error_for(nfkc);
  json dangling = base;
  dangling["model"]["merges"] = json::array({merge_pair("a", "zz")});
  EXPECT_NE(error_for(dangling).find("zz"), std::string::npos) << error_for(dangling);
  json missing_byte = base;
  missing_byte["model"]["vocab"].erase("a");
  EXPECT_NE(error_for(missing_byte).find("byte 97"), std::string::npos) << error_for(missing_byte);
  json bad_regex = base;
  bad_regex["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  EXPECT_NE(error_for(bad_regex).find("regex"), std::string::npos) << error_for(bad_regex);
  json no_model = base;
  no_model.erase("model");
  EXPECT_NE(error_for(no_model).find("model"), std::string::npos) << error_for(no_model);
  EXPECT_NE(error_for(json("not an object")), "loaded");
  auto not_json = Tokenizer::from_json("{\"model\": ");
  EXPECT_FALSE(not_json.ok());
}

TEST(TinyTokenizer, FromFileNamesAMissingFile) {
  auto tokenizer = Tokenizer::from_file("/nonexistent/tokenizer.json");
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_NE(tokenizer.status().message().find("/nonexistent/tokenizer.json"), std::string::npos);
}

}  // namespace
}  // namespace kuiper
