#include "kuiper/op/ops.h"

#include <cmath>

#include "kuiper/op/kernels/cpu/cpu_kernels.h"
#ifdef KUIPER_WITH_CUDA
#include "kuiper/op/kernels/cuda/cuda_kernels.h"
#endif

namespace kuiper::op {

namespace {

Status fail(const char* op, const std::string& why) {
  return Status::Error(std::string(op) + ": " + why);
}

bool is_float(DataType t) {
  return t == DataType::kFp32 || t == DataType::kFp16 || t == DataType::kBf16;
}

// Activations: fp32 everywhere, fp16 and bf16 on CUDA.
Status check_activation(const char* op, const Tensor& t) {
  if (!t.defined()) return fail(op, "undefined tensor");
  if (t.dtype() == DataType::kFp32) return Status::Ok();
  if (is_float(t.dtype()) && t.device() == DeviceType::kCuda) return Status::Ok();
  return fail(op, "unsupported activation " + t.describe());
}

// Two activation dtypes one op may mix: equal, or one of them fp32 (the fp32 residual stream
// beside 16-bit activations); never fp16 with bf16.
bool mixable(DataType a, DataType b) {
  return a == b || a == DataType::kFp32 || b == DataType::kFp32;
}

Status same_device(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = *ts.begin();
  for (const Tensor* t : ts) {
    if (t->device() != first->device()) {
      return fail(op, "tensors on different devices: " + first->describe() + " and " +
                          t->describe());
    }
  }
  return Status::Ok();
}

Status same_shape_and_type(const char* op, const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) {
    return fail(op, "mismatched " + a.describe() + " and " + b.describe());
  }
  return Status::Ok();
}

// Host cache rows must lie inside the cache; device ones cannot be read without a sync (see
// kv_write in ops.h).
Status check_cache_rows(const char* op, const Tensor& positions, const Tensor& cache) {
  if (positions.device() != DeviceType::kCpu) return Status::Ok();
  for (int64_t t = 0; t < positions.numel(); ++t) {
    const int32_t p = positions.data<int32_t>()[t];
    if (p < 0 || p >= cache.dim(0)) {
      return fail(op, "position " + std::to_string(p) + " is outside " + cache.describe());
    }
  }
  return Status::Ok();
}

// Rotary parameters the kernels can turn by: a positive theta; for YaRN a positive factor and
// attention factor and a ramp that rises (low < high).
Status check_rope(const char* op, const RopeParams& rope) {
  bool ok = rope.theta > 0 && std::isfinite(rope.theta);
  if (rope.scaling == RopeScaling::kYarn) {
    ok = ok && rope.factor > 0 && std::isfinite(rope.factor) && rope.attention_factor > 0 &&
         std::isfinite(rope.attention_factor) && rope.low >= 0 && rope.low < rope.high &&
         std::isfinite(rope.high);
  }
  return ok ? Status::Ok()
            : fail(op, "bad rotary parameters (theta " + std::to_string(rope.theta) + ")");
}

bool sample_params_in_range(const SampleParams& params, double uniform) {
  return params.temperature >= 0.0f && params.top_k >= 0 && params.top_p > 0.0f &&
         params.top_p <= 1.0f && params.min_p >= 0.0f && params.min_p <= 1.0f &&
         params.repeat_penalty > 0.0f && uniform >= 0.0 && uniform < 1.0;
}

}  // namespace

#ifdef KUIPER_WITH_CUDA
#define KUIPER_DISPATCH(device, call)                        \
  do {                                                       \
    if ((device) == DeviceType::kCuda) return cuda::call;    \
    cpu::call;                                               \
    return Status::Ok();                                     \
  } while (0)
#else
#define KUIPER_DISPATCH(device, call) \
  do {                                \
    cpu::call;                        \
    return Status::Ok();              \
  } while (0)
#endif

Status embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  KUIPER_RETURN_IF_ERROR(check_activation("embedding", out));
  KUIPER_RETURN_IF_ERROR(same_device("embedding", {&table, &ids, &out}));
  if (table.ndim() != 2 || !is_float(table.dtype())) {
    return fail("embedding", "bad table " + table.describe());
  }
  if (ids.dtype() != DataType::kInt32 || out.ndim() != 2 || out.dim(0) != ids.numel() ||
      out.dim(1) != table.dim(1)) {
    return fail("embedding", "ids " + ids.describe() + " and out " + out.describe() +
                                 " do not fit table " + table.describe());
  }
  // Ids are validated where they enter (the tokenizer or the caller); a device-side check would
  // cost a sync per step.
  KUIPER_DISPATCH(out.device(), embedding(table, ids, out));
}

