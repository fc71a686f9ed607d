#include "engine/memory/disk_store.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

// A path named `name` under the test's temporary directory, with nothing
// there (an earlier run's leftovers removed).
std::string EmptyTestPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/" + name;
  std::system(("rm -rf '" + path + "'").c_str());
  return path;
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

AlignedBuffer Random(uint64_t bytes, uint64_t seed) {
  AlignedBuffer buffer(bytes);
  std::mt19937_64 rng(seed);
  auto* words = static_cast<uint64_t*>(buffer.data());
  for (uint64_t i = 0; i < buffer.size() / 8; ++i) words[i] = rng();
  return buffer;
}

bool SameBytes(const AlignedBuffer& a, const AlignedBuffer& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

std::unique_ptr<DiskStore> OpenOrDie(DiskStoreOptions options) {
  absl::StatusOr<std::unique_ptr<DiskStore>> store = DiskStore::Open(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

DiskStoreOptions Options(const std::string& name) {
  DiskStoreOptions options;
  options.dir = EmptyTestPath(name);
  return options;
}

// Writes `data` to `file` and waits.
absl::Status WriteNow(DiskStore& store, int file, const AlignedBuffer& data) {
  return store.Wait(store.Write(file, data.data()));
}

TEST(AlignedBufferTest, RoundsUpAndAligns) {
  AlignedBuffer buffer(10000);
  EXPECT_EQ(buffer.size(), 12288u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data()) % kDiskAlignment, 0u);
  AlignedBuffer moved = std::move(buffer);
  EXPECT_EQ(moved.size(), 12288u);
  EXPECT_EQ(buffer.data(), nullptr);
  EXPECT_EQ(AlignedBuffer(0).size(), 0u);
}

TEST(DiskStoreTest, RoundTripsManyRequestsInFlightWaitedOutOfOrder) {
  std::unique_ptr<DiskStore> store = OpenOrDie(Options("roundtrip"));
  ASSERT_NE(store, nullptr);
  const std::vector<uint64_t> sizes = {4096, 10000, 65536, 1, 200000, 8192, 123457, 4096 * 3};
  std::vector<AlignedBuffer> written;
  std::vector<int> files;
  for (size_t i = 0; i < sizes.size(); ++i) {
    absl::StatusOr<int> file = store->AddFile(absl::StrCat("chunk", i), sizes[i]);
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ(*file, static_cast<int>(i));
    EXPECT_EQ(store->file_bytes(*file), AlignToDisk(sizes[i]));
    EXPECT_EQ(store->path(*file), absl::StrCat(store->scratch_dir(), "/chunk", i));
    files.push_back(*file);
    written.push_back(Random(sizes[i], i + 1));
  }
  EXPECT_EQ(store->file_count(), static_cast<int>(sizes.size()));

  std::vector<DiskStore::Ticket> tickets;
  for (size_t i = 0; i < files.size(); ++i) tickets.push_back(store->Write(files[i], written[i].data()));
  for (size_t i = tickets.size(); i-- > 0;) ASSERT_TRUE(store->Wait(tickets[i]).ok()) << i;

  std::vector<AlignedBuffer> read;
  for (uint64_t size : sizes) read.emplace_back(size);
  tickets.clear();
  for (size_t i = 0; i < files.size(); ++i) tickets.push_back(store->Read(files[i], read[i].data()));
  std::vector<size_t> order(files.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  for (size_t i : order) ASSERT_TRUE(store->Wait(tickets[i]).ok()) << i;
  for (size_t i = 0; i < files.size(); ++i) EXPECT_TRUE(SameBytes(read[i], written[i])) << "file " << i;

  uint64_t total = 0;
  for (uint64_t size : sizes) total += AlignToDisk(size);
  EXPECT_EQ(store->used_bytes(), total);
  const DiskStats stats = store->stats();
  EXPECT_EQ(stats.writes, static_cast<int64_t>(sizes.size()));
  EXPECT_EQ(stats.reads, static_cast<int64_t>(sizes.size()));
  EXPECT_EQ(stats.write_bytes, total);
  EXPECT_EQ(stats.read_bytes, total);
}

TEST(DiskStoreTest, LargeFileSpreadOverPiecesKeepsTheWholeFilesCrc) {
  DiskStoreOptions options = Options("pieces");
  options.piece_bytes = 8 << 10;
  options.block_bytes = 4 << 10;
  options.io_threads = 4;
  std::unique_ptr<DiskStore> store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  constexpr uint64_t kBytes = 100 << 10;
  absl::StatusOr<int> file = store->AddFile("big", kBytes);
  ASSERT_TRUE(file.ok()) << file.status();
  const AlignedBuffer data = Random(kBytes, 42);
  ASSERT_TRUE(WriteNow(*store, *file, data).ok());
  const uint32_t single_shot =
      static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0), static_cast<const Bytef*>(data.data()), data.size()));
  EXPECT_EQ(store->checksum(*file), single_shot);

  AlignedBuffer back(kBytes);
  ASSERT_TRUE(store->Wait(store->Read(*file, back.data())).ok());
  EXPECT_TRUE(SameBytes(back, data));

  // A second write replaces the recorded checksum.
  const AlignedBuffer other = Random(kBytes, 43);
  ASSERT_TRUE(WriteNow(*store, *file, other).ok());
  EXPECT_NE(store->checksum(*file), single_shot);
  ASSERT_TRUE(store->Wait(store->Read(*file, back.data())).ok());
  EXPECT_TRUE(SameBytes(back, other));
}

