// Hugging Face safetensors checkpoints, read in place: one file, or the shards that
// model.safetensors.index.json names. Files are mmapped and every header field is checked
// against the file, so a damaged checkpoint is an error rather than a read past the end.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kuiper/base/dtype.h"
#include "kuiper/model/model_file.h"

namespace kuiper {

struct SafetensorsTensor {
  std::string name;
  DataType dtype = DataType::kFp32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // inside the mapped file
  uint64_t nbytes = 0;
};

class SafetensorsFile {
 public:
  // Maps `path` and validates the header: its length, its JSON, each tensor's dtype (BF16, F16,
  // F32, I32, U8 or F8_E4M3; others are an error naming the tensor), shape, and data offsets
  // within the file.
  static Result<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }

 private:
  std::string path_;
  MappedFile file_;  // keeps every tensor's data pointer valid, in copies too
  std::vector<SafetensorsTensor> tensors_;
};

// Every tensor of a checkpoint directory, whichever shard holds it.
class SafetensorsCheckpoint {
 public:
  // `dir` holds model.safetensors.index.json and the shards its weight_map names (a missing
  // shard is an error naming it), or a single model.safetensors.
  static Result<SafetensorsCheckpoint> open(const std::string& dir);

  const SafetensorsTensor* find(const std::string& name) const;
  // The file holding `name` (for messages); empty if there is no such tensor.
  std::string file_of(const std::string& name) const;

 private:
  std::vector<SafetensorsFile> shards_;
  std::unordered_map<std::string, std::pair<size_t, size_t>> index_;  // name -> (shard, tensor)
};

}  // namespace kuiper
