// The model file: write/open round trip, and every kind of damage open() must name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "kuiper/model/model_file.h"
#include "support/assertions.h"
#include "support/fixture_checkpoint.h"
#include "support/tiny_config.h"

namespace kuiper {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// test::tiny_qwen3_config with a begin token and two end tokens, so the file carries both.
ModelConfig tiny_config() {
  ModelConfig c = test::tiny_qwen3_config();
  c.bos_token_id = 1;
  c.eos_token_ids = {2, 3};
  return c;
}

// Tensor i holds bytes (i * 31 + k) mod 256, so any misplaced byte shows; dtypes alternate so
// the table carries more than one.
uint8_t pattern_byte(size_t tensor, size_t k) { return static_cast<uint8_t>(tensor * 31 + k); }
DataType pattern_dtype(size_t tensor) { return tensor % 2 ? DataType::kFp32 : DataType::kBf16; }

std::vector<TensorSource> pattern_sources(const ModelConfig& c) {
  std::vector<TensorSource> sources;
  const std::vector<TensorSpec> specs = expected_tensors(c);
  for (size_t i = 0; i < specs.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : specs[i].shape) n *= d;
    const size_t nbytes = static_cast<size_t>(n) * dtype_size(pattern_dtype(i));
    sources.push_back({specs[i].name, pattern_dtype(i), specs[i].shape, [i, nbytes](void* dst) {
                         for (size_t k = 0; k < nbytes; ++k) {
                           static_cast<uint8_t*>(dst)[k] = pattern_byte(i, k);
                         }
                         return Status::Ok();
                       }});
  }
  return sources;
}

const json kExtraMetadata = {{"tokenizer_json", "{\"model\": {}}"},
                             {"tokenizer_config_json", "{\"chat_template\": \"x\"}"},
                             {"hf_config", {{"architectures", {"Qwen3ForCausalLM"}}}}};

std::string write_tiny(const test::TempDir& dir, const std::string& name = "model.bin") {
  const std::string path = dir.file(name);
  Status s = write_model_file(path, tiny_config(), kExtraMetadata, pattern_sources(tiny_config()));
  EXPECT_OK(s);
  return path;
}

std::string open_error(const std::string& path) {
  Result<std::shared_ptr<ModelFile>> r = ModelFile::open(path);
  return r.ok() ? "<opened without error>" : r.status().message();
}

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Lays out a file from a metadata object a test has broken on purpose, which write_model_file
// would refuse to produce: header, metadata, zero data up to the end of `data_bytes`.
void write_raw(const std::string& path, const json& metadata, uint64_t data_bytes) {
  const std::string text = metadata.dump();
  std::vector<char> bytes(24, 0);
  std::memcpy(bytes.data(), kModelFileMagic, 8);
  bytes[8] = static_cast<char>(kModelFileVersion);
  for (int i = 0; i < 8; ++i) bytes[16 + i] = static_cast<char>(text.size() >> (8 * i));
  bytes.insert(bytes.end(), text.begin(), text.end());
  const uint64_t data_offset =
      (bytes.size() + kModelFileAlignment - 1) / kModelFileAlignment * kModelFileAlignment;
  bytes.resize(data_offset + data_bytes, 0);
  write_bytes(path, bytes);
}

// The metadata of a valid tiny file and the length of its data section, for write_raw.
std::pair<json, uint64_t> valid_layout(const test::TempDir& dir) {
  Result<std::shared_ptr<ModelFile>> mf = ModelFile::open(write_tiny(dir, "valid.bin"));
  EXPECT_OK(mf);
  uint64_t end = 0;
  for (const TensorEntry& e : (*mf)->tensors()) end = std::max(end, e.offset + e.nbytes);
  return {(*mf)->metadata(), end};
}

json& entry_named(json& metadata, const std::string& name) {
  for (json& e : metadata["tensors"]) {
    if (e["name"] == name) return e;
  }
  ADD_FAILURE() << "no entry " << name;
  return metadata;
}

