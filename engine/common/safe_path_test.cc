#include "engine/common/safe_path.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace ferry {
namespace {

std::string Slurp(int fd) {
  std::string out;
  char buffer[256];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) out.append(buffer, static_cast<size_t>(n));
  return out;
}

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

// A fresh directory holding root/ (the allowed root) and outside/.
class SafePathTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string pattern = std::string(tmp != nullptr ? tmp : "/tmp") + "/safe_path.XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    char real[PATH_MAX];
    ASSERT_NE(realpath(pattern.c_str(), real), nullptr);
    base_ = real;
    root_ = base_ + "/root";
    outside_ = base_ + "/outside";
    ASSERT_EQ(mkdir(root_.c_str(), 0755), 0);
    ASSERT_EQ(mkdir(outside_.c_str(), 0755), 0);
    ASSERT_EQ(mkdir((root_ + "/data").c_str(), 0755), 0);
    WriteText(root_ + "/data/t.bin", "tokens");
    WriteText(outside_ + "/secret", "secret");
    absl::StatusOr<AllowedRoots> roots = AllowedRoots::Make({root_});
    ASSERT_TRUE(roots.ok()) << roots.status();
    roots_ = *roots;
    previous_openat2_ = SetUseOpenat2ForTesting(GetParam());
  }
  void TearDown() override {
    SetUseOpenat2ForTesting(previous_openat2_);
    SetAfterResolveHookForTesting(nullptr);
  }

  absl::Status Check(const std::string& path, PathKind kind) {
    return CheckConfined(roots_, "data.path", path, kind).status();
  }

  std::string base_, root_, outside_;
  AllowedRoots roots_;
  bool previous_openat2_ = true;
};

TEST(NormalizePathTest, DropsDotsAndDoubleSlashes) {
  EXPECT_EQ(NormalizePath("/a//b/./c/"), "/a/b/c");
  EXPECT_EQ(NormalizePath("/a/b/../c"), "/a/c");
  EXPECT_EQ(NormalizePath("/../../x"), "/x");
  EXPECT_EQ(NormalizePath("/"), "/");
}

TEST(AllowedRootsTest, ParsesResolvesAndDropsNestedRoots) {
  absl::StatusOr<AllowedRoots> roots = AllowedRoots::Parse("/usr/share, /usr,,/usr/lib");
  ASSERT_TRUE(roots.ok()) << roots.status();
  EXPECT_EQ(roots->Describe(), "/usr");
  EXPECT_EQ(roots->RootOf("/usr/share/x"), "/usr");
  EXPECT_EQ(roots->RootOf("/usr"), "/usr");
  EXPECT_EQ(roots->RootOf("/usrx"), "");
  EXPECT_FALSE(AllowedRoots::Parse("/nonexistent/dir").ok());
  EXPECT_FALSE(AllowedRoots::Parse("/etc/passwd").ok());
  EXPECT_FALSE(AllowedRoots().confined());
  EXPECT_EQ(AllowedRoots::Parse("/")->RootOf("/anything"), "/");
}

TEST_P(SafePathTest, InsideIsAllowed) {
  EXPECT_TRUE(Check(root_ + "/data/t.bin", PathKind::kFile).ok());
  EXPECT_TRUE(Check(root_ + "/data/../data/t.bin", PathKind::kFile).ok());
  absl::StatusOr<UniqueFd> fd = OpenConfinedFile(roots_, "data.path", root_ + "/data/t.bin");
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(Slurp(fd->get()), "tokens");
  EXPECT_EQ(fcntl(fd->get(), F_GETFL) & O_NONBLOCK, 0);
}

TEST_P(SafePathTest, DotDotEscapeIsRefused) {
  const std::string path = root_ + "/data/../../outside/secret";
  absl::Status s = Check(path, PathKind::kFile);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("data.path: " + path + " resolves to " + outside_ + "/secret, outside the allowed "
                             "roots (" + root_ + "); put the file under one of them or start ferryd with "
                             "--allowed_roots including its directory"),
            std::string::npos)
      << s;
  EXPECT_EQ(OpenConfinedFile(roots_, "data.path", path).status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_P(SafePathTest, AbsolutePathOutsideIsRefused) {
  absl::Status s = Check("/etc/passwd", PathKind::kFile);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("data.path: /etc/passwd is outside the allowed roots (" + root_ + ")"),
            std::string::npos)
      << s;
  // A missing file outside is refused the same way: nothing is said of it.
  EXPECT_EQ(Check("/nonexistent/t.bin", PathKind::kFile).code(), absl::StatusCode::kPermissionDenied);
}

