#include "server/api/tokens.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace ferry {
namespace {

constexpr char kViewerToken[] = "v-0123456789abcdef";
constexpr char kSubmitterToken[] = "s-0123456789abcdef";

std::string ErrorOf(absl::string_view text) {
  absl::StatusOr<TokenTable> table = ParseTokens(text);
  EXPECT_FALSE(table.ok()) << "parsed: " << text;
  return table.ok() ? "" : std::string(table.status().message());
}

TEST(ParseTokens, RolesCommentsBlanksAndWhitespace) {
  const std::string text = std::string("# who may call ferryd\n") +
                           "\n"
                           "   \t  \n"
                           "viewer " + kViewerToken + "\n" +
                           "  # an indented comment\n" +
                           "\tsubmitter\t \t" + kSubmitterToken + "   \r\n" +
                           "# the end, no newline after the last line";
  absl::StatusOr<TokenTable> table = ParseTokens(text);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 2u);
  EXPECT_EQ(table->Count(Role::kViewer), 1u);
  EXPECT_EQ(table->Count(Role::kSubmitter), 1u);
  EXPECT_EQ(table->Find(kViewerToken), Role::kViewer);
  EXPECT_EQ(table->Find(kSubmitterToken), Role::kSubmitter);
  EXPECT_EQ(table->Find("v-0123456789abcde"), std::nullopt);    // a prefix
  EXPECT_EQ(table->Find("v-0123456789abcdef0"), std::nullopt);  // longer
  EXPECT_EQ(table->Find("V-0123456789ABCDEF"), std::nullopt);   // case matters
  EXPECT_EQ(table->Find(""), std::nullopt);
}

TEST(ParseTokens, ByteOrderMarkAndNoTrailingNewline) {
  absl::StatusOr<TokenTable> table = ParseTokens(std::string("\xEF\xBB\xBFviewer ") + kViewerToken);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->Find(kViewerToken), Role::kViewer);
}

TEST(ParseTokens, ErrorsNameTheLineAndNeverTheToken) {
  const std::string bad_role = ErrorOf(std::string("viewer ") + kViewerToken + "\nadmin " + kSubmitterToken);
  EXPECT_EQ(bad_role, "line 2: unknown role 'admin'; use viewer or submitter");

  // Token and role swapped: the first field could be a token, so it is not shown.
  const std::string swapped = ErrorOf(std::string(kSubmitterToken) + " submitter");
  EXPECT_NE(swapped.find("line 1: the first field is not a role"), std::string::npos) << swapped;
  EXPECT_EQ(swapped.find(kSubmitterToken), std::string::npos) << swapped;

  const std::string missing = ErrorOf("# header\nsubmitter\n");
  EXPECT_NE(missing.find("line 2: expected `ROLE TOKEN`, found one field"), std::string::npos) << missing;

  const std::string token_alone = ErrorOf(kSubmitterToken);
  EXPECT_NE(token_alone.find("line 1: expected `ROLE TOKEN`, found one field"), std::string::npos);
  EXPECT_EQ(token_alone.find(kSubmitterToken), std::string::npos) << token_alone;

  const std::string three = ErrorOf(std::string("viewer ") + kViewerToken + " # trailing comment");
  EXPECT_NE(three.find("line 1: expected `ROLE TOKEN`, found 5 fields"), std::string::npos) << three;
  EXPECT_EQ(three.find(kViewerToken), std::string::npos) << three;

  const std::string duplicate = ErrorOf(std::string("viewer ") + kViewerToken + "\n\nsubmitter " + kViewerToken);
  EXPECT_EQ(duplicate, "line 3: the same token as line 1; give each client its own token");
  EXPECT_FALSE(ParseTokens(std::string("viewer ") + kViewerToken + "\nviewer " + kViewerToken).ok());

  const std::string short_token = ErrorOf("submitter secret");
  EXPECT_NE(short_token.find("line 1: the token is 6 characters; use 16 to 4096"), std::string::npos)
      << short_token;
  EXPECT_EQ(short_token.find("secret"), std::string::npos) << short_token;

  EXPECT_FALSE(ParseTokens(std::string("viewer ") + std::string(kMaxTokenLength + 1, 'x')).ok());
  EXPECT_TRUE(ParseTokens(std::string("viewer ") + std::string(kMaxTokenLength, 'x')).ok());

  const std::string control = ErrorOf(std::string("viewer abcdefgh\x01ijklmnopq"));
  EXPECT_NE(control.find("line 1: the token has a character that is not visible ASCII at position 9"),
            std::string::npos)
      << control;
  EXPECT_FALSE(ParseTokens(std::string("viewer abcdefghij\xC3\xA9klmnopq")).ok());
  static constexpr char kWithNul[] = "viewer abcdefghij\0klmnopq";
  EXPECT_FALSE(ParseTokens(std::string(kWithNul, sizeof(kWithNul) - 1)).ok());
  // Roles are lower case, exactly.
  EXPECT_EQ(ErrorOf(std::string("Viewer ") + kViewerToken),
            "line 1: unknown role 'Viewer'; use viewer or submitter");
}

TEST(ParseTokens, NoTokensIsAnError) {
  EXPECT_NE(ErrorOf("").find("no tokens"), std::string::npos);
  EXPECT_NE(ErrorOf("# only comments\n\n   \n").find("no tokens"), std::string::npos);
}

TEST(ConstantTimeEquals, ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0", 2), "a"));
}

TEST(TokenTable, RoleAllows) {
  EXPECT_TRUE(RoleAllows(Role::kSubmitter, Role::kSubmitter));
  EXPECT_TRUE(RoleAllows(Role::kSubmitter, Role::kViewer));
  EXPECT_TRUE(RoleAllows(Role::kViewer, Role::kViewer));
  EXPECT_FALSE(RoleAllows(Role::kViewer, Role::kSubmitter));
  EXPECT_EQ(RoleName(Role::kViewer), "viewer");
  EXPECT_EQ(RoleName(Role::kSubmitter), "submitter");
}

TEST(ReadTokensFile, ErrorsStartWithThePath) {
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/tokens";
  {
    std::ofstream(path) << "viewer " << kViewerToken << "\nbogus\n";
  }
  absl::StatusOr<TokenTable> table = ReadTokensFile(path);
  ASSERT_FALSE(table.ok());
  EXPECT_EQ(table.status().message(), path + ": line 2: expected `ROLE TOKEN`, found one field; put "
                                             "the role (viewer or submitter) before the token");
  {
    std::ofstream(path) << "submitter " << kSubmitterToken << "\n";
  }
  table = ReadTokensFile(path);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->Find(kSubmitterToken), Role::kSubmitter);

  table = ReadTokensFile(dir + "/missing");
  ASSERT_FALSE(table.ok());
  EXPECT_NE(table.status().message().find("/missing: cannot open: No such file or directory"),
            std::string::npos)
      << table.status();
  table = ReadTokensFile(dir);
  ASSERT_FALSE(table.ok());
  EXPECT_NE(table.status().message().find("not a regular file"), std::string::npos) << table.status();
  std::remove(path.c_str());
}

}  // namespace
}  // namespace ferry
