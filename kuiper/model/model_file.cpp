#include "kuiper/model/model_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>
#include <unordered_map>

#include <glog/logging.h>

#include "kuiper/base/json_reader.h"
#include "kuiper/model/quantization.h"

namespace kuiper {

using nlohmann::json;

namespace {

constexpr size_t kHeaderSize = 24;  // magic, version, reserved, metadata length

std::string errno_text(int err) { return std::strerror(err); }

uint64_t align_up(uint64_t v) {
  return (v + kModelFileAlignment - 1) / kModelFileAlignment * kModelFileAlignment;
}

// The format is little-endian on disk whatever the host is, so integers go byte by byte.
uint64_t load_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void store_le(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

std::string quote_name(const std::string& name) { return "'" + name + "'"; }

// numel * dtype size; a corrupted shape must not overflow into a small, plausible size.
Result<uint64_t> tensor_nbytes(const std::string& name, const std::vector<int64_t>& shape,
                               DataType dtype) {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) {
      return Status::Error("tensor " + quote_name(name) + " has an impossible shape " +
                           shape_string(shape));
    }
  }
  return n;
}

using EntryMap = std::unordered_map<std::string, const TensorEntry*>;

// A quantized matrix's parts (quantization.h) against its format and the [N, K] the config
// implies: op::check_weight judges shapeless views of the entries, so the file is held to the
// same layout rules the ops are.
Status check_quantized(const TensorSpec& spec, const QuantizedEntry& q, const EntryMap& by_name) {
  const std::string what = "tensor " + quote_name(spec.name) + " (" +
                           op::weight_format_name(q.format) + ")";
  auto part = [&](const std::string& name, Tensor* out) -> Status {
    auto it = by_name.find(name);
    if (it == by_name.end()) return Status::Error(what + ": " + quote_name(name) + " is missing");
    *out = Tensor::view(nullptr, it->second->shape, it->second->dtype, DeviceType::kCpu);
    return Status::Ok();
  };
  op::Weight w;
  w.format = q.format;
  w.block_rows = q.block_rows;
  w.block_cols = q.block_cols;
  KUIPER_RETURN_IF_ERROR(part(spec.name, &w.values));
  KUIPER_RETURN_IF_ERROR(part(spec.name + kScalesSuffix, &w.scales));
  if (q.format != op::WeightFormat::kFp8) {
    KUIPER_RETURN_IF_ERROR(part(spec.name + kZerosSuffix, &w.zeros));
  }
  if (spec.shape.size() != 2) return Status::Error(what + ": not a matrix");
  if (w.values.ndim() != 2) {
    return Status::Error(what + ": values " + w.values.describe() + " are not a matrix");
  }
  KUIPER_RETURN_IF_ERROR(op::check_weight(w).With(what));
  if (w.rows() != spec.shape[0] || w.cols() != spec.shape[1]) {
    return Status::Error(what + " holds " + shape_string({w.rows(), w.cols()}) +
                         " but the config implies " + shape_string(spec.shape));
  }
  return Status::Ok();
}

// The rules a tensor table obeys both when written and when read: unique names, aligned
// offsets, sizes that match shape and dtype, and exactly the tensors and shapes the config needs,
// each plain (fp32, fp16 or bf16) or, where the metadata's "quantization" names it, quantized.
// Tensors the config does not list are allowed, so later files can carry extras.
Status check_tensor_table(const ModelConfig& config, const json& metadata,
                          const std::vector<TensorEntry>& entries) {
  EntryMap by_name;
  for (const TensorEntry& e : entries) {
    if (!by_name.emplace(e.name, &e).second) {
      return Status::Error("tensor " + quote_name(e.name) + " appears twice");
    }
    KUIPER_ASSIGN_OR_RETURN(uint64_t expected_bytes, tensor_nbytes(e.name, e.shape, e.dtype));
    if (e.nbytes != expected_bytes) {
      return Status::Error("tensor " + quote_name(e.name) + " has nbytes " +
                           std::to_string(e.nbytes) + " but " + dtype_name(e.dtype) +
                           shape_string(e.shape) + " needs " + std::to_string(expected_bytes));
    }
    if (e.offset % kModelFileAlignment != 0) {
      return Status::Error("tensor " + quote_name(e.name) + " has offset " +
                           std::to_string(e.offset) + ", not a multiple of " +
                           std::to_string(kModelFileAlignment));
    }
  }
  KUIPER_ASSIGN_OR_RETURN(auto quantized, parse_quantization(metadata));
  std::unordered_map<std::string, QuantizedEntry> quantized_by_name;
  const std::vector<std::string> allowed = quantizable_tensors(config);
  for (const auto& [name, q] : quantized) {
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      return Status::Error("tensor " + quote_name(name) +
                           " is quantized, but only the decoder's projections and an untied "
                           "lm_head may be");
    }
    quantized_by_name.emplace(name, q);
  }
  for (const TensorSpec& spec : expected_tensors(config)) {
    auto it = by_name.find(spec.name);
    if (it == by_name.end()) {
      return Status::Error("tensor " + quote_name(spec.name) + " is missing (the config needs it)");
    }
    auto q = quantized_by_name.find(spec.name);
    if (q != quantized_by_name.end()) {
      KUIPER_RETURN_IF_ERROR(check_quantized(spec, q->second, by_name));
      continue;
    }
    const DataType dtype = it->second->dtype;
    if (dtype != DataType::kFp32 && dtype != DataType::kFp16 && dtype != DataType::kBf16) {
      return Status::Error("tensor " + quote_name(spec.name) + " has dtype " + dtype_name(dtype) +
                           "; weights are fp32, fp16 or bf16");
    }
    if (it->second->shape != spec.shape) {
      return Status::Error("tensor " + quote_name(spec.name) + " has shape " +
                           shape_string(it->second->shape) + " but the config implies " +
                           shape_string(spec.shape));
    }
  }
  return Status::Ok();
}

