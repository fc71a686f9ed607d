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
#include "engine/model/gpt_config.h"

namespace ferry {

// Opens `path` and checks that it holds exactly `config`'s weights
// (CheckGpt2Weights), then has `model` take its initial values from it
// (GptImpl::SetInitialValues) as it is initialised: `model` must be built
// deferred, its values not yet written. A tensor that cannot be read then
// throws a StatusException (DATA_LOSS naming the file and the tensor).
absl::Status InitFromGpt2Weights(const std::string& path, const GptConfig& config, GptImpl& model);

}  // namespace ferry
