// Quantized checkpoints and models: the published layouts (AWQ, GPTQ, FP8) repacked into
// Kuiper's, tiny quantized models against the fp32 forward of their dequantized weights,
// kuiper-convert --quantize's round trip, and the model file's checks of quantized tensors.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "kuiper/base/allocator.h"
#include "kuiper/model/hf_checkpoint.h"
#include "kuiper/model/hf_quantized.h"
#include "kuiper/model/model.h"
#include "kuiper/model/model_file.h"
#include "kuiper/model/quantization.h"
#include "kuiper/model/qwen_model.h"
#include "kuiper/op/ops.h"
#include "support/assertions.h"
#include "support/cli.h"
#include "support/fixture_checkpoint.h"
#include "support/golden.h"
#include "support/paths.h"
#include "support/tensors.h"

namespace kuiper {
namespace {

using nlohmann::json;
using test::CliResult;
using test::parse_jsonl;
using test::read_text;
using test::run_program;
using test::TempDir;

// The published packings, written here from their descriptions (hf_quantized.h) so the repacking
// is checked against an independent writer. AutoAWQ packs columns 8j + order[i] of row k into
// bits 4i of word [k, j].
constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

struct Codes {  // a random quantized [N, K] matrix in plain arrays
  int64_t N, K, group;
  std::vector<int> q;           // [N, K]
  std::vector<int> z;           // [N, K / group]
  std::vector<uint16_t> s;      // fp16 [N, K / group]
  float value(int64_t n, int64_t k) const {
    const int64_t g = k / group, G = K / group;
    return static_cast<float>(q[n * K + k] - z[n * G + g]) * fp16_to_float(s[n * G + g]);
  }
};

Codes random_codes(int64_t N, int64_t K, int64_t group, int qmax, uint32_t seed) {
  std::mt19937 rng(seed);
  Codes c{N, K, group, {}, {}, {}};
  std::uniform_int_distribution<int> code(0, qmax);
  std::uniform_real_distribution<float> scale(1e-3f, 1e-1f);
  for (int64_t i = 0; i < N * K; ++i) c.q.push_back(code(rng));
  for (int64_t i = 0; i < N * (K / group); ++i) {
    c.z.push_back(code(rng));
    c.s.push_back(float_to_fp16(scale(rng)));
  }
  return c;
}

// AWQ's arrays: qweight [K, N/8], qzeros [K/g, N/8], scales [K/g, N].
void pack_awq(const Codes& c, std::vector<int32_t>& qweight, std::vector<int32_t>& qzeros,
              std::vector<uint16_t>& scales) {
  const int64_t N = c.N, K = c.K, G = K / c.group, W = N / 8;
  qweight.assign(K * W, 0);
  qzeros.assign(G * W, 0);
  scales.assign(G * N, 0);
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t j = 0; j < W; ++j) {
      uint32_t word = 0;
      for (int i = 0; i < 8; ++i) word |= uint32_t(c.q[(8 * j + kAwqOrder[i]) * K + k]) << (4 * i);
      qweight[k * W + j] = static_cast<int32_t>(word);
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t j = 0; j < W; ++j) {
      uint32_t word = 0;
      for (int i = 0; i < 8; ++i) word |= uint32_t(c.z[(8 * j + kAwqOrder[i]) * G + g]) << (4 * i);
      qzeros[g * W + j] = static_cast<int32_t>(word);
    }
    for (int64_t n = 0; n < N; ++n) scales[g * N + n] = c.s[n * G + g];
  }
}

// GPTQ's arrays: qweight [K/p, N] packed along K, qzeros [K/g, N/p] along N (z - 1 in v1),
// scales [K/g, N]; p = 32 / bits.
void pack_gptq(const Codes& c, int bits, bool v1, std::vector<int32_t>& qweight,
               std::vector<int32_t>& qzeros, std::vector<uint16_t>& scales) {
  const int64_t N = c.N, K = c.K, G = K / c.group, p = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  qweight.assign((K / p) * N, 0);
  qzeros.assign(G * (N / p), 0);
  scales.assign(G * N, 0);
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < N; ++n) {
      qweight[(k / p) * N + n] = static_cast<int32_t>(
          uint32_t(qweight[(k / p) * N + n]) | (uint32_t(c.q[n * K + k]) << (bits * (k % p))));
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t n = 0; n < N; ++n) {
      const uint32_t z = (uint32_t(c.z[n * G + g]) - (v1 ? 1 : 0)) & mask;
      int32_t& word = qzeros[g * (N / p) + n / p];
      word = static_cast<int32_t>(uint32_t(word) | (z << (bits * (n % p))));
      scales[g * N + n] = c.s[n * G + g];
    }
  }
}

std::vector<float> dequantized(const op::Weight& w) {
  Result<Tensor> out = Tensor::empty({w.rows(), w.cols()}, DataType::kFp32);
  EXPECT_TRUE(out.ok());
  Status s = op::dequantize(w, *out);
  EXPECT_TRUE(s.ok()) << s.message();
  return std::vector<float>(out->data<float>(), out->data<float>() + out->numel());
}

void expect_codes(const Codes& c, const op::Weight& w) {
  ASSERT_EQ(w.rows(), c.N);
  ASSERT_EQ(w.cols(), c.K);
  const std::vector<float> d = dequantized(w);
  int64_t bad = 0;
  for (int64_t n = 0; n < c.N; ++n) {
    for (int64_t k = 0; k < c.K; ++k) bad += d[n * c.K + k] != c.value(n, k);
  }
  EXPECT_EQ(bad, 0) << "of " << c.N * c.K << " values differ from (q - z) * s";
}

TEST(HfQuantized, AwqRepackIsThePublishedMath) {
  // Zeros at both ends (0 and 15) and groups at the edges of rows are in the random draw.
  const Codes c = random_codes(24, 192, 64, 15, 1);
  std::vector<int32_t> qweight, qzeros;
  std::vector<uint16_t> scales;
  pack_awq(c, qweight, qzeros, scales);
  Result<op::Weight> w = repack_awq(qweight.data(), qzeros.data(), scales.data(), c.N, c.K, 64);
  ASSERT_OK(w.status());
  expect_codes(c, *w);
}

