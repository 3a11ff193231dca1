// Hugging Face checkpoint -> model file: the fixture recipe, the safetensors reader, the
// converter (library and kuiper-convert CLI) and the errors each must name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "kuiper/model/hf_checkpoint.h"
#include "kuiper/model/model_file.h"
#include "kuiper/model/safetensors.h"
#include "support/assertions.h"
#include "support/cli.h"
#include "support/fixture_checkpoint.h"
#include "support/paths.h"
#include "support/tensors.h"

namespace kuiper {
namespace {

using nlohmann::json;
using test::CheckpointOptions;
using test::TempDir;
namespace fs = std::filesystem;

using test::read_text;

json fixture_config(const std::string& name) {
  return json::parse(read_text(test::fixtures_dir() + "/" + name + "/config.json"));
}

// qwen3-tiny with a small vocabulary: every code path, a fraction of the bytes.
json small_qwen3_config() {
  json c = fixture_config("qwen3-tiny");
  c["vocab_size"] = 512;
  return c;
}

std::shared_ptr<ModelFile> open_ok(const std::string& path) {
  Result<std::shared_ptr<ModelFile>> r = ModelFile::open(path);
  EXPECT_OK(r);
  return r.ok() ? *r : nullptr;
}

std::string convert_error(const std::string& hf_dir, const std::string& out,
                          std::optional<DataType> dtype = std::nullopt) {
  Status s = convert_checkpoint(hf_dir, out, dtype);
  return s.ok() ? "<converted without error>" : s.message();
}

// The tensor's values as floats, whatever its dtype.
std::vector<float> floats_of(const ModelFile& mf, const std::string& name) {
  return test::host_floats(mf.tensor(name));
}

std::vector<float> recipe_floats(const std::string& name, const std::vector<int64_t>& shape) {
  std::vector<uint16_t> bits = test::fixture_bf16(name, shape);
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = bf16_to_float(bits[i]);
  return out;
}

bool same_bytes(const ModelFile& a, const ModelFile& b, const std::string& name) {
  Result<Tensor> ta = a.tensor(name), tb = b.tensor(name);
  return ta.ok() && tb.ok() && ta->dtype() == tb->dtype() && ta->nbytes() == tb->nbytes() &&
         std::memcmp(ta->raw(), tb->raw(), ta->nbytes()) == 0;
}

TEST(FixtureCheckpoint, RecipeMatchesDetweights) {
  EXPECT_EQ(test::fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(test::fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  // First and last values as detweights.py computes them.
  std::vector<uint16_t> norm = test::fixture_bf16("model.norm.weight", {128});
  EXPECT_EQ(std::vector<uint16_t>(norm.begin(), norm.begin() + 4),
            (std::vector<uint16_t>{0x3f69, 0x3f77, 0x3f6f, 0x3f7d}));
  EXPECT_EQ(norm.back(), 0x3f68);
  std::vector<uint16_t> bias = test::fixture_bf16("model.layers.0.self_attn.q_proj.bias", {256});
  EXPECT_EQ(std::vector<uint16_t>(bias.begin(), bias.begin() + 4),
            (std::vector<uint16_t>{0x3c95, 0x3c26, 0xbca4, 0x3c71}));
  EXPECT_EQ(bias.back(), 0x3d0f);
  std::vector<uint16_t> embed = test::fixture_bf16("model.embed_tokens.weight", {151936, 128});
  EXPECT_EQ(std::vector<uint16_t>(embed.begin(), embed.begin() + 4),
            (std::vector<uint16_t>{0xbd21, 0xbd3a, 0x3dfd, 0xbe1a}));
  EXPECT_EQ(embed.back(), 0xbdb8);
}

TEST(FixtureCheckpoint, Qwen3TinyIsBitIdenticalToDetweights) {
  TempDir dir;
  Status s = test::write_fixture_checkpoint(test::fixtures_dir() + "/qwen3-tiny", dir.path());
  ASSERT_OK(s);
  // Size and FNV-1a 64 of the whole model.safetensors that detweights.py writes.
  const std::string bytes = read_text(dir.file("model.safetensors"));
  EXPECT_EQ(bytes.size(), 39883072u);
  EXPECT_EQ(test::fnv1a64(bytes), 0xcff47ca10c536f7bull);
  EXPECT_EQ(read_text(dir.file("config.json")),
            read_text(test::fixtures_dir() + "/qwen3-tiny/config.json"));
  EXPECT_EQ(read_text(dir.file("tokenizer.json")),
            read_text(test::tokenizer_dir() + "/tokenizer.json"));
  EXPECT_FALSE(fs::exists(dir.file("tensors.json")));
}

TEST(Safetensors, ReadsShapesDtypesAndData) {
  TempDir dir;
  CheckpointOptions f32;
  f32.dtype = DataType::kFp32;
  ASSERT_OK(test::write_checkpoint(small_qwen3_config(), dir.path(), f32));
  Result<SafetensorsFile> f = SafetensorsFile::open(dir.file("model.safetensors"));
  ASSERT_OK(f);
  const SafetensorsTensor* norm = nullptr;
  for (const SafetensorsTensor& t : f->tensors()) {
    if (t.name == "model.norm.weight") norm = &t;
  }
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->dtype, DataType::kFp32);
  EXPECT_EQ(norm->shape, (std::vector<int64_t>{128}));
  EXPECT_EQ(norm->nbytes, 512u);
  const std::vector<float> want = recipe_floats("model.norm.weight", {128});
  EXPECT_EQ(std::memcmp(norm->data, want.data(), 512), 0);
}

// A one-tensor safetensors file with the given header entry and `data_bytes` of data.
void write_safetensors_by_hand(const std::string& path, const json& entry, size_t data_bytes) {
  const std::string header = json{{"t", entry}}.dump();
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(header.size() >> (8 * i));
  bytes += header + std::string(data_bytes, '\0');
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(Safetensors, RejectsOtherDtypesAndDataPastTheEnd) {
  TempDir dir;
  const std::string path = dir.file("x.safetensors");
  write_safetensors_by_hand(path, {{"dtype", "I64"}, {"shape", {2}}, {"data_offsets", {0, 16}}},
                            16);
  Result<SafetensorsFile> f = SafetensorsFile::open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().message(), path + ": tensor 't' has dtype I64, which is not supported "
                                        "(BF16, F16, F32, I32, U8 or F8_E4M3)");

  write_safetensors_by_hand(path, {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}},
                            8);
  f = SafetensorsFile::open(path);
  ASSERT_FALSE(f.ok());
  const uint64_t size = fs::file_size(path);
  EXPECT_EQ(f.status().message(), path + ": truncated: tensor 't' ends at byte " +
                                      std::to_string(size + 8) + " but the file has " +
                                      std::to_string(size) + " bytes");

  write_safetensors_by_hand(path, {{"dtype", "F32"}, {"shape", {3}}, {"data_offsets", {0, 16}}},
                            16);
  f = SafetensorsFile::open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().message(),
            path + ": tensor 't': data_offsets span 16 bytes but F32[3] needs 12");

