#pragma once

// The weights of a Hugging Face model, open for reading one tensor at a
// time: one safetensors file, or a model folder -- model.safetensors, or the
// shards model.safetensors.index.json names (its "weight_map" from tensor to
// file). No LibTorch, so that the daemon can check a folder at submit.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/checkpoint/safetensors.h"

namespace ferry {

// model.safetensors.index.json's "weight_map": tensor name -> shard file
// (a plain name within the folder). INVALID_ARGUMENT naming `what` and the
// fix for text that is not such an index.
absl::StatusOr<std::map<std::string, std::string>> ParseWeightMap(const std::string& text, const std::string& what);

class ModelFiles {
 public:
  // `path`: a safetensors file, or a folder holding model.safetensors or
  // model.safetensors.index.json. INVALID_ARGUMENT (naming model.init_from,
  // the file and the fix) for a folder with neither, an index that is not
  // one, that names a shard the folder lacks or a tensor its shard does not
  // hold; what SafetensorsReader::Open says for a shard that cannot be read
  // (truncated, not safetensors).
  // `check`, where given, is asked about each file before it is opened
  // (confining it, say), and its error returned.
  static absl::StatusOr<ModelFiles> Open(const std::string& path,
                                         const std::function<absl::Status(const std::string&)>& check = nullptr);

  // Whether `path` is a folder (else a file).
  static bool IsFolder(const std::string& path);

  // The entry for `name`, in whichever file holds it; null if none does.
  const SafetensorsEntry* Find(const std::string& name) const;
  // Every tensor of every file.
  std::vector<const SafetensorsEntry*> All() const;
  // All of `entry`'s bytes (it must come from Find or All) into `out`.
  absl::Status Read(const SafetensorsEntry& entry, void* out) const;
  // The files read, for errors.
  const std::string& what() const { return what_; }

 private:
  std::string what_;
  std::vector<std::shared_ptr<SafetensorsReader>> files_;
  // Tensor name -> (file, entry).
  std::map<std::string, std::pair<const SafetensorsReader*, const SafetensorsEntry*>> tensors_;
};

}  // namespace ferry
