#include "engine/device/device.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <chrono>

#ifdef FERRY_LIBTORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "engine/common/host_info.h"

namespace ferry {

std::vector<DeviceDescription> ProbeDevices() {
  std::vector<DeviceDescription> devices;
  const int64_t cuda_count = torch::cuda::is_available() ? torch::cuda::device_count() : 0;
  for (int64_t i = 0; i < cuda_count; ++i) {
    DeviceDescription d;
    d.kind = "cuda";
    d.name = absl::StrCat("cuda:", i);
    d.memory_bytes = DeviceMemoryTotalBytes(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)));
#ifdef FERRY_LIBTORCH_CUDA
    d.description = at::cuda::getDeviceProperties(static_cast<int>(i))->name;
#endif
    devices.push_back(d);
  }
  DeviceDescription cpu;
  cpu.kind = "cpu";
  cpu.name = "cpu";
  cpu.description = "host";
  cpu.memory_bytes = HostMemoryTotalBytes();
  devices.push_back(cpu);
  return devices;
}

absl::StatusOr<c10::Device> ResolveDevice(absl::string_view name) {
  const bool has_cuda = torch::cuda::is_available();
  if (name == "auto" || name.empty()) {
    return has_cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  }
  if (name == "cpu") return c10::Device(c10::kCPU);
  absl::string_view rest = name;
  if (!absl::ConsumePrefix(&rest, "cuda")) {
    return absl::InvalidArgumentError(
        absl::StrCat("device '", name, "': use auto, cpu, cuda or cuda:N"));
  }
  int index = 0;
  if (!rest.empty() && (!absl::ConsumePrefix(&rest, ":") || !absl::SimpleAtoi(rest, &index) ||
                        index < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("device '", name, "': use auto, cpu, cuda or cuda:N"));
  }
  if (!has_cuda) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device '", name, "': this LibTorch build or machine has no CUDA device; use cpu"));
  }
  if (index >= static_cast<int>(torch::cuda::device_count())) {
    return absl::FailedPreconditionError(absl::StrCat("device '", name, "': only ",
                                                      torch::cuda::device_count(),
                                                      " CUDA device(s) present"));
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

uint64_t DeviceMemoryAllocatedBytes(const c10::Device& device) {
#ifdef FERRY_LIBTORCH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return static_cast<uint64_t>(
        stats.allocated_bytes[static_cast<size_t>(c10::cuda::CUDACachingAllocator::StatType::AGGREGATE)]
            .current);
  }
#endif
  (void)device;
  return 0;
}

uint64_t DeviceMemoryTotalBytes(const c10::Device& device) {
#ifdef FERRY_LIBTORCH_CUDA
  if (device.is_cuda()) {
    return static_cast<uint64_t>(at::cuda::getDeviceProperties(device.index())->totalGlobalMem);
  }
#endif
  (void)device;
  return HostMemoryTotalBytes();
}

uint64_t DeviceMemoryFreeBytes(const c10::Device& device) {
#ifdef FERRY_LIBTORCH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDAGuard guard(device.index());
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return static_cast<uint64_t>(free);
  }
#endif
  (void)device;
  return HostMemoryTotalBytes();
}

std::string TorchVersion() { return TORCH_VERSION; }

double MeasureMatmulFlops(const c10::Device& device, c10::ScalarType dtype, int64_t size, double seconds) {
  const at::TensorOptions options = at::TensorOptions().device(device).dtype(dtype);
  const at::Tensor a = at::randn({size, size}, options.dtype(at::kFloat)).to(dtype);
  const at::Tensor b = at::randn({size, size}, options.dtype(at::kFloat)).to(dtype);
  at::Tensor c = at::empty({size, size}, options);
  // The host waits for the device's work: a scalar read back.
  auto finish = [&] { (void)c.select(0, 0).select(0, 0).item<float>(); };
  at::mm_out(c, a, b);
  finish();
  const auto start = std::chrono::steady_clock::now();
  int64_t products = 0;
  double elapsed = 0;
  do {
    for (int i = 0; i < 4; ++i) at::mm_out(c, a, b);
    products += 4;
    finish();
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (elapsed < seconds);
  return 2.0 * double(size) * double(size) * double(size) * double(products) / elapsed;
}

}  // namespace ferry