TEST(HfQuantized, GptqRepackIsThePublishedMathInBothFormats) {
  for (int bits : {4, 8}) {
    for (bool v1 : {true, false}) {
      SCOPED_TRACE("bits " + std::to_string(bits) + (v1 ? " gptq" : " gptq_v2"));
      // v1 stores z - 1, so z = 0 has no code there: draw zeros from [1, qmax] for it.
      Codes c = random_codes(16, 256, 128, (1 << bits) - 1, 2 + bits);
      if (v1) {
        for (int& z : c.z) z = std::max(z, 1);
      }
      std::vector<int32_t> qweight, qzeros;
      std::vector<uint16_t> scales;
      pack_gptq(c, bits, v1, qweight, qzeros, scales);
      Result<op::Weight> w = repack_gptq(qweight.data(), qzeros.data(), scales.data(), c.N, c.K,
                                         128, bits, v1);
      ASSERT_OK(w.status());
      EXPECT_EQ(w->format, bits == 4 ? op::WeightFormat::kInt4 : op::WeightFormat::kInt8);
      expect_codes(c, *w);
    }
  }
}

TEST(HfQuantized, GptqSymmetricZeroIsHalfTheRange) {
  // sym=True: every stored v1 zero is 7 (int4) / 127 (int8), the zero point 8 / 128.
  for (int bits : {4, 8}) {
    Codes c = random_codes(8, 64, 32, (1 << bits) - 1, 9);
    for (int& z : c.z) z = 1 << (bits - 1);
    std::vector<int32_t> qweight, qzeros;
    std::vector<uint16_t> scales;
    pack_gptq(c, bits, true, qweight, qzeros, scales);
    const uint32_t stored = bits == 4 ? 0x77777777u : 0x7f7f7f7fu;
    for (int32_t word : qzeros) ASSERT_EQ(static_cast<uint32_t>(word), stored);
    Result<op::Weight> w =
        repack_gptq(qweight.data(), qzeros.data(), scales.data(), 8, 64, 32, bits, true);
    ASSERT_OK(w.status());
    for (int64_t i = 0; i < w->zeros.numel(); ++i) {
      ASSERT_EQ(w->zeros.data<uint8_t>()[i], 1 << (bits - 1));
    }
  }
}

TEST(HfQuantized, Fp8RepackScalesPartialEdgeBlocks) {
  const int64_t N = 200, K = 300;  // 128-blocks: 2 x 3 scales, the last ones partial
  std::mt19937 rng(4);
  std::vector<uint8_t> weight(N * K);
  for (uint8_t& b : weight) {
    b = static_cast<uint8_t>(rng());
    if ((b & 0x7f) == 0x7f) b = 0;  // no NaN codes
  }
  std::vector<float> scale_inv(2 * 3);
  for (size_t i = 0; i < scale_inv.size(); ++i) scale_inv[i] = 0.5f + static_cast<float>(i);
  Result<op::Weight> w = repack_fp8(weight.data(), scale_inv.data(), N, K, 128, 128);
  ASSERT_OK(w.status());
  const std::vector<float> d = dequantized(*w);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      ASSERT_EQ(d[n * K + k], fp8_e4m3_to_float(weight[n * K + k]) *
                                  scale_inv[(n / 128) * 3 + k / 128])
          << n << "," << k;
    }
  }
}

TEST(HfQuantized, OddShapesAreRefused) {
  std::vector<int32_t> words(1024, 0);
  std::vector<uint16_t> scales(1024, 0);
  EXPECT_FALSE(repack_awq(words.data(), words.data(), scales.data(), 12, 64, 32).ok());  // N % 8
  EXPECT_FALSE(repack_awq(words.data(), words.data(), scales.data(), 8, 64, 48).ok());   // group
  EXPECT_FALSE(repack_gptq(words.data(), words.data(), scales.data(), 8, 36, 4, 4, true).ok());
  // A v1 zero stored as -1 (0xf) would be 16: not a 4-bit zero point.
  std::vector<int32_t> zeros(8, -1);
  EXPECT_FALSE(repack_gptq(words.data(), zeros.data(), scales.data(), 8, 64, 64, 4, true).ok());
}

TEST(HfQuantized, ConfigsAreReadOrRefusedByName) {
  auto parse = [](json q) { return parse_hf_quantization(json{{"quantization_config", q}}); };
  Result<HfQuantization> fp8 = parse({{"quant_method", "fp8"}, {"activation_scheme", "dynamic"},
                                      {"weight_block_size", {128, 128}}});
  ASSERT_OK(fp8.status());
  EXPECT_EQ(fp8->method, HfQuantMethod::kFp8);
  EXPECT_EQ(fp8->block_rows, 128);
  Result<HfQuantization> gptq = parse({{"quant_method", "gptq"}, {"bits", 8}, {"group_size", 128},
                                       {"desc_act", false}, {"sym", true}});
  ASSERT_OK(gptq.status());
  EXPECT_TRUE(gptq->gptq_zero_offset);
  Result<HfQuantization> v2 = parse({{"quant_method", "gptq"}, {"checkpoint_format", "gptq_v2"}});
  ASSERT_OK(v2.status());
  EXPECT_FALSE(v2->gptq_zero_offset);
  const std::vector<std::pair<json, std::string>> refused = {
      {{{"quant_method", "bitsandbytes"}}, "quant_method bitsandbytes"},
      {{{"quant_method", "gptq"}, {"desc_act", true}}, "desc_act"},
      {{{"quant_method", "gptq"}, {"bits", 3}}, "3 bits"},
      {{{"quant_method", "gptq"}, {"checkpoint_format", "marlin"}}, "marlin"},
      {{{"quant_method", "awq"}, {"version", "gemv"}}, "gemv"},
      {{{"quant_method", "awq"}, {"zero_point", false}}, "zero_point"},
      {{{"quant_method", "fp8"}, {"activation_scheme", "static"},
        {"weight_block_size", {128, 128}}}, "static"},
      {{{"quant_method", "fp8"}}, "weight_block_size"}};
  for (const auto& [q, word] : refused) {
    Result<HfQuantization> r = parse(q);
    ASSERT_FALSE(r.ok()) << q.dump();
    EXPECT_NE(r.status().message().find(word), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("not supported"), std::string::npos);
  }
}

// ---- Tiny quantized checkpoints ----

// A safetensors file of raw tensors.
struct RawTensor {
  std::string name, dtype;  // the safetensors dtype label
  std::vector<int64_t> shape;
  std::string bytes;
};

template <typename T>
std::string bytes_of(const T* p, size_t n) {
  return std::string(reinterpret_cast<const char*>(p), n * sizeof(T));
}

void write_raw_safetensors(const std::string& path, const std::vector<RawTensor>& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  uint64_t offset = 0;
  for (const RawTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(text.size() >> (8 * i)));
  out << text;
  for (const RawTensor& t : tensors) out << t.bytes;
}

