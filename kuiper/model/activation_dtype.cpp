#include "kuiper/model/activation_dtype.h"

#include <map>

namespace kuiper {

namespace {

bool is_activation_dtype(DataType t) {
  return t == DataType::kBf16 || t == DataType::kFp16 || t == DataType::kFp32;
}

// An explicit request `device` can run, or why not.
Status check_requested(DataType requested, DeviceType device) {
  if (!is_activation_dtype(requested)) {
    return Status::Error(std::string(dtype_name(requested)) +
                         " activations are not supported (expected bf16, fp16 or fp32)");
  }
  if (device == DeviceType::kCpu && requested != DataType::kFp32) {
    return Status::Error(std::string(dtype_name(requested)) +
                         " on the cpu: the CPU computes in fp32 (expected auto or fp32)");
  }
  return Status::Ok();
}

}  // namespace

Result<std::optional<DataType>> parse_activation_dtype(const std::string& name,
                                                       DeviceType device) {
  if (name == "auto") return std::optional<DataType>();
  for (DataType t : {DataType::kBf16, DataType::kFp16, DataType::kFp32}) {
    if (name != dtype_name(t)) continue;
    KUIPER_RETURN_IF_ERROR(check_requested(t, device));
    return std::optional<DataType>(t);
  }
  return Status::Error("unknown dtype '" + name + "' (expected auto, bf16, fp16 or fp32)");
}

DataType checkpoint_dtype(const ModelFile& file) {
  std::map<DataType, uint64_t> elements;
  for (const TensorEntry& e : file.tensors()) {
    if (is_activation_dtype(e.dtype)) elements[e.dtype] += e.nbytes / dtype_size(e.dtype);
  }
  DataType most = DataType::kFp32;
  uint64_t most_elements = 0;
  for (const auto& [dtype, count] : elements) {
    if (count > most_elements) {
      most = dtype;
      most_elements = count;
    }
  }
  return most;
}

Result<DataType> resolve_activation(std::optional<DataType> requested, DataType stored,
                                    DeviceType device) {
  if (requested.has_value()) {
    KUIPER_RETURN_IF_ERROR(check_requested(*requested, device));
    return *requested;
  }
  if (device == DeviceType::kCpu) return DataType::kFp32;
  if (!is_activation_dtype(stored)) {
    return Status::Error(std::string("weights stored as ") + dtype_name(stored) +
                         " name no activation dtype: ask for bf16, fp16 or fp32");
  }
  return stored;
}

}  // namespace kuiper
