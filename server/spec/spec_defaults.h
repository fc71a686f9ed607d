#pragma once

#include "absl/status/statusor.h"
#include "engine/memory/memory_options.h"
#include "engine/model/model_config.h"
#include "engine/train/train_options.h"
#include "ferry/v1/spec.pb.h"

namespace ferry {

// The spec with its preset expanded and every default filled in (the defaults
// are documented in spec.proto). INVALID_ARGUMENT for an unknown preset.
// Idempotent.
absl::StatusOr<ferry::v1::JobSpec> WithDefaults(const ferry::v1::JobSpec& spec);

// Records `config`'s architecture in `model`: its shape fields and
// model.architecture's where they are unset (a job file's own values win).
// GPT-2's architecture is recorded as none (the default), unless the spec
// has one already.
void SetModelArchitecture(const ModelConfig& config, ferry::v1::ModelSpec* model);

// Engine views of a spec that has been through WithDefaults.
ModelConfig ToModelConfig(const ferry::v1::ModelSpec& model);
TrainOptions ToTrainOptions(const ferry::v1::TrainSpec& train);
MemoryOptions ToMemoryOptions(const ferry::v1::MemorySpec& memory);
// The job's memory options: its memory spec's, sharded across its data
// ranks as parallel.shard says.
MemoryOptions ToMemoryOptions(const ferry::v1::JobSpec& spec);

}  // namespace ferry
