// Test checkpoints: Hugging Face directories written from the deterministic weight recipe of
// test/data/fixtures/detweights.py (ported here so tests need no Python), scratch directories, and
// converted fixture model files shared by the golden tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kuiper/base/dtype.h"
#include "kuiper/model/config.h"

namespace kuiper::test {

// A fresh directory $TMPDIR/kuiper-test-XXXXXX (TMPDIR defaults to /tmp), removed with its
// contents when the object goes. If it cannot be made the test fails and path() is empty.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// detweights.py's recipe: seed = FNV-1a 64 of the name, u[i] from splitmix64(seed + i), values
// centre + scale * (2u - 1), stored as bf16 (round to nearest even). Returns the bf16 bits.
uint64_t fnv1a64(const std::string& text);
std::vector<uint16_t> fixture_bf16(const std::string& name, const std::vector<int64_t>& shape);

struct CheckpointOptions {
  // Storage dtype (BF16, F16 or F32). The values are the bf16 ones in every case, so a
  // checkpoint stored in F32 describes exactly the same model as the BF16 one.
  DataType dtype = DataType::kBf16;
  // Above 1: model-0000k-of-0000n.safetensors shards and model.safetensors.index.json.
  int shards = 1;
  bool tokenizer = true;  // copy tokenizer.json and tokenizer_config.json from tokenizer_dir()
};

// Writes the fixture at `fixture_dir` (config.json + tensors.json) as a complete HF directory
// in `out_dir`, as detweights.py does: config.json, other .json files but tensors.json, .png
// files, the tokenizer files, and a model.safetensors bit-identical to the script's (the
// entries' "set" plants included; one that does not fit its tensor is an error).
Status write_fixture_checkpoint(const std::string& fixture_dir, const std::string& out_dir);

// An HF directory for any config.json: `tensors` (names and shapes) filled by the recipe, and
// `hf_config` written verbatim as config.json, so a test can describe a broken checkpoint.
Status write_checkpoint(const nlohmann::json& hf_config, const std::vector<TensorSpec>& tensors,
                        const std::string& out_dir, const CheckpointOptions& options = {});
// The same with exactly the tensors expected_tensors(ModelConfig::from_hf(hf_config)) lists.
Status write_checkpoint(const nlohmann::json& hf_config, const std::string& out_dir,
                        const CheckpointOptions& options = {});

// The model file of fixtures_dir()/<name> (e.g. "qwen3-tiny") converted to `dtype`. Made once
// and cached in the build tree (keyed by this test binary and the fixture's files, so a rebuild
// or a changed fixture makes a new one); safe to call from parallel test processes. On failure
// the test fails with the reason and the result is empty.
std::string converted_fixture(const std::string& name, DataType dtype);

}  // namespace kuiper::test
