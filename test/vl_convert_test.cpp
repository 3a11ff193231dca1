// Qwen3-VL checkpoints -> model file: the config (text_config, interleaved M-RoPE, image tokens,
// vision tower), every text and vision tensor of the fixture, the embedded
// preprocessor_config.json, and the errors a bad VL config must give.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "kuiper/model/hf_checkpoint.h"
#include "kuiper/model/model_file.h"
#include "support/assertions.h"
#include "support/cli.h"
#include "support/fixture_checkpoint.h"
#include "support/paths.h"

namespace kuiper {
namespace {

using nlohmann::json;
using test::TempDir;
namespace fs = std::filesystem;

std::string vl_fixture_dir() { return test::fixtures_dir() + "/qwen3-vl-tiny"; }

json vl_config() { return json::parse(test::read_text(vl_fixture_dir() + "/config.json")); }

std::string from_hf_error(const json& hf) {
  Result<ModelConfig> c = ModelConfig::from_hf(hf);
  return c.ok() ? "<accepted>" : c.status().message();
}

TEST(VlConfig, FromHfReadsTextConfigRopeAndVision) {
  Result<ModelConfig> r = ModelConfig::from_hf(vl_config());
  ASSERT_OK(r);
  const ModelConfig& c = *r;
  EXPECT_EQ(c.arch, Architecture::kQwen3VL);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.intermediate_size, 384);
  EXPECT_EQ(c.num_layers, 3);
  EXPECT_EQ(c.num_heads, 4);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.rope_theta, 5000000.0);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>({151645}));
  EXPECT_EQ(c.mrope_section, std::vector<int64_t>({12, 10, 10}));
  EXPECT_TRUE(c.mrope_interleaved);
  EXPECT_EQ(c.image_token_id, 151655);
  EXPECT_EQ(c.vision_start_token_id, 151652);
  EXPECT_EQ(c.vision_end_token_id, 151653);
  ASSERT_TRUE(c.vision.has_value());
  EXPECT_EQ(c.vision->depth, 3);
  EXPECT_EQ(c.vision->deepstack_visual_indexes, std::vector<int64_t>({0, 2}));
  EXPECT_EQ(c.text_prefix(), "model.language_model.");

  // The engine's own JSON round-trips every field, the vision tower included.
  Result<ModelConfig> back = ModelConfig::from_json(c.to_json());
  ASSERT_OK(back);
  EXPECT_EQ(back->to_json(), c.to_json());
  EXPECT_EQ(back->vision->to_json(), c.vision->to_json());
}

TEST(VlConfig, RopeParametersStyleGivesTheSameConfig) {
  json hf = vl_config();
  json& text = hf["text_config"];
  json rope = text["rope_scaling"];
  rope["rope_theta"] = text["rope_theta"];
  text.erase("rope_scaling");
  text.erase("rope_theta");
  text["rope_parameters"] = rope;
  Result<ModelConfig> a = ModelConfig::from_hf(vl_config()), b = ModelConfig::from_hf(hf);
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_EQ(a->to_json(), b->to_json());
}

TEST(VlConfig, ExpectedTensorsAreTheFixturesTensors) {
  const ModelConfig c = ModelConfig::from_hf(vl_config()).value();
  json listed = json::parse(test::read_text(vl_fixture_dir() + "/tensors.json"));
  std::map<std::string, std::vector<int64_t>> want;
  for (const json& t : listed) want[t["name"]] = t["shape"].get<std::vector<int64_t>>();
  std::map<std::string, std::vector<int64_t>> got;
  for (const TensorSpec& s : expected_tensors(c)) got[s.name] = s.shape;
  EXPECT_EQ(got, want);
  EXPECT_TRUE(got.count("model.language_model.layers.2.self_attn.q_norm.weight"));
  EXPECT_TRUE(got.count("model.visual.deepstack_merger_list.1.linear_fc2.bias"));
}

TEST(VlConfig, BadVlConfigsAreClearErrors) {
  json hf = vl_config();
  hf.erase("text_config");
  EXPECT_EQ(from_hf_error(hf),
            "config.json: Qwen3VLForConditionalGeneration needs a text_config object");

  hf = vl_config();
  hf.erase("vision_config");
  EXPECT_EQ(from_hf_error(hf),
            "config.json: Qwen3VLForConditionalGeneration needs a vision_config object");

  hf = vl_config();
  hf["text_config"]["rope_scaling"].erase("mrope_section");
  EXPECT_EQ(from_hf_error(hf),
            "config.json: text_config has no mrope_section (in rope_scaling or rope_parameters)");

  hf = vl_config();
  hf["text_config"]["rope_scaling"]["mrope_section"] = {16, 10, 10};
  EXPECT_EQ(from_hf_error(hf), "config: mrope_section sums to 36 but head_dim / 2 is 32");

  hf = vl_config();
  hf["text_config"]["rope_scaling"]["mrope_section"] = {22, 10};
  EXPECT_EQ(from_hf_error(hf),
            "config: qwen3_vl needs mrope_section with 3 entries (t, h, w), got 2");

  hf = vl_config();
  hf["text_config"]["rope_scaling"]["mrope_interleaved"] = false;
  EXPECT_EQ(from_hf_error(hf),
            "config: only interleaved M-RoPE (mrope_interleaved: true, Qwen3-VL) is supported");

  hf = vl_config();
  hf.erase("image_token_id");
  EXPECT_EQ(from_hf_error(hf),
            "config: image_token_id -1 is not a token of the vocabulary (151936)");

  hf = vl_config();
  hf["vision_config"]["out_hidden_size"] = 256;
  EXPECT_EQ(from_hf_error(hf),
            "config: the vision tower's out_hidden_size (256) must equal the text hidden_size "
            "(128)");

  hf = vl_config();
  hf["vision_config"]["hidden_act"] = "relu";
  EXPECT_EQ(from_hf_error(hf),
            "vision_config: hidden_act 'relu' is not supported (expected gelu_pytorch_tanh)");

  hf = vl_config();
  hf["architectures"] = {"Qwen2VLForConditionalGeneration"};
  EXPECT_NE(from_hf_error(hf).find("unsupported architecture 'Qwen2VLForConditionalGeneration'"),
            std::string::npos);

  // Text-only configs take no VL fields, and model files of text models stay as they were.
  ModelConfig text = ModelConfig::from_hf(vl_config()).value();
  text.arch = Architecture::kQwen3;
  EXPECT_EQ(text.validate().message(), "config: qwen3 has no vision tower or multimodal rotary "
                                       "embedding");
}