Result<TensorEntry> parse_entry(const JsonReader& j) {
  TensorEntry e;
  KUIPER_ASSIGN_OR_RETURN(e.name, j.get_string("name"));
  KUIPER_ASSIGN_OR_RETURN(std::string dtype_text, j.get_string("dtype"));
  Result<DataType> dtype = parse_dtype(dtype_text);
  if (!dtype.ok()) return dtype.status().With("tensor " + quote_name(e.name));
  e.dtype = *dtype;
  KUIPER_ASSIGN_OR_RETURN(JsonReader shape, j.at("shape"));
  KUIPER_ASSIGN_OR_RETURN(e.shape, shape.to_int_list(0, JsonReader::kIntMax));
  KUIPER_ASSIGN_OR_RETURN(JsonReader offset, j.at("offset"));
  KUIPER_ASSIGN_OR_RETURN(e.offset, offset.to_uint64());
  KUIPER_ASSIGN_OR_RETURN(JsonReader nbytes, j.at("nbytes"));
  KUIPER_ASSIGN_OR_RETURN(e.nbytes, nbytes.to_uint64());
  return e;
}

json tensor_table_json(const std::vector<TensorEntry>& entries) {
  json table = json::array();
  for (const TensorEntry& e : entries) {
    table.push_back({{"name", e.name},
                     {"dtype", dtype_name(e.dtype)},
                     {"shape", e.shape},
                     {"offset", e.offset},
                     {"nbytes", e.nbytes}});
  }
  return table;
}

