// Files and lines from outside are untrusted: every reproducer of the sanitizer and fuzzing
// audit (issue 16) is an error naming the bad value, never an exception past the loader, a
// conversion with undefined behaviour, a division by zero or an allocation the input sized.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "kuiper/base/json_reader.h"
#include "kuiper/model/config.h"
#include "kuiper/model/hf_checkpoint.h"
#include "kuiper/model/safetensors.h"
#include "kuiper/runtime/chat_session.h"
#include "kuiper/tokenizer/chat_template.h"
#include "kuiper/tokenizer/tokenizer.h"
#include "support/assertions.h"
#include "support/cli.h"
#include "support/fixture_checkpoint.h"
#include "support/paths.h"

namespace kuiper {
namespace {

using nlohmann::json;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// The error of a Result that must have failed, or a test failure.
template <typename T>
std::string error_of(const Result<T>& r) {
  EXPECT_FALSE(r.ok());
  return r.ok() ? std::string() : r.status().message();
}

#define EXPECT_MENTIONS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "expected \"" << (part) << "\" in: " << (text)

TEST(JsonReader, ParseNeverThrows) {
  EXPECT_MENTIONS(error_of(parse_json("{\"a\": 1e999}", "x.json")), "x.json is not valid JSON");
  EXPECT_MENTIONS(error_of(parse_json("{\"a\": ", "x.json")), "x.json is not valid JSON");
  EXPECT_MENTIONS(error_of(parse_json<nlohmann::ordered_json>("[1e999]", "line")), "line");
  EXPECT_OK(parse_json("{\"a\": 1e300}", "x.json"));
}

TEST(JsonReader, IntegersAreCheckedForTypeAndRange) {
  const json j = json::parse(R"({"small": 7, "negative": -3, "huge": 18446744073709551615,
                                 "beyond": 1e30, "float": 2e9, "text": "7", "nothing": null})");
  const JsonReader r(j, "cfg");
  EXPECT_EQ(*r.get_int("small", 0, 10), 7);
  EXPECT_MENTIONS(error_of(r.get_int("small", 0, 5)), "cfg: small: 7 is outside [0, 5]");
  EXPECT_MENTIONS(error_of(r.get_int("small", 8, 10)), "cfg: small: 7 is outside [8, 10]");
  EXPECT_MENTIONS(error_of(r.get_int("negative", 0)), "cfg: negative: -3 is outside");
  EXPECT_MENTIONS(error_of(r.get_int("huge")), "cfg: huge: 18446744073709551615 is outside");
  EXPECT_MENTIONS(error_of(r.get_int("beyond")), "cfg: beyond: expected an integer");
  EXPECT_MENTIONS(error_of(r.get_int("float")), "cfg: float: expected an integer");
  EXPECT_MENTIONS(error_of(r.get_int("text")), "cfg: text: expected an integer, got a string");
  EXPECT_MENTIONS(error_of(r.get_int("absent")), "cfg: missing \"absent\"");
  EXPECT_EQ(*r.get_int_or("nothing", 5), 5);
  EXPECT_EQ(*r.get_int_or("absent", 5), 5);
  EXPECT_MENTIONS(error_of(r.get_double("text")), "cfg: text: expected a number");
  EXPECT_MENTIONS(error_of(r.get_string("small")), "cfg: small: expected a string");
  EXPECT_MENTIONS(error_of(r.at("small")->at("x")), "cfg: small: expected an object");
  EXPECT_MENTIONS(error_of(r.at(size_t{0})), "cfg: expected an array");
}

json qwen3_config() {
  return json::parse(test::read_text(test::fixtures_dir() + "/qwen3-tiny/config.json"));
}

std::string from_hf_error(const json& config) { return error_of(ModelConfig::from_hf(config)); }

TEST(UntrustedConfig, WrongTypesAreErrors) {
  json c = qwen3_config();
  c["architectures"] = json::array({6});
  EXPECT_MENTIONS(from_hf_error(c), "architectures[0]: expected a string");
  c["architectures"] = json::array();
  EXPECT_MENTIONS(from_hf_error(c), "\"architectures\" is missing or empty");
  c.erase("architectures");
  EXPECT_MENTIONS(from_hf_error(c), "\"architectures\" is missing or empty");
  c = qwen3_config();
  c["rope_theta"] = "1000000";
  EXPECT_MENTIONS(from_hf_error(c), "rope_theta: expected a number, got a string");
  c = qwen3_config();
  c["eos_token_id"] = json::array({"</s>"});
  EXPECT_MENTIONS(from_hf_error(c), "eos_token_id[0]: expected an integer");
  c = qwen3_config();
  c["tie_word_embeddings"] = "yes";
  EXPECT_MENTIONS(from_hf_error(c), "tie_word_embeddings: expected a boolean");
}

TEST(UntrustedConfig, ZeroHeadsWithoutHeadDimIsAnErrorNotADivision) {
  json c = qwen3_config();
  c.erase("head_dim");
  c["num_attention_heads"] = 0;
  EXPECT_MENTIONS(from_hf_error(c), "num_attention_heads: 0 is outside [1, ");
  // As parsed from a file: the parser stores 0 as an unsigned integer (found by fuzz_config_json).
  c = json::parse(c.dump());
  ASSERT_TRUE(c["num_attention_heads"].is_number_unsigned());
  EXPECT_MENTIONS(from_hf_error(c), "num_attention_heads: 0 is outside [1, ");
}

TEST(UntrustedConfig, IntegersBeyondInt64OrTheLimitsAreErrors) {
  json c = qwen3_config();
  c["vocab_size"] = json::parse("99999999999999999999");  // beyond uint64: a double
  EXPECT_MENTIONS(from_hf_error(c), "vocab_size: expected an integer");
  c = qwen3_config();
  c["hidden_size"] = json::parse("18446744073709551615");
  EXPECT_MENTIONS(from_hf_error(c), "hidden_size: 18446744073709551615 is outside");
  // 2e9 layers would make billions of expected tensors: refused before any is listed.
  c = qwen3_config();
  c["num_hidden_layers"] = json::parse("2e9");
  EXPECT_MENTIONS(from_hf_error(c), "num_hidden_layers: expected an integer");
  c["num_hidden_layers"] = 2000000000;
  EXPECT_MENTIONS(from_hf_error(c), "num_hidden_layers: 2000000000 is outside [1, 1024]");
}

TEST(UntrustedConfig, ModelFileConfigIsRangeChecked) {
  Result<ModelConfig> config = ModelConfig::from_hf(qwen3_config());
  ASSERT_OK(config);
  json j = config->to_json();
  j["num_layers"] = 2000000000;
  EXPECT_MENTIONS(error_of(ModelConfig::from_json(j)),
                  "num_hidden_layers 2000000000 is beyond the limit 1024");
  j = config->to_json();
  j["head_dim"] = 1e300;
  EXPECT_MENTIONS(error_of(ModelConfig::from_json(j)), "config: head_dim: expected an integer");
  j = config->to_json();
  j["eos_token_ids"] = "x";
  EXPECT_MENTIONS(error_of(ModelConfig::from_json(j)), "config: eos_token_ids: expected an array");
}

TEST(UntrustedConfig, VisionSizesAreRangeChecked) {
  json c = json::parse(test::read_text(test::fixtures_dir() + "/qwen3-vl-tiny/config.json"));
  ASSERT_OK(ModelConfig::from_hf(c));
  c["vision_config"]["depth"] = 2000000000;
  EXPECT_MENTIONS(from_hf_error(c), "vision_config: depth: 2000000000 is outside");
  c["vision_config"]["depth"] = 3.5;
  EXPECT_MENTIONS(from_hf_error(c), "vision_config: depth: expected an integer");
}

TEST(UntrustedCheckpoint, HugeNumberInConfigJsonIsAnError) {
  test::TempDir dir;
  write_text(dir.file("config.json"), R"({"architectures": ["Qwen3ForCausalLM"], "rope_theta": 1e999})");
  EXPECT_MENTIONS(error_of(read_hf_checkpoint(dir.path())), "config.json is not valid JSON");
}

TEST(UntrustedCheckpoint, UnsupportedQuantizationIsRefusedByName) {
  test::TempDir dir;
  json c = qwen3_config();
  c["quantization_config"] = {{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}};
  write_text(dir.file("config.json"), c.dump());
  EXPECT_MENTIONS(error_of(read_hf_checkpoint(dir.path())),
                  "quant_method bitsandbytes (fp8, awq or gptq are read) is not supported");
}

// A safetensors file: the 8-byte little-endian header length, the header, then `data` bytes.
void write_safetensors(const std::string& path, const std::string& header, size_t data) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  bytes += header;
  bytes.append(data, '\0');
  write_text(path, bytes);
}