TEST(DiskStoreTest, RangesOfBlocksReadWhatWasWrittenWholeOrInRanges) {
  DiskStoreOptions options = Options("ranges");
  options.block_bytes = 16 << 10;
  options.piece_bytes = 32 << 10;
  std::unique_ptr<DiskStore> store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  // Seven and a half blocks: the last range reaches the end mid-block.
  constexpr uint64_t kBytes = (15 << 10) * 8;
  absl::StatusOr<int> file = store->AddFile("states", kBytes);
  ASSERT_TRUE(file.ok()) << file.status();
  const AlignedBuffer whole = Random(kBytes, 7);
  ASSERT_TRUE(WriteNow(*store, *file, whole).ok());
  const uint32_t single_shot =
      static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0), static_cast<const Bytef*>(whole.data()), whole.size()));
  EXPECT_EQ(store->checksum(*file), single_shot);

  // Part of a whole write, read back alone.
  AlignedBuffer part(48 << 10);
  ASSERT_TRUE(store->Wait(store->ReadRange(*file, 32 << 10, 48 << 10, part.data())).ok());
  EXPECT_EQ(std::memcmp(part.data(), static_cast<const char*>(whole.data()) + (32 << 10), 48 << 10), 0);

  // Ranges written over it, the last reaching the end, then read back whole.
  const AlignedBuffer head = Random(16 << 10, 8);
  const uint64_t tail_offset = 96 << 10, tail_bytes = kBytes - tail_offset;
  const AlignedBuffer tail = Random(tail_bytes, 9);
  const DiskStore::Ticket a = store->WriteRange(*file, 0, 16 << 10, head.data());
  const DiskStore::Ticket b = store->WriteRange(*file, tail_offset, tail_bytes, tail.data());
  ASSERT_TRUE(store->Wait(b).ok());
  ASSERT_TRUE(store->Wait(a).ok());
  AlignedBuffer back(kBytes);
  ASSERT_TRUE(store->Wait(store->Read(*file, back.data())).ok());
  const char* got = static_cast<const char*>(back.data());
  EXPECT_EQ(std::memcmp(got, head.data(), 16 << 10), 0);
  EXPECT_EQ(std::memcmp(got + (16 << 10), static_cast<const char*>(whole.data()) + (16 << 10), 80 << 10), 0);
  EXPECT_EQ(std::memcmp(got + tail_offset, tail.data(), tail_bytes), 0);
  EXPECT_NE(store->checksum(*file), single_shot);
  const DiskStats stats = store->stats();
  EXPECT_EQ(stats.write_bytes, kBytes + (16 << 10) + tail_bytes);
  EXPECT_EQ(stats.read_bytes, kBytes + (48 << 10));
}

