// Attention-only mode: the attention op alone, through make_attention, for decode and prefill.
#pragma once

#include <string>

#include "kuiper/base/dtype.h"
#include "tools/bench/report.h"

namespace kuiper::bench {

// The rows of one attention kind: a decode over --kv-len keys and a prefill of --prefill-len
// queries, or the cases of --decode-kv-lens and --causal-lens.
Result<json> bench_attention(const std::string& kind, DataType activation, double copy_gbs);

}  // namespace kuiper::bench
