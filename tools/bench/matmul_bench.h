// Matmul-only mode: op::matmul alone on the config's weight shapes.
#pragma once

#include "kuiper/base/dtype.h"
#include "tools/bench/report.h"

namespace kuiper::bench {

// Each distinct weight shape of the config through op::matmul, its weights quantized per
// --quantize. Decode cycles through enough copies of the weight that it cannot sit in L2, as in
// a real step where every matrix is read once; its GB/s count the weight's bytes as stored
// (codes, scales and zeros). Quantized weights also time op::quantize and op::dequantize of one
// matrix.
Result<json> bench_matmul(DataType activation, double copy_gbs);

}  // namespace kuiper::bench
