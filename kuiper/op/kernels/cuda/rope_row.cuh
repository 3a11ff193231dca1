// What the CUDA rope kernels share (rope, mrope, rope_2d, qk_norm_rope_cache): the frequency
// table and attention factor passed by value as a kernel parameter, and the rotation of one head
// row. The arithmetic itself is rope_math.h's, the CPU kernels' too.
#pragma once

#include <algorithm>
#include <string>

#include "kuiper/op/kernels/cuda/dtype_dispatch.cuh"
#include "kuiper/op/kernels/rope_math.h"
#include "kuiper/tensor/tensor.h"

namespace kuiper::cuda {

constexpr int kMaxRopeHalfDim = 256;  // head_dim up to 512

// The host's inv_freq table (rope_math.h says why not device powf) and the factor on cos and sin
// (YaRN's attention factor, else 1). A kernel parameter is baked into a captured graph at no
// cost, unlike a table that would need a copy.
struct RopeTable {
  float inv_freq[kMaxRopeHalfDim];
  float attention_factor;
};

// rope_inv_freq(rope, dim, i) for i < n (n <= kMaxRopeHalfDim, checked by check_rope_dim).
inline RopeTable make_rope_table(const op::RopeParams& rope, int64_t dim, int64_t n) {
  RopeTable table{};
  rope_inv_freqs(rope, dim, n, table.inv_freq);
  table.attention_factor = static_cast<float>(rope.attention_factor);
  return table;
}

// Heads whose d / 2 rotated pairs do not fit the table are refused.
inline Status check_rope_dim(const char* op, int64_t d) {
  if (d / 2 > kMaxRopeHalfDim) {
    return Status::Error(std::string(op) + ": head_dim " + std::to_string(d) +
                         " exceeds the CUDA kernel's " + std::to_string(2 * kMaxRopeHalfDim));
  }
  return Status::Ok();
}

// cos and sin of `angle`, times `scale`, as the CPU kernels take them.
__device__ __forceinline__ void scaled_sincos(float angle, float scale, float* s, float* c) {
  sincosf(angle, s, c);
  *s *= scale;
  *c *= scale;
}

// Rotates the head row v[0, 2 * half) in place, rotate-half form, pair i by angle_of(i), cos and
// sin times `scale`; the block's threads take one pair each.
template <typename TX, typename AngleOf>
__device__ __forceinline__ void rotate_half_row(TX* v, int half, float scale, AngleOf angle_of) {
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float s, c;
    scaled_sincos(angle_of(i), scale, &s, &c);
    const RotatedPair r = rotate_half(to_float(v[i]), to_float(v[i + half]), c, s);
    v[i] = from_float<TX>(r.first);
    v[i + half] = from_float<TX>(r.second);
  }
}

// Threads for a block rotating one head row: a warp multiple covering the pairs, at most 256.
inline int rope_threads(int64_t half) {
  return static_cast<int>(std::min<int64_t>(256, (half + 31) / 32 * 32));
}

// Launches kernel_of(TypeTag<TX>{}) — a kernel (TX* x, const int32_t* positions, RopeTable, int
// heads, int half) — over x [T, heads, d] in x's activation type, one block per (token, head).
template <typename KernelOf>
Status launch_head_rows(const char* name, Tensor& x, const Tensor& positions,
                        const RopeTable& freq, KernelOf kernel_of) {
  const int64_t T = x.dim(0), heads = x.dim(1), half = x.dim(2) / 2;
  if (T == 0) return Status::Ok();
  return visit_activation(x.dtype(), [&](auto tag) {
    using TX = typename decltype(tag)::type;
    kernel_of(tag)<<<static_cast<unsigned>(T * heads), rope_threads(half), 0, stream()>>>(
        x.data<TX>(), positions.data<int32_t>(), freq, static_cast<int>(heads),
        static_cast<int>(half));
    KUIPER_CUDA_CHECK_LAUNCH(name);
    return Status::Ok();
  });
}

}  // namespace kuiper::cuda
