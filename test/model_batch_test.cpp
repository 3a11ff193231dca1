// Model::forward over a batch of sequences (kuiper/model/batch.h): sequences of different lengths
// in different KV blocks, prefill chunks beside decode steps, give the logits each gives alone;
// each entry gets the logits rows it asks for; every invalid entry is an error that writes
// nothing. CPU fp32 on the fixture checkpoints (Qwen3, Qwen2, and Qwen3-VL with an image beside
// text); the per-block decode graphs on CUDA in CudaModelBatch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <tuple>

#include "kuiper/model/model.h"
#include "kuiper/model/rope_index.h"
#include "support/assertions.h"
#include "support/fixture_checkpoint.h"
#include "support/golden.h"
#include "support/tensors.h"

namespace kuiper::test {
namespace {

const int32_t kBlocks[] = {0, 1, 2, 3};

// A span in block `block` (kBlocks[block]; -1 for an empty block table).
SequenceInput span_in(const std::vector<int32_t>& ids, int64_t start, int block,
                      LogitRows rows = LogitRows::kLast) {
  SequenceInput s;
  s.tokens = ids;
  s.start = start;
  if (block >= 0) s.blocks = Span<const int32_t>(&kBlocks[block], 1);
  s.logits = rows;
  return s;
}

std::unique_ptr<Model> load(const std::string& fixture, const ModelOptions& options) {
  Result<std::unique_ptr<Model>> model =
      Model::load(converted_fixture(fixture, DataType::kFp32), options);
  EXPECT_OK(model);
  return model.ok() ? std::move(model).value() : nullptr;
}

// One block of the whole context per sequence (kBlocks names them), unless paged.
ModelOptions batch_options(int64_t sequences, int64_t block_size = 128) {
  ModelOptions o;
  o.max_context = 128;
  o.max_sequences = sequences;
  o.kv_block_size = block_size;
  o.prefill_chunk = 16;  // the longer prompts run in several passes
  return o;
}

// Block tables of `sequences` sequences of 128 tokens over a pool of 8-token blocks, each table
// a scrambled pick of the pool's blocks (no two sequences sharing one).
std::vector<std::vector<int32_t>> scrambled_tables(int sequences) {
  const int per_sequence = 128 / 8;
  std::vector<int32_t> order(static_cast<size_t>(sequences * per_sequence));
  for (size_t i = 0; i < order.size(); ++i) {
    order[i] = static_cast<int32_t>((i * 37 + 11) % order.size());  // 37 is prime to 16, 32, 48
  }
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(sequences));
  for (size_t i = 0; i < order.size(); ++i) tables[i / per_sequence].push_back(order[i]);
  return tables;
}

// Rows [row, row + count) of [R, V] logits.
std::vector<float> rows_of(const std::vector<float>& logits, size_t V, size_t row, size_t count) {
  return std::vector<float>(logits.begin() + static_cast<std::ptrdiff_t>(row * V),
                            logits.begin() + static_cast<std::ptrdiff_t>((row + count) * V));
}

// max |a - b| over max |b|: 0 when the batch reproduces the lone run bit for bit.
double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || a.empty()) return INFINITY;
  return relative_max_error(a.data(), b.data(), a.size());
}

// One step of a schedule: a batch of spans, each of one sequence (a slot in the batched model).
struct Entry {
  int sequence;
  SequenceInput input;  // its blocks are ignored for the lone runs
};

// Runs `steps` as batches on `batched`, and each sequence's spans alone, in order, on its own
// model from `make` (block 0); every entry's rows must agree.
template <typename Make>
void expect_batches_match_lone_runs(Model& batched, const std::vector<std::vector<Entry>>& steps,
                                    int sequences, Make make, double tolerance = 1e-6) {
  std::vector<std::unique_ptr<Model>> alone;
  for (int i = 0; i < sequences; ++i) alone.push_back(make());
  const size_t V = static_cast<size_t>(batched.config().vocab_size);
  for (size_t step = 0; step < steps.size(); ++step) {
    std::vector<SequenceInput> batch;
    for (const Entry& e : steps[step]) batch.push_back(e.input);
    const std::vector<float> got = host_floats(batched.forward(batch));
    size_t row = 0;
    for (const Entry& e : steps[step]) {
      SequenceInput lone = e.input;
      lone.blocks = Span<const int32_t>(&kBlocks[0], 1);
      const std::vector<float> want =
          host_floats(alone[static_cast<size_t>(e.sequence)]->forward(
              Span<const SequenceInput>(&lone, 1)));
      const size_t n = want.size() / V;
      ASSERT_EQ(static_cast<int64_t>(n), logit_rows(e.input));
      if (n == 0) continue;
      ASSERT_GE(got.size(), (row + n) * V) << "step " << step;
      EXPECT_LE(relative_difference(rows_of(got, V, row, n), want), tolerance)
          << "step " << step << ", sequence " << e.sequence;
      row += n;
    }
    EXPECT_EQ(got.size(), row * V) << "step " << step;
  }
}