Status rmsnorm(const Tensor& x, const Tensor& weight, double eps, Tensor& out) {
  KUIPER_RETURN_IF_ERROR(check_activation("rmsnorm", x));
  KUIPER_RETURN_IF_ERROR(check_activation("rmsnorm", out));
  if (x.shape() != out.shape() || !mixable(x.dtype(), out.dtype())) {
    return fail("rmsnorm", "cannot normalise " + x.describe() + " into " + out.describe());
  }
  KUIPER_RETURN_IF_ERROR(same_device("rmsnorm", {&x, &weight, &out}));
  if (weight.ndim() != 1 || !is_float(weight.dtype()) || x.dim(-1) % weight.numel() != 0) {
    return fail("rmsnorm", "weight " + weight.describe() + " does not fit " + x.describe());
  }
  KUIPER_DISPATCH(x.device(), rmsnorm(x, weight, eps, out));
}

Status matmul(const Tensor& x, const Weight& w, const Tensor* bias, Tensor& out) {
  KUIPER_RETURN_IF_ERROR(check_activation("matmul", x));
  KUIPER_RETURN_IF_ERROR(check_weight(w).With("matmul"));
  KUIPER_RETURN_IF_ERROR(same_device("matmul", {&x, &w.values, &out}));
  if (x.ndim() != 2 || out.ndim() != 2 || w.cols() != x.dim(1) || out.dim(0) != x.dim(0) ||
      out.dim(1) != w.rows() ||
      (out.dtype() != x.dtype() && out.dtype() != DataType::kFp32)) {
    return fail("matmul", "cannot multiply " + x.describe() + " by " + w.describe() +
                              "^T into " + out.describe());
  }
  if (bias != nullptr && (bias->numel() != w.rows() || bias->device() != x.device() ||
                          !is_float(bias->dtype()))) {
    return fail("matmul", "bias " + bias->describe() + " does not fit " + w.describe());
  }
  KUIPER_DISPATCH(x.device(), matmul(x, w, bias, out));
}

Status dequantize(const Weight& w, Tensor& out) {
  KUIPER_RETURN_IF_ERROR(check_weight(w).With("dequantize"));
  KUIPER_RETURN_IF_ERROR(same_device("dequantize", {&w.values, &out}));
  if (!is_float(out.dtype()) || out.shape() != std::vector<int64_t>{w.rows(), w.cols()}) {
    return fail("dequantize", "cannot dequantize " + w.describe() + " into " + out.describe());
  }
  KUIPER_DISPATCH(out.device(), dequantize(w, out));
}

Result<bool> tile(Weight& w) {
  KUIPER_RETURN_IF_ERROR(check_weight(w).With("tile"));
  if (w.tiled || !tileable(w) || w.device() == DeviceType::kCpu) return false;
#ifdef KUIPER_WITH_CUDA
  KUIPER_RETURN_IF_ERROR(cuda::tile(w));
  return true;
#else
  return false;
#endif
}

Status quantize(const Tensor& w, Weight& out) {
  KUIPER_RETURN_IF_ERROR(check_weight(out).With("quantize"));
  KUIPER_RETURN_IF_ERROR(same_device("quantize", {&w, &out.values}));
  if (!out.quantized() || !is_float(w.dtype()) ||
      w.shape() != std::vector<int64_t>{out.rows(), out.cols()}) {
    return fail("quantize", "cannot quantize " + w.describe() + " into " + out.describe());
  }
  KUIPER_DISPATCH(w.device(), quantize(w, out));
}

