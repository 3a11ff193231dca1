// kuiper-logits, the tool the golden checks can be run with by hand: its output file against the
// Hugging Face reference, the decode path against prefill, and its refusals.
#include <gtest/gtest.h>

#include "support/cli.h"
#include "support/fixture_checkpoint.h"
#include "support/golden.h"

namespace kuiper::test {
namespace {

const char* kEnv = "OMP_WAIT_POLICY=passive";  // the machine may be shared: do not spin

TEST(LogitsCli, PrefillAndDecodeWriteTheGoldenLogits) {
  Golden golden = Golden::load("qwen3-tiny");
  const std::vector<int32_t>& ids = golden.at("chat.ids").i32;
  const std::vector<float>& want = golden.at("chat.logits_last").f32;
  const std::string model = converted_fixture("qwen3-tiny", DataType::kFp32);
  TempDir dir;
  // --dtype auto and the graph default resolve to fp32 and eager decode on the CPU.
  for (const char* mode : {"--nodecode", "--decode", "--no-cuda-graph"}) {
    const std::string out = dir.file(std::string(mode) + ".f32");
    CliResult r = run_program(
        "kuiper-logits",
        {"--model", model, "--tokens", ids_flag(ids), "--out", out, "--dtype", "auto", mode}, "",
        kEnv);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::vector<float> got = read_floats(out);
    ASSERT_EQ(got.size(), want.size()) << mode;
    EXPECT_LE(relative_max_error(got.data(), want.data(), want.size()), 1e-4) << mode;
    const int32_t best = top_k(want.data(), want.size(), 1)[0];
    EXPECT_NE(r.out.find("argmax " + std::to_string(best)), std::string::npos) << r.out;
  }
}

TEST(LogitsCli, BadInputIsOneClearError) {
  const std::string model = converted_fixture("qwen3-tiny", DataType::kFp32);
  struct Bad {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Bad> cases = {
      {{"--model", model, "--tokens", "1,2", "--out", "/dev/null", "--attention", "flash3"},
       "--attention: unknown attention 'flash3' (expected mha, flash1 or flash2)"},
      {{"--model", model, "--tokens", "1,x", "--out", "/dev/null"}, "'x' is not a token id"},
      {{"--model", model, "--tokens", "1", "--out", "/dev/null", "--device", "tpu"},
       "--device: unknown device 'tpu'"},
      {{"--model", "/nonexistent/model.bin", "--tokens", "1", "--out", "/dev/null"},
       "/nonexistent/model.bin"},
      {{"--model", model, "--tokens", "999999", "--out", "/dev/null"},
       "outside the vocabulary"},
      {{"--model", model, "--tokens", "1", "--out", "/dev/null", "--dtype", "fp8"},
       "--dtype: unknown dtype 'fp8' (expected auto, bf16, fp16 or fp32)"},
      {{"--model", model, "--tokens", "1", "--out", "/dev/null", "--dtype", "fp16"},
       "--dtype: fp16 on the cpu: the CPU computes in fp32 (expected auto or fp32)"},
      {{"--model", model, "--tokens", "1", "--out", "/dev/null", "--cuda-graph"},
       "--cuda-graph needs --device cuda"},
  };
  for (const Bad& c : cases) {
    CliResult r = run_program("kuiper-logits", c.args, "", kEnv);
    EXPECT_EQ(r.exit_code, 1) << c.message;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line: " << r.err;
  }
}

}  // namespace
}  // namespace kuiper::test
