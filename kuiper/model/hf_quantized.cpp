#include "kuiper/model/hf_quantized.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "kuiper/base/json_reader.h"
#include "kuiper/op/ops.h"

namespace kuiper {

using nlohmann::json;

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

Status unsupported(const std::string& what) {
  return Status::Error("quantization_config: " + what + " is not supported");
}

// The group size of awq / gptq: a positive count, or -1 for whole rows (0 here).
Result<int64_t> parse_group(const JsonReader& q) {
  KUIPER_ASSIGN_OR_RETURN(int64_t group, q.get_int_or("group_size", 128, -1, int64_t{1} << 20));
  if (group == 0) return unsupported("group_size 0");
  return group < 0 ? 0 : group;
}

}  // namespace

Result<HfQuantization> parse_hf_quantization(const json& hf_config) {
  HfQuantization h;
  const JsonReader root(hf_config, "config.json");
  if (!root.is_object() || !root.has("quantization_config")) return h;
  KUIPER_ASSIGN_OR_RETURN(JsonReader q, root.at("quantization_config"));
  KUIPER_ASSIGN_OR_RETURN(std::string method, q.get_string_or("quant_method", "unknown"));
  method = lower(method);
  if (method == "fp8") {
    h.method = HfQuantMethod::kFp8;
    KUIPER_ASSIGN_OR_RETURN(std::string scheme, q.get_string_or("activation_scheme", "dynamic"));
    if (scheme != "dynamic") {
      return unsupported("fp8 activation_scheme '" + scheme + "' (only dynamic)");
    }
    KUIPER_ASSIGN_OR_RETURN(std::string fmt, q.get_string_or("fmt", "e4m3"));
    if (fmt != "e4m3") return unsupported("fp8 fmt '" + fmt + "' (only e4m3)");
    if (!q.has("weight_block_size")) {
      return unsupported("fp8 without weight_block_size (per-tensor FP8)");
    }
    KUIPER_ASSIGN_OR_RETURN(JsonReader block, q.at("weight_block_size"));
    KUIPER_ASSIGN_OR_RETURN(std::vector<int64_t> b, block.to_int_list(1, int64_t{1} << 20));
    if (b.size() != 2) return block.error("must be two positive integers");
    h.block_rows = b[0];
    h.block_cols = b[1];
    return h;
  }
  if (method == "awq") {
    h.method = HfQuantMethod::kAwq;
    KUIPER_ASSIGN_OR_RETURN(std::string version, q.get_string_or("version", "gemm"));
    if (lower(version) != "gemm") {
      return unsupported("awq version '" + version + "' (only gemm, AutoAWQ's default)");
    }
    KUIPER_ASSIGN_OR_RETURN(h.bits, q.get_int_or("bits", 4, 0, 64));
    if (h.bits != 4) return unsupported("awq with " + std::to_string(h.bits) + " bits (only 4)");
    KUIPER_ASSIGN_OR_RETURN(bool zero_point, q.get_bool_or("zero_point", true));
    if (!zero_point) return unsupported("awq without zero_point");
    KUIPER_ASSIGN_OR_RETURN(h.group, parse_group(q));
    return h;
  }
  if (method == "gptq") {
    h.method = HfQuantMethod::kGptq;
    KUIPER_ASSIGN_OR_RETURN(h.bits, q.get_int_or("bits", 4, 0, 64));
    if (h.bits != 4 && h.bits != 8) {
      return unsupported("gptq with " + std::to_string(h.bits) + " bits (only 4 or 8)");
    }
    KUIPER_ASSIGN_OR_RETURN(bool desc_act, q.get_bool_or("desc_act", false));
    if (desc_act) return unsupported("gptq desc_act (act-order)");
    KUIPER_ASSIGN_OR_RETURN(h.group, parse_group(q));
    // GPTQModel writes "format", AutoGPTQ / optimum "checkpoint_format"; "gptq" is v1.
    std::string format = "gptq";
    for (const char* key : {"checkpoint_format", "format"}) {
      if (q.has(key)) {
        KUIPER_ASSIGN_OR_RETURN(format, q.get_string(key));
      }
    }
    format = lower(format);
    if (format != "gptq" && format != "gptq_v2") {
      return unsupported("gptq checkpoint_format '" + format + "' (gptq or gptq_v2)");
    }
    h.gptq_zero_offset = format == "gptq";
    return h;
  }
  return unsupported("quant_method " + method + " (fp8, awq or gptq are read)");
}

