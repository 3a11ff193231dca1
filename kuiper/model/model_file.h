// The Kuiper model file: one self-describing file, mmapped at load.
//
//   bytes 0..7    magic "KUIPERLM"
//   bytes 8..11   format version, little-endian uint32 (kModelFileVersion)
//   bytes 12..15  zero
//   bytes 16..23  metadata length N, little-endian uint64
//   bytes 24..    N bytes of UTF-8 JSON metadata:
//                   "architecture", "config" (ModelConfig::to_json), "hf_config" (config.json as
//                   published), "tokenizer_json" and "tokenizer_config_json" (the checkpoint's files
//                   as strings), optionally "preprocessor_config" and "quantization" (the
//                   quantized matrices: kuiper/model/quantization.h), and "tensors": [{"name",
//                   "dtype", "shape", "offset", "nbytes"}], offsets relative to the data section
//   data section  starts at the first multiple of kModelFileAlignment after the metadata; every
//                 tensor offset is a multiple of kModelFileAlignment, so mmapped tensors can be
//                 used (and copied to a GPU) in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "kuiper/model/config.h"
#include "kuiper/model/quantization.h"
#include "kuiper/op/weight.h"
#include "kuiper/tensor/tensor.h"

namespace kuiper {

constexpr char kModelFileMagic[8] = {'K', 'U', 'I', 'P', 'E', 'R', 'L', 'M'};
constexpr uint32_t kModelFileVersion = 1;
constexpr uint64_t kModelFileAlignment = 4096;

// A whole file mapped read-only (the model file, a safetensors shard). The bytes stay valid as
// long as `mapping` or any copy of it lives, which is how tensor views keep their file mapped.
struct MappedFile {
  std::shared_ptr<const void> mapping;  // null for an empty file
  size_t size = 0;
  const uint8_t* data() const { return static_cast<const uint8_t*>(mapping.get()); }
};
// Errors name the path ("cannot open x: No such file or directory").
Result<MappedFile> map_file(const std::string& path);

struct TensorEntry {
  std::string name;
  DataType dtype = DataType::kFp32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // into the data section
  uint64_t nbytes = 0;
};

class ModelFile {
 public:
  // Maps and validates the file: magic, version, metadata, config, every tensor's dtype, shape
  // (against the config; a quantized matrix's values, scales and zeros against its format) and
  // extent. Errors name the file and what is wrong.
  static Result<std::shared_ptr<ModelFile>> open(const std::string& path);
  ~ModelFile();

  const std::string& path() const { return path_; }
  const ModelConfig& config() const { return config_; }
  const nlohmann::json& metadata() const { return metadata_; }
  std::string tokenizer_json() const;         // empty if the file has none
  std::string tokenizer_config_json() const;  // empty if the file has none
  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  const TensorEntry* find(const std::string& name) const;
  // A CPU tensor viewing the mapped bytes; keeps the mapping alive.
  Result<Tensor> tensor(const std::string& name) const;
  // A matrix as the ops take it: plain, or quantized with its scales and zeros (all CPU views).
  Result<op::Weight> weight(const std::string& name) const;

 private:
  ModelFile() = default;
  std::string path_;
  std::shared_ptr<const void> mapping_;  // the whole file, read-only
  size_t file_size_ = 0;
  uint64_t data_offset_ = 0;
  nlohmann::json metadata_;
  ModelConfig config_;
  std::vector<TensorEntry> tensors_;
  std::unordered_map<std::string, QuantizedEntry> quantized_;  // the quantized matrices
};

// One tensor to write: `fill` writes exactly nbytes (numel * dtype size) into dst.
struct TensorSource {
  std::string name;
  DataType dtype = DataType::kFp32;
  std::vector<int64_t> shape;
  std::function<Status(void* dst)> fill;
};

// Writes a model file. `metadata` holds everything but "config", "architecture" and "tensors",
// which are added here; its "quantization" says which tensors are quantized matrices, checked
// like the rest. The file appears at `path` only when complete: it is written to a
// temporary name and renamed; on failure nothing is left behind. `progress(done, total)` is
// called after each tensor.
Status write_model_file(const std::string& path, const ModelConfig& config,
                        nlohmann::json metadata, const std::vector<TensorSource>& tensors,
                        const std::function<void(size_t, size_t)>& progress = nullptr);

}  // namespace kuiper