TEST(DiskStoreTest, RangesMustBeWholeBlocksWithinTheFile) {
  DiskStoreOptions options = Options("badranges");
  options.block_bytes = 8 << 10;
  std::unique_ptr<DiskStore> store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  absl::StatusOr<int> file = store->AddFile("states", 40 << 10);
  ASSERT_TRUE(file.ok()) << file.status();
  AlignedBuffer buffer(64 << 10);
  for (const auto& [offset, bytes] : std::vector<std::pair<uint64_t, uint64_t>>{
           {4 << 10, 8 << 10}, {0, 12 << 10}, {32 << 10, 16 << 10}, {48 << 10, 0}}) {
    const absl::Status status = store->Wait(store->WriteRange(*file, offset, bytes, buffer.data()));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << offset << " " << bytes;
    EXPECT_THAT(std::string(status.message()), HasSubstr("whole blocks"));
  }
  // Written in part: the rest was never written.
  ASSERT_TRUE(store->Wait(store->WriteRange(*file, 8 << 10, 8 << 10, buffer.data())).ok());
  EXPECT_TRUE(store->Wait(store->ReadRange(*file, 8 << 10, 8 << 10, buffer.data())).ok());
  EXPECT_EQ(store->checksum(*file), 0u);
  const absl::Status unwritten = store->Wait(store->ReadRange(*file, 8 << 10, 16 << 10, buffer.data()));
  EXPECT_EQ(unwritten.code(), absl::StatusCode::kFailedPrecondition) << unwritten;
  EXPECT_THAT(std::string(unwritten.message()), HasSubstr("at offset 16384, which was never written"));
}

TEST(DiskStoreTest, AChangedBlockFailsOnlyTheReadsThatCoverIt) {
  DiskStoreOptions options = Options("flippedblock");
  options.block_bytes = 8 << 10;
  std::unique_ptr<DiskStore> store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  absl::StatusOr<int> file = store->AddFile("states", 32 << 10);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE(WriteNow(*store, *file, Random(32 << 10, 3)).ok());
  const int fd = open(store->path(*file).c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  char byte = 0;
  ASSERT_EQ(pread(fd, &byte, 1, 20000), 1);
  byte ^= 0x01;
  ASSERT_EQ(pwrite(fd, &byte, 1, 20000), 1);
  close(fd);
  AlignedBuffer back(32 << 10);
  EXPECT_TRUE(store->Wait(store->ReadRange(*file, 0, 16 << 10, back.data())).ok());
  const absl::Status status = store->Wait(store->ReadRange(*file, 16 << 10, 16 << 10, back.data()));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("checksum at offset 16384"));
}

TEST(DiskStoreTest, ByteChangedOnDiskIsDataLoss) {
  DiskStoreOptions options = Options("flipped");
  options.piece_bytes = 8 << 10;
  options.block_bytes = 4 << 10;
  std::unique_ptr<DiskStore> store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  absl::StatusOr<int> file = store->AddFile("states", 40000);
  ASSERT_TRUE(file.ok()) << file.status();
  const AlignedBuffer data = Random(40000, 1);
  ASSERT_TRUE(WriteNow(*store, *file, data).ok());

  const int fd = open(store->path(*file).c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  char byte = 0;
  ASSERT_EQ(pread(fd, &byte, 1, 20001), 1);
  byte ^= 0x10;
  ASSERT_EQ(pwrite(fd, &byte, 1, 20001), 1);
  close(fd);

  AlignedBuffer back(40000);
  const absl::Status status = store->Wait(store->Read(*file, back.data()));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(store->path(*file)));
  EXPECT_THAT(std::string(status.message()), HasSubstr("checksum"));
}

TEST(DiskStoreTest, TruncatedFileIsDataLoss) {
  DiskStoreOptions options = Options("truncated");
  options.piece_bytes = 8 << 10;
  options.block_bytes = 4 << 10;
  std::unique_ptr<DiskStore> store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  absl::StatusOr<int> file = store->AddFile("states", 64 << 10);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE(WriteNow(*store, *file, Random(64 << 10, 2)).ok());
  // Mid-block, so that a direct read meets the end inside a block.
  ASSERT_EQ(truncate(store->path(*file).c_str(), 10000), 0) << std::strerror(errno);

  AlignedBuffer back(64 << 10);
  const absl::Status status = store->Wait(store->Read(*file, back.data()));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(store->path(*file)));
  EXPECT_THAT(std::string(status.message()), HasSubstr("10000 bytes where 65536"));
}

TEST(DiskStoreTest, ReadOfAFileNeverWrittenIsFailedPrecondition) {
  std::unique_ptr<DiskStore> store = OpenOrDie(Options("unwritten"));
  ASSERT_NE(store, nullptr);
  absl::StatusOr<int> file = store->AddFile("states", 8192);
  ASSERT_TRUE(file.ok()) << file.status();
  AlignedBuffer back(8192);
  const absl::Status status = store->Wait(store->Read(*file, back.data()));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("never written"));
}

