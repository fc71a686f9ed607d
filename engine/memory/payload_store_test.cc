#include "engine/memory/payload_store.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "engine/common/torch_status.h"
#include "engine/memory/chunk_table.h"
#include "engine/memory/payload_mover.h"
#include "engine/memory/period_tracer.h"
#include "engine/memory/simulated_device.h"

namespace ferry {
namespace {

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
}

MemoryOptions DiskOptions(const std::string& name) {
  MemoryOptions options;
  options.disk_dir = TestDir(name);
  options.disk_budget_bytes = 1ull << 30;
  return options;
}

// A chunk's payload of `regions` runs of `elements` elements.
Payload MakePayload(PayloadKind kind, int64_t elements, int regions, c10::ScalarType dtype, int64_t slice) {
  Payload p;
  p.kind = kind;
  p.regions = regions;
  p.numel = elements * regions;
  p.dtype = dtype;
  p.bytes = static_cast<uint64_t>(p.numel) * c10::elementSize(dtype);
  p.slice_elements = slice;
  return p;
}

// Element i of region r holds r * 100000 + i.
at::Tensor Pattern(int64_t elements, int regions) {
  HostAllocationScope host;
  std::vector<at::Tensor> parts;
  for (int r = 0; r < regions; ++r) parts.push_back(at::arange(elements, at::kFloat) + r * 100000.0);
  return at::cat(parts);
}

TEST(PayloadStoreTest, StreamedOutAndInAPayloadRoundTripsEveryRegionASliceAtATime) {
  SimulatedDevice device(64 << 20);
  PayloadStore store(&device, 0);
  // Three regions of two and a half slices each.
  const int64_t elements = 5 * kDiskSliceQuantum / 2;
  Payload o = MakePayload(PayloadKind::kOptimizer, elements, 3, at::kFloat, kDiskSliceQuantum);
  ASSERT_TRUE(store.OpenDisk(DiskOptions("roundtrip"), {&o}, 3 * kDiskSliceQuantum * 4).ok());
  EXPECT_EQ(o.home, Tier::kDisk);
  EXPECT_EQ(store.disk()->file_bytes(o.disk_file), DiskFileBytes(elements, 4, 3));
  EXPECT_EQ(store.staging_bytes(), kDiskStagingSlots * 3 * kDiskSliceQuantum * 4);
  const at::Tensor values = Pattern(elements, 3);
  std::vector<int64_t> begins;
  store.StreamOut(o, [&](int64_t begin, int64_t count, const std::vector<at::Tensor>& views) {
    ASSERT_EQ(views.size(), 3u);
    begins.push_back(begin);
    for (int r = 0; r < 3; ++r) views[static_cast<size_t>(r)].copy_(values.narrow(0, r * elements + begin, count));
  });
  o.disk_valid = true;
  EXPECT_EQ(begins, (std::vector<int64_t>{0, kDiskSliceQuantum, 2 * kDiskSliceQuantum}));
  // Read back while the last writes may still be in flight: a read waits for
  // the write of its slice.
  HostAllocationScope host;
  at::Tensor back = at::zeros({3 * elements});
  store.StreamIn(o, [&](int64_t begin, int64_t count, const std::vector<at::Tensor>& views) {
    for (int r = 0; r < 3; ++r) back.narrow(0, r * elements + begin, count).copy_(views[static_cast<size_t>(r)]);
  });
  EXPECT_TRUE(torch::equal(back, values));
  // One region alone: the masters after the moments.
  at::Tensor masters = at::zeros({elements});
  store.StreamIn(
      o,
      [&](int64_t begin, int64_t count, const std::vector<at::Tensor>& views) {
        ASSERT_EQ(views.size(), 1u);
        masters.narrow(0, begin, count).copy_(views[0]);
      },
      2);
  EXPECT_TRUE(torch::equal(masters, values.narrow(0, 2 * elements, elements)));
  store.FinishWrites();
  const DiskStats stats = store.disk()->stats();
  EXPECT_EQ(stats.write_bytes, DiskFileBytes(elements, 4, 3)) << "each block written once";
  EXPECT_EQ(stats.read_bytes, DiskFileBytes(elements, 4, 3) + DiskRegionBytes(elements, 4));
}

TEST(PayloadStoreTest, AFileThatHoldsNoValuesReadsAsZerosWithoutReadingTheDisk) {
  SimulatedDevice device(64 << 20);
  PayloadStore store(&device, 0);
  Payload o = MakePayload(PayloadKind::kOptimizer, kDiskSliceQuantum, 2, at::kFloat, kDiskSliceQuantum);
  ASSERT_TRUE(store.OpenDisk(DiskOptions("zeros"), {&o}, 2 * kDiskSliceQuantum * 4).ok());
  const int slot = store.AcquireSlot();
  for (const at::Tensor& v : store.SliceViews(o, slot, 0, kDiskSliceQuantum)) v.fill_(7);
  store.StartRead(o, slot, 0, 0, kDiskSliceQuantum);
  store.FinishReads(slot);
  for (const at::Tensor& v : store.SliceViews(o, slot, 0, kDiskSliceQuantum)) EXPECT_EQ(v.abs().sum().item<float>(), 0);
  EXPECT_EQ(store.disk()->stats().reads, 0);
}

TEST(PayloadStoreTest, SlicesOutsideThePayloadOrTheSlotAreBugs) {
  SimulatedDevice device(64 << 20);
  PayloadStore store(&device, 0);
  Payload g = MakePayload(PayloadKind::kGrad, 3 * kDiskSliceQuantum, 1, at::kBFloat16, kDiskSliceQuantum);
  ASSERT_TRUE(store.OpenDisk(DiskOptions("bugs"), {&g}, kDiskSliceQuantum * 2).ok());
  const int slot = store.AcquireSlot();
  EXPECT_THROW(store.StartWrite(g, slot, 0, 1, 10), std::logic_error) << "not at a slice";
  EXPECT_THROW(store.StartWrite(g, slot, 0, 0, kDiskSliceQuantum + 1), std::logic_error) << "longer than a slice";
  EXPECT_THROW(store.StartWrite(g, slot, 4096, 0, kDiskSliceQuantum), std::logic_error) << "past the slot's end";
  EXPECT_THROW(store.StartWrite(g, slot, 0, 3 * kDiskSliceQuantum, 1), std::logic_error) << "past the payload";
}

TEST(PayloadStoreTest, TheStagingCountsAgainstTheHostBudget) {
  SimulatedDevice device(64 << 20);
  PayloadStore store(&device, 128 << 10);  // four slots of 64 KiB do not fit
  Payload o = MakePayload(PayloadKind::kOptimizer, kDiskSliceQuantum, 2, at::kFloat, kDiskSliceQuantum);
  const absl::Status status = store.OpenDisk(DiskOptions("budget"), {&o}, 2 * kDiskSliceQuantum * 4);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_NE(status.message().find("memory.host_budget"), std::string::npos) << status;
}

// A gradient evicted in the middle of its backward (a tied weight's chunk,
// used by two backward periods), fetched back and accumulated into: when
// it leaves the device again the host side must take the sum, not keep the
// copy it had -- on the host and on disk.
TEST(PayloadMoverTest, AGradientFetchedBackAndAccumulatedIsCopiedOutAgain) {
  for (const bool on_disk : {false, true}) {
    SCOPED_TRACE(on_disk ? "disk" : "host");
    SimulatedDevice device(64 << 20);
    PayloadStore store(&device, 0);
    ChunkTable table;
    table.stages = {{"s0", {}, false}};
    table.chunks.resize(1);
    Chunk& chunk = table.chunks[0];
    chunk.capacity = chunk.used = kDiskSliceQuantum;
    for (int k = 0; k < kPayloadKinds; ++k) {
      Payload& p = chunk.payloads[k];
      p = MakePayload(static_cast<PayloadKind>(k), kDiskSliceQuantum, 1, at::kFloat, kDiskSliceQuantum);
      store.InitDevice(p);
    }
    ASSERT_TRUE(table.IndexStages().ok());
    Payload& g = chunk.payload(PayloadKind::kGrad);
    if (on_disk) {
      ASSERT_TRUE(store.OpenDisk(DiskOptions("refetched"), {&g}, kDiskSliceQuantum * 4).ok());
    }
    PeriodTracer tracer(&table, MemoryOptions());
    StepMemoryStats stats;
    PayloadMover mover(&device, &store, &table, &tracer, &stats);

    mover.Fetch(g, /*prefetch=*/false);  // this step's gradients start at zero
    EXPECT_TRUE(chunk.grad_started);
    g.device.fill_(1);
    // As compute does, it waits for the copy that fills what it reads; the
    // copy back waits for the copy out (host_filled).
    mover.Evict(g, /*keep_values=*/true);
    mover.Fetch(g, /*prefetch=*/false);
    device.ComputeWaitsFor(g.device_filled);
    g.device.add_(2);
    mover.Evict(g, /*keep_values=*/true);
    mover.Fetch(g, /*prefetch=*/false);
    device.ComputeWaitsFor(g.device_filled);
    EXPECT_EQ(g.device.min().item<float>(), 3) << "the sum, not the first copy";
    EXPECT_EQ(g.device.max().item<float>(), 3);
    EXPECT_EQ(stats.device_to_host_bytes, 2 * g.bytes);
    EXPECT_EQ(stats.host_to_device_bytes, 2 * g.bytes);
  }
}

}  // namespace
}  // namespace ferry
