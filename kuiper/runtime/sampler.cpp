#include "kuiper/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kuiper/op/ops.h"

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
  for (const auto& [name, value] : {std::pair<const char*, float>{"presence_penalty",
                                                                   p.presence_penalty},
                                    {"frequency_penalty", p.frequency_penalty}}) {
    if (!(value >= -2.0f && value <= 2.0f)) {
      return Status::Error(std::string(name) + " must be in [-2, 2] (0 is off), not " +
                           std::to_string(value));
    }
  }
  return Status::Ok();
}

void apply_occurrence_penalties(float presence, float frequency,
                                const std::unordered_map<int32_t, int32_t>& counts,
                                std::vector<float>* logits) {
  for (const auto& [id, count] : counts) {
    if (id < 0 || static_cast<size_t>(id) >= logits->size() || count <= 0) continue;
    (*logits)[static_cast<size_t>(id)] -= static_cast<float>(count) * frequency + presence;
  }
}

void apply_repetition_penalty(float penalty, const std::vector<int32_t>& recent,
                              std::vector<float>* logits) {
  op::repetition_penalty(penalty, recent.data(), static_cast<int64_t>(recent.size()),
                          logits->data(), static_cast<int64_t>(logits->size()));
}

Result<Sampler> Sampler::create(const SamplingParams& params) {
  KUIPER_RETURN_IF_ERROR(validate_sampling(params));
  return Sampler(params);
}

op::SampleParams Sampler::op_params() const {
  return {params_.temperature, params_.top_k, params_.top_p, params_.min_p,
          params_.repeat_penalty};
}

std::vector<int32_t> Sampler::recent(const std::vector<int32_t>& history) const {
  if (params_.repeat_penalty == 1.0f || params_.repeat_last_n == 0) return {};
  const size_t window = params_.repeat_last_n < 0
                            ? history.size()
                            : std::min(history.size(), static_cast<size_t>(params_.repeat_last_n));
  return std::vector<int32_t>(history.end() - static_cast<std::ptrdiff_t>(window), history.end());
}

const float* Sampler::penalised(const float* logits, int64_t vocab,
                                const std::vector<int32_t>& history) {
  const std::vector<int32_t> ids = recent(history);
  const bool occurrence = occurrence_penalties() && !drawn_.empty();
  if (ids.empty() && !occurrence) return logits;
  scratch_.assign(logits, logits + vocab);
  if (!ids.empty()) apply_repetition_penalty(params_.repeat_penalty, ids, &scratch_);
  if (occurrence) {
    apply_occurrence_penalties(params_.presence_penalty, params_.frequency_penalty, drawn_,
                               &scratch_);
  }
  return scratch_.data();
}

double Sampler::uniform() {
  // 53 random bits as a double: std::uniform_real_distribution is allowed to differ between
  // standard libraries, mt19937_64's output is not.
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

std::vector<TokenProbability> Sampler::candidates(const float* logits, int64_t vocab,
                                                  const std::vector<int32_t>& history) {
  return op::sample_candidates(penalised(logits, vocab, history), vocab, op_params());
}

int32_t Sampler::sample(const float* logits, int64_t vocab, const std::vector<int32_t>& history) {
  int32_t id = 0;
  if (greedy()) {
    const float* scores = penalised(logits, vocab, history);
    id = static_cast<int32_t>(std::max_element(scores, scores + vocab) - scores);
  } else {
    id = op::draw(candidates(logits, vocab, history), uniform());
  }
  if (occurrence_penalties()) ++drawn_[id];
  return id;
}

op::SampleRow Sampler::sample_row(int64_t row, const std::vector<int32_t>& history,
                                  std::vector<int32_t>* recent) {
  const std::vector<int32_t> ids = this->recent(history);
  op::SampleRow out;
  out.row = row;
  out.params = op_params();
  out.recent_begin = static_cast<int64_t>(recent->size());
  out.recent_count = static_cast<int64_t>(ids.size());
  recent->insert(recent->end(), ids.begin(), ids.end());
  // Drawn only when not greedy, as sample() does, so every path consumes the same sequence.
  out.uniform = greedy() ? 0.0 : uniform();
  return out;
}

Result<int32_t> Sampler::sample(const Tensor& logits, const std::vector<int32_t>& history) {
  const DeviceType device = logits.device();
  if (occurrence_penalties()) {
    // op::sample knows only the repetition penalty: the row comes to the host (4 bytes a
    // vocabulary entry, only for requests that ask for these penalties).
    const int64_t vocab = logits.numel();
    host_row_.resize(static_cast<size_t>(vocab));
    KUIPER_RETURN_IF_ERROR(
        Tensor::view(host_row_.data(), logits.shape(), DataType::kFp32, DeviceType::kCpu)
            .copy_from(logits));
    return sample(host_row_.data(), vocab, history);
  }
  std::vector<int32_t> ids = recent(history);
  const int64_t n = static_cast<int64_t>(ids.size());
  Tensor recent_ids;
  if (n > 0) {
    if (!recent_.defined() || recent_.device() != device || recent_.numel() < n) {
      // Room for the whole window (or twice what is needed when it is unbounded) so the buffer
      // is allocated once in the common case.
      const int64_t capacity = std::max<int64_t>(n, params_.repeat_last_n > 0
                                                        ? params_.repeat_last_n
                                                        : 2 * n);
      KUIPER_ASSIGN_OR_RETURN(recent_, Tensor::empty({capacity}, DataType::kInt32, device));
    }
    recent_ids = recent_.rows(0, n);
    KUIPER_RETURN_IF_ERROR(
        recent_ids.copy_from(Tensor::view(ids.data(), {n}, DataType::kInt32, DeviceType::kCpu)));
  }
  if (!token_.defined() || token_.device() != device) {
    KUIPER_ASSIGN_OR_RETURN(token_, Tensor::empty({1}, DataType::kInt32, device));
  }
  // Drawn only when not greedy, as the host path does, so both consume the same sequence.
  const double u = greedy() ? 0.0 : uniform();
  KUIPER_RETURN_IF_ERROR(op::sample(logits, recent_ids, op_params(), u, workspace_, token_));
  int32_t id = 0;
  KUIPER_RETURN_IF_ERROR(
      Tensor::view(&id, {1}, DataType::kInt32, DeviceType::kCpu).copy_from(token_));
  return id;
}

}  // namespace kuiper