Result<Weight> empty_weight(WeightFormat format, int64_t N, int64_t K, int64_t block_rows,
                            int64_t block_cols, DeviceType device) {
  const std::string what = std::string(weight_format_name(format)) + " weight " +
                           shape_string({N, K});
  if (format == WeightFormat::kPlain || N < 1 || K < 1 || block_rows < 1 || block_cols < 1) {
    return fail("empty_weight", "cannot make a " + what);
  }
  Weight w;
  w.format = format;
  w.block_rows = block_rows;
  w.block_cols = block_cols;
  if (format == WeightFormat::kFp8) {
    KUIPER_ASSIGN_OR_RETURN(w.values, Tensor::empty({N, K}, DataType::kFp8E4m3, device));
    KUIPER_ASSIGN_OR_RETURN(
        w.scales, Tensor::empty({(N + block_rows - 1) / block_rows,
                                 (K + block_cols - 1) / block_cols}, DataType::kFp32, device));
  } else {
    const int64_t group = block_cols;
    const bool int4 = format == WeightFormat::kInt4;
    if (block_rows != 1 || K % group != 0 || (int4 && group % 2 != 0)) {
      return fail("empty_weight", what + ": group " + std::to_string(group) +
                                      " must divide the columns" + (int4 ? " and be even" : "") +
                                      ", one row a group");
    }
    KUIPER_ASSIGN_OR_RETURN(w.values,
                            Tensor::empty({N, int4 ? K / 2 : K}, DataType::kUint8, device));
    KUIPER_ASSIGN_OR_RETURN(w.scales, Tensor::empty({N, K / group}, DataType::kFp16, device));
    KUIPER_ASSIGN_OR_RETURN(w.zeros, Tensor::empty({N, K / group}, DataType::kUint8, device));
  }
  return w;
}

Status rope(Tensor& x, const Tensor& positions, RopeParams rope) {
  KUIPER_RETURN_IF_ERROR(check_activation("rope", x));
  KUIPER_RETURN_IF_ERROR(same_device("rope", {&x, &positions}));
  KUIPER_RETURN_IF_ERROR(check_rope("rope", rope));
  if (x.ndim() != 3 || x.dim(2) % 2 != 0 || positions.dtype() != DataType::kInt32 ||
      positions.numel() != x.dim(0)) {
    return fail("rope", "bad input " + x.describe() + " with positions " + positions.describe());
  }
  KUIPER_DISPATCH(x.device(), rope(x, positions, rope));
}

Status mrope(Tensor& x, const Tensor& positions, RopeParams rope,
             const std::vector<int64_t>& sections) {
  KUIPER_RETURN_IF_ERROR(check_activation("mrope", x));
  KUIPER_RETURN_IF_ERROR(same_device("mrope", {&x, &positions}));
  KUIPER_RETURN_IF_ERROR(check_rope("mrope", rope));
  if (x.ndim() != 3 || x.dim(2) % 2 != 0 || positions.dtype() != DataType::kInt32 ||
      positions.numel() != 3 * x.dim(0)) {
    return fail("mrope", "bad input " + x.describe() + " with positions " + positions.describe() +
                             " (want int32 [3, " + std::to_string(x.dim(0)) + "])");
  }
  int64_t sum = 0;
  for (int64_t s : sections) sum += s < 0 ? x.dim(2) : s;
  if (sections.size() != 3 || sum != x.dim(2) / 2) {
    return fail("mrope", "sections must be three non-negative counts summing to head_dim / 2 (" +
                             std::to_string(x.dim(2) / 2) + ")");
  }
  KUIPER_DISPATCH(x.device(), mrope(x, positions, rope, sections));
}

Status swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  KUIPER_RETURN_IF_ERROR(check_activation("swiglu", gate));
  KUIPER_RETURN_IF_ERROR(same_shape_and_type("swiglu", gate, up));
  KUIPER_RETURN_IF_ERROR(same_shape_and_type("swiglu", gate, out));
  KUIPER_RETURN_IF_ERROR(same_device("swiglu", {&gate, &up, &out}));
  KUIPER_DISPATCH(gate.device(), swiglu(gate, up, out));
}

Status swiglu(const Tensor& gate_up, Tensor& out) {
  KUIPER_RETURN_IF_ERROR(check_activation("swiglu", gate_up));
  KUIPER_RETURN_IF_ERROR(same_device("swiglu", {&gate_up, &out}));
  if (gate_up.ndim() != 2 || out.ndim() != 2 || out.dim(0) != gate_up.dim(0) ||
      gate_up.dim(1) != 2 * out.dim(1) || out.dtype() != gate_up.dtype()) {
    return fail("swiglu", "bad stacked gate/up " + gate_up.describe() + " for " + out.describe());
  }
  KUIPER_DISPATCH(out.device(), swiglu(gate_up, out));
}