Status write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::Error(errno_text(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

Status write_zeros(int fd, uint64_t n) {
  static const char zeros[4096] = {};
  while (n > 0) {
    size_t chunk = n < sizeof zeros ? static_cast<size_t>(n) : sizeof zeros;
    KUIPER_RETURN_IF_ERROR(write_all(fd, zeros, chunk));
    n -= chunk;
  }
  return Status::Ok();
}

// A fresh file beside `path`, so the final rename stays within one filesystem and is atomic.
// The pid and a counter keep concurrent writers (processes or threads) of one path apart.
Result<int> create_temp_beside(const std::string& path, std::string& tmp_path) {
  static std::atomic<unsigned> counter{0};
  for (int attempt = 0; attempt < 100; ++attempt) {
    tmp_path = path + ".partial-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) return fd;
    if (errno != EEXIST) return Status::Error("cannot create " + path + ": " + errno_text(errno));
  }
  return Status::Error("cannot create " + path + ": no free temporary name beside it");
}

// Header, metadata, then each tensor filled into one reused buffer and written at its offset:
// memory use is the largest tensor, never the whole model.
Status write_contents(int fd, const std::string& prefix, const std::vector<TensorSource>& tensors,
                      const std::vector<TensorEntry>& entries,
                      const std::function<void(size_t, size_t)>& progress) {
  KUIPER_RETURN_IF_ERROR(write_all(fd, prefix.data(), prefix.size()));
  uint64_t largest = 0;
  for (const TensorEntry& e : entries) largest = std::max(largest, e.nbytes);
  std::unique_ptr<uint8_t[]> buffer(new (std::nothrow) uint8_t[largest > 0 ? largest : 1]);
  if (!buffer) {
    return Status::Error("out of memory for a " + std::to_string(largest) + "-byte tensor");
  }
  uint64_t position = 0;  // within the data section
  for (size_t i = 0; i < entries.size(); ++i) {
    const TensorEntry& e = entries[i];
    KUIPER_RETURN_IF_ERROR(tensors[i].fill(buffer.get()).With("tensor " + quote_name(e.name)));
    KUIPER_RETURN_IF_ERROR(write_zeros(fd, e.offset - position));
    KUIPER_RETURN_IF_ERROR(write_all(fd, buffer.get(), e.nbytes));
    position = e.offset + e.nbytes;
    if (progress) progress(i + 1, entries.size());
  }
  return Status::Ok();
}

}  // namespace

Result<MappedFile> map_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Error("cannot open " + path + ": " + errno_text(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return Status::Error("cannot stat " + path + ": " + errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::Error(path + " is not a regular file");
  }
  MappedFile file;
  file.size = static_cast<size_t>(st.st_size);
  if (file.size > 0) {  // mmap refuses a zero length
    void* p = ::mmap(nullptr, file.size, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    ::close(fd);  // the mapping keeps the file referenced
    if (p == MAP_FAILED) return Status::Error("cannot map " + path + ": " + errno_text(err));
    size_t size = file.size;
    file.mapping = std::shared_ptr<const void>(
        p, [size](const void* q) { ::munmap(const_cast<void*>(q), size); });
  } else {
    ::close(fd);
  }
  return file;
}

ModelFile::~ModelFile() = default;

Result<std::shared_ptr<ModelFile>> ModelFile::open(const std::string& path) {
  KUIPER_ASSIGN_OR_RETURN(MappedFile file, map_file(path));
  auto fail = [&path](const std::string& problem) { return Status::Error(path + ": " + problem); };
  const uint8_t* bytes = file.data();
  const size_t size = file.size;

  if (size == 0) return fail("empty file, not a Kuiper model file");
  if (std::memcmp(bytes, kModelFileMagic, std::min<size_t>(size, sizeof kModelFileMagic)) != 0) {
    return fail("not a Kuiper model file (bad magic)");
  }
  if (size < kHeaderSize) {
    return fail("truncated: the file has " + std::to_string(size) + " bytes, less than the " +
                std::to_string(kHeaderSize) + "-byte header");
  }
  const uint64_t version = load_le(bytes + 8, 4);
  if (version != kModelFileVersion) {
    return fail("unsupported model file version " + std::to_string(version) +
                " (this build reads " + std::to_string(kModelFileVersion) + ")");
  }
  if (load_le(bytes + 12, 4) != 0) return fail("corrupt header: bytes 12..15 are not zero");
  const uint64_t metadata_len = load_le(bytes + 16, 8);
  if (metadata_len > size - kHeaderSize) {
    return fail("truncated: " + std::to_string(metadata_len) + " bytes of metadata from byte " +
                std::to_string(kHeaderSize) + " but the file has " + std::to_string(size) +
                " bytes");
  }

  std::shared_ptr<ModelFile> mf(new ModelFile());
  mf->path_ = path;
  mf->file_size_ = size;
  mf->data_offset_ = align_up(kHeaderSize + metadata_len);
  const char* meta_begin = reinterpret_cast<const char*>(bytes + kHeaderSize);
  KUIPER_ASSIGN_OR_RETURN(mf->metadata_, parse_json(std::string_view(meta_begin, metadata_len),
                                                    path + ": metadata"));
  const json& meta = mf->metadata_;
  if (!meta.is_object()) return fail("metadata is not a JSON object");
  if (!meta.contains("architecture") || !meta["architecture"].is_string()) {
    return fail("metadata has no \"architecture\" string");
  }
  if (!meta.contains("config") || !meta["config"].is_object()) {
    return fail("metadata has no \"config\" object");
  }
  if (!meta.contains("tensors") || !meta["tensors"].is_array()) {
    return fail("metadata has no \"tensors\" array");
  }
  for (const char* key : {"tokenizer_json", "tokenizer_config_json"}) {
    if (meta.contains(key) && !meta[key].is_string()) {
      return fail(std::string("metadata \"") + key + "\" is not a string");
    }
  }

  Result<ModelConfig> config = ModelConfig::from_json(meta["config"]);
  if (!config.ok()) return config.status().With(path);
  mf->config_ = *config;
  const std::string arch = meta["architecture"].get<std::string>();
  if (arch != architecture_name(mf->config_.arch)) {
    return fail("metadata architecture '" + arch + "' does not match the config's '" +
                architecture_name(mf->config_.arch) + "'");
  }

  KUIPER_ASSIGN_OR_RETURN(JsonReader tensors, JsonReader(meta, "metadata").at("tensors"));
  KUIPER_ASSIGN_OR_RETURN(std::vector<JsonReader> table, tensors.elements());
  for (const JsonReader& row : table) {
    Result<TensorEntry> entry = parse_entry(row);
    if (!entry.ok()) return entry.status().With(path);
    mf->tensors_.push_back(std::move(*entry));
  }
  KUIPER_RETURN_IF_ERROR(check_tensor_table(mf->config_, meta, mf->tensors_).With(path));
  for (const TensorEntry& e : mf->tensors_) {
    uint64_t end;
    if (__builtin_add_overflow(mf->data_offset_, e.offset, &end) ||
        __builtin_add_overflow(end, e.nbytes, &end)) {
      return fail("tensor " + quote_name(e.name) + " has an impossible extent (offset " +
                  std::to_string(e.offset) + ", " + std::to_string(e.nbytes) + " bytes)");
    }
    if (end > size) {
      return fail("truncated: tensor " + quote_name(e.name) + " ends at byte " +
                  std::to_string(end) + " but the file has " + std::to_string(size) + " bytes");
    }
  }
  KUIPER_ASSIGN_OR_RETURN(auto quantized, parse_quantization(meta));  // checked above
  for (auto& [name, q] : quantized) mf->quantized_.emplace(name, q);
  mf->mapping_ = std::move(file.mapping);
  VLOG(1) << path << ": " << arch << ", " << mf->config_.num_layers << " layers, hidden "
          << mf->config_.hidden_size << ", " << mf->tensors_.size() << " tensors, " << size
          << " bytes";
  return mf;
}

std::string ModelFile::tokenizer_json() const {
  return metadata_.value("tokenizer_json", std::string());
}

std::string ModelFile::tokenizer_config_json() const {
  return metadata_.value("tokenizer_config_json", std::string());
}

const TensorEntry* ModelFile::find(const std::string& name) const {
  for (const TensorEntry& e : tensors_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

Result<Tensor> ModelFile::tensor(const std::string& name) const {
  const TensorEntry* e = find(name);
  if (e == nullptr) return Status::Error(path_ + ": no tensor " + quote_name(name));
  // The mapping is read-only: the view is for reading (or copying to a device) only.
  auto* data = const_cast<uint8_t*>(static_cast<const uint8_t*>(mapping_.get())) +
               data_offset_ + e->offset;
  return Tensor::view(data, e->shape, e->dtype, DeviceType::kCpu, mapping_);
}

Result<op::Weight> ModelFile::weight(const std::string& name) const {
  op::Weight w;
  KUIPER_ASSIGN_OR_RETURN(w.values, tensor(name));
  auto q = quantized_.find(name);
  if (q == quantized_.end()) return w;
  w.format = q->second.format;
  w.block_rows = q->second.block_rows;
  w.block_cols = q->second.block_cols;
  KUIPER_ASSIGN_OR_RETURN(w.scales, tensor(name + kScalesSuffix));
  if (w.format != op::WeightFormat::kFp8) {
    KUIPER_ASSIGN_OR_RETURN(w.zeros, tensor(name + kZerosSuffix));
  }
  return w;
}

Status write_model_file(const std::string& path, const ModelConfig& config, json metadata,
                        const std::vector<TensorSource>& tensors,
                        const std::function<void(size_t, size_t)>& progress) {
  auto fail = [&path](const std::string& problem) { return Status::Error(path + ": " + problem); };
  KUIPER_RETURN_IF_ERROR(config.validate().With(path));
  if (metadata.is_null()) metadata = json::object();
  if (!metadata.is_object()) return fail("metadata must be a JSON object");

  std::vector<TensorEntry> entries;
  uint64_t position = 0;
  for (const TensorSource& src : tensors) {
    if (!src.fill) return fail("tensor " + quote_name(src.name) + " has nothing to fill it");
    TensorEntry e{src.name, src.dtype, src.shape, position, 0};
    Result<uint64_t> nbytes = tensor_nbytes(src.name, src.shape, src.dtype);
    if (!nbytes.ok()) return nbytes.status().With(path);
    e.nbytes = *nbytes;
    position = align_up(e.offset + e.nbytes);
    entries.push_back(std::move(e));
  }
  // Refuse before writing anything a file that open() would reject.
  KUIPER_RETURN_IF_ERROR(check_tensor_table(config, metadata, entries).With(path));

  metadata["architecture"] = architecture_name(config.arch);
  metadata["config"] = config.to_json();
  metadata["tensors"] = tensor_table_json(entries);
  std::string text;
  try {
    text = metadata.dump();
  } catch (const json::type_error& e) {
    return fail(std::string("metadata cannot be written as JSON: ") + e.what());
  }
  std::string prefix(kHeaderSize, '\0');
  std::memcpy(&prefix[0], kModelFileMagic, sizeof kModelFileMagic);
  store_le(reinterpret_cast<uint8_t*>(&prefix[8]), kModelFileVersion, 4);
  store_le(reinterpret_cast<uint8_t*>(&prefix[16]), text.size(), 8);
  prefix += text;
  prefix.resize(align_up(prefix.size()), '\0');

  std::string tmp_path;
  KUIPER_ASSIGN_OR_RETURN(int fd, create_temp_beside(path, tmp_path));
  Status s = write_contents(fd, prefix, tensors, entries, progress);
  // fsync before rename: after a crash the path holds the old file or the whole new one.
  if (s.ok() && ::fsync(fd) != 0) s = Status::Error(errno_text(errno));
  if (::close(fd) != 0 && s.ok()) s = Status::Error(errno_text(errno));
  if (s.ok() && ::rename(tmp_path.c_str(), path.c_str()) != 0) {
    s = Status::Error("cannot rename into place: " + errno_text(errno));
  }
  if (!s.ok()) ::unlink(tmp_path.c_str());
  return s.With(path);
}

}  // namespace kuiper
