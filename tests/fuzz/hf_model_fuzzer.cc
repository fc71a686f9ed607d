// Fuzzes what a Hugging Face model folder is read from besides its weights
// (engine/model/hf_layout, engine/checkpoint/model_files). The first byte
// picks the target:
//   even: the rest is config.json. ParseHfConfig gives a model or
//         INVALID_ARGUMENT naming model.init_from and the file, never a crash;
//         a model accepted holds together (CheckModelConfig), its tensors
//         fill every parameter exactly, and its config.json written again
//         (HfConfigJson) reads back as the same model.
//   odd:  the rest is model.safetensors.index.json. ParseWeightMap gives a
//         map of tensors to plain file names within the folder, or
//         INVALID_ARGUMENT naming the file.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/checkpoint/model_files.h"
#include "engine/model/hf_layout.h"
#include "tests/fuzz/fuzz_check.h"

using ferry::fuzz::Fail;

namespace {

void Config(const std::string& text) {
  absl::StatusOr<ferry::HfConfig> c = ferry::ParseHfConfig(text, "cfg");
  if (!c.ok()) {
    if (c.status().code() != absl::StatusCode::kInvalidArgument) Fail("an error other than INVALID_ARGUMENT");
    if (!absl::StartsWith(c.status().message(), "model.init_from: cfg")) Fail("an error not naming the file");
    return;
  }
  if (!ferry::CheckModelConfig(c->model).ok()) Fail("an accepted model that does not hold together");
  // Small enough to lay out: the tensors fill every parameter.
  if (c->model.layers <= 64 && c->model.ParameterCount() < (int64_t{1} << 40)) {
    std::map<std::string, int64_t> filled;
    for (const ferry::HfTensor& t : ferry::HfTensors(c->model)) {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      filled[t.param] += n;
    }
    // A vocabulary kept in pieces (VocabPieces) is filled by its one tensor.
    std::map<std::string, int64_t> shaped;
    for (const ferry::ParameterShape& p : ferry::ModelParameterShapes(c->model)) {
      std::string name = p.name;
      int piece = 0;
      ferry::ParseVocabPiece(p.name, &name, &piece);
      shaped[name] += p.numel;
    }
    for (const auto& [name, numel] : shaped) {
      if (filled[name] != numel) Fail(absl::StrCat("tensors that do not fill ", name));
    }
  }
  absl::StatusOr<ferry::HfConfig> back =
      ferry::ParseHfConfig(ferry::HfConfigJson(c->model, c->bos_token_id, c->eos_token_ids), "again");
  if (!back.ok()) Fail(absl::StrCat("a config written again does not read back: ", back.status().message()));
  if (back->model.ParameterCount() != c->model.ParameterCount() || back->model.seq_len != c->model.seq_len ||
      back->model.tied != c->model.tied || back->model.QkvRows() != c->model.QkvRows() ||
      back->eos_token_ids != c->eos_token_ids) {
    Fail("a config written again reads back as another model");
  }
}

void Index(const std::string& text) {
  absl::StatusOr<std::map<std::string, std::string>> map = ferry::ParseWeightMap(text, "index");
  if (!map.ok()) {
    if (map.status().code() != absl::StatusCode::kInvalidArgument) Fail("an error other than INVALID_ARGUMENT");
    if (!absl::StartsWith(map.status().message(), "model.init_from: index")) Fail("an error not naming the file");
    return;
  }
  if (map->empty()) Fail("an empty weight map accepted");
  for (const auto& [tensor, file] : *map) {
    if (file.empty() || file[0] == '.' || file.find('/') != std::string::npos) Fail("a shard outside the folder");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    Config(rest);
  } else {
    Index(rest);
  }
  return 0;
}