enum class Published { kAwq, kGptq4, kGptq8, kFp8 };

// qwen3-tiny with its projections quantized (op::quantize's round to nearest, group 128 / FP8
// 128-blocks) and written in a published layout to `quantized_dir`, and the same model with
// those projections dequantized (fp32) to `reference_dir`: the two are one model.
void write_quantized_fixture(Published format, const std::string& quantized_dir,
                             const std::string& reference_dir) {
  TempDir source;
  ASSERT_OK(test::write_fixture_checkpoint(test::fixtures_dir() + "/qwen3-tiny", source.path()));
  Result<HfCheckpoint> ckpt = read_hf_checkpoint(source.path());
  ASSERT_OK(ckpt.status());
  json config = ckpt->hf_config;
  QuantizeSpec spec;
  switch (format) {
    case Published::kAwq:
      spec = {op::WeightFormat::kInt4, 128};
      config["quantization_config"] = {{"quant_method", "awq"}, {"bits", 4}, {"group_size", 128},
                                       {"zero_point", true}, {"version", "gemm"}};
      break;
    case Published::kGptq4:
    case Published::kGptq8: {
      const int bits = format == Published::kGptq4 ? 4 : 8;
      spec = {bits == 4 ? op::WeightFormat::kInt4 : op::WeightFormat::kInt8, 128};
      config["quantization_config"] = {{"quant_method", "gptq"}, {"bits", bits},
                                       {"group_size", 128}, {"desc_act", false}, {"sym", false}};
      break;
    }
    case Published::kFp8:
      spec = {op::WeightFormat::kFp8, 128};
      config["quantization_config"] = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"},
                                       {"weight_block_size", {128, 128}}};
      break;
  }
  const std::vector<std::string> quantizable = quantizable_tensors(ckpt->config);
  std::vector<RawTensor> quantized, reference;
  for (const TensorSpec& t : expected_tensors(ckpt->config)) {
    const SafetensorsTensor* st = ckpt->weights.find(t.name);
    ASSERT_NE(st, nullptr);
    const std::string raw = bytes_of(static_cast<const uint8_t*>(st->data), st->nbytes);
    if (std::find(quantizable.begin(), quantizable.end(), t.name) == quantizable.end()) {
      quantized.push_back({t.name, "BF16", t.shape, raw});
      reference.push_back({t.name, "BF16", t.shape, raw});
      continue;
    }
    const Tensor w = Tensor::view(const_cast<void*>(st->data), st->shape, st->dtype,
                                  DeviceType::kCpu);
    Result<op::Weight> q = quantize_matrix(w, spec);
    ASSERT_OK(q.status());
    const std::vector<float> d = dequantized(*q);
    reference.push_back({t.name, "F32", t.shape, bytes_of(d.data(), d.size())});
    const int64_t N = q->rows(), K = q->cols();
    const std::string module = t.name.substr(0, t.name.size() - std::string(".weight").size());
    if (format == Published::kFp8) {
      quantized.push_back({t.name, "F8_E4M3", t.shape,
                           bytes_of(q->values.data<uint8_t>(), q->values.numel())});
      quantized.push_back({module + ".weight_scale_inv", "F32", q->scales.shape(),
                           bytes_of(q->scales.data<float>(), q->scales.numel())});
      continue;
    }
    Codes c{N, K, 128, {}, {}, {}};
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t k = 0; k < K; ++k) {
        const uint8_t* row = q->values.data<uint8_t>() + n * q->values.dim(1);
        c.q.push_back(format == Published::kGptq8 ? row[k] : (row[k / 2] >> (4 * (k % 2))) & 0xf);
      }
    }
    for (int64_t i = 0; i < q->zeros.numel(); ++i) {
      c.z.push_back(q->zeros.data<uint8_t>()[i]);
      c.s.push_back(q->scales.data<uint16_t>()[i]);
    }
    std::vector<int32_t> qweight, qzeros;
    std::vector<uint16_t> scales;
    if (format == Published::kAwq) {
      pack_awq(c, qweight, qzeros, scales);
      quantized.push_back({module + ".qweight", "I32", {K, N / 8},
                           bytes_of(qweight.data(), qweight.size())});
      quantized.push_back({module + ".qzeros", "I32", {K / 128, N / 8},
                           bytes_of(qzeros.data(), qzeros.size())});
    } else {
      // v1 cannot store a zero point of 0 (it writes z - 1): such groups get a v2 file instead.
      const int bits = format == Published::kGptq4 ? 4 : 8, p = 32 / bits;
      pack_gptq(c, bits, false, qweight, qzeros, scales);
      quantized.push_back({module + ".qweight", "I32", {K / p, N},
                           bytes_of(qweight.data(), qweight.size())});
      quantized.push_back({module + ".qzeros", "I32", {K / 128, N / p},
                           bytes_of(qzeros.data(), qzeros.size())});
      std::vector<int32_t> g_idx(K);
      for (int64_t k = 0; k < K; ++k) g_idx[k] = static_cast<int32_t>(k / 128);
      quantized.push_back({module + ".g_idx", "I32", {K}, bytes_of(g_idx.data(), g_idx.size())});
      config["quantization_config"]["checkpoint_format"] = "gptq_v2";
    }
    quantized.push_back({module + ".scales", "F16", {K / 128, N},
                         bytes_of(scales.data(), scales.size())});
  }
  for (const auto& [dir, tensors, cfg] :
       {std::make_tuple(quantized_dir, &quantized, config),
        std::make_tuple(reference_dir, &reference, ckpt->hf_config)}) {
    std::filesystem::create_directories(dir);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      std::filesystem::copy_file(source.file(f), dir + "/" + f);
    }
    std::ofstream(dir + "/config.json") << cfg.dump(2);
    write_raw_safetensors(dir + "/model.safetensors", *tensors);
  }
}

