// FlashAttention-1 style: a block holds a tile of query rows and streams large KV tiles through
// shared memory; per tile it computes the scores, updates the running row maximum and sum, and
// rescales the (kept normalised, as in FA1's algorithm) output. Every step is block-wide,
// separated by barriers: the structure FlashAttention-2 later reorganised.
//
// Rows are (query, head) pairs of one kv head: row r of the flattened [T x group] list is query
// r / group of head kvh * group + r % group. Packing a GQA group into one block loads each K/V
// tile once for all the heads that share it. Decode is the same kernel with T = 1; its grid does
// not depend on the position, so the graph-safe variant only reads the position from the device.
#include <algorithm>

#include "kuiper/op/kernels/cuda/attention_common.cuh"

namespace kuiper::op::cuda_attention {
namespace {

template <int D>
struct Flash1Traits {
  static constexpr int kRows = 16;     // query rows per block
  static constexpr int kKeys = 64;     // keys per KV tile
  static constexpr int kThreads = 128;
  static constexpr int kLanesPerRow = kThreads / kRows;            // 8 threads share a row
  static constexpr int kColsPerThread = kKeys / kLanesPerRow;      // scores per thread
  static constexpr int kDimsPerThread = D / kLanesPerRow;          // outputs per thread
  // +4 floats per row: the 8 threads of a row read 8 different K rows as float4, and a stride of
  // D + 4 words puts those reads in distinct bank quads.
  static constexpr int kStride = D + 4;
  // +8: the four rows a warp touches then start in different banks.
  static constexpr int kPStride = kKeys + 8;
  static constexpr size_t kSharedBytes =
      sizeof(float) * (static_cast<size_t>(kRows + 2 * kKeys) * kStride + kRows * kPStride);
};

template <typename T, int D>
__global__ void __launch_bounds__(Flash1Traits<D>::kThreads)
    flash1_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                  T* __restrict__ out, Geometry g) {
  using Tr = Flash1Traits<D>;
  extern __shared__ float4 shared4[];
  float* qs = reinterpret_cast<float*>(shared4);
  float* ks = qs + Tr::kRows * Tr::kStride;
  float* vs = ks + Tr::kKeys * Tr::kStride;
  float* ps = vs + Tr::kKeys * Tr::kStride;

  const int kvh = blockIdx.y;
  const int total_rows = g.T * g.group;
  // Later row blocks see more keys; launching them first evens out the tail of the grid.
  const int row_block = gridDim.x - 1 - blockIdx.x;
  const int r0 = row_block * Tr::kRows;
  const int pos0 = first_position(g);
  const int last_row = min(r0 + Tr::kRows, total_rows) - 1;
  const int kv_end = pos0 + last_row / g.group + 1;

  stage_q_tile<T, D, Tr::kRows, Tr::kThreads>(q, g, kvh, r0, total_rows, qs, Tr::kStride);

  const int r = threadIdx.x / Tr::kLanesPerRow;  // this thread's row
  const int c0 = threadIdx.x % Tr::kLanesPerRow;
  const int my_row = min(r0 + r, total_rows - 1);
  const int my_pos = pos0 + my_row / g.group;  // the last key this row may see
  float m = -INFINITY, l = 0.0f;
  float o[Tr::kDimsPerThread] = {};

  for (int key0 = 0; key0 < kv_end; key0 += Tr::kKeys) {
    __syncthreads();  // the previous tile's K, V and P are no longer read
    load_kv_tile<T, D, Tr::kKeys, Tr::kStride, Tr::kThreads>(k, g.kv_heads, kvh, key0, kv_end, ks);
    load_kv_tile<T, D, Tr::kKeys, Tr::kStride, Tr::kThreads>(v, g.kv_heads, kvh, key0, kv_end, vs);
    __syncthreads();

    // S = Q K^T for this thread's columns c0 + 8 i.
    float s[Tr::kColsPerThread] = {};
    for (int d = 0; d < D; d += 4) {
      const float4 qv = *reinterpret_cast<const float4*>(qs + r * Tr::kStride + d);
#pragma unroll
      for (int i = 0; i < Tr::kColsPerThread; ++i) {
        const int c = c0 + i * Tr::kLanesPerRow;
        const float4 kv = *reinterpret_cast<const float4*>(ks + c * Tr::kStride + d);
        s[i] += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
      }
    }
    float tile_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < Tr::kColsPerThread; ++i) {
      if (key0 + c0 + i * Tr::kLanesPerRow > my_pos) s[i] = -INFINITY;
      tile_max = fmaxf(tile_max, s[i]);
    }
    tile_max = group_max<Tr::kLanesPerRow>(tile_max);
    // Key 0 is in every row's past, so m is finite from the first tile on.
    const float m_new = fmaxf(m, tile_max);
    float tile_sum = 0.0f;
#pragma unroll
    for (int i = 0; i < Tr::kColsPerThread; ++i) {
      const float p = fast_exp2(s[i] - m_new);
      tile_sum += p;
      ps[r * Tr::kPStride + c0 + i * Tr::kLanesPerRow] = p;
    }
    tile_sum = group_sum<Tr::kLanesPerRow>(tile_sum);
    const float alpha = fast_exp2(m - m_new);
    const float l_new = l * alpha + tile_sum;
    __syncthreads();  // P complete

    // O = (l * alpha * O + P V) / l_new: FA1 keeps the output normalised after every tile.
    float acc[Tr::kDimsPerThread] = {};
    for (int j = 0; j < Tr::kKeys; ++j) {
      const float p = ps[r * Tr::kPStride + j];
#pragma unroll
      for (int i = 0; i < Tr::kDimsPerThread / 4; ++i) {
        const float4 vv = *reinterpret_cast<const float4*>(vs + j * Tr::kStride + c0 * 4 + i * 32);
        acc[4 * i] += p * vv.x;
        acc[4 * i + 1] += p * vv.y;
        acc[4 * i + 2] += p * vv.z;
        acc[4 * i + 3] += p * vv.w;
      }
    }
    const float keep = l * alpha, inv = 1.0f / l_new;
#pragma unroll
    for (int i = 0; i < Tr::kDimsPerThread; ++i) o[i] = (keep * o[i] + acc[i]) * inv;
    m = m_new;
    l = l_new;
  }

