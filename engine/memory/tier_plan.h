#pragma once

// Where the host side of each chunk lives -- host memory or the disk tier --
// and what a run then needs of each tier. No LibTorch: the chunk manager
// plans with it when it is created, the daemon at submit time with the same
// inputs, so a job the daemon accepts is one the manager can place.
//
// Every payload has one authoritative copy. Parameters of chunks the device
// does not keep are used in every forward and backward, so they live in host
// memory. The optimizer states (the AdamW moments, and the fp32 master
// weights in mixed precision) are used once a step, by the update, and the
// gradients are written once (when their chunk's backward is complete) and
// read once (by the update): they are what goes to disk when host memory is
// short. Which goes first is priced: a byte of optimizer states on disk is
// read and written by every update; a byte of gradients is written behind
// the backward and read by the update -- half the exposed disk time -- but
// with gradient accumulation (M micro-batches a step) it is written after
// every micro-batch and read back by the next one's backward to add to, so
// it costs 2M - 1 reads and writes the step waits for against the states'
// two, and from M = 2 the states go first. On disk, a payload is read and written
// through a few staging slots of host memory a slice of its chunk at a time
// (while slice k is updated, slice k+1 is read and slice k-1 written), so
// staging stays small however large the chunks are.
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
constexpr uint64_t kDiskBlockBytes = 16 << 10;

// Bytes for people: "768.00 KiB", "12.37 GiB".
std::string BytesText(uint64_t bytes);

// The disk tier's staging: this many slots, each holding a slice of a
// chunk's payloads on disk: at most kDiskSliceBytes, and less where host
// memory is short (the plan halves it down to kDiskMinSliceBytes, weighing
// the smaller requests' cost, kDiskRequestCostBytes each, against the
// bytes that stay off the disk).
constexpr int kDiskStagingSlots = 4;
constexpr uint64_t kDiskSliceBytes = 32 << 20;
constexpr uint64_t kDiskMinSliceBytes = 256 << 10;
// What a disk request costs beyond its bytes, as bytes: about 100 us of a
// local disk streaming at 1.3 GB/s.
constexpr uint64_t kDiskRequestCostBytes = 128 << 10;
// Slices are multiples of this many elements, so that every region of a
// slice of 2- or 4-byte elements is a whole number of blocks.
constexpr int64_t kDiskSliceQuantum = static_cast<int64_t>(kDiskBlockBytes / 2);

// A payload's chunk file: `regions` runs of `elements` elements of
// `element_bytes` each (the optimizer states' moments and masters are
// regions of one file), each starting at a block.
uint64_t DiskRegionBytes(int64_t elements, uint64_t element_bytes);
uint64_t DiskFileBytes(int64_t elements, uint64_t element_bytes, int regions);

struct TierInput {
  // Per chunk: the elements each of its payloads holds (its capacity).
  std::vector<int64_t> elements;
  // Per chunk: the elements of its optimizer states' regions, where they
  // hold a shard of the chunk (data-parallel sharding); empty: `elements`.
  std::vector<int64_t> optimizer_elements;
  // Per chunk: the elements of the weights' and gradients' host copies,
  // where those hold a shard (full sharding); empty: `elements`.
  std::vector<int64_t> host_elements;
  // Bytes an element of the weights and of the gradients: 4 in fp32, 2 in
  // fp16 and bf16.
  uint64_t weight_bytes = 4;
  // Mixed precision: the optimizer states hold the fp32 masters beside the
  // two moments (three fp32 regions, not two), so they are filled at
  // construction too (in fp32 they start at the first update).
  bool masters_with_optimizer = false;
  // Host bytes of the model's values while they move into chunks: as built
  // (fp32, 4 bytes a parameter, freed a chunk at a time as each chunk is
  // filled), and the scratch of drawing a parameter straight into its chunk
  // (held until every chunk is filled).
  uint64_t built_bytes = 0;
  uint64_t init_scratch_bytes = 0;
  // Host bytes for model data; 0: no limit.
  uint64_t host_limit_bytes = 0;
  // Bytes the disk tier may hold (0: nothing goes to disk), its directory
  // ("" when the job has no disk tier), and whether the limit is the default
  // one taken from that directory's free space: for messages.
  uint64_t disk_limit_bytes = 0;
  std::string disk_dir;
  bool disk_limit_is_free_space = false;
  // Micro-batches a step (train.grad_accum_steps): gradients on disk move
  // this many times each way a step.
  int micro_batches = 1;