TEST(VlConvert, FixtureKeepsEveryTensorAndThePreprocessorConfig) {
  TempDir dir;
  const std::string hf = dir.file("hf"), out = dir.file("vl.bin");
  ASSERT_OK(test::write_fixture_checkpoint(vl_fixture_dir(), hf));
  Status s = convert_checkpoint(hf, out, std::nullopt);
  ASSERT_OK(s);
  Result<std::shared_ptr<ModelFile>> r = ModelFile::open(out);
  ASSERT_OK(r);
  const ModelFile& mf = **r;
  EXPECT_EQ(mf.config().arch, Architecture::kQwen3VL);
  EXPECT_EQ(mf.metadata()["architecture"], "qwen3_vl");
  ASSERT_TRUE(mf.config().vision.has_value());
  EXPECT_EQ(mf.config().vision->to_json(),
            ModelConfig::from_hf(vl_config()).value().vision->to_json());
  EXPECT_EQ(mf.metadata()["preprocessor_config"],
            json::parse(test::read_text(vl_fixture_dir() + "/preprocessor_config.json")));
  EXPECT_EQ(mf.metadata()["hf_config"], vl_config());

  const std::vector<TensorSpec> specs = expected_tensors(mf.config());
  ASSERT_EQ(mf.tensors().size(), specs.size());
  for (const TensorSpec& spec : specs) {
    Result<Tensor> t = mf.tensor(spec.name);
    ASSERT_OK(t);
    EXPECT_EQ(t->dtype(), DataType::kBf16) << spec.name;
    const std::vector<uint16_t> want = test::fixture_bf16(spec.name, spec.shape);
    ASSERT_EQ(std::memcmp(t->raw(), want.data(), t->nbytes()), 0) << spec.name;
  }
}

TEST(VlConvert, MissingVisionTensorOrPreprocessorConfigIsNamed) {
  TempDir dir;
  const json hf = vl_config();
  std::vector<TensorSpec> tensors = expected_tensors(ModelConfig::from_hf(hf).value());
  std::vector<TensorSpec> without;
  for (const TensorSpec& t : tensors) {
    if (t.name != "model.visual.merger.norm.bias") without.push_back(t);
  }
  ASSERT_OK(test::write_checkpoint(hf, without, dir.file("a")));
  fs::copy_file(vl_fixture_dir() + "/preprocessor_config.json",
                dir.file("a") + "/preprocessor_config.json");
  Status s = convert_checkpoint(dir.file("a"), dir.file("a.bin"), std::nullopt);
  EXPECT_EQ(s.message(), dir.file("a") +
                             ": tensor 'model.visual.merger.norm.bias' is missing from the "
                             "checkpoint");
  EXPECT_FALSE(fs::exists(dir.file("a.bin")));

  // write_checkpoint writes no preprocessor_config.json: a VL model needs one.
  ASSERT_OK(test::write_checkpoint(hf, tensors, dir.file("b")));
  s = convert_checkpoint(dir.file("b"), dir.file("b.bin"), std::nullopt);
  EXPECT_EQ(s.message(), dir.file("b") +
                             ": preprocessor_config.json is missing (the model file embeds the "
                             "image processor settings of a vision model)");
}

TEST(VlConvert, CliConvertsTheFixture) {
  TempDir dir;
  ASSERT_OK(test::write_fixture_checkpoint(vl_fixture_dir(), dir.file("hf")));
  test::CliResult r = test::run_program(
      "kuiper-convert", {"--hf", dir.file("hf"), "--out", dir.file("m.bin"), "--dtype", "fp32"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("wrote " + dir.file("m.bin") + ": qwen3_vl"), std::string::npos) << r.err;
  Result<std::shared_ptr<ModelFile>> mf = ModelFile::open(dir.file("m.bin"));
  ASSERT_OK(mf);
  for (const TensorEntry& e : (*mf)->tensors()) EXPECT_EQ(e.dtype, DataType::kFp32) << e.name;
}

}  // namespace
}  // namespace kuiper
