// The quantized weight formats' reference math (kuiper/op/weight.h): dequantize (and the row
// widening matmul uses) and the round-to-nearest quantizer (ops.h, op::quantize).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kuiper/op/kernels/cpu/cpu_kernels.h"

namespace kuiper::cpu {

namespace {

// Integer code of column k of row n (kInt8 one byte, kInt4 a nibble).
int code_at(const op::Weight& w, const uint8_t* row, int64_t k) {
  if (w.format == op::WeightFormat::kInt8) return row[k];
  return (row[k / 2] >> (4 * (k % 2))) & 0xf;
}

int qmax_of(op::WeightFormat f) { return f == op::WeightFormat::kInt8 ? 255 : 15; }

}  // namespace

void round_to_fp8_groups(const float* x, int64_t T, int64_t K, float* out) {
  constexpr int64_t G = op::kFp8ActivationGroup;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k0 = 0; k0 < K; k0 += G) {
      const float* v = x + t * K + k0;
      float* o = out + t * K + k0;
      const int64_t n = std::min(G, K - k0);
      float amax = 0.0f;
      for (int64_t k = 0; k < n; ++k) amax = std::max(amax, std::fabs(v[k]));
      const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
      const float inv = amax > 0.0f ? 448.0f / amax : 1.0f;
      for (int64_t k = 0; k < n; ++k) o[k] = fp8_e4m3_to_float(float_to_fp8_e4m3(v[k] * inv)) * s;
    }
  }
}

void dequantize_rows(const op::Weight& w, int64_t n0, int64_t rows, float* out) {
  const int64_t K = w.cols();
  if (!w.quantized()) {
    const size_t row_bytes = static_cast<size_t>(K) * dtype_size(w.values.dtype());
    (void)convert_elements(static_cast<const char*>(w.values.raw()) + n0 * row_bytes,
                           w.values.dtype(), out, DataType::kFp32,
                           static_cast<size_t>(rows * K));
    return;
  }
  const int64_t value_cols = w.values.dim(1);
  const int64_t scale_cols = w.scales.dim(1);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = n0 + r;
    float* o = out + r * K;
    const uint8_t* v = w.values.data<uint8_t>() + n * value_cols;
    if (w.format == op::WeightFormat::kFp8) {
      const float* s = w.scales.data<float>() + (n / w.block_rows) * scale_cols;
      for (int64_t k = 0; k < K; ++k) o[k] = fp8_e4m3_to_float(v[k]) * s[k / w.block_cols];
      continue;
    }
    const uint16_t* s = w.scales.data<uint16_t>() + n * scale_cols;
    const uint8_t* z = w.zeros.data<uint8_t>() + n * scale_cols;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t g = k / w.block_cols;
      o[k] = static_cast<float>(code_at(w, v, k) - z[g]) * fp16_to_float(s[g]);
    }
  }
}

void dequantize(const op::Weight& w, Tensor& out) {
  const int64_t N = w.rows(), K = w.cols();
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(K));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      dequantize_rows(w, n, 1, row.data());
      (void)convert_elements(row.data(), DataType::kFp32,
                             static_cast<char*>(out.raw()) + n * K * dtype_size(out.dtype()),
                             out.dtype(), static_cast<size_t>(K));
    }
  }
}

void quantize(const Tensor& w, op::Weight& out) {
  const int64_t N = out.rows(), K = out.cols();
  const int64_t br = out.block_rows, bc = out.block_cols;
  const int64_t scale_cols = out.scales.dim(1), value_cols = out.values.dim(1);
  const auto row_of = [&](int64_t n, std::vector<float>& buf) {
    (void)convert_elements(static_cast<const char*>(w.raw()) + n * K * dtype_size(w.dtype()),
                           w.dtype(), buf.data(), DataType::kFp32, static_cast<size_t>(K));
  };
  if (out.format == op::WeightFormat::kFp8) {
    const int64_t block_row_count = (N + br - 1) / br;
#pragma omp parallel
    {
      std::vector<float> tile(static_cast<size_t>(br * K));
      std::vector<float> buf(static_cast<size_t>(K));
#pragma omp for schedule(static)
      for (int64_t b = 0; b < block_row_count; ++b) {
        const int64_t n0 = b * br, rows = std::min(br, N - n0);
        for (int64_t r = 0; r < rows; ++r) {
          row_of(n0 + r, buf);
          std::copy(buf.begin(), buf.end(), tile.begin() + r * K);
        }
        for (int64_t c = 0; c < scale_cols; ++c) {
          const int64_t k0 = c * bc, cols = std::min(bc, K - k0);
          float amax = 0.0f;
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t k = k0; k < k0 + cols; ++k) amax = std::max(amax, std::fabs(tile[r * K + k]));
          }
          const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
          out.scales.data<float>()[b * scale_cols + c] = scale;
          for (int64_t r = 0; r < rows; ++r) {
            uint8_t* v = out.values.data<uint8_t>() + (n0 + r) * value_cols;
            for (int64_t k = k0; k < k0 + cols; ++k) v[k] = float_to_fp8_e4m3(tile[r * K + k] / scale);
          }
        }
      }
    }
    return;
  }
  const int qmax = qmax_of(out.format);
  const bool int4 = out.format == op::WeightFormat::kInt4;
#pragma omp parallel
  {
    std::vector<float> buf(static_cast<size_t>(K));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      row_of(n, buf);
      uint8_t* v = out.values.data<uint8_t>() + n * value_cols;
      if (int4) std::fill(v, v + value_cols, uint8_t{0});
      for (int64_t g = 0; g < scale_cols; ++g) {
        const float* x = buf.data() + g * bc;
        float lo = 0.0f, hi = 0.0f;
        for (int64_t k = 0; k < bc; ++k) {
          lo = std::min(lo, x[k]);
          hi = std::max(hi, x[k]);
        }
        uint16_t s16 = float_to_fp16((hi - lo) / static_cast<float>(qmax));
        if (fp16_to_float(s16) == 0.0f) s16 = float_to_fp16(1.0f);
        const float s = fp16_to_float(s16);
        const float z = std::clamp(std::nearbyint(-lo / s), 0.0f, static_cast<float>(qmax));
        out.scales.data<uint16_t>()[n * scale_cols + g] = s16;
        out.zeros.data<uint8_t>()[n * scale_cols + g] = static_cast<uint8_t>(z);
        for (int64_t k = 0; k < bc; ++k) {
          const int q = static_cast<int>(
              std::clamp(std::nearbyint(x[k] / s) + z, 0.0f, static_cast<float>(qmax)));
          const int64_t col = g * bc + k;
          if (int4) {
            v[col / 2] |= static_cast<uint8_t>(q << (4 * (col % 2)));
          } else {
            v[col] = static_cast<uint8_t>(q);
          }
        }
      }
    }
  }
}

}  // namespace kuiper::cpu