  std::ofstream(path, std::ios::binary | std::ios::trunc) << std::string("\xff\xff\0\0\0\0\0\0{}", 10);
  f = SafetensorsFile::open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().message(),
            path + ": truncated: the header claims 65535 bytes but the file has 10 bytes");
}

TEST(Convert, FixtureKeepsBf16AndEmbedsConfigAndTokenizer) {
  TempDir dir;
  const std::string hf = dir.file("hf");
  ASSERT_OK(test::write_fixture_checkpoint(test::fixtures_dir() + "/qwen3-tiny", hf));
  std::vector<ConvertProgress> calls;
  Status s = convert_checkpoint(hf, dir.file("model.bin"), std::nullopt,
                                [&](const ConvertProgress& p) { calls.push_back(p); });
  ASSERT_OK(s);
  std::shared_ptr<ModelFile> mf = open_ok(dir.file("model.bin"));
  ASSERT_NE(mf, nullptr);

  EXPECT_EQ(mf->config().arch, Architecture::kQwen3);
  EXPECT_TRUE(mf->config().tie_word_embeddings);
  EXPECT_EQ(mf->metadata()["hf_config"], fixture_config("qwen3-tiny"));
  EXPECT_EQ(mf->tokenizer_json(), read_text(test::tokenizer_dir() + "/tokenizer.json"));
  EXPECT_EQ(mf->tokenizer_config_json(),
            read_text(test::tokenizer_dir() + "/tokenizer_config.json"));
  EXPECT_FALSE(mf->metadata().contains("preprocessor_config"));

  const std::vector<TensorSpec> specs = expected_tensors(mf->config());
  ASSERT_EQ(mf->tensors().size(), specs.size());
  EXPECT_EQ(mf->find("lm_head.weight"), nullptr);
  for (const TensorSpec& spec : specs) {
    Result<Tensor> t = mf->tensor(spec.name);
    ASSERT_OK(t);
    EXPECT_EQ(t->dtype(), DataType::kBf16) << spec.name;
    const std::vector<uint16_t> want = test::fixture_bf16(spec.name, spec.shape);
    ASSERT_EQ(std::memcmp(t->raw(), want.data(), t->nbytes()), 0) << spec.name;
  }

  ASSERT_EQ(calls.size(), specs.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].tensors_done, i + 1);
    EXPECT_EQ(calls[i].tensors_total, specs.size());
    if (i > 0) {
      EXPECT_GT(calls[i].bytes_done, calls[i - 1].bytes_done);
    }
  }
  EXPECT_EQ(calls.back().bytes_done, calls.back().bytes_total);
  uint64_t bf16_bytes = 0;
  for (const TensorSpec& spec : specs) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    bf16_bytes += 2 * static_cast<uint64_t>(n);
  }
  EXPECT_EQ(calls.back().bytes_total, bf16_bytes);
}

