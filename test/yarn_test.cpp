// YaRN rope scaling against Hugging Face transformers: the per-frequency inverse frequencies and
// the attention factor a config gives, its config forms and refusals, the model file keeping the
// scaling, and a YaRN model's logits at rotary positions before and beyond its original 32768
// (test/data/configs/qwen3-yarn: the short prompt at positions N + t, N = 1000, 32760, 40000 and
// 120000, from scripts/hf_golden.py) on the CPU and, for every attention kind, on the GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kuiper/model/hf_checkpoint.h"
#include "kuiper/model/model.h"
#include "kuiper/op/kernels/rope_math.h"
#include "support/assertions.h"
#include "support/fixture_checkpoint.h"
#include "support/golden.h"
#include "support/paths.h"
#include "support/tensors.h"

namespace kuiper::test {
namespace {

using nlohmann::json;

// A Qwen3 config.json of head_dim d around the rope fields `rope`.
json hf_config(int64_t d, const json& rope) {
  json j = {{"architectures", {"Qwen3ForCausalLM"}},
            {"vocab_size", 1200},
            {"hidden_size", 4 * d},
            {"intermediate_size", 64},
            {"num_hidden_layers", 1},
            {"num_attention_heads", 4},
            {"head_dim", d}};
  j.update(rope);
  return j;
}

struct Reference {
  const char* rope;  // config.json's rope fields
  int64_t head_dim;
  double attention_factor;
  std::vector<float> inv_freq;
};

// transformers 5.17's ROPE_INIT_FUNCTIONS["yarn"] for these configs, printed by
// scripts/yarn_reference.py: Qwen3's documented setting in the older rope_scaling style, every
// optional key in the newer rope_parameters style (beta_fast / beta_slow, DeepSeek's mscale pair,
// no truncation), and a given attention factor.
const Reference kReferences[] = {
    {R"({"max_position_embeddings": 131072, "rope_theta": 1000000.0, "rope_scaling":
         {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}})",
     128, 1.138629436111989,
     {1, 0.805842221, 0.649381638, 0.523299158, 0.421696514, 0.339820832, 0.273841977,
      0.220673397, 0.177827939, 0.143301263, 0.115478203, 0.0930572003, 0.0749894157,
      0.0604296438, 0.0486967526, 0.0392418988, 0.0316227786, 0.0254829675, 0.0205352511,
      0.0165481716, 0.0133352149, 0.0107460786, 0.00865964312, 0.00697830599, 0.00537532149,
      0.0041317381, 0.00316842273, 0.00242342241, 0.00184827659, 0.00140511245, 0.00106436096,
      0.000802959781, 0.000602941145, 0.000450323569, 0.000334240554, 0.000246258394,
      0.000179841154, 0.00012993149, 9.26230132e-05, 6.4903943e-05, 4.44569851e-05,
      3.58253164e-05, 2.88695483e-05, 2.32643015e-05, 1.87473561e-05, 1.51074091e-05,
      1.21741887e-05, 9.81047469e-06, 7.90569356e-06, 6.37074163e-06, 5.13381246e-06,
      4.13704265e-06, 3.33380353e-06, 2.68651957e-06, 2.16491094e-06, 1.74457659e-06,
      1.40585337e-06, 1.13289593e-06, 9.1293532e-07, 7.35681795e-07, 5.92843435e-07,
      4.7773824e-07, 3.84981632e-07, 3.10234441e-07}},
    {R"({"max_position_embeddings": 163840, "rope_parameters": {"rope_type": "yarn",
         "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 16.0, "beta_slow": 2.0,
         "mscale": 0.707, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
         "truncate": false}})",
     64, 0.9210423553163399,
     {1, 0.749894202, 0.562341332, 0.421696514, 0.316227764, 0.237137362, 0.177827939,
      0.133352146, 0.100000001, 0.0749894157, 0.0562341288, 0.0421696492, 0.0316227786,
      0.0233312435, 0.0150961196, 0.00952086132, 0.00579010462, 0.00332995923, 0.00173821871,
      0.000734386675, 0.000123952457, 5.92843462e-05, 4.44569851e-05, 3.3338034e-05,
      2.49999994e-05, 1.87473543e-05, 1.40585325e-05, 1.05424124e-05, 7.90569447e-06,
      5.92843435e-06, 4.44569832e-06, 3.33380353e-06}},
    {R"({"max_position_embeddings": 65536, "rope_parameters": {"rope_type": "yarn",
         "rope_theta": 1000000.0, "factor": 2.0, "attention_factor": 0.8,
         "original_max_position_embeddings": 32768}})",
     64, 0.8,
     {1, 0.649381638, 0.421696514, 0.273841977, 0.177827939, 0.115478203, 0.0749894157,
      0.0486967526, 0.0316227786, 0.0205352511, 0.0133352149, 0.00865964312, 0.00531100109,
      0.00324599235, 0.00197614473, 0.00119772064, 0.000722222263, 0.000432921108,
      0.000257703417, 0.000152134424, 8.89139701e-05, 5.77390965e-05, 3.74947122e-05,
      2.43483773e-05, 1.58113871e-05, 1.02676249e-05, 6.66760707e-06, 4.32982188e-06,
      2.81170674e-06, 1.82587064e-06, 1.18568687e-06, 7.69963265e-07}},
};

