#include "engine/memory/simulated_device.h"

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>
#include <torch/torch.h>

#include <optional>

#include "engine/common/host_info.h"

namespace ferry {
namespace {

constexpr uint64_t kMiB = 1 << 20;

TEST(SimulatedDeviceTest, CountsEveryTensorAllocationAgainstTheCapacity) {
  SimulatedDevice device(8 * kMiB);
  const uint64_t before = device.allocated_bytes();
  {
    torch::Tensor a = torch::empty({kMiB / 4});  // 1 MiB of floats
    EXPECT_EQ(device.allocated_bytes() - before, kMiB);
    torch::Tensor b = a * 2;  // results of compute count too
    EXPECT_EQ(device.allocated_bytes() - before, 2 * kMiB);
  }
  EXPECT_EQ(device.allocated_bytes(), before) << "freed tensors are given back";
  EXPECT_GE(device.peak_allocated_bytes() - before, 2 * kMiB);
  device.ResetPeak();
  EXPECT_EQ(device.peak_allocated_bytes(), device.allocated_bytes());
}

// Kernels that allocate scratch space through raw_allocate (bf16 matrix
// products on some CPUs) are counted too, and give it back.
TEST(SimulatedDeviceTest, RawAllocationsAreCountedAndFreed) {
  SimulatedDevice device(8 * kMiB);
  const uint64_t before = device.allocated_bytes();
  c10::Allocator* allocator = c10::GetCPUAllocator();
  void* p = allocator->raw_allocate(kMiB);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  static_cast<char*>(p)[kMiB - 1] = 1;
  EXPECT_EQ(device.allocated_bytes() - before, kMiB);
  allocator->raw_deallocate(p);
  EXPECT_EQ(device.allocated_bytes(), before);
  // And a bf16 matrix product, which may take that path, runs.
  torch::Tensor a = torch::ones({64, 64}, torch::kBFloat16);
  EXPECT_EQ(torch::mm(a, a).index({0, 0}).item<float>(), 64.0f);
}

// Freed large blocks are reused, as a GPU's caching allocator reuses them,
// without changing what the device counts.
TEST(SimulatedDeviceTest, LargeBlocksAreReusedAndStillCounted) {
  SimulatedDevice device(64 * kMiB);
  const uint64_t before = device.allocated_bytes();
  void* first = nullptr;
  {
    torch::Tensor a = torch::empty({static_cast<int64_t>(2 * kMiB / 4)});
    first = a.data_ptr();
    EXPECT_EQ(device.allocated_bytes() - before, 2 * kMiB);
  }
  EXPECT_EQ(device.allocated_bytes(), before);
  torch::Tensor b = torch::empty({static_cast<int64_t>(2 * kMiB / 4)});
  EXPECT_EQ(b.data_ptr(), first);
  EXPECT_EQ(device.allocated_bytes() - before, 2 * kMiB);
  // A little smaller still fits the same rounded block; capacity is judged
  // on the bytes asked for.
  b = torch::Tensor();
  torch::Tensor c = torch::empty({static_cast<int64_t>(2 * kMiB / 4) - 16});
  EXPECT_EQ(c.data_ptr(), first);
  EXPECT_EQ(device.allocated_bytes() - before, 2 * kMiB - 64);
}

// Host memory freed goes back to the system: only device blocks are kept,
// so the model's values freed once they are in chunks do not stay resident.
TEST(SimulatedDeviceTest, FreedHostBlocksAreNotKept) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer's allocator keeps freed memory in quarantine";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  GTEST_SKIP() << "the sanitizer's allocator keeps freed memory in quarantine";
#endif
#endif
  SimulatedDevice device(512 * kMiB);
  constexpr int64_t kFloats = 128 * kMiB / 4;
  auto resident_after = [&](bool host) {
    const uint64_t before = ProcessResidentBytes();
    {
      std::optional<HostAllocationScope> scope;
      if (host) scope.emplace();
      torch::Tensor t = torch::empty({kFloats});
      t.fill_(1.0f);  // every page touched
    }
    return static_cast<int64_t>(ProcessResidentBytes()) - static_cast<int64_t>(before);
  };
  EXPECT_LT(resident_after(/*host=*/true), static_cast<int64_t>(32 * kMiB)) << "128 MiB of host memory, freed";
  EXPECT_GT(resident_after(/*host=*/false), static_cast<int64_t>(96 * kMiB)) << "128 MiB of device memory, kept";
}

TEST(SimulatedDeviceTest, GoingOverCapacityThrowsOutOfMemory) {
  SimulatedDevice device(4 * kMiB);
  torch::Tensor a = torch::empty({static_cast<int64_t>(3 * kMiB / 4)});
  EXPECT_THROW(torch::empty({static_cast<int64_t>(2 * kMiB / 4)}), c10::OutOfMemoryError);
  // The failed allocation left the count as it was.
  EXPECT_LT(device.allocated_bytes(), 4 * kMiB);
  EXPECT_NO_THROW(torch::empty({static_cast<int64_t>(kMiB / 8)}));
}

TEST(SimulatedDeviceTest, HostScopeAndHostBuffersDoNotCount) {
  SimulatedDevice device(kMiB);
  const uint64_t before = device.allocated_bytes();
  torch::Tensor host = device.AllocateHost(2 * kMiB / 4, at::kFloat);  // bigger than the device
  {
    HostAllocationScope scope;
    torch::Tensor t = torch::empty({static_cast<int64_t>(2 * kMiB / 4)});
    EXPECT_EQ(device.allocated_bytes(), before);
  }
  EXPECT_GE(device.host_allocated_bytes(), 2 * kMiB);
}

TEST(SimulatedDeviceTest, TransfersAreRealCopiesBetweenSeparateBuffers) {
  SimulatedDevice device(kMiB);
  torch::Tensor host = device.AllocateHost(16, at::kFloat);
  host.copy_(torch::arange(16, torch::kFloat));
  c10::DataPtr data = device.AllocateDevice(16 * sizeof(float));
  torch::Tensor on_device = torch::from_blob(data.get(), {16}, torch::kFloat);
  device.ComputeWaitsFor(device.CopyToDevice(host, on_device));
  EXPECT_NE(on_device.data_ptr(), host.data_ptr());
  EXPECT_TRUE(torch::equal(on_device, host));
  host.zero_();
  EXPECT_EQ(on_device[5].item<float>(), 5.0f) << "changing one copy leaves the other";
  device.CopyToHost(on_device, host);
  device.SynchronizeTransfers();
  EXPECT_EQ(host[5].item<float>(), 5.0f);
}

TEST(SimulatedDeviceTest, TheCopyEngineRunsEachDirectionInOrderAndSignalsEachCopy) {
  SimulatedDevice device(64 * kMiB);
  device.KeepTimeline(true);
  constexpr int64_t kN = 1 << 20;  // 4 MiB a copy
  torch::Tensor host = device.AllocateHost(kN, at::kFloat);
  std::vector<c10::DataPtr> blocks;
  std::vector<torch::Tensor> targets;
  std::vector<TransferEvent> events;
  for (int i = 0; i < 6; ++i) {
    host.fill_(float(i));  // written before the copy is issued, as compute would
    blocks.push_back(device.AllocateDevice(kN * sizeof(float)));
    targets.push_back(torch::from_blob(blocks.back().get(), {kN}, torch::kFloat));
    events.push_back(device.CopyToDevice(host.clone(), targets.back()));
  }
  for (int i = 0; i < 6; ++i) {
    device.ComputeWaitsFor(events[size_t(i)]);
    EXPECT_TRUE(events[size_t(i)].done());
    EXPECT_EQ(targets[size_t(i)].min().item<float>(), float(i));
    EXPECT_EQ(targets[size_t(i)].max().item<float>(), float(i));
  }
  const DeviceTimeline t = device.timeline();
  ASSERT_EQ(t.copies.size(), 6u);
  for (size_t i = 0; i < t.copies.size(); ++i) {
    const CopyRecord& c = t.copies[i];
    EXPECT_TRUE(c.to_device);
    EXPECT_EQ(c.bytes, uint64_t(kN) * 4);
    EXPECT_LE(c.enqueued_ns, c.started_ns);
    EXPECT_LE(c.started_ns, c.finished_ns);
    EXPECT_GT(c.waited_ns, 0) << "compute waited for it";
    if (i > 0) EXPECT_GE(c.started_ns, t.copies[i - 1].finished_ns) << "one direction, in order";
  }
  EXPECT_TRUE(TransferEvent().done()) << "nothing to wait for";
}

// Ranks as threads share one device: a thread's SynchronizeTransfers waits
// for every copy queued before it, however many copies other threads queue
// meanwhile, and however soon those finish in the other direction.
TEST(SimulatedDeviceTest, SynchronizingWaitsForEveryEarlierCopyWhateverOthersQueue) {
  SimulatedDevice device(512 * kMiB);
  constexpr int64_t kBig = 16 << 20;  // 64 MiB: a long copy to the host
  c10::DataPtr block = device.AllocateDevice(kBig * sizeof(float));
  torch::Tensor source = torch::from_blob(block.get(), {kBig}, torch::kFloat);
  source.fill_(1.0f);
  torch::Tensor home = device.AllocateHost(kBig, at::kFloat);
  torch::Tensor small_host = device.AllocateHost(1024, at::kFloat);
  c10::DataPtr small_block = device.AllocateDevice(1024 * sizeof(float));
  torch::Tensor small = torch::from_blob(small_block.get(), {1024}, torch::kFloat);
  std::atomic<bool> stop{false};
  std::atomic<int> queued{0};
  // Another rank: small copies to the device, one after another.
  std::thread other([&] {
    while (!stop.load()) {
      device.ComputeWaitsFor(device.CopyToDevice(small_host, small));
      queued.fetch_add(1);
    }
  });
  while (queued.load() < 16) std::this_thread::yield();
  for (int i = 0; i < 4; ++i) {
    const TransferEvent out = device.CopyToHost(source, home);
    device.SynchronizeTransfers();
    EXPECT_TRUE(out.done()) << "round " << i;
  }
  stop.store(true);
  other.join();
  device.SynchronizeTransfers();
  EXPECT_EQ(home.min().item<float>(), 1.0f);
}

// Transfer time is what the copy engine spent copying and what compute spent
// waiting, as the device measured it, not the time taken to issue copies:
// every copy's span counts, and compute's wait only where it had to block.
TEST(SimulatedDeviceTest, TransferTimesAreTheCopiesAndTheWaitsTheDeviceTimed) {
  SimulatedDevice device(64 * kMiB);
  device.KeepTimeline(true);
  (void)device.TakeTransferTimes();
  constexpr int64_t kN = 4 << 20;  // 16 MiB a copy
  torch::Tensor host = device.AllocateHost(kN, at::kFloat);
  host.fill_(1);
  c10::DataPtr block = device.AllocateDevice(kN * sizeof(float));
  torch::Tensor target = torch::from_blob(block.get(), {kN}, torch::kFloat);
  std::vector<TransferEvent> events;
  for (int i = 0; i < 3; ++i) events.push_back(device.CopyToDevice(host, target));
  device.ComputeWaitsFor(events.back());
  device.SynchronizeTransfers();
  const TransferTimes times = device.TakeTransferTimes();
  const DeviceTimeline t = device.timeline();
  ASSERT_EQ(t.copies.size(), 3u);
  double spans = 0;
  for (const CopyRecord& c : t.copies) spans += double(c.finished_ns - c.started_ns) / 1e9;
  EXPECT_GT(times.copy_seconds, 0);
  EXPECT_NEAR(times.copy_seconds, spans, 1e-9);
  // Compute blocked on the last copy exactly when the timeline says so, for
  // as long as it says, and went on only after the copy had finished.
  const CopyRecord& last = t.copies.back();
  EXPECT_EQ(times.stall_seconds > 0, last.blocked);
  if (last.blocked) {
    EXPECT_NEAR(times.stall_seconds, double(last.resumed_ns - last.waited_ns) / 1e9, 1e-9);
    EXPECT_GE(last.resumed_ns, last.finished_ns);
  }
  // Taken: the next call starts from zero.
  const TransferTimes again = device.TakeTransferTimes();
  EXPECT_EQ(again.copy_seconds, 0);
  EXPECT_EQ(again.stall_seconds, 0);
}

// A caching allocator's reserved but unallocated memory, which no
// allocation counts: allocations that fit the count are refused past it;
// cached segments come back with ReleaseCachedMemory, fragments do not.
TEST(SimulatedDeviceTest, ReservedSlackRefusesWhatTheCountSaysFits) {
  SimulatedDevice device(8 * kMiB);
  const uint64_t before = device.allocated_bytes();
  device.SetReservedSlack(6 * kMiB, /*releasable=*/true);
  EXPECT_THROW(device.AllocateDevice(4 * kMiB), c10::OutOfMemoryError);
  EXPECT_EQ(device.allocated_bytes(), before);
  device.ReleaseCachedMemory();
  EXPECT_EQ(device.reserved_slack_bytes(), 0u);
  EXPECT_NO_THROW(device.AllocateDevice(4 * kMiB));
  device.SetReservedSlack(6 * kMiB, /*releasable=*/false);
  device.ReleaseCachedMemory();
  EXPECT_EQ(device.reserved_slack_bytes(), 6 * kMiB);
  try {
    device.AllocateDevice(4 * kMiB);
    FAIL() << "6 MiB of fragments leave no room for 4 MiB";
  } catch (const c10::OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("(and 6.0 MiB reserved unused)"), std::string::npos)
        << e.what_without_backtrace();
  }
}