// Every row's logits for `ids` and, when `greedy` > 0, that many greedy tokens after them, the
// model loaded with `options` (max_context 64).
std::vector<float> prompt_logits(const std::string& model_file, const std::vector<int32_t>& ids,
                                 int greedy = 0, std::vector<int32_t>* continuation = nullptr,
                                 ModelOptions options = {}) {
  options.max_context = 64;
  Result<std::unique_ptr<Model>> model = Model::load(model_file, options);
  EXPECT_TRUE(model.ok()) << model.status().message();
  if (!model.ok()) return {};
  Result<Tensor> logits = (*model)->forward(ids, 0, true);
  EXPECT_TRUE(logits.ok()) << logits.status().message();
  if (!logits.ok()) return {};
  std::vector<float> rows = test::host_floats(*logits);
  const int64_t V = logits->dim(1);
  const float* last = rows.data() + rows.size() - V;
  int32_t next = static_cast<int32_t>(std::max_element(last, last + V) - last);
  for (int step = 0; step < greedy; ++step) {
    continuation->push_back(next);
    Result<Tensor> row = (*model)->forward({next}, static_cast<int64_t>(ids.size()) + step, false);
    EXPECT_TRUE(row.ok()) << row.status().message();
    if (!row.ok()) return {};
    const std::vector<float> r = test::host_floats(*row);
    next = static_cast<int32_t>(std::max_element(r.begin(), r.end()) - r.begin());
  }
  return rows;
}

class QuantizedFixture : public ::testing::TestWithParam<Published> {};

TEST_P(QuantizedFixture, LogitsEqualTheDequantizedFp32Model) {
  TempDir dir;
  write_quantized_fixture(GetParam(), dir.file("quantized"), dir.file("reference"));
  ASSERT_OK(convert_checkpoint(dir.file("quantized"), dir.file("q.bin"), std::nullopt));
  ASSERT_OK(convert_checkpoint(dir.file("reference"), dir.file("r.bin"), std::nullopt));
  Result<std::shared_ptr<ModelFile>> file = ModelFile::open(dir.file("q.bin"));
  ASSERT_OK(file.status());
  EXPECT_EQ(parse_quantization(file->get()->metadata())->size(), 14u);  // 7 a layer, lm_head tied

  const std::vector<int32_t> ids = {151644, 872, 198, 9707, 11, 1879, 0, 151645};
  std::vector<int32_t> q_greedy, r_greedy;
  const std::vector<float> q = prompt_logits(dir.file("q.bin"), ids, 8, &q_greedy);
  const std::vector<float> r = prompt_logits(dir.file("r.bin"), ids, 8, &r_greedy);
  EXPECT_EQ(q_greedy, r_greedy);  // the greedy continuation, as qwen3_infer would decode it
  ASSERT_EQ(q.size(), r.size());
  ASSERT_FALSE(q.empty());
  const size_t V = q.size() / ids.size();
  for (size_t t = 0; t < ids.size(); ++t) {
    const float* a = q.data() + t * V;
    const float* b = r.data() + t * V;
    double err = 0, scale = 0;
    for (size_t v = 0; v < V; ++v) {
      err = std::max(err, std::fabs(double(a[v]) - b[v]));
      scale = std::max(scale, std::fabs(double(b[v])));
    }
    EXPECT_LE(err / scale, 1e-4) << "row " << t;
    EXPECT_EQ(std::max_element(a, a + V) - a, std::max_element(b, b + V) - b) << "row " << t;
  }
}

// On the GPU (the fused GEMV for decode rows, the dequantized GEMM for the prompt, the decode
// graph) against the CPU's fp32 forward of the dequantized weights: in fp32 every prompt row's
// logits within 1e-2 relative and the same greedy continuation; in bf16 within the 16-bit
// tolerance, with the top token wherever the reference's top-two margin exceeds it.
TEST_P(QuantizedFixture, CudaLogitsEqualTheDequantizedFp32Model) {
  SKIP_WITHOUT_CUDA();
  TempDir dir;
  write_quantized_fixture(GetParam(), dir.file("quantized"), dir.file("reference"));
  ASSERT_OK(convert_checkpoint(dir.file("quantized"), dir.file("q.bin"), std::nullopt));
  ASSERT_OK(convert_checkpoint(dir.file("reference"), dir.file("r.bin"), std::nullopt));
  const std::vector<int32_t> ids = {151644, 872, 198, 9707, 11, 1879, 0, 151645};
  std::vector<int32_t> r_greedy;
  const std::vector<float> r = prompt_logits(dir.file("r.bin"), ids, 8, &r_greedy);
  ASSERT_FALSE(r.empty());
  const size_t V = r.size() / ids.size();
  for (const DataType act : {DataType::kFp32, DataType::kBf16}) {
    SCOPED_TRACE(dtype_name(act));
    const double tol = act == DataType::kFp32 ? 1e-2 : test::kHalfTolerance;
    ModelOptions options;
    options.device = DeviceType::kCuda;
    options.activation = act;
    options.cuda_graph = true;
    std::vector<int32_t> q_greedy;
    const std::vector<float> q = prompt_logits(dir.file("q.bin"), ids, 8, &q_greedy, options);
    ASSERT_EQ(q.size(), r.size());
    if (act == DataType::kFp32) EXPECT_EQ(q_greedy, r_greedy);
    for (size_t t = 0; t < ids.size(); ++t) {
      std::vector<float> a(q.begin() + t * V, q.begin() + (t + 1) * V);
      std::vector<float> b(r.begin() + t * V, r.begin() + (t + 1) * V);
      double err = 0, scale = 0;
      for (size_t v = 0; v < V; ++v) {
        err = std::max(err, std::fabs(double(a[v]) - b[v]));
        scale = std::max(scale, std::fabs(double(b[v])));
      }
      EXPECT_LE(err / scale, tol) << "row " << t;
      std::vector<float> sorted = b;
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      if (act == DataType::kFp32 || sorted[0] - sorted[1] > tol * scale) {
        EXPECT_EQ(std::max_element(a.begin(), a.end()) - a.begin(),
                  std::max_element(b.begin(), b.end()) - b.begin())
            << "row " << t;
      }
    }
  }
}

// qwen3_infer on the quantized file and on the dequantized fp32 one: the same greedy tokens, on
// the CPU and (where there is one) on the GPU in fp32.
TEST_P(QuantizedFixture, Qwen3InferGreedyTokensEqualTheDequantizedModels) {
  TempDir dir;
  write_quantized_fixture(GetParam(), dir.file("quantized"), dir.file("reference"));
  ASSERT_OK(convert_checkpoint(dir.file("quantized"), dir.file("q.bin"), std::nullopt));
  ASSERT_OK(convert_checkpoint(dir.file("reference"), dir.file("r.bin"), std::nullopt));
  auto greedy_ids = [&](const std::string& model, const std::string& device) {
    const std::string out = dir.file(device + "-" + model + ".jsonl");
    const CliResult r = run_program(
        "qwen3_infer", {"--model", dir.file(model), "--device", device, "--dtype", "fp32",
                        "--prompt", "Hello! Who are you?", "--max-tokens", "12", "--temperature",
                        "0", "--ignore-eos", "--output", out});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const std::vector<nlohmann::json> records = parse_jsonl(read_text(out));
    return records.size() == 1 ? records[0]["output_ids"].get<std::vector<int32_t>>()
                               : std::vector<int32_t>{};
  };
  const std::vector<int32_t> reference = greedy_ids("r.bin", "cpu");
  ASSERT_EQ(reference.size(), 12u);
  EXPECT_EQ(greedy_ids("q.bin", "cpu"), reference);
  if (cuda_available()) EXPECT_EQ(greedy_ids("q.bin", "cuda"), reference);
}