TEST(Convert, UntiedQwen2KeepsLmHeadAndBiases) {
  TempDir dir;
  json config = fixture_config("qwen2-tiny");
  config["vocab_size"] = 640;
  ASSERT_OK(test::write_checkpoint(config, dir.file("hf")));
  ASSERT_OK(convert_checkpoint(dir.file("hf"), dir.file("model.bin"), std::nullopt));
  std::shared_ptr<ModelFile> mf = open_ok(dir.file("model.bin"));
  ASSERT_NE(mf, nullptr);
  EXPECT_EQ(mf->config().arch, Architecture::kQwen2);
  EXPECT_TRUE(mf->config().qkv_bias);
  ASSERT_NE(mf->find("lm_head.weight"), nullptr);
  EXPECT_EQ(mf->find("lm_head.weight")->shape, (std::vector<int64_t>{640, 128}));
  EXPECT_EQ(floats_of(*mf, "model.layers.1.self_attn.k_proj.bias"),
            recipe_floats("model.layers.1.self_attn.k_proj.bias", {64}));
}

TEST(Convert, DtypeOptionConvertsEveryTensor) {
  TempDir dir;
  ASSERT_OK(test::write_checkpoint(small_qwen3_config(), dir.file("hf")));
  for (DataType dtype : {DataType::kFp32, DataType::kFp16, DataType::kBf16}) {
    const std::string out = dir.file(std::string(dtype_name(dtype)) + ".bin");
    Status s = convert_checkpoint(dir.file("hf"), out, dtype);
    ASSERT_OK(s);
    std::shared_ptr<ModelFile> mf = open_ok(out);
    ASSERT_NE(mf, nullptr);
    for (const TensorEntry& e : mf->tensors()) EXPECT_EQ(e.dtype, dtype) << e.name;
    const std::string name = "model.layers.0.mlp.down_proj.weight";
    const std::vector<float> want = recipe_floats(name, {128, 384});
    std::vector<float> got = floats_of(*mf, name);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      // fp16 holds these bf16 values exactly unless they fall below its normal range.
      const float expected = dtype == DataType::kFp16 ? fp16_to_float(float_to_fp16(want[i]))
                                                      : want[i];
      ASSERT_EQ(got[i], expected) << dtype_name(dtype) << " element " << i;
    }
  }
  EXPECT_EQ(convert_error(dir.file("hf"), dir.file("int8.bin"), DataType::kInt8),
            "cannot convert weights to int8 (fp32, fp16 or bf16)");
  EXPECT_FALSE(fs::exists(dir.file("int8.bin")));
}

