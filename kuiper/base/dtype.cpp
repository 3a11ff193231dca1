#include "kuiper/base/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace kuiper {

size_t dtype_size(DataType t) {
  switch (t) {
    case DataType::kFp32: return 4;
    case DataType::kFp16: return 2;
    case DataType::kBf16: return 2;
    case DataType::kInt8: return 1;
    case DataType::kInt32: return 4;
    case DataType::kUint8: return 1;
    case DataType::kFp8E4m3: return 1;
  }
  return 0;
}

const char* dtype_name(DataType t) {
  switch (t) {
    case DataType::kFp32: return "fp32";
    case DataType::kFp16: return "fp16";
    case DataType::kBf16: return "bf16";
    case DataType::kInt8: return "int8";
    case DataType::kInt32: return "int32";
    case DataType::kUint8: return "uint8";
    case DataType::kFp8E4m3: return "fp8_e4m3";
  }
  return "?";
}

Result<DataType> parse_dtype(const std::string& name) {
  for (DataType t : {DataType::kFp32, DataType::kFp16, DataType::kBf16, DataType::kInt8,
                     DataType::kInt32, DataType::kUint8, DataType::kFp8E4m3}) {
    if (name == dtype_name(t)) return t;
  }
  return Status::Error("unknown dtype '" + name +
                       "' (expected fp32, fp16, bf16, int8, int32, uint8 or fp8_e4m3)");
}

const char* device_name(DeviceType d) { return d == DeviceType::kCpu ? "cpu" : "cuda"; }

Result<DeviceType> parse_device(const std::string& name) {
  if (name == "cpu") return DeviceType::kCpu;
  if (name == "cuda") return DeviceType::kCuda;
  return Status::Error("unknown device '" + name + "' (expected cpu or cuda)");
}

float fp8_e4m3_to_float(uint8_t bits) {
  const float sign = (bits & 0x80u) ? -1.0f : 1.0f;
  const int exp = (bits >> 3) & 0xf;
  const int mant = bits & 0x7;
  if (exp == 0xf && mant == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -9);  // subnormal: m * 2^-9
  return sign * std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, exp - 7);
}

uint8_t float_to_fp8_e4m3(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80u : 0x00u;
  if (std::isnan(f)) return sign | 0x7fu;
  const float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7eu;  // saturate (inf too)
  if (a < 0.015625f) {                   // below 2^-6, the smallest normal: steps of 2^-9
    // 8 steps is 2^-6 itself, whose bits (exponent 1, mantissa 0) are 0x08 too.
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  int e = 0;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1 + 7;                // a = (2m) * 2^(e-1), 2m in [1, 2)
  int mant = static_cast<int>(std::nearbyint((2.0f * m - 1.0f) * 8.0f));  // exact, ties to even
  if (mant == 8) {
    mant = 0;
    ++exp;
  }
  if (exp > 15 || (exp == 15 && mant == 7)) return sign | 0x7eu;
  return sign | static_cast<uint8_t>((exp << 3) | mant);
}

float fp16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: value = mant * 2^-24
      float f = static_cast<float>(mant) * 5.9604644775390625e-8f;
      std::memcpy(&u, &f, sizeof u);
      u |= sign;
    }
  } else {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t float_to_fp16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;               // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;              // rounds to >= 65536: inf
  if (abs < 0x38800000u) {                                    // below the smallest normal
    // Subnormal half: value / 2^-24 rounded to nearest even.
    float a;
    std::memcpy(&a, &abs, sizeof a);
    float scaled = a * 16777216.0f;  // exact: power of two
    uint32_t m = static_cast<uint32_t>(scaled);
    float rem = scaled - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return sign | static_cast<uint16_t>(m);
  }
  uint32_t mant = abs & 0x7fffffu;
  uint32_t exp = (abs >> 23) - 112;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // carry may roll into the exponent
  return sign | static_cast<uint16_t>(h);
}

namespace {
float load_float(const void* src, DataType t, size_t i) {
  switch (t) {
    case DataType::kFp32: return static_cast<const float*>(src)[i];
    case DataType::kFp16: return fp16_to_float(static_cast<const uint16_t*>(src)[i]);
    case DataType::kBf16: return bf16_to_float(static_cast<const uint16_t*>(src)[i]);
    default: return 0.0f;
  }
}
void store_float(void* dst, DataType t, size_t i, float v) {
  switch (t) {
    case DataType::kFp32: static_cast<float*>(dst)[i] = v; break;
    case DataType::kFp16: static_cast<uint16_t*>(dst)[i] = float_to_fp16(v); break;
    case DataType::kBf16: static_cast<uint16_t*>(dst)[i] = float_to_bf16(v); break;
    default: break;
  }
}
float largest_finite(DataType t) {
  switch (t) {
    case DataType::kFp16: return 65504.0f;
    case DataType::kBf16: return bf16_to_float(0x7f7f);
    default: return std::numeric_limits<float>::max();
  }
}
bool is_float_like(DataType t) {
  return t == DataType::kFp32 || t == DataType::kFp16 || t == DataType::kBf16;
}
}  // namespace

Status convert_elements(const void* src, DataType src_type, void* dst, DataType dst_type,
                        size_t n) {
  if (!is_float_like(src_type) || !is_float_like(dst_type)) {
    return Status::Error(std::string("cannot convert ") + dtype_name(src_type) + " to " +
                         dtype_name(dst_type));
  }
  if (src_type == dst_type) {
    std::memcpy(dst, src, n * dtype_size(src_type));
    return Status::Ok();
  }
  // The largest finite |value| that rounded to inf (beyond fp16's 65504, say); 0 if none did.
  float overflow = 0.0f;
#pragma omp parallel for schedule(static) reduction(max : overflow) if (n > (1u << 16))
  for (size_t i = 0; i < n; ++i) {
    const float v = load_float(src, src_type, i);
    store_float(dst, dst_type, i, v);
    if (std::isfinite(v) && !std::isfinite(load_float(dst, dst_type, i))) {
      overflow = std::max(overflow, std::fabs(v));
    }
  }
  if (overflow > 0.0f) {
    char text[160];
    std::snprintf(text, sizeof text, "values up to %g in magnitude do not fit %s (largest %g)",
                  static_cast<double>(overflow), dtype_name(dst_type),
                  static_cast<double>(largest_finite(dst_type)));
    return Status::Error(text);
  }
  return Status::Ok();
}

}  // namespace kuiper
