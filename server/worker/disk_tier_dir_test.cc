#include "server/worker/disk_tier_dir.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <fstream>
#include <string>

namespace ferry {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

class DiskTierDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string pattern = std::string(tmp != nullptr ? tmp : "/tmp") + "/disk_tier.XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    char real[PATH_MAX];
    ASSERT_NE(realpath(pattern.c_str(), real), nullptr);
    base_ = real;
    root_ = base_ + "/root";
    outside_ = base_ + "/outside";
    job_dir_ = base_ + "/state/jobs/j-1";
    ASSERT_EQ(mkdir(root_.c_str(), 0755), 0);
    ASSERT_EQ(mkdir(outside_.c_str(), 0755), 0);
    std::ofstream(outside_ + "/keep") << "keep";
    absl::StatusOr<AllowedRoots> roots = AllowedRoots::Make({root_});
    ASSERT_TRUE(roots.ok()) << roots.status();
    roots_ = *roots;
  }

  ferry::v1::JobSpec WithDiskDir(const std::string& dir) {
    ferry::v1::JobSpec spec;
    spec.mutable_memory()->set_disk_dir(dir);
    return spec;
  }

  std::string base_, root_, outside_, job_dir_;
  AllowedRoots roots_;
};

TEST_F(DiskTierDirTest, EachJobAndRankHasItsOwnDirectory) {
  EXPECT_EQ(JobDiskDir(WithDiskDir("/nvme/ferry"), "j-1", job_dir_), "/nvme/ferry/ferry-j-1");
  EXPECT_EQ(JobDiskDir(ferry::v1::JobSpec(), "j-1", job_dir_), job_dir_ + "/scratch");
  EXPECT_EQ(JobDiskDir(ferry::v1::JobSpec(), "j-1", ""), "") << "on its own without disk_dir: no tier";
  EXPECT_EQ(RankDiskDir("/nvme/ferry/ferry-j-1", 3), "/nvme/ferry/ferry-j-1/rank3");
}

TEST_F(DiskTierDirTest, PrepareEmptiesWhatAKilledRunLeftAndRemoveTakesItAll) {
  const ferry::v1::JobSpec spec = WithDiskDir(root_ + "/scratch");
  const std::string job = JobDiskDir(spec, "j-1", job_dir_);
  const std::string rank = RankDiskDir(job, 0);
  ASSERT_TRUE(PrepareRankDiskDir(spec, rank, roots_).ok());
  ASSERT_TRUE(Exists(rank));
  // A run killed with -9 leaves its store's scratch directory.
  ASSERT_EQ(mkdir((rank + "/ferry-chunks-abc123").c_str(), 0755), 0);
  std::ofstream(rank + "/ferry-chunks-abc123/0.o") << "states";
  ASSERT_EQ(symlink(outside_.c_str(), (rank + "/out").c_str()), 0);
  ASSERT_TRUE(PrepareRankDiskDir(spec, rank, roots_).ok());
  EXPECT_TRUE(Exists(rank));
  EXPECT_FALSE(Exists(rank + "/ferry-chunks-abc123"));
  EXPECT_FALSE(Exists(rank + "/out"));
  EXPECT_TRUE(Exists(outside_ + "/keep"));
  ASSERT_TRUE(PrepareRankDiskDir(spec, RankDiskDir(job, 1), roots_).ok());
  EXPECT_TRUE(RemoveJobDiskDir(spec, "j-1", job_dir_, roots_).ok());
  EXPECT_FALSE(Exists(job));
  EXPECT_TRUE(Exists(root_ + "/scratch")) << "the user's directory stays";
  EXPECT_TRUE(RemoveJobDiskDir(spec, "j-1", job_dir_, roots_).ok()) << "gone already";
  EXPECT_TRUE(RemoveJobDiskDir(WithDiskDir(root_ + "/never"), "j-1", job_dir_, roots_).ok());
}

TEST_F(DiskTierDirTest, TheDefaultIsInTheJobsDirectory) {
  const ferry::v1::JobSpec spec;
  const std::string rank = RankDiskDir(JobDiskDir(spec, "j-1", job_dir_), 0);
  ASSERT_TRUE(PrepareRankDiskDir(spec, rank, roots_).ok()) << "the daemon's own directory is not confined";
  EXPECT_TRUE(Exists(job_dir_ + "/scratch/rank0"));
  EXPECT_TRUE(RemoveJobDiskDir(spec, "j-1", job_dir_, roots_).ok());
  EXPECT_FALSE(Exists(job_dir_ + "/scratch"));
  EXPECT_TRUE(Exists(job_dir_));
}

TEST_F(DiskTierDirTest, ALinkPlantedAfterSubmitIsRefused) {
  // Accepted at submit as root/scratch; a link to outside put there since.
  ASSERT_EQ(symlink(outside_.c_str(), (root_ + "/scratch").c_str()), 0);
  const ferry::v1::JobSpec spec = WithDiskDir(root_ + "/scratch");
  absl::Status s = PrepareRankDiskDir(spec, RankDiskDir(JobDiskDir(spec, "j-1", job_dir_), 0), roots_);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("memory.disk_dir"), std::string::npos) << s;
  EXPECT_FALSE(Exists(outside_ + "/ferry-j-1"));
  // Removing goes nowhere near outside either.
  ASSERT_EQ(mkdir((outside_ + "/ferry-j-1").c_str(), 0755), 0);
  s = RemoveJobDiskDir(spec, "j-1", job_dir_, roots_);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Exists(outside_ + "/ferry-j-1"));
}

}  // namespace
}  // namespace ferry
