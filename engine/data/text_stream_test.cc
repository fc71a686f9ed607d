#include "engine/data/text_stream.h"

#include <gtest/gtest.h>

#include "engine/data/byte_tokenizer.h"

namespace ferry {
namespace {

TEST(TextStreamTest, HoldsBackACharacterSplitAcrossTokens) {
  ByteTokenizer bytes;
  TextStream stream(&bytes);
  const std::string text = "a\xC3\xA9\xE2\x82\xAC!";  // a, é, €, !
  std::vector<std::string> pieces;
  for (unsigned char c : text) {
    absl::StatusOr<std::string> piece = stream.Push(c);
    ASSERT_TRUE(piece.ok()) << piece.status();
    pieces.push_back(*piece);
  }
  EXPECT_EQ(pieces, (std::vector<std::string>{"a", "", "\xC3\xA9", "", "", "\xE2\x82\xAC", "!"}));
  EXPECT_EQ(stream.Finish(), "");
}

TEST(TextStreamTest, AnIncompleteEndBecomesAReplacementCharacter) {
  ByteTokenizer bytes;
  TextStream stream(&bytes);
  EXPECT_EQ(*stream.Push('x'), "x");
  EXPECT_EQ(*stream.Push(0xE2), "");
  EXPECT_EQ(*stream.Push(0x82), "");
  EXPECT_EQ(stream.Finish(), "\xEF\xBF\xBD");
}

TEST(TextStreamTest, InvalidBytesAreReplacedAtOnce) {
  ByteTokenizer bytes;
  TextStream stream(&bytes);
  EXPECT_EQ(*stream.Push(0xFF), "\xEF\xBF\xBD");
  EXPECT_EQ(*stream.Push(0xC3), "");
  // Not a continuation: the held lead byte is invalid alone.
  EXPECT_EQ(*stream.Push('b'), "\xEF\xBF\xBD" "b");
  EXPECT_EQ(stream.Push(300).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Utf8Test, CompletePrefixAndSanitize) {
  EXPECT_EQ(CompleteUtf8Prefix("abc"), 3u);
  EXPECT_EQ(CompleteUtf8Prefix("ab\xF0\x9F\x98"), 2u);
  EXPECT_EQ(CompleteUtf8Prefix("ab\xF0\x9F\x98\x80"), 6u);
  EXPECT_EQ(SanitizeUtf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD") << "a surrogate";
  EXPECT_EQ(SanitizeUtf8("ok"), "ok");
}

}  // namespace
}  // namespace ferry
