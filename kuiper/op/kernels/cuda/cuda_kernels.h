// CUDA kernels behind the op layer, one .cu file per op named for it (kernels/cuda/<op>.cu;
// matmul.cu holds op::linear's fused forms too; attention is a family folder). Activations are
// fp32, fp16 or bf16 (accumulation always fp32); each launch runs on the current stream
// (kuiper/base/cuda_stream.h) and its launch status is checked and returned.
#pragma once

#include "kuiper/op/ops.h"
#include "kuiper/tensor/tensor.h"

namespace kuiper::cuda {

Status embedding(const Tensor& table, const Tensor& ids, Tensor& out);
Status rmsnorm(const Tensor& x, const Tensor& weight, double eps, Tensor& out);
Status matmul(const Tensor& x, const op::Weight& w, const Tensor* bias, Tensor& out);
// op::linear's fused forms where the GPU has them; false: the caller runs the composition.
// linear_fuses says beforehand whether T rows of x of K columns over w take one kernel for every
// form (one row always; 2 to 8 rows of a plain 16-bit w, gemv_rows.cuh and gemv_rows_mma.cuh),
// x's rows 16-byte aligned.
bool linear_fuses(int64_t T, int64_t K, const op::Weight& w);
Result<bool> linear(const Tensor& x, const op::Weight& w, const op::LinearOptions& options,
                    Tensor& out);
// The quantized formats (quantized_matmul.cu): matmul and linear of a quantized w, and
// op::dequantize / op::quantize.
Status quantized_matmul(const Tensor& x, const op::Weight& w, const Tensor* bias, Tensor& out);
Result<bool> quantized_linear(const Tensor& x, const op::Weight& w,
                              const op::LinearOptions& options, Tensor& out);
Status dequantize(const op::Weight& w, Tensor& out);
// op::tile on the GPU (quantized_matmul.cu): w's values permuted in place, w.tiled set.
Status tile(op::Weight& w);
// Block-wise FP8 w times many rows of 16-bit x on the FP8 tensor cores (fp8_block_gemm.cu);
// false where it does not apply (another GPU than sm_90, other scales, shapes cuBLASLt refuses).
Result<bool> fp8_block_gemm(const Tensor& x, const op::Weight& w, const Tensor* bias, Tensor& out);
// Before a cuBLAS product with bias: out[t, n] = bias[n], then the product adds with beta = 1,
// so the bias joins the fp32 accumulation and 16-bit outputs are rounded once (matmul.cu).
Status broadcast_bias(const Tensor& bias, Tensor& out);
Status quantize(const Tensor& w, op::Weight& out);
Status qk_norm_rope_cache(Tensor& q, Tensor& k, const Tensor& v, const Tensor* q_norm,
                          const Tensor* k_norm, double eps, const Tensor& positions,
                          const op::RopeParams& rope, Tensor& k_cache, Tensor& v_cache,
                          const Tensor& rope_positions);
Status qk_norm_rope_cache(Tensor& qkv, Tensor& q, const Tensor* q_norm, const Tensor* k_norm,
                          double eps, const Tensor& positions, const op::RopeParams& rope,
                          Tensor& k_cache, Tensor& v_cache, const Tensor& rope_positions);
Status rope(Tensor& x, const Tensor& positions, const op::RopeParams& rope);
Status mrope(Tensor& x, const Tensor& positions, const op::RopeParams& rope,
             const std::vector<int64_t>& sections);
Status swiglu(const Tensor& gate, const Tensor& up, Tensor& out);
Status swiglu(const Tensor& gate_up, Tensor& out);
Status add(const Tensor& a, const Tensor& b, Tensor& out);
Status kv_write(const Tensor& k, Tensor& cache, const Tensor& positions);
Status argmax(const Tensor& logits, Tensor& out);
Status copy_indexed(const Tensor& src, const Tensor& from, const Tensor& to, Tensor& out);
Status fill_random(Tensor& t, uint64_t seed, float scale, float offset);
Status sample(const Tensor& logits, const Tensor& recent, const op::SampleParams& params,
              double uniform, op::SampleWorkspace& workspace, Tensor& out);
Status sample_rows(const Tensor& logits, const std::vector<op::SampleRow>& rows,
                   const std::vector<int32_t>& recent, op::SampleWorkspace& workspace,
                   Tensor& out);

// Vision tower ops (varlen_attention in the attention family folder, attention/).
Status layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                 Tensor& out);
Status gelu(const Tensor& x, op::GeluKind kind, Tensor& out);
Status rope_2d(Tensor& x, const Tensor& positions, double theta);
Status varlen_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                        int64_t heads, Tensor& out);

}  // namespace kuiper::cuda
