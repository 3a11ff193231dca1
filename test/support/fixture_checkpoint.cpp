#include "support/fixture_checkpoint.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

#include <gtest/gtest.h>

#include "kuiper/model/hf_checkpoint.h"
#include "support/paths.h"

namespace kuiper::test {

using nlohmann::json;
namespace fs = std::filesystem;

TempDir::TempDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                        "/kuiper-test-XXXXXX";
  if (::mkdtemp(&pattern[0]) == nullptr) {
    ADD_FAILURE() << "cannot create a temporary directory " << pattern;
    return;
  }
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!path_.empty()) fs::remove_all(path_, ec);
}

uint64_t fnv1a64(const std::string& text) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return h;
}

namespace {

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

const char* safetensors_dtype(DataType t) {
  switch (t) {
    case DataType::kBf16: return "BF16";
    case DataType::kFp16: return "F16";
    case DataType::kFp32: return "F32";
    default: return nullptr;
  }
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// A tensors.json entry's "set" list (see detweights.py) applied to the tensor's bf16 bits in
// order: each block of [begin, end) ranges, one per dimension, takes the value.
Status apply_sets(const std::string& name, const json& sets, const std::vector<int64_t>& shape,
                  std::vector<uint16_t>& bits) {
  for (const json& set : sets) {
    const json& at = set.value("at", json());
    if (!at.is_array() || at.size() != shape.size() || !set.contains("value") ||
        !set["value"].is_number()) {
      return Status::Error(name + ": a set needs \"at\" (one range per dimension) and a number "
                                  "\"value\": " + set.dump());
    }
    std::vector<int64_t> begin, end;
    for (size_t d = 0; d < at.size(); ++d) {
      const bool pair = at[d].is_array() && at[d].size() == 2 && at[d][0].is_number_integer() &&
                        at[d][1].is_number_integer();
      const int64_t b = pair ? at[d][0].get<int64_t>() : 0, e = pair ? at[d][1].get<int64_t>() : 0;
      if (!pair || b < 0 || b >= e || e > shape[d]) {
        return Status::Error(name + ": set at " + at.dump() + " does not fit shape " +
                             shape_string(shape));
      }
      begin.push_back(b);
      end.push_back(e);
    }
    const uint16_t value = float_to_bf16(static_cast<float>(set["value"].get<double>()));
    // Every index of the block, the last dimension fastest.
    std::vector<int64_t> index = begin;
    while (true) {
      int64_t flat = 0;
      for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + index[d];
      bits[static_cast<size_t>(flat)] = value;
      size_t d = shape.size();
      while (d > 0 && ++index[d - 1] == end[d - 1]) {
        index[d - 1] = begin[d - 1];
        --d;
      }
      if (d == 0) break;
    }
  }
  return Status::Ok();
}

// One safetensors file laid out exactly as detweights.py writes it: the header in insertion
// order with compact separators, "__metadata__" last, padded with spaces to 8 bytes. `sets`
// (by tensor name, may be null) plants values over the recipe's.
Status write_safetensors(const std::string& path, const std::vector<TensorSpec>& tensors,
                         DataType dtype, const std::map<std::string, json>* sets = nullptr) {
  const char* dtype_label = safetensors_dtype(dtype);
  if (dtype_label == nullptr) {
    return Status::Error(std::string("cannot store ") + dtype_name(dtype) + " in a test checkpoint");
  }
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  uint64_t offset = 0;
  for (const TensorSpec& t : tensors) {
    const uint64_t nbytes = static_cast<uint64_t>(numel(t.shape)) * dtype_size(dtype);
    header[t.name] = {{"dtype", dtype_label}, {"shape", t.shape},
                      {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::Error("cannot create " + path);
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(text.size() >> (8 * i));
  out.write(reinterpret_cast<const char*>(length), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  std::vector<uint8_t> data;
  for (const TensorSpec& t : tensors) {
    std::vector<uint16_t> bits = fixture_bf16(t.name, t.shape);
    if (sets != nullptr && sets->count(t.name) != 0) {
      KUIPER_RETURN_IF_ERROR(apply_sets(t.name, sets->at(t.name), t.shape, bits));
    }
    data.resize(bits.size() * dtype_size(dtype));
    KUIPER_RETURN_IF_ERROR(
        convert_elements(bits.data(), DataType::kBf16, data.data(), dtype, bits.size()));
    out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  }
  out.close();
  if (!out) return Status::Error("cannot write " + path);
  return Status::Ok();
}

Status copy_into(const fs::path& file, const std::string& out_dir) {
  std::error_code ec;
  fs::copy_file(file, fs::path(out_dir) / file.filename(), fs::copy_options::overwrite_existing,
                ec);
  if (ec) return Status::Error("cannot copy " + file.string() + ": " + ec.message());
  return Status::Ok();
}

Status copy_tokenizer(const std::string& out_dir) {
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
    if (fs::exists(fs::path(out_dir) / name)) continue;  // the fixture's own wins
    KUIPER_RETURN_IF_ERROR(copy_into(fs::path(tokenizer_dir()) / name, out_dir));
  }
  return Status::Ok();
}

Status write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  return out ? Status::Ok() : Status::Error("cannot write " + path);
}

Result<json> read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::Error("cannot open " + path);
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded()) return Status::Error(path + " is not valid JSON");
  return j;
}

}  // namespace

std::vector<uint16_t> fixture_bf16(const std::string& name, const std::vector<int64_t>& shape) {
  const int64_t n = numel(shape);
  double center = 0.0, scale = 0.05;  // 1-D, not a norm: a bias
  if (shape.size() == 1 && name.find("norm") != std::string::npos) {
    center = 1.0;
    scale = 0.1;
  } else if (shape.size() != 1) {
    int64_t fan_in = 1;
    for (size_t d = 1; d < shape.size(); ++d) fan_in *= shape[d];
    scale = std::sqrt(3.0 / static_cast<double>(fan_in));
  }
  const uint64_t seed = fnv1a64(name);
  std::vector<uint16_t> bits(static_cast<size_t>(n));
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) {
    // Same arithmetic, in the same order and precision, as the numpy recipe.
    const double u = static_cast<double>(splitmix64(seed + static_cast<uint64_t>(i)) >> 40) /
                     static_cast<double>(1 << 24);
    const double value = center + scale * (2.0 * u - 1.0);
    bits[static_cast<size_t>(i)] = float_to_bf16(static_cast<float>(value));
  }
  return bits;
}

