// The reference sampler: Hugging Face's repetition penalty and warper chain (temperature ->
// top-k -> top-p -> min-p) in plain loops. Probabilities are summed in double so the result does
// not depend on the vocabulary's size, and the draw walks the kept tokens in id order (as
// torch.multinomial does) summing whole units of 2^-60 (sample_math.h), exact in any
// order; the CUDA kernel (kernels/cuda/sample.cu) follows the same arithmetic step by step.
#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "kuiper/op/kernels/cpu/cpu_kernels.h"
#include "kuiper/op/kernels/sample_math.h"

namespace kuiper::cpu {

void repetition_penalty(float penalty, const int32_t* recent, int64_t n, float* logits,
                        int64_t vocab) {
  std::unordered_set<int32_t> seen;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = recent[i];
    // A token is penalised once however often it repeats, as Hugging Face's gather/scatter does.
    if (id < 0 || id >= vocab || !seen.insert(id).second) continue;
    float& v = logits[id];
    v = v > 0.0f ? v / penalty : v * penalty;
  }
}

std::vector<op::TokenProbability> sample_candidates(const float* logits, int64_t vocab,
                                                    const op::SampleParams& params) {
  const float inv_temperature = params.temperature == 0.0f ? 1.0f : 1.0f / params.temperature;

  struct Scored {
    int32_t id;
    float logit;
  };
  std::vector<Scored> pool(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) {
    pool[static_cast<size_t>(i)] = {static_cast<int32_t>(i), logits[i] * inv_temperature};
  }
  // Most likely first; equal logits keep the lower id first so results do not depend on the
  // sort's internals (the GPU's stable radix sort gives the same order).
  auto more_likely = [](const Scored& a, const Scored& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  size_t keep = pool.size();
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < pool.size()) {
    keep = static_cast<size_t>(params.top_k);
    std::partial_sort(pool.begin(), pool.begin() + static_cast<std::ptrdiff_t>(keep), pool.end(),
                      more_likely);
    pool.resize(keep);
  } else {
    std::sort(pool.begin(), pool.end(), more_likely);
  }

  std::vector<op::TokenProbability> out(pool.size());
  const float top = pool.front().logit;
  double total = 0.0;
  for (size_t i = 0; i < pool.size(); ++i) {
    const double e = std::exp(static_cast<double>(pool[i].logit - top));
    out[i] = {pool[i].id, static_cast<float>(e)};
    total += e;
  }
  for (op::TokenProbability& c : out) c.probability = static_cast<float>(c.probability / total);

  if (params.top_p < 1.0f) {
    // The smallest prefix whose mass reaches top_p, the token crossing the line included.
    double mass = 0.0;
    size_t n = 0;
    while (n < out.size()) {
      mass += out[n].probability;
      ++n;
      if (mass >= params.top_p) break;
    }
    out.resize(n);
  }
  if (params.min_p > 0.0f) {
    const float floor = params.min_p * out.front().probability;
    size_t n = 1;
    while (n < out.size() && out[n].probability >= floor) ++n;
    out.resize(n);
  }
  if (!cuts_vocabulary(params, vocab)) return out;  // the softmax as it is
  double kept = 0.0;
  for (const op::TokenProbability& c : out) kept += c.probability;
  for (op::TokenProbability& c : out) c.probability = static_cast<float>(c.probability / kept);
  return out;
}

int32_t draw(const std::vector<op::TokenProbability>& candidates, double uniform) {
  // Each id's probability in units, then the walk in id order.
  int32_t last = 0;
  for (const op::TokenProbability& c : candidates) last = std::max(last, c.id);
  std::vector<unsigned long long> units(static_cast<size_t>(last) + 1, 0);
  for (const op::TokenProbability& c : candidates) {
    units[static_cast<size_t>(c.id)] = probability_units(static_cast<double>(c.probability));
  }
  const unsigned long long target = probability_units(uniform);
  unsigned long long mass = 0;
  for (int32_t id = 0; id < last; ++id) {
    mass += units[static_cast<size_t>(id)];
    if (target < mass) return id;
  }
  return last;  // through the last, or uniform fell in the rounding gap at the top
}

void sample(const Tensor& logits, const Tensor& recent, const op::SampleParams& params,
            double uniform, Tensor& out) {
  const int64_t vocab = logits.numel();
  const float* scores = logits.data<float>();
  std::vector<float> penalised;
  if (params.repeat_penalty != 1.0f && recent.defined() && recent.numel() > 0) {
    penalised.assign(scores, scores + vocab);
    repetition_penalty(params.repeat_penalty, recent.data<int32_t>(), recent.numel(),
                       penalised.data(), vocab);
    scores = penalised.data();
  }
  out.data<int32_t>()[0] =
      params.temperature == 0.0f
          ? static_cast<int32_t>(std::max_element(scores, scores + vocab) - scores)
          : cpu::draw(cpu::sample_candidates(scores, vocab, params), uniform);
}

void sample_rows(const Tensor& logits, const std::vector<op::SampleRow>& rows,
                 const std::vector<int32_t>& recent, Tensor& out) {
  const int64_t vocab = logits.dim(1);
  for (size_t i = 0; i < rows.size(); ++i) {
    const op::SampleRow& r = rows[i];
    const Tensor row = Tensor::view(logits.data<float>() + r.row * vocab, {vocab},
                                    DataType::kFp32, DeviceType::kCpu);
    const Tensor window =
        r.recent_count == 0
            ? Tensor()
            : Tensor::view(const_cast<int32_t*>(recent.data()) + r.recent_begin,
                           {r.recent_count}, DataType::kInt32, DeviceType::kCpu);
    Tensor token = Tensor::view(out.data<int32_t>() + i, {1}, DataType::kInt32, DeviceType::kCpu);
    sample(row, window, r.params, r.uniform, token);
  }
}

}  // namespace kuiper::cpu
