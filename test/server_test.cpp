// kuiper-server end to end on loopback: the binary serving the converted tiny Qwen3 fixture on
// the CPU, driven by cpp-httplib's client. Every endpoint streaming and not, the sampling
// fields, the refusals (each followed by a request that works), cancellation freeing KV blocks
// (seen in /metrics), authentication, the queue limit, graceful shutdown and a bounded load.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <atomic>
#include <sstream>
#include <chrono>
#include <fstream>
#include <memory>
#include <mutex>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "kuiper/model/model_file.h"
#include "kuiper/runtime/chat_session.h"
#include "support/cli.h"
#include "support/fixture_checkpoint.h"
#include "support/paths.h"

namespace kuiper {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

std::string fixture_model() { return test::converted_fixture("qwen3-tiny", DataType::kFp32); }

// kuiper-server on a free port; SIGTERM and a wait when it goes.
class ServerProcess {
 public:
  explicit ServerProcess(const std::vector<std::string>& extra) {
    log_ = dir_.file("server.log");
    std::vector<std::string> args = {test::bin_dir() + "/kuiper-server", "--model",
                                     fixture_model(), "--port", "0", "--device", "cpu",
                                     "--served-model-name", "tiny", "--max-context", "256"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 2);
      setenv("OMP_WAIT_POLICY", "passive", 1);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    const std::regex listening("listening on http://[^:]+:([0-9]+)");
    for (const auto deadline = Clock::now() + std::chrono::seconds(60); Clock::now() < deadline;) {
      std::smatch m;
      const std::string text = log();
      if (std::regex_search(text, m, listening)) {
        port_ = std::stoi(m[1]);
        return;
      }
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "kuiper-server did not start:\n" << log();
  }
  ~ServerProcess() {
    if (pid_ > 0) terminate();
  }
  int port() const { return port_; }
  std::string log() const { return test::read_text(log_); }
  // SIGTERM; the exit code (-1: killed by a signal or not within `seconds`).
  int terminate(int seconds = 60) {
    kill(pid_, SIGTERM);
    for (const auto deadline = Clock::now() + std::chrono::seconds(seconds); Clock::now() < deadline;) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
    return -1;
  }
  // Resident memory in kB.
  long rss_kb() const {
    std::ifstream status("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    }
    return -1;
  }

 private:
  test::TempDir dir_;
  std::string log_;
  pid_t pid_ = -1;
  int port_ = 0;
};

struct Reply {
  int status = -1;
  json body;
  std::string raw;
};

Reply post(int port, const std::string& path, const std::string& body,
           const httplib::Headers& headers = {},
           const std::string& content_type = "application/json") {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(120);
  Reply reply;
  httplib::Result r = client.Post(path.c_str(), headers, body, content_type.c_str());
  if (!r) {
    reply.raw = httplib::to_string(r.error());
    return reply;
  }
  reply.status = r->status;
  reply.raw = r->body;
  reply.body = json::parse(r->body, nullptr, false);
  return reply;
}
Reply post(int port, const std::string& path, const json& body,
           const httplib::Headers& headers = {}) {
  return post(port, path, body.dump(), headers);
}
Reply get(int port, const std::string& path, const httplib::Headers& headers = {}) {
  httplib::Client client("127.0.0.1", port);
  Reply reply;
  httplib::Result r = client.Get(path.c_str(), headers);
  if (!r) return reply;
  reply.status = r->status;
  reply.raw = r->body;
  reply.body = json::parse(r->body, nullptr, false);
  return reply;
}

// A streamed request: its events' JSON (without [DONE]) and whether [DONE] ended it. With
// `stop_after` > 0 the client hangs up after that many events.
struct Stream {
  int status = -1;
  std::vector<json> events;
  bool done = false;
  std::string raw;
  std::string error;  // the client's, when the request failed
};
Stream post_stream(int port, const std::string& path, const json& body, int stop_after = 0) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(120);
  Stream stream;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.set_header("Content-Type", "application/json");
  req.body = body.dump();
  std::string pending;
  req.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    stream.raw.append(data, size);
    pending.append(data, size);
    for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
      const std::string event = pending.substr(0, end);
      pending.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        stream.done = true;
      } else {
        stream.events.push_back(json::parse(payload, nullptr, false));
      }
    }
    return stop_after <= 0 || static_cast<int>(stream.events.size()) < stop_after;
  };
  httplib::Result r = client.send(req);
  if (r) {
    stream.status = r->status;
  } else {
    stream.error = httplib::to_string(r.error());
  }
  return stream;
}

