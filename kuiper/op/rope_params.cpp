#include "kuiper/op/rope_params.h"

#include <algorithm>
#include <cmath>

namespace kuiper::op {

namespace {

constexpr double kPi = 3.14159265358979323846;

// The channel dim whose frequency turns `rotations` times over `positions` positions.
double correction_dim(double rotations, int64_t dim, double theta, int64_t positions) {
  return static_cast<double>(dim) *
         std::log(static_cast<double>(positions) / (rotations * 2 * kPi)) / (2 * std::log(theta));
}

double mscale_of(double factor, double mscale) {
  return factor <= 1 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

}  // namespace

RopeParams yarn_rope(double theta, int64_t dim, double factor, int64_t original_max_positions,
                     double beta_fast, double beta_slow, double attention_factor, bool truncate) {
  RopeParams p(theta);
  p.scaling = RopeScaling::kYarn;
  p.factor = factor;
  p.attention_factor = attention_factor;
  double low = correction_dim(beta_fast, dim, theta, original_max_positions);
  double high = correction_dim(beta_slow, dim, theta, original_max_positions);
  if (truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  p.low = std::max(low, 0.0);
  p.high = std::min(high, static_cast<double>(dim - 1));
  if (p.low == p.high) p.high += 0.001;  // transformers' guard against a zero-width ramp
  return p;
}

double yarn_attention_factor(double factor, double mscale, double mscale_all_dim) {
  if (mscale != 0 && mscale_all_dim != 0) {
    return mscale_of(factor, mscale) / mscale_of(factor, mscale_all_dim);
  }
  return mscale_of(factor, 1.0);
}

}  // namespace kuiper::op