class BatchTest : public ::testing::TestWithParam<std::string> {};

// Three prompts of 14, 40 and 23 tokens prefilled together in blocks 2, 0 and 1 (16-token passes),
// then a step that decodes two of them beside the third's next prefill chunk, then a decode step
// of all three.
std::vector<std::vector<Entry>> three_sequence_schedule(const Golden& g) {
  static std::vector<std::vector<int32_t>> ids;  // the spans' tokens outlive the schedule
  const std::vector<int32_t>& chat = g.at("chat.ids").i32;
  const std::vector<int32_t>& long_ids = g.at("long.ids").i32;
  ids = {chat,
         std::vector<int32_t>(long_ids.begin(), long_ids.begin() + 40),
         std::vector<int32_t>(long_ids.begin() + 100, long_ids.begin() + 123),
         {g.at("chat.greedy").i32[0]},
         {long_ids[40]},
         std::vector<int32_t>(long_ids.begin() + 123, long_ids.begin() + 126),
         {17},
         {long_ids[41]},
         {5}};
  const auto& [a, b, c, a1, b1, c1, a2, b2, c2] =
      std::tie(ids[0], ids[1], ids[2], ids[3], ids[4], ids[5], ids[6], ids[7], ids[8]);
  const int64_t A = static_cast<int64_t>(a.size()), B = 40, C = 23;
  return {
      {{0, span_in(a, 0, 2, LogitRows::kAll)},
       {1, span_in(b, 0, 0, LogitRows::kLast)},
       {2, span_in(c, 0, 1, LogitRows::kNone)}},
      {{0, span_in(a1, A, 2)}, {2, span_in(c1, C, 1, LogitRows::kAll)}, {1, span_in(b1, B, 0)}},
      {{1, span_in(b2, B + 1, 0)}, {2, span_in(c2, C + 3, 1)}, {0, span_in(a2, A + 1, 2)}},
  };
}

// `steps` with each sequence's blocks replaced by its table.
std::vector<std::vector<Entry>> paged(std::vector<std::vector<Entry>> steps,
                                      const std::vector<std::vector<int32_t>>& tables) {
  for (std::vector<Entry>& step : steps) {
    for (Entry& e : step) e.input.blocks = tables[static_cast<size_t>(e.sequence)];
  }
  return steps;
}

TEST_P(BatchTest, SequencesInABatchMatchEachAlone) {
  const Golden g = Golden::load(GetParam());
  const std::vector<std::vector<Entry>> steps = three_sequence_schedule(g);
  std::unique_ptr<Model> batched = load(GetParam(), batch_options(3));
  ASSERT_NE(batched, nullptr);
  expect_batches_match_lone_runs(*batched, steps, 3,
                                 [&] { return load(GetParam(), batch_options(1)); });

  // The same schedule over a paged pool: 8-token blocks, each sequence's scattered over it.
  const std::vector<std::vector<int32_t>> tables = scrambled_tables(3);
  std::unique_ptr<Model> pool = load(GetParam(), batch_options(3, 8));
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->kv_blocks(), 3 * 128 / 8);
  expect_batches_match_lone_runs(*pool, paged(steps, tables), 3,
                                 [&] { return load(GetParam(), batch_options(1)); });
}

