// qwen3_infer / qwen2_infer end to end on the converted tiny fixtures (CPU,
// fp32): one prompt against the greedy continuation transformers produces,
// batch files, the REPL through a pseudo-terminal, and the refusals of bad
// input.
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "kuiper/model/model_file.h"
#include "kuiper/runtime/chat_session.h"
#include "support/assertions.h"
#include "support/cli.h"
#include "support/fixture_checkpoint.h"
#include "support/golden.h"
#include "support/paths.h"

namespace kuiper {
namespace {

using nlohmann::json;
using test::CliResult;

// The CPU kernels use OpenMP; on a machine shared with other jobs, spinning
// worker threads make each token cost a scheduler time slice. Passive waiting
// keeps these runs fast there.
constexpr const char *kChildEnv = "OMP_WAIT_POLICY=passive";

std::vector<json> read_jsonl(const std::string &path) {
  return test::parse_jsonl(test::read_text(path));
}

// The user message whose chat-templated ids are the shared fixtures' golden
// chat.ids.
constexpr const char *kChatPrompt = "Hello! Who are you?";

// A shared fixture's transformers goldens (golden.safetensors), read once.
const test::Golden &golden(const std::string &fixture) {
  static std::map<std::string, test::Golden> loaded;
  auto it = loaded.find(fixture);
  if (it == loaded.end())
    it = loaded.emplace(fixture, test::Golden::load(fixture)).first;
  return it->second;
}

const std::vector<int32_t> &
chat_ids(const std::string &fixture = "qwen3-tiny") {
  return golden(fixture).at("chat.ids").i32;
}

// The converted tiny fixture the infer programs run (CPU, fp32).
std::string fixture_model(const std::string &fixture = "qwen3-tiny") {
  return test::converted_fixture(fixture, DataType::kFp32);
}

// kChatPrompt's ids as the infer programs render it (no system prompt): the
// model file's own tokenizer and chat template, through encode_chat as
// ChatSession calls it.
std::vector<int32_t> rendered_chat_prompt(const std::string &model_path) {
  Result<std::shared_ptr<ModelFile>> file = ModelFile::open(model_path);
  if (!file.ok()) {
    ADD_FAILURE() << file.status().message();
    return {};
  }
  Result<Tokenizer> tokenizer = Tokenizer::from_json((*file)->tokenizer_json());
  Result<ChatTemplate> chat_template =
      ChatTemplate::from_tokenizer_config((*file)->tokenizer_config_json());
  if (!tokenizer.ok() || !chat_template.ok()) {
    ADD_FAILURE() << tokenizer.status().message()
                  << chat_template.status().message();
    return {};
  }
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  messages.push_back({{"role", "user"}, {"content", kChatPrompt}});
  Result<std::vector<int32_t>> ids =
      encode_chat(*chat_template, *tokenizer, messages, ChatOptions());
  EXPECT_OK(ids);
  return ids.ok() ? *ids : std::vector<int32_t>();
}

class InferCli : public ::testing::Test {
protected:
  std::string path(const std::string &name) const { return dir_.file(name); }

  // Runs bin/<program> with `args` and nothing on stdin.
  static CliResult run(const std::string &program,
                       const std::vector<std::string> &args) {
    return test::run_program(program, args, "", kChildEnv);
  }

  // <family>_infer on the <family>-tiny fixture on the CPU, greedy unless
  // `args` say otherwise.
  CliResult infer(const std::string &family,
                  const std::vector<std::string> &args) const {
    std::vector<std::string> all = {
        "--model",       fixture_model(family + "-tiny"),
        "--device",      "cpu",
        "--temperature", "0"};
    all.insert(all.end(), args.begin(), args.end());
    return run(family + "_infer", all);
  }
  CliResult qwen3(const std::vector<std::string> &args) const {
    return infer("qwen3", args);
  }

  void write(const std::string &name, const std::string &text) const {
    std::ofstream(path(name), std::ios::binary) << text;
  }

