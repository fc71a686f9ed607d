#include "engine/checkpoint/model_files.h"

#include <sys/stat.h>

#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "nlohmann/json.hpp"

namespace ferry {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> ParseWeightMap(const std::string& text, const std::string& what) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  const auto map = j.is_object() ? j.find("weight_map") : j.end();
  if (!j.is_object() || map == j.end() || !map->is_object() || map->empty()) {
    return absl::InvalidArgumentError(absl::StrCat("model.init_from: ", what,
                                                   " has no \"weight_map\" of tensors to files; rewrite it or "
                                                   "remove it to read model.safetensors"));
  }
  std::map<std::string, std::string> out;
  for (const auto& [tensor, file] : map->items()) {
    if (!file.is_string() || file.get<std::string>().empty() || file.get<std::string>().find('/') != std::string::npos ||
        file.get<std::string>()[0] == '.') {
      return absl::InvalidArgumentError(absl::StrCat("model.init_from: ", what, ": ", tensor.substr(0, 200),
                                                     " maps to no file of the folder; each entry must name a "
                                                     "shard beside the index"));
    }
    out[tensor] = file.get<std::string>();
  }
  return out;
}

bool ModelFiles::IsFolder(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

absl::StatusOr<ModelFiles> ModelFiles::Open(const std::string& path,
                                            const std::function<absl::Status(const std::string&)>& check) {
  ModelFiles files;
  std::vector<std::string> shards;
  std::map<std::string, std::string> weight_map;  // from the index
  if (!IsFolder(path)) {
    shards.push_back(path);
    files.what_ = path;
  } else {
    const std::string dir = path.back() == '/' ? path : path + "/";
    const std::string index = dir + "model.safetensors.index.json";
    if (Exists(index)) {
      files.what_ = index;
      if (check) {
        if (absl::Status s = check(index); !s.ok()) return s;
      }
      std::ifstream in(index);
      std::stringstream text;
      text << in.rdbuf();
      ASSIGN_OR_RETURN(weight_map, ParseWeightMap(text.str(), index));
      std::set<std::string> named;
      for (const auto& [tensor, file] : weight_map) named.insert(file);
      for (const std::string& shard : named) {
        if (!Exists(dir + shard)) {
          return absl::InvalidArgumentError(absl::StrCat("model.init_from: ", index, " names the shard ", shard,
                                                         ", which the folder lacks; download it again"));
        }
        shards.push_back(dir + shard);
      }
    } else if (Exists(dir + "model.safetensors")) {
      files.what_ = dir + "model.safetensors";
      shards.push_back(files.what_);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.init_from: ", path, " holds neither model.safetensors nor model.safetensors.index.json; give a "
          "Hugging Face model folder (safetensors weights) or a .safetensors file"));
    }
  }
  for (const std::string& shard : shards) {
    if (check) {
      if (absl::Status s = check(shard); !s.ok()) return s;
    }
    absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(shard);
    if (!reader.ok()) return reader.status();
    files.files_.push_back(std::make_shared<SafetensorsReader>(std::move(*reader)));
    const SafetensorsReader* file = files.files_.back().get();
    for (const SafetensorsEntry& e : file->index().tensors) {
      if (!weight_map.empty()) {
        const auto it = weight_map.find(e.name);
        // A shard's tensor the index does not send there is not read.
        if (it == weight_map.end() || shard.size() < it->second.size() ||
            shard.compare(shard.size() - it->second.size(), it->second.size(), it->second) != 0) {
          continue;
        }
      }
      files.tensors_[e.name] = {file, &e};
    }
  }
  for (const auto& [tensor, file] : weight_map) {
    if (files.tensors_.count(tensor) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("model.init_from: ", files.what_, " says ", file, " holds ",
                                                     tensor, ", which it does not; download the shard again"));
    }
  }
  return files;
}

const SafetensorsEntry* ModelFiles::Find(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second.second;
}

std::vector<const SafetensorsEntry*> ModelFiles::All() const {
  std::vector<const SafetensorsEntry*> out;
  for (const auto& [name, at] : tensors_) out.push_back(at.second);
  return out;
}

absl::Status ModelFiles::Read(const SafetensorsEntry& entry, void* out) const {
  const auto it = tensors_.find(entry.name);
  if (it == tensors_.end() || it->second.second != &entry) {
    return absl::InternalError(absl::StrCat("ModelFiles::Read: ", entry.name, " is not one of ", what_, "'s"));
  }
  return it->second.first->Read(entry, 0, entry.bytes, out);
}

}  // namespace ferry