TEST(ModelFile, RoundTripKeepsConfigMetadataAndBytes) {
  test::TempDir dir;
  const std::string path = dir.file("model.bin");
  std::vector<std::pair<size_t, size_t>> calls;
  Status s = write_model_file(path, tiny_config(), kExtraMetadata, pattern_sources(tiny_config()),
                              [&](size_t done, size_t total) { calls.emplace_back(done, total); });
  ASSERT_OK(s);

  Result<std::shared_ptr<ModelFile>> r = ModelFile::open(path);
  ASSERT_OK(r);
  const ModelFile& mf = **r;
  EXPECT_EQ(mf.config().to_json(), tiny_config().to_json());
  EXPECT_EQ(mf.metadata()["architecture"], "qwen3");
  EXPECT_EQ(mf.metadata()["hf_config"], kExtraMetadata["hf_config"]);
  EXPECT_EQ(mf.tokenizer_json(), "{\"model\": {}}");
  EXPECT_EQ(mf.tokenizer_config_json(), "{\"chat_template\": \"x\"}");

  const std::vector<TensorSpec> specs = expected_tensors(tiny_config());
  ASSERT_EQ(mf.tensors().size(), specs.size());
  ASSERT_EQ(calls.size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(calls[i], std::make_pair(i + 1, specs.size()));
    const TensorEntry* e = mf.find(specs[i].name);
    ASSERT_NE(e, nullptr) << specs[i].name;
    EXPECT_EQ(e->offset % kModelFileAlignment, 0u);
    EXPECT_EQ(e->dtype, pattern_dtype(i));
    Result<Tensor> t = mf.tensor(specs[i].name);
    ASSERT_OK(t);
    EXPECT_EQ(t->shape(), specs[i].shape);
    EXPECT_EQ(t->nbytes(), e->nbytes);
    const uint8_t* bytes = t->data<uint8_t>();
    for (size_t k = 0; k < e->nbytes; ++k) {
      ASSERT_EQ(bytes[k], pattern_byte(i, k)) << specs[i].name << " byte " << k;
    }
  }
  EXPECT_EQ(mf.find("model.layers.9.mlp.up_proj.weight"), nullptr);
  Result<Tensor> missing = mf.tensor("lm_head.weight");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(), path + ": no tensor 'lm_head.weight'");
}

TEST(ModelFile, TensorViewKeepsTheMappingAlive) {
  test::TempDir dir;
  Result<std::shared_ptr<ModelFile>> r = ModelFile::open(write_tiny(dir));
  ASSERT_OK(r);
  Result<Tensor> t = (*r)->tensor("model.norm.weight");
  ASSERT_OK(t);
  const size_t index = expected_tensors(tiny_config()).size() - 1;  // norm is last when tied
  r = Status::Error("dropped");  // the only ModelFile reference goes
  EXPECT_EQ(t->data<uint8_t>()[5], pattern_byte(index, 5));
}

TEST(ModelFile, FailedWriteLeavesNothingAndKeepsTheOldFile) {
  test::TempDir dir;
  const std::string path = write_tiny(dir);
  const std::vector<char> before = read_bytes(path);
  std::vector<TensorSource> sources = pattern_sources(tiny_config());
  sources[3].fill = [](void*) { return Status::Error("source went away"); };
  Status s = write_model_file(path, tiny_config(), kExtraMetadata, sources);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), path + ": tensor '" + sources[3].name + "': source went away");
  EXPECT_EQ(read_bytes(path), before);
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) files += entry.exists();
  EXPECT_EQ(files, 1u) << "a temporary file was left behind";

  const std::string fresh = dir.file("fresh.bin");
  ASSERT_FALSE(write_model_file(fresh, tiny_config(), kExtraMetadata, sources).ok());
  EXPECT_FALSE(fs::exists(fresh));
}

TEST(ModelFile, WriterRefusesATableOpenWouldReject) {
  test::TempDir dir;
  const std::string path = dir.file("model.bin");
  std::vector<TensorSource> sources = pattern_sources(tiny_config());
  sources.pop_back();  // model.norm.weight
  Status s = write_model_file(path, tiny_config(), kExtraMetadata, sources);
  EXPECT_EQ(s.message(), path + ": tensor 'model.norm.weight' is missing (the config needs it)");

  sources = pattern_sources(tiny_config());
  sources.back().shape = {8};
  s = write_model_file(path, tiny_config(), kExtraMetadata, sources);
  EXPECT_EQ(s.message(),
            path + ": tensor 'model.norm.weight' has shape [8] but the config implies [16]");

  sources = pattern_sources(tiny_config());
  sources.push_back(sources[0]);
  s = write_model_file(path, tiny_config(), kExtraMetadata, sources);
  EXPECT_EQ(s.message(), path + ": tensor 'model.embed_tokens.weight' appears twice");
  EXPECT_FALSE(fs::exists(path));
}

