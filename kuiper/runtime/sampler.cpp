#include "kuiper/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_set>

namespace kuiper {

Status validate_sampling(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return Status::Error("temperature must be a number >= 0 (0 is greedy), not " +
                         std::to_string(p.temperature));
  }
  if (p.top_k < 0) {
    return Status::Error("top_k must be >= 0 (0 keeps all tokens), not " +
                         std::to_string(p.top_k));
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return Status::Error("top_p must be in (0, 1] (1 keeps all tokens), not " +
                         std::to_string(p.top_p));
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return Status::Error("min_p must be in [0, 1] (0 keeps all tokens), not " +
                         std::to_string(p.min_p));
  }
  if (!(p.repeat_penalty > 0.0f) || !std::isfinite(p.repeat_penalty)) {
    return Status::Error("repeat_penalty must be a number > 0 (1 is off), not " +
                         std::to_string(p.repeat_penalty));
  }
  if (p.repeat_last_n < -1) {
    return Status::Error("repeat_last_n must be >= 0 or -1 (all tokens), not " +
                         std::to_string(p.repeat_last_n));
  }
  return Status::Ok();
}

void apply_repetition_penalty(float penalty, const std::vector<int32_t>& recent,
                              std::vector<float>* logits) {
  const int64_t vocab = static_cast<int64_t>(logits->size());
  std::unordered_set<int32_t> seen;
  for (int32_t id : recent) {
    // A token is penalised once however often it repeats, as Hugging Face's gather/scatter does.
    if (id < 0 || id >= vocab || !seen.insert(id).second) continue;
    float& v = (*logits)[static_cast<size_t>(id)];
    v = v > 0.0f ? v / penalty : v * penalty;
  }
}

Result<Sampler> Sampler::create(const SamplingParams& params) {
  KUIPER_RETURN_IF_ERROR(validate_sampling(params));
  return Sampler(params);
}

const float* Sampler::penalised(const float* logits, int64_t vocab,
                                const std::vector<int32_t>& history) {
  if (params_.repeat_penalty == 1.0f || params_.repeat_last_n == 0 || history.empty()) {
    return logits;
  }
  scratch_.assign(logits, logits + vocab);
  const size_t window = params_.repeat_last_n < 0
                            ? history.size()
                            : std::min(history.size(), static_cast<size_t>(params_.repeat_last_n));
  const std::vector<int32_t> recent(history.end() - static_cast<std::ptrdiff_t>(window),
                                    history.end());
  apply_repetition_penalty(params_.repeat_penalty, recent, &scratch_);
  return scratch_.data();
}

double Sampler::uniform() {
  // 53 random bits as a double: std::uniform_real_distribution is allowed to differ between
  // standard libraries, mt19937_64's output is not.
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

std::vector<TokenProbability> Sampler::candidates(const float* logits, int64_t vocab,
                                                  const std::vector<int32_t>& history) {
  const float* scores = penalised(logits, vocab, history);
  const float inv_temperature = greedy() ? 1.0f : 1.0f / params_.temperature;

  struct Scored {
    int32_t id;
    float logit;
  };
  std::vector<Scored> pool(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) {
    pool[static_cast<size_t>(i)] = {static_cast<int32_t>(i), scores[i] * inv_temperature};
  }
  // Most likely first; equal logits keep the lower id first so results do not depend on the
  // sort's internals.
  auto more_likely = [](const Scored& a, const Scored& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  size_t keep = pool.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < pool.size()) {
    keep = static_cast<size_t>(params_.top_k);
    std::partial_sort(pool.begin(), pool.begin() + static_cast<std::ptrdiff_t>(keep), pool.end(),
                      more_likely);
    pool.resize(keep);
  } else {
    std::sort(pool.begin(), pool.end(), more_likely);
  }

  std::vector<TokenProbability> out(pool.size());
  const float top = pool.front().logit;
  double total = 0.0;
  for (size_t i = 0; i < pool.size(); ++i) {
    const double e = std::exp(static_cast<double>(pool[i].logit - top));
    out[i] = {pool[i].id, static_cast<float>(e)};
    total += e;
  }
  for (TokenProbability& c : out) c.probability = static_cast<float>(c.probability / total);

  if (params_.top_p < 1.0f) {
    // The smallest prefix whose mass reaches top_p, the token crossing the line included.
    double mass = 0.0;
    size_t n = 0;
    while (n < out.size()) {
      mass += out[n].probability;
      ++n;
      if (mass >= params_.top_p) break;
    }
    out.resize(n);
  }
  if (params_.min_p > 0.0f) {
    const float floor = params_.min_p * out.front().probability;
    size_t n = 1;
    while (n < out.size() && out[n].probability >= floor) ++n;
    out.resize(n);
  }
  double kept = 0.0;
  for (const TokenProbability& c : out) kept += c.probability;
  for (TokenProbability& c : out) c.probability = static_cast<float>(c.probability / kept);
  return out;
}

int32_t Sampler::sample(const float* logits, int64_t vocab, const std::vector<int32_t>& history) {
  if (greedy()) {
    const float* scores = penalised(logits, vocab, history);
    return static_cast<int32_t>(std::max_element(scores, scores + vocab) - scores);
  }
  const std::vector<TokenProbability> pool = candidates(logits, vocab, history);
  const double u = uniform();
  double mass = 0.0;
  for (const TokenProbability& c : pool) {
    mass += c.probability;
    if (u < mass) return c.id;
  }
  return pool.back().id;  // u fell in the rounding gap at the top of the distribution
}

}  // namespace kuiper
