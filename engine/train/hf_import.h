#pragma once

// Pretrained GPT-2 weights into a model (`model.init_from`): each tensor
// read from the safetensors file when its parameter is initialised, in the
// model's layout (GPT-2's Conv1D weights transposed) and in fp32 whatever
// the file's type, so that only one tensor at a time is held beside the
// chunks. See engine/model/gpt2_weights.h for the layout and the checks.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/model/gpt.h"
#include "engine/model/model_config.h"

namespace ferry {

// Opens `path` and checks that it holds exactly `config`'s weights
// (CheckGpt2Weights), then has `model` take its initial values from it
// (GptImpl::SetInitialValues) as it is initialised: `model` must be built
// deferred, its values not yet written. A tensor that cannot be read then
// throws a StatusException (DATA_LOSS naming the file and the tensor).
absl::Status InitFromGpt2Weights(const std::string& path, const ModelConfig& config, GptImpl& model);

// The same for any family: `path` a safetensors file or a Hugging Face
// model folder (engine/checkpoint/model_files.h) in the family's layout
// (engine/model/hf_layout.h), checked with CheckHfWeights; each parameter
// assembled from its tensors (a fused layer's from several) as it is
// initialised, one parameter beside the chunks at a time. GPT-2 files go
// through InitFromGpt2Weights.
absl::Status InitFromWeights(const std::string& path, const ModelConfig& config, GptImpl& model);

}  // namespace ferry
