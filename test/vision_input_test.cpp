// The image placeholders of a prompt: placeholder text, image-pad expansion and the checks of
// pad runs against the images, and the chat session's rendering of a message with images.
#include <gtest/gtest.h>

#include "kuiper/runtime/chat_session.h"
#include "kuiper/runtime/vision_input.h"
#include "support/assertions.h"
#include "support/golden.h"
#include "support/paths.h"
#include "support/cli.h"

namespace kuiper {
namespace {

constexpr int32_t kPad = 151655;

TEST(VisionInput, PlaceholdersComeBeforeTheText) {
  EXPECT_EQ(with_image_placeholders("Hi", 0), "Hi");
  EXPECT_EQ(with_image_placeholders("Describe.", 2),
            "<|vision_start|><|image_pad|><|vision_end|>"
            "<|vision_start|><|image_pad|><|vision_end|>Describe.");
}

TEST(VisionInput, EachPadBecomesItsImagesTokenCount) {
  Result<std::vector<int32_t>> ids = expand_image_pads({1, 7, kPad, 8, 2, 7, kPad, 8}, kPad, {3, 1});
  ASSERT_OK(ids);
  EXPECT_EQ(*ids, (std::vector<int32_t>{1, 7, kPad, kPad, kPad, 8, 2, 7, kPad, 8}));
  // No images, no pads: unchanged.
  ids = expand_image_pads({1, 2, 3}, kPad, {});
  ASSERT_OK(ids);
  EXPECT_EQ(*ids, (std::vector<int32_t>{1, 2, 3}));
}

TEST(VisionInput, PadCountMismatchIsAnError) {
  Result<std::vector<int32_t>> ids = expand_image_pads({1, kPad, 2}, kPad, {});
  ASSERT_FALSE(ids.ok());
  EXPECT_NE(ids.status().message().find("1 <|image_pad|> token for 0 images"), std::string::npos)
      << ids.status().message();
  EXPECT_NE(ids.status().message().find("written in the text"), std::string::npos);
  ids = expand_image_pads({1, kPad, 2}, kPad, {4, 4});
  ASSERT_FALSE(ids.ok());
  EXPECT_NE(ids.status().message().find("for 2 images"), std::string::npos)
      << ids.status().message();
}

TEST(VisionInput, PadRunsAreCheckedAgainstTheImages) {
  const std::vector<int32_t> ids = {1, kPad, kPad, 2, 3, kPad, 4};
  const std::vector<std::pair<size_t, size_t>> runs = image_pad_runs(ids, kPad);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0], (std::pair<size_t, size_t>{1, 3}));
  EXPECT_EQ(runs[1], (std::pair<size_t, size_t>{5, 6}));
  EXPECT_OK(check_image_pads(ids, kPad, {2, 1}));
  const Status wrong = check_image_pads(ids, kPad, {2, 4});
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.message().find("image 2 needs 4"), std::string::npos) << wrong.message();
  EXPECT_NE(wrong.message().find("position 5 has 1"), std::string::npos) << wrong.message();
  const Status count = check_image_pads(ids, kPad, {2});
  ASSERT_FALSE(count.ok());
  EXPECT_NE(count.message().find("2 runs"), std::string::npos) << count.message();
  EXPECT_FALSE(check_image_pads({1, kPad}, kPad, {}).ok());
  EXPECT_OK(check_image_pads({1, 2}, kPad, {}));
}

TEST(VisionInput, ImageTokensFollowTheMergeSize) {
  ModelConfig config;
  ProcessedImage image;
  image.grid = {1, 14, 20};
  EXPECT_EQ(image_tokens(config, {image}), std::vector<int64_t>{0});  // no vision tower
  config.vision = VisionConfig();
  config.vision->spatial_merge_size = 2;
  EXPECT_EQ(image_tokens(config, {image, image}), (std::vector<int64_t>{70, 70}));
}

// The prompt the goldens were made with: the test image then "Describe this image.", rendered
// by the Qwen3 chat template the fixture's model file carries, gives img.ids once the pad is
// expanded to the golden grid's merged token count.
TEST(VisionInput, GoldenImagePromptRendersToTheGoldenIds) {
  const test::Golden golden = test::Golden::load("qwen3-vl-tiny");
  const std::vector<int32_t>& want = golden.at("img.ids").i32;
  const std::vector<int32_t>& grid = golden.at("image.grid_thw_slow").i32;
  ProcessedImage image;
  image.grid = {grid[0], grid[1], grid[2]};
  Result<Tokenizer> tokenizer =
      Tokenizer::from_json(test::read_text(test::tokenizer_dir() + "/tokenizer.json"));
  ASSERT_OK(tokenizer);
  Result<ChatTemplate> chat_template = ChatTemplate::from_tokenizer_config(
      test::read_text(test::tokenizer_dir() + "/tokenizer_config.json"));
  ASSERT_OK(chat_template);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  messages.push_back(
      {{"role", "user"}, {"content", with_image_placeholders("Describe this image.", 1)}});
  Result<std::vector<int32_t>> ids = encode_chat(*chat_template, *tokenizer, messages, {});
  ASSERT_OK(ids);
  ModelConfig config;
  config.vision = VisionConfig();
  config.vision->spatial_merge_size = 2;
  ids = expand_image_pads(*ids, kPad, image_tokens(config, {image}));
  ASSERT_OK(ids);
  EXPECT_EQ(*ids, want);
}

}  // namespace
}  // namespace kuiper
