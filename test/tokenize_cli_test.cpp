// kuiper-tokenize end to end: the built binary, driven through a shell, must reproduce the
// Hugging Face goldens in both directions and keep going past bad lines.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "support/cli.h"
#include "support/fixture_checkpoint.h"
#include "support/paths.h"

namespace kuiper {
namespace {

using nlohmann::json;
using test::CliResult;
using test::read_text;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

const json& golden_cases() {
  static const json cases =
      json::parse(read_text(test::fixtures_dir() + "/tokenizer/tokenizer_public.json"));
  return cases;
}

class TokenizeCli : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return dir_.file(name); }

  // Runs kuiper-tokenize with `flags` (space-separated, no quoting), feeding it `input`.
  CliResult run(const std::string& flags, const std::string& input) const {
    std::vector<std::string> args;
    std::istringstream words(flags);
    for (std::string w; words >> w;) args.push_back(w);
    return test::run_program("kuiper-tokenize", args, input);
  }

  test::TempDir dir_;
};

std::string tokenizer_flag() {
  return "--tokenizer " + test::tokenizer_dir() + "/tokenizer.json";
}

TEST_F(TokenizeCli, EncodesEachJsonStringLineToTheGoldenIds) {
  std::string input;
  for (const json& c : golden_cases()) input += c.at("text").dump() + "\n";
  const CliResult r = run(tokenizer_flag(), input);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), golden_cases().size());
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(json::parse(lines[i]), golden_cases()[i].at("ids")) << golden_cases()[i].at("text");
  }
}

TEST_F(TokenizeCli, DecodesEachIdArrayLineToTheGoldenText) {
  std::string input;
  for (const json& c : golden_cases()) input += c.at("ids").dump() + "\n";
  const CliResult r = run(tokenizer_flag() + " --decode", input);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), golden_cases().size());
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(json::parse(lines[i]), golden_cases()[i].at("decoded")) << lines[i];
  }
}

TEST_F(TokenizeCli, ReportsBadLinesByNumberAndEncodesTheRest) {
  const json& a = golden_cases()[0];
  const json& b = golden_cases()[1];
  const std::string input = a.at("text").dump() + "\n" +  // 1
                            "\"unterminated\n" +           // 2: not JSON
                            b.at("text").dump() + "\n" +  // 3
                            "[1, 2]\n" +                   // 4: not a string
                            "\"bad \xFF byte\"\n" +        // 5: not UTF-8
                            a.at("text").dump() + "\n";   // 6
  const CliResult r = run(tokenizer_flag(), input);
  EXPECT_NE(r.exit_code, 0);
  for (const char* reported : {"line 2:", "line 4:", "line 5:"}) {
    EXPECT_NE(r.err.find(reported), std::string::npos) << reported << " in\n" << r.err;
  }
  for (const char* fine : {"line 1:", "line 3:", "line 6:"}) {
    EXPECT_EQ(r.err.find(fine), std::string::npos) << fine << " in\n" << r.err;
  }
  const auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 6u) << r.out;
  EXPECT_EQ(json::parse(lines[0]), a.at("ids"));
  EXPECT_EQ(lines[1], "null");
  EXPECT_EQ(json::parse(lines[2]), b.at("ids"));
  EXPECT_EQ(lines[3], "null");
  EXPECT_EQ(lines[4], "null");
  EXPECT_EQ(json::parse(lines[5]), a.at("ids"));
}

