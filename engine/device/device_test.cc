#include "engine/device/device.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>

namespace ferry {
namespace {

TEST(DeviceTest, ProbeListsTheCpuLast) {
  std::vector<DeviceDescription> devices = ProbeDevices();
  ASSERT_FALSE(devices.empty());
  EXPECT_EQ(devices.back().kind, "cpu");
  EXPECT_GT(devices.back().memory_bytes, 0u);
}

TEST(DeviceTest, ResolvesNames) {
  EXPECT_EQ(ResolveDevice("cpu")->type(), c10::kCPU);
  absl::StatusOr<c10::Device> automatic = ResolveDevice("auto");
  ASSERT_TRUE(automatic.ok());
  EXPECT_EQ(automatic->is_cuda(), torch::cuda::is_available());
  EXPECT_EQ(ResolveDevice("tpu").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveDevice("cuda:x").status().code(), absl::StatusCode::kInvalidArgument);
  if (!torch::cuda::is_available()) {
    EXPECT_EQ(ResolveDevice("cuda:0").status().code(), absl::StatusCode::kFailedPrecondition);
  }
}

}  // namespace
}  // namespace ferry
