// qwen3_vl_infer and kuiper-logits --image end to end on the converted qwen3-vl-tiny fixture:
// the test image with the golden prompt gives the transformers greedy ids (acceptance 5, CPU
// and GPU) and last logits, several images, the REPL's /image, batch lines with "images", and
// the refusals of bad images and of images for a text-only model.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#include <stb_image_write.h>

#include "kuiper/base/allocator.h"
#include "kuiper/tokenizer/tokenizer.h"
#include "support/assertions.h"
#include "support/cli.h"
#include "support/fixture_checkpoint.h"
#include "support/golden.h"
#include "support/paths.h"

namespace kuiper {
namespace {

using nlohmann::json;
using test::CliResult;
using test::ids_flag;
using test::parse_jsonl;
using test::read_floats;

constexpr const char* kChildEnv = "OMP_WAIT_POLICY=passive";  // the machine may be shared
constexpr const char* kFixture = "qwen3-vl-tiny";
// The user text of the goldens' `img` prompt, shown after the test image.
constexpr const char* kImagePrompt = "Describe this image.";

const test::Golden& golden() {
  static const test::Golden* loaded = new test::Golden(test::Golden::load(kFixture));
  return *loaded;
}
const std::vector<int32_t>& img_ids() { return golden().at("img.ids").i32; }
const std::vector<int32_t>& img_greedy() { return golden().at("img.greedy").i32; }

std::string test_image() { return test::fixtures_dir() + "/" + kFixture + "/test_image.png"; }

// The image's <|vision_start|> <|image_pad|> x 70 <|vision_end|> in img.ids.
constexpr size_t kImageTokens = 72;

std::string vl_model() { return test::converted_fixture(kFixture, DataType::kFp32); }

// The text of the golden greedy continuation.
std::string golden_reply() {
  Result<Tokenizer> tokenizer =
      Tokenizer::from_json(test::read_text(test::tokenizer_dir() + "/tokenizer.json"));
  EXPECT_OK(tokenizer);
  return tokenizer.ok() ? tokenizer->decode(img_greedy()) : std::string();
}

// One line on stderr, exit 1, naming what is wrong.
void expect_refusal(const CliResult& r, const std::vector<std::string>& mentions) {
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  for (const std::string& m : mentions) EXPECT_NE(r.err.find(m), std::string::npos) << r.err;
}

class VlCli : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return dir_.file(name); }
  void write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
  }

  static CliResult run(const std::string& program, const std::vector<std::string>& args,
                       const std::string& input = "") {
    return test::run_program(program, args, input, kChildEnv);
  }
  // qwen3_vl_infer on `model` (the converted fixture by default), greedy, on `device`.
  static CliResult vl(const std::vector<std::string>& args, const std::string& input = "",
                      const std::string& device = "cpu", std::string model = "") {
    if (model.empty()) model = vl_model();
    std::vector<std::string> all = {"--model", model, "--device", device, "--temperature", "0"};
    if (device == "cuda") all.insert(all.end(), {"--dtype", "fp32"});
    all.insert(all.end(), args.begin(), args.end());
    return run("qwen3_vl_infer", all, input);
  }

  // The golden prompt with the test image, greedy for as many tokens as img.greedy holds:
  // exactly the golden ids, the whole image prompt prefilled.
  void expect_golden_reply(const std::string& device, const std::string& model = "") {
    const std::string out = path(device + ".jsonl");
    CliResult r = vl({"--image", test_image(), "--prompt", kImagePrompt, "--max-tokens",
                      std::to_string(img_greedy().size()), "--output", out, "--stats"},
                     "", device, model);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::vector<json> records = parse_jsonl(test::read_text(out));
    ASSERT_EQ(records.size(), 1u);
    EXPECT_EQ(records[0]["output_ids"].get<std::vector<int32_t>>(), img_greedy());
    EXPECT_EQ(records[0]["images"], json::array({test_image()}));
    EXPECT_EQ(records[0]["stats"]["prompt_tokens"].get<size_t>(), img_ids().size());
    EXPECT_EQ(r.out, records[0]["output"].get<std::string>() + "\n");
    const std::string n = std::to_string(img_ids().size());
    EXPECT_NE(r.err.find("prompt " + n + " tokens (" + n + " prefilled"), std::string::npos)
        << r.err;
  }

  test::TempDir dir_;
};