TEST(ModelFile, RejectsTruncatedFile) {
  test::TempDir dir;
  const std::string path = write_tiny(dir);
  std::vector<char> bytes = read_bytes(path);
  const size_t full = bytes.size();
  bytes.resize(full - 100);
  write_bytes(path, bytes);
  EXPECT_EQ(open_error(path), path + ": truncated: tensor 'model.norm.weight' ends at byte " +
                                  std::to_string(full) + " but the file has " +
                                  std::to_string(full - 100) + " bytes");

  bytes.resize(100);  // inside the metadata
  write_bytes(path, bytes);
  EXPECT_EQ(open_error(path).rfind(path + ": truncated: ", 0), 0u) << open_error(path);
  bytes.resize(12);  // inside the header
  write_bytes(path, bytes);
  EXPECT_EQ(open_error(path), path + ": truncated: the file has 12 bytes, less than the 24-byte header");
  bytes.clear();
  write_bytes(path, bytes);
  EXPECT_EQ(open_error(path), path + ": empty file, not a Kuiper model file");
}

TEST(ModelFile, RejectsWrongMagic) {
  test::TempDir dir;
  const std::string path = write_tiny(dir);
  std::vector<char> bytes = read_bytes(path);
  bytes[0] = 'k';
  write_bytes(path, bytes);
  EXPECT_EQ(open_error(path), path + ": not a Kuiper model file (bad magic)");
  write_bytes(path, {'{', '}', '\n'});
  EXPECT_EQ(open_error(path), path + ": not a Kuiper model file (bad magic)");
}

TEST(ModelFile, RejectsOtherVersion) {
  test::TempDir dir;
  const std::string path = write_tiny(dir);
  std::vector<char> bytes = read_bytes(path);
  bytes[8] = 7;
  write_bytes(path, bytes);
  EXPECT_EQ(open_error(path), path + ": unsupported model file version 7 (this build reads 1)");
}

TEST(ModelFile, RejectsTensorOffsetPastTheEnd) {
  test::TempDir dir;
  auto [metadata, data_bytes] = valid_layout(dir);
  const std::string path = dir.file("bad.bin");
  write_raw(path, metadata, data_bytes);
  ASSERT_EQ(open_error(path), "<opened without error>");  // the layout itself is sound

  json& embed = entry_named(metadata, "model.embed_tokens.weight");
  embed["offset"] = 1 << 20;
  write_raw(path, metadata, data_bytes);
  const uint64_t file_size = fs::file_size(path);
  const uint64_t data_offset = file_size - data_bytes;
  EXPECT_EQ(open_error(path),
            path + ": truncated: tensor 'model.embed_tokens.weight' ends at byte " +
                std::to_string(data_offset + (1 << 20) + embed["nbytes"].get<uint64_t>()) +
                " but the file has " + std::to_string(file_size) + " bytes");

  embed["offset"] = ~uint64_t{0} - 4095;  // aligned, and wraps if added carelessly
  write_raw(path, metadata, data_bytes);
  EXPECT_NE(open_error(path).find("impossible extent"), std::string::npos) << open_error(path);

  embed["offset"] = 100;
  write_raw(path, metadata, data_bytes);
  EXPECT_EQ(open_error(path), path + ": tensor 'model.embed_tokens.weight' has offset 100, not a "
                                     "multiple of 4096");
}

