// kuiper-bench --throughput on the CPU: a tiny random-weight model serving random prompts through
// the Engine, one JSON line and one table row per concurrency, and its refusals.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/cli.h"
#include "support/paths.h"

namespace kuiper::test {
namespace {

using nlohmann::json;

const char* kEnv = "OMP_WAIT_POLICY=passive OMP_NUM_THREADS=2";  // the machine may be shared

std::string tiny_config() { return test_data_dir() + "/configs/qwen3-mha-tied/config.json"; }

// The JSON lines of a run's stdout (the table's lines start with '|').
std::vector<json> points_of(const std::string& out) {
  std::vector<json> points;
  size_t begin = 0;
  while (begin < out.size()) {
    size_t end = out.find('\n', begin);
    if (end == std::string::npos) end = out.size();
    if (out[begin] == '{') points.push_back(json::parse(out.substr(begin, end - begin)));
    begin = end + 1;
  }
  return points;
}

CliResult run_bench(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"--throughput", "--device", "cpu", "--dtype", "fp32",
                                   "--config", tiny_config(), "--num-prompts", "6",
                                   "--input-len", "24", "--output-len", "5",
                                   "--len-jitter", "0.25", "--max-batch-tokens", "32"};
  args.insert(args.end(), extra.begin(), extra.end());
  return run_program("kuiper-bench", args, "", kEnv);
}

TEST(ThroughputCli, ReportsEveryFigurePerConcurrency) {
  const CliResult r = run_bench({"--concurrency", "4,1", "--shared-prefix", "16"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<json> points = points_of(r.out);
  ASSERT_EQ(points.size(), 2u) << r.out;
  for (size_t i = 0; i < points.size(); ++i) {
    const json& p = points[i];
    SCOPED_TRACE(p.dump());
    EXPECT_EQ(p["concurrency"], i == 0 ? 1 : 4);  // the sweep runs in increasing order
    EXPECT_EQ(p["requests"], 6);
    EXPECT_EQ(p["device"], "cpu");
    // Every request ran to its own drawn length (5 +- 25%), the same workload at each point.
    const auto output = p["output_tokens"].get<int64_t>();
    EXPECT_GE(output, 6 * 4);
    EXPECT_LE(output, 6 * 6);
    EXPECT_EQ(output, points[0]["output_tokens"].get<int64_t>());
    EXPECT_EQ(p["prompt_tokens"], points[0]["prompt_tokens"]);
    EXPECT_GE(p["prompt_tokens"].get<int64_t>(), 6 * 18);
    const double seconds = p["seconds"].get<double>();
    ASSERT_GT(seconds, 0.0);
    EXPECT_NEAR(p["output_tok_s"].get<double>(), output / seconds, 1e-6 * output / seconds);
    EXPECT_NEAR(p["total_tok_s"].get<double>(),
                (output + p["prompt_tokens"].get<int64_t>()) / seconds, 1e-3);
    EXPECT_NEAR(p["request_s"].get<double>(), 6 / seconds, 1e-6 * 6 / seconds);
    EXPECT_GT(p["ttft_ms_p50"].get<double>(), 0.0);
    EXPECT_LE(p["ttft_ms_p50"].get<double>(), p["ttft_ms_p99"].get<double>());
    EXPECT_LE(p["ttft_ms_p99"].get<double>(), seconds * 1e3);
    EXPECT_GT(p["itl_ms_p50"].get<double>(), 0.0);
    EXPECT_LE(p["itl_ms_p50"].get<double>(), p["itl_ms_p99"].get<double>());
    EXPECT_GT(p["steps"].get<int64_t>(), 0);
    EXPECT_FALSE(p.contains("roofline_pct")) << "no roofline without a GPU bandwidth";
  }
  // One at a time, every request after the first finds the 16-token system prompt cached.
  EXPECT_GT(points[0]["cached_fraction"].get<double>(), 0.0);
  EXPECT_EQ(points[0]["prefilled_tokens"].get<int64_t>() +
                static_cast<int64_t>(points[0]["cached_fraction"].get<double>() *
                                         points[0]["prompt_tokens"].get<double>() +
                                     0.5),
            points[0]["prompt_tokens"].get<int64_t>());
  // The table: a header and a row per concurrency.
  EXPECT_NE(r.out.find("| attention | concurrency | requests |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| flash2 | 1 | 6 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| flash2 | 4 | 6 |"), std::string::npos) << r.out;
}

TEST(ThroughputCli, DistinctPromptsShareNothing) {
  const CliResult r = run_bench({"--concurrency", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<json> points = points_of(r.out);
  ASSERT_EQ(points.size(), 1u) << r.out;
  EXPECT_EQ(points[0]["cached_fraction"].get<double>(), 0.0);
  EXPECT_EQ(points[0]["prefilled_tokens"], points[0]["prompt_tokens"]);
}

TEST(ThroughputCli, RequestsShorterThanTheWarmUpsFit) {
  // The warm-up generates 4 tokens after up to 16: the model's context must hold that too.
  const CliResult r = run_bench({"--concurrency", "2", "--input-len", "3", "--output-len", "1",
                                 "--len-jitter", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<json> points = points_of(r.out);
  ASSERT_EQ(points.size(), 1u) << r.out;
  EXPECT_EQ(points[0]["output_tokens"], 6);
  EXPECT_EQ(points[0]["itl_ms_p99"], 0.0) << "one token each: no gaps";
}

// --max-context, as the programs take it, widens each request's reach (and the decode graphs'
// tables) but not the KV pool, which stays sized for the workload: the same tokens come out.
TEST(ThroughputCli, MaxContextLeavesThePoolToTheWorkload) {
  const CliResult sized = run_bench({"--concurrency", "2"});
  const CliResult wide = run_bench({"--concurrency", "2", "--max-context", "2048"});
  ASSERT_EQ(sized.exit_code, 0) << sized.err;
  ASSERT_EQ(wide.exit_code, 0) << wide.err;
  const std::vector<json> a = points_of(sized.out), b = points_of(wide.out);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0]["kv_blocks"], a[0]["kv_blocks"]);
  EXPECT_EQ(b[0]["output_tokens"], a[0]["output_tokens"]);
  EXPECT_EQ(b[0]["prompt_tokens"], a[0]["prompt_tokens"]);
}

TEST(ThroughputCli, BadFlagsAreOneClearError) {
  struct Bad {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Bad> cases = {
      {{"--len-jitter", "1.5"}, "--len-jitter must be in [0, 1)"},
      {{"--concurrency", "4,0"}, "--concurrency: '0' is not a positive integer"},
      {{"--device", "tpu"}, "--device: unknown device 'tpu'"},
      {{"--dtype", "fp16"}, "--dtype: fp16 on the cpu: the CPU computes in fp32"},
      {{"--output-len", "0"}, "--output-len must be >= 1"},
      // The tiny config's context is 2048 tokens (the longest request drawn is named too).
      {{"--input-len", "2040"},
       "tokens (--input-len, --len-jitter, --shared-prefix and --output-len) do not fit the "
       "model's context of 2048 tokens"},
      {{"--input-len", "8", "--shared-prefix", "4000"}, "do not fit the model's context of 2048"},
      {{"--max-context", "10"}, "--max-context 10 is shorter than the "},
      {{"--max-context", "4096"}, "--max-context 4096 is past the model's context of 2048 tokens"},
  };
  for (const Bad& c : cases) {
    const CliResult r = run_bench(c.args);
    EXPECT_EQ(r.exit_code, 1) << c.message;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line: " << r.err;
  }
}

}  // namespace
}  // namespace kuiper::test
