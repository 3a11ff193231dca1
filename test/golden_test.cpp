// The CPU backend against Hugging Face transformers (fp32): last-position logits, top-8 ids and
// log-sum-exp at every position, and the greedy continuation through the decode path. On the
// shared tiny fixtures, on qwen2-overflow-tiny (planted weights drive <|im_start|>'s residual to
// about 8e4, beyond fp16's range), and on five more configurations in test/data/configs (one kv
// head with head dim 128, no GQA, tied and untied, other rope theta and norm eps, YaRN rope
// scaling) whose references scripts/hf_golden.py computed with transformers 5.17.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>

#include "kuiper/model/hf_checkpoint.h"
#include "kuiper/model/model.h"
#include "support/assertions.h"
#include "support/fixture_checkpoint.h"
#include "support/golden.h"
#include "support/paths.h"
#include "support/tensors.h"

namespace kuiper::test {
namespace {

std::unique_ptr<Model> load_cpu(const std::string& path, int64_t max_context) {
  ModelOptions options;
  options.max_context = max_context;
  Result<std::unique_ptr<Model>> model = Model::load(path, options);
  EXPECT_OK(model);
  return model.ok() ? std::move(model).value() : nullptr;
}

// Where a model under test and its golden come from.
enum class Origin {
  kSharedFixture,  // test/data/fixtures, goldens of the team fixtures (chat.greedy recorded apart)
  kFixture,        // test/data/fixtures, goldens from scripts/hf_golden.py
  kConfig,         // a folder of test/data/configs
};

struct Case {
  std::string model;
  std::string prompt;
  Origin origin = Origin::kSharedFixture;
};

Golden load_golden(const Case& c) {
  return c.origin != Origin::kConfig
             ? Golden::load(c.model)
             : Golden::load_file(test_data_dir() + "/configs/" + c.model + "/golden.safetensors");
}

// test/data/configs/<name>/config.json with the fixture weight recipe, converted once per process.
std::string converted_config(const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, std::string> done;
  static TempDir dir;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = done.find(name);
  if (it != done.end()) return it->second;
  std::ifstream in(test_data_dir() + "/configs/" + name + "/config.json");
  nlohmann::json hf = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  const std::string hf_dir = dir.file(name), out = dir.file(name + ".bin");
  Status s = write_checkpoint(hf, hf_dir);
  if (s.ok()) s = convert_checkpoint(hf_dir, out, DataType::kFp32);
  EXPECT_TRUE(s.ok()) << name << ": " << s.message();
  return done[name] = s.ok() ? out : std::string();
}

std::string model_path(const Case& c) {
  return c.origin != Origin::kConfig ? converted_fixture(c.model, DataType::kFp32)
                                     : converted_config(c.model);
}

class GoldenTest : public ::testing::TestWithParam<Case> {};

TEST_P(GoldenTest, PrefillMatchesHuggingFaceAtEveryPosition) {
  const Case& c = GetParam();
  Golden golden = load_golden(c);
  const std::vector<int32_t>& ids = golden.at(c.prompt + ".ids").i32;
  auto model = load_cpu(model_path(c), static_cast<int64_t>(ids.size()));
  ASSERT_NE(model, nullptr);
  Result<Tensor> logits = model->forward(ids, 0, /*all_logits=*/true);
  ASSERT_OK(logits);
  const std::vector<float> all = host_floats(*logits);
  const size_t V = static_cast<size_t>(model->config().vocab_size), T = ids.size();

  const std::vector<float>& last = golden.at(c.prompt + ".logits_last").f32;
  ASSERT_EQ(last.size(), V);
  EXPECT_LE(relative_max_error(all.data() + (T - 1) * V, last.data(), V), 1e-4);

  const GoldenTensor& top_ids = golden.at(c.prompt + ".top_ids");
  const GoldenTensor& top_vals = golden.at(c.prompt + ".top_vals");
  const std::vector<float>& lse = golden.at(c.prompt + ".lse").f32;
  int compared = 0;
  for (size_t t = 0; t < T; ++t) {
    const float* row = all.data() + t * V;
    const std::vector<int32_t> ours = top_k(row, V, 8);
    const int32_t* gid = top_ids.i32.data() + t * 8;
    const float* gval = top_vals.f32.data() + t * 8;
    for (int r = 0; r < 8; ++r) {
      // Our logit for the golden id matches whatever its rank.
      EXPECT_NEAR(row[gid[r]], gval[r], 1e-4 * std::max(1.0f, std::fabs(gval[0])))
          << "position " << t << " rank " << r;
      // Ids agree wherever the golden ranking is unambiguous (neighbours more than 1e-4 apart;
      // the 8th has an unknown right neighbour, so its value check above stands for it).
      const bool clear_left = r == 0 || gval[r - 1] - gval[r] > 1e-4f;
      const bool clear_right = r < 7 && gval[r] - gval[r + 1] > 1e-4f;
      if (clear_left && clear_right) {
        EXPECT_EQ(ours[r], gid[r]) << "position " << t << " rank " << r;
        ++compared;
      }
    }
    EXPECT_NEAR(log_sum_exp(row, V), lse[t], 1e-4 * std::max(1.0f, std::fabs(lse[t])))
        << "position " << t;
  }
  EXPECT_GT(compared, static_cast<int>(T));  // the check above must not be vacuous
}

TEST_P(GoldenTest, GreedyDecodeFollowsHuggingFace) {
  const Case& c = GetParam();
  Golden golden = load_golden(c);
  if (!golden.has(c.prompt + ".greedy")) GTEST_SKIP() << "no greedy golden for " << c.prompt;
  const std::vector<int32_t>& ids = golden.at(c.prompt + ".ids").i32;
  std::vector<int32_t> greedy = golden.at(c.prompt + ".greedy").i32;
  std::vector<float> margin = golden.at(c.prompt + ".greedy_margin").f32;
  if (c.origin == Origin::kSharedFixture && c.prompt == "chat") {
    greedy = recorded_chat_greedy(c.model);
    margin.assign(greedy.size(), 1.0f);  // no margins recorded: every step is compared
  }
  auto model = load_cpu(model_path(c), static_cast<int64_t>(ids.size() + greedy.size()));
  ASSERT_NE(model, nullptr);
  Result<Tensor> logits = model->forward(ids, 0, false);
  ASSERT_OK(logits);
  const size_t V = static_cast<size_t>(model->config().vocab_size);
  // Teacher-forced: each step is fed the golden token, so one near-tie cannot derail the rest.
  int checked = 0;
  for (size_t step = 0; step < greedy.size(); ++step) {
    const std::vector<float> row = host_floats(*logits);
    if (margin[step] > 1e-3f) {
      EXPECT_EQ(top_k(row.data(), V, 1)[0], greedy[step]) << "step " << step;
      ++checked;
    }
    logits = model->forward({greedy[step]}, static_cast<int64_t>(ids.size() + step), false);
    ASSERT_OK(logits);
  }
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, GoldenTest,
    ::testing::Values(Case{"qwen3-tiny", "chat"}, Case{"qwen3-tiny", "long"},
                      Case{"qwen3-tiny", "one"}, Case{"qwen2-tiny", "chat"},
                      Case{"qwen2-tiny", "long"}, Case{"qwen2-tiny", "one"},
                      Case{"qwen2-overflow-tiny", "chat", Origin::kFixture},
                      Case{"qwen2-overflow-tiny", "long", Origin::kFixture},
                      Case{"qwen2-overflow-tiny", "one", Origin::kFixture},
                      Case{"qwen3-mqa-hd128", "short", Origin::kConfig},
                      Case{"qwen3-mqa-hd128", "long", Origin::kConfig},
                      Case{"qwen3-mha-tied", "short", Origin::kConfig},
                      Case{"qwen3-mha-tied", "long", Origin::kConfig},
                      Case{"qwen2-gqa4-tied", "short", Origin::kConfig},
                      Case{"qwen2-gqa4-tied", "long", Origin::kConfig},
                      Case{"qwen2-mha-hd128", "short", Origin::kConfig},
                      Case{"qwen2-mha-hd128", "long", Origin::kConfig},
                      Case{"qwen3-yarn", "short", Origin::kConfig},
                      Case{"qwen3-yarn", "long", Origin::kConfig}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string name = info.param.model + "_" + info.param.prompt;
      for (char& ch : name) {
        if (ch == '-') ch = '_';
      }
      return name;
    });

class FixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureTest, PrefillAndTokenByTokenDecodeAgree) {
  Golden golden = Golden::load(GetParam());
  const std::vector<int32_t>& ids = golden.at("chat.ids").i32;
  const std::string path = converted_fixture(GetParam(), DataType::kFp32);
  auto prefill = load_cpu(path, static_cast<int64_t>(ids.size()));
  auto decode = load_cpu(path, static_cast<int64_t>(ids.size()));
  ASSERT_TRUE(prefill && decode);
  Result<Tensor> all_at_once = prefill->forward(ids, 0, false);
  ASSERT_OK(all_at_once);
  Result<Tensor> step = Status::Error("not run");
  for (size_t i = 0; i < ids.size(); ++i) {
    step = decode->forward({ids[i]}, static_cast<int64_t>(i), false);
    ASSERT_OK(step);
  }
  const std::vector<float> a = host_floats(*all_at_once), b = host_floats(*step);
  EXPECT_LE(relative_max_error(b.data(), a.data(), a.size()), 1e-5);
}

TEST_P(FixtureTest, HalfPrecisionWeightsAgreeOnTopToken) {
  Golden golden = Golden::load(GetParam());
  const std::vector<int32_t>& ids = golden.at("chat.ids").i32;
  const int64_t T = static_cast<int64_t>(ids.size());
  auto reference = load_cpu(converted_fixture(GetParam(), DataType::kFp32), T);
  ASSERT_NE(reference, nullptr);
  const std::vector<float> ref = host_floats(reference->forward(ids, 0, true).value());
  const size_t V = static_cast<size_t>(reference->config().vocab_size);
  for (DataType dtype : {DataType::kFp16, DataType::kBf16}) {
    auto model = load_cpu(converted_fixture(GetParam(), dtype), T);
    ASSERT_NE(model, nullptr);
    const std::vector<float> got = host_floats(model->forward(ids, 0, true).value());
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(top_k(got.data() + t * V, V, 1)[0], top_k(ref.data() + t * V, V, 1)[0])
          << dtype_name(dtype) << " position " << t;
    }
  }
}