TEST(DiskStoreTest, MisuseIsReportedByWait) {
  std::unique_ptr<DiskStore> store = OpenOrDie(Options("misuse"));
  ASSERT_NE(store, nullptr);
  absl::StatusOr<int> file = store->AddFile("states", 8192);
  ASSERT_TRUE(file.ok()) << file.status();
  AlignedBuffer buffer(8192 + kDiskAlignment);
  EXPECT_EQ(store->Wait(store->Write(7, buffer.data())).code(), absl::StatusCode::kInvalidArgument);
  const absl::Status unaligned = store->Wait(store->Write(*file, static_cast<char*>(buffer.data()) + 512));
  EXPECT_EQ(unaligned.code(), absl::StatusCode::kInvalidArgument) << unaligned;
  EXPECT_THAT(std::string(unaligned.message()), HasSubstr("aligned"));
  const DiskStore::Ticket ticket = store->Write(*file, buffer.data());
  EXPECT_TRUE(store->Wait(ticket).ok());
  EXPECT_EQ(store->Wait(ticket).code(), absl::StatusCode::kInvalidArgument) << "waited twice";
  EXPECT_EQ(store->AddFile("states", 8192).status().code(), absl::StatusCode::kInvalidArgument) << "a name twice";
  EXPECT_EQ(store->AddFile("../escape", 8192).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->used_bytes(), 8192u);
}

TEST(DiskStoreTest, BudgetIsEnforcedAtAddFile) {
  DiskStoreOptions options = Options("budget");
  options.budget_bytes = 64 << 10;
  std::unique_ptr<DiskStore> store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->budget_bytes(), 64u << 10);
  ASSERT_TRUE(store->AddFile("a", 40000).ok());  // 40960 aligned
  const absl::StatusOr<int> over = store->AddFile("b", 30000);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("memory.disk_budget"));
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("65536"));
  EXPECT_EQ(store->used_bytes(), 40960u);
  EXPECT_FALSE(Exists(store->scratch_dir() + "/b"));
  // What is left still fits.
  EXPECT_TRUE(store->AddFile("c", 24576).ok());
  EXPECT_EQ(store->used_bytes(), 65536u);
}

TEST(DiskStoreTest, DestructionRemovesTheScratchDirectory) {
  const DiskStoreOptions options = Options("destroyed/deeper");
  std::unique_ptr<DiskStore> store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  const std::string scratch = store->scratch_dir();
  EXPECT_EQ(scratch.rfind(options.dir + "/ferry-chunks-", 0), 0u) << scratch;
  std::vector<AlignedBuffer> buffers;
  std::vector<std::string> paths;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<int> file = store->AddFile(absl::StrCat("f", i), 32 << 10);
    ASSERT_TRUE(file.ok()) << file.status();
    paths.push_back(store->path(*file));
    buffers.push_back(Random(32 << 10, static_cast<uint64_t>(i)));
    // Left in flight: the destructor finishes them.
    store->Write(*file, buffers.back().data());
  }
  for (const std::string& path : paths) EXPECT_TRUE(Exists(path)) << path;
  store.reset();
  for (const std::string& path : paths) EXPECT_FALSE(Exists(path)) << path;
  EXPECT_FALSE(Exists(scratch));
  EXPECT_TRUE(Exists(options.dir)) << "only the scratch directory is the store's";
}

TEST(DiskStoreTest, DirectoryThatCannotBeMadeIsInvalidArgument) {
  const std::string file = EmptyTestPath("a_file");
  ASSERT_EQ(std::system(("touch '" + file + "'").c_str()), 0);
  for (const std::string& dir : {file, file + "/sub/dir"}) {
    DiskStoreOptions options;
    options.dir = dir;
    const absl::StatusOr<std::unique_ptr<DiskStore>> store = DiskStore::Open(options);
    EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument) << store.status();
    EXPECT_THAT(std::string(store.status().message()), HasSubstr("memory.disk_dir"));
    EXPECT_THAT(std::string(store.status().message()), HasSubstr("Not a directory"));
  }
}