TEST(UntrustedSafetensors, HugeNumbersAndWrongTypesInTheHeaderAreErrors) {
  test::TempDir dir;
  const std::string path = dir.file("model.safetensors");
  write_safetensors(path, R"({"w": {"dtype": "F32", "shape": [1e999], "data_offsets": [0, 4]}})", 4);
  EXPECT_MENTIONS(error_of(SafetensorsFile::open(path)), "header is not valid JSON");
  write_safetensors(path, R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4);
  EXPECT_MENTIONS(error_of(SafetensorsFile::open(path)), "tensor 'w': shape[0]: expected an integer");
  write_safetensors(path,
                    R"({"w": {"dtype": "F32", "shape": [0, 18446744073709551615], "data_offsets": [0, 0]}})",
                    0);
  EXPECT_MENTIONS(error_of(SafetensorsFile::open(path)), "is outside");
  write_safetensors(path, R"({"w": {"dtype": 5, "shape": [1], "data_offsets": [0, 4]}})", 4);
  EXPECT_MENTIONS(error_of(SafetensorsFile::open(path)), "tensor 'w': dtype: expected a string");
  write_safetensors(path, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 4);
  EXPECT_OK(SafetensorsFile::open(path));
}

TEST(UntrustedSafetensors, HugeNumberInTheIndexIsAnError) {
  test::TempDir dir;
  write_text(dir.file("model.safetensors.index.json"),
             R"({"metadata": {"total_size": 1e999}, "weight_map": {}})");
  EXPECT_MENTIONS(error_of(SafetensorsCheckpoint::open(dir.path())),
                  "model.safetensors.index.json is not valid JSON");
}

