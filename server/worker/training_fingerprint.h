#pragma once

#include <string>

#include "ferry/v1/spec.pb.h"

namespace ferry {

// What a checkpoint must have been written by to resume from it (or to
// export it as this job's weights): a digest of the spec less what may
// change between runs (steps, name, checkpointing itself). Stored in each
// checkpoint's meta["training"].
std::string TrainingFingerprint(const ferry::v1::JobSpec& spec);

}  // namespace ferry
