#include "engine/device/device.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cmath>

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

TEST(DeviceTest, MeasuresAMatmulRateInEachType) {
  for (c10::ScalarType dtype : {c10::kFloat, c10::kBFloat16}) {
    const double flops = MeasureMatmulFlops(c10::Device(c10::kCPU), dtype, /*size=*/128, /*seconds=*/0.01);
    EXPECT_GT(flops, 0) << c10::toString(dtype);
    EXPECT_TRUE(std::isfinite(flops)) << c10::toString(dtype);
  }
}

}  // namespace
}  // namespace ferry
