#include "kuiper/model/safetensors.h"

#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "kuiper/base/json_reader.h"

namespace kuiper {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// The safetensors dtypes this engine reads: floats, I32 (token ids in reference outputs, the
// packed codes of AWQ and GPTQ checkpoints), U8 and F8_E4M3 (FP8 checkpoints); the format has
// more (I64, BOOL...).
Result<DataType> parse_safetensors_dtype(const std::string& name, const std::string& tensor) {
  if (name == "BF16") return DataType::kBf16;
  if (name == "F16") return DataType::kFp16;
  if (name == "F32") return DataType::kFp32;
  if (name == "I32") return DataType::kInt32;
  if (name == "U8") return DataType::kUint8;
  if (name == "F8_E4M3") return DataType::kFp8E4m3;
  return Status::Error("tensor '" + tensor + "' has dtype " + name +
                       ", which is not supported (BF16, F16, F32, I32, U8 or F8_E4M3)");
}

uint64_t load_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

Result<SafetensorsTensor> parse_header_entry(const std::string& name, const json& entry,
                                             const uint8_t* data, uint64_t data_size,
                                             uint64_t data_start) {
  SafetensorsTensor t;
  t.name = name;
  const JsonReader j(entry, "tensor '" + name + "'");
  const std::string what = "tensor '" + name + "': ";
  KUIPER_ASSIGN_OR_RETURN(std::string dtype, j.get_string("dtype"));
  KUIPER_ASSIGN_OR_RETURN(t.dtype, parse_safetensors_dtype(dtype, t.name));
  KUIPER_ASSIGN_OR_RETURN(JsonReader shape, j.at("shape"));
  KUIPER_ASSIGN_OR_RETURN(t.shape, shape.to_int_list(0, JsonReader::kIntMax));
  uint64_t expected = dtype_size(t.dtype);
  for (int64_t d : t.shape) {
    if (__builtin_mul_overflow(expected, static_cast<uint64_t>(d), &expected)) {
      return Status::Error(what + "impossible shape " + shape.json().dump());
    }
  }
  KUIPER_ASSIGN_OR_RETURN(JsonReader offsets, j.at("data_offsets"));
  KUIPER_ASSIGN_OR_RETURN(std::vector<int64_t> span, offsets.to_int_list(0, JsonReader::kIntMax));
  if (span.size() != 2) {
    return Status::Error(what + "\"data_offsets\" must be two non-negative integers");
  }
  const uint64_t begin = static_cast<uint64_t>(span[0]), end = static_cast<uint64_t>(span[1]);
  if (begin > end) {
    return Status::Error(what + "data_offsets " + offsets.json().dump() + " are reversed");
  }
  if (end > data_size) {
    return Status::Error("truncated: tensor '" + t.name + "' ends at byte " +
                         std::to_string(data_start + end) + " but the file has " +
                         std::to_string(data_start + data_size) + " bytes");
  }
  if (end - begin != expected) {
    return Status::Error(what + "data_offsets span " + std::to_string(end - begin) +
                         " bytes but " + dtype + shape.json().dump() + " needs " +
                         std::to_string(expected));
  }
  t.data = data + begin;
  t.nbytes = expected;
  return t;
}

Result<json> read_json_file(const std::string& path) {
  KUIPER_ASSIGN_OR_RETURN(MappedFile file, map_file(path));
  return parse_json(std::string_view(reinterpret_cast<const char*>(file.data()), file.size), path);
}

}  // namespace

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  KUIPER_ASSIGN_OR_RETURN(f.file_, map_file(path));
  const size_t size = f.file_.size;
  auto fail = [&path](const std::string& problem) { return Status::Error(path + ": " + problem); };
  if (size < 8) {
    return fail("truncated: the file has " + std::to_string(size) +
                " bytes, less than the 8-byte header length");
  }
  const uint64_t header_len = load_le64(f.file_.data());
  if (header_len > size - 8) {
    return fail("truncated: the header claims " + std::to_string(header_len) +
                " bytes but the file has " + std::to_string(size) + " bytes");
  }
  const char* header = reinterpret_cast<const char*>(f.file_.data() + 8);
  KUIPER_ASSIGN_OR_RETURN(json j, parse_json(std::string_view(header, header_len),
                                             path + ": header"));
  if (!j.is_object()) return fail("header is not a JSON object");
  const uint64_t data_start = 8 + header_len;
  for (const auto& [name, entry] : j.items()) {
    if (name == "__metadata__") continue;  // free-form strings, nothing the engine needs
    Result<SafetensorsTensor> t = parse_header_entry(name, entry, f.file_.data() + data_start,
                                                     size - data_start, data_start);
    if (!t.ok()) return t.status().With(path);
    f.tensors_.push_back(std::move(*t));
  }
  return f;
}

Result<SafetensorsCheckpoint> SafetensorsCheckpoint::open(const std::string& dir) {
  SafetensorsCheckpoint ckpt;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single_path = fs::path(dir) / "model.safetensors";
  std::error_code ec;
  // Sharded: the weight_map says which shard holds each tensor; checked below against the shards.
  json weight_map = json::object();
  if (fs::exists(index_path, ec)) {
    KUIPER_ASSIGN_OR_RETURN(json index, read_json_file(index_path.string()));
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      return Status::Error(index_path.string() + ": no \"weight_map\" object");
    }
    weight_map = index["weight_map"];
    std::set<std::string> opened;
    for (const auto& [name, shard] : weight_map.items()) {
      if (!shard.is_string()) {
        return Status::Error(index_path.string() + ": weight_map entry for '" + name +
                             "' is not a file name");
      }
      const std::string shard_name = shard.get<std::string>();
      if (!opened.insert(shard_name).second) continue;
      const fs::path shard_path = fs::path(dir) / shard_name;
      if (!fs::exists(shard_path, ec)) {
        return Status::Error(dir + ": shard '" + shard_name +
                             "' named by model.safetensors.index.json is missing");
      }
      KUIPER_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(shard_path.string()));
      ckpt.shards_.push_back(std::move(f));
    }
  } else if (fs::exists(single_path, ec)) {
    KUIPER_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(single_path.string()));
    ckpt.shards_.push_back(std::move(f));
  } else {
    return Status::Error(dir + ": no model.safetensors or model.safetensors.index.json");
  }

  for (size_t s = 0; s < ckpt.shards_.size(); ++s) {
    const std::vector<SafetensorsTensor>& tensors = ckpt.shards_[s].tensors();
    for (size_t t = 0; t < tensors.size(); ++t) {
      if (!ckpt.index_.emplace(tensors[t].name, std::make_pair(s, t)).second) {
        return Status::Error(dir + ": tensor '" + tensors[t].name + "' is in two shards (" +
                             ckpt.file_of(tensors[t].name) + " and " + ckpt.shards_[s].path() +
                             ")");
      }
    }
  }
  for (const auto& [name, shard] : weight_map.items()) {
    const std::string holder = ckpt.file_of(name);
    if (fs::path(holder).filename() != shard.get<std::string>()) {
      return Status::Error(dir + ": model.safetensors.index.json puts tensor '" + name +
                           "' in " + shard.get<std::string>() + ", which does not hold it");
    }
  }
  return ckpt;
}

const SafetensorsTensor* SafetensorsCheckpoint::find(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return nullptr;
  return &shards_[it->second.first].tensors()[it->second.second];
}

std::string SafetensorsCheckpoint::file_of(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? std::string() : shards_[it->second.first].path();
}

}  // namespace kuiper
