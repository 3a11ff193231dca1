#include "support/golden.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>

#include <nlohmann/json.hpp>

#include "kuiper/model/safetensors.h"
#include "support/assertions.h"
#include "support/paths.h"

namespace kuiper::test {

Golden Golden::load(const std::string& fixture) {
  return load_file(fixtures_dir() + "/" + fixture + "/golden.safetensors");
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

}  // namespace kuiper::test