// Each entry gets what it asks for: none, its last row or all its rows, in batch order; a lone
// decode step likewise.
TEST_P(BatchTest, EachSequenceGetsTheLogitsRowsItAsksFor) {
  const Golden g = Golden::load(GetParam());
  const std::vector<int32_t>& ids = g.at("chat.ids").i32;
  std::unique_ptr<Model> model = load(GetParam(), batch_options(4));
  ASSERT_NE(model, nullptr);
  const size_t V = static_cast<size_t>(model->config().vocab_size), T = ids.size();
  const std::vector<float> all = host_floats(model->forward(ids, 0, true));
  ASSERT_EQ(all.size(), T * V);
  const std::vector<SequenceInput> batch = {
      span_in(ids, 0, 0, LogitRows::kNone), span_in(ids, 0, 1, LogitRows::kAll),
      span_in(ids, 0, 2, LogitRows::kLast), span_in(ids, 0, 3, LogitRows::kNone)};
  const std::vector<float> got = host_floats(model->forward(batch));
  ASSERT_EQ(got.size(), (T + 1) * V);
  EXPECT_LE(relative_difference(rows_of(got, V, 0, T), all), 1e-6);
  EXPECT_LE(relative_difference(rows_of(got, V, T, 1), rows_of(all, V, T - 1, 1)), 1e-6);

  const std::vector<int32_t> next = {7};
  for (LogitRows rows : {LogitRows::kNone, LogitRows::kLast, LogitRows::kAll}) {
    const SequenceInput step = span_in(next, static_cast<int64_t>(T), 1, rows);
    Result<Tensor> logits = model->forward(Span<const SequenceInput>(&step, 1));
    ASSERT_OK(logits);
    EXPECT_EQ(logits->dim(0), rows == LogitRows::kNone ? 0 : 1);
    EXPECT_EQ(logits->dim(1), model->config().vocab_size);
  }
  const std::vector<SequenceInput> quiet = {span_in(ids, 0, 0, LogitRows::kNone),
                                            span_in(next, static_cast<int64_t>(T), 1,
                                                    LogitRows::kNone)};
  Result<Tensor> none = model->forward(quiet);
  ASSERT_OK(none);
  EXPECT_EQ(none->dim(0), 0);
}

// The three-sequence schedule run twice on fresh models of `make`: as it is, and with the last
// token of every entry after the first step a placeholder (0) fed from a tokens tensor on the
// model's device (SequenceInput::fed), the tokens in scrambled rows among others; a multi-token
// chunk and single decode tokens are fed, one entry of each step keeps its own. The logits must
// be the same bit for bit.
template <typename Make>
void expect_fed_tokens_stand_in_for_placeholders(const Golden& g, Make make) {
  std::vector<std::vector<Entry>> steps = three_sequence_schedule(g);
  // Two more decode steps of all three (on CUDA a graph bucket's capture, then its replay).
  static const std::vector<int32_t> next[] = {{11}, {12}, {13}, {14}, {15}, {16}};
  const int64_t A = static_cast<int64_t>(g.at("chat.ids").i32.size()), B = 40, C = 23;
  for (int64_t k = 0; k < 2; ++k) {
    steps.push_back({{2, span_in(next[3 * k], C + 4 + k, 1)},
                     {0, span_in(next[3 * k + 1], A + 2 + k, 2)},
                     {1, span_in(next[3 * k + 2], B + 2 + k, 0)}});
  }
  std::unique_ptr<Model> plain = make(), fed = make();
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(fed, nullptr);
  std::deque<std::vector<int32_t>> placeholders;  // the spans' tokens outlive each step
  for (size_t step = 0; step < steps.size(); ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    std::vector<SequenceInput> batch, with_fed;
    std::vector<int32_t> tokens(2 * steps[step].size() + 3, 1);  // rows not named hold 1
    for (size_t i = 0; i < steps[step].size(); ++i) {
      const SequenceInput& in = steps[step][i].input;
      batch.push_back(in);
      SequenceInput f = in;
      if (step > 0 && i + 1 < steps[step].size()) {  // the last entry keeps its own token
        placeholders.emplace_back(in.tokens.begin(), in.tokens.end());
        placeholders.back().back() = 0;
        f.tokens = placeholders.back();
        f.fed = static_cast<int64_t>(2 * i + 1);
        tokens[static_cast<size_t>(f.fed)] = in.tokens[in.tokens.size() - 1];
      }
      with_fed.push_back(f);
    }
    const Tensor host = Tensor::view(tokens.data(), {static_cast<int64_t>(tokens.size())},
                                     DataType::kInt32, DeviceType::kCpu);
    Result<Tensor> on_device = host.to(fed->options().device);
    ASSERT_OK(on_device);
    const std::vector<float> want = host_floats(plain->forward(batch));
    const std::vector<float> got = host_floats(fed->forward(with_fed, *on_device));
    ASSERT_FALSE(want.empty());
    EXPECT_EQ(relative_difference(got, want), 0.0);
  }
  // A fed entry needs the tokens, and its row must be in them.
  const std::vector<int32_t> one = {0};
  SequenceInput decode = span_in(one, 30, 0);
  decode.fed = 0;
  EXPECT_NE(fed->forward(Span<const SequenceInput>(&decode, 1)).status().message().find(
                "fed tokens (none given)"),
            std::string::npos);
  Result<Tensor> two = Tensor::empty({2}, DataType::kInt32, fed->options().device);
  ASSERT_OK(two);
  decode.fed = 2;
  EXPECT_NE(fed->forward(Span<const SequenceInput>(&decode, 1), *two).status().message().find(
                "its last token is row 2 of the fed tokens"),
            std::string::npos);
}

