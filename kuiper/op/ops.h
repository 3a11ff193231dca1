// The op layer: one entry point per operation. Each checks shapes, dtypes and devices, then runs
// the kernel of the tensors' device (kernels/cpu or kernels/cuda). The model graph calls only
// these, so it is the same code on every backend.
//
// Conventions: activations are row-major [rows, features]; weights are [out, in] as Hugging Face
// stores them; every reduction accumulates in fp32. Outputs may alias inputs where noted.
//
// Dtypes: activations are fp32 on every device, fp16 or bf16 on CUDA too; weights (matrices,
// biases, norm weights, embedding tables) fp32, fp16 or bf16 anywhere. An op's activations share
// one dtype except in these mixed forms, which let 16-bit activations keep the residual stream
// in fp32 (Qwen2's reaches 8e4, past fp16's 65504) and never round it to 16 bits:
//   embedding  a 16-bit table into fp32 out;
//   rmsnorm    fp32 x into 16-bit out, or 16-bit x into fp32 out;
//   linear     with norm: fp32 x into 16-bit out (the norm reads x in fp32); with residual:
//              16-bit x, fp32 out (the product is added to out in fp32, unrounded);
//   add        fp32 a and out, 16-bit b;
//   matmul     16-bit x into fp32 out (logits).
// fp16 and bf16 activations never meet in one op. The CPU computes in fp32 and so meets only the
// all-fp32 forms of these.
#pragma once

#include <vector>

#include "kuiper/op/rope_params.h"
#include "kuiper/op/weight.h"
#include "kuiper/tensor/tensor.h"

