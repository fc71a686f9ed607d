#pragma once

// The CPU random number generator the engine's own random draws use
// (dropout masks; what recomputation saves and replays): LibTorch's default
// CPU generator, unless a CpuGeneratorScope on this thread names another.
// Ranks run as threads of one process (as multi-rank tests run them) would
// otherwise share, and race on, one generator.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace ferry {

at::Generator CpuGenerator();

// The states of the generators a step on `device` draws from: CpuGenerator()
// and, when `device` is not the CPU, its default generator (undefined
// otherwise). What recomputation replays and a checkpoint keeps.
struct GeneratorStates {
  at::Tensor cpu;
  at::Tensor device;
};
GeneratorStates SaveGenerators(const c10::Device& device);
// Sets them back; an undefined `device` state leaves that generator as it is.
void RestoreGenerators(const c10::Device& device, const GeneratorStates& states);

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