TEST_P(BatchTest, FedTokensStandInForTheirPlaceholders) {
  expect_fed_tokens_stand_in_for_placeholders(Golden::load(GetParam()),
                                              [&] { return load(GetParam(), batch_options(3)); });
}

// Every invalid entry is an error naming it, and no entry of the batch runs: block 0's cache still
// holds the prompt afterwards, so the next token's logits are those of a clean run.
TEST_P(BatchTest, InvalidEntriesAreErrorsThatWriteNothing) {
  const Golden g = Golden::load(GetParam());
  const std::vector<int32_t>& ids = g.at("chat.ids").i32;
  const int64_t T = static_cast<int64_t>(ids.size());
  std::unique_ptr<Model> model = load(GetParam(), batch_options(2));
  ASSERT_NE(model, nullptr);
  ASSERT_OK(model->forward(ids, 0, false));

  const std::vector<int32_t> other(ids.rbegin(), ids.rend());  // would overwrite block 0
  const std::vector<int32_t> five = {1, 2, 3, 4, 5}, none;
  const std::vector<int32_t> outside = {static_cast<int32_t>(model->config().vocab_size)};
  const std::vector<int32_t> positions(15, 0);
  SequenceInput bad_block = span_in(five, 0, 1);
  bad_block.blocks = Span<const int32_t>(&kBlocks[2], 1);
  SequenceInput offset = span_in(five, 0, 1);
  offset.rope_offset = -1;
  SequenceInput rope3 = span_in(five, 0, 1);
  rope3.rope_positions = positions;
  ImageFeatures features;
  SequenceInput image = span_in(five, 0, 1);
  image.image = &features;
  const std::vector<std::pair<SequenceInput, std::string>> cases = {
      {bad_block, "forward: sequence 1: block id 2 is outside the KV pool of 2 blocks"},
      {span_in(five, 0, -1),
       "forward: sequence 1: the block table holds 0 blocks; positions 0..5 need 1 of 128 tokens"},
      {span_in(five, 125, 1), "forward: sequence 1: positions 125..130 exceed the context of 128 tokens"},
      {span_in(five, -1, 1), "forward: sequence 1: positions -1..4 exceed the context of 128 tokens"},
      {span_in(outside, 0, 1), "forward: sequence 1: token id " + std::to_string(outside[0]) +
                                   " is outside the vocabulary (" + std::to_string(outside[0]) + ")"},
      {span_in(none, 0, 1), "forward: sequence 1: no tokens"},
      {span_in(five, 0, 0), "forward: KV block 0 is written by two sequences of the batch"},
      {offset, "forward: sequence 1: rotary positions -1 + [0, 5) are outside [0, 2^31)"},
      {rope3, "forward: sequence 1: 3-D positions are for M-RoPE models; a " +
                  std::string(architecture_name(model->config().arch)) +
                  " model rotates at 1-D positions"},
      {image, "forward: sequence 1: a " + std::string(architecture_name(model->config().arch)) +
                  " model takes no images"},
  };
  for (const auto& [entry, message] : cases) {
    const std::vector<SequenceInput> batch = {span_in(other, 0, 0), entry};
    Result<Tensor> r = model->forward(batch);
    EXPECT_EQ(r.status().message(), message);
  }
  EXPECT_EQ(model->forward(Span<const SequenceInput>()).status().message(),
            "forward: the batch is empty");

  std::unique_ptr<Model> clean = load(GetParam(), batch_options(1));
  ASSERT_NE(clean, nullptr);
  ASSERT_OK(clean->forward(ids, 0, false));
  const std::vector<int32_t> next = {g.at("chat.greedy").i32[0]};
  EXPECT_LE(relative_difference(host_floats(model->forward(next, T, false)),
                                host_floats(clean->forward(next, T, false))),
            1e-6);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BatchTest, ::testing::Values("qwen3-tiny", "qwen2-tiny"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "qwen3-tiny" ? "qwen3_tiny" : "qwen2_tiny";
                         });