// Acceptance 5 on the CPU, with the model file kuiper-convert writes from the fixture's
// checkpoint.
TEST_F(VlCli, GreedyImagePromptGivesTheGoldenIds) {
  const std::string hf = path("hf");
  const Status written = test::write_fixture_checkpoint(test::fixtures_dir() + "/" + kFixture, hf);
  ASSERT_OK(written);
  const std::string model = path("vl.bin");
  CliResult convert =
      run("kuiper-convert", {"--hf", hf, "--out", model, "--dtype", "fp32"});
  ASSERT_EQ(convert.exit_code, 0) << convert.err;
  expect_golden_reply("cpu", model);
}

// Acceptance 5 on the GPU (fp32 activations, as the goldens were computed).
class CudaVlCli : public VlCli {};
TEST_F(CudaVlCli, GreedyImagePromptGivesTheGoldenIds) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  expect_golden_reply("cuda");
}

TEST_F(VlCli, TwoImagesTakeTwoPlaceholders) {
  CliResult r = vl({"--image", test_image(), "--image=" + test_image(), "--prompt",
                    kImagePrompt, "--max-tokens", "2", "--output", path("out.jsonl")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<json> records = parse_jsonl(test::read_text(path("out.jsonl")));
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0]["images"].size(), 2u);
  // The golden prompt and one more image.
  EXPECT_EQ(records[0]["stats"]["prompt_tokens"].get<size_t>(), img_ids().size() + kImageTokens);
}

TEST_F(VlCli, BadImagesAreOneClearError) {
  const std::string png = test::read_text(test_image());
  write("notes.png", "these are notes, not pixels\n");
  write("empty.png", "");
  write("truncated.png", png.substr(0, png.size() / 2));
  for (const std::string& bad : {path("missing.png"), path("notes.png"), path("empty.png"),
                                 path("truncated.png"), dir_.path()}) {
    SCOPED_TRACE(bad);
    expect_refusal(vl({"--image", bad, "--prompt", kImagePrompt}), {bad});
    // A good image first does not hide a bad second one.
    expect_refusal(vl({"--image", test_image(), "--image", bad, "--prompt", kImagePrompt}), {bad});
  }
}

TEST_F(VlCli, ImagesNeedAVisionModel) {
  const std::string text_model = test::converted_fixture("qwen3-tiny", DataType::kFp32);
  expect_refusal(run("qwen3_infer", {"--model", text_model, "--device", "cpu", "--image",
                                     test_image(), "--prompt", "x"}),
                 {"--image", "qwen3 models take no images"});
  expect_refusal(vl({"--image", test_image(), "--prompt", "x"}, "", "cpu", text_model),
                 {"qwen3 model", "qwen3_vl"});
  expect_refusal(run("kuiper-logits", {"--model", text_model, "--tokens", "1,2", "--out",
                                       path("l.f32"), "--image", test_image()}),
                 {"--image", "takes no images"});
  write("p.jsonl", "{\"prompt\": \"x\"}\n");
  expect_refusal(vl({"--image", test_image(), "--prompts-file", path("p.jsonl")}),
                 {"--image", "\"images\""});
  // A pad token typed into the text has no image to stand for.
  expect_refusal(vl({"--prompt", "look: <|image_pad|>"}), {"<|image_pad|>", "0 images"});
}

