#include "server/spec/size.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

TEST(SizeTest, ParsesUnitsAndPlainBytes) {
  EXPECT_EQ(*ParseSize("512MiB"), 512ull << 20);
  EXPECT_EQ(*ParseSize("4GiB"), 4ull << 30);
  EXPECT_EQ(*ParseSize("4 gib"), 4ull << 30);
  EXPECT_EQ(*ParseSize("1.5GiB"), 3ull << 29);
  EXPECT_EQ(*ParseSize("100KB"), 100000u);
  EXPECT_EQ(*ParseSize("2GB"), 2000000000u);
  EXPECT_EQ(*ParseSize("256Mi"), 256ull << 20);
  EXPECT_EQ(*ParseSize("64B"), 64u);
  EXPECT_EQ(*ParseSize("12345"), 12345u);
}

TEST(SizeTest, RejectsWhatIsNotASize) {
  for (const char* bad : {"", "MiB", "-1GiB", "lots", "1.2.3MB", "5 parsecs", "1e400", "0x10"}) {
    absl::StatusOr<uint64_t> s = ParseSize(bad);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_FALSE(ParseSize("20000000TiB").ok());
}

TEST(SizeTest, FormatsReadably) {
  EXPECT_EQ(FormatSize(512ull << 20), "512 MiB");
  EXPECT_EQ(FormatSize(3ull << 29), "1.5 GiB");
  EXPECT_EQ(FormatSize(100), "100 B");
}

}  // namespace
}  // namespace ferry
