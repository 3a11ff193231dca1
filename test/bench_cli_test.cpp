// kuiper-bench's GPU modes (--matmul-only, --attention-only, model): flags no run could use are
// one clear error before the device is looked at (so also on a machine without a GPU), and on a
// GPU every prompt length gives a whole table.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "support/assertions.h"
#include "support/cli.h"
#include "support/paths.h"

namespace kuiper::test {
namespace {

std::string tiny_config() { return test_data_dir() + "/configs/qwen3-mha-tied/config.json"; }

TEST(BenchCli, BadGpuModeFlagsAreOneClearError) {
  struct Bad {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Bad> cases = {
      {{"--matmul-only", "--config", tiny_config(), "--prompt", "0"},
       "--prompt must be >= 1 (the prefill rows)"},
      {{"--matmul-only"}, "--matmul-only needs --config CONFIG.json"},
      {{"--attention-only", "--heads", "6", "--kv-heads", "4"},
       "--heads (6) must be a multiple of --kv-heads (4)"},
      {{"--attention-only", "--kv-heads", "0"}, "--heads, --kv-heads and --head-dim must be >= 1"},
      {{"--attention-only", "--kv-len", "0"},
       "--kv-len, --prefill-len and --block-size must be >= 1"},
      {{"--attention-only", "--decode-grid", "-1"}, "--decode-grid must be >= 0"},
      {{"--attention-only", "--kv-len-spread", "-2"},
       "--kv-len-spread must be >= 0 and below twice --kv-len"},
      {{"--attention-only", "--kv-len", "64", "--kv-len-spread", "128"},
       "--kv-len-spread must be >= 0 and below twice --kv-len"},
      {{"--config", tiny_config(), "--repeat", "0"}, "--repeat must be >= 1"},
      {{"--config", tiny_config(), "--gen", "-1"}, "--prompt must be >= 1 and --gen >= 0"},
  };
  for (const Bad& c : cases) {
    const CliResult r = run_program("kuiper-bench", c.args, "");
    EXPECT_EQ(r.exit_code, 1) << c.message;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line: " << r.err;
  }
}

// --prompt 1 is also the decode row count (and 2 to 16 small batches'): the prefill column is still
// there, every shape's row with its length (the report once read a missing field).
TEST(BenchCli, MatmulOnlyReportsThePrefillOfAnyPromptLength) {
  SKIP_WITHOUT_CUDA();
  for (const char* prompt : {"1", "20"}) {
    SCOPED_TRACE(prompt);
    const CliResult r = run_program(
        "kuiper-bench",
        {"--matmul-only", "--config", tiny_config(), "--dtype", "fp16", "--prompt", prompt}, "");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::istringstream lines(r.out);
    std::string line;
    int rows = 0;
    while (std::getline(lines, line)) {
      if (line.rfind("| ", 0) != 0 || line.find("| weight |") == 0) continue;
      // | weight | N | K | decode us | GB/s | % | prefill T | ...: the seventh cell.
      std::vector<std::string> cells;
      std::istringstream cells_in(line.substr(1));
      std::string cell;
      while (std::getline(cells_in, cell, '|')) cells.push_back(cell);
      ASSERT_GE(cells.size(), 9u) << line;
      EXPECT_EQ(cells[6], " " + std::string(prompt) + " ") << line;
      ++rows;
    }
    EXPECT_EQ(rows, 8) << r.out;  // q, k/v, qkv, o, gate/up, gate+up, down, lm_head
  }
}

}  // namespace
}  // namespace kuiper::test