TEST(BatchOptions, RefusesNoSequences) {
  ModelOptions o = batch_options(0);
  Result<std::unique_ptr<Model>> m =
      Model::load(converted_fixture("qwen3-tiny", DataType::kFp32), o);
  EXPECT_EQ(m.status().message(), "max_sequences must be at least 1, not 0");
}

// Qwen3-VL: the image prompt (golden vision features, 3-D positions) in block 1 and the text chat
// prompt in block 0, prefilled in one batch, then decoded together (the image sequence rotating at
// its rope delta); then the image prompt again in block 0 in two chunks that split the image, each
// passing its slice of the feature rows, beside a decode step of the text in block 1.
class VlBatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_ = std::make_unique<Golden>(Golden::load("qwen3-vl-tiny"));
    const ModelConfig probe = load_vl(1)->config();
    img_ = g_->at("img.ids").i32;
    const std::vector<int32_t>& grid = g_->at("image.grid_thw_fast").i32;
    Result<RopeIndex> index = qwen3_vl_rope_index(img_, probe.image_token_id,
                                                  probe.vision->spatial_merge_size,
                                                  {{grid[0], grid[1], grid[2]}});
    ASSERT_OK(index);
    index_ = *index;
    features_.embeds = tensor("image.vision_embeds");
    features_.deepstack = {tensor("image.deepstack0"), tensor("image.deepstack1")};
  }
  std::unique_ptr<Model> load_vl(int64_t sequences) {
    return load("qwen3-vl-tiny", batch_options(sequences));
  }
  Tensor tensor(const std::string& name) const {
    const GoldenTensor& t = g_->at(name);
    Tensor out = Tensor::empty(t.shape, DataType::kFp32).value();
    std::copy(t.f32.begin(), t.f32.end(), out.data<float>());
    return out;
  }
  // Tokens [begin, end) of the image prompt at block `block`, with their 3-D positions and the
  // feature rows of their image tokens.
  SequenceInput image_span(int64_t begin, int64_t end, int block, LogitRows rows) {
    pieces_.emplace_back(img_.begin() + begin, img_.begin() + end);
    rope_.emplace_back();
    for (int a = 0; a < 3; ++a) {
      const auto axis = index_.positions.begin() + a * static_cast<int64_t>(img_.size());
      rope_.back().insert(rope_.back().end(), axis + begin, axis + end);
    }
    SequenceInput s = span_in(pieces_.back(), begin, block, rows);
    s.rope_positions = rope_.back();
    s.image = &features_;
    s.image_row = std::max<int64_t>(0, std::min(begin - index_.spans[0].first, index_.spans[0].second));
    return s;
  }

  std::unique_ptr<Golden> g_;
  std::vector<int32_t> img_;
  RopeIndex index_;
  ImageFeatures features_;
  std::deque<std::vector<int32_t>> pieces_, rope_;  // what the spans view
};

TEST_F(VlBatchTest, ImageSequenceBesideTextMatchesEachAlone) {
  const std::vector<int32_t>& chat = g_->at("chat.ids").i32;
  const int64_t I = static_cast<int64_t>(img_.size()), C = static_cast<int64_t>(chat.size());
  const std::vector<int32_t> i1 = {g_->at("img.greedy").i32[0]}, c1 = {g_->at("chat.greedy").i32[0]};
  SequenceInput image_next = span_in(i1, I, 1);
  image_next.rope_offset = index_.delta;
  const int64_t split = index_.spans[0].first + 30;  // inside the image's 70 pad tokens
  std::vector<std::vector<Entry>> steps = {
      {{1, span_in(chat, 0, 0, LogitRows::kAll)}, {0, image_span(0, I, 1, LogitRows::kAll)}},
      {{0, image_next}, {1, span_in(c1, C, 0)}},
  };
  std::unique_ptr<Model> batched = load_vl(2);
  ASSERT_NE(batched, nullptr);
  expect_batches_match_lone_runs(*batched, steps, 2, [&] { return load_vl(1); });

  // The image prompt in two chunks in block 0 (rewriting it), beside the text's decode in block 1.
  const std::vector<int32_t> c2 = {g_->at("chat.greedy").i32[1]};
  steps = {
      {{0, image_span(0, split, 0, LogitRows::kAll)}, {1, span_in(chat, 0, 1, LogitRows::kNone)}},
      {{1, span_in(c1, C, 1)}, {0, image_span(split, I, 0, LogitRows::kAll)}},
      {{1, span_in(c2, C + 1, 1)}},
  };
  std::unique_ptr<Model> again = load_vl(2);
  ASSERT_NE(again, nullptr);
  expect_batches_match_lone_runs(*again, steps, 2, [&] { return load_vl(1); });
}

