// The CUDA attention kinds' launchers: dispatch.cu's op checks a call against its request and
// runs the kind's launcher (mha.cu, flash1.cu, flash2.cu) with the buffers it keeps.
#pragma once

#include "kuiper/op/kernels/cuda/attention/common.cuh"

namespace kuiper::op::cuda_attention {

Status run_mha(const AttentionArgs& a, const Geometry& g, const AttentionRequest& r,
               AttentionBuffers& buffers);
Status run_flash1(const AttentionArgs& a, const Geometry& g, const AttentionRequest& r,
                  AttentionBuffers& buffers);
Status run_flash2(const AttentionArgs& a, const Geometry& g, const AttentionRequest& r,
                  AttentionBuffers& buffers);

// Whether launch_flash2_decode prepares AttentionArgs::input inside its kernel for this call: the
// 16-bit kernel over a paged pool whose blocks keep an SM each (the prepared rows' shared memory
// would cost a block an SM where two fit).
Result<bool> flash2_decode_fuses_input(const Geometry& g, const AttentionRequest& r);

}  // namespace kuiper::op::cuda_attention