std::string format_name(const ::testing::TestParamInfo<Published>& info) {
  static const char* const kNames[] = {"awq", "gptq_int4", "gptq_int8", "fp8"};
  return kNames[static_cast<int>(info.param)];
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizedFixture,
                         ::testing::Values(Published::kAwq, Published::kGptq4, Published::kGptq8,
                                           Published::kFp8),
                         format_name);

// FP8 activations (ModelOptions::fp8_activations, W8A8): the CPU's fp32 forward rounds x to FP8
// before every FP8 product, which moves its logits off the dequantized weights'; the GPU's (the
// tensor-core GEMV for decode rows, the prompt's products, the decode graph) equals that forward
// within 1e-2 in fp32 with the same greedy continuation. In bf16 the rounding to FP8 magnifies
// bf16's: where bf16 moves an activation across an FP8 rounding boundary (about one in 30), the
// code moves by a whole FP8 step (2^-3 to 2^-4 of the value), which puts the logits of this
// 2-layer model 5-10% of their largest off the fp32 forward; bf16 is held to 0.2 and the top
// token wherever the reference's margin exceeds that. A model without FP8 weights refuses the
// option.
TEST(QuantizedCheckpoint, Fp8ActivationsGiveTheSameLogitsOnEveryDevice) {
  TempDir dir;
  write_quantized_fixture(Published::kFp8, dir.file("quantized"), dir.file("reference"));
  ASSERT_OK(convert_checkpoint(dir.file("quantized"), dir.file("q.bin"), std::nullopt));
  const std::vector<int32_t> ids = {151644, 872, 198, 9707, 11, 1879, 0, 151645};
  ModelOptions w8a8;
  w8a8.fp8_activations = true;
  std::vector<int32_t> r_greedy, plain_greedy;
  const std::vector<float> r = prompt_logits(dir.file("q.bin"), ids, 8, &r_greedy, w8a8);
  const std::vector<float> plain = prompt_logits(dir.file("q.bin"), ids, 8, &plain_greedy);
  ASSERT_FALSE(r.empty());
  ASSERT_EQ(r.size(), plain.size());
  const size_t V = r.size() / ids.size();
  // The largest difference of a row of `a` from the row of r, over r's largest magnitude.
  auto row_error = [&](const std::vector<float>& a, size_t t) {
    double err = 0, scale = 0;
    for (size_t v = t * V; v < (t + 1) * V; ++v) {
      err = std::max(err, std::fabs(double(a[v]) - r[v]));
      scale = std::max(scale, std::fabs(double(r[v])));
    }
    return std::make_pair(err / scale, scale);
  };
  double moved = 0;
  for (size_t t = 0; t < ids.size(); ++t) moved = std::max(moved, row_error(plain, t).first);
  EXPECT_GE(moved, 1e-4);
  if (cuda_available()) {
    for (const DataType act : {DataType::kFp32, DataType::kBf16}) {
      SCOPED_TRACE(dtype_name(act));
      const double tol = act == DataType::kFp32 ? 1e-2 : 0.2;
      ModelOptions options = w8a8;
      options.device = DeviceType::kCuda;
      options.activation = act;
      options.cuda_graph = true;
      std::vector<int32_t> q_greedy;
      const std::vector<float> q = prompt_logits(dir.file("q.bin"), ids, 8, &q_greedy, options);
      ASSERT_EQ(q.size(), r.size());
      if (act == DataType::kFp32) EXPECT_EQ(q_greedy, r_greedy);
      for (size_t t = 0; t < ids.size(); ++t) {
        const auto [err, scale] = row_error(q, t);
        EXPECT_LE(err, tol) << "row " << t;
        std::vector<float> b(r.begin() + t * V, r.begin() + (t + 1) * V);
        const auto top = std::max_element(b.begin(), b.end()) - b.begin();
        std::vector<float> sorted = b;
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
        if (act == DataType::kFp32 || sorted[0] - sorted[1] > tol * scale) {
          EXPECT_EQ(std::max_element(q.begin() + t * V, q.begin() + (t + 1) * V) -
                        (q.begin() + t * V),
                    top)
              << "row " << t;
        }
      }
    }
  }
  write_quantized_fixture(Published::kAwq, dir.file("awq"), dir.file("awq_reference"));
  ASSERT_OK(convert_checkpoint(dir.file("awq"), dir.file("awq.bin"), std::nullopt));
  Result<std::unique_ptr<Model>> awq = Model::load(dir.file("awq.bin"), w8a8);
  ASSERT_FALSE(awq.ok());
  EXPECT_NE(awq.status().message().find("no FP8 weights"), std::string::npos)
      << awq.status().message();
  // The programs' flag: qwen3_infer runs the FP8 model with it and refuses the AWQ one by name.
  for (const char* model : {"q.bin", "awq.bin"}) {
    const CliResult cli = run_program(
        "qwen3_infer", {"--model", dir.file(model), "--device", "cpu", "--fp8-activations",
                        "--prompt", "Hello!", "--max-tokens", "4", "--temperature", "0"});
    if (std::string(model) == "q.bin") {
      EXPECT_EQ(cli.exit_code, 0) << cli.err;
    } else {
      EXPECT_NE(cli.exit_code, 0);
      EXPECT_NE(cli.err.find("no FP8 weights"), std::string::npos) << cli.err;
    }
  }
}

// qwen3-tiny-fp8/fp8_transformers.safetensors: qwen3-tiny's projections as transformers 5.17
// writes them with FineGrainedFP8Config (weight_block_size 128) and save_pretrained, and the last
// row of logits its own fp32 forward gives for kFp8Prompt after loading that checkpoint with
// FineGrainedFP8Config(dequantize=True): transformers' dequantization, our fp32 CPU forward's
// reference. (Its FP8 forward needs the `kernels` package, absent on the GPU machine.)
const std::vector<int32_t> kFp8Prompt = {151644, 872, 198, 9707, 11, 1879, 0, 151645};

