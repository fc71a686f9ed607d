#include "engine/common/status_macros.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::Status Check(int x) {
  if (x < 0) return absl::OutOfRangeError("negative");
  return absl::OkStatus();
}

absl::StatusOr<int> Quarter(int x) {
  RETURN_IF_ERROR(Check(x));
  ASSIGN_OR_RETURN(int half, Half(x));
  ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

TEST(StatusMacrosTest, PassesValuesAndErrorsThrough) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Quarter(-4).status().code(), absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace ferry
