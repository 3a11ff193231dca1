// Element types and host-side conversions between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "kuiper/base/status.h"

namespace kuiper {

// kUint8 holds the codes of integer-quantized weights (int4 packed two to a byte, int8 one) and
// their zero points; kFp8E4m3 is OCP FP8 E4M3 (bias 7, no infinities, 0x7f/0xff NaN, largest
// finite 448), the element type of FP8 weights. See kuiper/op/weight.h.
enum class DataType { kFp32, kFp16, kBf16, kInt8, kInt32, kUint8, kFp8E4m3 };

size_t dtype_size(DataType t);
// "fp32", "fp16", "bf16", "int8", "int32", "uint8", "fp8_e4m3"
const char* dtype_name(DataType t);
Result<DataType> parse_dtype(const std::string& name);

enum class DeviceType { kCpu, kCuda };
const char* device_name(DeviceType d);  // "cpu", "cuda"
Result<DeviceType> parse_device(const std::string& name);

// IEEE half and bfloat16 as raw bits on the host; arithmetic always happens in float.
inline float bf16_to_float(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t float_to_bf16(float f) {  // round to nearest even, NaN kept quiet
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float fp16_to_float(uint16_t bits);
uint16_t float_to_fp16(float f);  // round to nearest even, overflow to inf

// Converts n elements between float-like types (fp32/fp16/bf16) on the host. A finite value
// that does not fit the destination (beyond fp16's 65504) is an error giving the largest such
// |value|; the elements are all written (those values as inf) before it returns. inf and NaN
// convert as themselves.
// FP8 E4M3 bits to float (exact), and float to the nearest E4M3 (ties to even), saturating
// finite values beyond 448 to +-448; NaN stays NaN.
float fp8_e4m3_to_float(uint8_t bits);
uint8_t float_to_fp8_e4m3(float f);

Status convert_elements(const void* src, DataType src_type, void* dst, DataType dst_type,
                        size_t n);

}  // namespace kuiper
