// How a rotary embedding turns (op::rope, op::mrope, op::qk_norm_rope_cache): the base theta and,
// with YaRN rope scaling, how each frequency is scaled and the factor on cos and sin. A few
// scalars, passed by value: the kernels build their frequency table from them (rope_math.h).
#pragma once

#include <cstdint>

namespace kuiper::op {

enum class RopeScaling { kNone, kYarn };

struct RopeParams {
  // Unscaled RoPE of base theta: a bare theta converts to it, as every caller without scaling
  // (the vision tower, tests) passes one.
  RopeParams(double theta = 10000.0) : theta(theta) {}  // NOLINT(google-explicit-constructor)

  double theta;
  RopeScaling scaling = RopeScaling::kNone;
  // YaRN: frequency i (of d / 2) keeps theta^(-2i/d) for i <= low, is divided by factor for
  // i >= high, and blends the two linearly in i between (transformers' linear ramp).
  double factor = 1.0;
  double low = 0.0, high = 0.0;
  // Multiplies cos and sin, so q.k by its square (YaRN's attention temperature).
  double attention_factor = 1.0;
};

// YaRN over `dim` rotated channels (head_dim) as transformers' _compute_yarn_parameters derives
// it: low and high are the channel dims where a frequency turns beta_fast and beta_slow times
// over original_max_positions, floored and ceiled when `truncate`, clamped to [0, dim - 1].
// attention_factor is taken as given (the config's, or yarn_attention_factor's).
RopeParams yarn_rope(double theta, int64_t dim, double factor, int64_t original_max_positions,
                     double beta_fast, double beta_slow, double attention_factor, bool truncate);

// YaRN's default attention factor: 0.1 ln(factor) + 1 (1 for factor <= 1), or with both mscale
// and mscale_all_dim non-zero (DeepSeek's form) the ratio of that with each as ln's coefficient.
double yarn_attention_factor(double factor, double mscale, double mscale_all_dim);

}  // namespace kuiper::op
