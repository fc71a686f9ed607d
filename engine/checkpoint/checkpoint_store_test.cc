#include "engine/checkpoint/checkpoint_store.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint/test_files.h"

namespace ferry {
namespace {

using testing::EmptyTestPath;
using testing::Slurp;
using testing::Spit;

CheckpointContents At(int64_t step) {
  CheckpointContents c;
  c.step = step;
  c.meta["spec_hash"] = "abc123";
  c.meta["world"] = "tensor 2 data 1";
  c.files["rank0.model"] = std::string(1000, 'a') + std::to_string(step);
  c.files["rank0.rng"] = std::string("\0\1\2\3", 4) + std::to_string(step);
  return c;
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

TEST(CheckpointStoreTest, RoundTripsAndKeepsTheNewest) {
  const std::string root = EmptyTestPath("roundtrip");
  for (int64_t step : {100, 200, 300}) ASSERT_TRUE(WriteCheckpoint(root, At(step), 2).ok());
  absl::StatusOr<LoadedCheckpoint> loaded = LoadLatestCheckpoint(root);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->contents.step, 300);
  EXPECT_EQ(loaded->contents.files, At(300).files);
  EXPECT_EQ(loaded->contents.meta, At(300).meta);
  EXPECT_TRUE(loaded->skipped.empty());
  EXPECT_EQ(Slurp(root + "/latest"), "step-000000000300\n");
  EXPECT_TRUE(Exists(root + "/step-000000000200"));
  EXPECT_FALSE(Exists(root + "/step-000000000100")) << "only the newest 2 are kept";
}

// A run that resumed from an older checkpoint (the newest damaged) must not
// count the newer one when pruning: with keep 1 it would delete the step it
// just wrote and keep only the damaged one.
TEST(CheckpointStoreTest, PruningIgnoresStepsAfterTheOneWritten) {
  const std::string root = EmptyTestPath("resumed");
  for (int64_t step : {100, 200}) ASSERT_TRUE(WriteCheckpoint(root, At(step), 2).ok());
  Spit(root + "/step-000000000200/rank0.model", "damaged");
  ASSERT_TRUE(WriteCheckpoint(root, At(150), 1).ok());
  EXPECT_TRUE(Exists(root + "/step-000000000150"));
  EXPECT_FALSE(Exists(root + "/step-000000000200")) << "a step after the one written is from an abandoned run";
  EXPECT_FALSE(Exists(root + "/step-000000000100")) << "keep 1";
  absl::StatusOr<LoadedCheckpoint> loaded = LoadLatestCheckpoint(root);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->contents.step, 150);
  EXPECT_TRUE(loaded->skipped.empty());
}

// A large file is produced a piece at a time as the checkpoint is written
// and, loaded, left on disk (verified) to be read in pieces.
TEST(CheckpointStoreTest, ProducedFilesAreWrittenInPiecesAndLargeOnesLeftOnDisk) {
  const std::string root = EmptyTestPath("produced");
  const std::string piece(300 << 10, 'p');
  const int pieces = 5;  // 1.5 MiB: over kHeldFileBytes
  CheckpointContents c = At(7);
  int calls = 0;
  c.produced["rank0.chunks"] = [&](const ByteSink& sink) -> absl::Status {
    ++calls;
    for (int i = 0; i < pieces; ++i) {
      std::string p = piece;
      p[0] = static_cast<char>('0' + i);
      if (absl::Status s = sink(p.data(), p.size()); !s.ok()) return s;
    }
    return absl::OkStatus();
  };
  ASSERT_TRUE(WriteCheckpoint(root, c, 2).ok());
  EXPECT_EQ(calls, 1);
  absl::StatusOr<LoadedCheckpoint> loaded = LoadLatestCheckpoint(root);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->contents.files, At(7).files) << "small files are held";
  ASSERT_EQ(loaded->contents.stored.count("rank0.chunks"), 1u);
  EXPECT_EQ(loaded->contents.files.count("rank0.chunks"), 0u);
  absl::StatusOr<CheckpointFileReader> reader = CheckpointFileReader::Open(loaded->contents, "rank0.chunks");
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->size(), piece.size() * pieces);
  std::string back(piece.size(), '\0');
  for (int i = 0; i < pieces; ++i) {
    ASSERT_TRUE(reader->Read(back.data(), back.size()).ok()) << i;
    EXPECT_EQ(back[0], '0' + i);
    EXPECT_EQ(back.substr(1), piece.substr(1));
  }
  EXPECT_EQ(reader->remaining(), 0u);
  EXPECT_EQ(reader->Read(back.data(), 1).code(), absl::StatusCode::kDataLoss) << "past the end";
  // A held file reads the same way.
  absl::StatusOr<CheckpointFileReader> held = CheckpointFileReader::Open(loaded->contents, "rank0.model");
  ASSERT_TRUE(held.ok());
  std::string model(held->size(), '\0');
  ASSERT_TRUE(held->Read(model.data(), model.size()).ok());
  EXPECT_EQ(model, At(7).files.at("rank0.model"));
  EXPECT_EQ(CheckpointFileReader::Open(loaded->contents, "rank1.chunks").status().code(), absl::StatusCode::kNotFound);

  // Damage in a large file is found when the checkpoint is loaded, like in
  // any other file.
  const std::string path = root + "/step-000000000007/rank0.chunks";
  std::string bytes = Slurp(path);
  bytes[bytes.size() - 3] ^= 1;
  Spit(path, bytes);
  absl::StatusOr<LoadedCheckpoint> damaged = LoadCheckpointAt(root, 7);
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss) << damaged.status();
  EXPECT_NE(damaged.status().message().find("rank0.chunks: CRC-32"), std::string::npos) << damaged.status();
  Spit(path, bytes.substr(0, 1000));
  damaged = LoadCheckpointAt(root, 7);
  EXPECT_NE(damaged.status().message().find("truncated"), std::string::npos) << damaged.status();

  // A producer's error fails the write and leaves the older checkpoints.
  CheckpointContents failing = At(9);
  failing.produced["rank0.chunks"] = [](const ByteSink&) { return absl::DataLossError("chunk 3: damaged"); };
  const absl::Status s = WriteCheckpoint(root, failing, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_FALSE(Exists(root + "/step-000000000009"));
  EXPECT_TRUE(Exists(root + "/step-000000000007"));
}