namespace kuiper::op {

// out[t, :] = table[ids[t], :]. table: fp32/fp16/bf16 [V, H]; ids: int32 [T]; out: [T, H] in
// any activation dtype (fp32 from a 16-bit table: the fp32 residual stream).
Status embedding(const Tensor& table, const Tensor& ids, Tensor& out);

// Row-wise RMSNorm over the last dimension D = weight.numel():
//   out = x / sqrt(mean(x^2) + eps) * weight. Works for per-head norms by viewing x as [R, D].
// out has x's shape and x's dtype, or one of the two is fp32 (the fp32 residual stream normalised
// into 16-bit activations). out may alias x (same dtype).
Status rmsnorm(const Tensor& x, const Tensor& weight, double eps, Tensor& out);

// out[T, N] = x[T, K] @ w[N, K]^T (+ bias[N]). w: plain fp32/fp16/bf16, read in its stored
// type, or quantized (weight.h): the product with its dequantized values, which the kernels form
// from the packed codes as they read them (the CUDA GEMM of many rows may round them to x's
// 16-bit dtype first, or for block-wise FP8 on sm_90 split 16-bit x into two FP8 terms, within
// 2^-8 of each value of x and 2^-22 of its 128-column group's largest). With FP8 activations
// (w.fp8_activations, weight.h) the product is with x rounded to FP8 a group at a time: the same
// codes and scales on every device and path (where a path cannot take the codes as they are, x
// rounded to FP8 and back to its dtype). out has x's dtype, or fp32 (logits keep full precision
// when activations are 16-bit).
Status matmul(const Tensor& x, const Weight& w, const Tensor* bias, Tensor& out);

// out[N, K] = the values of w (weight.h's math, in fp32, rounded once to out's dtype:
// fp32/fp16/bf16). A plain w is converted.
Status dequantize(const Weight& w, Tensor& out);

// w's values into the tiled layout (weight.h), in place, on the GPU; false (w unchanged) where
// w is not tileable, already tiled, or on the CPU.
Result<bool> tile(Weight& w);

// Round-to-nearest quantization of w (fp32/fp16/bf16 [N, K], read as fp32) into out, whose
// format, block and tensors are set (empty_weight) on w's device. Per scale block:
//   kFp8:  amax = max |w|; scale = amax / 448 (1 for an all-zero block); code =
//          float_to_fp8_e4m3(w / scale) (base/dtype.h: nearest, ties to even).
//   kInt8 / kInt4 (qmax 255 / 15), each group of a row: lo = min(0, min w), hi = max(0, max w);
//          s = fp16((hi - lo) / qmax), or 1 where that is 0; z = clamp(rint(-lo / s), 0, qmax);
//          q = clamp(rint(w / s) + z, 0, qmax), with the fp16 scale s and ties to even.
// The dequantized values are then within half an E4M3 step of w for FP8 (|w| * 2^-4 for a
// normal code, scale * 2^-10 for a subnormal one) and within s of w for the integer formats
// (s / 2 away from the clamped ends).
Status quantize(const Tensor& w, Weight& out);

// A weight of `format` for an [N, K] matrix with uninitialised values, scales and zeros on
// `device` (weight.h's layouts; block_rows x block_cols the FP8 block, block_cols the group of
// the integer formats, whose block_rows is 1). Errors for shapes the format cannot hold.
Result<Weight> empty_weight(WeightFormat format, int64_t N, int64_t K, int64_t block_rows,
                            int64_t block_cols, DeviceType device);

// Rotary embedding in place, rotate-half form as Hugging Face applies it: for each head,
// pairs (i, i + d/2) rotate by angle pos * f(i), f(i) = theta^(-2i/d) (YaRN: scaled per
// frequency, and cos and sin times its attention factor; rope_params.h). x: [T, heads, d];
// positions: int32 [T].
Status rope(Tensor& x, const Tensor& positions, RopeParams rope);

// Qwen3-VL's interleaved multimodal rotary embedding in place, rope() with per-frequency
// positions: frequency i of each head rotates by positions[a, t] * f(i), where axis a is
// 1 (h) when i % 3 == 1 and i < 3 * sections[1], 2 (w) when i % 3 == 2 and i < 3 * sections[2],
// else 0 (t). x: [T, heads, d]; positions: int32 [3, T] (rows t, h, w) on x's device; sections:
// three counts summing to d / 2. With three equal rows it is rope() at that row.
Status mrope(Tensor& x, const Tensor& positions, RopeParams rope,
             const std::vector<int64_t>& sections);

// out = silu(gate) * up, elementwise. out may alias gate or up.
Status swiglu(const Tensor& gate, const Tensor& up, Tensor& out);
// The same over the two halves of each row of gate_up [T, 2N], gate then up (the product of the
// stacked gate/up weights, one GEMM for both): out [T, N], which may not alias gate_up.
Status swiglu(const Tensor& gate_up, Tensor& out);

// out = a + b, elementwise, in fp32 and rounded to a's dtype, which out has. b has a's dtype, or
// is 16-bit where a is fp32 (vision features added into the fp32 residual stream). out may alias
// a, or b of out's dtype.
Status add(const Tensor& a, const Tensor& b, Tensor& out);

// Writes row t of k[T, kv_dim] into cache row positions[t] of cache[max_ctx, kv_dim].
// positions: int32 [T] on k's device. Taking the rows from a tensor rather than a host integer lets
// a captured CUDA graph write each decode step to the position held in device memory. Host
// positions are range-checked here; device positions cannot be read without a sync, so the
// caller checks them (the model does at forward) and the CUDA kernel skips out-of-range rows
// instead of writing outside the cache.
Status kv_write(const Tensor& k, Tensor& cache, const Tensor& positions);

// The decode layer's fused forms of matmul. out[T, N] = epilogue(norm(x) @ w^T + bias):
//  - norm: x's rows are RMS-normalised with this weight [K] and eps first (op::rmsnorm);
//  - swiglu: w is [2N, K], gate rows then up rows (bias [2N] likewise), and
//    out = silu(x gate^T) * (x up^T) (op::swiglu);
//  - residual: out += the product (out holds the residual; op::add); not with swiglu.
// out has x's dtype, or fp32 from 16-bit x (logits; the fp32 residual, to which the product is
// added in fp32 without being rounded to 16 bits), not with swiglu; with norm, x may be the fp32
// residual stream and out 16-bit (the activation dtype). The composition's intermediates (the
// normalised x, gate and up) have the activation dtype, x's or, for an fp32 x, out's.
// The GPU GEMV (one row of x) rounds the products, the gate/up pair and the residual sum to out's
// dtype where the unfused ops store them, but applies the norm as a 1 / rms factor on the fp32
// dot products, so the normalised x is not rounded (16-bit: within an ulp or so of the
// composition). Other cases run the composition itself, or for a plain residual form one GEMM
// that accumulates into out (in fp32 for an fp32 out).
struct LinearOptions {
  const Tensor* norm = nullptr;
  double eps = 1e-6;
  const Tensor* bias = nullptr;
  bool swiglu = false;
  bool residual = false;
};
Status linear(const Tensor& x, const Weight& w, const LinearOptions& options, Tensor& out);
// Whether op::linear runs every form for T rows of x of K columns over w (on w's device, x's
// rows 16-byte aligned) as one kernel, with no intermediate tensors, so that a captured graph may
// call it: on CUDA one row always; two rows of a plain 16-bit w of K a multiple of 8 up to 25600,
// and 3 to 8 rows of K a multiple of 128 (past about 7000 split over blocks, up to 16 parts),
// whose x and out are w's dtype or fp32 where the forms allow; never on the CPU.
bool linear_fuses(int64_t T, int64_t K, const Weight& w);

// Attention input preparation for T tokens, fused on the GPU: the per-head RMSNorm of q and k
// (when q_norm / k_norm are given), RoPE at `positions` (both in place), then k and v rows
// written to cache row positions[t] (op::rmsnorm, op::rope, op::kv_write in that order).
// q: [T, Hq, d]; k: [T, Hkv, d]; v: [T, Hkv * d]; caches [max_ctx, Hkv * d]. `rope_positions`
// ([T] int32), when given, are the rotary positions instead, the cache rows staying
// `positions` (Qwen3-VL text tokens: the cache row plus the images' rope delta).
Status qk_norm_rope_cache(Tensor& q, Tensor& k, const Tensor& v, const Tensor* q_norm,
                          const Tensor* k_norm, double eps, const Tensor& positions,
                          RopeParams rope, Tensor& k_cache, Tensor& v_cache,
                          const Tensor* rope_positions = nullptr);
// The same of q, k and v side by side in each row of qkv [T, Hq + 2 Hkv, d] (the product of the
// stacked q/k/v weights, one GEMM for all three), Hq = q.dim(1): the normalised and rotated q
// heads go to q [T, Hq, d]; qkv's k heads are left normalised and rotated as the k above, its q
// and v heads as they were.
Status qk_norm_rope_cache(Tensor& qkv, Tensor& q, const Tensor* q_norm, const Tensor* k_norm,
                          double eps, const Tensor& positions, RopeParams rope, Tensor& k_cache,
                          Tensor& v_cache, const Tensor* rope_positions = nullptr);
// The checks of the stacked form alone (the fused attention input of op/attention.h runs them).
Status check_qk_norm_rope_cache(const Tensor& qkv, const Tensor& q, const Tensor* q_norm,
                                const Tensor* k_norm, const Tensor& positions, RopeParams rope,
                                const Tensor& k_cache, const Tensor& v_cache,
                                const Tensor* rope_positions = nullptr);

// out[r] = argmax over the last dimension of logits[R, V] (first index on ties). out: int32 [R].
Status argmax(const Tensor& logits, Tensor& out);

// out[to[j]] = src[from[j]] for every j, the rest of out as it was: int32, 1-D, on one device (a
// step's token ids taken from the tokens the step before left on the device). Each index must
// be in range: an error on the CPU; on CUDA, where the indices are not read on the host, an
// entry out of range is skipped. Two entries with the same `to` leave either one's value.
Status copy_indexed(const Tensor& src, const Tensor& from, const Tensor& to, Tensor& out);

// The sampling warpers in the order they apply (the runtime's SamplingParams less the window and
// the seed, which stay on the host).
struct SampleParams {
  float temperature = 0.0f;     // 0: greedy arg-max
  int32_t top_k = 0;            // 0 keeps all
  float top_p = 1.0f;           // 1 keeps all
  float min_p = 0.0f;           // 0 keeps all
  float repeat_penalty = 1.0f;  // 1 is off
};

struct TokenProbability {
  int32_t id = 0;
  float probability = 0.0f;
};

// Device scratch of op::sample and op::sample_rows, owned by the caller and kept across steps:
// the kernel sizes it on first use for a vocabulary and a number of rows and reuses it after
// (growing it only for more rows), so a decode step allocates nothing (and can be captured in a
// graph later). The CPU kernel does not use it.
struct SampleWorkspace {
  // CUB's double buffers of (key, id) pairs, [S, V] for the S rows of one sort (at most 64, so
  // 24 bytes a row and vocabulary entry stay bounded): a key is the row's index above its warped
  // logit's bits, ordered so that one radix sort of all S rows leaves each row most likely first.
  // Stored as uint8 bytes (8 a key); the sort leaves its result in either buffer.
  Tensor keys, alt_keys;
  Tensor ids, alt_ids;  // int32 [S, V]
  Tensor sort_temp;     // CUB's radix-sort scratch
  Tensor table;         // the rows' SampleRow table, then their recent ids (bytes)
  Tensor whole;         // the whole-vocabulary draw's state of each row (bytes)
};

// One row of op::sample_rows: its row of logits, its warpers, its draw and its penalty window.
struct SampleRow {
  int64_t row = 0;  // the row of logits
  SampleParams params;
  double uniform = 0.0;       // in [0, 1); read only when params.temperature > 0
  int64_t recent_begin = 0;   // the window of the repetition penalty:
  int64_t recent_count = 0;   // recent[recent_begin, recent_begin + recent_count)
};

// The next token of a row of logits (fp32 [V]): every distinct id of `recent` (int32 [n] on the
// logits' device, may be empty) gets the repetition penalty, then greedy arg-max at temperature
// 0 or else temperature -> top-k -> top-p -> min-p and an inverse-CDF draw at `uniform` in
// [0, 1) over the renormalised kept probabilities in id order (op::draw). The draw comes from the
// caller so the CPU and the GPU pick the same token for the same random sequence. out: int32 [1]
// on the logits' device.
Status sample(const Tensor& logits, const Tensor& recent, const SampleParams& params,
              double uniform, SampleWorkspace& workspace, Tensor& out);

// op::sample for many rows at once: out[i] (int32 [rows.size()] on the logits' device) is the
// token op::sample gives for logits row rows[i].row (logits fp32 [R, V]) with rows[i]'s window of
// `recent` (every row's window packed into one host array), its params and its uniform. On the
// GPU the table and the ids go up in one copy that does not wait for the device, one pipeline
// runs every row (one sort for up to 64 of them), and nothing comes back until the caller copies
// out.
Status sample_rows(const Tensor& logits, const std::vector<SampleRow>& rows,
                   const std::vector<int32_t>& recent, SampleWorkspace& workspace, Tensor& out);

// The host pieces of op::sample's CPU kernel, on plain arrays, for the runtime's host Sampler
// (the reference the GPU kernel is tested against). Preconditions, not checked: vocab > 0,
// logits of length vocab, candidates non-empty.
//
// Hugging Face's repetition penalty, in place: logits[id] = logits[id] > 0 ? logits[id] / penalty
// : logits[id] * penalty, once for each distinct id of recent[0, n) in [0, vocab).
void repetition_penalty(float penalty, const int32_t* recent, int64_t n, float* logits,
                        int64_t vocab);
// The tokens a non-greedy draw chooses among (no penalty applied here), most likely first (the
// lower id first on equal logits), with their renormalised probabilities: l = logits / T, the
// top_k largest, p = exp(l - max) / sum (in double), the smallest prefix with mass >= top_p,
// those with p >= min_p * p_max, then p / sum(kept) where the parameters may cut any
// (cuts_vocabulary, sample_math.h).
std::vector<TokenProbability> sample_candidates(const float* logits, int64_t vocab,
                                                const SampleParams& params);
// The inverse-CDF draw over the candidates in id order (as torch.multinomial walks them): the
// first id whose running probability sum, in units of 2^-60 (sample_math.h), exceeds
// uniform in [0, 1); the largest id when rounding leaves uniform above the total.
int32_t draw(const std::vector<TokenProbability>& candidates, double uniform);

// Fills t (fp32/fp16/bf16) with offset + scale * u, u uniform in [-1, 1) from a hash of
// (seed, element index): the same values on every device, so a random-weight model on the GPU
// is the same model as on the CPU.
Status fill_random(Tensor& t, uint64_t seed, float scale, float offset);

// ---- Vision tower ops (Qwen3-VL) ----

// Row-wise LayerNorm over the last dimension D = weight.numel() (bias: the same length):
//   out = (x - mean) / sqrt(var + eps) * weight + bias, var the biased variance, both in fp32.
// weight and bias: fp32/fp16/bf16. out may alias x.
Status layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                 Tensor& out);

