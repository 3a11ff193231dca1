// Weight: a projection matrix [N, K] (out, in) as the ops read it, plain or quantized. Every
// quantized format is one Kuiper layout, whatever checkpoint it came from: kuiper-convert repacks
// FP8 (FineGrainedFP8), AWQ and GPTQ checkpoints into it, and op::quantize makes it from 16-bit
// weights. The layouts and their math (n a row, k a column of the [N, K] matrix):
//
//   kPlain  values fp32/fp16/bf16 [N, K]; w = values[n, k].
//   kFp8    values fp8_e4m3 [N, K]; scales fp32 [ceil(N / block_rows), ceil(K / block_cols)];
//           w = float(values[n, k]) * scales[n / block_rows, k / block_cols]. Block-wise FP8 is
//           block 128 x 128 (the scales are FineGrainedFP8's weight_scale_inv), per-channel FP8
//           is block 1 x K. Edge blocks may be partial.
//   kInt8   values uint8 [N, K], codes q in [0, 255]; scales fp16 [N, K / group]; zeros uint8
//           [N, K / group]; w = (q - zeros[n, k / group]) * scales[n, k / group]. block_rows 1,
//           block_cols = group, which divides K.
//   kInt4   values uint8 [N, K / 2], code q in [0, 15] of column k in bits 4 * (k % 2) of byte
//           [n, k / 2] (the even column in the low nibble); scales and zeros as kInt8 (zeros in
//           [0, 15]); group even and dividing K.
//
// Rows of a weight (a row view) keep their scales: a view begins and ends at a multiple of
// block_rows (or at N), so stacked matrices (q|k|v, gate|up) stay one Weight.
//
// Tiled (`tiled`, kInt8 / kInt4 on the GPU only): the values' bytes in the tensor-core GEMV's
// load order instead of row-major. Rows go in groups of 8, and a group holds its 64-byte pieces
// (a GEMV super-step: 128 int4 or 64 int8 columns) piece by piece, each piece's 8 rows together:
// byte b of row n sits at tiled_offset(n, b, R), R the bytes of a row (a multiple of 64; N a
// multiple of 8). A warp load then reads 512 contiguous bytes where row-major it reads 64 bytes
// of 8 rows (H100, scripts/access_probe.cu: up to 8% faster). Scales and zeros stay row-major; a
// row view begins and ends at a multiple of 8 rows.
//
// FP8 activations (W8A8; fp8_activations, kFp8 only, K a multiple of 128): the product takes x
// rounded to E4M3 in groups of kFp8ActivationGroup columns of a row, as transformers'
// FineGrainedFP8 forward (its act_quant), vLLM and SGLang multiply these checkpoints: for each
// row t and group g of x (x as the product receives it, in the activation dtype),
//   s = max |x[t, g]| / 448, q = float_to_fp8_e4m3(x * (448 / max |x[t, g]|))
// (s = 1 and q = 0 for an all-zero group), and the product is sum_g s * (q . w) over the groups.
// Off, it is the product with x as given.
#pragma once

#include <cstdint>
#include <string>

#include "kuiper/tensor/tensor.h"

namespace kuiper::op {

enum class WeightFormat { kPlain, kFp8, kInt8, kInt4 };

// Columns of x that share one scale when the product rounds x to FP8 (fp8_activations).
constexpr int64_t kFp8ActivationGroup = 128;

const char* weight_format_name(WeightFormat f);  // "plain", "fp8", "int8", "int4"
Result<WeightFormat> parse_weight_format(const std::string& name);

struct Weight {
  Weight() = default;
  // A plain weight; implicit, so every op that takes a Weight takes a Tensor matrix as before.
  Weight(Tensor plain) : values(std::move(plain)) {}  // NOLINT(google-explicit-constructor)

  WeightFormat format = WeightFormat::kPlain;
  Tensor values;
  Tensor scales;  // quantized formats
  Tensor zeros;   // kInt8, kInt4
  int64_t block_rows = 1, block_cols = 1;  // the scale block (quantized formats)
  bool fp8_activations = false;            // W8A8: x rounded to FP8 first (above)
  bool tiled = false;                      // the GPU GEMV's byte order (above)

  bool defined() const { return values.defined(); }
  bool quantized() const { return format != WeightFormat::kPlain; }
  int64_t rows() const;  // N
  int64_t cols() const;  // K (twice values' columns for kInt4)
  DeviceType device() const { return values.device(); }
  // Bytes of values, scales and zeros.
  size_t nbytes() const;
  // Rows [begin, begin + count) with their scales and zeros, sharing memory. Precondition (the
  // caller's): begin is a multiple of block_rows and begin + count is one too or equals N.
  Weight rows(int64_t begin, int64_t count) const;
  // A copy on `device`.
  Result<Weight> to(DeviceType device) const;
  // "int4[4096,4096] group 128@cuda", "fp8[4096,4096] block 128x128@cpu", "fp16[..]@cuda";
  // "fp8[..] block 128x128 fp8 activations@cuda" with fp8_activations, "... tiled@cuda" tiled.
  std::string describe() const;
};

// Where byte b of row n of a row-major matrix of R bytes a row sits in the tiled layout.
inline int64_t tiled_offset(int64_t n, int64_t b, int64_t R) {
  return (n / 8) * 8 * R + (b / 64) * 512 + (n % 8) * 64 + b % 64;
}
// Whether w's values can be tiled: an int8 / int4 weight of rows a multiple of 8 and row bytes a
// multiple of 64.
bool tileable(const Weight& w);

// Checks that values, scales and zeros have the dtypes and shapes the format's layout gives
// them for an [N, K] matrix, all on one device, and that fp8_activations is set only where it
// applies. Errors say what does not fit.
Status check_weight(const Weight& w);

}  // namespace kuiper::op