TEST(CheckpointStoreTest, LoadsAnOlderStep) {
  const std::string root = EmptyTestPath("at_step");
  for (int64_t step : {100, 200}) ASSERT_TRUE(WriteCheckpoint(root, At(step), 3).ok());
  absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpointAt(root, 100);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->contents.step, 100);
  EXPECT_EQ(loaded->contents.files, At(100).files);
  EXPECT_EQ(LoadCheckpointAt(root, 150).status().code(), absl::StatusCode::kNotFound);
  // A damaged one is not handed out.
  std::string model = Slurp(root + "/step-000000000100/rank0.model");
  model[10] ^= 1;
  Spit(root + "/step-000000000100/rank0.model", model);
  EXPECT_EQ(LoadCheckpointAt(root, 100).status().code(), absl::StatusCode::kDataLoss);
}

TEST(CheckpointStoreTest, NothingThereIsNotFound) {
  const std::string root = EmptyTestPath("empty");
  EXPECT_EQ(LoadLatestCheckpoint(root).status().code(), absl::StatusCode::kNotFound);
}

// A crash between writing and renaming leaves a temporary directory (and
// `latest` unchanged): the previous checkpoint is used, and the next write
// clears the leftovers.
TEST(CheckpointStoreTest, AnUnfinishedWriteIsIgnored) {
  const std::string root = EmptyTestPath("crash");
  ASSERT_TRUE(WriteCheckpoint(root, At(100), 3).ok());
  const std::string leftover = root + "/.tmp-step-000000000200-999";
  ASSERT_EQ(mkdir(leftover.c_str(), 0755), 0);
  Spit(leftover + "/rank0.model", "half");
  absl::StatusOr<LoadedCheckpoint> loaded = LoadLatestCheckpoint(root);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->contents.step, 100);
  // A directory renamed into place but without a manifest (a crash in a
  // copy by hand) is skipped with the reason.
  ASSERT_EQ(mkdir((root + "/step-000000000150").c_str(), 0755), 0);
  loaded = LoadLatestCheckpoint(root);
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->contents.step, 100);
  ASSERT_EQ(loaded->skipped.size(), 1u);
  EXPECT_NE(loaded->skipped[0].find("step-000000000150: no readable MANIFEST"), std::string::npos)
      << loaded->skipped[0];
  ASSERT_TRUE(WriteCheckpoint(root, At(300), 3).ok());
  EXPECT_FALSE(Exists(leftover));
}