TEST(QuantizedCheckpoint, TransformersFp8CheckpointMatchesItsDequantizedForward) {
  TempDir dir;
  ASSERT_OK(test::write_fixture_checkpoint(test::fixtures_dir() + "/qwen3-tiny", dir.file("bf16")));
  Result<HfCheckpoint> bf16 = read_hf_checkpoint(dir.file("bf16"));
  ASSERT_OK(bf16.status());
  Result<SafetensorsFile> fp8 = SafetensorsFile::open(
      test::fixtures_dir() + "/qwen3-tiny-fp8/fp8_transformers.safetensors");
  ASSERT_OK(fp8.status());
  std::vector<RawTensor> tensors;
  const std::vector<std::string> quantizable = quantizable_tensors(bf16->config);
  for (const TensorSpec& t : expected_tensors(bf16->config)) {
    if (std::find(quantizable.begin(), quantizable.end(), t.name) != quantizable.end()) continue;
    const SafetensorsTensor* st = bf16->weights.find(t.name);
    ASSERT_NE(st, nullptr);
    tensors.push_back(
        {t.name, "BF16", t.shape, bytes_of(static_cast<const uint8_t*>(st->data), st->nbytes)});
  }
  std::vector<float> reference;
  for (const SafetensorsTensor& t : fp8->tensors()) {
    if (t.name == "logits_last_row") {
      const float* p = static_cast<const float*>(t.data);
      reference.assign(p, p + t.nbytes / sizeof(float));
      continue;
    }
    tensors.push_back({t.name, t.dtype == DataType::kFp8E4m3 ? "F8_E4M3" : "F32", t.shape,
                       bytes_of(static_cast<const uint8_t*>(t.data), t.nbytes)});
  }
  json config = bf16->hf_config;
  config["quantization_config"] = {{"activation_scheme", "dynamic"}, {"dequantize", false},
                                   {"modules_to_convert", nullptr},
                                   {"modules_to_not_convert", nullptr}, {"quant_method", "fp8"},
                                   {"scale_fmt", "float"}, {"weight_block_size", {128, 128}}};
  std::ofstream(dir.file("bf16/config.json")) << config.dump(2);
  write_raw_safetensors(dir.file("bf16/model.safetensors"), tensors);
  ASSERT_OK(convert_checkpoint(dir.file("bf16"), dir.file("fp8.bin"), std::nullopt));
  const std::vector<float> logits = prompt_logits(dir.file("fp8.bin"), kFp8Prompt);
  ASSERT_EQ(logits.size(), reference.size() * kFp8Prompt.size());
  const float* last = logits.data() + logits.size() - reference.size();
  double err = 0, scale = 0;
  for (size_t v = 0; v < reference.size(); ++v) {
    err = std::max(err, std::fabs(double(last[v]) - reference[v]));
    scale = std::max(scale, std::fabs(double(reference[v])));
  }
  EXPECT_LE(err / scale, 1e-4);
  EXPECT_EQ(std::max_element(last, last + reference.size()) - last,
            std::max_element(reference.begin(), reference.end()) - reference.begin());
}

TEST(QuantizedCheckpoint, ActOrderGIdxIsRefused) {
  TempDir dir;
  write_quantized_fixture(Published::kGptq4, dir.file("q"), dir.file("r"));
  // Point column 0 of one matrix at group 1, in place: the file is otherwise unchanged.
  const std::string path = dir.file("q/model.safetensors");
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  const json header = json::parse(bytes.substr(8, header_len));
  const uint64_t begin = header.at("model.layers.0.mlp.down_proj.g_idx")
                             .at("data_offsets")[0]
                             .get<uint64_t>();
  const int32_t one = 1;
  std::memcpy(&bytes[8 + header_len + begin], &one, 4);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  Status s = convert_checkpoint(dir.file("q"), dir.file("q.bin"), std::nullopt);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("act-order"), std::string::npos) << s.message();
  EXPECT_FALSE(std::filesystem::exists(dir.file("q.bin")));
}

// scripts/make_quantized_fixtures.py writes each published layout from a 16-bit checkpoint
// (plain python3); what kuiper-convert reads back is the checkpoint's weights within the
// quantizer's bound, and it runs.
TEST(QuantizedCheckpoint, ScriptFixturesReadBackWithinTheBound) {
  TempDir dir;
  const json config = json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "vocab_size": 512, "hidden_size": 128,
    "intermediate_size": 256, "num_hidden_layers": 1, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 64, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16"})");
  ASSERT_OK(test::write_checkpoint(config, dir.file("bf16")));
  const std::string script = test::test_data_dir() + "/../../scripts/make_quantized_fixtures.py";
  const std::string command = "python3 " + test::shell_quote(script) + " " +
                              test::shell_quote(dir.file("bf16")) + " " +
                              test::shell_quote(dir.file("out")) + " > /dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  Result<SafetensorsCheckpoint> source = SafetensorsCheckpoint::open(dir.file("bf16"));
  ASSERT_OK(source.status());
  for (const char* format : {"awq", "gptq-int4", "gptq-int8", "fp8"}) {
    SCOPED_TRACE(format);
    const std::string out = dir.file(std::string(format) + ".bin");
    ASSERT_OK(convert_checkpoint(dir.file("out/") + format, out, std::nullopt));
    Result<std::shared_ptr<ModelFile>> file = ModelFile::open(out);
    ASSERT_OK(file.status());
    for (const std::string& name : quantizable_tensors((*file)->config())) {
      Result<op::Weight> w = (*file)->weight(name);
      ASSERT_OK(w.status());
      if (name == "lm_head.weight") {  // the releases keep it 16-bit
        EXPECT_FALSE(w->quantized());
        continue;
      }
      ASSERT_TRUE(w->quantized()) << name;
      const std::vector<float> d = dequantized(*w);
      const SafetensorsTensor* t = source->find(name);
      std::vector<float> orig(d.size());
      ASSERT_OK(convert_elements(t->data, t->dtype, orig.data(), DataType::kFp32, orig.size()));
      const int64_t K = w->cols();
      for (size_t i = 0; i < d.size(); ++i) {
        const int64_t n = static_cast<int64_t>(i) / K, k = static_cast<int64_t>(i) % K;
        const int64_t sc = w->scales.dim(1);
        const double bound =
            w->format == op::WeightFormat::kFp8
                ? std::max(std::fabs(orig[i]) * 0x1p-4,
                           w->scales.data<float>()[(n / w->block_rows) * sc + k / w->block_cols] *
                               0x1p-10)
                : fp16_to_float(w->scales.data<uint16_t>()[n * sc + k / w->block_cols]);
        ASSERT_LE(std::fabs(d[i] - orig[i]), bound) << name << " [" << n << ", " << k << "]";
      }
    }
    const std::vector<float> logits = prompt_logits(out, {1, 2, 3, 4});
    ASSERT_FALSE(logits.empty());
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  }
}