Result<op::Weight> repack_awq(const int32_t* qweight, const int32_t* qzeros,
                              const uint16_t* scales, int64_t N, int64_t K, int64_t group) {
  if (N % 8 != 0) return Status::Error("awq: " + std::to_string(N) + " rows, not a multiple of 8");
  KUIPER_ASSIGN_OR_RETURN(op::Weight w, op::empty_weight(op::WeightFormat::kInt4, N, K, 1, group,
                                                         DeviceType::kCpu));
  const int64_t words = N / 8, groups = K / group;
  auto nibble = [](int32_t word, int64_t n) {
    return static_cast<uint8_t>((static_cast<uint32_t>(word) >> (4 * kAwqSlot[n % 8])) & 0xf);
  };
  uint8_t* v = w.values.data<uint8_t>();
  std::memset(v, 0, w.values.nbytes());
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < N; ++n) {
      v[n * (K / 2) + k / 2] |= static_cast<uint8_t>(nibble(qweight[k * words + n / 8], n)
                                                     << (4 * (k % 2)));
    }
  }
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t n = 0; n < N; ++n) {
      w.zeros.data<uint8_t>()[n * groups + g] = nibble(qzeros[g * words + n / 8], n);
      w.scales.data<uint16_t>()[n * groups + g] = scales[g * N + n];
    }
  }
  return w;
}

Result<op::Weight> repack_gptq(const int32_t* qweight, const int32_t* qzeros,
                               const uint16_t* scales, int64_t N, int64_t K, int64_t group,
                               int64_t bits, bool zero_offset) {
  const int64_t per_word = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  if (K % per_word != 0 || N % per_word != 0) {
    return Status::Error("gptq: a " + std::to_string(bits) + "-bit [" + std::to_string(N) + ", " +
                         std::to_string(K) + "] matrix must have both sides multiples of " +
                         std::to_string(per_word));
  }
  const op::WeightFormat format = bits == 4 ? op::WeightFormat::kInt4 : op::WeightFormat::kInt8;
  KUIPER_ASSIGN_OR_RETURN(op::Weight w,
                          op::empty_weight(format, N, K, 1, group, DeviceType::kCpu));
  const int64_t groups = K / group, value_cols = w.values.dim(1);
  uint8_t* v = w.values.data<uint8_t>();
  std::memset(v, 0, w.values.nbytes());
  for (int64_t k = 0; k < K; ++k) {
    const int64_t shift = bits * (k % per_word);
    for (int64_t n = 0; n < N; ++n) {
      const uint32_t q = (static_cast<uint32_t>(qweight[(k / per_word) * N + n]) >> shift) & mask;
      if (bits == 4) {
        v[n * value_cols + k / 2] |= static_cast<uint8_t>(q << (4 * (k % 2)));
      } else {
        v[n * value_cols + k] = static_cast<uint8_t>(q);
      }
    }
  }
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t n = 0; n < N; ++n) {
      const uint32_t word = static_cast<uint32_t>(qzeros[g * (N / per_word) + n / per_word]);
      const uint32_t z = ((word >> (bits * (n % per_word))) & mask) + (zero_offset ? 1 : 0);
      if (z > mask) {
        return Status::Error("gptq: zero point " + std::to_string(z) + " of row " +
                             std::to_string(n) + ", group " + std::to_string(g) +
                             " does not fit " + std::to_string(bits) +
                             " bits (a v1 checkpoint storing zero 0 as -1)");
      }
      w.zeros.data<uint8_t>()[n * groups + g] = static_cast<uint8_t>(z);
      w.scales.data<uint16_t>()[n * groups + g] = scales[g * N + n];
    }
  }
  return w;
}

