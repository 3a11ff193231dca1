// Reference CPU kernels: plain loops, OpenMP over independent rows, fp32 accumulation.
// Arguments are validated by kuiper/op/ops.cpp before these run.
#pragma once

#include "kuiper/tensor/tensor.h"

namespace kuiper::cpu {

void embedding(const Tensor& table, const Tensor& ids, Tensor& out);
void rmsnorm(const Tensor& x, const Tensor& weight, double eps, Tensor& out);
void matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out);
void rope(Tensor& x, const Tensor& positions, double theta);
void swiglu(const Tensor& gate, const Tensor& up, Tensor& out);
void add(const Tensor& a, const Tensor& b, Tensor& out);
void kv_write(const Tensor& k, Tensor& cache, const Tensor& positions);
void argmax(const Tensor& logits, Tensor& out);
void fill_random(Tensor& t, uint64_t seed, float scale, float offset);
// Exact causal GQA softmax attention; see AttentionArgs for the layout.
void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, Tensor& out,
               int64_t start);

}  // namespace kuiper::cpu