// ---- kuiper-convert --quantize ----

TEST(ConvertQuantize, RoundTripIsWithinTheQuantizersBound) {
  TempDir dir;
  ASSERT_OK(test::write_fixture_checkpoint(test::fixtures_dir() + "/qwen3-tiny", dir.file("hf")));
  Result<SafetensorsCheckpoint> source = SafetensorsCheckpoint::open(dir.file("hf"));
  ASSERT_OK(source.status());
  for (const QuantizeSpec spec : {QuantizeSpec{op::WeightFormat::kInt4, 128},
                                  QuantizeSpec{op::WeightFormat::kInt8, 64},
                                  QuantizeSpec{op::WeightFormat::kFp8, 128},
                                  QuantizeSpec{op::WeightFormat::kFp8, 0}}) {
    SCOPED_TRACE(spec.describe());
    const std::string out = dir.file("model.bin");
    ASSERT_OK(convert_checkpoint(dir.file("hf"), out, std::nullopt, nullptr, spec));
    Result<std::shared_ptr<ModelFile>> file = ModelFile::open(out);
    ASSERT_OK(file.status());
    const ModelFile& f = **file;
    // The embeddings and norms stay as stored.
    EXPECT_EQ(f.find("model.embed_tokens.weight")->dtype, DataType::kBf16);
    EXPECT_EQ(f.find("model.norm.weight")->dtype, DataType::kBf16);
    int64_t checked = 0;
    for (const std::string& name : quantizable_tensors(f.config())) {
      Result<op::Weight> w = f.weight(name);
      ASSERT_OK(w.status());
      ASSERT_EQ(w->format, spec.format) << name;
      const std::vector<float> d = dequantized(*w);
      const SafetensorsTensor* t = source->find(name);
      const int64_t K = w->cols();
      std::vector<float> orig(d.size());
      ASSERT_OK(convert_elements(t->data, t->dtype, orig.data(), DataType::kFp32, orig.size()));
      for (size_t i = 0; i < d.size(); ++i) {
        const int64_t n = static_cast<int64_t>(i) / K, k = static_cast<int64_t>(i) % K;
        double bound;
        if (spec.format == op::WeightFormat::kFp8) {
          const float s = w->scales.data<float>()[(n / w->block_rows) * w->scales.dim(1) +
                                                  k / w->block_cols];
          bound = std::max(std::fabs(orig[i]) * 0x1p-4, s * 0x1p-10);  // half an E4M3 step
        } else {
          bound = fp16_to_float(w->scales.data<uint16_t>()[n * (K / w->block_cols) +
                                                           k / w->block_cols]);
        }
        ASSERT_LE(std::fabs(d[i] - orig[i]), bound) << name << " [" << n << ", " << k << "]";
      }
      ++checked;
    }
    EXPECT_EQ(checked, 14);
    // It runs: logits finite.
    const std::vector<float> logits = prompt_logits(out, {151644, 872, 198});
    ASSERT_FALSE(logits.empty());
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  }
}

TEST(ConvertQuantize, TheVisionTowerStaysSixteenBit) {
  TempDir dir;
  ASSERT_OK(
      test::write_fixture_checkpoint(test::fixtures_dir() + "/qwen3-vl-tiny", dir.file("hf")));
  ASSERT_OK(convert_checkpoint(dir.file("hf"), dir.file("vl.bin"), std::nullopt, nullptr,
                               QuantizeSpec{op::WeightFormat::kInt8, 128}));
  Result<std::shared_ptr<ModelFile>> file = ModelFile::open(dir.file("vl.bin"));
  ASSERT_OK(file.status());
  const std::vector<std::string> text = quantizable_tensors((*file)->config());
  Result<std::vector<std::pair<std::string, QuantizedEntry>>> q =
      parse_quantization((*file)->metadata());
  ASSERT_OK(q.status());
  EXPECT_EQ(q->size(), text.size() - 1);  // every text projection; lm_head stays
  int64_t vision = 0;
  for (const TensorSpec& spec : expected_vision_tensors(*(*file)->config().vision)) {
    EXPECT_EQ((*file)->find(spec.name)->dtype, DataType::kBf16) << spec.name;
    ++vision;
  }
  EXPECT_GT(vision, 0);
  ModelOptions options;
  options.max_context = 16;
  ASSERT_OK(Model::load(dir.file("vl.bin"), options).status());
}

// --quantize_lm_head: an untied lm_head in its own format (here int4 beside int8 projections),
// within its quantizer's bound, and the model runs; a tied one is refused (it is the embedding
// table), as is an integer lm_head without a group.
TEST(ConvertQuantize, AnUntiedLmHeadIsQuantizedWhenAsked) {
  Result<QuantizeSpec> spec = parse_quantize_spec("int8", 128, "int4");
  ASSERT_OK(spec.status());
  EXPECT_EQ(spec->describe(), "int8 group 128, lm_head int4 group 128");
  EXPECT_FALSE(parse_quantize_spec("fp8", 0, "int8").ok());  // per-channel FP8: no group
  TempDir dir;
  ASSERT_OK(
      test::write_fixture_checkpoint(test::fixtures_dir() + "/qwen3-vl-tiny", dir.file("hf")));
  ASSERT_OK(convert_checkpoint(dir.file("hf"), dir.file("vl.bin"), std::nullopt, nullptr, *spec));
  Result<std::shared_ptr<ModelFile>> file = ModelFile::open(dir.file("vl.bin"));
  ASSERT_OK(file.status());
  Result<op::Weight> head = (*file)->weight("lm_head.weight");
  ASSERT_OK(head.status());
  ASSERT_EQ(head->format, op::WeightFormat::kInt4);
  Result<op::Weight> q_proj =
      (*file)->weight("model.language_model.layers.0.self_attn.q_proj.weight");
  ASSERT_OK(q_proj.status());
  EXPECT_EQ(q_proj->format, op::WeightFormat::kInt8);
  Result<SafetensorsCheckpoint> source = SafetensorsCheckpoint::open(dir.file("hf"));
  ASSERT_OK(source.status());
  const SafetensorsTensor* t = source->find("lm_head.weight");
  ASSERT_NE(t, nullptr);
  const std::vector<float> d = dequantized(*head);
  std::vector<float> orig(d.size());
  ASSERT_OK(convert_elements(t->data, t->dtype, orig.data(), DataType::kFp32, orig.size()));
  const int64_t K = head->cols(), groups = K / head->block_cols;
  for (size_t i = 0; i < d.size(); ++i) {
    const int64_t n = static_cast<int64_t>(i) / K, k = static_cast<int64_t>(i) % K;
    const float s = fp16_to_float(head->scales.data<uint16_t>()[n * groups + k / head->block_cols]);
    ASSERT_LE(std::fabs(d[i] - orig[i]), s) << "[" << n << ", " << k << "]";
  }
  ModelOptions options;
  options.max_context = 16;
  Result<std::unique_ptr<Model>> model = Model::load(dir.file("vl.bin"), options);
  ASSERT_OK(model.status());

  ASSERT_OK(test::write_fixture_checkpoint(test::fixtures_dir() + "/qwen3-tiny", dir.file("tied")));
  const Status tied = convert_checkpoint(dir.file("tied"), dir.file("t.bin"), std::nullopt,
                                         nullptr, *spec);
  ASSERT_FALSE(tied.ok());
  EXPECT_NE(tied.message().find("tie_word_embeddings"), std::string::npos) << tied.message();
}

