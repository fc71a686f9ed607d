#pragma once

// A job's memory placement as a picture (SVG): for each operator period of
// the step, model data on the device and non-model memory (activations,
// workspace) stacked as the last step measured them, the warm-up's
// measurement as a line, the device's capacity and the limit the policy
// fills as horizontal lines, and the chunk moves of each period as marks
// (evictions, on-demand fetches, prefetches); below, model data on each
// tier (device, host, and the disk tier where the job has one) as a bar
// against what the tier may hold. The picture that shows why a job fits or
// not.
//
// Element ids for tools and tests: "model" and "non-model" (one <rect> per
// period each), "warmup" (a <polyline>), "capacity" and "limit" (<line>),
// "evictions", "fetches", "prefetches" (one mark per period with moves),
// "tiers" (a group holding "tier-device", "tier-host" and "tier-disk", each
// a <rect> as wide as the tier's share of its limit).

#include <string>

#include "ferry/v1/memory.pb.h"

namespace ferry {

std::string MemoryPlacementSvg(const ferry::v1::MemoryPlacement& placement);

}  // namespace ferry
