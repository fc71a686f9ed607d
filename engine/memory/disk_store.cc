#include "engine/memory/disk_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <new>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "engine/common/safe_path.h"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

constexpr char kProbeName[] = ".direct-io-probe";
constexpr char kFreeSpace[] =
    "free space on the disk or lower memory.disk_budget (and with it what the disk tier holds), or choose "
    "another memory.disk_dir";

absl::Status NotWritable(const std::string& what, int err) {
  return absl::InvalidArgumentError(
      absl::StrCat("memory.disk_dir: ", what, ": ", std::strerror(err), "; choose a writable directory"));
}

// A failed read or write: a full disk (which the reservation at AddFile
// should have made impossible, but a file system may still refuse, e.g.
// copy-on-write ones) is RESOURCE_EXHAUSTED, as the header promises.
absl::Status IoError(int err, const char* what, const std::string& path, uint64_t bytes, uint64_t offset) {
  const std::string message =
      absl::StrCat("memory.disk_dir: cannot ", what, " ", bytes, " bytes at offset ", offset, " of chunk file ", path,
                   ": ", std::strerror(err));
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(absl::StrCat(message, "; ", kFreeSpace));
  return absl::InternalError(message);
}

uint32_t Crc32(uint32_t crc, const char* data, uint64_t bytes) {
  uLong c = crc;
  while (bytes > 0) {
    const uInt n = static_cast<uInt>(std::min<uint64_t>(bytes, 1u << 30));
    c = crc32(c, reinterpret_cast<const Bytef*>(data), n);
    data += n;
    bytes -= n;
  }
  return static_cast<uint32_t>(c);
}

// mkdir -p; the message names the component that could not be made.
absl::Status MakeDirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i < path.size() && path[i] != '/') continue;
    const std::string prefix = path.substr(0, i);
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return NotWritable(prefix == path ? absl::StrCat("cannot create ", path)
                                        : absl::StrCat("cannot create ", prefix, " for ", path),
                         errno);
    }
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return NotWritable(absl::StrCat("cannot use ", path), errno);
  if (!S_ISDIR(st.st_mode)) return NotWritable(absl::StrCat("cannot use ", path), ENOTDIR);
  return absl::OkStatus();
}

// Whether O_DIRECT works in `scratch`: some file systems refuse it at open
// (EINVAL: tmpfs before Linux 6.6, some FUSE ones), others only at the first
// transfer, so the probe writes one aligned block. Returns "" when it works,
// else why not; an error when no file can be made there at all.
absl::StatusOr<std::string> ProbeDirectIo(const std::string& scratch) {
  const std::string probe = absl::StrCat(scratch, "/", kProbeName);
  UniqueFd fd(open(probe.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0600));
  if (!fd.valid()) {
    const int err = errno;
    if (err != EINVAL) return NotWritable(absl::StrCat("cannot create a file in ", scratch), err);
    return absl::StrCat("the file system of ", scratch, " does not support O_DIRECT (open: ", std::strerror(err),
                        ")");
  }
  unlink(probe.c_str());
  std::string reason;
  const AlignedBuffer block(kDiskAlignment);
  std::memset(block.data(), 0, block.size());
  ssize_t n;
  do {
    n = pwrite(fd.get(), block.data(), block.size(), 0);
  } while (n < 0 && errno == EINTR);
  const int err = errno;
  if (n < 0 && err == EINVAL) {
    reason = absl::StrCat("the file system of ", scratch, " does not support O_DIRECT (write: ", std::strerror(err),
                          ")");
  } else if (n < 0) {
    return NotWritable(absl::StrCat("cannot write a file in ", scratch), err);
  }
  return reason;
}

// A plain name inside the scratch directory.
bool IsPlainName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name != kProbeName &&
         name.find_first_of(std::string("/\0", 2)) == std::string::npos;
}

// One chunk file; immutable once added, so the I/O threads use it unlocked.
struct ChunkFile {
  std::string path;
  uint64_t bytes = 0;
  UniqueFd fd;
};