Status add(const Tensor& a, const Tensor& b, Tensor& out) {
  KUIPER_RETURN_IF_ERROR(check_activation("add", a));
  KUIPER_RETURN_IF_ERROR(check_activation("add", b));
  if (a.shape() != b.shape() || (b.dtype() != a.dtype() && a.dtype() != DataType::kFp32)) {
    return fail("add", "cannot add " + b.describe() + " to " + a.describe());
  }
  KUIPER_RETURN_IF_ERROR(same_shape_and_type("add", a, out));
  KUIPER_RETURN_IF_ERROR(same_device("add", {&a, &b, &out}));
  KUIPER_DISPATCH(a.device(), add(a, b, out));
}

Status kv_write(const Tensor& k, Tensor& cache, const Tensor& positions) {
  KUIPER_RETURN_IF_ERROR(check_activation("kv_write", k));
  KUIPER_RETURN_IF_ERROR(same_device("kv_write", {&k, &cache, &positions}));
  if (k.ndim() != 2 || cache.ndim() != 2 || k.dim(1) != cache.dim(1) ||
      k.dtype() != cache.dtype() || positions.dtype() != DataType::kInt32 ||
      positions.numel() != k.dim(0)) {
    return fail("kv_write", "cannot write " + k.describe() + " at positions " +
                                positions.describe() + " of " + cache.describe());
  }
  KUIPER_RETURN_IF_ERROR(check_cache_rows("kv_write", positions, cache));
  KUIPER_DISPATCH(k.device(), kv_write(k, cache, positions));
}

Status argmax(const Tensor& logits, Tensor& out) {
  KUIPER_RETURN_IF_ERROR(check_activation("argmax", logits));
  KUIPER_RETURN_IF_ERROR(same_device("argmax", {&logits, &out}));
  if (out.dtype() != DataType::kInt32 || out.numel() * logits.dim(-1) != logits.numel()) {
    return fail("argmax", "bad output " + out.describe() + " for " + logits.describe());
  }
  KUIPER_DISPATCH(logits.device(), argmax(logits, out));
}

Status copy_indexed(const Tensor& src, const Tensor& from, const Tensor& to, Tensor& out) {
  KUIPER_RETURN_IF_ERROR(same_device("copy_indexed", {&src, &from, &to, &out}));
  for (const Tensor* t : {&src, &from, &to, static_cast<const Tensor*>(&out)}) {
    if (t->dtype() != DataType::kInt32 || t->ndim() != 1) {
      return fail("copy_indexed", "takes 1-D int32 tensors, not " + t->describe());
    }
  }
  if (from.numel() != to.numel()) {
    return fail("copy_indexed", "from " + from.describe() + " and to " + to.describe() +
                                    " differ in length");
  }
  if (src.device() == DeviceType::kCpu) {
    for (int64_t j = 0; j < from.numel(); ++j) {
      const int32_t f = from.data<int32_t>()[j], t = to.data<int32_t>()[j];
      if (f < 0 || f >= src.numel() || t < 0 || t >= out.numel()) {
        return fail("copy_indexed", "entry " + std::to_string(j) + " copies " + std::to_string(f) +
                                        " of " + src.describe() + " to " + std::to_string(t) +
                                        " of " + out.describe());
      }
    }
  }
  KUIPER_DISPATCH(src.device(), copy_indexed(src, from, to, out));
}

