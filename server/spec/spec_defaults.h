#pragma once

#include "absl/status/statusor.h"
#include "engine/memory/memory_options.h"
#include "engine/model/gpt_config.h"
#include "engine/train/train_options.h"
#include "ferry/v1/spec.pb.h"

namespace ferry {

// The spec with its preset expanded and every default filled in (the defaults
// are documented in spec.proto). INVALID_ARGUMENT for an unknown preset.
// Idempotent.
absl::StatusOr<ferry::v1::JobSpec> WithDefaults(const ferry::v1::JobSpec& spec);

// Engine views of a spec that has been through WithDefaults.
GptConfig ToGptConfig(const ferry::v1::ModelSpec& model);
TrainOptions ToTrainOptions(const ferry::v1::TrainSpec& train);
MemoryOptions ToMemoryOptions(const ferry::v1::MemorySpec& memory);
// The job's memory options: its memory spec's, sharded across its data
// ranks as parallel.shard says.
MemoryOptions ToMemoryOptions(const ferry::v1::JobSpec& spec);

}  // namespace ferry