TEST_F(VlBatchTest, ImageEntriesThatDoNotFitAreErrors) {
  std::unique_ptr<Model> model = load_vl(2);
  ASSERT_NE(model, nullptr);
  const int64_t I = static_cast<int64_t>(img_.size());
  auto message = [&](const SequenceInput& s) {
    return model->forward(Span<const SequenceInput>(&s, 1)).status().message();
  };
  SequenceInput late = image_span(0, I, 0, LogitRows::kLast);
  late.image_row = 1;
  EXPECT_EQ(message(late), "forward: the span's 70 image tokens take feature rows 1..71 of 70");
  SequenceInput flat = image_span(0, I, 0, LogitRows::kLast);
  flat.rope_positions = Span<const int32_t>(rope_.back().data(), static_cast<size_t>(I));
  EXPECT_EQ(message(flat), "forward: 3-D positions must be [3, 84] for 84 tokens, got 84 values");
  SequenceInput one_d = image_span(0, I, 0, LogitRows::kLast);
  one_d.rope_positions = Span<const int32_t>();
  EXPECT_EQ(message(one_d), "forward: a span holding image tokens needs 3-D positions");
  ImageFeatures bad = features_;
  bad.deepstack[1] = bad.deepstack[1].rows(0, 69);
  SequenceInput short_deepstack = image_span(0, I, 0, LogitRows::kLast);
  short_deepstack.image = &bad;
  EXPECT_EQ(message(short_deepstack),
            "forward: deepstack feature 1 must be [70, 128], got fp32[69,128]@cpu");
  const int64_t layers = model->config().num_layers;
  bad.deepstack.assign(static_cast<size_t>(layers + 1), features_.embeds);
  EXPECT_EQ(message(short_deepstack), "forward: more deepstack features (" +
                                          std::to_string(layers + 1) + ") than decoder layers (" +
                                          std::to_string(layers) + ")");
}

// The decode graphs are per KV block: two sequences decoding in turns and together, through the
// graphs, give the eager logits.
TEST(CudaModelBatch, GraphDecodeOfTwoBlocksMatchesEager) {
  SKIP_WITHOUT_CUDA();
  for (const char* fixture : {"qwen3-tiny", "qwen3-vl-tiny"}) {
    SCOPED_TRACE(fixture);
    const Golden g = Golden::load(fixture);
    const std::vector<int32_t>& ids = g.at("chat.ids").i32;
    const int64_t T = static_cast<int64_t>(ids.size());
    const std::vector<int32_t> first(ids.begin(), ids.begin() + T / 2);
    std::vector<std::unique_ptr<Model>> models;
    for (bool graph : {false, true}) {
      ModelOptions o = batch_options(2);
      o.device = DeviceType::kCuda;
      o.cuda_graph = graph;
      models.push_back(load(fixture, o));
      ASSERT_NE(models.back(), nullptr);
    }
    std::vector<std::vector<float>> logits[2];
    for (size_t m = 0; m < 2; ++m) {
      Model& model = *models[m];
      const std::vector<SequenceInput> prefill = {span_in(ids, 0, 1), span_in(first, 0, 0)};
      ASSERT_OK(model.forward(prefill));
      for (int64_t i = 0; i < 6; ++i) {
        // Any valid ids serve; the VL chat prompt is shorter than T / 2 + 6, so wrap around.
        const std::vector<int32_t> a = {ids[static_cast<size_t>(i % T)]},
                                   b = {ids[static_cast<size_t>((T / 2 + i) % T)]};
        const SequenceInput sa = span_in(a, T + i, 1), sb = span_in(b, T / 2 + i, 0);
        // Alternate lone steps of each block with steps of both.
        if (i % 2 == 0) {
          logits[m].push_back(host_floats(model.forward(Span<const SequenceInput>(&sa, 1))));
          logits[m].push_back(host_floats(model.forward(Span<const SequenceInput>(&sb, 1))));
        } else {
          const std::vector<SequenceInput> both = {sb, sa};
          logits[m].push_back(host_floats(model.forward(both)));
        }
      }
    }
    ASSERT_EQ(logits[0].size(), logits[1].size());
    for (size_t i = 0; i < logits[0].size(); ++i) {
      EXPECT_LE(relative_difference(logits[1][i], logits[0][i]), 1e-5) << "step " << i;
    }
  }
}

