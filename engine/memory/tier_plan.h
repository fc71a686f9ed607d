#pragma once

// Where the host side of each chunk lives -- host memory or the disk tier --
// and what a run then needs of each tier. No LibTorch: the chunk manager
// plans with it when it is created, the daemon at submit time with the same
// inputs, so a job the daemon accepts is one the manager can place.
//
// Every payload has one authoritative copy. Parameters and gradients of
// chunks the device does not keep are used every step on the host side, so
// they live in host memory; the optimizer states (the AdamW moments, and the
// fp32 master weights in mixed precision) are used once a step, by the
// update, so they are what goes to disk when host memory is short: read
// ahead of their chunk's update and written behind it, through a few staging
// buffers that are host memory too.
//
// The plan is made before any step, so it assumes every chunk's host side is
// kept there (as in the warm-up); chunks the device plan later homes on the
// device give their host memory back.

#include <cstdint>
#include <string>
#include <vector>

namespace ferry {

enum class Tier { kDevice = 0, kHost = 1, kDisk = 2 };
const char* TierName(Tier tier);

// Disk reads and writes are whole multiples of this, from buffers aligned to
// it (O_DIRECT's rule on every common file system).
constexpr uint64_t kDiskAlignment = 4096;
uint64_t AlignToDisk(uint64_t bytes);
// The disk tier checksums its files in blocks of this size, and reads and
// writes parts of a file a whole number of blocks at a time.
constexpr uint64_t kDiskBlockBytes = 64 << 10;

// Bytes for people: "768.00 KiB", "12.37 GiB".
std::string BytesText(uint64_t bytes);

// Staging buffers of the disk tier: while chunk i is updated, chunk i+1's
// states are read into one and chunk i-1's written from another.
constexpr int kDiskStagingBuffers = 3;

struct TierInput {
  // Per chunk: bytes of its parameters, its gradients and its optimizer
  // states.
  std::vector<uint64_t> param_bytes;
  std::vector<uint64_t> grad_bytes;
  std::vector<uint64_t> optimizer_bytes;
  // Host bytes of the model's values as built (fp32, 4 bytes a parameter),
  // before they move into chunks. They move a chunk at a time, in chunk
  // order, each chunk's freed once the chunk is filled.
  uint64_t construction_bytes = 0;
  // Mixed precision: the optimizer states hold the fp32 masters, so they
  // are filled at construction too (in fp32 they start at the first
  // update).
  bool masters_with_optimizer = false;
  // Host bytes for model data; 0: no limit.
  uint64_t host_limit_bytes = 0;
  // Bytes the disk tier may hold (0: nothing goes to disk), its directory
  // ("" when the job has no disk tier), and whether the limit is the default
  // one taken from that directory's free space: for messages.
  uint64_t disk_limit_bytes = 0;
  std::string disk_dir;
  bool disk_limit_is_free_space = false;
};

struct TierPlan {
  bool feasible = false;
  // Per chunk: where its optimizer states live (kHost or kDisk).
  std::vector<Tier> optimizer_tier;
  // Predicted peak of host memory for model data: the larger of the steady
  // state and construction, staging buffers included.
  uint64_t host_bytes = 0;
  uint64_t host_steady_bytes = 0;
  uint64_t host_construction_bytes = 0;
  uint64_t staging_bytes = 0;
  // Bytes of the chunk files on disk.
  uint64_t disk_bytes = 0;
  // Disk traffic of a step that updates every chunk on the host side.
  uint64_t disk_read_bytes_per_step = 0;
  uint64_t disk_write_bytes_per_step = 0;
  // Why it is infeasible: the numbers per tier and what to change.
  std::string problem;
};

// Keeps every optimizer state on the host while the host limit allows;
// otherwise moves states to disk until the host side fits, choosing among
// caps on the size of a state on disk (which sizes the staging buffers) the
// plan that puts the fewest bytes there. Infeasible when no choice brings the
// host within its limit (the plan returned is then the one needing the least
// host memory) or the disk states are over the disk's.
TierPlan PlanTiers(const TierInput& input);

// What the host side may use when the job sets no memory.host_budget: most
// of the machine's memory less what the simulated device (host memory
// itself) takes, leaving room for the rest of the process (LibTorch,
// activations beyond the device, the page cache the disk tier streams
// through).
uint64_t DefaultHostBudgetBytes(uint64_t host_memory_bytes, uint64_t device_in_host_bytes);

// What the disk tier may use when the job sets no memory.disk_budget: most
// of the free space of the file system holding memory.disk_dir.
uint64_t DefaultDiskBudgetBytes(uint64_t free_disk_bytes);

}  // namespace ferry