  if (r0 + r < total_rows) {
    const int row = r0 + r, t = row / g.group, h = kvh * g.group + row % g.group;
    T* dst = out + (static_cast<size_t>(t) * g.heads + h) * D;
#pragma unroll
    for (int i = 0; i < Tr::kDimsPerThread / 4; ++i) {
      store_vec<T, 4>(dst + c0 * 4 + i * 32, o + 4 * i);
    }
  }
}

class Flash1Attention final : public AttentionOp {
 public:
  explicit Flash1Attention(const AttentionRequest& r) : request_(r) {}
  const char* name() const override {
    return request_.graph_safe ? "cuda-flash1-gpu-pos" : "cuda-flash1";
  }

  Status forward(const AttentionArgs& a) override {
    KUIPER_RETURN_IF_ERROR(check_cuda_call(a, request_));
    const Geometry g = make_geometry(a, request_.graph_safe);
    return with_instantiation(request_.dtype, request_.head_dim, [&](auto tt, auto dt) -> Status {
      using T = typename decltype(tt)::type;
      constexpr int D = decltype(dt)::value;
      using Tr = Flash1Traits<D>;
      auto kernel = flash1_kernel<T, D>;
      KUIPER_RETURN_IF_ERROR((allow_shared_memory<flash1_kernel<T, D>>(Tr::kSharedBytes)));
      const int row_blocks = (g.T * g.group + Tr::kRows - 1) / Tr::kRows;
      kernel<<<dim3(row_blocks, g.kv_heads), Tr::kThreads, Tr::kSharedBytes, cuda::stream()>>>(
          a.q.data<T>(), a.k_cache.data<T>(), a.v_cache.data<T>(), a.out.data<T>(), g);
      KUIPER_CUDA_CHECK_LAUNCH("flash1_kernel");
      return Status::Ok();
    });
  }

 private:
  AttentionRequest request_;
};

}  // namespace

Result<std::unique_ptr<AttentionOp>> make_flash1_attention(const AttentionRequest& request) {
  return std::unique_ptr<AttentionOp>(new Flash1Attention(request));
}

}  // namespace kuiper::op::cuda_attention