  int optimizer_regions() const { return masters_with_optimizer ? 3 : 2; }
  int64_t host_numel(size_t c) const { return host_elements.empty() ? elements[c] : host_elements[c]; }
  uint64_t param_bytes(size_t c) const { return static_cast<uint64_t>(host_numel(c)) * weight_bytes; }
  uint64_t grad_bytes(size_t c) const { return param_bytes(c); }
  int64_t optimizer_numel(size_t c) const { return optimizer_elements.empty() ? elements[c] : optimizer_elements[c]; }
  // Whether the chunk's gradients and states may go to disk: unsharded, or
  // its shards start on disk blocks (ShardChunks).
  bool disk_aligned(size_t c) const {
    return optimizer_elements.empty() || optimizer_elements[c] == elements[c] ||
           optimizer_elements[c] % kDiskSliceQuantum == 0;
  }
  uint64_t optimizer_bytes(size_t c) const {
    return static_cast<uint64_t>(optimizer_numel(c)) * 4 * optimizer_regions();
  }
};

// The input for chunks of `capacity` elements each, in fp32 or mixed
// precision; construction and the limits are left for the caller.
TierInput ChunkTierInput(const std::vector<int64_t>& capacity, bool mixed_precision);

// Chunks split into `shards` equal parts, one per data rank (sharding):
// each capacity padded to whole shards, each shard starting on a disk block
// (a slice of its states on disk starts there) unless that would pad the
// chunk by more than a quarter (a chunk of under 4 x D disk blocks) -- such
// a chunk is padded to whole shards only, and keeps its gradients and states off the disk tier
// (TierInput::disk_aligned). The layout, and a checkpoint's, depends on the
// chunks alone, not on whether the disk tier is on. Returns the elements of
// a shard of each chunk.
std::vector<int64_t> ShardChunks(std::vector<int64_t>* capacity, int64_t shards);

struct TierPlan {
  bool feasible = false;
  // Per chunk: where its optimizer states and its gradients live (kHost or
  // kDisk).
  std::vector<Tier> optimizer_tier;
  std::vector<Tier> grad_tier;
  // The staging slots (kDiskStagingSlots of slot_bytes, 0 with nothing on
  // disk) and, per chunk, the elements of a slice of its payloads on disk
  // (0 for a chunk with none).
  uint64_t slot_bytes = 0;
  std::vector<int64_t> slice_elements;
  // Predicted peak of host memory for model data: the larger of the steady
  // state and construction, staging included.
  uint64_t host_bytes = 0;
  uint64_t host_steady_bytes = 0;
  uint64_t host_construction_bytes = 0;
  uint64_t staging_bytes = 0;
  // Bytes of the chunk files on disk.
  uint64_t disk_bytes = 0;
  uint64_t disk_optimizer_bytes = 0;
  uint64_t disk_grad_bytes = 0;
  // Disk traffic of a step that updates every chunk on the host side: each
  // file of states read once and written once, each of gradients once per
  // micro-batch.
  uint64_t disk_read_bytes_per_step = 0;
  uint64_t disk_write_bytes_per_step = 0;
  // Why it is infeasible: the numbers per tier and what to change.
  std::string problem;

  int optimizer_chunks_on_disk() const;
  int grad_chunks_on_disk() const;
};

// Keeps everything on the host while the host limit allows; otherwise moves
// the payload whose disk traffic costs the least exposed time per byte of
// host memory freed (gradients with one micro-batch, optimizer states with
// more) to disk, largest chunk first, then the other, choosing among
// slice sizes and caps on the size of a state on disk (both size the
// staging slots) the plan that costs the least exposed disk traffic (bytes
// the step waits for, and the requests they take). It is
// infeasible when no choice brings the host within its limit (the plan
// returned is then the one needing the least host memory) or the files are
// over the disk's limit.
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