TEST(ModelFile, RejectsShapeTheConfigDoesNotImply) {
  test::TempDir dir;
  auto [metadata, data_bytes] = valid_layout(dir);
  const std::string path = dir.file("bad.bin");
  json& norm = entry_named(metadata, "model.norm.weight");
  norm["shape"] = {8};
  norm["nbytes"] = 8 * dtype_size(parse_dtype(norm["dtype"]).value());
  write_raw(path, metadata, data_bytes);
  EXPECT_EQ(open_error(path),
            path + ": tensor 'model.norm.weight' has shape [8] but the config implies [16]");

  norm["shape"] = {16};  // right shape, wrong size
  write_raw(path, metadata, data_bytes);
  EXPECT_NE(open_error(path).find("tensor 'model.norm.weight' has nbytes"), std::string::npos)
      << open_error(path);
}

TEST(ModelFile, RejectsMissingTensorAndUnknownDtype) {
  test::TempDir dir;
  auto [metadata, data_bytes] = valid_layout(dir);
  const std::string path = dir.file("bad.bin");
  json broken = metadata;
  broken["tensors"].erase(0);
  write_raw(path, broken, data_bytes);
  EXPECT_EQ(open_error(path),
            path + ": tensor 'model.embed_tokens.weight' is missing (the config needs it)");

  broken = metadata;
  entry_named(broken, "model.norm.weight")["dtype"] = "fp8";
  write_raw(path, broken, data_bytes);
  EXPECT_EQ(open_error(path).rfind(path + ": tensor 'model.norm.weight': unknown dtype 'fp8'", 0),
            0u)
      << open_error(path);
}

TEST(ModelFile, RejectsBrokenMetadata) {
  test::TempDir dir;
  auto [metadata, data_bytes] = valid_layout(dir);
  const std::string path = dir.file("bad.bin");

  json broken = metadata;
  broken.erase("tensors");
  write_raw(path, broken, data_bytes);
  EXPECT_EQ(open_error(path), path + ": metadata has no \"tensors\" array");

  broken = metadata;
  broken["config"]["num_kv_heads"] = 3;  // 2 heads are not a multiple of 3
  write_raw(path, broken, data_bytes);
  EXPECT_NE(open_error(path).find(path + ": config: num_attention_heads (2) is not a multiple"),
            std::string::npos)
      << open_error(path);

  broken = metadata;
  broken["architecture"] = "qwen2";
  write_raw(path, broken, data_bytes);
  EXPECT_EQ(open_error(path),
            path + ": metadata architecture 'qwen2' does not match the config's 'qwen3'");

  std::vector<char> bytes = read_bytes(write_tiny(dir));
  bytes[24] = '[';  // the metadata's opening brace
  write_bytes(path, bytes);
  EXPECT_EQ(open_error(path).rfind(path + ": metadata is not valid JSON", 0), 0u)
      << open_error(path);
}

// A number beyond a double once threw out of the metadata parser (an abort); a huge or
// mistyped config value is an error naming it.
TEST(ModelFile, HugeOrMistypedMetadataNumbersAreErrors) {
  test::TempDir dir;
  std::vector<char> bytes = read_bytes(write_tiny(dir));
  const std::string text(bytes.begin(), bytes.end());
  const std::string key = "\"rms_norm_eps\":";
  const size_t at = text.find(key);
  ASSERT_NE(at, std::string::npos);
  const size_t begin = at + key.size(), end = text.find_first_of(",}", begin);
  ASSERT_GE(end - begin, 5u);
  const std::string path = dir.file("bad.bin");
  auto with_value = [&](const std::string& value) {
    std::vector<char> patched = bytes;
    std::string padded = value;
    padded.resize(end - begin, ' ');  // same length: the header's metadata size still holds
    std::copy(padded.begin(), padded.end(), patched.begin() + static_cast<long>(begin));
    write_bytes(path, patched);
    return open_error(path);
  };
  EXPECT_EQ(with_value("1e999").rfind(path + ": metadata is not valid JSON", 0), 0u)
      << with_value("1e999");
  EXPECT_NE(with_value("\"x\"").find(path + ": config: rms_norm_eps: expected a number"),
            std::string::npos)
      << with_value("\"x\"");
}

TEST(ModelFile, MissingFileOrDirectoryIsAClearError) {
  test::TempDir dir;
  EXPECT_EQ(open_error(dir.file("absent.bin")),
            "cannot open " + dir.file("absent.bin") + ": No such file or directory");
  EXPECT_EQ(open_error(dir.path()), dir.path() + " is not a regular file");
}

}  // namespace
}  // namespace kuiper