// The REPL on stdin: a bad /image is reported and the chat goes on; a good one goes with the
// next message, whose reply is the golden one; the next turn keeps the image in the
// conversation.
TEST_F(VlCli, ReplImageCommandAttachesToTheNextMessage) {
  const std::string input = "/image " + path("missing.png") + "\n/image\n/image " + test_image() +
                            "\n" + kImagePrompt + "\nAnd the colours?\n/quit\n";
  CliResult r = vl({"-i", "--max-tokens", std::to_string(img_greedy().size()), "--stats"}, input);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("error: " + path("missing.png")), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("usage: /image PATH"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(test_image() + ": 70 image tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find(golden_reply()), std::string::npos) << r.out;
  // Two replies; the first prompt is img.ids, the second holds the whole conversation.
  const std::string n = std::to_string(img_ids().size());
  EXPECT_NE(r.err.find("prompt " + n + " tokens (" + n + " prefilled"), std::string::npos)
      << r.err;
  size_t replies = 0;
  for (size_t at = r.err.find(" prefilled"); at != std::string::npos;
       at = r.err.find(" prefilled", at + 1)) {
    ++replies;
  }
  EXPECT_EQ(replies, 2u) << r.err;

  // A text-only model has no /image; its chat goes on.
  const std::string text_model = test::converted_fixture("qwen3-tiny", DataType::kFp32);
  CliResult text = run("qwen3_infer", {"--model", text_model, "--device", "cpu", "-i",
                                       "--max-tokens", "2"},
                       "/image " + test_image() + "\nHi\n/quit\n");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.err.find("this model takes no images"), std::string::npos) << text.err;
}

TEST_F(VlCli, JsonlBatchLinesTakeImages) {
  // A second image of the test image's size: the same ids, other pixels.
  std::vector<uint8_t> rgb(96 * 64 * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(i * 7 % 251);
  ASSERT_NE(stbi_write_png(path("other.png").c_str(), 96, 64, 3, rgb.data(), 96 * 3), 0);
  const json good = json::array({test_image()});
  std::string lines;
  lines += json{{"id", "a"}, {"prompt", kImagePrompt}, {"images", good}}.dump() + "\n";
  lines += json{{"prompt", kImagePrompt}, {"images", {path("missing.png")}}}.dump() + "\n";
  lines += json{{"messages", {{{"role", "user"}, {"content", kImagePrompt}, {"images", good}}}}}
               .dump() +
           "\n";
  lines += json{{"prompt", kImagePrompt}, {"images", {path("other.png")}}}.dump() + "\n";
  lines += json{{"messages", {{{"role", "user"}, {"content", kImagePrompt}}}}, {"images", good}}
               .dump() +
           "\n";
  lines += json{{"prompt", kImagePrompt}}.dump() + "\n";
  lines += json{{"prompt", kImagePrompt}, {"images", "a.png"}}.dump() + "\n";
  write("p.jsonl", lines);
  // One line at a time, so each finds the cache the lines before it left.
  CliResult r = vl({"--prompts-file", path("p.jsonl"), "--max-batch", "1", "--max-tokens",
                    std::to_string(img_greedy().size()), "--output", path("out.jsonl")});
  EXPECT_EQ(r.exit_code, 1) << r.err;  // lines 2 and 7 fail
  EXPECT_NE(r.err.find("p.jsonl:2: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(path("missing.png")), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("p.jsonl:7: \"images\" must be a non-empty list"), std::string::npos)
      << r.err;
  std::vector<json> records = parse_jsonl(test::read_text(path("out.jsonl")));
  ASSERT_EQ(records.size(), 7u);
  EXPECT_EQ(records[0]["id"], "a");
  EXPECT_EQ(records[0]["images"], good);
  EXPECT_TRUE(records[1].contains("error"));
  EXPECT_TRUE(records[6].contains("error"));
  // The golden image prompt three ways, each giving the golden ids. The cache (16-token
  // blocks) is reused through an image only when it holds the same pixels: line 3 follows line 1
  // and runs only the last token; line 4's other image starts in the first block, so it runs
  // whole; line 5 finds line 1's blocks still cached and runs only the last token again.
  const std::vector<std::pair<size_t, size_t>> prefilled = {
      {0, img_ids().size()}, {2, 1}, {3, img_ids().size()}, {4, 1}};
  for (const auto& [i, n] : prefilled) {
    SCOPED_TRACE("line " + std::to_string(i + 1));
    ASSERT_TRUE(records[i].contains("output_ids")) << records[i];
    EXPECT_EQ(records[i]["stats"]["prompt_tokens"].get<size_t>(), img_ids().size());
    EXPECT_EQ(records[i]["stats"]["prefilled_tokens"].get<size_t>(), n);
    if (i != 3) EXPECT_EQ(records[i]["output_ids"].get<std::vector<int32_t>>(), img_greedy());
  }
  EXPECT_EQ(records[5]["stats"]["prompt_tokens"].get<size_t>(),
            img_ids().size() - kImageTokens);  // no image
}

// Two images, the second changed: the cache is reused through the first image only, and the
// tokens after it keep the first image's position offset (rope delta).
TEST_F(VlCli, ReuseBetweenTwoImagesGivesTheFreshResult) {
  std::vector<uint8_t> rgb(96 * 64 * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(i * 7 % 251);
  ASSERT_NE(stbi_write_png(path("other.png").c_str(), 96, 64, 3, rgb.data(), 96 * 3), 0);
  const json same = json::array({test_image(), test_image()});
  const json other = json::array({test_image(), path("other.png")});
  std::string lines;
  for (const json& images : {same, other, same}) {
    lines += json{{"prompt", kImagePrompt}, {"images", images}}.dump() + "\n";
  }
  write("p.jsonl", lines);
  CliResult r = vl({"--prompts-file", path("p.jsonl"), "--max-batch", "1", "--max-tokens", "8",
                    "--output", path("out.jsonl")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<json> records = parse_jsonl(test::read_text(path("out.jsonl")));
  ASSERT_EQ(records.size(), 3u);
  const size_t prompt = img_ids().size() + kImageTokens;
  EXPECT_EQ(records[0]["stats"]["prefilled_tokens"].get<size_t>(), prompt);
  // The prefix cache shares whole 16-token blocks. Line 2 differs from line 1 at the second
  // image's first pad (after <|im_start|> user \n, the first image and the second's
  // <|vision_start|>): it reuses the full blocks before that. Line 3 is line 1 again, whose
  // blocks are all still cached: it runs from its last full block on.
  const size_t block = 16, differs = 4 + kImageTokens;
  EXPECT_EQ(records[1]["stats"]["prefilled_tokens"].get<size_t>(),
            prompt - differs / block * block);
  EXPECT_EQ(records[2]["stats"]["prefilled_tokens"].get<size_t>(),
            prompt - (prompt - 1) / block * block);
  EXPECT_EQ(records[2]["output_ids"], records[0]["output_ids"]);
}

// kuiper-logits --image: img.ids with the test image give the golden last logits, through one
// prefill and with the text after the image decoded token by token.
TEST_F(VlCli, LogitsWithImageMatchTheGolden) {
  const std::vector<float>& want = golden().at("img.logits_last").f32;
  for (const char* mode : {"--nodecode", "--decode"}) {
    SCOPED_TRACE(mode);
    const std::string out = path(std::string(mode) + ".f32");
    CliResult r = run("kuiper-logits", {"--model", vl_model(), "--tokens", ids_flag(img_ids()),
                                        "--image", test_image(), "--out", out, mode});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::vector<float> got = read_floats(out);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_LE(test::relative_max_error(got.data(), want.data(), want.size()), 1e-3);
  }
}

TEST_F(VlCli, LogitsImagePadsMustMatchTheImages) {
  std::vector<int32_t> short_ids = img_ids();
  short_ids.erase(short_ids.begin() + 10);  // one pad fewer
  expect_refusal(run("kuiper-logits", {"--model", vl_model(), "--tokens", ids_flag(short_ids),
                                       "--image", test_image(), "--out", path("l.f32")}),
                 {"--tokens", "image 1 needs 70", "has 69"});
  expect_refusal(run("kuiper-logits", {"--model", vl_model(), "--tokens", ids_flag(img_ids()),
                                       "--out", path("l.f32")}),
                 {"1 run", "0 images"});
  expect_refusal(run("kuiper-logits", {"--model", vl_model(), "--tokens", ids_flag(img_ids()),
                                       "--image", test_image(), "--image", test_image(), "--out",
                                       path("l.f32")}),
                 {"1 run", "2 images"});
  expect_refusal(run("kuiper-logits", {"--model", vl_model(), "--tokens", ids_flag(img_ids()),
                                       "--image", path("missing.png"), "--out", path("l.f32")}),
                 {path("missing.png")});
}

}  // namespace
}  // namespace kuiper
