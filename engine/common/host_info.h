#pragma once

// Facts about the host machine, read from the OS. No LibTorch.

#include <cstdint>

namespace ferry {

// Physical memory of the machine, in bytes.
uint64_t HostMemoryTotalBytes();

// Resident set size of this process, in bytes (0 if unknown).
uint64_t ProcessResidentBytes();

// Resident set size of process `pid`, in bytes (0 if unknown).
uint64_t ProcessResidentBytes(int pid);

// Online CPUs this process may run on.
int HostCpuCount();

// Whether the CPU multiplies bf16 natively (AVX512-BF16 or AMX-BF16, with
// the OS saving AVX-512 state), so that bf16 matrix products beat fp32 ones.
// False on other architectures.
bool CpuHasBf16Arithmetic();

}  // namespace ferry