Status write_fixture_checkpoint(const std::string& fixture_dir, const std::string& out_dir) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return Status::Error("cannot create " + out_dir + ": " + ec.message());
  for (const fs::directory_entry& entry : fs::directory_iterator(fixture_dir, ec)) {
    const fs::path& p = entry.path();
    const bool wanted = (p.extension() == ".json" && p.filename() != "tensors.json") ||
                        p.extension() == ".png";
    if (wanted) KUIPER_RETURN_IF_ERROR(copy_into(p, out_dir));
  }
  if (ec) return Status::Error("cannot list " + fixture_dir + ": " + ec.message());
  KUIPER_RETURN_IF_ERROR(copy_tokenizer(out_dir));

  KUIPER_ASSIGN_OR_RETURN(json list, read_json(fixture_dir + "/tensors.json"));
  std::vector<TensorSpec> tensors;
  std::map<std::string, json> sets;
  for (const json& t : list) {
    tensors.push_back({t.at("name").get<std::string>(), t.at("shape").get<std::vector<int64_t>>()});
    if (t.contains("set")) sets[tensors.back().name] = t["set"];
  }
  return write_safetensors(out_dir + "/model.safetensors", tensors, DataType::kBf16, &sets);
}

Status write_checkpoint(const json& hf_config, const std::vector<TensorSpec>& tensors,
                        const std::string& out_dir, const CheckpointOptions& options) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return Status::Error("cannot create " + out_dir + ": " + ec.message());
  KUIPER_RETURN_IF_ERROR(write_text(out_dir + "/config.json", hf_config.dump(2)));
  if (options.tokenizer) KUIPER_RETURN_IF_ERROR(copy_tokenizer(out_dir));
  if (options.shards <= 1) {
    return write_safetensors(out_dir + "/model.safetensors", tensors, options.dtype);
  }

  const size_t shards = static_cast<size_t>(options.shards);
  const size_t per_shard = (tensors.size() + shards - 1) / shards;
  json weight_map = json::object();
  uint64_t total_size = 0;
  for (size_t s = 0; s < shards; ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards);
    const size_t begin = std::min(tensors.size(), s * per_shard);
    const size_t end = std::min(tensors.size(), begin + per_shard);
    std::vector<TensorSpec> part(tensors.begin() + begin, tensors.begin() + end);
    for (const TensorSpec& t : part) {
      weight_map[t.name] = name;
      total_size += static_cast<uint64_t>(numel(t.shape)) * dtype_size(options.dtype);
    }
    KUIPER_RETURN_IF_ERROR(write_safetensors(out_dir + "/" + name, part, options.dtype));
  }
  json index = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  return write_text(out_dir + "/model.safetensors.index.json", index.dump(2));
}

