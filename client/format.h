#pragma once

// How the CLI shows jobs to people.

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "ferry/v1/ferry.pb.h"
#include "ferry/v1/job.pb.h"
#include "ferry/v1/memory.pb.h"

namespace ferry {

// "running", "succeeded", ...
std::string ShortState(ferry::v1::JobState state);

// "0:07", "12:03", "1:02:03".
std::string FormatClock(double seconds);

// "950", "12.4k", "3.1M".
std::string FormatCount(double value);

// One line of live progress: step/total, loss, tokens/s, s/step, ETA.
std::string ProgressLine(const ferry::v1::Progress& progress);

// A table of jobs: ID, NAME, STATE, STEP, LOSS, AGE.
std::string JobTable(const std::vector<ferry::v1::Job>& jobs, absl::Time now);

// Everything about one job, a field per line.
std::string JobDetails(const ferry::v1::Job& job, absl::Time now);

std::string DaemonInfoText(const ferry::v1::DaemonInfo& info);

// A job's memory placement: a bar per tier (device, host, and the disk tier
// where the job has one), the chunk map (each payload's tier as a letter: D
// device, H host, S disk, B both device and host, - none), the warm-up
// trace.
std::string MemoryPlacementText(const ferry::v1::MemoryPlacement& placement);

// JSON with the .proto field names and every field shown.
std::string ToJson(const google::protobuf::Message& message, bool multiline);

// The same data as YAML (block style), from JSON text; the JSON unchanged if
// it does not parse.
std::string JsonToYaml(const std::string& json);

// One frame of `ferry top`: progress, memory per tier as bars (the disk
// tier's where the job has one), bytes moved between the tiers, where the
// step's time went (waiting for the disk as part of the optimizer's). `placement` may be null (before the first
// step). With `info` (may be null), the step's achieved FLOP/s beside the
// device's matrix-product rate for the job's precision. `width` is the
// terminal's.
std::string TopFrame(const ferry::v1::Job& job, const ferry::v1::MemoryPlacement* placement, int width,
                     const ferry::v1::DaemonInfo* info = nullptr);

}  // namespace ferry