// Which GELU: kErf is the exact x/2 * (1 + erf(x / sqrt 2)) (torch nn.GELU()), kTanh the tanh
// approximation x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) (gelu_pytorch_tanh).
enum class GeluKind { kErf, kTanh };

// out = gelu(x), elementwise. out may alias x.
Status gelu(const Tensor& x, GeluKind kind, Tensor& out);

// 2-D rotary embedding of image patches in place, rotate-half form as the Qwen2/3-VL vision
// tower applies it. x: [T, heads, d] with d % 4 == 0; positions: int32 [T, 2] = (row, col) of
// each patch. Pair (i, i + d/2) turns by row * f(i) for i < d/4 and by col * f(i - d/4) after,
// f(j) = theta^(-2j / (d/2)), angles in fp32.
Status rope_2d(Tensor& x, const Tensor& positions, double theta);

// Bidirectional (non-causal) softmax attention over packed sequences, scale 1/sqrt(d):
// q, k, v, out: [T, heads * d] (head h in columns [h*d, (h+1)*d)). cu_seqlens: int32 [S + 1] on
// q's device, 0 = c0 <= c1 <= ... <= cS = T; token t attends to every token of its own sequence
// [ci, ci+1) and to no other. Host cu_seqlens are checked here; device ones are the caller's
// to check (the CUDA kernel clamps them to [0, T] rather than read outside the tensors).
Status varlen_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& cu_seqlens, int64_t heads, Tensor& out);

}  // namespace kuiper::op