TEST_P(SafePathTest, RelativePathIsInvalid) {
  EXPECT_EQ(Check("data/t.bin", PathKind::kFile).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenConfinedFile(roots_, "data.path", "data/t.bin").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Check("", PathKind::kDirectory).code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(SafePathTest, SymlinkEscapeToAFileIsRefused) {
  ASSERT_EQ(symlink((outside_ + "/secret").c_str(), (root_ + "/data/link.bin").c_str()), 0);
  absl::Status s = Check(root_ + "/data/link.bin", PathKind::kFile);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("resolves to " + outside_ + "/secret"), std::string::npos) << s;
  EXPECT_EQ(OpenConfinedFile(roots_, "data.path", root_ + "/data/link.bin").status().code(),
            absl::StatusCode::kPermissionDenied);
  // A relative link out, too.
  ASSERT_EQ(symlink("../../outside/secret", (root_ + "/data/rel.bin").c_str()), 0);
  EXPECT_EQ(Check(root_ + "/data/rel.bin", PathKind::kFile).code(), absl::StatusCode::kPermissionDenied);
}

TEST_P(SafePathTest, SymlinkEscapeToADirectoryIsRefused) {
  ASSERT_EQ(symlink(outside_.c_str(), (root_ + "/ckpt").c_str()), 0);
  absl::Status s = CheckConfined(roots_, "checkpoint.dir", root_ + "/ckpt/rank0", PathKind::kDirectory).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("checkpoint.dir: " + root_ + "/ckpt/rank0 resolves to " + outside_ +
                             "/rank0, outside the allowed roots"),
            std::string::npos)
      << s;
  absl::StatusOr<UniqueFd> fd = OpenConfinedDir(roots_, "checkpoint.dir", root_ + "/ckpt/rank0", true);
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kPermissionDenied) << fd.status();
  EXPECT_FALSE(Exists(outside_ + "/rank0"));
}

TEST_P(SafePathTest, SymlinkWithinTheRootIsAllowed) {
  ASSERT_EQ(symlink("data/t.bin", (root_ + "/alias.bin").c_str()), 0);
  ASSERT_EQ(symlink((root_ + "/data").c_str(), (root_ + "/d").c_str()), 0);
  EXPECT_TRUE(Check(root_ + "/alias.bin", PathKind::kFile).ok());
  for (const std::string& path : {root_ + "/alias.bin", root_ + "/d/t.bin"}) {
    absl::StatusOr<UniqueFd> fd = OpenConfinedFile(roots_, "data.path", path);
    ASSERT_TRUE(fd.ok()) << path << ": " << fd.status();
    EXPECT_EQ(Slurp(fd->get()), "tokens");
  }
  absl::StatusOr<UniqueFd> dir = OpenConfinedDir(roots_, "checkpoint.dir", root_ + "/d/ck", true);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_TRUE(Exists(root_ + "/data/ck"));
  // A link into the root from outside it leads inside: allowed.
  ASSERT_EQ(symlink(root_.c_str(), (outside_ + "/into").c_str()), 0);
  EXPECT_TRUE(Check(outside_ + "/into/data/t.bin", PathKind::kFile).ok());
}