// What the store knows of a file's contents, block by block.
enum class BlockState : uint8_t { kNeverWritten, kWritten, kWriteFailed };
struct Contents {
  std::vector<BlockState> state;
  std::vector<uint32_t> crc;
};

struct Request {
  bool write = false;
  int file = -1;
  // Null for a request that failed before any I/O (done at once).
  const ChunkFile* chunk = nullptr;
  char* buffer = nullptr;
  // The range of the file, its first block, and its pieces.
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t first_block = 0;
  uint64_t piece_bytes = 0;
  int pieces = 0;
  // Reads: the checksums of the blocks' last writes completed when the read
  // was queued.
  std::vector<uint32_t> expected_crc;
  Clock::time_point queued;

  // The rest is guarded by Impl::mu_.
  int next_piece = 0;
  int pieces_done = 0;
  // Per block of the range: the checksum of what was written or read.
  std::vector<uint32_t> block_crc;
  // The error of the lowest-numbered failed piece: the one a sequential
  // transfer would have met first.
  int failed_piece = INT_MAX;
  absl::Status status;
  bool done = false;
  bool waited = false;
};

}  // namespace

AlignedBuffer::AlignedBuffer(uint64_t bytes) : size_(AlignToDisk(bytes)) {
  if (size_ == 0) return;
  if (posix_memalign(&data_, kDiskAlignment, size_) != 0) {
    data_ = nullptr;
    size_ = 0;
    throw std::bad_alloc();
  }
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

class DiskStore::Impl {
 public:
  Impl(const DiskStoreOptions& options, std::string scratch, std::string buffered_reason)
      : options_(options),
        scratch_(std::move(scratch)),
        direct_io_(buffered_reason.empty()),
        buffered_reason_(std::move(buffered_reason)),
        block_bytes_(std::max(kDiskAlignment, options.block_bytes / kDiskAlignment * kDiskAlignment)),
        piece_bytes_(std::max(block_bytes_, (options.piece_bytes + block_bytes_ - 1) / block_bytes_ * block_bytes_)) {
    threads_.reserve(static_cast<size_t>(options.io_threads));
    for (int i = 0; i < options.io_threads; ++i) threads_.emplace_back([this] { Work(); });
  }

  // The threads drain the queue before they stop: a write queued and never
  // waited for still lands, and no thread is left using a buffer or a file.
  ~Impl() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    for (std::thread& t : threads_) t.join();
    absl::MutexLock lock(&mu_);
    for (std::unique_ptr<ChunkFile>& file : files_) {
      unlink(file->path.c_str());
      file.reset();
    }
    rmdir(scratch_.c_str());
  }

  absl::StatusOr<int> AddFile(const std::string& name, uint64_t bytes) {
    if (!IsPlainName(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("DiskStore: chunk file name \"", name, "\" is not a plain file name"));
    }
    const uint64_t aligned = AlignToDisk(bytes);
    const std::string path = absl::StrCat(scratch_, "/", name);
    {
      // Counted before the file exists, so that concurrent additions cannot
      // pass the budget together.
      absl::MutexLock lock(&mu_);
      if (options_.budget_bytes > 0 && used_bytes_ + aligned > options_.budget_bytes) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "memory.disk_budget: chunk file ", path, " of ", aligned, " bytes would bring the disk tier to ",
            used_bytes_ + aligned, " bytes, over memory.disk_budget of ", options_.budget_bytes,
            " bytes (", used_bytes_, " already in use); raise memory.disk_budget"));
      }
      used_bytes_ += aligned;
    }
    absl::StatusOr<UniqueFd> fd = CreateFile(path, aligned);
    absl::MutexLock lock(&mu_);
    if (!fd.ok()) {
      used_bytes_ -= aligned;
      return fd.status();
    }
    auto file = std::make_unique<ChunkFile>();
    file->path = path;
    file->bytes = aligned;
    file->fd = *std::move(fd);
    files_.push_back(std::move(file));
    Contents& contents = contents_.emplace_back();
    const uint64_t blocks = (aligned + block_bytes_ - 1) / block_bytes_;
    contents.state.assign(blocks, BlockState::kNeverWritten);
    contents.crc.assign(blocks, 0);
    return static_cast<int>(files_.size() - 1);
  }

  // A whole file: `bytes` is UINT64_MAX.
  Ticket Queue(bool write, int file, uint64_t offset, uint64_t bytes, void* buffer) {
    absl::MutexLock lock(&mu_);
    const Ticket ticket = next_ticket_++;
    auto request = std::make_unique<Request>();
    Request* r = request.get();
    requests_.emplace(ticket, std::move(request));
    r->write = write;
    r->file = file;
    r->buffer = static_cast<char*>(buffer);
    r->queued = Clock::now();
    if (file < 0 || static_cast<size_t>(file) >= files_.size()) {
      r->status = absl::InvalidArgumentError(
          absl::StrCat("DiskStore: no chunk file ", file, " (", files_.size(), " files)"));
      r->done = true;
      return ticket;
    }
    const ChunkFile& chunk = *files_[static_cast<size_t>(file)];
    if (bytes == UINT64_MAX) bytes = chunk.bytes;
    if (reinterpret_cast<uintptr_t>(buffer) % kDiskAlignment != 0) {
      r->status = absl::InvalidArgumentError(absl::StrCat("DiskStore: the buffer for chunk file ", chunk.path,
                                                          " is not aligned to ", kDiskAlignment, " bytes"));
      r->done = true;
      return ticket;
    }
    if (offset % block_bytes_ != 0 || offset > chunk.bytes || bytes > chunk.bytes - offset ||
        (bytes % block_bytes_ != 0 && offset + bytes != chunk.bytes)) {
      r->status = absl::InvalidArgumentError(absl::StrCat(
          "DiskStore: ", bytes, " bytes at offset ", offset, " of chunk file ", chunk.path, " (", chunk.bytes,
          " bytes) are not whole blocks of ", block_bytes_, " bytes within it"));
      r->done = true;
      return ticket;
    }
    r->offset = offset;
    r->bytes = bytes;
    r->first_block = offset / block_bytes_;
    const uint64_t blocks = (bytes + block_bytes_ - 1) / block_bytes_;
    if (!write) {
      const Contents& contents = contents_[static_cast<size_t>(file)];
      for (uint64_t b = r->first_block; b < r->first_block + blocks; ++b) {
        if (contents.state[b] != BlockState::kWritten) {
          r->status = absl::FailedPreconditionError(absl::StrCat(
              "DiskStore: read of chunk file ", chunk.path, " at offset ", b * block_bytes_,
              contents.state[b] == BlockState::kNeverWritten ? ", which was never written"
                                                             : ", whose last write failed"));
          r->done = true;
          return ticket;
        }
      }
      r->expected_crc.assign(contents.crc.begin() + static_cast<ptrdiff_t>(r->first_block),
                             contents.crc.begin() + static_cast<ptrdiff_t>(r->first_block + blocks));
    }
    r->chunk = &chunk;
    r->piece_bytes = piece_bytes_;
    r->pieces = static_cast<int>((bytes + piece_bytes_ - 1) / piece_bytes_);
    r->block_crc.assign(blocks, 0);
    if (r->pieces == 0) {
      Complete(*r);
    } else {
      queue_.push_back(r);
    }
    return ticket;
  }

  absl::Status Wait(Ticket ticket) {
    const Clock::time_point start = Clock::now();
    absl::MutexLock lock(&mu_);
    auto it = requests_.find(ticket);
    if (it == requests_.end() || it->second->waited) {
      return absl::InvalidArgumentError(
          absl::StrCat("DiskStore: ticket ", ticket, " was never issued or is already waited for"));
    }
    Request* r = it->second.get();
    r->waited = true;
    mu_.Await(absl::Condition(&r->done));
    absl::Status status = std::move(r->status);
    requests_.erase(ticket);
    stats_.wait_seconds += SecondsSince(start);
    return status;
  }

  int file_count() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(files_.size());
  }
  std::string path(int file) const {
    absl::MutexLock lock(&mu_);
    return file >= 0 && static_cast<size_t>(file) < files_.size() ? files_[static_cast<size_t>(file)]->path : "";
  }
  uint64_t file_bytes(int file) const {
    absl::MutexLock lock(&mu_);
    return file >= 0 && static_cast<size_t>(file) < files_.size() ? files_[static_cast<size_t>(file)]->bytes : 0;
  }
  uint32_t checksum(int file) const {
    absl::MutexLock lock(&mu_);
    if (file < 0 || static_cast<size_t>(file) >= contents_.size()) return 0;
    const Contents& contents = contents_[static_cast<size_t>(file)];
    const uint64_t size = files_[static_cast<size_t>(file)]->bytes;
    uLong crc = crc32(0L, Z_NULL, 0);
    for (size_t b = 0; b < contents.crc.size(); ++b) {
      if (contents.state[b] != BlockState::kWritten) return 0;
      const uint64_t length = std::min(block_bytes_, size - b * block_bytes_);
      crc = crc32_combine(crc, contents.crc[b], static_cast<z_off_t>(length));
    }
    return static_cast<uint32_t>(crc);
  }
  const std::string& scratch_dir() const { return scratch_; }
  uint64_t used_bytes() const {
    absl::MutexLock lock(&mu_);
    return used_bytes_;
  }
  uint64_t budget_bytes() const { return options_.budget_bytes; }
  bool direct_io() const { return direct_io_; }
  const std::string& buffered_reason() const { return buffered_reason_; }
  DiskStats stats() const {
    absl::MutexLock lock(&mu_);
    return stats_;
  }

 private:
  // Creates the file and reserves its space, so that a full disk shows now.
  absl::StatusOr<UniqueFd> CreateFile(const std::string& path, uint64_t bytes) {
    const int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | (direct_io_ ? O_DIRECT : 0);
    UniqueFd fd(open(path.c_str(), flags, 0600));
    if (!fd.valid()) {
      if (errno == EEXIST) {
        return absl::InvalidArgumentError(absl::StrCat("DiskStore: chunk file ", path, " was added twice"));
      }
      return absl::InternalError(
          absl::StrCat("memory.disk_dir: cannot create chunk file ", path, ": ", std::strerror(errno)));
    }
    if (bytes == 0) return fd;
    int err = 0;
    do {
      err = fallocate(fd.get(), 0, 0, static_cast<off_t>(bytes)) == 0 ? 0 : errno;
    } while (err == EINTR);
    if (err == EOPNOTSUPP || err == ENOSYS) {
      // Nothing reserved: the full disk, if any, shows at the first write.
      err = ftruncate(fd.get(), static_cast<off_t>(bytes)) == 0 ? 0 : errno;
    }
    if (err == 0) return fd;
    fd = UniqueFd();
    unlink(path.c_str());
    if (err == ENOSPC || err == EDQUOT) {
      return absl::ResourceExhaustedError(absl::StrCat("memory.disk_dir: no space for chunk file ", path, " of ",
                                                       bytes, " bytes: ", std::strerror(err), "; ", kFreeSpace));
    }
    return absl::InternalError(absl::StrCat("memory.disk_dir: cannot reserve ", bytes, " bytes for chunk file ",
                                            path, ": ", std::strerror(err)));
  }

  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); }

  // Pieces go to whichever thread is free, in queue order: a large file is
  // spread over every thread, and requests start in the order queued.
  void Work() {
    for (;;) {
      Request* r = nullptr;
      int piece = 0;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &Impl::HasWork));
        if (queue_.empty()) return;
        r = queue_.front();
        piece = r->next_piece++;
        if (r->next_piece == r->pieces) queue_.pop_front();
      }
      // The piece's blocks' checksums go straight into the request: each
      // piece has blocks of its own.
      double checksum_seconds = 0;
      absl::Status status = Transfer(*r, piece, &checksum_seconds);
      absl::MutexLock lock(&mu_);
      stats_.checksum_seconds += checksum_seconds;
      if (!status.ok() && piece < r->failed_piece) {
        r->failed_piece = piece;
        r->status = std::move(status);
      }
      if (++r->pieces_done == r->pieces) Complete(*r);
    }
  }

  // The checksums of the blocks of a piece (at `start` of the request).
  void BlockChecksums(Request& r, uint64_t start, uint64_t length, double* checksum_seconds) const {
    const Clock::time_point begin = Clock::now();
    for (uint64_t at = 0; at < length; at += block_bytes_) {
      const uint64_t n = std::min(block_bytes_, length - at);
      r.block_crc[(start + at) / block_bytes_] = Crc32(0, r.buffer + start + at, n);
    }
    *checksum_seconds += SecondsSince(begin);
  }

  // One piece, unlocked: the request's fields read here are fixed at Queue,
  // and the piece's own blocks' checksums are its alone.
  absl::Status Transfer(Request& r, int piece, double* checksum_seconds) const {
    const ChunkFile& file = *r.chunk;
    const uint64_t start = static_cast<uint64_t>(piece) * r.piece_bytes;
    const uint64_t length = std::min(r.piece_bytes, r.bytes - start);
    const uint64_t offset = r.offset + start;
    char* data = r.buffer + start;
    if (r.write) BlockChecksums(r, start, length, checksum_seconds);
    uint64_t done = 0;
    while (done < length) {
      const ssize_t n = r.write ? pwrite(file.fd.get(), data + done, length - done, static_cast<off_t>(offset + done))
                                : pread(file.fd.get(), data + done, length - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return IoError(errno, r.write ? "write" : "read", file.path, length - done, offset + done);
      if (n == 0 && r.write) return IoError(EIO, "write", file.path, length - done, offset + done);
      if (n == 0 || (!r.write && static_cast<uint64_t>(n) < length - done)) {
        // The end of the file before the end of the piece: cut short under us.
        struct stat st;
        if (fstat(file.fd.get(), &st) == 0 && static_cast<uint64_t>(st.st_size) < offset + length) {
          return absl::DataLossError(absl::StrCat(
              "memory.disk_dir: chunk file ", file.path, " is short: ", st.st_size, " bytes where ", file.bytes,
              " were written; the file was truncated or damaged under the job"));
        }
        if (n == 0) return IoError(EIO, "read", file.path, length - done, offset + done);
      }
      done += static_cast<uint64_t>(n);
    }
    if (!r.write) BlockChecksums(r, start, length, checksum_seconds);
    return absl::OkStatus();
  }

  void Complete(Request& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Contents& contents = contents_[static_cast<size_t>(r.file)];
    if (r.write) {
      for (size_t i = 0; i < r.block_crc.size(); ++i) {
        contents.state[r.first_block + i] = r.status.ok() ? BlockState::kWritten : BlockState::kWriteFailed;
        contents.crc[r.first_block + i] = r.block_crc[i];
      }
    } else if (r.status.ok()) {
      for (size_t i = 0; i < r.block_crc.size(); ++i) {
        if (r.block_crc[i] == r.expected_crc[i]) continue;
        r.status = absl::DataLossError(absl::StrFormat(
            "memory.disk_dir: chunk file %s failed its checksum at offset %d (read CRC %08x, written %08x): the "
            "file was changed or damaged under the job",
            r.chunk->path, (r.first_block + i) * block_bytes_, r.block_crc[i], r.expected_crc[i]));
        break;
      }
    }
    const double seconds = SecondsSince(r.queued);
    if (r.write) {
      ++stats_.writes;
      stats_.write_seconds += seconds;
      if (r.status.ok()) stats_.write_bytes += r.bytes;
    } else {
      ++stats_.reads;
      stats_.read_seconds += seconds;
      if (r.status.ok()) stats_.read_bytes += r.bytes;
    }
    r.done = true;
  }

  const DiskStoreOptions options_;
  const std::string scratch_;
  const bool direct_io_;
  const std::string buffered_reason_;
  const uint64_t block_bytes_;
  const uint64_t piece_bytes_;

  mutable absl::Mutex mu_;
  // Owned here so that a ChunkFile stays put while the vector grows.
  std::vector<std::unique_ptr<ChunkFile>> files_ ABSL_GUARDED_BY(mu_);
  std::vector<Contents> contents_ ABSL_GUARDED_BY(mu_);
  uint64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::unordered_map<Ticket, std::unique_ptr<Request>> requests_ ABSL_GUARDED_BY(mu_);
  Ticket next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  // Requests with pieces not yet taken by a thread.
  std::deque<Request*> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  DiskStats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

absl::StatusOr<std::unique_ptr<DiskStore>> DiskStore::Open(const DiskStoreOptions& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("memory.disk_dir: no directory given");
  if (options.io_threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("DiskStore: io_threads is ", options.io_threads, "; at least 1"));
  }
  if (absl::Status made = MakeDirs(options.dir); !made.ok()) return made;
  std::string scratch = absl::StrCat(options.dir, options.dir.back() == '/' ? "" : "/", "ferry-chunks-XXXXXX");
  if (mkdtemp(scratch.data()) == nullptr) {
    return NotWritable(absl::StrCat("cannot create a scratch directory in ", options.dir), errno);
  }
  std::string buffered_reason = "memory.disk_direct_io is off";
  if (options.direct_io) {
    absl::StatusOr<std::string> probed = ProbeDirectIo(scratch);
    if (!probed.ok()) {
      rmdir(scratch.c_str());
      return probed.status();
    }
    buffered_reason = *std::move(probed);
  }
  return std::unique_ptr<DiskStore>(
      new DiskStore(std::make_unique<Impl>(options, std::move(scratch), std::move(buffered_reason))));
}

