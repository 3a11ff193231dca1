#include "kuiper/op/weight.h"

#include <cstring>

namespace kuiper::op {

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kPlain: return "plain";
    case WeightFormat::kFp8: return "fp8";
    case WeightFormat::kInt8: return "int8";
    case WeightFormat::kInt4: return "int4";
  }
  return "?";
}

Result<WeightFormat> parse_weight_format(const std::string& name) {
  for (WeightFormat f : {WeightFormat::kPlain, WeightFormat::kFp8, WeightFormat::kInt8,
                         WeightFormat::kInt4}) {
    if (name == weight_format_name(f)) return f;
  }
  return Status::Error("unknown weight format '" + name + "' (expected plain, fp8, int8 or int4)");
}

int64_t Weight::rows() const { return values.dim(0); }

int64_t Weight::cols() const {
  return format == WeightFormat::kInt4 ? 2 * values.dim(1) : values.dim(1);
}

size_t Weight::nbytes() const {
  size_t n = values.nbytes();
  if (scales.defined()) n += scales.nbytes();
  if (zeros.defined()) n += zeros.nbytes();
  return n;
}

Weight Weight::rows(int64_t begin, int64_t count) const {
  Weight w = *this;
  w.values = values.rows(begin, count);
  if (!quantized()) return w;
  const int64_t first = begin / block_rows;
  const int64_t last = (begin + count + block_rows - 1) / block_rows;  // one past
  w.scales = scales.rows(first, last - first);
  if (zeros.defined()) w.zeros = zeros.rows(first, last - first);
  return w;
}

Result<Weight> Weight::to(DeviceType device) const {
  Weight w = *this;
  KUIPER_ASSIGN_OR_RETURN(w.values, values.to(device));
  if (tiled && device == DeviceType::kCpu) {  // the CPU reads row-major: untile
    KUIPER_ASSIGN_OR_RETURN(Tensor rows, Tensor::empty(w.values.shape(), w.values.dtype(), device));
    const int64_t N = w.values.dim(0), R = w.values.dim(1);
    const uint8_t* src = w.values.data<uint8_t>();
    uint8_t* dst = rows.data<uint8_t>();
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t b = 0; b < R; b += 16) {
        std::memcpy(dst + n * R + b, src + tiled_offset(n, b, R), 16);
      }
    }
    w.values = rows;
    w.tiled = false;
  }
  if (scales.defined()) {
    KUIPER_ASSIGN_OR_RETURN(w.scales, scales.to(device));
  }
  if (zeros.defined()) {
    KUIPER_ASSIGN_OR_RETURN(w.zeros, zeros.to(device));
  }
  return w;
}

std::string Weight::describe() const {
  if (!defined()) return "undefined weight";
  if (!quantized()) return values.describe();
  std::string s = std::string(weight_format_name(format)) + shape_string({rows(), cols()});
  if (format == WeightFormat::kFp8) {
    s += " block " + std::to_string(block_rows) + "x" + std::to_string(block_cols);
    if (fp8_activations) s += " fp8 activations";
  } else {
    s += " group " + std::to_string(block_cols);
  }
  if (tiled) s += " tiled";
  return s + "@" + device_name(device());
}

namespace {

Status bad(const Weight& w, const std::string& why) {
  return Status::Error("weight " + w.describe() + ": " + why);
}

bool has_shape(const Tensor& t, DataType dtype, std::vector<int64_t> shape) {
  return t.defined() && t.dtype() == dtype && t.shape() == shape;
}

}  // namespace

bool tileable(const Weight& w) {
  return (w.format == WeightFormat::kInt8 || w.format == WeightFormat::kInt4) &&
         w.values.defined() && w.values.ndim() == 2 && w.values.dim(0) % 8 == 0 &&
         w.values.dim(1) % 64 == 0;
}

Status check_weight(const Weight& w) {
  if (!w.values.defined()) return Status::Error("undefined weight");
  if (w.tiled && (!tileable(w) || w.device() == DeviceType::kCpu)) {
    return bad(w, "only int8 / int4 weights of rows a multiple of 8 and row bytes a multiple of "
                  "64 are tiled, on the GPU");
  }
  if (w.values.ndim() != 2) return bad(w, "values must be a matrix, not " + w.values.describe());
  const DataType vt = w.values.dtype();
  if (w.fp8_activations &&
      (w.format != WeightFormat::kFp8 || w.cols() % kFp8ActivationGroup != 0)) {
    return bad(w, "FP8 activations need FP8 weights of a multiple of " +
                      std::to_string(kFp8ActivationGroup) + " columns");
  }
  if (!w.quantized()) {
    if (vt != DataType::kFp32 && vt != DataType::kFp16 && vt != DataType::kBf16) {
      return bad(w, "a plain weight must be fp32, fp16 or bf16");
    }
    return Status::Ok();
  }
  const int64_t N = w.rows(), K = w.cols();
  if (w.block_rows < 1 || w.block_cols < 1) return bad(w, "the scale block must be positive");
  const auto on_device = [&](const Tensor& t) { return t.device() == w.device(); };
  if (w.format == WeightFormat::kFp8) {
    if (vt != DataType::kFp8E4m3) return bad(w, "FP8 values must be fp8_e4m3");
    const int64_t sr = (N + w.block_rows - 1) / w.block_rows;
    const int64_t sc = (K + w.block_cols - 1) / w.block_cols;
    if (!has_shape(w.scales, DataType::kFp32, {sr, sc}) || !on_device(w.scales)) {
      return bad(w, "scales must be fp32 " + shape_string({sr, sc}) + ", not " +
                        (w.scales.defined() ? w.scales.describe() : "missing"));
    }
    if (w.zeros.defined()) return bad(w, "FP8 has no zero points");
    return Status::Ok();
  }
  if (vt != DataType::kUint8) return bad(w, "integer codes must be uint8");
  const int64_t group = w.block_cols;
  if (w.block_rows != 1) return bad(w, "integer formats scale groups of one row");
  if (K % group != 0 || (w.format == WeightFormat::kInt4 && group % 2 != 0)) {
    return bad(w, "group " + std::to_string(group) + " does not divide " + std::to_string(K) +
                      " columns" + (w.format == WeightFormat::kInt4 ? " into even groups" : ""));
  }
  const std::vector<int64_t> shape = {N, K / group};
  if (!has_shape(w.scales, DataType::kFp16, shape) || !on_device(w.scales)) {
    return bad(w, "scales must be fp16 " + shape_string(shape) + ", not " +
                      (w.scales.defined() ? w.scales.describe() : "missing"));
  }
  if (!has_shape(w.zeros, DataType::kUint8, shape) || !on_device(w.zeros)) {
    return bad(w, "zeros must be uint8 " + shape_string(shape) + ", not " +
                      (w.zeros.defined() ? w.zeros.describe() : "missing"));
  }
  return Status::Ok();
}

}  // namespace kuiper::op