// Flipped bytes and truncation are caught by the manifest's checksums and
// sizes; the previous checkpoint is used and the reason given.
TEST(CheckpointStoreTest, DamagedCheckpointsAreSkippedWithTheReason) {
  const std::string root = EmptyTestPath("damaged");
  ASSERT_TRUE(WriteCheckpoint(root, At(100), 3).ok());
  ASSERT_TRUE(WriteCheckpoint(root, At(200), 3).ok());
  const std::string model = root + "/step-000000000200/rank0.model";
  std::string data = Slurp(model);
  data[500] ^= 0x10;
  Spit(model, data);
  absl::StatusOr<LoadedCheckpoint> loaded = LoadLatestCheckpoint(root);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->contents.step, 100);
  ASSERT_EQ(loaded->skipped.size(), 1u);
  EXPECT_NE(loaded->skipped[0].find("step-000000000200: rank0.model: CRC-32"), std::string::npos)
      << loaded->skipped[0];

  Spit(root + "/step-000000000100/rank0.rng", std::string("\0\1", 2));
  loaded = LoadLatestCheckpoint(root);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(loaded.status().message().find("rank0.rng: 2 bytes, the manifest says 7 (truncated?)"),
            std::string::npos)
      << loaded.status();
}

// `latest` is a pointer for people: a crash after the rename but before it
// was updated leaves the newer, complete checkpoint, which is used.
TEST(CheckpointStoreTest, TheNewestCompleteCheckpointWinsOverLatest) {
  const std::string root = EmptyTestPath("latest");
  ASSERT_TRUE(WriteCheckpoint(root, At(100), 3).ok());
  ASSERT_TRUE(WriteCheckpoint(root, At(200), 3).ok());
  Spit(root + "/latest", "garbage");
  absl::StatusOr<LoadedCheckpoint> loaded = LoadLatestCheckpoint(root);
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->contents.step, 200);
  unlink((root + "/latest").c_str());
  EXPECT_EQ(LoadLatestCheckpoint(root)->contents.step, 200);
}

TEST(CheckpointStoreTest, WriteErrorsNameThePathAndLeaveThePreviousOne) {
  const std::string root = EmptyTestPath("errors");
  ASSERT_TRUE(WriteCheckpoint(root, At(100), 3).ok());
  CheckpointContents bad = At(200);
  bad.files["../escape"] = "x";
  absl::Status s = WriteCheckpoint(root, bad, 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadLatestCheckpoint(root)->contents.step, 100);
  const std::string file_root = EmptyTestPath("a_file");
  Spit(file_root, "not a directory");
  s = WriteCheckpoint(file_root + "/ckpt", At(1), 1);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(file_root + "/ckpt"), std::string::npos) << s;
}

