#include "support/golden.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>

#include <nlohmann/json.hpp>

#include "kuiper/model/safetensors.h"
#include "support/assertions.h"
#include "support/paths.h"

namespace kuiper::test {

Golden Golden::load(const std::string& fixture, const std::string& file) {
  return load_file(fixtures_dir() + "/" + fixture + "/" + file);
}

Golden Golden::load_file(const std::string& path) {
  Golden g;
  Result<SafetensorsFile> file = SafetensorsFile::open(path);
  EXPECT_OK(file);
  if (!file.ok()) return g;
  for (const SafetensorsTensor& t : file->tensors()) {
    GoldenTensor& out = g.tensors_[t.name];
    out.shape = t.shape;
    const size_t n = t.nbytes / dtype_size(t.dtype);
    if (t.dtype == DataType::kInt32) {
      out.i32.resize(n);
      std::memcpy(out.i32.data(), t.data, t.nbytes);
    } else {
      out.f32.resize(n);
      EXPECT_OK(convert_elements(t.data, t.dtype, out.f32.data(), DataType::kFp32, n));
    }
  }
  return g;
}

const GoldenTensor& Golden::at(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    ADD_FAILURE() << "golden tensor " << name << " missing";
    static const GoldenTensor empty;
    return empty;
  }
  return it->second;
}

std::vector<int32_t> recorded_chat_greedy(const std::string& fixture) {
  std::ifstream in(test_data_dir() + "/fixture_chat_greedy.json");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  const bool found = j.is_object() && j.contains(fixture) && j[fixture].is_array();
  EXPECT_TRUE(found) << "fixture_chat_greedy.json has no " << fixture;
  return found ? j[fixture].get<std::vector<int32_t>>() : std::vector<int32_t>();
}

double relative_max_error(const float* a, const float* b, size_t n) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    err = std::max(err, std::fabs(double(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return err / std::max(scale, 1e-30);
}

double max_abs_error(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double err = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::fabs(double(a[i]) - b[i]));
  }
  return err;
}

double log_sum_exp(const float* x, size_t n) {
  double mx = *std::max_element(x, x + n), sum = 0;
  for (size_t i = 0; i < n; ++i) sum += std::exp(double(x[i]) - mx);
  return mx + std::log(sum);
}

std::vector<int32_t> top_k(const float* x, size_t n, int k) {
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

namespace {

size_t non_finite(const float* x, size_t n) {
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += std::isfinite(x[i]) ? 0 : 1;
  return bad;
}

// The scale errors are measured against: the largest |logit| of p's last golden row.
double logit_scale(const Golden& golden, const std::string& p) {
  double scale = 1e-30;
  for (float v : golden.at(p + ".logits_last").f32) scale = std::max(scale, std::fabs(double(v)));
  return scale;
}

}  // namespace

int expect_prompt_rows_match(const std::vector<float>& rows, const Golden& golden,
                             const std::string& p, double tol, const std::string& what) {
  const std::vector<float>& last = golden.at(p + ".logits_last").f32;
  const GoldenTensor& top_ids = golden.at(p + ".top_ids");
  const GoldenTensor& top_vals = golden.at(p + ".top_vals");
  const size_t V = last.size(), T = golden.at(p + ".ids").i32.size();
  if (V == 0 || rows.size() != T * V) {
    ADD_FAILURE() << what << " " << p << ": " << rows.size() << " logits, want " << T << " x " << V;
    return 0;
  }
  EXPECT_EQ(non_finite(rows.data(), rows.size()), 0u) << what << " " << p << ": non-finite logits";
  const double err = relative_max_error(rows.data() + (T - 1) * V, last.data(), V);
  std::printf("[ measured ] %s %s: last-position logits max rel error %.3g\n", what.c_str(),
              p.c_str(), err);
  EXPECT_LE(err, tol) << what << " " << p;
  const double clear = 2 * tol * logit_scale(golden, p);
  int compared = 0;
  for (size_t t = 0; t < T; ++t) {
    if (top_vals.f32[t * 8] - top_vals.f32[t * 8 + 1] <= clear) continue;
    EXPECT_EQ(top_k(rows.data() + t * V, V, 1)[0], top_ids.i32[t * 8])
        << what << " " << p << " position " << t;
    ++compared;
  }
  return compared;
}

bool expect_greedy_step(const std::vector<float>& row, const Golden& golden, const std::string& p,
                        size_t step, double tol, const std::string& what) {
  const std::vector<int32_t>& greedy = golden.at(p + ".greedy").i32;
  const std::vector<float>& margin = golden.at(p + ".greedy_margin").f32;
  if (step >= greedy.size() || step >= margin.size() || row.empty()) {
    ADD_FAILURE() << what << " " << p << ": no greedy step " << step;
    return false;
  }
  EXPECT_EQ(non_finite(row.data(), row.size()), 0u) << what << " " << p << " step " << step;
  if (margin[step] <= 2 * tol * logit_scale(golden, p)) return false;
  EXPECT_EQ(top_k(row.data(), row.size(), 1)[0], greedy[step]) << what << " " << p << " step " << step;
  return true;
}

}  // namespace kuiper::test
