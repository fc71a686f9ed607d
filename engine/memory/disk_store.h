#pragma once

// The disk tier: one chunk file per payload in a scratch directory, read and
// written asynchronously by a small pool of I/O threads with direct, aligned
// I/O (O_DIRECT: the page cache is bypassed, so streaming tens of gigabytes
// through it neither evicts the process's memory nor counts twice). A file
// is read and written whole or a range of blocks at a time, and each block
// is checked against the CRC-32 of its last write when it is read back.
// No LibTorch.
//
// Thread-safe: Write/Read/Wait may be called from any thread; the chunk
// manager calls them from its training thread while the pool works.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/memory/tier_plan.h"

namespace ferry {

struct DiskStoreOptions {
  // A directory for the scratch directory; created (with its parents) if
  // missing. The store's files live in a fresh "ferry-chunks-XXXXXX" inside
  // it, removed with them when the store is destroyed.
  std::string dir;
  // The most bytes the files may take (each rounded up to kDiskAlignment);
  // 0: no limit but the file system's.
  uint64_t budget_bytes = 0;
  // I/O threads. Each request is split into pieces of at most
  // `piece_bytes` so that one large file is read by every thread at once.
  int io_threads = 2;
  uint64_t piece_bytes = 8ull << 20;
  // Each file is checksummed in blocks of this many bytes (a multiple of
  // kDiskAlignment; pieces are rounded up to a multiple of it): a range
  // read or written starts at a block and covers whole blocks, or reaches
  // the end of the file.
  uint64_t block_bytes = kDiskBlockBytes;
  // O_DIRECT where the file system allows it; else buffered I/O (see
  // direct_io()).
  bool direct_io = true;
};

// Cumulative figures since the store was opened.
struct DiskStats {
  uint64_t read_bytes = 0;
  uint64_t write_bytes = 0;
  int64_t reads = 0;
  int64_t writes = 0;
  // Seconds requests were in flight (queued or running), summed over
  // requests; and the part of that the I/O threads spent in checksums.
  double read_seconds = 0;
  double write_seconds = 0;
  double checksum_seconds = 0;
  // Seconds callers spent blocked in Wait().
  double wait_seconds = 0;
};

// Host memory aligned for direct I/O: `bytes` rounded up to kDiskAlignment,
// from posix_memalign, freed on destruction.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Throws std::bad_alloc when the memory cannot be had.
  explicit AlignedBuffer(uint64_t bytes);
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();

  void* data() const { return data_; }
  // The aligned size.
  uint64_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  uint64_t size_ = 0;
};

class DiskStore {
 public:
  using Ticket = uint64_t;

  // Creates the scratch directory. INVALID_ARGUMENT naming memory.disk_dir
  // for a path that is not a writable directory (with the OS's reason).
  static absl::StatusOr<std::unique_ptr<DiskStore>> Open(const DiskStoreOptions& options);
  // Waits for every request, then removes the files and the scratch
  // directory.
  ~DiskStore();

  // Adds a file of `bytes` (rounded up to kDiskAlignment), its space
  // reserved now (fallocate) so that a full disk shows here, naming the path
  // and the bytes, rather than in the middle of a step. RESOURCE_EXHAUSTED
  // past the budget (naming memory.disk_budget) or the file system's space.
  // Returns the file's index.
  absl::StatusOr<int> AddFile(const std::string& name, uint64_t bytes);

  // Queues a write of the file's whole (aligned) size from `buffer`, which
  // must be aligned to kDiskAlignment, hold that many bytes, and stay
  // untouched until the request is waited for. The checksums of what was
  // written are recorded when the write completes.
  Ticket Write(int file, const void* buffer);
  // Queues a read of the whole file into `buffer` (same rules), checked
  // against the checksums of its last completed writes (as of the call: a
  // write of the file still in flight then does not count).
  Ticket Read(int file, void* buffer);
  // The same for `bytes` bytes at `offset` of the file: `offset` a multiple
  // of the block size, `bytes` too unless the range reaches the end of the
  // file (INVALID_ARGUMENT at Wait otherwise).
  Ticket WriteRange(int file, uint64_t offset, uint64_t bytes, const void* buffer);
  Ticket ReadRange(int file, uint64_t offset, uint64_t bytes, void* buffer);
  // Blocks until the request is done; its result: OK; an I/O error naming
  // the path, the bytes and the OS's reason (RESOURCE_EXHAUSTED for a full
  // disk); DATA_LOSS when the file read back is short or a block's checksum
  // does not match (the file was changed under the store); FAILED_PRECONDITION
  // for a read of a block never written. Each ticket is waited for once.
  absl::Status Wait(Ticket ticket);

  int file_count() const;
  std::string path(int file) const;
  // The file's aligned size.
  uint64_t file_bytes(int file) const;
  // The CRC-32 of the file's contents as last written; 0 while a block of
  // it has not been written.
  uint32_t checksum(int file) const;
  const std::string& scratch_dir() const;
  // Bytes of the files, and the budget (0: none).
  uint64_t used_bytes() const;
  uint64_t budget_bytes() const;
  // Whether files are opened with O_DIRECT; when not, why.
  bool direct_io() const;
  const std::string& buffered_reason() const;
  DiskStats stats() const;

 private:
  class Impl;
  explicit DiskStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