  test::TempDir dir_;
};

// Acceptance 1: the chat prompt renders to the golden chat.ids, and the greedy
// reply (16 tokens, read back from --output) is exactly the continuation
// transformers produces.
void check_chat_reply(const std::string &fixture, const json &record) {
  ASSERT_EQ(rendered_chat_prompt(fixture_model(fixture)), chat_ids(fixture));
  EXPECT_EQ(record.at("stats").at("prompt_tokens").get<size_t>(),
            chat_ids(fixture).size());
  EXPECT_EQ(record.at("output_ids").get<std::vector<int32_t>>(),
            test::recorded_chat_greedy(fixture));
}

TEST_F(InferCli, Qwen3GreedyChatPromptGivesTheRecordedIds) {
  CliResult r = qwen3({"--prompt", kChatPrompt, "--max-tokens", "16",
                       "--output", path("out.jsonl"), "--stats"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<json> records = read_jsonl(path("out.jsonl"));
  ASSERT_EQ(records.size(), 1u);
  check_chat_reply("qwen3-tiny", records[0]);
  EXPECT_EQ(records[0]["finish_reason"], "length");
  EXPECT_EQ(r.out, records[0]["output"].get<std::string>() + "\n");
  const std::string n = std::to_string(chat_ids().size());
  EXPECT_NE(r.err.find("prompt " + n + " tokens (" + n + " prefilled"),
            std::string::npos)
      << r.err;
}

TEST_F(InferCli, Qwen2GreedyChatPromptGivesTheRecordedIds) {
  CliResult r = infer("qwen2", {"--prompt", kChatPrompt, "--max-tokens", "16",
                                "--ignore-eos", "--output", path("out.jsonl")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<json> records = read_jsonl(path("out.jsonl"));
  ASSERT_EQ(records.size(), 1u);
  check_chat_reply("qwen2-tiny", records[0]);
}

TEST_F(InferCli, StreamingPrintsTheSameText) {
  CliResult plain = qwen3({"--prompt", "Hi there", "--max-tokens", "8",
                           "--output", path("plain.jsonl")});
  CliResult streamed =
      qwen3({"--prompt", "Hi there", "--max-tokens", "8", "--stream"});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(streamed.exit_code, 0) << streamed.err;
  EXPECT_EQ(plain.out, streamed.out);
  EXPECT_EQ(plain.out,
            read_jsonl(path("plain.jsonl"))[0]["output"].get<std::string>() +
                "\n");
}

TEST_F(InferCli, SameSeedSameSample) {
  std::vector<std::string> args = {"--prompt",      "Hi",  "--max-tokens", "10",
                                   "--temperature", "1.2", "--top-k",      "0",
                                   "--seed",        "77",  "--output"};
  args.push_back(path("a.jsonl"));
  ASSERT_EQ(qwen3(args).exit_code, 0);
  args.back() = path("b.jsonl");
  ASSERT_EQ(qwen3(args).exit_code, 0);
  const json a = read_jsonl(path("a.jsonl")).at(0);
  EXPECT_EQ(a["output_ids"], read_jsonl(path("b.jsonl")).at(0)["output_ids"]);
  EXPECT_EQ(a["seed"], 77);
}

// A prompts file's lines without a "seed" take --seed plus their line number less one: the same
// prompt on three lines draws three samples, each the one-shot program's with that line's seed,
// and a blank line still counts.
TEST_F(InferCli, BatchLinesWithoutASeedTakeTheRunSeedPlusTheirLine) {
  write("prompts.txt", "Hi\nHi\n\nHi\n");
  const std::vector<std::string> sampling = {"--max-tokens", "10", "--temperature", "1.2",
                                             "--top-k", "0", "--seed", "77"};
  std::vector<std::string> args = sampling;
  args.insert(args.end(), {"--prompts-file", path("prompts.txt"), "--output", path("b.jsonl")});
  CliResult r = qwen3(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<json> records = read_jsonl(path("b.jsonl"));
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0]["seed"], 77);
  EXPECT_EQ(records[1]["seed"], 78);
  EXPECT_EQ(records[2]["seed"], 80);
  EXPECT_NE(records[0]["output_ids"], records[1]["output_ids"]);
  EXPECT_NE(records[1]["output_ids"], records[2]["output_ids"]);
  // Line 4 alone, one-shot with its seed, samples the same tokens.
  args = sampling;
  args[7] = "80";
  args.insert(args.end(), {"--prompt", "Hi", "--output", path("one.jsonl")});
  r = qwen3(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_jsonl(path("one.jsonl")).at(0)["output_ids"], records[2]["output_ids"]);
}

// The load summary is glog's at --v=1, one line, and absent from a normal run.
TEST_F(InferCli, VerboseRunLogsTheLoadSummaryOnce) {
  const std::string summary = "decode, max_context 4096, KV pool 256 x 16 tokens";
  const CliResult verbose = qwen3({"--prompt", "Hi", "--max-tokens", "2", "--v=1"});
  ASSERT_EQ(verbose.exit_code, 0) << verbose.err;
  const size_t at = verbose.err.find(summary);
  ASSERT_NE(at, std::string::npos) << verbose.err;
  EXPECT_EQ(verbose.err.find(summary, at + 1), std::string::npos) << verbose.err;
  EXPECT_NE(verbose.err.find("cpu, fp32 activations (auto: the CPU computes in fp32), flash2 "
                             "attention, eager decode"),
            std::string::npos)
      << verbose.err;
  const CliResult quiet = qwen3({"--prompt", "Hi", "--max-tokens", "2"});
  ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_EQ(quiet.err.find(summary), std::string::npos) << quiet.err;
}

TEST_F(InferCli, TextBatchGivesOneResultPerLine) {
  write("prompts.txt",
        "Hello! Who are you?\n\nWhat is 2+2?\nTell me a story.\n");
  CliResult r = qwen3({"--prompts-file", path("prompts.txt"), "--max-tokens",
                       "16", "--output", path("out.jsonl")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<json> records = read_jsonl(path("out.jsonl"));
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0]["prompt"], "Hello! Who are you?");
  EXPECT_EQ(records[1]["prompt"], "What is 2+2?");
  EXPECT_EQ(records[2]["id"],
            4); // the line number: the blank line is skipped, not renumbered
  for (const json &record : records) {
    EXPECT_FALSE(record["output_ids"].empty());
    EXPECT_TRUE(record["stats"].contains("decode_tokens_per_second"));
  }
  check_chat_reply("qwen3-tiny", records[0]);
  EXPECT_NE(r.err.find("[3/3]"), std::string::npos) << r.err;
}

// A prompts file as Windows editors save it: a byte order mark first, CRLF line ends.
TEST_F(InferCli, ABatchFileWithAByteOrderMarkAndCrlfReadsAsItsText) {
  write("bom.txt", "\xEF\xBB\xBFWhat is 2+2?\r\nTell me a story.\r\n");
  write("bom.jsonl", "\xEF\xBB\xBF{\"prompt\": \"What is 2+2?\"}\r\n");
  for (const std::string file : {"bom.txt", "bom.jsonl"}) {
    SCOPED_TRACE(file);
    const CliResult r = qwen3({"--prompts-file", path(file), "--max-tokens", "2"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::vector<json> records = test::parse_jsonl(r.out);
    ASSERT_FALSE(records.empty()) << r.out;
    EXPECT_EQ(records[0]["prompt"], "What is 2+2?");
    EXPECT_EQ(records.back()["id"], file == "bom.txt" ? 2 : 1);
  }
}

TEST_F(InferCli, JsonlBatchTakesPromptsMessagesAndPerLineSampling) {
  write(
      "prompts.jsonl",
      R"({"id": "a", "prompt": "Hello! Who are you?"})"
      "\n"
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]})"
      "\n"
      R"({"prompt": "Go on", "temperature": 0.9, "top_p": 0.5, "seed": 5, "max_tokens": 3, "stop": ["zzz"]})"
      "\n");
  CliResult r = qwen3({"--prompts-file", path("prompts.jsonl"), "--max-tokens",
                       "16", "--output", path("out.jsonl")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<json> records = read_jsonl(path("out.jsonl"));
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0]["id"], "a");
  check_chat_reply("qwen3-tiny", records[0]);
  EXPECT_EQ(records[1]["messages"].size(), 2u);
  EXPECT_EQ(records[1]["id"], 2);
  EXPECT_EQ(records[2]["seed"], 5);
  EXPECT_LE(records[2]["output_ids"].size(), 3u);
}

TEST_F(InferCli, BadBatchLinesAreReportedAndTheOthersStillRun) {
  write("prompts.jsonl", R"({"prompt": "first"})"
                         "\n"
                         R"({"prompt": "unterminated)"
                         "\n"
                         R"({"prompt": "typo", "temprature": 1})"
                         "\n"
                         R"({"prompt": "bad top_p", "top_p": 2})"
                         "\n"
                         "{\"prompt\": \"caf\xC3\"}\n"
                         R"({"prompt": "empty stop", "stop": ["x", ""]})"
                         "\n"
                         R"({"prompt": "last"})"
                         "\n");
  CliResult r = qwen3({"--prompts-file", path("prompts.jsonl"), "--max-tokens",
                       "4", "--output", path("out.jsonl")});
  EXPECT_EQ(r.exit_code, 1);
  for (const char *where : {"prompts.jsonl:2:", "prompts.jsonl:3:",
                            "prompts.jsonl:4:", "prompts.jsonl:5:", "prompts.jsonl:6:"}) {
    EXPECT_NE(r.err.find(where), std::string::npos) << where << "\n" << r.err;
  }
  EXPECT_NE(r.err.find("temprature"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("top_p"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\"stop\" cannot hold an empty string"), std::string::npos) << r.err;
  std::vector<json> records = read_jsonl(path("out.jsonl"));
  ASSERT_EQ(records.size(), 7u);
  EXPECT_EQ(records[0]["prompt"], "first");
  EXPECT_TRUE(records[0].contains("output_ids"));
  for (int i = 1; i <= 5; ++i) {
    EXPECT_TRUE(records[i].contains("error")) << records[i];
    EXPECT_EQ(records[i]["line"], i + 1);
  }
  EXPECT_EQ(records[6]["prompt"], "last");
  EXPECT_TRUE(records[6].contains("output_ids"));
}

// Lines run concurrently (--max-batch): the records come out in the file's order, each equal
// to what the line gives when the lines run one at a time, the bad lines are those lines' errors,
// and the progress shows a rate and an ETA.
TEST_F(InferCli, ConcurrentBatchGivesInOrderWhatOneAtATimeGives) {
  std::string lines;
  const char *prompts[] = {"Hello! Who are you?", "What is 2+2?", "Tell me a story.",
                           "Hi", "Name three colours.", "Why is the sky blue?", "Go on"};
  for (int i = 0; i < 7; ++i) {
    lines += json{{"prompt", prompts[i]}, {"max_tokens", 3 + 2 * i}}.dump() + "\n";
    if (i == 1) lines += R"({"prompt": "bad", "top_k": -1})" "\n";
    if (i == 4) lines += "{not json\n";
  }
  lines += R"({"prompt": "sampled", "temperature": 1.0, "seed": 9, "max_tokens": 6})" "\n";
  write("prompts.jsonl", lines);
  std::vector<std::vector<json>> runs;
  for (const char *batch : {"1", "4"}) {
    SCOPED_TRACE(std::string("--max-batch ") + batch);
    const std::string out = path(std::string("out") + batch + ".jsonl");
    CliResult r = qwen3({"--prompts-file", path("prompts.jsonl"), "--max-batch",
                         batch, "--output", out});
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("prompts.jsonl:3: top_k"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("prompts.jsonl:7: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("[10/10]"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("tok/s, ETA "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("8 of 10 prompts done, 2 failed"), std::string::npos) << r.err;
    runs.push_back(read_jsonl(out));
  }
  ASSERT_EQ(runs[0].size(), 10u);
  ASSERT_EQ(runs[1].size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    SCOPED_TRACE("record " + std::to_string(i));
    const bool bad = i == 2 || i == 6;
    EXPECT_EQ(runs[1][i].contains("error"), bad) << runs[1][i];
    EXPECT_EQ(runs[1][i]["id"], runs[0][i]["id"]);
    if (bad) continue;
    EXPECT_EQ(runs[1][i]["output_ids"], runs[0][i]["output_ids"]);
    EXPECT_EQ(runs[1][i]["finish_reason"], runs[0][i]["finish_reason"]);
  }
  EXPECT_EQ(runs[1][0]["prompt"], prompts[0]);
  EXPECT_EQ(runs[1][9]["prompt"], "sampled");
}

// Issue 13's batch-file acceptance at CI scale: a 1000-line file with bad lines of every kind
// runs concurrently; every good line is answered, in the file's order, each bad line is that
// line's error only, and the summary gives the output rate.
TEST_F(InferCli, ThousandLineBatchAnswersEveryGoodLineInOrder) {
  constexpr int kLines = 1000;
  std::string lines;
  std::vector<int> bad;  // 0-based line numbers
  for (int i = 0; i < kLines; ++i) {
    if (i % 97 == 13) {  // a different kind of bad line each time
      bad.push_back(i);
      switch (bad.size() % 4) {
        case 0: lines += "{not json\n"; break;
        case 1: lines += json{{"prompt", "x"}, {"top_p", 2.0}}.dump() + "\n"; break;
        case 2: lines += json{{"prompt", "x"}, {"max_tokens", "many"}}.dump() + "\n"; break;
        case 3: lines += "{\"prompt\": \"bad \xFF\"}\n"; break;
      }
      continue;
    }
    lines += json{{"prompt", "Line " + std::to_string(i) + " says hello."},
                  {"max_tokens", 1 + i % 4}}.dump() + "\n";
  }
  write("prompts.jsonl", lines);
  const std::string out = path("out.jsonl");
  CliResult r = qwen3({"--prompts-file", path("prompts.jsonl"), "--max-batch", "32",
                       "--output", out});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  for (int i : bad) {
    EXPECT_NE(r.err.find("prompts.jsonl:" + std::to_string(i + 1) + ": "), std::string::npos)
        << "line " << i + 1;
  }
  const std::string done = std::to_string(kLines - static_cast<int>(bad.size())) + " of " +
                           std::to_string(kLines) + " prompts done, " +
                           std::to_string(bad.size()) + " failed";
  EXPECT_NE(r.err.find(done), std::string::npos) << r.err.substr(r.err.size() - 400);
  EXPECT_NE(r.err.find("tok/s"), std::string::npos);
  const std::vector<json> records = read_jsonl(out);
  ASSERT_EQ(records.size(), static_cast<size_t>(kLines));
  for (int i = 0; i < kLines; ++i) {
    const json& rec = records[static_cast<size_t>(i)];
    const bool is_bad = std::find(bad.begin(), bad.end(), i) != bad.end();
    ASSERT_EQ(rec.contains("error"), is_bad) << "line " << i + 1 << ": " << rec;
    if (is_bad) continue;
    EXPECT_EQ(rec["prompt"], "Line " + std::to_string(i) + " says hello.");
    ASSERT_TRUE(rec.contains("output_ids")) << rec;
    EXPECT_GE(rec["output_ids"].size(), 1u);
    EXPECT_LE(rec["output_ids"].size(), static_cast<size_t>(1 + i % 4));
  }
}

TEST_F(InferCli, InvalidUtf8InATextBatchFailsOnlyThatLine) {
  write("prompts.txt", "one\ntwo \xFF\xFE\nthree\n");
  CliResult r =
      qwen3({"--prompts-file", path("prompts.txt"), "--max-tokens", "2"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("prompts.txt:2:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("UTF-8"), std::string::npos) << r.err;
  std::vector<json> records =
      test::parse_jsonl(r.out); // without --output they go to stdout
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0]["prompt"], "one");
  EXPECT_TRUE(records[1].contains("error"));
  EXPECT_EQ(records[2]["prompt"], "three");
}

// One line on stderr, exit 1, naming what is wrong.
void expect_refusal(const CliResult &r,
                    const std::vector<std::string> &mentions) {
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  for (const std::string &m : mentions)
    EXPECT_NE(r.err.find(m), std::string::npos) << r.err;
}

// A number beyond a double (1e999) once threw out of the JSON parser and aborted the whole
// batch with its output; now it is that line's error only.
TEST_F(InferCli, AHugeNumberInABatchLineFailsOnlyThatLine) {
  write("prompts.jsonl", R"({"prompt": "first"}
{"prompt": "hot", "temperature": 1e999}
{"prompt": "big", "top_k": 99999999999}
{"prompt": "last"}
)");
  CliResult r = qwen3({"--prompts-file", path("prompts.jsonl"), "--max-tokens",
                       "2", "--output", path("out.jsonl")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("prompts.jsonl:2:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("not valid JSON"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("prompts.jsonl:3: top_k: 99999999999 is outside"),
            std::string::npos) << r.err;
  std::vector<json> records = read_jsonl(path("out.jsonl"));
  ASSERT_EQ(records.size(), 4u);
  EXPECT_TRUE(records[0].contains("output_ids"));
  EXPECT_TRUE(records[1].contains("error"));
  EXPECT_TRUE(records[2].contains("error"));
  EXPECT_TRUE(records[3].contains("output_ids"));
}

TEST_F(InferCli, MaxContextAboveTheModelsMaximumIsRefused) {
  // The fixture's max_position_embeddings is 4096.
  expect_refusal(qwen3({"--prompt", "x", "--max-context", "100000"}),
                 {"--max-context 100000", "maximum of 4096"});
  CliResult r = qwen3({"--prompt", "x", "--max-context", "4096", "--max-tokens", "1"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// --dtype auto (the default: VerboseRunLogsTheLoadSummaryOnce) is fp32 on the CPU, and the load
// summary says why; the CPU has no CUDA graph, so it decodes eagerly unless --cuda-graph asks
// (refused below) and --no-cuda-graph is accepted in either spelling.
TEST_F(InferCli, DtypeAndGraphFlagsOnTheCpu) {
  struct Case {
    std::vector<std::string> flags;
    std::string summary;
  };
  const std::vector<Case> cases = {
      {{"--dtype", "auto", "--no-cuda-graph"}, "fp32 activations (auto: the CPU computes in fp32)"},
      {{"--dtype=fp32", "--nocuda_graph"}, "fp32 activations (requested; checkpoint fp32)"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"--prompt", "Hi", "--max-tokens", "1", "--v=1"};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    const CliResult r = qwen3(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("cpu, " + c.summary + ", flash2 attention, eager decode"),
              std::string::npos)
        << r.err;
  }
}

TEST_F(InferCli, UnwritableOutputFailsBeforeGenerating) {
  const std::string out = path("no-such-dir/out.jsonl");
  CliResult r = qwen3({"--prompt", "x", "--max-tokens", "2", "--output", out});
  expect_refusal(r, {"--output", out, "No such file or directory"});
  EXPECT_EQ(r.out, "");  // nothing was generated
}

TEST_F(InferCli, FlagValuesThatMakeNoSenseAreRefused) {
  expect_refusal(qwen3({"--prompt", "x", "--attention", "fast"}),
                 {"--attention", "mha, flash1 or flash2"});
  expect_refusal(qwen3({"--prompt", "x", "--device", "tpu"}),
                 {"--device", "cpu or cuda"});
  expect_refusal(qwen3({"--prompt", "x", "--top-p", "1.5"}),
                 {"--top-p 1.5", "(0, 1]"});
  expect_refusal(qwen3({"--prompt", "x", "--temperature", "-1"}),
                 {"--temperature", ">= 0"});
  expect_refusal(qwen3({"--prompt", "x", "--min-p", "2"}), {"--min-p"});
  expect_refusal(qwen3({"--prompt", "x", "--max-tokens", "0"}),
                 {"--max-tokens"});
  expect_refusal(qwen3({"--prompt", "x", "--cuda-graph"}),
                 {"--cuda-graph", "--device cuda"});
  expect_refusal(qwen3({"--prompt", "x", "--dtype", "fp8"}),
                 {"--dtype: unknown dtype 'fp8' (expected auto, bf16, fp16 or fp32)"});
  expect_refusal(qwen3({"--prompt", "x", "--dtype", "bf16"}),
                 {"--dtype: bf16 on the cpu: the CPU computes in fp32"});
  expect_refusal(infer("qwen2", {"--prompt", "x", "--no-think"}),
                 {"--no-think"});
  expect_refusal(qwen3({"--prompt", "x", "--stop", ""}), {"--stop needs a non-empty string"});
  expect_refusal(qwen3({"--prompt", "x", "--stop=,"}), {"--stop needs a non-empty string"});
}

TEST_F(InferCli, MissingOrWrongModelIsRefused) {
  expect_refusal(
      run("qwen3_infer", {"--model", path("nope.bin"), "--prompt", "x"}),
      {path("nope.bin")});
  expect_refusal(run("qwen3_infer", {"--prompt", "x"}), {"--model"});
  expect_refusal(run("qwen2_infer", {"--model", fixture_model(), "--prompt",
                                     "x", "--device", "cpu"}),
                 {"qwen3 model", "qwen2"});
  expect_refusal(run("qwen3_infer", {"--model", fixture_model("qwen2-tiny"),
                                     "--prompt", "x", "--device", "cpu"}),
                 {"qwen2 model"});
}

// --help (and -h) lists the program's own flags as people type them and exits 0: not glog's and
// gflags' flags first (--helpfull has those), not gflags' exit 1. A flag's value that reads
// "--help" is a value.
TEST_F(InferCli, HelpListsTheProgramsOwnFlags) {
  for (const std::string program : {"qwen3_infer", "qwen3_vl_infer", "kuiper-convert",
                                    "kuiper-tokenize", "kuiper-logits", "kuiper-server",
                                    "kuiper-bench"}) {
    for (const std::string flag : {"--help", "-h"}) {
      const CliResult r = run(program, {flag});
      SCOPED_TRACE(program + " " + flag);
      EXPECT_EQ(r.exit_code, 0) << r.err;
      EXPECT_NE(r.out.find("Flags (--helpfull"), std::string::npos) << r.out;
      EXPECT_EQ(r.out.find("logbufsecs"), std::string::npos);  // glog's
      EXPECT_EQ(r.out.find("tab_completion_columns"), std::string::npos);  // gflags'
    }
  }
  const CliResult infer = run("qwen3_infer", {"--help"});
  EXPECT_NE(infer.out.find("  --top-p (double, default 0.95)\n"), std::string::npos) << infer.out;
  EXPECT_NE(infer.out.find("  --model (string, default \"\")\n"), std::string::npos);
  EXPECT_NE(run("kuiper-bench", {"--helpfull"}).out.find("logbufsecs"), std::string::npos);
  const CliResult as_value = qwen3({"--prompt", "--help", "--max-tokens", "2"});
  EXPECT_EQ(as_value.exit_code, 0) << as_value.err;
  EXPECT_EQ(as_value.out.find("Flags (--helpfull"), std::string::npos);
}

TEST_F(InferCli, MaxBatchGoesWithAPromptsFile) {
  expect_refusal(qwen3({"--prompt", "x", "--max-batch", "2"}), {"--max-batch", "--prompts-file"});
  write("p.txt", "x\n");
  expect_refusal(qwen3({"--prompts-file", path("p.txt"), "--max-batch", "-1"}), {"--max-batch -1"});
}

TEST_F(InferCli, BadPromptsAreRefused) {
  // The chat-templated prompt is longer than 8 tokens.
  expect_refusal(
      qwen3({"--prompt", kChatPrompt, "--max-context", "8"}),
      {std::to_string(chat_ids().size()) + " tokens", "context of 8"});
  expect_refusal(qwen3({"--prompt", "caf\xC3"}), {"UTF-8"});
  write("empty.txt", "\n  \n");
  expect_refusal(qwen3({"--prompts-file", path("empty.txt")}), {"no prompts"});
  expect_refusal(qwen3({"--prompts-file", path("absent.txt")}), {"absent.txt"});
}

// ----------------------------------------------------------------------------
// the REPL

// A program running on a pseudo-terminal, as a person at a terminal would run
// it.
class Terminal {
public:
  explicit Terminal(const std::vector<std::string> &argv) {
    pid_ = forkpty(&fd_, nullptr, nullptr, nullptr);
    if (pid_ == 0) {
      putenv(const_cast<char *>(kChildEnv));
      std::vector<char *> args;
      for (const std::string &a : argv)
        args.push_back(const_cast<char *>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
  }
  ~Terminal() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0)
      close(fd_);
  }

  bool started() const { return pid_ > 0; }
  const std::string &screen() const { return screen_; }

  void type(const std::string &keys) {
    ASSERT_EQ(::write(fd_, keys.data(), keys.size()),
              static_cast<ssize_t>(keys.size()));
  }

  // Keys for the line editor, once it reads them. It prints its prompt before
  // it puts the terminal in raw mode; keys typed in between are the terminal's,
  // which echoes them a second time and turns a Ctrl-C into a SIGINT that
  // arrives before the editor's read and is lost.
  void type_at_prompt(const std::string &keys) {
    ASSERT_TRUE(read_until([this] {
      termios mode;
      return tcgetattr(fd_, &mode) == 0 && (mode.c_lflag & ICANON) == 0;
    })) << "the terminal never left cooked mode:\n"
        << screen_;
    type(keys);
  }

  // Reads until `text` appears after byte `from` of the output; false on
  // timeout or exit.
  bool wait_for(const std::string &text, size_t from, int seconds = 120) {
    return read_until(
        [&] { return screen_.find(text, from) != std::string::npos; }, seconds);
  }

  // Types a line at the prompt and waits for the next; returns what was printed
  // in between.
  std::string command(const std::string &line) {
    const size_t from = screen_.size();
    type_at_prompt(line + "\r");
    const bool prompted = wait_for("\n> ", from);
    EXPECT_TRUE(prompted) << "no prompt after '" << line << "':\n"
                          << screen_.substr(from);
    return screen_.substr(from);
  }

  int wait_exit(int seconds = 30) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      // Keep draining the output so the program never blocks writing it; once
      // it has closed the terminal, reads fail at once, hence the sleep.
      char buf[4096];
      pollfd p = {fd_, POLLIN, 0};
      const ssize_t n = poll(&p, 1, 100) > 0 ? ::read(fd_, buf, sizeof buf) : 0;
      if (n > 0) {
        screen_.append(buf, static_cast<size_t>(n));
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    return -2;
  }

private:
  // Reads the output until `done()` holds; false on timeout or when the
  // terminal closes.
  template <typename Done> bool read_until(Done done, int seconds = 120) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline)
        return false;
      pollfd p = {fd_, POLLIN, 0};
      if (poll(&p, 1, 10) <= 0)
        continue;
      char buf[4096];
      const ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n <= 0)
        return false;
      screen_.append(buf, static_cast<size_t>(n));
    }
    return true;
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  bool exited_ = false;
  std::string screen_;
};

struct TurnStats {
  int prompt = -1;
  int prefilled = -1;
  int generated = -1;
};

TurnStats parse_stats(const std::string &text) {
  static const std::regex pattern(
      R"(prompt (\d+) tokens \((\d+) prefilled[^|]*\| generated (\d+) tokens)");
  TurnStats s;
  std::smatch m;
  if (std::regex_search(text, m, pattern)) {
    s.prompt = std::stoi(m[1]);
    s.prefilled = std::stoi(m[2]);
    s.generated = std::stoi(m[3]);
  }
  return s;
}

std::vector<std::string> repl_argv(const std::string &max_tokens,
                                   const std::string &context) {
  return {test::bin_dir() + "/qwen3_infer",
          "--model",
          fixture_model(),
          "--device",
          "cpu",
          "-i",
          "--temperature",
          "0",
          "--max-tokens",
          max_tokens,
          "--max-context",
          context};
}

TEST(InferRepl, SecondTurnPrefillsOnlyNewTokensAndClearResets) {
  Terminal term(repl_argv("6", "256"));
  ASSERT_TRUE(term.started());
  ASSERT_TRUE(term.wait_for("> ", 0)) << term.screen();

  term.command(kChatPrompt);
  const TurnStats one = parse_stats(term.command("/stats"));
  EXPECT_EQ(one.prompt, static_cast<int>(chat_ids().size()));
  EXPECT_EQ(one.prefilled, one.prompt);

  term.command("Tell me more.");
  const TurnStats two = parse_stats(term.command("/stats"));
  ASSERT_GT(two.prompt, one.prompt + one.generated);
  // The whole first turn's prompt and most of its reply came from the cache.
  EXPECT_LE(two.prefilled, two.prompt - one.prompt) << term.screen();
  EXPECT_GT(two.prefilled, 0);

  // Ctrl-C at the prompt throws the half-typed line away.
  const size_t before = term.screen().size();
  term.type_at_prompt("abc");
  term.type("\x03");
  ASSERT_TRUE(term.wait_for("\n> ", before)) << term.screen();
  const TurnStats unchanged = parse_stats(term.command("/stats"));
  EXPECT_EQ(unchanged.prompt, two.prompt);

  // Errors of a turn are reported and the chat goes on. (Invalid UTF-8 never
  // gets this far: ReplReadsUtf8InAnyLocaleAndRefusesOtherBytes.)
  std::string too_long;
  for (int i = 0; i < 300; ++i)
    too_long += "word ";
  EXPECT_NE(
      term.command(too_long).find("longer than the context of 256 tokens"),
      std::string::npos)
      << term.screen();

  EXPECT_NE(term.command("/clear").find("new conversation"), std::string::npos);
  term.command(kChatPrompt);
  const TurnStats fresh = parse_stats(term.command("/stats"));
  EXPECT_EQ(fresh.prompt, one.prompt);

  // A message over several lines: a trailing backslash continues it.
  const size_t continued = term.screen().size();
  term.type_at_prompt("Two\\\r");
  ASSERT_TRUE(term.wait_for("... ", continued)) << term.screen();
  term.command("lines");
  const TurnStats multi = parse_stats(term.command("/stats"));
  EXPECT_GT(multi.prompt, 0);

  term.type_at_prompt("\x04"); // Ctrl-D
  EXPECT_EQ(term.wait_exit(), 0) << term.screen();
}

TEST(InferRepl, CtrlCStopsTheReplyAndReturnsToThePrompt) {
  // No token limit and a long context: the reply would run for thousands of
  // tokens.
  std::vector<std::string> argv = repl_argv("-1", "4096");
  argv.push_back("--ignore-eos");
  Terminal term(argv);
  ASSERT_TRUE(term.started());
  ASSERT_TRUE(term.wait_for("> ", 0)) << term.screen();
  const size_t from = term.screen().size();
  term.type_at_prompt("Hello\r");
  // Let some of the reply arrive, then interrupt.
  ASSERT_TRUE(term.wait_for("Hello\r\n", from));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  term.type("\x03");
  ASSERT_TRUE(term.wait_for("[interrupted]", from, 60)) << term.screen();
  ASSERT_TRUE(term.wait_for("\n> ", from));
  const TurnStats stopped = parse_stats(term.command("/stats"));
  EXPECT_GT(stopped.generated, 0);
  EXPECT_LT(stopped.generated, 4000);
  // The session is still alive.
  term.command("/help");
  term.type_at_prompt("/quit\r");
  EXPECT_EQ(term.wait_exit(), 0) << term.screen();
}

// The REPL reads UTF-8 whatever the locale (in "C", a container without LANG, a message with a
// non-ASCII character was dropped without a word), and a line that is not UTF-8 is not sent: the
// user is told and the chat goes on unchanged.
TEST_F(InferCli, ReplReadsUtf8InAnyLocaleAndRefusesOtherBytes) {
  for (const std::string locale : {"C", "C.UTF-8"}) {
    SCOPED_TRACE(locale);
    const CliResult r = test::run_program(
        "qwen3_infer",
        {"--model", fixture_model("qwen3-tiny"), "--device", "cpu", "--temperature", "0",
         "--max-tokens", "2", "-i"},
        "\xE6\x97\xA5\xE6\x9C\xAC\n/stats\ncaf\xE9\n/stats\n",
        std::string(kChildEnv) + " LC_ALL=" + locale);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err.find("no reply yet"), std::string::npos) << r.err;
    const size_t refused = r.err.find("not UTF-8");
    ASSERT_NE(refused, std::string::npos) << r.err;
    // The same statistics before and after the refused line: nothing was sent.
    const TurnStats before = parse_stats(r.err.substr(0, refused));
    const TurnStats after = parse_stats(r.err.substr(refused));
    EXPECT_GT(before.prompt, 0) << r.err;
    EXPECT_EQ(after.prompt, before.prompt) << r.err;
    EXPECT_EQ(after.generated, 2) << r.err;
  }
}

} // namespace
} // namespace kuiper