Status linear(const Tensor& x, const Weight& w, const LinearOptions& o, Tensor& out) {
  KUIPER_RETURN_IF_ERROR(check_activation("linear", x));
  KUIPER_RETURN_IF_ERROR(check_activation("linear", out));
  KUIPER_RETURN_IF_ERROR(check_weight(w).With("linear"));
  KUIPER_RETURN_IF_ERROR(same_device("linear", {&x, &w.values, &out}));
  const int64_t rows = o.swiglu ? 2 * out.dim(-1) : out.dim(-1);
  // out has x's dtype; or fp32 from 16-bit x (logits, the fp32 residual), not with swiglu; or
  // 16-bit from an fp32 x that the norm reads (the fp32 residual stream).
  const bool dtypes_fit =
      out.dtype() == x.dtype() ||
      (mixable(x.dtype(), out.dtype()) &&
       (out.dtype() == DataType::kFp32 ? !o.swiglu : o.norm != nullptr));
  if (x.ndim() != 2 || out.ndim() != 2 || w.cols() != x.dim(1) || out.dim(0) != x.dim(0) ||
      w.rows() != rows || !dtypes_fit) {
    return fail("linear", "cannot multiply " + x.describe() + " by " + w.describe() + "^T into " +
                              out.describe() + (o.swiglu ? " (swiglu)" : ""));
  }
  if (o.swiglu && o.residual) return fail("linear", "swiglu and residual do not combine");
  if (o.bias != nullptr && (o.bias->numel() != rows || o.bias->device() != x.device() ||
                            !is_float(o.bias->dtype()))) {
    return fail("linear", "bias " + o.bias->describe() + " does not fit " + w.describe());
  }
  if (o.norm != nullptr && (o.norm->ndim() != 1 || o.norm->numel() != x.dim(1) ||
                            o.norm->device() != x.device() || !is_float(o.norm->dtype()))) {
    return fail("linear", "norm weight " + o.norm->describe() + " does not fit " + x.describe());
  }
#ifdef KUIPER_WITH_CUDA
  if (x.device() == DeviceType::kCuda) {
    KUIPER_ASSIGN_OR_RETURN(const bool done, cuda::linear(x, w, o, out));
    if (done) return Status::Ok();
  }
#endif
  // The composition, which is also the reference the fused GPU forms are tested against. Its
  // intermediates have the activation dtype: x's, or out's where x is the fp32 residual.
  const int64_t T = x.dim(0), N = out.dim(1);
  const DataType act = x.dtype() != DataType::kFp32 ? x.dtype() : out.dtype();
  Tensor h = x;
  if (o.norm != nullptr) {
    KUIPER_ASSIGN_OR_RETURN(h, Tensor::empty(x.shape(), act, x.device()));
    KUIPER_RETURN_IF_ERROR(rmsnorm(x, *o.norm, o.eps, h));
  }
  if (o.swiglu) {
    KUIPER_ASSIGN_OR_RETURN(Tensor gate, Tensor::empty({T, N}, act, x.device()));
    KUIPER_ASSIGN_OR_RETURN(Tensor up, Tensor::empty({T, N}, act, x.device()));
    Tensor gate_bias, up_bias;
    if (o.bias != nullptr) {
      gate_bias = o.bias->rows(0, N);
      up_bias = o.bias->rows(N, N);
    }
    KUIPER_RETURN_IF_ERROR(matmul(h, w.rows(0, N), o.bias ? &gate_bias : nullptr, gate));
    KUIPER_RETURN_IF_ERROR(matmul(h, w.rows(N, N), o.bias ? &up_bias : nullptr, up));
    return swiglu(gate, up, out);
  }
  if (!o.residual) return matmul(h, w, o.bias, out);
  KUIPER_ASSIGN_OR_RETURN(Tensor product, Tensor::empty(out.shape(), out.dtype(), out.device()));
  KUIPER_RETURN_IF_ERROR(matmul(h, w, o.bias, product));
  return add(out, product, out);
}

bool linear_fuses(int64_t T, int64_t K, const Weight& w) {
#ifdef KUIPER_WITH_CUDA
  if (w.values.device() == DeviceType::kCuda) return cuda::linear_fuses(T, K, w);
#endif
  (void)T;
  (void)K;
  return false;
}

