#include "engine/checkpoint/model_files.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "engine/checkpoint/test_files.h"

namespace ferry {
namespace {

SafetensorsTensor Tensor(const std::string& name, std::vector<float> values) {
  SafetensorsTensor t;
  t.name = name;
  t.dtype = "F32";
  t.shape = {static_cast<int64_t>(values.size())};
  t.data.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return t;
}

void Write(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

void WriteSafetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors) {
  std::string bytes;
  ASSERT_TRUE(SerializeSafetensors(tensors, {}, &bytes).ok());
  Write(path, bytes);
}

std::vector<float> Values(const ModelFiles& files, const std::string& name) {
  const SafetensorsEntry* e = files.Find(name);
  EXPECT_NE(e, nullptr) << name;
  if (e == nullptr) return {};
  std::vector<float> out(static_cast<size_t>(e->numel()));
  EXPECT_TRUE(files.Read(*e, out.data()).ok());
  return out;
}

// A folder of two shards and their index.
std::string ShardedFolder(const std::string& name) {
  const std::string dir = testing::EmptyTestPath(name);
  mkdir(dir.c_str(), 0755);
  WriteSafetensors(dir + "/model-00001-of-00002.safetensors", {Tensor("a", {1, 2}), Tensor("b", {3})});
  WriteSafetensors(dir + "/model-00002-of-00002.safetensors", {Tensor("c", {4, 5, 6})});
  Write(dir + "/model.safetensors.index.json", R"({"metadata": {"total_size": 24}, "weight_map": {
      "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
      "c": "model-00002-of-00002.safetensors"}})");
  return dir;
}

TEST(ModelFilesTest, ReadsAFileAFolderAndShards) {
  const std::string dir = testing::EmptyTestPath("model-files-one");
  mkdir(dir.c_str(), 0755);
  WriteSafetensors(dir + "/model.safetensors", {Tensor("x", {7, 8})});
  for (const std::string& path : {dir, dir + "/", dir + "/model.safetensors"}) {
    absl::StatusOr<ModelFiles> files = ModelFiles::Open(path);
    ASSERT_TRUE(files.ok()) << files.status();
    EXPECT_EQ(Values(*files, "x"), (std::vector<float>{7, 8}));
    EXPECT_EQ(files->All().size(), 1u);
  }
  EXPECT_TRUE(ModelFiles::IsFolder(dir));
  EXPECT_FALSE(ModelFiles::IsFolder(dir + "/model.safetensors"));

  absl::StatusOr<ModelFiles> sharded = ModelFiles::Open(ShardedFolder("model-files-sharded"));
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  EXPECT_EQ(Values(*sharded, "a"), (std::vector<float>{1, 2}));
  EXPECT_EQ(Values(*sharded, "c"), (std::vector<float>{4, 5, 6}));
  EXPECT_EQ(sharded->All().size(), 3u);
  EXPECT_EQ(sharded->Find("d"), nullptr);
}

TEST(ModelFilesTest, EveryFileIsCheckedBeforeItIsOpened) {
  const std::string dir = ShardedFolder("model-files-checked");
  std::vector<std::string> asked;
  absl::StatusOr<ModelFiles> files = ModelFiles::Open(dir, [&](const std::string& path) {
    asked.push_back(path.substr(path.rfind('/') + 1));
    return path.find("-00002-of") != std::string::npos ? absl::PermissionDeniedError("outside") : absl::OkStatus();
  });
  EXPECT_EQ(files.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(asked, (std::vector<std::string>{"model.safetensors.index.json", "model-00001-of-00002.safetensors",
                                             "model-00002-of-00002.safetensors"}));
}

TEST(ModelFilesTest, BrokenFoldersAreRefusedNamingTheFile) {
  auto refused = [](const std::string& dir, const std::string& says) {
    absl::StatusOr<ModelFiles> files = ModelFiles::Open(dir);
    ASSERT_FALSE(files.ok()) << dir;
    EXPECT_NE(files.status().message().find(says), std::string::npos) << files.status();
  };
  const std::string empty = testing::EmptyTestPath("model-files-empty");
  mkdir(empty.c_str(), 0755);
  refused(empty, "holds neither model.safetensors nor model.safetensors.index.json");

  const std::string missing = ShardedFolder("model-files-missing-shard");
  std::remove((missing + "/model-00002-of-00002.safetensors").c_str());
  refused(missing, "names the shard model-00002-of-00002.safetensors, which the folder lacks");

  const std::string misplaced = ShardedFolder("model-files-misplaced");
  Write(misplaced + "/model.safetensors.index.json", R"({"weight_map": {"a": "model-00002-of-00002.safetensors",
      "b": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}})");
  refused(misplaced, "says model-00002-of-00002.safetensors holds a, which it does not");

  const std::string bad_index = ShardedFolder("model-files-bad-index");
  Write(bad_index + "/model.safetensors.index.json", R"({"metadata": {}})");
  refused(bad_index, "has no \"weight_map\"");

  const std::string escaping = ShardedFolder("model-files-escaping");
  Write(escaping + "/model.safetensors.index.json", R"({"weight_map": {"a": "../elsewhere.safetensors"}})");
  refused(escaping, "maps to no file of the folder");

  // A shard cut short: its header promises more data than it holds.
  const std::string truncated = ShardedFolder("model-files-truncated");
  const std::string shard = truncated + "/model-00002-of-00002.safetensors";
  std::ifstream in(shard, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  Write(shard, bytes.substr(0, bytes.size() - 4));
  absl::StatusOr<ModelFiles> cut = ModelFiles::Open(truncated);
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("model-00002-of-00002.safetensors"), std::string::npos) << cut.status();
}

}  // namespace
}  // namespace ferry