// The Qwen tokenizer.json with one vocabulary id replaced.
std::string tokenizer_with_id(const std::string& id_text) {
  json t = json::parse(test::read_text(test::tokenizer_dir() + "/tokenizer.json"));
  std::string text = t.dump();
  // The first vocabulary entry ("!": 0), spelled as the test wants the id.
  const std::string entry = "\"!\":0,";
  const size_t at = text.find(entry);
  EXPECT_NE(at, std::string::npos);
  text.replace(at, entry.size(), "\"!\":" + id_text + ",");
  return text;
}

TEST(UntrustedTokenizer, IdsBeyondTheLimitAreRefusedNotAllocated) {
  // 2147483647 would size the id table at about 68 GB.
  EXPECT_MENTIONS(error_of(Tokenizer::from_json(tokenizer_with_id("2147483647"))),
                  "tokenizer.json: model.vocab.!: 2147483647 is outside [0, 16777215]");
  // Beyond int32: once converted with undefined behaviour and reported as a negative id.
  EXPECT_MENTIONS(error_of(Tokenizer::from_json(tokenizer_with_id("4294967296"))),
                  "4294967296 is outside");
  EXPECT_MENTIONS(error_of(Tokenizer::from_json(tokenizer_with_id("-1"))), "-1 is outside");
  EXPECT_MENTIONS(error_of(Tokenizer::from_json(tokenizer_with_id("1e999"))),
                  "tokenizer.json is not valid JSON");
  EXPECT_MENTIONS(error_of(Tokenizer::from_json(tokenizer_with_id("\"0\""))),
                  "expected an integer, got a string");
}

// tokenizer_config.json comes inside the model file: a named template whose "name" is not a
// string once threw nlohmann's type_error out of from_tokenizer_config.
TEST(UntrustedTokenizerConfig, WrongTypesInTheTemplateListAreErrors) {
  EXPECT_MENTIONS(error_of(ChatTemplate::from_tokenizer_config(
                      R"({"chat_template": [{"name": 5, "template": "x"}]})")),
                  "has no \"default\" template");
  EXPECT_MENTIONS(error_of(ChatTemplate::from_tokenizer_config(
                      R"({"chat_template": [7, {"name": "default", "template": 8}]})")),
                  "has no \"default\" template");
  EXPECT_MENTIONS(error_of(ChatTemplate::from_tokenizer_config(R"({"chat_template": 1e999})")),
                  "tokenizer_config.json");
  Result<ChatTemplate> named = ChatTemplate::from_tokenizer_config(
      R"({"chat_template": [{"name": 5}, {"name": "default", "template": "ok"}]})");
  ASSERT_OK(named);
  EXPECT_EQ(*named->render(nlohmann::ordered_json::array(), ChatOptions()), "ok");
}

// A message whose role is not a string (a request from outside) with invalid UTF-8 content
// once threw type_error while the error message was being written.
TEST(UntrustedMessages, ANonStringRoleDoesNotThrowFromTheUtf8Check) {
  const Tokenizer tokenizer = Tokenizer::from_file(test::tokenizer_dir() + "/tokenizer.json").value();
  const ChatTemplate tmpl = ChatTemplate::parse("{{ messages[0].content }}", "", "").value();
  const auto messages = nlohmann::ordered_json::parse(R"([{"role": 5, "content": "a"}])");
  nlohmann::ordered_json bad = messages;
  bad[0]["content"] = std::string("a\xff");
  EXPECT_MENTIONS(error_of(encode_chat(tmpl, tokenizer, bad, ChatOptions())),
                  "message is not valid UTF-8 (byte 1)");
  EXPECT_OK(encode_chat(tmpl, tokenizer, messages, ChatOptions()));
}

}  // namespace
}  // namespace kuiper