TEST_P(SafePathTest, DeviceFilesAreRefused) {
  absl::StatusOr<AllowedRoots> dev = AllowedRoots::Make({"/dev"});
  ASSERT_TRUE(dev.ok()) << dev.status();
  absl::Status s = CheckConfined(*dev, "data.path", "/dev/zero", PathKind::kFile).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("data.path: /dev/zero is a character device; only regular files are read"),
            std::string::npos)
      << s;
  EXPECT_EQ(OpenConfinedFile(*dev, "data.path", "/dev/zero").status().code(), absl::StatusCode::kPermissionDenied);
  // Without confinement too.
  EXPECT_EQ(CheckConfined(AllowedRoots(), "data.path", "/dev/zero", PathKind::kFile).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(OpenConfinedFile(AllowedRoots(), "data.path", "/dev/zero").status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_P(SafePathTest, FifosAreRefusedWithoutBlocking) {
  ASSERT_EQ(mkfifo((root_ + "/data/fifo").c_str(), 0644), 0);
  absl::Status s = Check(root_ + "/data/fifo", PathKind::kFile);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("is a FIFO"), std::string::npos) << s;
  EXPECT_EQ(OpenConfinedFile(roots_, "data.path", root_ + "/data/fifo").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(OpenConfinedDir(roots_, "checkpoint.dir", root_ + "/data/fifo", true).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_P(SafePathTest, MissingCheckpointDirUnderARootIsAllowedAndCreated) {
  const std::string dir = root_ + "/new/ckpt/rank0";
  EXPECT_TRUE(CheckConfined(roots_, "checkpoint.dir", dir, PathKind::kDirectory).ok());
  EXPECT_EQ(OpenConfinedDir(roots_, "checkpoint.dir", dir, false).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<UniqueFd> fd = OpenConfinedDir(roots_, "checkpoint.dir", dir, true);
  ASSERT_TRUE(fd.ok()) << fd.status();
  // The descriptor is a directory one can write in.
  EXPECT_EQ(mkdirat(fd->get(), "step", 0755), 0);
  EXPECT_TRUE(Exists(dir + "/step"));
  // A file in the way.
  absl::Status in_way = CheckConfined(roots_, "checkpoint.dir", root_ + "/data/t.bin/x", PathKind::kDirectory).status();
  EXPECT_EQ(in_way.code(), absl::StatusCode::kFailedPrecondition) << in_way;
  EXPECT_EQ(OpenConfinedDir(roots_, "checkpoint.dir", root_ + "/data/t.bin/x", true).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CheckConfined(roots_, "checkpoint.dir", root_ + "/data/t.bin", PathKind::kDirectory).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // The root itself.
  EXPECT_TRUE(OpenConfinedDir(roots_, "checkpoint.dir", root_, false).ok());
}

TEST_P(SafePathTest, MissingFileIsNotFound) {
  EXPECT_TRUE(Check(root_ + "/data/missing.bin", PathKind::kFile).ok());  // the caller reports it
  EXPECT_EQ(OpenConfinedFile(roots_, "data.path", root_ + "/data/missing.bin").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(OpenConfinedFile(roots_, "data.path", root_ + "/data").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// A racing process swaps a checked part of the path for a link after the
// path was resolved: the walk refuses it, and nothing outside is touched.
std::string* g_race_target = nullptr;
std::string* g_race_link = nullptr;
void SwapForLink() {
  const std::string moved = *g_race_link + ".moved";
  ASSERT_EQ(rename(g_race_link->c_str(), moved.c_str()), 0);
  ASSERT_EQ(symlink(g_race_target->c_str(), g_race_link->c_str()), 0);
}

TEST_P(SafePathTest, LinkCreatedAfterResolutionIsNotFollowed) {
  std::string target = outside_ + "/secret";
  std::string link = root_ + "/data/t.bin";
  g_race_target = &target;
  g_race_link = &link;
  SetAfterResolveHookForTesting(SwapForLink);
  absl::StatusOr<UniqueFd> fd = OpenConfinedFile(roots_, "data.path", link);
  SetAfterResolveHookForTesting(nullptr);
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kPermissionDenied) << fd.status();
  EXPECT_NE(fd.status().message().find("is a symbolic link that was not there"), std::string::npos) << fd.status();

  // A directory on the way to a checkpoint directory.
  ASSERT_EQ(mkdir((root_ + "/ck").c_str(), 0755), 0);
  target = outside_;
  link = root_ + "/ck";
  SetAfterResolveHookForTesting(SwapForLink);
  absl::StatusOr<UniqueFd> dir = OpenConfinedDir(roots_, "checkpoint.dir", root_ + "/ck/rank0", true);
  SetAfterResolveHookForTesting(nullptr);
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kPermissionDenied) << dir.status();
  EXPECT_FALSE(Exists(outside_ + "/rank0"));
}

TEST_P(SafePathTest, UnconfinedOpensAsBefore) {
  absl::StatusOr<UniqueFd> fd = OpenConfinedFile(AllowedRoots(), "data.path", outside_ + "/secret");
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(Slurp(fd->get()), "secret");
  EXPECT_TRUE(OpenConfinedDir(AllowedRoots(), "checkpoint.dir", outside_ + "/a/b", true).ok());
  EXPECT_TRUE(Exists(outside_ + "/a/b"));
  EXPECT_EQ(OpenConfinedFile(AllowedRoots(), "data.path", outside_ + "/none").status().code(),
            absl::StatusCode::kNotFound);
}

// A scratch tree with files, subdirectories and links out: every entry
// goes, nothing the links point at.
TEST_P(SafePathTest, RemoveTreeAtRemovesLinksNotWhatTheyPointAt) {
  const std::string scratch = root_ + "/scratch";
  ASSERT_EQ(mkdir(scratch.c_str(), 0755), 0);
  ASSERT_EQ(mkdir((scratch + "/rank0").c_str(), 0755), 0);
  ASSERT_EQ(mkdir((scratch + "/rank0/ferry-chunks-1").c_str(), 0755), 0);
  WriteText(scratch + "/rank0/ferry-chunks-1/o3", "states");
  ASSERT_EQ(symlink(outside_.c_str(), (scratch + "/rank0/out").c_str()), 0);
  ASSERT_EQ(symlink((outside_ + "/secret").c_str(), (scratch + "/secret").c_str()), 0);
  UniqueFd root(open(root_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(root.valid());
  EXPECT_TRUE(RemoveTreeAt(root.get(), "scratch", root_).ok());
  EXPECT_FALSE(Exists(scratch));
  EXPECT_TRUE(Exists(outside_ + "/secret"));
  // Gone already, a plain file, a link to a directory: each is fine.
  EXPECT_TRUE(RemoveTreeAt(root.get(), "scratch", root_).ok());
  ASSERT_EQ(symlink(outside_.c_str(), (root_ + "/linked").c_str()), 0);
  EXPECT_TRUE(RemoveTreeAt(root.get(), "linked", root_).ok());
  EXPECT_TRUE(Exists(outside_ + "/secret"));
  EXPECT_FALSE(Exists(root_ + "/linked"));
  EXPECT_EQ(RemoveTreeAt(root.get(), "../outside", root_).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RemoveTreeAt(root.get(), "..", root_).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Exists(outside_ + "/secret"));
}

INSTANTIATE_TEST_SUITE_P(Openat2AndWalk, SafePathTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "openat2" : "openat_walk";
                         });

}  // namespace
}  // namespace ferry
