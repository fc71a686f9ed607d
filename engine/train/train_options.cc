#include "engine/train/train_options.h"

#include "engine/common/host_info.h"

namespace ferry {

bool NativeCpuBf16Products(const TrainOptions& options) {
  if (options.precision != TrainOptions::Precision::kBf16) return false;
  switch (options.cpu_bf16_matmul) {
    case TrainOptions::CpuBf16Matmul::kNative:
      return true;
    case TrainOptions::CpuBf16Matmul::kFp32:
      return false;
    case TrainOptions::CpuBf16Matmul::kAuto:
      break;
  }
  return CpuHasBf16Arithmetic();
}

}  // namespace ferry