// The value of a metric line "name value" (or "name{labels} value"); -1 when absent.
double metric(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  }
  return -1;
}

json chat(const std::string& content, int max_tokens, json extra = json::object()) {
  json body = {{"model", "tiny"},
               {"messages", {{{"role", "user"}, {"content", content}}}},
               {"max_tokens", max_tokens},
               {"temperature", 0}};
  body.update(extra);
  return body;
}

std::string content_of(const Reply& reply) {
  return reply.body["choices"][0]["message"]["content"].get<std::string>();
}

class Server : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new ServerProcess({"--max-batch", "8"}); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static int port() { return server_->port(); }
  static ServerProcess* server_;
};
ServerProcess* Server::server_ = nullptr;

TEST_F(Server, HealthModelsAndMetricsAnswer) {
  EXPECT_EQ(get(port(), "/health").status, 200);
  const Reply models = get(port(), "/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.body["object"], "list");
  EXPECT_EQ(models.body["data"][0]["id"], "tiny");
  const Reply metrics = get(port(), "/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_GT(metric(metrics.raw, "kuiper_kv_blocks_total"), 0);
  EXPECT_GE(metric(metrics.raw, "kuiper_requests_running"), 0);
  EXPECT_NE(metrics.raw.find("kuiper_time_to_first_token_seconds_bucket"), std::string::npos);
  EXPECT_NE(metrics.raw.find("kuiper_inter_token_latency_seconds_bucket"), std::string::npos);
  EXPECT_GE(metric(metrics.raw, "kuiper_prefix_cache_hit_rate"), 0);
}

TEST_F(Server, ChatCompletionCountsTokensAndStopsAtMaxTokens) {
  const Reply reply = post(port(), "/v1/chat/completions",
                           chat("Hello! Who are you?", 5, {{"ignore_eos", true}}));
  ASSERT_EQ(reply.status, 200) << reply.raw;
  EXPECT_EQ(reply.body["object"], "chat.completion");
  EXPECT_EQ(reply.body["model"], "tiny");
  EXPECT_EQ(reply.body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(reply.body["choices"][0]["finish_reason"], "length");
  // The prompt as the model file's template renders it.
  auto file = ModelFile::open(fixture_model());
  ASSERT_TRUE(file.ok());
  auto tokenizer = Tokenizer::from_json((*file)->tokenizer_json());
  auto chat_template = ChatTemplate::from_tokenizer_config((*file)->tokenizer_config_json());
  ASSERT_TRUE(tokenizer.ok() && chat_template.ok());
  nlohmann::ordered_json messages = {{{"role", "user"}, {"content", "Hello! Who are you?"}}};
  auto ids = encode_chat(*chat_template, *tokenizer, messages, ChatOptions());
  ASSERT_TRUE(ids.ok());
  const json& usage = reply.body["usage"];
  EXPECT_EQ(usage["prompt_tokens"], ids->size());
  EXPECT_EQ(usage["completion_tokens"], 5);
  EXPECT_EQ(usage["total_tokens"], ids->size() + 5);
  // max_completion_tokens means the same.
  const Reply again = post(port(), "/v1/chat/completions",
                           chat("Hello! Who are you?", 99,
                                {{"ignore_eos", true}, {"max_completion_tokens", 5}}));
  ASSERT_EQ(again.status, 200);
  EXPECT_EQ(content_of(again), content_of(reply));
  EXPECT_EQ(again.body["usage"]["completion_tokens"], 5);
}

TEST_F(Server, StreamedChatIsTheSameTextWithUsageLast) {
  const json body = chat("Tell me a story.", 8, {{"ignore_eos", true}});
  const Reply whole = post(port(), "/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200);
  json streamed = body;
  streamed["stream"] = true;
  streamed["stream_options"] = {{"include_usage", true}};
  const Stream s = post_stream(port(), "/v1/chat/completions", streamed);
  ASSERT_EQ(s.status, 200);
  ASSERT_TRUE(s.done) << s.raw;
  ASSERT_GE(s.events.size(), 3u);
  EXPECT_EQ(s.events[0]["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  std::string finish;
  for (size_t i = 0; i + 1 < s.events.size(); ++i) {
    const json& e = s.events[i];
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    EXPECT_TRUE(e["usage"].is_null());
    const json& choice = e["choices"][0];
    if (choice["delta"].contains("content")) text += choice["delta"]["content"].get<std::string>();
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
  }
  EXPECT_EQ(text, content_of(whole));
  EXPECT_EQ(finish, "length");
  const json& last = s.events.back();
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"], whole.body["usage"]);
}

TEST_F(Server, CompletionTakesTextOrTokenIds) {
  const json body = {{"model", "tiny"}, {"prompt", "The capital of France is"},
                     {"max_tokens", 6}, {"temperature", 0}, {"ignore_eos", true}};
  const Reply text = post(port(), "/v1/completions", body);
  ASSERT_EQ(text.status, 200) << text.raw;
  EXPECT_EQ(text.body["object"], "text_completion");
  EXPECT_EQ(text.body["usage"]["completion_tokens"], 6);
  auto file = ModelFile::open(fixture_model());
  auto tokenizer = Tokenizer::from_json((*file)->tokenizer_json());
  auto ids = tokenizer->encode("The capital of France is");
  ASSERT_TRUE(ids.ok());
  json by_ids = body;
  by_ids["prompt"] = *ids;
  const Reply from_ids = post(port(), "/v1/completions", by_ids);
  ASSERT_EQ(from_ids.status, 200) << from_ids.raw;
  EXPECT_EQ(from_ids.body["choices"][0]["text"], text.body["choices"][0]["text"]);
  EXPECT_EQ(from_ids.body["usage"]["prompt_tokens"], ids->size());
  // Streamed: the same text, then [DONE].
  json streamed = body;
  streamed["stream"] = true;
  const Stream s = post_stream(port(), "/v1/completions", streamed);
  ASSERT_TRUE(s.done);
  std::string joined;
  for (const json& e : s.events) joined += e["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(joined, text.body["choices"][0]["text"]);
}

// A list of prompts: choice p * n + c is prompt p's c-th, the same as the prompt gives alone
// (its choices' seeds are seed, seed + 1, ... as alone); usage counts each prompt once. echo puts
// the prompt's text before each choice's, streamed first.
TEST_F(Server, CompletionTakesAListOfPromptsAndEchoesThem) {
  const std::vector<std::string> prompts = {"The capital of France is", "Once upon a time"};
  auto completion = [](json prompt, json extra) {
    json body = {{"model", "tiny"}, {"prompt", std::move(prompt)}, {"max_tokens", 4},
                 {"temperature", 1.0}, {"seed", 11}, {"ignore_eos", true}};
    body.update(extra);
    return body;
  };
  const Reply both = post(port(), "/v1/completions", completion(prompts, {{"n", 2}}));
  ASSERT_EQ(both.status, 200) << both.raw;
  ASSERT_EQ(both.body["choices"].size(), 4u);
  int64_t prompt_tokens = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    const Reply alone = post(port(), "/v1/completions", completion(prompts[p], {{"n", 2}}));
    ASSERT_EQ(alone.status, 200) << alone.raw;
    prompt_tokens += alone.body["usage"]["prompt_tokens"].get<int64_t>();
    for (size_t c = 0; c < 2; ++c) {
      const json& choice = both.body["choices"][p * 2 + c];
      EXPECT_EQ(choice["index"], p * 2 + c);
      EXPECT_EQ(choice["text"], alone.body["choices"][c]["text"]) << "prompt " << p << " choice " << c;
    }
  }
  EXPECT_NE(both.body["choices"][0]["text"], both.body["choices"][1]["text"]);
  EXPECT_EQ(both.body["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(both.body["usage"]["completion_tokens"], 16);

  const Reply echoed = post(port(), "/v1/completions", completion(prompts, {{"echo", true}}));
  ASSERT_EQ(echoed.status, 200) << echoed.raw;
  for (size_t p = 0; p < prompts.size(); ++p) {
    EXPECT_EQ(echoed.body["choices"][p]["text"],
              prompts[p] + both.body["choices"][p * 2]["text"].get<std::string>());
  }
  // Token-id prompts, streamed: each index's chunks join into its echoed text.
  auto file = ModelFile::open(fixture_model());
  auto tokenizer = Tokenizer::from_json((*file)->tokenizer_json());
  json id_lists = json::array();
  for (const std::string& p : prompts) id_lists.push_back(*tokenizer->encode(p));
  const Stream s = post_stream(port(), "/v1/completions",
                               completion(id_lists, {{"echo", true}, {"stream", true}}));
  ASSERT_TRUE(s.done);
  std::vector<std::string> joined(prompts.size());
  for (const json& e : s.events) {
    joined.at(e["choices"][0]["index"].get<size_t>()) += e["choices"][0]["text"].get<std::string>();
  }
  for (size_t p = 0; p < prompts.size(); ++p) {
    EXPECT_EQ(joined[p], echoed.body["choices"][p]["text"]) << "prompt " << p;
  }
}

TEST_F(Server, SeedsReproduceAndChoicesUseSuccessiveSeeds) {
  const json body = chat("Write a poem.", 8,
                         {{"temperature", 1.0}, {"seed", 7}, {"ignore_eos", true}});
  const Reply a = post(port(), "/v1/chat/completions", body);
  const Reply b = post(port(), "/v1/chat/completions", body);
  ASSERT_EQ(a.status, 200);
  EXPECT_EQ(content_of(a), content_of(b));
  json two = body;
  two["n"] = 2;
  const Reply both = post(port(), "/v1/chat/completions", two);
  ASSERT_EQ(both.status, 200);
  ASSERT_EQ(both.body["choices"].size(), 2u);
  EXPECT_EQ(both.body["choices"][0]["message"]["content"], content_of(a));
  json next = body;
  next["seed"] = 8;
  EXPECT_EQ(both.body["choices"][1]["message"]["content"],
            content_of(post(port(), "/v1/chat/completions", next)));
  EXPECT_EQ(both.body["usage"]["completion_tokens"], 16);
}

TEST_F(Server, StopStringEndsTheTextBeforeIt) {
  const Reply whole = post(port(), "/v1/chat/completions",
                           chat("Count to ten.", 12, {{"ignore_eos", true}}));
  ASSERT_EQ(whole.status, 200);
  const std::string text = content_of(whole);
  // One whole character from the middle of the text.
  auto boundary = [&](size_t i) {
    while (i < text.size() && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) ++i;
    return i;
  };
  const size_t begin = boundary(text.size() / 3 + 1);
  const size_t end = boundary(begin + 1);
  ASSERT_LT(begin, end) << text;
  const std::string stop = text.substr(begin, end - begin);
  const Reply stopped = post(port(), "/v1/chat/completions",
                             chat("Count to ten.", 12, {{"ignore_eos", true}, {"stop", {stop}}}));
  ASSERT_EQ(stopped.status, 200);
  EXPECT_EQ(content_of(stopped), text.substr(0, text.find(stop)));
  EXPECT_EQ(stopped.body["choices"][0]["finish_reason"], "stop");
}

TEST_F(Server, LogprobsComeWithEachToken) {
  const Reply reply = post(port(), "/v1/chat/completions",
                           chat("Hi", 4, {{"ignore_eos", true}, {"logprobs", true},
                                          {"top_logprobs", 3}}));
  ASSERT_EQ(reply.status, 200) << reply.raw;
  const json& content = reply.body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 4u);
  for (const json& token : content) {
    EXPECT_LE(token["logprob"].get<double>(), 0.0);
    ASSERT_EQ(token["top_logprobs"].size(), 3u);
    // Greedy: the sampled token is the most likely one.
    EXPECT_DOUBLE_EQ(token["logprob"].get<double>(),
                     token["top_logprobs"][0]["logprob"].get<double>());
  }
}

// Streamed, each chunk carries the log-probabilities of the tokens it brings: together, one
// per generated token, in order, and the same as the reply without streaming.
TEST_F(Server, StreamedLogprobsComeWithTheirChunks) {
  json body = chat("Hi", 4, {{"ignore_eos", true}, {"logprobs", true}, {"top_logprobs", 2}});
  const Reply whole = post(port(), "/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.raw;
  body["stream"] = true;
  const Stream s = post_stream(port(), "/v1/chat/completions", body);
  ASSERT_EQ(s.status, 200) << s.raw;
  ASSERT_TRUE(s.done);
  json tokens = json::array();
  for (const json& event : s.events) {
    if (!event.contains("choices") || event["choices"].empty()) continue;
    const json& lp = event["choices"][0]["logprobs"];
    if (lp.is_null()) continue;
    for (const json& t : lp["content"]) tokens.push_back(t);
  }
  const json& want = whole.body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(tokens.size(), 4u) << s.raw;
  for (size_t i = 0; i < tokens.size(); ++i) {
    EXPECT_EQ(tokens[i]["token"], want[i]["token"]) << i;
    EXPECT_DOUBLE_EQ(tokens[i]["logprob"].get<double>(), want[i]["logprob"].get<double>()) << i;
  }
}

TEST_F(Server, BadRequestsAreRefusedAndTheServerGoesOn) {
  struct Case {
    const char* what;
    std::string path;
    std::string body;
    const char* param;
  };
  const std::vector<Case> cases = {
      {"malformed JSON", "/v1/chat/completions", "{\"messages\": [", nullptr},
      {"not an object", "/v1/chat/completions", "[1, 2]", nullptr},
      {"no messages", "/v1/chat/completions", R"({"model": "tiny"})", "messages"},
      {"temperature of the wrong type", "/v1/chat/completions",
       chat("hi", 4, {{"temperature", "hot"}}).dump(), "temperature"},
      {"top_p out of range", "/v1/chat/completions", chat("hi", 4, {{"top_p", 0}}).dump(),
       "top_p"},
      {"negative max_tokens", "/v1/chat/completions", chat("hi", -5).dump(), "max_tokens"},
      {"presence_penalty out of range", "/v1/chat/completions",
       chat("hi", 4, {{"presence_penalty", 3}}).dump(), "presence_penalty"},
      {"unknown role", "/v1/chat/completions",
       R"({"messages": [{"role": "wizard", "content": "hi"}]})", "messages[0].role"},
      {"an image for a text model", "/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": [{"type": "image_url",
           "image_url": {"url": "https://example.com/a.png"}}]}]})",
       "messages[0].content[0]"},
      {"prompt longer than the context", "/v1/completions",
       json({{"prompt", std::vector<int>(300, 100)}}).dump(), "prompt"},
      {"token id out of the vocabulary", "/v1/completions",
       json({{"prompt", {1, 2, 1 << 30}}}).dump(), "prompt"},
      {"n out of range", "/v1/completions", json({{"prompt", "hi"}, {"n", 0}}).dump(), "n"},
      {"max_tokens past the context", "/v1/chat/completions", chat("hi", 250).dump(),
       "max_tokens"},
      {"max_completion_tokens past the context", "/v1/completions",
       json({{"prompt", "hi"}, {"max_completion_tokens", 100000}}).dump(), "max_tokens"},
      {"an empty stop string", "/v1/chat/completions", chat("hi", 4, {{"stop", {"x", ""}}}).dump(),
       "stop"},
      {"prompts of two forms", "/v1/completions", json({{"prompt", {json("a"), json({1})}}}).dump(),
       "prompt"},
      {"an empty prompt in a list", "/v1/completions", json({{"prompt", {"a", ""}}}).dump(),
       "prompt"},
      {"more prompts than the server takes at once", "/v1/completions",
       json({{"prompt", std::vector<std::string>(300, "a")}}).dump(), "prompt"},
      {"echo with logprobs", "/v1/completions",
       json({{"prompt", "a"}, {"echo", true}, {"logprobs", 1}}).dump(), "echo"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const Reply reply = post(port(), c.path, c.body);
    EXPECT_EQ(reply.status, 400) << reply.raw;
    ASSERT_TRUE(reply.body.contains("error")) << reply.raw;
    const json& error = reply.body["error"];
    EXPECT_TRUE(error["message"].is_string() && !error["message"].get<std::string>().empty());
    EXPECT_EQ(error["type"], "invalid_request_error");
    EXPECT_TRUE(error.contains("code"));
    if (c.param != nullptr) EXPECT_EQ(error["param"], c.param);
    EXPECT_EQ(post(port(), "/v1/chat/completions", chat("hi", 2)).status, 200);
  }
  const Reply too_long = post(port(), "/v1/completions",
                              json({{"prompt", std::vector<int>(300, 100)}}));
  EXPECT_EQ(too_long.body["error"]["code"], "context_length_exceeded");
  // The context's room after the prompt is a max_tokens that is taken; one more is not.
  const json ids = std::vector<int>(200, 100);
  EXPECT_EQ(post(port(), "/v1/completions", json({{"prompt", ids}, {"max_tokens", 56}})).status,
            200);
  const Reply past = post(port(), "/v1/completions", json({{"prompt", ids}, {"max_tokens", 57}}));
  EXPECT_EQ(past.status, 400);
  EXPECT_EQ(past.body["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(get(port(), "/v1/nothing").status, 404);
}

// As OpenAI's API and vLLM: a model the server does not serve is a 404 (model_not_found), a
// known route asked with another method a 405 that names the one it takes; the server goes on.
TEST_F(Server, UnknownModelIs404AndWrongMethodIs405) {
  const Reply unknown = post(port(), "/v1/chat/completions", chat("hi", 4, {{"model", "gpt-9"}}));
  EXPECT_EQ(unknown.status, 404) << unknown.raw;
  EXPECT_EQ(unknown.body["error"]["code"], "model_not_found");
  EXPECT_EQ(unknown.body["error"]["param"], "model");
  EXPECT_EQ(unknown.body["error"]["type"], "invalid_request_error");

  httplib::Client client("127.0.0.1", port());
  httplib::Result r = client.Get("/v1/chat/completions");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "POST");
  const json body = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(body.contains("error")) << r->body;
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  r = client.Post("/v1/models", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "GET");
  r = client.Delete("/v1/completions");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "POST");
  r = client.Put("/v1/nothing", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(json::parse(r->body, nullptr, false)["error"]["type"], "not_found_error");
  EXPECT_EQ(post(port(), "/v1/chat/completions", chat("hi", 2)).status, 200);
}

// `curl -d` sends application/x-www-form-urlencoded, whose bodies httplib's own read caps at
// 8 KB: the body is read as JSON whatever the type, so a long request is answered; multipart
// form data is refused, and the server goes on.
TEST_F(Server, BodyIsJsonWhateverItsContentType) {
  json body = chat("hi", 2);
  body["user"] = std::string(20000, 'u');  // a field the server ignores: a body past 8 KB
  const Reply form = post(port(), "/v1/chat/completions", body.dump(), {},
                          "application/x-www-form-urlencoded");
  EXPECT_EQ(form.status, 200) << form.raw;
  EXPECT_EQ(form.body["usage"]["completion_tokens"], 2) << form.raw;
  const Reply plain = post(port(), "/v1/chat/completions", body.dump(), {}, "text/plain");
  EXPECT_EQ(plain.status, 200) << plain.raw;
  const Reply multipart = post(port(), "/v1/completions", "--x\r\n\r\nhi\r\n--x--\r\n", {},
                               "multipart/form-data; boundary=x");
  EXPECT_EQ(multipart.status, 415) << multipart.raw;
  EXPECT_EQ(multipart.body["error"]["message"],
            "the request body must be JSON, not multipart/form-data");
  EXPECT_EQ(post(port(), "/v1/chat/completions", chat("hi", 2)).status, 200);
}

TEST_F(Server, ClientThatHangsUpIsCancelledAndItsBlocksFreed) {
  const json body = chat("Go on forever.", 200,
                         {{"ignore_eos", true}, {"stream", true}, {"temperature", 0.7}});
  const Stream s = post_stream(port(), "/v1/chat/completions", body, 3);
  EXPECT_GE(s.events.size(), 3u);
  EXPECT_FALSE(s.done);
  std::string metrics;
  for (const auto deadline = Clock::now() + std::chrono::seconds(30); Clock::now() < deadline;) {
    metrics = get(port(), "/metrics").raw;
    if (metric(metrics, "kuiper_kv_blocks_used") == 0 &&
        metric(metrics, "kuiper_requests_total{status=\"cancelled\"}") >= 1) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(metric(metrics, "kuiper_kv_blocks_used"), 0) << metrics;
  EXPECT_GE(metric(metrics, "kuiper_requests_total{status=\"cancelled\"}"), 1) << metrics;
  EXPECT_EQ(metric(metrics, "kuiper_requests_running"), 0) << metrics;
}

TEST(ServerAuth, ApiKeyIsRequiredOnTheApi) {
  ServerProcess server({"--api-key", "sesame"});
  const json body = chat("hi", 2);
  const Reply none = post(server.port(), "/v1/chat/completions", body);
  EXPECT_EQ(none.status, 401);
  EXPECT_EQ(none.body["error"]["type"], "authentication_error");
  EXPECT_EQ(post(server.port(), "/v1/chat/completions", body,
                 {{"Authorization", "Bearer sesamf"}}).status, 401);
  EXPECT_EQ(post(server.port(), "/v1/chat/completions", body,
                 {{"Authorization", "Bearer sesame"}}).status, 200);
  EXPECT_EQ(get(server.port(), "/v1/models").status, 401);
  EXPECT_EQ(get(server.port(), "/health").status, 200);
}

TEST(ServerQueue, MoreWaitingRequestsThanTheQueueAreRefusedAtOnce) {
  ServerProcess server({"--max-batch", "1", "--max-queue", "1"});
  std::atomic<int> ok{0}, busy{0}, ready{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 6; ++i) {
    clients.emplace_back([&] {
      for (++ready; ready < 6;) std::this_thread::yield();  // all at once
      const Reply r = post(server.port(), "/v1/chat/completions",
                           chat("Go on.", 40, {{"ignore_eos", true}}));
      if (r.status == 200) ++ok;
      if (r.status == 429) {
        EXPECT_EQ(r.body["error"]["code"], "queue_full");
        ++busy;
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_GE(ok.load(), 2);
  EXPECT_GE(busy.load(), 1);
  EXPECT_EQ(ok + busy, 6);
}

TEST(ServerShutdown, SigtermFinishesTheRequestInFlightAndExitsZero) {
  ServerProcess server({});
  Stream s;
  std::thread client([&] {
    s = post_stream(server.port(), "/v1/chat/completions",
                    chat("Go on.", 40, {{"ignore_eos", true}, {"stream", true}}));
  });
  // Wait until the request is running, then ask the server to stop.
  for (const auto deadline = Clock::now() + std::chrono::seconds(30); Clock::now() < deadline;) {
    if (metric(get(server.port(), "/metrics").raw, "kuiper_requests_running") == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(server.terminate(), 0);
  client.join();
  EXPECT_TRUE(s.done) << s.raw;
  ASSERT_GE(s.events.size(), 2u);
  EXPECT_EQ(s.events[s.events.size() - 1]["choices"][0]["finish_reason"], "length");
}

std::string base64(const std::string& bytes) {
  static const char* const kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  uint32_t bits = 0;
  int count = 0;
  for (unsigned char c : bytes) {
    bits = (bits << 8) | c;
    count += 8;
    while (count >= 6) out += kAlphabet[(bits >> (count -= 6)) & 63];
  }
  if (count > 0) out += kAlphabet[(bits << (6 - count)) & 63];
  while (out.size() % 4 != 0) out += '=';
  return out;
}

// Qwen3-VL: an image as a data: URI; any other URL, or bad base64, refused.
TEST(ServerVision, DataUriImagesAreSeenOthersRefused) {
  const std::string model = test::converted_fixture("qwen3-vl-tiny", DataType::kFp32);
  ServerProcess server({"--model", model});
  const std::string png =
      test::read_text(test::fixtures_dir() + "/qwen3-vl-tiny/test_image.png");
  auto with_image = [](const std::string& url) {
    return json{{"model", "tiny"},
                {"max_tokens", 3},
                {"temperature", 0},
                {"messages",
                 {{{"role", "user"},
                   {"content",
                    {{{"type", "image_url"}, {"image_url", {{"url", url}}}},
                     {{"type", "text"}, {"text", "Describe this image."}}}}}}}};
  };
  const Reply seen = post(server.port(), "/v1/chat/completions",
                          with_image("data:image/png;base64," + base64(png)));
  ASSERT_EQ(seen.status, 200) << seen.raw << server.log();
  const Reply text_only = post(server.port(), "/v1/chat/completions",
                               chat("Describe this image.", 3));
  ASSERT_EQ(text_only.status, 200);
  EXPECT_GT(seen.body["usage"]["prompt_tokens"].get<int>(),
            text_only.body["usage"]["prompt_tokens"].get<int>() + 3);
  const Reply fetched = post(server.port(), "/v1/chat/completions",
                             with_image("https://example.com/cat.png"));
  EXPECT_EQ(fetched.status, 400);
  EXPECT_EQ(fetched.body["error"]["code"], "unsupported_image_url");
  EXPECT_EQ(post(server.port(), "/v1/chat/completions",
                 with_image("data:image/png;base64,@@@")).status, 400);
  EXPECT_EQ(post(server.port(), "/v1/chat/completions",
                 with_image("data:image/png;base64," + base64("not a png"))).status, 400);
  EXPECT_EQ(post(server.port(), "/v1/chat/completions",
                 with_image("data:image/png;base64," + base64(png))).status, 200);
}

// The official OpenAI client (test/openai, installed by `npm ci` there, as .ci/run does): a
// chat completion, a streamed one, a completion and a refusal, with an API key.
TEST(ServerOpenAiClient, OfficialClientRunsAgainstTheServer) {
  const std::string dir = test::test_data_dir() + "/../openai";
  if (access((dir + "/node_modules/openai/package.json").c_str(), R_OK) != 0 ||
      system("node --version > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "node or the openai package is missing: run npm ci in " << dir;
  }
  ServerProcess server({"--api-key", "sesame"});
  test::TempDir scratch;
  const std::string command =
      "node " + test::shell_quote(dir + "/client_test.mjs") + " http://127.0.0.1:" +
      std::to_string(server.port()) + "/v1 tiny sesame > " + scratch.file("out") + " 2>&1";
  const int status = std::system(command.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << test::read_text(scratch.file("out")) << server.log();
}

// 200 requests at concurrency 32 (2 to 4 tokens each, to keep CI short), streamed and not,
// every tenth streamed one hung up on after two events: no failures, every finished response whole, KV blocks all back, the memory back
// near its level after the warm-up.
TEST(ServerLoad, TwoHundredRequestsAtConcurrency32) {
  ServerProcess server({"--max-batch", "16"});
  std::mutex failures_mutex;
  std::vector<std::string> failures;
  auto check = [&](bool ok, int i, const std::string& what) {
    if (!ok) {
      std::lock_guard<std::mutex> lock(failures_mutex);
      failures.push_back("request " + std::to_string(i) + ": " + what.substr(0, 400));
    }
    return ok;
  };
  auto one = [&](int i) -> bool {
    const int max_tokens = 2 + i % 3;
    const json body = chat("Request " + std::to_string(i) + ": say something.", max_tokens,
                           {{"temperature", 0.8}, {"seed", i}});
    if (i % 2 == 0) {
      const Reply r = post(server.port(), "/v1/chat/completions", body);
      return check(r.status == 200 && r.body["choices"][0]["finish_reason"].is_string() &&
                       r.body["usage"]["completion_tokens"].get<int>() <= max_tokens &&
                       r.body["choices"][0]["message"]["content"].is_string(),
                   i, std::to_string(r.status) + " " + r.raw);
    }
    json streamed = body;
    streamed["stream"] = true;
    const bool hang_up = i % 10 == 1;
    const Stream s = post_stream(server.port(), "/v1/chat/completions", streamed, hang_up ? 2 : 0);
    if (hang_up) return check(!s.events.empty(), i, s.raw);  // the server's side: below
    return check(s.status == 200 && s.done && !s.events.empty() &&
                     s.events.back()["choices"][0]["finish_reason"].is_string(),
                 i, std::to_string(s.status) + " " + s.error + " " + s.raw);
  };
  auto run = [&](int count) {
    std::atomic<int> next{0}, failed{0};
    std::vector<std::thread> workers;
    for (int w = 0; w < 32; ++w) {
      workers.emplace_back([&] {
        for (int i; (i = next++) < count;) {
          if (!one(i)) ++failed;
        }
      });
    }
    for (std::thread& t : workers) t.join();
    return failed.load();
  };
  EXPECT_EQ(run(32), 0) << failures[0] << server.log();  // warm-up: thread stacks, allocator pools
  const long idle = server.rss_kb();
  EXPECT_EQ(run(200), 0) << failures[0];
  std::string metrics;
  for (const auto deadline = Clock::now() + std::chrono::seconds(30); Clock::now() < deadline;) {
    metrics = get(server.port(), "/metrics").raw;
    if (metric(metrics, "kuiper_kv_blocks_used") == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(metric(metrics, "kuiper_kv_blocks_used"), 0) << metrics;
  EXPECT_EQ(metric(metrics, "kuiper_requests_running"), 0) << metrics;
  EXPECT_EQ(metric(metrics, "kuiper_requests_total{status=\"error\"}"), -1) << metrics;
  const long after = server.rss_kb();
  if (!kSanitized) {
    EXPECT_LT(after, idle + idle / 10 + 16 * 1024) << "idle " << idle << " kB, after " << after;
  }
  EXPECT_EQ(server.terminate(), 0);
}

}  // namespace
}  // namespace kuiper