// A write that runs out of room (here: a file-size limit, which fails
// writes as a full disk does) reports the path and the cause, leaves the
// previous checkpoint as it was, and leaves no partial directory.
TEST(CheckpointStoreTest, RunningOutOfRoomKeepsThePreviousCheckpoint) {
  const std::string root = EmptyTestPath("full");
  ASSERT_TRUE(WriteCheckpoint(root, At(100), 3).ok());
  CheckpointContents big = At(200);
  big.files["rank0.model"] = std::string(64 << 10, 'b');
  signal(SIGXFSZ, SIG_IGN);
  rlimit old;
  getrlimit(RLIMIT_FSIZE, &old);
  rlimit small = old;
  small.rlim_cur = 16 << 10;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const absl::Status s = WriteCheckpoint(root, big, 3);
  setrlimit(RLIMIT_FSIZE, &old);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot write"), std::string::npos) << s;
  EXPECT_NE(s.message().find("rank0.model"), std::string::npos) << s;
  absl::StatusOr<LoadedCheckpoint> loaded = LoadLatestCheckpoint(root);
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->contents.step, 100);
  EXPECT_TRUE(loaded->skipped.empty());
  EXPECT_EQ(std::system(("ls -a '" + root + "' | grep -q tmp").c_str()) != 0, true) << "a partial directory was left";
}

TEST(CheckpointStoreTest, ParsesTheManifestItWrites) {
  const std::string root = EmptyTestPath("manifest");
  ASSERT_TRUE(WriteCheckpoint(root, At(100), 1).ok());
  absl::StatusOr<CheckpointManifest> m = ParseManifest(Slurp(root + "/step-000000000100/MANIFEST"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->step, 100);
  EXPECT_EQ(m->meta.at("world"), "tensor 2 data 1");
  ASSERT_EQ(m->files.size(), 2u);
  EXPECT_EQ(m->files[0].name, "rank0.model");
  EXPECT_EQ(m->files[0].size, 1003u);
  EXPECT_EQ(ParseManifest("step 3\n").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseManifest("format 1\nfile x 3\n").status().code(), absl::StatusCode::kDataLoss);
}

// A manifest names only files inside its own checkpoint directory, and its
// step is the directory's: one that says otherwise (damaged, or written by
// hand) is skipped, never followed to another file.
TEST(CheckpointStoreTest, AManifestCannotPointOutsideItsCheckpoint) {
  const std::string root = EmptyTestPath("escape");
  ASSERT_TRUE(WriteCheckpoint(root, At(100), 3).ok());
  ASSERT_TRUE(WriteCheckpoint(root, At(200), 3).ok());
  const std::string secret = std::string(1000, 'a') + "100";
  for (const std::string& name :
       {std::string("../step-000000000100/rank0.model"), std::string("/etc/hostname"), std::string(".."),
        std::string("MANIFEST"), std::string("a\0b", 3)}) {
    EXPECT_EQ(ParseManifest("format 1\nfile " + name + " 1003 0\n").status().code(),
              absl::StatusCode::kDataLoss)
        << name;
  }
  const std::string manifest = root + "/step-000000000200/MANIFEST";
  const std::string good = Slurp(manifest);
  Spit(manifest, good + "file ../step-000000000100/rank0.model 1003 " +
                     Fingerprint(secret).substr(6, 8) + "\n");
  absl::StatusOr<LoadedCheckpoint> loaded = LoadLatestCheckpoint(root);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->contents.step, 100);
  EXPECT_NE(loaded->skipped[0].find("bad file name"), std::string::npos) << loaded->skipped[0];
  EXPECT_EQ(LoadCheckpointAt(root, 200).status().code(), absl::StatusCode::kDataLoss);

  Spit(manifest, absl::StrCat("format 1\nstep 150\n", good.substr(good.find("meta"))));
  absl::StatusOr<LoadedCheckpoint> at = LoadCheckpointAt(root, 200);
  EXPECT_EQ(at.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(at.status().message().find("MANIFEST: step 150, the directory's is 200"), std::string::npos)
      << at.status();
}

}  // namespace
}  // namespace ferry