Result<op::Weight> repack_fp8(const uint8_t* weight, const float* scale_inv, int64_t N, int64_t K,
                              int64_t block_rows, int64_t block_cols) {
  KUIPER_ASSIGN_OR_RETURN(op::Weight w, op::empty_weight(op::WeightFormat::kFp8, N, K, block_rows,
                                                         block_cols, DeviceType::kCpu));
  std::memcpy(w.values.raw(), weight, w.values.nbytes());
  std::memcpy(w.scales.raw(), scale_inv, w.scales.nbytes());
  return w;
}

namespace {

std::string module_of(const std::string& name) {
  const std::string suffix = ".weight";
  return name.size() > suffix.size() ? name.substr(0, name.size() - suffix.size()) : name;
}

// The tensors of one quantized matrix, found and checked against the published shapes.
struct HfParts {
  const SafetensorsTensor* values = nullptr;  // fp8 weight / qweight
  const SafetensorsTensor* scales = nullptr;  // weight_scale_inv / scales
  const SafetensorsTensor* zeros = nullptr;   // qzeros
  const SafetensorsTensor* g_idx = nullptr;   // gptq, optional
  QuantizedEntry entry;
};

Result<std::optional<HfParts>> find_parts(const HfQuantization& q,
                                          const SafetensorsCheckpoint& weights,
                                          const std::string& name, int64_t N, int64_t K) {
  const std::string module = module_of(name);
  HfParts p;
  auto need = [&](const std::string& tensor, DataType dtype, std::vector<int64_t> shape,
                  const SafetensorsTensor** out) -> Status {
    const SafetensorsTensor* t = weights.find(tensor);
    if (t == nullptr) {
      return Status::Error("tensor '" + tensor + "' is missing (" + module + " is quantized)");
    }
    if (t->dtype != dtype || t->shape != shape) {
      return Status::Error("tensor '" + tensor + "' is " + dtype_name(t->dtype) +
                           shape_string(t->shape) + " but the quantization_config implies " +
                           dtype_name(dtype) + shape_string(shape) + " for a [" +
                           std::to_string(N) + ", " + std::to_string(K) + "] matrix");
    }
    *out = t;
    return Status::Ok();
  };
  if (q.method == HfQuantMethod::kFp8) {
    const SafetensorsTensor* w = weights.find(name);
    if (w == nullptr || w->dtype != DataType::kFp8E4m3) return std::optional<HfParts>();
    const int64_t br = q.block_rows, bc = q.block_cols;
    p.entry = {op::WeightFormat::kFp8, br, bc};
    KUIPER_RETURN_IF_ERROR(need(name, DataType::kFp8E4m3, {N, K}, &p.values));
    // FineGrainedFP8 writes fp32 scales; a release storing them in 16 bits reads the same.
    const SafetensorsTensor* s = weights.find(module + ".weight_scale_inv");
    const DataType scale_dtype =
        s != nullptr && (s->dtype == DataType::kBf16 || s->dtype == DataType::kFp16)
            ? s->dtype
            : DataType::kFp32;
    KUIPER_RETURN_IF_ERROR(need(module + ".weight_scale_inv", scale_dtype,
                                {(N + br - 1) / br, (K + bc - 1) / bc}, &p.scales));
    return std::optional<HfParts>(p);
  }
  if (weights.find(module + ".qweight") == nullptr) return std::optional<HfParts>();
  const int64_t group = q.group > 0 ? q.group : K;
  if (K % group != 0) {
    return Status::Error(module + ": group_size " + std::to_string(group) + " does not divide " +
                         std::to_string(K) + " columns");
  }
  const int64_t per_word = 32 / q.bits;
  if (N % per_word != 0 || (q.method == HfQuantMethod::kGptq && K % per_word != 0)) {
    return Status::Error(module + ": a [" + std::to_string(N) + ", " + std::to_string(K) +
                         "] matrix does not pack " + std::to_string(per_word) + " codes a word");
  }
  p.entry = {q.bits == 4 ? op::WeightFormat::kInt4 : op::WeightFormat::kInt8, 1, group};
  const int64_t groups = K / group;
  if (q.method == HfQuantMethod::kAwq) {
    KUIPER_RETURN_IF_ERROR(need(module + ".qweight", DataType::kInt32, {K, N / 8}, &p.values));
  } else {
    KUIPER_RETURN_IF_ERROR(
        need(module + ".qweight", DataType::kInt32, {K / per_word, N}, &p.values));
    if (weights.find(module + ".g_idx") != nullptr) {
      KUIPER_RETURN_IF_ERROR(need(module + ".g_idx", DataType::kInt32, {K}, &p.g_idx));
    }
  }
  KUIPER_RETURN_IF_ERROR(
      need(module + ".qzeros", DataType::kInt32, {groups, N / per_word}, &p.zeros));
  KUIPER_RETURN_IF_ERROR(need(module + ".scales", DataType::kFp16, {groups, N}, &p.scales));
  return std::optional<HfParts>(p);
}

}  // namespace