Status qk_norm_rope_cache(Tensor& q, Tensor& k, const Tensor& v, const Tensor* q_norm,
                          const Tensor* k_norm, double eps, const Tensor& positions,
                          RopeParams rope, Tensor& k_cache, Tensor& v_cache,
                          const Tensor* rope_positions) {
  KUIPER_RETURN_IF_ERROR(check_activation("qk_norm_rope_cache", q));
  KUIPER_RETURN_IF_ERROR(
      same_device("qk_norm_rope_cache", {&q, &k, &v, &positions, &k_cache, &v_cache}));
  KUIPER_RETURN_IF_ERROR(check_rope("qk_norm_rope_cache", rope));
  const int64_t T = q.dim(0);
  if (q.ndim() != 3 || k.ndim() != 3 || k.dim(0) != T || k.dim(2) != q.dim(2) ||
      q.dim(2) % 2 != 0 || v.ndim() != 2 || v.dim(0) != T || v.dim(1) != k.dim(1) * k.dim(2) ||
      k.dtype() != q.dtype() || v.dtype() != q.dtype() || k_cache.ndim() != 2 ||
      v_cache.ndim() != 2 || k_cache.dim(1) != v.dim(1) || v_cache.dim(1) != v.dim(1) ||
      k_cache.dim(0) != v_cache.dim(0) || k_cache.dtype() != q.dtype() ||
      v_cache.dtype() != q.dtype() || positions.dtype() != DataType::kInt32 ||
      positions.numel() != T) {
    return fail("qk_norm_rope_cache", "bad inputs q " + q.describe() + ", k " + k.describe() +
                                          ", v " + v.describe() + ", caches " +
                                          k_cache.describe() + ", positions " +
                                          positions.describe());
  }
  for (const Tensor* n : {q_norm, k_norm}) {
    if (n != nullptr && (n->ndim() != 1 || n->numel() != q.dim(2) || !is_float(n->dtype()) ||
                         n->device() != q.device())) {
      return fail("qk_norm_rope_cache", "norm weight " + n->describe() + " does not fit head_dim " +
                                            std::to_string(q.dim(2)));
    }
  }
  if (rope_positions != nullptr &&
      (rope_positions->dtype() != DataType::kInt32 || rope_positions->numel() != T ||
       rope_positions->device() != q.device())) {
    return fail("qk_norm_rope_cache", "rope positions " + rope_positions->describe() +
                                          " do not fit " + std::to_string(T) + " tokens");
  }
  KUIPER_RETURN_IF_ERROR(check_cache_rows("qk_norm_rope_cache", positions, k_cache));
  const Tensor& rotary = rope_positions != nullptr ? *rope_positions : positions;
  KUIPER_DISPATCH(q.device(), qk_norm_rope_cache(q, k, v, q_norm, k_norm, eps, positions, rope,
                                                 k_cache, v_cache, rotary));
}

Status check_qk_norm_rope_cache(const Tensor& qkv, const Tensor& q, const Tensor* q_norm,
                                const Tensor* k_norm, const Tensor& positions, RopeParams rope,
                                const Tensor& k_cache, const Tensor& v_cache,
                                const Tensor* rope_positions) {
  KUIPER_RETURN_IF_ERROR(check_activation("qk_norm_rope_cache", q));
  KUIPER_RETURN_IF_ERROR(
      same_device("qk_norm_rope_cache", {&qkv, &q, &positions, &k_cache, &v_cache}));
  KUIPER_RETURN_IF_ERROR(check_rope("qk_norm_rope_cache", rope));
  const int64_t T = qkv.ndim() == 3 ? qkv.dim(0) : -1;
  const int64_t kv_heads = q.ndim() == 3 ? (qkv.dim(1) - q.dim(1)) / 2 : -1;
  if (T < 0 || kv_heads < 1 || qkv.dim(1) != q.dim(1) + 2 * kv_heads || q.dim(0) != T ||
      q.dim(2) != qkv.dim(2) || q.dtype() != qkv.dtype()) {
    return fail("qk_norm_rope_cache",
                "bad stacked inputs qkv " + qkv.describe() + ", q " + q.describe());
  }
  const int64_t d = qkv.dim(2);
  if (d % 2 != 0 || k_cache.ndim() != 2 || v_cache.ndim() != 2 || k_cache.dim(1) != kv_heads * d ||
      v_cache.dim(1) != kv_heads * d || k_cache.dim(0) != v_cache.dim(0) ||
      k_cache.dtype() != q.dtype() || v_cache.dtype() != q.dtype() ||
      positions.dtype() != DataType::kInt32 || positions.numel() != T) {
    return fail("qk_norm_rope_cache", "bad caches " + k_cache.describe() + ", " +
                                          v_cache.describe() + " or positions " +
                                          positions.describe() + " for qkv " + qkv.describe());
  }
  for (const Tensor* n : {q_norm, k_norm}) {
    if (n != nullptr &&
        (n->ndim() != 1 || n->numel() != d || !is_float(n->dtype()) || n->device() != q.device())) {
      return fail("qk_norm_rope_cache",
                  "norm weight " + n->describe() + " does not fit head_dim " + std::to_string(d));
    }
  }
  if (rope_positions != nullptr &&
      (rope_positions->dtype() != DataType::kInt32 || rope_positions->numel() != T ||
       rope_positions->device() != q.device())) {
    return fail("qk_norm_rope_cache", "rope positions " + rope_positions->describe() +
                                          " do not fit " + std::to_string(T) + " tokens");
  }
  return check_cache_rows("qk_norm_rope_cache", positions, k_cache);
}

