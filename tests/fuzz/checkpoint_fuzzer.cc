// Fuzzes the checkpoint reader. The input is a MANIFEST, optionally followed
// by "\n--\n" and the contents of a file named "data": ParseManifest reads
// the manifest alone, then both are written as a checkpoint of step 7 in a
// fresh directory and read back with LoadLatestCheckpoint and
// LoadCheckpointAt, which must agree.

#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/string_view.h"
#include "engine/checkpoint/checkpoint_store.h"

namespace {

std::string& Root() {
  static std::string* root = [] {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/checkpoint_fuzzer.XXXXXX";
    if (mkdtemp(dir.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    return new std::string(dir);
  }();
  return *root;
}

void WriteFile(const std::string& path, absl::string_view contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(bytes), size);
  absl::string_view manifest = input;
  absl::string_view data;
  if (const size_t split = input.find("\n--\n"); split != absl::string_view::npos) {
    manifest = input.substr(0, split + 1);
    data = input.substr(split + 4);
  }
  absl::StatusOr<ferry::CheckpointManifest> parsed = ferry::ParseManifest(manifest);

  const std::string root = Root() + "/ckpt";
  const std::string dir = root + "/step-000000000007";
  // The directory is reused across runs: clear what the last one wrote.
  std::remove((dir + "/MANIFEST").c_str());
  std::remove((dir + "/data").c_str());
  rmdir(dir.c_str());
  rmdir(root.c_str());
  if (mkdir(root.c_str(), 0755) != 0 || mkdir(dir.c_str(), 0755) != 0) std::abort();
  WriteFile(dir + "/MANIFEST", manifest);
  WriteFile(dir + "/data", data);

  absl::StatusOr<ferry::LoadedCheckpoint> latest = ferry::LoadLatestCheckpoint(root);
  absl::StatusOr<ferry::LoadedCheckpoint> at = ferry::LoadCheckpointAt(root, 7);
  if (latest.ok() != at.ok() || (latest.ok() && !parsed.ok())) {
    std::fprintf(stderr, "FUZZ CHECK FAILED: readers disagree: parse %s, latest %s, at %s\n",
                 parsed.status().ToString().c_str(), latest.status().ToString().c_str(),
                 at.status().ToString().c_str());
    std::abort();
  }
  if (latest.ok()) {
    if (latest->contents.step != 7) {
      std::fprintf(stderr, "FUZZ CHECK FAILED: step %lld read from step-000000000007\n",
                   static_cast<long long>(latest->contents.step));
      std::abort();
    }
    // Only files the manifest names, from inside the checkpoint's directory.
    for (const auto& [name, contents] : latest->contents.files) {
      if (name != "data") {
        std::fprintf(stderr, "FUZZ CHECK FAILED: read a file the checkpoint does not hold: %s\n",
                     name.c_str());
        std::abort();
      }
    }
    for (const auto& [name, stored] : latest->contents.stored) {
      if (name != "data") {
        std::fprintf(stderr, "FUZZ CHECK FAILED: left a file the checkpoint does not hold: %s\n", name.c_str());
        std::abort();
      }
    }
  }
  return 0;
}