Status write_checkpoint(const json& hf_config, const std::string& out_dir,
                        const CheckpointOptions& options) {
  KUIPER_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::from_hf(hf_config));
  return write_checkpoint(hf_config, expected_tensors(config), out_dir, options);
}

namespace {

// Identifies what a cached conversion was made from: this test binary (any change to the
// converter relinks it) and the fixture's description.
Result<std::string> cache_stamp(const std::string& fixture_dir) {
  struct stat st;
  if (::stat("/proc/self/exe", &st) != 0) return Status::Error("cannot stat /proc/self/exe");
  std::string key = std::to_string(st.st_mtim.tv_sec) + "." +
                    std::to_string(st.st_mtim.tv_nsec) + "." + std::to_string(st.st_size);
  for (const char* name : {"config.json", "tensors.json"}) {
    std::ifstream in(fixture_dir + "/" + name, std::ios::binary);
    if (!in) return Status::Error("cannot read " + fixture_dir + "/" + name);
    std::ostringstream text;
    text << in.rdbuf();
    key += text.str();
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a64(key)));
  return std::string(hex);
}

Result<std::string> make_converted_fixture(const std::string& name, DataType dtype) {
  const std::string fixture_dir = fixtures_dir() + "/" + name;
  KUIPER_ASSIGN_OR_RETURN(std::string stamp, cache_stamp(fixture_dir));
  const fs::path cache_dir = fs::path(bin_dir()).parent_path() / "test-fixtures";
  const std::string prefix = name + "." + dtype_name(dtype) + ".";
  const fs::path path = cache_dir / (prefix + stamp + ".bin");
  std::error_code ec;
  if (fs::exists(path, ec)) return path.string();

  fs::create_directories(cache_dir, ec);
  if (ec) return Status::Error("cannot create " + cache_dir.string() + ": " + ec.message());
  // Conversions from older builds of this fixture are stale; a process still using one keeps
  // its mapping, since removing a mapped file only unlinks its name. Files of this stamp (a
  // parallel process's temporary among them) are left alone.
  for (const fs::directory_entry& entry : fs::directory_iterator(cache_dir, ec)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind(prefix, 0) == 0 && file.rfind(prefix + stamp, 0) != 0) {
      fs::remove(entry.path(), ec);
    }
  }
  TempDir hf;
  if (hf.path().empty()) return Status::Error("no temporary directory");
  KUIPER_RETURN_IF_ERROR(write_fixture_checkpoint(fixture_dir, hf.path()));
  // The writer renames a complete file into place, so parallel test processes racing here
  // each produce the same bytes and the last rename wins harmlessly.
  KUIPER_RETURN_IF_ERROR(convert_checkpoint(hf.path(), path.string(), dtype));
  return path.string();
}

}  // namespace

std::string converted_fixture(const std::string& name, DataType dtype) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  Result<std::string> path = make_converted_fixture(name, dtype);
  if (!path.ok()) {
    ADD_FAILURE() << "converted_fixture(" << name << ", " << dtype_name(dtype)
                  << "): " << path.status().message();
    return std::string();
  }
  return *path;
}

}  // namespace kuiper::test