TEST(Yarn, FrequenciesAndAttentionFactorMatchTransformers) {
  for (const Reference& ref : kReferences) {
    SCOPED_TRACE(ref.rope);
    Result<ModelConfig> c = ModelConfig::from_hf(hf_config(ref.head_dim, json::parse(ref.rope)));
    ASSERT_OK(c);
    const op::RopeParams rope = c->rope();
    ASSERT_EQ(rope.scaling, op::RopeScaling::kYarn);
    EXPECT_NEAR(rope.attention_factor, ref.attention_factor, 1e-12);
    const int64_t half = ref.head_dim / 2;
    ASSERT_EQ(static_cast<int64_t>(ref.inv_freq.size()), half);
    std::vector<float> ours(static_cast<size_t>(half));
    rope_inv_freqs(rope, ref.head_dim, half, ours.data());
    for (int64_t i = 0; i < half; ++i) {
      // fp32 as transformers rounds it; a host pow may differ from torch's in the last bit.
      EXPECT_NEAR(ours[i], ref.inv_freq[i], 2.5e-7 * ref.inv_freq[i]) << "frequency " << i;
    }
  }
}

Status from_hf_status(const json& rope, int64_t d = 64) {
  return ModelConfig::from_hf(hf_config(d, rope)).status();
}

TEST(Yarn, DefaultsFollowTransformers) {
  // No original_max_position_embeddings: max_position_embeddings; no attention_factor:
  // 0.1 ln(factor) + 1; beta_fast / beta_slow 0 mean their defaults, 32 and 1.
  Result<ModelConfig> c = ModelConfig::from_hf(hf_config(
      64, {{"max_position_embeddings", 4096},
           {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 8.0}, {"beta_fast", 0}}}}));
  ASSERT_OK(c);
  ASSERT_TRUE(c->yarn.has_value());
  EXPECT_EQ(c->yarn->original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c->yarn->attention_factor, 0.1 * std::log(8.0) + 1);
  EXPECT_EQ(c->yarn->beta_fast, 32.0);
  EXPECT_EQ(c->yarn->beta_slow, 1.0);
  EXPECT_TRUE(c->yarn->truncate);
  // No factor: max_position_embeddings / original; a top-level original (Phi3's place) wins.
  c = ModelConfig::from_hf(hf_config(
      64, {{"max_position_embeddings", 131072},
           {"original_max_position_embeddings", 16384},
           {"rope_parameters", {{"rope_type", "yarn"}, {"rope_theta", 1e6},
                                {"original_max_position_embeddings", 32768}}}}));
  ASSERT_OK(c);
  EXPECT_EQ(c->yarn->original_max_position_embeddings, 16384);
  EXPECT_EQ(c->yarn->factor, 8.0);
  EXPECT_EQ(c->rope_theta, 1e6);
  // Qwen3's published max_position_embeddings beside its documented YaRN setting: the context
  // reaches factor x original.
  c = ModelConfig::from_hf(hf_config(
      64, {{"max_position_embeddings", 40960},
           {"rope_scaling",
            {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}}}}));
  ASSERT_OK(c);
  EXPECT_EQ(c->context_limit(), 131072);
  // Unscaled: no YaRN, the plain rotation.
  c = ModelConfig::from_hf(hf_config(64, {{"rope_scaling", {{"rope_type", "default"}}}}));
  ASSERT_OK(c);
  EXPECT_FALSE(c->yarn.has_value());
  EXPECT_EQ(c->rope().scaling, op::RopeScaling::kNone);
  EXPECT_EQ(c->context_limit(), c->max_position_embeddings);
}