Status qk_norm_rope_cache(Tensor& qkv, Tensor& q, const Tensor* q_norm, const Tensor* k_norm,
                          double eps, const Tensor& positions, RopeParams rope, Tensor& k_cache,
                          Tensor& v_cache, const Tensor* rope_positions) {
  KUIPER_RETURN_IF_ERROR(check_qk_norm_rope_cache(qkv, q, q_norm, k_norm, positions, rope, k_cache,
                                                  v_cache, rope_positions));
  const Tensor& rotary = rope_positions != nullptr ? *rope_positions : positions;
  KUIPER_DISPATCH(q.device(), qk_norm_rope_cache(qkv, q, q_norm, k_norm, eps, positions, rope,
                                                 k_cache, v_cache, rotary));
}

Status sample(const Tensor& logits, const Tensor& recent, const SampleParams& params,
              double uniform, SampleWorkspace& workspace, Tensor& out) {
  if (!logits.defined() || logits.dtype() != DataType::kFp32 || logits.numel() == 0 ||
      logits.numel() != logits.dim(-1) || logits.numel() > INT32_MAX) {
    return fail("sample", "logits must be one non-empty fp32 row, not " +
                              (logits.defined() ? logits.describe() : "undefined tensor"));
  }
  if (!out.defined() || out.dtype() != DataType::kInt32 || out.numel() != 1) {
    return fail("sample", "out must be int32[1], not " +
                              (out.defined() ? out.describe() : "undefined tensor"));
  }
  KUIPER_RETURN_IF_ERROR(same_device("sample", {&logits, &out}));
  if (recent.defined()) {
    KUIPER_RETURN_IF_ERROR(same_device("sample", {&logits, &recent}));
    if (recent.dtype() != DataType::kInt32) return fail("sample", "bad recent " + recent.describe());
  }
  if (!sample_params_in_range(params, uniform)) return fail("sample", "parameters out of range");
#ifdef KUIPER_WITH_CUDA
  if (logits.device() == DeviceType::kCuda) {
    return cuda::sample(logits, recent, params, uniform, workspace, out);
  }
#endif
  (void)workspace;  // the CPU kernel sorts in place and needs none
  cpu::sample(logits, recent, params, uniform, out);
  return Status::Ok();
}

Status sample_rows(const Tensor& logits, const std::vector<SampleRow>& rows,
                   const std::vector<int32_t>& recent, SampleWorkspace& workspace, Tensor& out) {
  if (!logits.defined() || logits.dtype() != DataType::kFp32 || logits.ndim() != 2 ||
      logits.numel() == 0 || logits.dim(1) > INT32_MAX) {
    return fail("sample_rows", "logits must be non-empty fp32 [R, V], not " +
                                   (logits.defined() ? logits.describe() : "undefined tensor"));
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  if (n == 0 || !out.defined() || out.dtype() != DataType::kInt32 || out.numel() != n) {
    return fail("sample_rows", "out must be int32[" + std::to_string(n) + "] for " +
                                   std::to_string(n) + " rows, not " +
                                   (out.defined() ? out.describe() : "undefined tensor"));
  }
  KUIPER_RETURN_IF_ERROR(same_device("sample_rows", {&logits, &out}));
  for (size_t i = 0; i < rows.size(); ++i) {
    const SampleRow& r = rows[i];
    if (r.row < 0 || r.row >= logits.dim(0) || r.recent_begin < 0 || r.recent_count < 0 ||
        r.recent_begin + r.recent_count > static_cast<int64_t>(recent.size()) ||
        !sample_params_in_range(r.params, r.uniform)) {
      return fail("sample_rows", "row " + std::to_string(i) + " (logits row " +
                                     std::to_string(r.row) + ") out of range");
    }
  }
#ifdef KUIPER_WITH_CUDA
  if (logits.device() == DeviceType::kCuda) {
    return cuda::sample_rows(logits, rows, recent, workspace, out);
  }
#endif
  (void)workspace;
  cpu::sample_rows(logits, rows, recent, out);
  return Status::Ok();
}

void repetition_penalty(float penalty, const int32_t* recent, int64_t n, float* logits,
                        int64_t vocab) {
  cpu::repetition_penalty(penalty, recent, n, logits, vocab);
}

std::vector<TokenProbability> sample_candidates(const float* logits, int64_t vocab,
                                                const SampleParams& params) {
  return cpu::sample_candidates(logits, vocab, params);
}

int32_t draw(const std::vector<TokenProbability>& candidates, double uniform) {
  return cpu::draw(candidates, uniform);
}

Status fill_random(Tensor& t, uint64_t seed, float scale, float offset) {
  if (!t.defined() || !is_float(t.dtype())) {
    return fail("fill_random", "cannot fill " + (t.defined() ? t.describe() : "undefined tensor"));
  }
  KUIPER_DISPATCH(t.device(), fill_random(t, seed, scale, offset));
}

// ---- Vision tower ops ----

Status layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                 Tensor& out) {
  KUIPER_RETURN_IF_ERROR(check_activation("layernorm", x));
  KUIPER_RETURN_IF_ERROR(same_shape_and_type("layernorm", x, out));
  KUIPER_RETURN_IF_ERROR(same_device("layernorm", {&x, &weight, &bias, &out}));
  if (weight.ndim() != 1 || bias.ndim() != 1 || !is_float(weight.dtype()) ||
      !is_float(bias.dtype()) || bias.numel() != weight.numel() || x.ndim() < 1 ||
      x.dim(-1) != weight.numel()) {
    return fail("layernorm", "weight " + weight.describe() + " and bias " + bias.describe() +
                                 " do not fit " + x.describe());
  }
  KUIPER_DISPATCH(x.device(), layernorm(x, weight, bias, eps, out));
}

