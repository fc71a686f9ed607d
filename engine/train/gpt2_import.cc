#include "engine/train/gpt2_import.h"

#include <ATen/ATen.h>

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/common/torch_status.h"
#include "engine/model/gpt2_weights.h"

namespace ferry {
namespace {

c10::ScalarType TypeOf(const std::string& dtype) {
  return dtype == "F16" ? at::kHalf : dtype == "BF16" ? at::kBFloat16 : at::kFloat;
}

}  // namespace

absl::Status InitFromGpt2Weights(const std::string& path, const GptConfig& config, GptImpl& model) {
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

}  // namespace ferry