TEST(SimulatedDeviceTest, ACopyBackWaitsForTheCopyOutItNamesAfter) {
  SimulatedDevice device(64 * kMiB);
  constexpr int64_t kN = 1 << 21;  // 8 MiB: a copy long enough to race
  torch::Tensor host = device.AllocateHost(kN, at::kFloat);
  c10::DataPtr a = device.AllocateDevice(kN * sizeof(float));
  c10::DataPtr b = device.AllocateDevice(kN * sizeof(float));
  torch::Tensor from = torch::from_blob(a.get(), {kN}, torch::kFloat);
  torch::Tensor to = torch::from_blob(b.get(), {kN}, torch::kFloat);
  for (int round = 1; round <= 20; ++round) {
    from.fill_(float(round));
    const TransferEvent out = device.CopyToHost(from, host);
    // The other queue: without `after` it could read the host copy first.
    device.ComputeWaitsFor(device.CopyToDevice(host, to, out));
    ASSERT_EQ(to.min().item<float>(), float(round)) << "round " << round;
    ASSERT_EQ(to.max().item<float>(), float(round)) << "round " << round;
  }
}

TEST(SimulatedDeviceTest, AReleasedBlockIsFreedOnlyOnceItsCopiesAreDone) {
  SimulatedDevice device(64 * kMiB);
  constexpr int64_t kN = 1 << 21;
  torch::Tensor host = device.AllocateHost(kN, at::kFloat);
  const uint64_t before = device.allocated_bytes();
  c10::DataPtr block = device.AllocateDevice(kN * sizeof(float));
  torch::Tensor on_device = torch::from_blob(block.get(), {kN}, torch::kFloat);
  on_device.fill_(7);
  device.CopyToHost(on_device, host);
  EXPECT_EQ(device.allocated_bytes(), before + uint64_t(kN) * 4);
  // Given back while its copy may run: kept until the copy is done (freed
  // early, the copy would read freed memory: ASan's catch), releasing, but
  // out of use at once, as in a CUDA caching allocator, so that a period's
  // peak does not depend on how fast the copy runs.
  device.ReleaseAfterTransfers(std::move(block), kN * sizeof(float));
  EXPECT_EQ(device.allocated_bytes(), before);
  device.ResetPeak();
  EXPECT_EQ(device.peak_allocated_bytes(), before);
  device.SynchronizeTransfers();
  EXPECT_EQ(device.releasing_bytes(), 0u);
  EXPECT_EQ(device.allocated_bytes(), before);
  EXPECT_EQ(host.min().item<float>(), 7.0f);
  EXPECT_EQ(host.max().item<float>(), 7.0f);
  // A block no copy touches goes at once.
  c10::DataPtr idle = device.AllocateDevice(kN * sizeof(float));
  device.ReleaseAfterTransfers(std::move(idle), kN * sizeof(float));
  EXPECT_EQ(device.allocated_bytes(), before);
}

TEST(SimulatedDeviceTest, AReleasedPlaceholderFaultsWhenTouched) {
  // The device runs copy threads: the death test re-executes the binary
  // rather than forking them.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  SimulatedDevice device(kMiB);
  c10::DataPtr placeholder = device.ReleasedPlaceholder(4096);
  ASSERT_NE(placeholder.get(), nullptr);
  float* p = static_cast<float*>(placeholder.get());
  EXPECT_DEATH({ volatile float x = p[3]; (void)x; }, "");
}

TEST(SimulatedDeviceTest, OnlyOneAtATime) {
  SimulatedDevice device(kMiB);
  EXPECT_THROW(SimulatedDevice second(kMiB), std::logic_error);
}

}  // namespace
}  // namespace ferry