TEST(Convert, ShardedF32AndF16CheckpointsGiveTheSameModel) {
  TempDir dir;
  ASSERT_OK(test::write_checkpoint(small_qwen3_config(), dir.file("bf16")));
  CheckpointOptions f32_sharded;
  f32_sharded.dtype = DataType::kFp32;
  f32_sharded.shards = 3;
  ASSERT_OK(test::write_checkpoint(small_qwen3_config(), dir.file("f32"), f32_sharded));
  ASSERT_TRUE(fs::exists(dir.file("f32/model.safetensors.index.json")));
  ASSERT_TRUE(fs::exists(dir.file("f32/model-00003-of-00003.safetensors")));
  CheckpointOptions f16_sharded;
  f16_sharded.dtype = DataType::kFp16;
  f16_sharded.shards = 2;
  ASSERT_OK(test::write_checkpoint(small_qwen3_config(), dir.file("f16"), f16_sharded));

  ASSERT_OK(convert_checkpoint(dir.file("bf16"), dir.file("a.bin"), std::nullopt));
  Status s = convert_checkpoint(dir.file("f32"), dir.file("b.bin"), DataType::kBf16);
  ASSERT_OK(s);
  s = convert_checkpoint(dir.file("f16"), dir.file("c.bin"), std::nullopt);
  ASSERT_OK(s);
  std::shared_ptr<ModelFile> a = open_ok(dir.file("a.bin")), b = open_ok(dir.file("b.bin")),
                             c = open_ok(dir.file("c.bin"));
  ASSERT_TRUE(a && b && c);
  for (const TensorEntry& e : a->tensors()) {
    EXPECT_TRUE(same_bytes(*a, *b, e.name)) << e.name;
    EXPECT_EQ(c->find(e.name)->dtype, DataType::kFp16) << e.name;
  }
  const std::vector<float> want = recipe_floats("model.norm.weight", {128});
  EXPECT_EQ(floats_of(*c, "model.norm.weight"), want);  // norm values are exact in fp16
}

TEST(Convert, BothRopeStylesGiveTheSameTheta) {
  TempDir dir;
  json older = small_qwen3_config();
  older["rope_theta"] = 250000.0;
  older["rope_scaling"] = nullptr;
  json newer = small_qwen3_config();
  newer.erase("rope_theta");
  newer.erase("rope_scaling");
  newer["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 250000.0}};
  ASSERT_OK(test::write_checkpoint(older, dir.file("older")));
  ASSERT_OK(test::write_checkpoint(newer, dir.file("newer")));
  ASSERT_OK(convert_checkpoint(dir.file("older"), dir.file("older.bin"), std::nullopt));
  ASSERT_OK(convert_checkpoint(dir.file("newer"), dir.file("newer.bin"), std::nullopt));
  std::shared_ptr<ModelFile> a = open_ok(dir.file("older.bin")), b = open_ok(dir.file("newer.bin"));
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->config().rope_theta, 250000.0);
  EXPECT_EQ(b->config().rope_theta, 250000.0);
  EXPECT_EQ(b->metadata()["hf_config"]["rope_parameters"]["rope_theta"], 250000.0);
}