Result<std::optional<QuantizedEntry>> describe_hf_quantized(const HfQuantization& q,
                                                            const SafetensorsCheckpoint& weights,
                                                            const std::string& name, int64_t N,
                                                            int64_t K) {
  KUIPER_ASSIGN_OR_RETURN(std::optional<HfParts> parts, find_parts(q, weights, name, N, K));
  if (!parts) return std::optional<QuantizedEntry>();
  const QuantizedEntry& e = parts->entry;
  // The layout's own rules (an odd int4 group, say) before any data is read.
  KUIPER_RETURN_IF_ERROR(
      op::empty_weight(e.format, N, K, e.block_rows, e.block_cols, DeviceType::kCpu)
          .status()
          .With(module_of(name)));
  return std::optional<QuantizedEntry>(e);
}

Result<op::Weight> read_hf_quantized(const HfQuantization& q,
                                     const SafetensorsCheckpoint& weights,
                                     const std::string& name, int64_t N, int64_t K) {
  KUIPER_ASSIGN_OR_RETURN(std::optional<HfParts> parts, find_parts(q, weights, name, N, K));
  if (!parts) return Status::Error(name + " is not quantized in this checkpoint");
  const HfParts& p = *parts;
  const int64_t group = p.entry.block_cols;
  if (p.g_idx != nullptr) {  // act-order would permute groups: only k / group is read
    const int32_t* g_idx = static_cast<const int32_t*>(p.g_idx->data);
    for (int64_t k = 0; k < K; ++k) {
      if (g_idx[k] != k / group) {
        return Status::Error(module_of(name) + ": g_idx[" + std::to_string(k) + "] is " +
                             std::to_string(g_idx[k]) + ", not " + std::to_string(k / group) +
                             " (act-order checkpoints are not supported)");
      }
    }
  }
  switch (q.method) {
    case HfQuantMethod::kFp8: {
      const size_t n = p.scales->nbytes / dtype_size(p.scales->dtype);
      std::vector<float> scales(n);
      KUIPER_RETURN_IF_ERROR(
          convert_elements(p.scales->data, p.scales->dtype, scales.data(), DataType::kFp32, n));
      return repack_fp8(static_cast<const uint8_t*>(p.values->data), scales.data(), N, K,
                        p.entry.block_rows, p.entry.block_cols);
    }
    case HfQuantMethod::kAwq:
      return repack_awq(static_cast<const int32_t*>(p.values->data),
                        static_cast<const int32_t*>(p.zeros->data),
                        static_cast<const uint16_t*>(p.scales->data), N, K, group);
    case HfQuantMethod::kGptq:
      return repack_gptq(static_cast<const int32_t*>(p.values->data),
                         static_cast<const int32_t*>(p.zeros->data),
                         static_cast<const uint16_t*>(p.scales->data), N, K, group, q.bits,
                         q.gptq_zero_offset);
    case HfQuantMethod::kNone:
      break;
  }
  return Status::Error(name + ": the checkpoint is not quantized");
}

}  // namespace kuiper