DiskStore::DiskStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DiskStore::~DiskStore() = default;

absl::StatusOr<int> DiskStore::AddFile(const std::string& name, uint64_t bytes) { return impl_->AddFile(name, bytes); }
DiskStore::Ticket DiskStore::Write(int file, const void* buffer) {
  // Only read from: the const is dropped so one request type serves both.
  return impl_->Queue(/*write=*/true, file, 0, UINT64_MAX, const_cast<void*>(buffer));
}
DiskStore::Ticket DiskStore::Read(int file, void* buffer) {
  return impl_->Queue(/*write=*/false, file, 0, UINT64_MAX, buffer);
}
DiskStore::Ticket DiskStore::WriteRange(int file, uint64_t offset, uint64_t bytes, const void* buffer) {
  return impl_->Queue(/*write=*/true, file, offset, bytes, const_cast<void*>(buffer));
}
DiskStore::Ticket DiskStore::ReadRange(int file, uint64_t offset, uint64_t bytes, void* buffer) {
  return impl_->Queue(/*write=*/false, file, offset, bytes, buffer);
}
absl::Status DiskStore::Wait(Ticket ticket) { return impl_->Wait(ticket); }
int DiskStore::file_count() const { return impl_->file_count(); }
std::string DiskStore::path(int file) const { return impl_->path(file); }
uint64_t DiskStore::file_bytes(int file) const { return impl_->file_bytes(file); }
uint32_t DiskStore::checksum(int file) const { return impl_->checksum(file); }
const std::string& DiskStore::scratch_dir() const { return impl_->scratch_dir(); }
uint64_t DiskStore::used_bytes() const { return impl_->used_bytes(); }
uint64_t DiskStore::budget_bytes() const { return impl_->budget_bytes(); }
bool DiskStore::direct_io() const { return impl_->direct_io(); }
const std::string& DiskStore::buffered_reason() const { return impl_->buffered_reason(); }
DiskStats DiskStore::stats() const { return impl_->stats(); }

}  // namespace ferry