Status gelu(const Tensor& x, GeluKind kind, Tensor& out) {
  KUIPER_RETURN_IF_ERROR(check_activation("gelu", x));
  KUIPER_RETURN_IF_ERROR(same_shape_and_type("gelu", x, out));
  KUIPER_RETURN_IF_ERROR(same_device("gelu", {&x, &out}));
  KUIPER_DISPATCH(x.device(), gelu(x, kind, out));
}

Status rope_2d(Tensor& x, const Tensor& positions, double theta) {
  KUIPER_RETURN_IF_ERROR(check_activation("rope_2d", x));
  KUIPER_RETURN_IF_ERROR(same_device("rope_2d", {&x, &positions}));
  if (x.ndim() != 3 || x.dim(2) % 4 != 0 || positions.dtype() != DataType::kInt32 ||
      positions.ndim() != 2 || positions.dim(0) != x.dim(0) || positions.dim(1) != 2) {
    return fail("rope_2d", "bad input " + x.describe() + " with positions " +
                               positions.describe() + " (want [T, heads, d % 4 == 0], [T, 2])");
  }
  KUIPER_DISPATCH(x.device(), rope_2d(x, positions, theta));
}

Status varlen_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& cu_seqlens, int64_t heads, Tensor& out) {
  KUIPER_RETURN_IF_ERROR(check_activation("varlen_attention", q));
  KUIPER_RETURN_IF_ERROR(same_shape_and_type("varlen_attention", q, k));
  KUIPER_RETURN_IF_ERROR(same_shape_and_type("varlen_attention", q, v));
  KUIPER_RETURN_IF_ERROR(same_shape_and_type("varlen_attention", q, out));
  KUIPER_RETURN_IF_ERROR(same_device("varlen_attention", {&q, &k, &v, &cu_seqlens, &out}));
  if (q.ndim() != 2 || heads <= 0 || q.dim(1) % heads != 0 || q.dim(1) == 0 ||
      cu_seqlens.dtype() != DataType::kInt32 || cu_seqlens.ndim() != 1 ||
      cu_seqlens.numel() < 2) {
    return fail("varlen_attention", "bad input " + q.describe() + " with " +
                                        std::to_string(heads) + " heads and cu_seqlens " +
                                        (cu_seqlens.defined() ? cu_seqlens.describe()
                                                              : std::string("undefined")));
  }
  if (cu_seqlens.device() == DeviceType::kCpu) {
    const int32_t* c = cu_seqlens.data<int32_t>();
    const int64_t S = cu_seqlens.numel() - 1;
    bool ok = c[0] == 0 && c[S] == q.dim(0);
    for (int64_t i = 0; ok && i < S; ++i) ok = c[i] <= c[i + 1];
    if (!ok) {
      return fail("varlen_attention", "cu_seqlens must rise from 0 to " +
                                          std::to_string(q.dim(0)) + " without falling");
    }
  }
  KUIPER_DISPATCH(q.device(), varlen_attention(q, k, v, cu_seqlens, heads, out));
}

}  // namespace kuiper::op