// Fed tokens on CUDA, eager and through the decode graphs (the last step is three decode tokens:
// a graph bucket).
TEST(CudaModelBatch, FedTokensStandInForTheirPlaceholders) {
  SKIP_WITHOUT_CUDA();
  for (const bool graph : {false, true}) {
    SCOPED_TRACE(graph ? "graph" : "eager");
    expect_fed_tokens_stand_in_for_placeholders(Golden::load("qwen3-tiny"), [&] {
      ModelOptions o = batch_options(3);
      o.device = DeviceType::kCuda;
      o.cuda_graph = graph;
      return load("qwen3-tiny", o);
    });
  }
}

// A decode graph's block tables are as wide as the whole context (4096 tokens of 8-token blocks:
// 512 entries a sequence, most of them pad); a step of many sequences that use a few entries
// each must still give the eager logits (whose tables are only as wide as the pass needs), as the
// used width grows and as fewer sequences run in the same bucket.
TEST(CudaModelBatch, GraphDecodeInWideTablesMatchesEager) {
  SKIP_WITHOUT_CUDA();
  const Golden g = Golden::load("qwen3-tiny");
  const std::vector<int32_t>& ids = g.at("chat.ids").i32;
  constexpr int kSequences = 32, kBlocksEach = 8, kSteps = 6;
  std::vector<std::vector<int32_t>> prompts, tables;
  for (int i = 0; i < kSequences; ++i) {
    const size_t n = 3 + static_cast<size_t>(i * 5) % 30;  // 3 to 32 tokens
    prompts.emplace_back();
    for (size_t t = 0; t < n; ++t) prompts.back().push_back(ids[t % ids.size()]);  // any valid ids
    tables.emplace_back();
    for (int j = 0; j < kBlocksEach; ++j) tables.back().push_back(j * kSequences + i);
  }
  auto entry = [&](int i, Span<const int32_t> tokens, int64_t start) {
    SequenceInput s;
    s.tokens = tokens;
    s.start = start;
    s.blocks = tables[static_cast<size_t>(i)];
    return s;
  };
  const std::vector<std::vector<int32_t>> original = prompts;
  std::vector<std::vector<float>> logits[2];
  for (int graph = 0; graph < 2; ++graph) {
    prompts = original;
    ModelOptions o;
    o.device = DeviceType::kCuda;
    o.max_context = 4096;
    o.max_sequences = kSequences;
    o.kv_block_size = 8;
    o.cuda_graph = graph == 1;
    std::unique_ptr<Model> model = load("qwen3-tiny", o);
    ASSERT_NE(model, nullptr);
    std::vector<SequenceInput> prefill;
    for (int i = 0; i < kSequences; ++i) prefill.push_back(entry(i, prompts[i], 0));
    ASSERT_OK(model->forward(prefill));
    std::vector<std::vector<int32_t>> next(kSequences);
    for (int step = 0; step < kSteps; ++step) {
      // Every sequence, except at odd steps only the first 17 (the bucket of 32 with pads).
      const int running = step % 2 == 0 ? kSequences : 17;
      std::vector<SequenceInput> batch;
      for (int i = 0; i < running; ++i) {
        std::vector<int32_t>& p = prompts[static_cast<size_t>(i)];
        next[static_cast<size_t>(i)] = {ids[(p.size() * 3 + 1) % ids.size()]};
        batch.push_back(entry(i, next[static_cast<size_t>(i)], static_cast<int64_t>(p.size())));
      }
      logits[graph].push_back(host_floats(model->forward(batch)));
      for (int i = 0; i < running; ++i) {
        prompts[static_cast<size_t>(i)].push_back(next[static_cast<size_t>(i)][0]);
      }
    }
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  for (size_t i = 0; i < logits[0].size(); ++i) {
    ASSERT_EQ(logits[0][i].size(), logits[1][i].size());
    EXPECT_LE(relative_difference(logits[1][i], logits[0][i]), 1e-5) << "step " << i;
  }
}

// The paged schedule on the GPU in fp32, through the decode graphs (the three-sequence decode
// step runs in the bucket of four, one pad sequence) and eagerly, for every attention kind:
// each entry's rows match its sequence run alone.
TEST(CudaModelBatch, PagedScheduleMatchesEachAloneOnEveryKind) {
  SKIP_WITHOUT_CUDA();
  const Golden g = Golden::load("qwen3-tiny");
  const std::vector<std::vector<int32_t>> tables = scrambled_tables(3);  // the spans' blocks
  const std::vector<std::vector<Entry>> steps = paged(three_sequence_schedule(g), tables);
  for (AttentionKind kind : {AttentionKind::kFlash2, AttentionKind::kFlash1, AttentionKind::kMha}) {
    for (bool graph : {false, true}) {
      SCOPED_TRACE(std::string(attention_name(kind)) + (graph ? " graph" : " eager"));
      auto options = [&](int64_t sequences, int64_t block_size) {
        ModelOptions o = batch_options(sequences, block_size);
        o.device = DeviceType::kCuda;
        o.attention = kind;
        o.cuda_graph = graph;
        return o;
      };
      std::unique_ptr<Model> pool = load("qwen3-tiny", options(3, 8));
      ASSERT_NE(pool, nullptr);
      expect_batches_match_lone_runs(*pool, steps, 3,
                                     [&] { return load("qwen3-tiny", options(1, 128)); }, 1e-4);
    }
  }
}

// Many sequences in fp16 on the GPU, past the multi-row tensor-core GEMV's 8 rows (cuBLAS, and
// op::linear's compositions): prompts of different lengths prefilled each in its own pass, then
// decode steps of all of them together, eagerly and through the decode graphs. Each sequence's logits match its lone run's within fp16's rounding (a batch's
// products add in another order than one row's, and its prefill passes of 5 to 24 tokens take
// the same kernels as decode steps of that many sequences).
TEST(CudaModelBatch, HalfPrecisionDecodeOfManySequencesMatchesEachAlone) {
  SKIP_WITHOUT_CUDA();
  const Golden g = Golden::load("qwen3-tiny");
  const std::vector<int32_t>& long_ids = g.at("long.ids").i32;
  for (const int n : {12, 16, 20}) {
    for (const bool graph : {false, true}) {
      SCOPED_TRACE(std::to_string(n) + " sequences" + (graph ? ", graph" : ", eager"));
      auto options = [&](int64_t sequences, int64_t block_size) {
        ModelOptions o = batch_options(sequences, block_size);
        o.device = DeviceType::kCuda;
        o.activation = DataType::kFp16;
        o.cuda_graph = graph;
        return o;
      };
      auto load16 = [&](const ModelOptions& o) -> std::unique_ptr<Model> {
        Result<std::unique_ptr<Model>> model =
            Model::load(converted_fixture("qwen3-tiny", DataType::kFp16), o);
        EXPECT_OK(model);
        return model.ok() ? std::move(model).value() : nullptr;
      };
      std::unique_ptr<Model> batched = load16(options(n, 8));
      ASSERT_NE(batched, nullptr);
      const std::vector<std::vector<int32_t>> tables = scrambled_tables(n);
      // Sequence i: 5 + i tokens from its own place in the long prompt, then 3 decode steps.
      static std::vector<std::vector<int32_t>> ids;
      ids.clear();
      for (int i = 0; i < n; ++i) {
        ids.emplace_back(long_ids.begin() + 3 * i, long_ids.begin() + 3 * i + 5 + i);
      }
      for (int step = 0; step < 3; ++step) {
        for (int i = 0; i < n; ++i) ids.push_back({long_ids[200 + 7 * i + step]});
      }
      std::vector<std::vector<Entry>> steps;
      for (int i = 0; i < n; ++i) steps.push_back({{i, span_in(ids[i], 0, -1)}});
      for (int step = 0; step < 3; ++step) {
        std::vector<Entry> decode;
        for (int i = 0; i < n; ++i) {
          decode.push_back({i, span_in(ids[n * (step + 1) + i], 5 + i + step, -1)});
        }
        steps.push_back(decode);
      }
      expect_batches_match_lone_runs(*batched, paged(steps, tables), n,
                                     [&] { return load16(options(1, 128)); }, 2e-2);
    }
  }
}

}  // namespace
}  // namespace kuiper::test
