// --dtype auto|bf16|fp16|fp32: the parsing every program shares, the checkpoint's stored dtype
// auto follows, and the rule itself, on both devices (a pure function: the CUDA side is checked
// here without a GPU).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "kuiper/model/activation_dtype.h"
#include "kuiper/model/model.h"
#include "kuiper/model/model_file.h"
#include "support/assertions.h"
#include "support/fixture_checkpoint.h"
#include "support/tiny_config.h"

namespace kuiper {
namespace {

constexpr DataType kFloatTypes[] = {DataType::kBf16, DataType::kFp16, DataType::kFp32};

std::string error_of(const Result<std::optional<DataType>>& r) {
  return r.ok() ? "<no error>" : r.status().message();
}

TEST(ActivationDtype, ParsesAutoAndTheThreeFloatTypes) {
  for (DeviceType device : {DeviceType::kCpu, DeviceType::kCuda}) {
    Result<std::optional<DataType>> automatic = parse_activation_dtype("auto", device);
    ASSERT_OK(automatic);
    EXPECT_FALSE(automatic->has_value());
  }
  for (DataType t : kFloatTypes) {
    Result<std::optional<DataType>> r = parse_activation_dtype(dtype_name(t), DeviceType::kCuda);
    ASSERT_OK(r);
    EXPECT_EQ(r->value(), t);
  }
  Result<std::optional<DataType>> fp32 = parse_activation_dtype("fp32", DeviceType::kCpu);
  ASSERT_OK(fp32);
  EXPECT_EQ(fp32->value(), DataType::kFp32);
}

TEST(ActivationDtype, UnknownNamesAndSixteenBitsOnTheCpuAreRefused) {
  for (const char* name : {"fp8", "int8", "float16", "", "AUTO"}) {
    EXPECT_EQ(error_of(parse_activation_dtype(name, DeviceType::kCuda)),
              "unknown dtype '" + std::string(name) + "' (expected auto, bf16, fp16 or fp32)");
  }
  EXPECT_EQ(error_of(parse_activation_dtype("bf16", DeviceType::kCpu)),
            "bf16 on the cpu: the CPU computes in fp32 (expected auto or fp32)");
  EXPECT_EQ(error_of(parse_activation_dtype("fp16", DeviceType::kCpu)),
            "fp16 on the cpu: the CPU computes in fp32 (expected auto or fp32)");
}

TEST(ActivationDtype, AutoIsTheStoredDtypeOnCudaAndFp32OnTheCpu) {
  for (DataType stored : kFloatTypes) {
    Result<DataType> cuda = resolve_activation(std::nullopt, stored, DeviceType::kCuda);
    ASSERT_OK(cuda);
    EXPECT_EQ(*cuda, stored) << dtype_name(stored);
    Result<DataType> cpu = resolve_activation(std::nullopt, stored, DeviceType::kCpu);
    ASSERT_OK(cpu);
    EXPECT_EQ(*cpu, DataType::kFp32) << dtype_name(stored);
  }
  EXPECT_FALSE(resolve_activation(std::nullopt, DataType::kInt8, DeviceType::kCuda).ok());
}

TEST(ActivationDtype, AnExplicitRequestWinsWhereTheDeviceRunsIt) {
  for (DataType stored : kFloatTypes) {
    for (DataType requested : kFloatTypes) {
      Result<DataType> cuda = resolve_activation(requested, stored, DeviceType::kCuda);
      ASSERT_OK(cuda);
      EXPECT_EQ(*cuda, requested);
    }
    Result<DataType> cpu = resolve_activation(DataType::kFp32, stored, DeviceType::kCpu);
    ASSERT_OK(cpu);
    EXPECT_EQ(*cpu, DataType::kFp32);
    EXPECT_FALSE(resolve_activation(DataType::kBf16, stored, DeviceType::kCpu).ok());
    EXPECT_FALSE(resolve_activation(DataType::kFp16, stored, DeviceType::kCpu).ok());
    EXPECT_FALSE(resolve_activation(DataType::kInt8, stored, DeviceType::kCuda).ok());
  }
}

// A Qwen3 shape small enough to write in a test, its embedding table (4096 x 16) larger than
// every other tensor together.
ModelConfig tiny_config() {
  ModelConfig c = test::tiny_qwen3_config();
  c.vocab_size = 4096;
  return c;
}

// A tiny_config() model file whose tensors are stored as `dtype_of` says; the bytes are zeros.
std::shared_ptr<ModelFile> model_file(const test::TempDir& dir, const std::string& name,
                                      const std::function<DataType(const TensorSpec&)>& dtype_of) {
  const ModelConfig c = tiny_config();
  std::vector<TensorSource> sources;
  for (const TensorSpec& spec : expected_tensors(c)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    const DataType dtype = dtype_of(spec);
    const size_t nbytes = static_cast<size_t>(n) * dtype_size(dtype);
    sources.push_back({spec.name, dtype, spec.shape, [nbytes](void* dst) {
                         std::memset(dst, 0, nbytes);
                         return Status::Ok();
                       }});
  }
  const nlohmann::json metadata = {{"tokenizer_json", "{}"},
                                   {"tokenizer_config_json", "{}"},
                                   {"hf_config", {{"architectures", {"Qwen3ForCausalLM"}}}}};
  const std::string path = dir.file(name);
  EXPECT_OK(write_model_file(path, c, metadata, sources));
  Result<std::shared_ptr<ModelFile>> file = ModelFile::open(path);
  EXPECT_OK(file);
  return file.ok() ? *file : nullptr;
}

// Mixed files follow the dtype holding the most elements, whatever the tensor count says.
TEST(ActivationDtype, TheCheckpointDtypeIsThatOfMostElements) {
  test::TempDir dir;
  std::shared_ptr<ModelFile> bf16_norms_fp32 = model_file(dir, "a.bin", [](const TensorSpec& s) {
    return s.shape.size() == 1 ? DataType::kFp32 : DataType::kBf16;
  });
  ASSERT_NE(bf16_norms_fp32, nullptr);
  EXPECT_EQ(checkpoint_dtype(*bf16_norms_fp32), DataType::kBf16);
  // The fp32 embedding table outweighs every other tensor (fp16) together.
  std::shared_ptr<ModelFile> big_fp32_embedding =
      model_file(dir, "b.bin", [](const TensorSpec& s) {
        return s.name == "model.embed_tokens.weight" ? DataType::kFp32 : DataType::kFp16;
      });
  ASSERT_NE(big_fp32_embedding, nullptr);
  EXPECT_EQ(checkpoint_dtype(*big_fp32_embedding), DataType::kFp32);
  for (DataType t : kFloatTypes) {
    std::shared_ptr<ModelFile> uniform = model_file(dir, std::string(dtype_name(t)) + ".bin",
                                                    [t](const TensorSpec&) { return t; });
    ASSERT_NE(uniform, nullptr);
    EXPECT_EQ(checkpoint_dtype(*uniform), t);
  }
}

// What Model::load makes of the programs' defaults on the CPU: fp32 and no graph, the model's
// options() holding the choice and still saying it was automatic.
TEST(ActivationDtype, LoadingWithAutoOnTheCpuRunsFp32Eagerly) {
  ModelOptions o;
  o.auto_activation = true;
  o.activation = DataType::kFp16;  // ignored under auto
  o.auto_cuda_graph = true;
  o.cuda_graph = true;  // ignored under auto: the CPU has no graph
  o.max_context = 64;
  for (DataType stored : {DataType::kFp32, DataType::kBf16}) {
    Result<std::unique_ptr<Model>> m =
        Model::load(test::converted_fixture("qwen3-tiny", stored), o);
    ASSERT_OK(m);
    EXPECT_EQ((*m)->options().activation, DataType::kFp32);
    EXPECT_FALSE((*m)->options().cuda_graph);
    EXPECT_TRUE((*m)->options().auto_activation);
  }
  // Random weights have no stored dtype for auto to follow.
  Result<std::unique_ptr<Model>> random = Model::random(tiny_config(), o);
  ASSERT_FALSE(random.ok());
  EXPECT_NE(random.status().message().find("no stored dtype"), std::string::npos)
      << random.status().message();
  o.auto_activation = false;
  o.activation = DataType::kFp32;
  EXPECT_OK(Model::random(tiny_config(), o));
}

}  // namespace
}  // namespace kuiper