TEST(Yarn, OtherScalingTypesAndBadValuesAreRefused) {
  for (const char* type : {"linear", "dynamic", "llama3", "longrope"}) {
    for (const char* key : {"rope_type", "type"}) {
      const Status s = from_hf_status({{"rope_scaling", {{key, type}, {"factor", 2.0}}}});
      ASSERT_FALSE(s.ok()) << type;
      EXPECT_NE(s.message().find(std::string("rope scaling type '") + type + "' is not supported"),
                std::string::npos)
          << s.message();
    }
  }
  const std::pair<json, std::string> bad[] = {
      {{{"rope_type", "yarn"}, {"factor", 0.5}}, "factor must be a number >= 1"},
      {{{"rope_type", "yarn"}, {"factor", 4.0}, {"beta_fast", 1.0}, {"beta_slow", 2.0}},
       "beta_fast > beta_slow"},
      {{{"rope_type", "yarn"}, {"factor", 4.0}, {"attention_factor", -1.0}},
       "attention_factor must be positive"},
      {{{"rope_type", "yarn"}, {"factor", "4"}}, "factor: expected a number"},
      {{{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 0}},
       "original_max_position_embeddings"},
  };
  for (const auto& [scaling, message] : bad) {
    const Status s = from_hf_status({{"rope_scaling", scaling}});
    ASSERT_FALSE(s.ok()) << scaling.dump();
    EXPECT_NE(s.message().find(message), std::string::npos) << s.message();
  }
  // Qwen3-VL's multimodal rotary embedding takes no scaling.
  std::ifstream in(fixtures_dir() + "/qwen3-vl-tiny/config.json");
  json vl = json::parse(in);
  vl["text_config"]["rope_scaling"]["rope_type"] = "yarn";
  vl["text_config"]["rope_scaling"]["factor"] = 4.0;
  const Status s = ModelConfig::from_hf(vl).status();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("yarn rope scaling: not supported with M-RoPE"), std::string::npos)
      << s.message();
}

// test/data/configs/qwen3-yarn converted (fp32) once per process.
std::string yarn_model_file() {
  static TempDir dir;
  static const std::string path = [] {
    std::ifstream in(test_data_dir() + "/configs/qwen3-yarn/config.json");
    const json hf = json::parse(in);
    Status s = write_checkpoint(hf, dir.file("hf"));
    if (s.ok()) s = convert_checkpoint(dir.file("hf"), dir.file("yarn.bin"), DataType::kFp32);
    EXPECT_OK(s);
    return s.ok() ? dir.file("yarn.bin") : std::string();
  }();
  return path;
}

TEST(Yarn, TheModelFileKeepsTheScaling) {
  std::ifstream in(test_data_dir() + "/configs/qwen3-yarn/config.json");
  Result<ModelConfig> hf = ModelConfig::from_hf(json::parse(in));
  ASSERT_OK(hf);
  ASSERT_FALSE(yarn_model_file().empty());
  ModelOptions options;
  options.max_context = 32;
  Result<std::unique_ptr<Model>> model = Model::load(yarn_model_file(), options);
  ASSERT_OK(model);
  const ModelConfig& c = (*model)->config();
  ASSERT_TRUE(c.yarn.has_value());
  EXPECT_EQ(c.yarn->factor, 4.0);
  EXPECT_EQ(c.yarn->original_max_position_embeddings, 32768);
  const op::RopeParams a = c.rope(), b = hf->rope();
  EXPECT_EQ(a.low, b.low);
  EXPECT_EQ(a.high, b.high);
  EXPECT_EQ(a.attention_factor, b.attention_factor);
  // A stored scaling of another kind is refused.
  json j = c.to_json();
  j["rope_scaling"]["rope_type"] = "linear";
  const Status s = ModelConfig::from_json(j).status();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rope_type 'linear' is not supported"), std::string::npos)
      << s.message();
}

const int64_t kShifts[] = {1000, 32760, 40000, 120000};

// The logits of ids[begin, end) run as one span at cache rows [begin, end) rotated `shift`
// further along: every row's, or the last one's.
Result<std::vector<float>> shifted_logits(Model& model, const std::vector<int32_t>& ids,
                                          size_t begin, size_t end, int64_t shift, bool all) {
  const std::vector<int32_t> blocks = model.first_blocks(static_cast<int64_t>(end));
  SequenceInput s;
  s.tokens = Span<const int32_t>(ids.data() + begin, end - begin);
  s.start = static_cast<int64_t>(begin);
  s.blocks = blocks;
  s.rope_offset = shift;
  s.logits = all ? LogitRows::kAll : LogitRows::kLast;
  KUIPER_ASSIGN_OR_RETURN(Tensor logits, model.forward(Span<const SequenceInput>(&s, 1)));
  return host_floats(logits);
}

