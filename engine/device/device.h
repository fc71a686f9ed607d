#pragma once

// Execution devices through LibTorch's device-generic API. Everything that
// differs between a CPU and a CUDA LibTorch build lives behind this header.

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

struct DeviceDescription {
  // "cuda" or "cpu".
  std::string kind;
  // "cuda:0", "cpu".
  std::string name;
  // What the driver calls it; for the CPU, "host".
  std::string description;
  // Total memory (host memory for the CPU).
  uint64_t memory_bytes = 0;
};

// Every device this build of LibTorch can run on: the CUDA devices, then the
// CPU.
std::vector<DeviceDescription> ProbeDevices();

// "auto" (the first CUDA device, else the CPU), "cpu", "cuda" or "cuda:N".
// INVALID_ARGUMENT for a malformed name, FAILED_PRECONDITION for a device this
// machine or build does not have.
absl::StatusOr<c10::Device> ResolveDevice(absl::string_view name);

// Bytes the caching allocator has handed out on `device`; 0 for the CPU.
uint64_t DeviceMemoryAllocatedBytes(const c10::Device& device);

// Total memory of `device`; host memory for the CPU.
uint64_t DeviceMemoryTotalBytes(const c10::Device& device);

// Memory of `device` free now, as its driver reports it (for a GPU,
// cudaMemGetInfo: less the CUDA context, other processes' memory and what
// this process holds); host memory for the CPU, as DeviceMemoryTotalBytes.
uint64_t DeviceMemoryFreeBytes(const c10::Device& device);

// The LibTorch version the worker was built against, e.g. "1.13.1".
std::string TorchVersion();

// The rate of square matrix products of `size` in `dtype` on `device`, in
// floating-point operations a second (2 size^3 a product), measured for at
// least `seconds` after one unmeasured product, with LibTorch's current
// intra-op threads. A short probe: the machine's GEMM rate, against which a
// training step's achieved rate is set.
double MeasureMatmulFlops(const c10::Device& device, c10::ScalarType dtype, int64_t size = 1024,
                          double seconds = 0.25);

}  // namespace ferry
