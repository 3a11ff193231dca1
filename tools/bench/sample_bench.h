// Sample-only mode: op::sample_rows alone at the config's vocabulary.
#pragma once

#include "tools/bench/report.h"

namespace kuiper::bench {

// For each row count of --decode-batch (default 1, 8, 64, 256): one op::sample_rows call over that
// many rows of random fp32 logits of --config's vocabulary, every row at --temperature, --top_k,
// --top_p and --min_p with its own uniform draw, as a decode step samples its sequences (the
// tokens' copy back not included). us a call, and the logits' GB/s.
Result<json> bench_sample();

}  // namespace kuiper::bench