TEST(Convert, TiedCheckpointWithLmHeadLeavesItOut) {
  TempDir dir;
  json config = small_qwen3_config();
  ModelConfig mc = ModelConfig::from_hf(config).value();
  std::vector<TensorSpec> tensors = expected_tensors(mc);
  tensors.push_back({"lm_head.weight", {512, 128}});
  tensors.push_back({"model.rotary_emb.inv_freq", {32}});
  ASSERT_OK(test::write_checkpoint(config, tensors, dir.file("hf")));
  ASSERT_OK(convert_checkpoint(dir.file("hf"), dir.file("model.bin"), std::nullopt));
  std::shared_ptr<ModelFile> mf = open_ok(dir.file("model.bin"));
  ASSERT_NE(mf, nullptr);
  EXPECT_EQ(mf->find("lm_head.weight"), nullptr);
  EXPECT_EQ(mf->find("model.rotary_emb.inv_freq"), nullptr);
  EXPECT_EQ(mf->tensors().size(), tensors.size() - 2);
}

TEST(Convert, UnknownArchitectureIsAClearError) {
  TempDir dir;
  json config = small_qwen3_config();
  ASSERT_OK(test::write_checkpoint(config, dir.file("hf")));
  config["architectures"] = {"LlamaForCausalLM"};
  std::ofstream(dir.file("hf/config.json"), std::ios::trunc) << config.dump();
  EXPECT_EQ(convert_error(dir.file("hf"), dir.file("model.bin")),
            dir.file("hf") + ": config.json: unsupported architecture 'LlamaForCausalLM' "
                             "(supported: Qwen2ForCausalLM, Qwen3ForCausalLM, "
                             "Qwen3VLForConditionalGeneration)");
  EXPECT_FALSE(fs::exists(dir.file("model.bin")));
}

TEST(Convert, MissingShardIsNamed) {
  TempDir dir;
  CheckpointOptions sharded;
  sharded.shards = 3;
  ASSERT_OK(test::write_checkpoint(small_qwen3_config(), dir.file("hf"), sharded));
  fs::remove(dir.file("hf/model-00002-of-00003.safetensors"));
  EXPECT_EQ(convert_error(dir.file("hf"), dir.file("model.bin")),
            dir.file("hf") + ": shard 'model-00002-of-00003.safetensors' named by "
                             "model.safetensors.index.json is missing");
  EXPECT_FALSE(fs::exists(dir.file("model.bin")));
}

TEST(Convert, MissingOrMisShapedTensorIsNamed) {
  TempDir dir;
  json config = small_qwen3_config();
  std::vector<TensorSpec> tensors = expected_tensors(ModelConfig::from_hf(config).value());
  std::vector<TensorSpec> without_norm(tensors.begin(), tensors.end() - 1);
  ASSERT_EQ(tensors.back().name, "model.norm.weight");
  ASSERT_OK(test::write_checkpoint(config, without_norm, dir.file("missing")));
  EXPECT_EQ(convert_error(dir.file("missing"), dir.file("model.bin")),
            dir.file("missing") + ": tensor 'model.norm.weight' is missing from the checkpoint");

  std::vector<TensorSpec> without_two(tensors.begin() + 1, tensors.end() - 1);
  ASSERT_OK(test::write_checkpoint(config, without_two, dir.file("missing2")));
  EXPECT_EQ(convert_error(dir.file("missing2"), dir.file("model.bin")),
            dir.file("missing2") +
                ": tensor 'model.embed_tokens.weight' is missing from the checkpoint (and 1 more)");

  std::vector<TensorSpec> misshaped = tensors;
  misshaped[2].shape = {64, 128};
  ASSERT_OK(test::write_checkpoint(config, misshaped, dir.file("shape")));
  EXPECT_EQ(convert_error(dir.file("shape"), dir.file("model.bin")),
            dir.file("shape") + ": tensor '" + tensors[2].name + "' has shape [64,128] in " +
                dir.file("shape/model.safetensors") + " but config.json implies " +
                shape_string(tensors[2].shape));
  EXPECT_FALSE(fs::exists(dir.file("model.bin")));
}