TEST(DiskStoreTest, DirectIoOrAReason) {
  std::unique_ptr<DiskStore> store = OpenOrDie(Options("direct"));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->direct_io(), store->buffered_reason().empty()) << store->buffered_reason();

  DiskStoreOptions buffered_options = Options("buffered");
  buffered_options.direct_io = false;
  std::unique_ptr<DiskStore> buffered = OpenOrDie(buffered_options);
  ASSERT_NE(buffered, nullptr);
  EXPECT_FALSE(buffered->direct_io());
  EXPECT_THAT(buffered->buffered_reason(), HasSubstr("memory.disk_direct_io"));
  absl::StatusOr<int> file = buffered->AddFile("states", 50000);
  ASSERT_TRUE(file.ok()) << file.status();
  const AlignedBuffer data = Random(50000, 9);
  ASSERT_TRUE(WriteNow(*buffered, *file, data).ok());
  AlignedBuffer back(50000);
  ASSERT_TRUE(buffered->Wait(buffered->Read(*file, back.data())).ok());
  EXPECT_TRUE(SameBytes(back, data));
}

TEST(DiskStoreTest, ThreadsShareTheStore) {
  DiskStoreOptions options = Options("shared");
  options.piece_bytes = 16 << 10;
  options.io_threads = 3;
  std::unique_ptr<DiskStore> store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  constexpr int kCallers = 4;
  std::vector<std::thread> callers;
  std::vector<int> ok(kCallers, 0);
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&store, &ok, c] {
      absl::StatusOr<int> file = store->AddFile(absl::StrCat("caller", c), 100000);
      if (!file.ok()) return;
      AlignedBuffer back(100000);
      for (int round = 0; round < 5; ++round) {
        const AlignedBuffer data = Random(100000, static_cast<uint64_t>(c * 100 + round));
        if (!store->Wait(store->Write(*file, data.data())).ok()) return;
        if (!store->Wait(store->Read(*file, back.data())).ok()) return;
        if (!SameBytes(back, data)) return;
      }
      ok[static_cast<size_t>(c)] = 1;
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(ok[static_cast<size_t>(c)], 1) << "caller " << c;
  EXPECT_EQ(store->stats().writes, kCallers * 5);
}

// A full disk shows at AddFile, with the path and the bytes: a 1 MiB tmpfs
// in a mount namespace of the test's own.
TEST(DiskStoreTest, FullDiskIsResourceExhaustedAtAddFile) {
  const std::string dir = EmptyTestPath("small_fs");
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0) << std::strerror(errno);
  if (unshare(CLONE_NEWNS) != 0) {
    GTEST_SKIP() << "unshare(CLONE_NEWNS): " << std::strerror(errno)
                 << " (needs CAP_SYS_ADMIN and a single-threaded process)";
  }
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    GTEST_SKIP() << "making mounts private: " << std::strerror(errno);
  }
  if (mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=1m") != 0) {
    GTEST_SKIP() << "mounting a tmpfs: " << std::strerror(errno);
  }
  {
    DiskStoreOptions options;
    options.dir = dir + "/disk";
    std::unique_ptr<DiskStore> store = OpenOrDie(options);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->direct_io(), store->buffered_reason().empty()) << store->buffered_reason();
    const absl::StatusOr<int> big = store->AddFile("big", 4 << 20);
    EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted) << big.status();
    EXPECT_THAT(std::string(big.status().message()), HasSubstr(store->scratch_dir() + "/big"));
    EXPECT_THAT(std::string(big.status().message()), HasSubstr("4194304 bytes"));
    EXPECT_THAT(std::string(big.status().message()), HasSubstr("memory.disk_dir"));
    EXPECT_EQ(store->used_bytes(), 0u);
    EXPECT_FALSE(Exists(store->scratch_dir() + "/big")) << "the failed file is removed";
    // The space the failed reservation took is back.
    absl::StatusOr<int> small = store->AddFile("small", 256 << 10);
    ASSERT_TRUE(small.ok()) << small.status();
    const AlignedBuffer data = Random(256 << 10, 5);
    ASSERT_TRUE(WriteNow(*store, *small, data).ok());
    AlignedBuffer back(256 << 10);
    ASSERT_TRUE(store->Wait(store->Read(*small, back.data())).ok());
    EXPECT_TRUE(SameBytes(back, data));
  }
  EXPECT_EQ(umount2(dir.c_str(), MNT_DETACH), 0) << std::strerror(errno);
}

}  // namespace
}  // namespace ferry