TEST(ConvertQuantize, ShapesTheFormatCannotHoldAreRefused) {
  TempDir dir;
  ASSERT_OK(test::write_fixture_checkpoint(test::fixtures_dir() + "/qwen3-tiny", dir.file("hf")));
  // A group of 96 does not divide the 128 columns of q_proj.
  Status s = convert_checkpoint(dir.file("hf"), dir.file("m.bin"), std::nullopt, nullptr,
                                QuantizeSpec{op::WeightFormat::kInt4, 96});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("q_proj"), std::string::npos) << s.message();
  EXPECT_FALSE(std::filesystem::exists(dir.file("m.bin")));
}

// ---- The model file ----

TEST(QuantizedModelFile, InconsistentPartsAreRefused) {
  Result<ModelConfig> config = ModelConfig::from_hf(json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "vocab_size": 64, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 16, "tie_word_embeddings": true})"));
  ASSERT_OK(config.status());
  std::vector<TensorSource> tensors;
  auto add = [&](const std::string& name, DataType dtype, std::vector<int64_t> shape) {
    tensors.push_back({name, dtype, shape, [](void*) { return Status::Ok(); }});
  };
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  for (const TensorSpec& t : expected_tensors(*config)) {
    if (t.name == q) continue;
    add(t.name, DataType::kFp32, t.shape);
  }
  TempDir dir;
  auto write = [&](json quantization, DataType vt, std::vector<int64_t> values,
                   std::vector<int64_t> scales, std::vector<int64_t> zeros) {
    std::vector<TensorSource> all = tensors;
    all.push_back({q, vt, values, [](void*) { return Status::Ok(); }});
    all.push_back({q + ".scales", DataType::kFp16, scales, [](void*) { return Status::Ok(); }});
    all.push_back({q + ".zeros", DataType::kUint8, zeros, [](void*) { return Status::Ok(); }});
    return write_model_file(dir.file("m.bin"), *config, {{"quantization", quantization}}, all);
  };
  const json int4 = {{q, {{"format", "int4"}, {"block", {1, 16}}}}};
  ASSERT_OK(write(int4, DataType::kUint8, {32, 16}, {32, 2}, {32, 2}));
  Result<std::shared_ptr<ModelFile>> f = ModelFile::open(dir.file("m.bin"));
  ASSERT_OK(f.status());
  Result<op::Weight> w = (*f)->weight(q);
  ASSERT_OK(w.status());
  EXPECT_EQ(w->cols(), 32);
  EXPECT_EQ(w->nbytes(), 32u * 16 + 32 * 2 * 2 + 32 * 2);

  const std::vector<std::pair<Status, std::string>> cases = {
      {write(int4, DataType::kUint8, {32, 16}, {32, 3}, {32, 2}), "scales must be fp16 [32,2]"},
      {write(int4, DataType::kUint8, {32, 8}, {32, 1}, {32, 1}), "config implies [32,32]"},
      {write(int4, DataType::kFp16, {32, 16}, {32, 2}, {32, 2}), "codes must be uint8"},
      {write({{q, {{"format", "int3"}, {"block", {1, 16}}}}}, DataType::kUint8, {32, 16}, {32, 2},
             {32, 2}),
       "int3"},
      {write({{q, {{"format", "int4"}, {"block", {1, 0}}}}}, DataType::kUint8, {32, 16}, {32, 2},
             {32, 2}),
       "block"},
      {write({{"model.embed_tokens.weight", {{"format", "int4"}, {"block", {1, 16}}}}},
             DataType::kUint8, {32, 16}, {32, 2}, {32, 2}),
       "only the decoder's projections"}};
  for (const auto& [s, text] : cases) {
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_NE(s.message().find(text), std::string::npos) << s.message();
  }
}

TEST(QuantizedModel, RandomQuantizedWeightsCountPackedBytes) {
  Result<ModelConfig> config = ModelConfig::from_hf(json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "vocab_size": 64, "hidden_size": 128,
    "intermediate_size": 256, "num_hidden_layers": 1, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 64, "tie_word_embeddings": true})"));
  ASSERT_OK(config.status());
  ModelOptions options;
  options.max_context = 16;
  Result<std::unique_ptr<Model>> plain = Model::random(*config, options);
  ASSERT_OK(plain.status());
  options.quantize = {op::WeightFormat::kInt4, 64};
  Result<std::unique_ptr<Model>> int4 = Model::random(*config, options);
  ASSERT_OK(int4.status());
  // Projections: 2 * 128 * 128 (q, o) + 2 * 64 * 128 (k, v) + 3 * 256 * 128 = 147456 weights,
  // fp32 4 bytes each, int4 half a byte plus a 2-byte scale and a 1-byte zero per 64.
  const int64_t n = 147456;
  const auto* p = dynamic_cast<const QwenModel*>(plain->get());
  const auto* q = dynamic_cast<const QwenModel*>(int4->get());
  ASSERT_NE(p, nullptr);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(p->weight_bytes() - q->weight_bytes(), n * 4 - (n / 2 + n / 64 * 3));
  Result<Tensor> logits = (*int4)->forward({1, 2, 3}, 0, false);
  ASSERT_OK(logits.status());
  for (int64_t i = 0; i < logits->numel(); ++i) {
    ASSERT_TRUE(std::isfinite(logits->data<float>()[i]));
  }
}

}  // namespace
}  // namespace kuiper