TEST(Convert, MissingOrIncompleteDirectoryIsAClearError) {
  TempDir dir;
  EXPECT_EQ(convert_error(dir.file("absent"), dir.file("model.bin")),
            dir.file("absent") + ": no such directory");
  std::ofstream(dir.file("file")) << "not a directory";
  EXPECT_EQ(convert_error(dir.file("file"), dir.file("model.bin")),
            dir.file("file") + ": not a directory");
  fs::create_directory(dir.file("empty"));
  EXPECT_EQ(convert_error(dir.file("empty"), dir.file("model.bin")),
            dir.file("empty") + ": no config.json (not a Hugging Face checkpoint directory)");

  CheckpointOptions no_tokenizer;
  no_tokenizer.tokenizer = false;
  ASSERT_OK(test::write_checkpoint(small_qwen3_config(), dir.file("hf"), no_tokenizer));
  EXPECT_EQ(convert_error(dir.file("hf"), dir.file("model.bin")),
            dir.file("hf") + ": tokenizer.json is missing (the model file embeds the tokenizer)");
  fs::remove(dir.file("hf/model.safetensors"));
  fs::copy_file(test::tokenizer_dir() + "/tokenizer.json", dir.file("hf/tokenizer.json"));
  fs::copy_file(test::tokenizer_dir() + "/tokenizer_config.json",
                dir.file("hf/tokenizer_config.json"));
  EXPECT_EQ(convert_error(dir.file("hf"), dir.file("model.bin")),
            dir.file("hf") + ": no model.safetensors or model.safetensors.index.json");
  EXPECT_FALSE(fs::exists(dir.file("model.bin")));
}

TEST(Convert, ConvertedFixtureIsCachedAndValid) {
  const std::string first = test::converted_fixture("qwen3-tiny", DataType::kFp32);
  ASSERT_FALSE(first.empty());
  const auto written = fs::last_write_time(first);
  EXPECT_EQ(test::converted_fixture("qwen3-tiny", DataType::kFp32), first);
  EXPECT_EQ(fs::last_write_time(first), written);
  std::shared_ptr<ModelFile> mf = open_ok(first);
  ASSERT_NE(mf, nullptr);
  EXPECT_EQ(mf->find("model.norm.weight")->dtype, DataType::kFp32);
  EXPECT_EQ(floats_of(*mf, "model.norm.weight"), recipe_floats("model.norm.weight", {128}));
}

// Runs kuiper-convert with `args` (space-separated); returns the exit code, fills `err`.
int run_cli(const std::string& args, std::string& err) {
  std::vector<std::string> argv;
  std::istringstream words(args);
  for (std::string w; words >> w;) argv.push_back(w);
  test::CliResult r = test::run_program("kuiper-convert", argv);
  err = r.err;
  return r.exit_code;
}

TEST(ConvertCli, ConvertsAndSummarises) {
  TempDir dir;
  ASSERT_OK(test::write_checkpoint(small_qwen3_config(), dir.file("hf")));
  std::string err;
  ASSERT_EQ(run_cli("--hf " + dir.file("hf") + " --out " + dir.file("model.bin") + " --dtype fp16",
                    err),
            0)
      << err;
  EXPECT_NE(err.find("wrote " + dir.file("model.bin") + ": qwen3"), std::string::npos) << err;
  EXPECT_NE(err.find("100.0%"), std::string::npos) << err;
  std::shared_ptr<ModelFile> mf = open_ok(dir.file("model.bin"));
  ASSERT_NE(mf, nullptr);
  for (const TensorEntry& e : mf->tensors()) EXPECT_EQ(e.dtype, DataType::kFp16) << e.name;
}

