#pragma once

// Job states for people and metric labels: short, lower-case names
// (JOB_STATE_RUNNING -> "running") and which states are final.

#include <string>

#include "ferry/v1/job.pb.h"

namespace ferry {

std::string StateName(ferry::v1::JobState state);

// SUCCEEDED, FAILED and CANCELLED: states a job never leaves.
inline bool IsTerminalState(ferry::v1::JobState state) {
  return state == ferry::v1::JOB_STATE_SUCCEEDED || state == ferry::v1::JOB_STATE_FAILED ||
         state == ferry::v1::JOB_STATE_CANCELLED;
}

}  // namespace ferry
