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

}  // namespace kuiper::op::cuda_attention