TEST_F(TokenizeCli, ReportsBadIdLinesByNumberAndDecodesTheRest) {
  const json& a = golden_cases()[0];
  const std::string input = a.at("ids").dump() + "\n" +  // 1
                            "[1, 999999999]\n" +          // 2: out of range
                            "[-1]\n" +                    // 3: out of range
                            "[\"one\"]\n" +               // 4: not an id
                            "{}\n" +                      // 5: not an array
                            a.at("ids").dump() + "\n";   // 6
  const CliResult r = run(tokenizer_flag() + " --decode", input);
  EXPECT_NE(r.exit_code, 0);
  for (const char* reported : {"line 2:", "line 3:", "line 4:", "line 5:"}) {
    EXPECT_NE(r.err.find(reported), std::string::npos) << reported << " in\n" << r.err;
  }
  EXPECT_NE(r.err.find("999999999"), std::string::npos) << r.err;
  const auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 6u) << r.out;
  EXPECT_EQ(json::parse(lines[0]), a.at("decoded"));
  for (size_t i = 1; i < 5; ++i) EXPECT_EQ(lines[i], "null");
  EXPECT_EQ(json::parse(lines[5]), a.at("decoded"));
}

// nlohmann throws out_of_range, not parse_error, for a number beyond a double: such a line is
// an error like any other, in both directions, never an abort.
TEST_F(TokenizeCli, NumbersBeyondADoubleAreBadLines) {
  const json& a = golden_cases()[0];
  for (const bool decode : {false, true}) {
    const std::string fine = (decode ? a.at("ids") : a.at("text")).dump() + "\n";
    const CliResult r = run(tokenizer_flag() + (decode ? " --decode" : ""),
                            fine + "1e999\n[1e999]\n" + fine);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    for (const char* reported : {"line 2:", "line 3:"}) {
      EXPECT_NE(r.err.find(reported), std::string::npos) << reported << " in\n" << r.err;
    }
    const auto lines = lines_of(r.out);
    ASSERT_EQ(lines.size(), 4u) << r.out << r.err;
    EXPECT_EQ(lines[1], "null");
    EXPECT_EQ(lines[2], "null");
    EXPECT_EQ(lines[0], lines[3]);
    EXPECT_NE(lines[0], "null");
  }
}

TEST_F(TokenizeCli, ReadsTheTokenizerEmbeddedInAModelFile) {
  const std::string model = test::converted_fixture("qwen3-tiny", DataType::kBf16);
  ASSERT_FALSE(model.empty());
  std::string input;
  for (const json& c : golden_cases()) input += c.at("text").dump() + "\n";
  const CliResult r = run("--model " + model, input);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), golden_cases().size());
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(json::parse(lines[i]), golden_cases()[i].at("ids")) << golden_cases()[i].at("text");
  }
}

TEST_F(TokenizeCli, MissingTokenizerFileIsOneClearError) {
  const CliResult r = run("--tokenizer " + path("absent.json"), "\"hi\"\n");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find(path("absent.json")), std::string::npos) << r.err;
  EXPECT_EQ(lines_of(r.err).size(), 1u) << r.err;
}

TEST_F(TokenizeCli, UnreadableTokenizerIsOneClearError) {
  std::ofstream(path("broken.json")) << "{\"model\": {\"type\": \"BPE\"";
  const CliResult r = run("--tokenizer " + path("broken.json"), "\"hi\"\n");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(path("broken.json")), std::string::npos) << r.err;
  EXPECT_EQ(lines_of(r.err).size(), 1u) << r.err;
}

TEST_F(TokenizeCli, MissingModelFileIsOneClearError) {
  const CliResult r = run("--model " + path("absent.bin"), "\"hi\"\n");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(path("absent.bin")), std::string::npos) << r.err;
  EXPECT_EQ(lines_of(r.err).size(), 1u) << r.err;
}

TEST_F(TokenizeCli, NeedsExactlyOneTokenizerSource) {
  EXPECT_EQ(run("", "\"hi\"\n").exit_code, 2);
  EXPECT_EQ(run(tokenizer_flag() + " --model x.bin", "\"hi\"\n").exit_code, 2);
}

TEST_F(TokenizeCli, BenchReportsThroughputOnStderr) {
  std::string text;
  for (const json& c : golden_cases()) text += c.at("text").get<std::string>() + "\n";
  std::ofstream(path("bench.txt"), std::ios::binary) << text;
  const CliResult r =
      run(tokenizer_flag() + " --bench " + path("bench.txt") + " --bench_runs 1", "");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("MB/s"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kuiper