// The prompt's last logits with all but its last token prefilled, then the last one decoded.
Result<std::vector<float>> decoded_last(Model& model, const std::vector<int32_t>& ids,
                                        int64_t shift) {
  KUIPER_RETURN_IF_ERROR(shifted_logits(model, ids, 0, ids.size() - 1, shift, false).status());
  return shifted_logits(model, ids, ids.size() - 1, ids.size(), shift, false);
}

// max |a - b| / max(1, max |b|): the error measure of the GPU golden tests.
double scaled_error(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 1.0;
  for (float v : b) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  return max_abs_error(a, b) / scale;
}

TEST(Yarn, ShiftedPromptsMatchTransformers) {
  const Golden golden = Golden::load_file(test_data_dir() + "/configs/qwen3-yarn/golden.safetensors");
  ASSERT_FALSE(yarn_model_file().empty());
  ModelOptions options;
  options.max_context = 32;
  Result<std::unique_ptr<Model>> loaded = Model::load(yarn_model_file(), options);
  ASSERT_OK(loaded);
  Model& model = **loaded;
  const size_t V = static_cast<size_t>(model.config().vocab_size);
  for (int64_t shift : kShifts) {
    SCOPED_TRACE("positions " + std::to_string(shift) + " + t");
    const std::string p = "shifted" + std::to_string(shift);
    const std::vector<int32_t>& ids = golden.at(p + ".ids").i32;
    const size_t T = ids.size();
    Result<std::vector<float>> all = shifted_logits(model, ids, 0, T, shift, true);
    ASSERT_OK(all);
    ASSERT_EQ(all->size(), T * V);
    const std::vector<float>& last = golden.at(p + ".logits_last").f32;
    EXPECT_LE(relative_max_error(all->data() + (T - 1) * V, last.data(), V), 1e-4);
    const GoldenTensor& top_vals = golden.at(p + ".top_vals");
    const GoldenTensor& top_ids = golden.at(p + ".top_ids");
    const std::vector<float>& lse = golden.at(p + ".lse").f32;
    for (size_t t = 0; t < T; ++t) {
      const float* row = all->data() + t * V;
      for (int r = 0; r < 8; ++r) {
        const float want = top_vals.f32[t * 8 + r];
        EXPECT_NEAR(row[top_ids.i32[t * 8 + r]], want, 1e-4 * std::max(1.0f, std::fabs(want)))
            << "position " << t << " rank " << r;
      }
      EXPECT_NEAR(log_sum_exp(row, V), lse[t], 1e-4 * std::max(1.0f, std::fabs(lse[t])))
          << "position " << t;
    }
    // The decode path rotates the same way.
    Result<std::vector<float>> decoded = decoded_last(model, ids, shift);
    ASSERT_OK(decoded);
    EXPECT_LE(relative_max_error(decoded->data(), last.data(), V), 1e-4);
  }
}

TEST(CudaYarn, ShiftedPromptsMatchTransformersForEveryAttentionKind) {
  SKIP_WITHOUT_CUDA();
  const Golden golden = Golden::load_file(test_data_dir() + "/configs/qwen3-yarn/golden.safetensors");
  ASSERT_FALSE(yarn_model_file().empty());
  for (AttentionKind kind : {AttentionKind::kMha, AttentionKind::kFlash1, AttentionKind::kFlash2}) {
    for (DataType act : {DataType::kFp32, DataType::kFp16}) {
      for (bool graph : {false, true}) {
        SCOPED_TRACE(std::string(attention_name(kind)) + " " + dtype_name(act) +
                     (graph ? " graph" : ""));
        ModelOptions o;
        o.device = DeviceType::kCuda;
        o.attention = kind;
        o.activation = act;
        o.cuda_graph = graph;
        o.max_context = 32;
        Result<std::unique_ptr<Model>> model = Model::load(yarn_model_file(), o);
        ASSERT_OK(model);
        for (int64_t shift : kShifts) {
          const std::string p = "shifted" + std::to_string(shift);
          Result<std::vector<float>> got = decoded_last(**model, golden.at(p + ".ids").i32, shift);
          ASSERT_OK(got);
          EXPECT_LE(scaled_error(*got, golden.at(p + ".logits_last").f32),
                    act == DataType::kFp32 ? 1e-4 : 2e-2)
              << "positions " << shift << " + t";
        }
      }
    }
  }
}

}  // namespace
}  // namespace kuiper::test
