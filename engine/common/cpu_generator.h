#pragma once

// The CPU random number generator the engine's own random draws use
// (dropout masks; what recomputation saves and replays): LibTorch's default
// CPU generator, unless a CpuGeneratorScope on this thread names another.
// Ranks run as threads of one process (as multi-rank tests run them) would
// otherwise share, and race on, one generator.

#include <ATen/core/Generator.h>

namespace ferry {

at::Generator CpuGenerator();

class CpuGeneratorScope {
 public:
  explicit CpuGeneratorScope(at::Generator generator);
  ~CpuGeneratorScope();
  CpuGeneratorScope(const CpuGeneratorScope&) = delete;
  CpuGeneratorScope& operator=(const CpuGeneratorScope&) = delete;

 private:
  at::Generator previous_;
};

}  // namespace ferry