TEST_P(FixtureTest, PromptBeyondTheContextIsAnError) {
  auto model = load_cpu(converted_fixture(GetParam(), DataType::kFp32), 4);
  ASSERT_NE(model, nullptr);
  Result<Tensor> logits = model->forward({1, 2, 3, 4, 5}, 0, false);
  ASSERT_FALSE(logits.ok());
  EXPECT_NE(logits.status().message().find("exceed the context of 4"), std::string::npos)
      << logits.status().message();
  Result<Tensor> bad_id = model->forward({static_cast<int32_t>(model->config().vocab_size)}, 0,
                                         false);
  ASSERT_FALSE(bad_id.ok());
  EXPECT_NE(bad_id.status().message().find("outside the vocabulary"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureTest, ::testing::Values("qwen3-tiny", "qwen2-tiny"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "qwen3-tiny" ? "qwen3_tiny" : "qwen2_tiny";
                         });

// The planted fixture is the same model in Python and C++: the size and FNV-1a 64 of the
// model.safetensors that detweights.py writes for it.
TEST(OverflowFixture, IsBitIdenticalToDetweights) {
  TempDir dir;
  ASSERT_OK(write_fixture_checkpoint(fixtures_dir() + "/qwen2-overflow-tiny", dir.path()));
  std::ifstream in(dir.file("model.safetensors"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes.size(), 78550112u);
  EXPECT_EQ(fnv1a64(bytes), 0xf4fd396263e0c01cull);
}

// A plant outside its tensor, or malformed, is an error naming the tensor, not a write out of
// bounds.
TEST(OverflowFixture, SetsThatDoNotFitAreErrors) {
  TempDir dir;
  auto write_with = [&](const nlohmann::json& set) {
    const std::string src = dir.file("src");
    std::filesystem::create_directories(src);
    std::ifstream config(fixtures_dir() + "/qwen2-tiny/config.json");
    std::ofstream(src + "/config.json") << config.rdbuf();
    const nlohmann::json tensors = {
        {{"name", "model.norm.weight"}, {"shape", {128}}, {"set", {set}}}};
    std::ofstream(src + "/tensors.json") << tensors.dump();
    return write_fixture_checkpoint(src, dir.file("out"));
  };
  EXPECT_OK(write_with({{"at", {{0, 128}}}, {"value", 2.0}}));
  for (const nlohmann::json& bad :
       {nlohmann::json{{"at", {{0, 129}}}, {"value", 2.0}},
        nlohmann::json{{"at", {{3, 3}}}, {"value", 2.0}},
        nlohmann::json{{"at", {{0, 1}, {0, 1}}}, {"value", 2.0}},
        nlohmann::json{{"at", {{0, 1}}}}}) {
    const Status s = write_with(bad);
    ASSERT_FALSE(s.ok()) << bad.dump();
    EXPECT_NE(s.message().find("model.norm.weight"), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace kuiper::test
