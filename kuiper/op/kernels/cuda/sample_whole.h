// Step 2'' of sample.cu: the rows of a group that draw from their whole vocabulary but for top-p
// and min-p, drawn without the sort (sample_whole.cu).
#pragma once

#include <cstdint>

#include "kuiper/base/status.h"
#include "kuiper/op/ops.h"

namespace kuiper::cuda {

// What the group's whole rows cut, so the chain runs only the phases some row needs.
struct WholePlan {
  bool top_p = false;  // some row cuts by top-p
  bool kept = false;   // some row cuts by top-p or min-p (probabilities and kept mass)
};

// out[r] for each row r of the S (rows: the device table) that draws_whole, from its 32-bit
// keys (keys32 [S, V], warped and penalised); other rows are left alone. Scratch: ws.alt_ids
// ([S, V] 4-byte entries, allocated by the caller) and ws.whole (allocated here).
Status draw_whole_rows(const uint32_t* keys32, int64_t S, int64_t V, const op::SampleRow* rows,
                       const WholePlan& plan, op::SampleWorkspace& ws, int32_t* out);

}  // namespace kuiper::cuda
