#pragma once

namespace ferry {

// The release of the daemon, CLI and worker (semantic versioning).
inline constexpr char kFerryVersion[] = "0.1.0";

}  // namespace ferry
