#include "engine/memory/memory_device.h"

#include "absl/strings/str_cat.h"
#include "engine/common/host_info.h"
#include "engine/device/device.h"
#include "engine/memory/cuda_device.h"
#include "engine/memory/simulated_device.h"

namespace ferry {

absl::StatusOr<std::unique_ptr<MemoryDevice>> MakeMemoryDevice(absl::string_view name,
                                                               uint64_t budget_bytes) {
  absl::StatusOr<c10::Device> device = ResolveDevice(name);
  if (!device.ok()) return device.status();
  if (device->is_cuda()) {
    return std::unique_ptr<MemoryDevice>(std::make_unique<CudaDevice>(device->index(), budget_bytes));
  }
  const uint64_t capacity = budget_bytes > 0 ? budget_bytes : HostMemoryTotalBytes() / 4;
  return std::unique_ptr<MemoryDevice>(std::make_unique<SimulatedDevice>(capacity));
}

}  // namespace ferry
