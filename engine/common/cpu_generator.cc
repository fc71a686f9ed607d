#include "engine/common/cpu_generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <mutex>

#include <utility>

namespace ferry {
namespace {

thread_local at::Generator t_generator;  // undefined: LibTorch's default

}  // namespace

at::Generator CpuGenerator() {
  return t_generator.defined() ? t_generator : at::detail::getDefaultCPUGenerator();
}

GeneratorStates SaveGenerators(const c10::Device& device) {
  GeneratorStates s;
  at::Generator cpu = CpuGenerator();
  {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    s.cpu = cpu.get_state();
  }
  if (!device.is_cpu()) {
    at::Generator g = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(g.mutex());
    s.device = g.get_state();
  }
  return s;
}

void RestoreGenerators(const c10::Device& device, const GeneratorStates& states) {
  at::Generator cpu = CpuGenerator();
  {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    cpu.set_state(states.cpu);
  }
  if (!device.is_cpu() && states.device.defined()) {
    at::Generator g = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(states.device);
  }
}

CpuGeneratorScope::CpuGeneratorScope(at::Generator generator) : previous_(t_generator) {
  t_generator = std::move(generator);
}

CpuGeneratorScope::~CpuGeneratorScope() { t_generator = previous_; }

}  // namespace ferry
