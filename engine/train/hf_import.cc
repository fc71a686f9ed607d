#include "engine/train/hf_import.h"

#include <ATen/ATen.h>

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/common/torch_status.h"
#include "engine/checkpoint/model_files.h"
#include "engine/model/gpt2_weights.h"
#include "engine/model/hf_layout.h"

namespace ferry {
namespace {

c10::ScalarType TypeOf(const std::string& dtype) {
  return dtype == "F16" ? at::kHalf : dtype == "BF16" ? at::kBFloat16 : at::kFloat;
}

}  // namespace

absl::Status InitFromGpt2Weights(const std::string& path, const ModelConfig& config, GptImpl& model) {
  ASSIGN_OR_RETURN(SafetensorsReader reader, SafetensorsReader::Open(path));
  RETURN_IF_ERROR(CheckGpt2Weights(reader.index(), config, path));
  std::map<std::string, Gpt2Tensor> tensors;
  for (Gpt2Tensor& t : Gpt2Tensors(config)) tensors[t.name] = std::move(t);
  auto file = std::make_shared<SafetensorsReader>(std::move(reader));
  model.SetInitialValues([file, tensors = std::move(tensors)](const std::string& name, at::Tensor out) {
    const Gpt2Tensor& t = tensors.at(name);
    const SafetensorsEntry* entry = FindGpt2Tensor(file->index(), name);
    at::Tensor stored = at::empty(t.shape, at::TensorOptions().dtype(TypeOf(entry->dtype)));
    const absl::Status read = file->Read(*entry, 0, entry->bytes, stored.data_ptr());
    if (!read.ok()) throw StatusException(read);
    out.copy_(t.transposed ? stored.t() : stored);
  });
  return absl::OkStatus();
}

absl::Status InitFromWeights(const std::string& path, const ModelConfig& config, GptImpl& model) {
  if (config.model_type == "gpt2" && !ModelFiles::IsFolder(path)) return InitFromGpt2Weights(path, config, model);
  ASSIGN_OR_RETURN(ModelFiles opened, ModelFiles::Open(path));
  auto files = std::make_shared<ModelFiles>(std::move(opened));
  // GPT-2's names may carry the "transformer." prefix.
  auto find = [files](const std::string& name) {
    const SafetensorsEntry* e = files->Find(name);
    return e != nullptr ? e : files->Find("transformer." + name);
  };
  RETURN_IF_ERROR(CheckHfWeights(config, find, files->All(), files->what()));
  std::map<std::string, std::vector<HfTensor>> of_param;
  for (HfTensor& t : HfTensors(config)) of_param[t.param].push_back(std::move(t));
  model.SetInitialValues([files, find, of_param = std::move(of_param)](const std::string& name, at::Tensor out) {
    for (const HfTensor& t : of_param.at(name)) {
      const SafetensorsEntry* entry = find(t.name);
      at::Tensor stored = at::empty(t.shape, at::TensorOptions().dtype(TypeOf(entry->dtype)));
      const absl::Status read = files->Read(*entry, stored.data_ptr());
      if (!read.ok()) throw StatusException(read);
      const at::Tensor value = t.transposed ? stored.t() : stored;
      out.narrow(0, t.row_offset, value.size(0)).copy_(value);
    }
  });
  return absl::OkStatus();
}

}  // namespace ferry
