#pragma once

// Short, lower-case names of the API's enums for people and metric labels:
// JOB_STATE_RUNNING -> "running".

#include <string>

#include "ferry/v1/job.pb.h"

namespace ferry {

std::string StateName(ferry::v1::JobState state);

}  // namespace ferry