// Sets element `index` of the F32 tensor `name` in the safetensors file at `path` to `value`.
void plant_f32(const std::string& path, const std::string& name, size_t index, float value) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  uint8_t length[8] = {};
  f.read(reinterpret_cast<char*>(length), 8);
  uint64_t header_bytes = 0;
  for (int i = 0; i < 8; ++i) header_bytes |= static_cast<uint64_t>(length[i]) << (8 * i);
  std::string header(header_bytes, '\0');
  f.read(header.data(), static_cast<std::streamsize>(header_bytes));
  const json entry = json::parse(header).at(name);
  ASSERT_EQ(entry.at("dtype"), "F32");
  const uint64_t begin = entry.at("data_offsets")[0].get<uint64_t>();
  f.seekp(static_cast<std::streamoff>(8 + header_bytes + begin + 4 * index));
  f.write(reinterpret_cast<const char*>(&value), 4);
  ASSERT_TRUE(f.good()) << path;
}

// fp16 ends at 65504: a weight beyond it would be inf in the file, so converting to fp16 is
// refused, naming the tensor and the value; bf16 (fp32's range) and the stored dtype hold it.
TEST(ConvertCli, Fp16OfAValueBeyondItsRangeIsRefusedPointingAtBf16) {
  TempDir dir;
  CheckpointOptions f32;
  f32.dtype = DataType::kFp32;
  ASSERT_OK(test::write_checkpoint(small_qwen3_config(), dir.file("hf"), f32));
  const std::string tensor = "model.layers.0.mlp.down_proj.weight";
  plant_f32(dir.file("hf/model.safetensors"), tensor, 5, -7e4f);

  std::string err;
  EXPECT_EQ(run_cli("--hf " + dir.file("hf") + " --out " + dir.file("fp16.bin") + " --dtype fp16",
                    err),
            1);
  EXPECT_NE(err.find("kuiper-convert: "), std::string::npos) << err;
  EXPECT_NE(err.find("tensor '" + tensor + "': values up to 70000 in magnitude do not fit fp16 "
                     "(largest 65504); convert to bf16 (--dtype bf16)"),
            std::string::npos)
      << err;
  EXPECT_FALSE(fs::exists(dir.file("fp16.bin")));

  for (std::optional<DataType> dtype : {std::optional<DataType>(DataType::kBf16),
                                        std::optional<DataType>()}) {
    const std::string out = dir.file(dtype ? "bf16.bin" : "stored.bin");
    ASSERT_OK(convert_checkpoint(dir.file("hf"), out, dtype));
    std::shared_ptr<ModelFile> mf = open_ok(out);
    ASSERT_NE(mf, nullptr);
    const float want = dtype ? bf16_to_float(float_to_bf16(-7e4f)) : -7e4f;
    EXPECT_EQ(floats_of(*mf, tensor).at(5), want);
  }
}

TEST(ConvertCli, ErrorsExitOneWithOneMessageAndNoOutput) {
  TempDir dir;
  json config = small_qwen3_config();
  std::vector<TensorSpec> tensors = expected_tensors(ModelConfig::from_hf(config).value());
  tensors.pop_back();
  ASSERT_OK(test::write_checkpoint(config, tensors, dir.file("hf")));
  std::string err;
  EXPECT_EQ(run_cli("--hf " + dir.file("hf") + " --out " + dir.file("model.bin"), err),
            1);
  EXPECT_NE(err.find("\nkuiper-convert: " + dir.file("hf") +
                     ": tensor 'model.norm.weight' is missing from the checkpoint\n"),
            std::string::npos)
      << err;
  EXPECT_FALSE(fs::exists(dir.file("model.bin")));
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(entry.path().filename(), "hf") << "left behind: " << entry.path();
  }

  EXPECT_EQ(run_cli("--hf " + dir.file("hf") + " --out " + dir.file("model.bin") + " --dtype fp8",
                    err),
            1);
  EXPECT_EQ(err, "kuiper-convert: --dtype 'fp8' is not one of fp32, fp16, bf16\n");

  EXPECT_EQ(run_cli("--hf " + dir.file("hf"), err), 1);
  EXPECT_EQ(err.rfind("kuiper-convert: --hf and --out are required\nusage: ", 0), 0u) << err;
  EXPECT_FALSE(fs::exists(dir.file("model.bin")));
}

}  // namespace
}  // namespace kuiper
