// The checkpoint store through an open root directory (WriteCheckpointIn,
// LoadLatestCheckpointIn, LoadCheckpointIn): links put inside the root, or
// in place of its path, never lead a read or a write outside.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "engine/checkpoint/checkpoint_store.h"
#include "engine/checkpoint/test_files.h"

namespace ferry {
namespace {

using testing::Slurp;

// An empty directory for the test.
std::string Fresh(const std::string& name) {
  const std::string dir = testing::EmptyTestPath("confined-" + name);
  EXPECT_EQ(mkdir(dir.c_str(), 0755), 0);
  return dir;
}

CheckpointContents At(int64_t step) {
  CheckpointContents c;
  c.step = step;
  c.meta["training"] = "t1";
  c.files["rank0.model"] = std::string(100, 'm') + std::to_string(step);
  return c;
}

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

int OpenDir(const std::string& path) { return open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); }

TEST(CheckpointStoreConfinedTest, RoundTripsThroughTheDescriptor) {
  const std::string root = Fresh("roundtrip");
  const int fd = OpenDir(root);
  ASSERT_GE(fd, 0);
  for (int64_t step : {10, 20, 30}) ASSERT_TRUE(WriteCheckpointIn(fd, root, At(step), 2).ok());
  absl::StatusOr<LoadedCheckpoint> latest = LoadLatestCheckpointIn(fd, root);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->contents.step, 30);
  EXPECT_EQ(latest->path, root + "/step-000000000030");
  EXPECT_EQ(latest->contents.files, At(30).files);
  absl::StatusOr<LoadedCheckpoint> older = LoadCheckpointIn(fd, root, 20);
  ASSERT_TRUE(older.ok()) << older.status();
  EXPECT_EQ(older->contents.step, 20);
  EXPECT_FALSE(Exists(root + "/step-000000000010"));
  EXPECT_EQ(Slurp(root + "/latest"), "step-000000000030\n");
  close(fd);
}

// The root's path is replaced by a link to another directory while the
// directory is open: writes go on into the directory that was opened.
TEST(CheckpointStoreConfinedTest, ARootSwappedForALinkIsNotFollowed) {
  const std::string base = Fresh("swap");
  const std::string root = base + "/ckpt", outside = base + "/outside";
  ASSERT_EQ(mkdir(root.c_str(), 0755), 0);
  ASSERT_EQ(mkdir(outside.c_str(), 0755), 0);
  const int fd = OpenDir(root);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(rename(root.c_str(), (base + "/moved").c_str()), 0);
  ASSERT_EQ(symlink(outside.c_str(), root.c_str()), 0);
  ASSERT_TRUE(WriteCheckpointIn(fd, root, At(5), 2).ok());
  EXPECT_TRUE(Exists(base + "/moved/step-000000000005/MANIFEST"));
  EXPECT_FALSE(Exists(outside + "/step-000000000005"));
  close(fd);
}

// Links planted inside the root: a `latest.tmp` pointing at a file outside
// is removed, not written through; a step directory that is a link to a
// checkpoint elsewhere is skipped, not read; a leftover `.tmp-` link is
// removed without touching what it points at.
TEST(CheckpointStoreConfinedTest, LinksInsideTheRootAreNeverFollowed) {
  const std::string base = Fresh("planted");
  const std::string root = base + "/ckpt", outside = base + "/outside";
  ASSERT_EQ(mkdir(root.c_str(), 0755), 0);
  ASSERT_EQ(mkdir(outside.c_str(), 0755), 0);
  std::ofstream(outside + "/victim") << "precious";
  ASSERT_TRUE(WriteCheckpoint(outside + "/other", At(99), 1).ok());
  ASSERT_EQ(mkdir((outside + "/victim-dir").c_str(), 0755), 0);
  std::ofstream(outside + "/victim-dir/file") << "keep";

  ASSERT_EQ(symlink((outside + "/victim").c_str(), (root + "/latest.tmp").c_str()), 0);
  ASSERT_EQ(symlink((outside + "/other/step-000000000099").c_str(), (root + "/step-000000000099").c_str()), 0);
  ASSERT_EQ(symlink((outside + "/victim-dir").c_str(), (root + "/.tmp-step-000000000001-1").c_str()), 0);
  ASSERT_EQ(mkfifo((root + "/latest.tmp.fifo").c_str(), 0644), 0);

  const int fd = OpenDir(root);
  ASSERT_GE(fd, 0);
  // The linked step is not read: there is no checkpoint, and the reason says why.
  absl::StatusOr<LoadedCheckpoint> none = LoadLatestCheckpointIn(fd, root);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound) << none.status();
  EXPECT_NE(none.status().message().find("step-000000000099"), std::string::npos) << none.status();
  EXPECT_FALSE(LoadCheckpointIn(fd, root, 99).ok());

  ASSERT_TRUE(WriteCheckpointIn(fd, root, At(7), 5).ok());
  EXPECT_EQ(Slurp(outside + "/victim"), "precious");
  EXPECT_EQ(Slurp(outside + "/victim-dir/file"), "keep");
  EXPECT_FALSE(Exists(root + "/.tmp-step-000000000001-1"));
  // Pruning (step 99 is after the one written) removes the link itself,
  // never the checkpoint it points at.
  EXPECT_FALSE(Exists(root + "/step-000000000099"));
  EXPECT_TRUE(Exists(outside + "/other/step-000000000099/MANIFEST"));

  absl::StatusOr<LoadedCheckpoint> latest = LoadLatestCheckpointIn(fd, root);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->contents.step, 7);
  close(fd);
}

// A file inside a checkpoint directory that is a link (to a file with the
// same bytes, even) is not read: the checkpoint is skipped.
TEST(CheckpointStoreConfinedTest, AFileLinkInACheckpointIsNotRead) {
  const std::string base = Fresh("filelink");
  const std::string root = base + "/ckpt";
  ASSERT_TRUE(WriteCheckpoint(root, At(3), 2).ok());
  ASSERT_TRUE(WriteCheckpoint(root, At(4), 2).ok());
  const std::string file = root + "/step-000000000004/rank0.model";
  ASSERT_EQ(rename(file.c_str(), (base + "/copy").c_str()), 0);
  ASSERT_EQ(symlink((base + "/copy").c_str(), file.c_str()), 0);
  const int fd = OpenDir(root);
  ASSERT_GE(fd, 0);
  absl::StatusOr<LoadedCheckpoint> latest = LoadLatestCheckpointIn(fd, root);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->contents.step, 3);
  close(fd);
}

}  // namespace
}  // namespace ferry
