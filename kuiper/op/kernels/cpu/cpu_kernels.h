// Reference CPU kernels: plain loops, OpenMP over independent rows, fp32 accumulation. One file
// per op, named for it (kernels/cpu/<op>.cpp; linear is op-level, ops.cpp composes it); the
// attention family is attention.cpp. Arguments are validated by kuiper/op/ops.cpp before these
// run.
#pragma once

#include <vector>

#include "kuiper/op/attention.h"
#include "kuiper/op/ops.h"
#include "kuiper/tensor/tensor.h"

namespace kuiper::cpu {

void embedding(const Tensor& table, const Tensor& ids, Tensor& out);
void rmsnorm(const Tensor& x, const Tensor& weight, double eps, Tensor& out);
void matmul(const Tensor& x, const op::Weight& w, const Tensor* bias, Tensor& out);
void dequantize(const op::Weight& w, Tensor& out);
void quantize(const Tensor& w, op::Weight& out);
// Rows [n0, n0 + rows) of w as fp32 into out[rows * K] (weight.h's math); matmul's widening.
void dequantize_rows(const op::Weight& w, int64_t n0, int64_t rows, float* out);
// x [T, K] rounded to FP8 in groups of op::kFp8ActivationGroup columns (weight.h, FP8
// activations) into out: each value float(q) * s, in fp32.
void round_to_fp8_groups(const float* x, int64_t T, int64_t K, float* out);
void rope(Tensor& x, const Tensor& positions, const op::RopeParams& rope);
void mrope(Tensor& x, const Tensor& positions, const op::RopeParams& rope,
           const std::vector<int64_t>& sections);
void swiglu(const Tensor& gate, const Tensor& up, Tensor& out);
void swiglu(const Tensor& gate_up, Tensor& out);
void add(const Tensor& a, const Tensor& b, Tensor& out);
void kv_write(const Tensor& k, Tensor& cache, const Tensor& positions);
void qk_norm_rope_cache(Tensor& q, Tensor& k, const Tensor& v, const Tensor* q_norm,
                        const Tensor* k_norm, double eps, const Tensor& positions,
                        const op::RopeParams& rope, Tensor& k_cache, Tensor& v_cache,
                        const Tensor& rope_positions);
void qk_norm_rope_cache(Tensor& qkv, Tensor& q, const Tensor* q_norm, const Tensor* k_norm,
                        double eps, const Tensor& positions, const op::RopeParams& rope,
                        Tensor& k_cache, Tensor& v_cache, const Tensor& rope_positions);
void argmax(const Tensor& logits, Tensor& out);
void copy_indexed(const Tensor& src, const Tensor& from, const Tensor& to, Tensor& out);
void fill_random(Tensor& t, uint64_t seed, float scale, float offset);
void sample(const Tensor& logits, const Tensor& recent, const op::SampleParams& params,
            double uniform, Tensor& out);
// sample for each row (the reference of the batched CUDA pipeline).
void sample_rows(const Tensor& logits, const std::vector<op::SampleRow>& rows,
                 const std::vector<int32_t>& recent, Tensor& out);
// The pieces of sample (op::repetition_penalty, op::sample_candidates, op::draw).
void repetition_penalty(float penalty, const int32_t* recent, int64_t n, float* logits,
                        int64_t vocab);
std::vector<op::TokenProbability> sample_candidates(const float* logits, int64_t vocab,
                                                    const op::SampleParams& params);
int32_t draw(const std::vector<op::TokenProbability>& candidates, double uniform);
// Exact causal GQA softmax attention; see AttentionArgs for the layout.
void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, Tensor& out,
               int64_t start);
// The same for a batch of sequences over a paged pool (PagedBatch, its tensors on the CPU).
void paged_attention(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, Tensor& out,
                     const op::PagedBatch& batch);

// Vision tower ops.
void layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
               Tensor& out);
void gelu(const Tensor& x, op::GeluKind kind, Tensor& out);
void rope_2d(Tensor& x, const Tensor& positions, double theta);
void varlen_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                      int64_t heads, Tensor& out);

}  // namespace kuiper::cpu
