#include "engine/common/cpu_generator.h"

#include <ATen/CPUGeneratorImpl.h>

#include <utility>

namespace ferry {
namespace {

thread_local at::Generator t_generator;  // undefined: LibTorch's default

}  // namespace

at::Generator CpuGenerator() {
  return t_generator.defined() ? t_generator : at::detail::getDefaultCPUGenerator();
}

CpuGeneratorScope::CpuGeneratorScope(at::Generator generator) : previous_(t_generator) {
  t_generator = std::move(generator);
}

CpuGeneratorScope::~CpuGeneratorScope() { t_generator = previous_; }

}  // namespace ferry
